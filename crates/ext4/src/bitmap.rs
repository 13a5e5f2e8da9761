//! Bit operations on ext4 bitmaps (block and inode bitmaps: bit `i` of
//! byte `i / 8`, least significant first, as the kernel's `ext4_test_bit`
//! on little-endian).
//!
//! Locking: none; callers hold the group lock of the bitmap they change.

/// Test bit `i` of a bitmap.
pub fn test_bit(bm: &[u8], i: usize) -> bool {
    bm[i / 8] & (1 << (i % 8)) != 0
}

/// Set bit `i` of a bitmap.
pub fn set_bit(bm: &mut [u8], i: usize) {
    bm[i / 8] |= 1 << (i % 8);
}

/// Clear bit `i` of a bitmap.
pub fn clear_bit(bm: &mut [u8], i: usize) {
    bm[i / 8] &= !(1 << (i % 8));
}

/// First clear bit in `bm[from..limit]`.
pub fn find_zero(bm: &[u8], from: usize, limit: usize) -> Option<usize> {
    // A word at a time where whole words fit: an inode bitmap fills from
    // the front, so a create storm scans ever further into the group, and a
    // bit-at-a-time scan made every create pay for all its predecessors.
    let limit = limit.min(bm.len() * 8);
    let mut i = from;
    while i < limit {
        if i.is_multiple_of(64) && i + 64 <= limit {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bm[i / 8..i / 8 + 8]);
            let w = u64::from_le_bytes(w);
            if w == u64::MAX {
                i += 64;
                continue;
            }
            return Some(i + (!w).trailing_zeros() as usize);
        }
        if !test_bit(bm, i) {
            return Some(i);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits() {
        let mut b = vec![0xffu8, 0xff, 0b1110_1111, 0];
        assert_eq!(find_zero(&b, 0, 32), Some(20));
        set_bit(&mut b, 20);
        assert_eq!(find_zero(&b, 0, 24), None);
        assert_eq!(find_zero(&b, 0, 32), Some(24));
        clear_bit(&mut b, 3);
        assert_eq!(find_zero(&b, 0, 32), Some(3));
        assert!(test_bit(&b, 20));
    }

    /// The word-at-a-time scan agrees with a bit-at-a-time one for every
    /// start, limit and fill pattern (full words, partial words, tails).
    #[test]
    fn find_zero_matches_bitwise_scan() {
        let naive = |bm: &[u8], from: usize, limit: usize| (from..limit.min(bm.len() * 8)).find(|&i| !test_bit(bm, i));
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        for round in 0..200 {
            let mut bm = vec![0xffu8; 40];
            // Clear a few random bits (none in some rounds).
            for _ in 0..round % 4 {
                clear_bit(&mut bm, rng.random_range(0..320));
            }
            for from in [0, 1, 7, 63, 64, 65, 130, 319] {
                for limit in [0, 64, 100, 128, 200, 320, 400] {
                    assert_eq!(
                        find_zero(&bm, from, limit),
                        naive(&bm, from, limit),
                        "round {round} from {from} limit {limit}"
                    );
                }
            }
        }
    }
}
