//! Block group bookkeeping on the write side: writing descriptors back
//! (with their checksum) and the bitmap checksums they carry.
//!
//! Locking: callers hold the group's descriptor write lock (the group lock)
//! across reading a bitmap, changing it, and updating the descriptor, so
//! allocations in one group are serialised and different groups never
//! contend.

use ext4kit_format::checksum::crc32c;
use ext4kit_format::features::ro_compat;
use ext4kit_format::group_desc::{GdCsum, GroupDesc, BG_BLOCK_UNINIT, BG_INODE_UNINIT};

use super::transaction::Handle;
use super::volume::Volume;
use crate::error::Result;

impl Volume {
    /// How this filesystem checksums its descriptors.
    pub fn gd_csum(&self) -> GdCsum {
        let sb = self.sb.read();
        if let Some(seed) = self.csum_seed {
            GdCsum::Crc32c { seed }
        } else if sb.gdt_csum() {
            GdCsum::Crc16 { uuid: sb.uuid }
        } else {
            GdCsum::None
        }
    }

    /// Write descriptor `g` (as `gd`) into its descriptor-table block.
    pub fn write_group_desc(&self, h: &mut Handle<'_>, g: usize, gd: &GroupDesc) -> Result<()> {
        let grp = &self.groups[g];
        let dsz = self.sb.read().desc_size();
        let csum = self.gd_csum();
        let off = grp.desc_offset;
        h.modify(grp.desc_block, |d| {
            gd.write_sized_into(&mut d[off..off + dsz], g as u32, csum);
            Ok(())
        })
    }

    /// Store the checksum of an inode bitmap in its descriptor
    /// (`bg_inode_bitmap_csum`: crc32c over inodes_per_group bits).
    pub fn set_inode_bitmap_csum(&self, gd: &mut GroupDesc, bitmap: &[u8]) {
        if let Some(seed) = self.csum_seed {
            let c = crc32c(seed, &bitmap[..(self.inodes_per_group as usize).div_ceil(8)]);
            gd.set_inode_bitmap_csum(c, self.sb.read().desc_size() >= 64);
        }
    }

    /// Store the checksum of a block bitmap in its descriptor
    /// (`bg_block_bitmap_csum`: crc32c over clusters_per_group bits).
    pub fn set_block_bitmap_csum(&self, gd: &mut GroupDesc, bitmap: &[u8]) {
        if let Some(seed) = self.csum_seed {
            let c = crc32c(seed, &bitmap[..(self.blocks_per_group as usize).div_ceil(8)]);
            gd.set_block_bitmap_csum(c, self.sb.read().desc_size() >= 64);
        }
    }

    /// Write the primary superblock with free counts summed from the groups
    /// (the kernel keeps them in per-cpu counters and writes them the same
    /// way at sync time).
    pub fn sync_super(&self) -> Result<()> {
        if self.jbd.is_some() && !self.read_only {
            // Journaled like any metadata: the orphan chain's head lives
            // here, and must change in the same transaction as the links.
            let mut h = self.begin()?;
            self.journal_super(&mut h)?;
            return h.commit();
        }
        let _g = self.sb_lock.lock();
        let bytes = self.super_bytes();
        if self.read_only {
            return Ok(());
        }
        self.device()
            .write_at(ext4kit_format::superblock::SUPERBLOCK_OFFSET, &bytes)
            .map_err(|e| crate::error::Error::io("writing the superblock", e))
    }
}

impl Volume {
    /// The superblock as it would be written now: the in-memory copy with
    /// the free counts summed from the groups (plus `count_bias`).
    fn super_bytes(&self) -> Vec<u8> {
        let (mut fb, mut fi) = (0u64, 0u64);
        for grp in &self.groups {
            let gd = grp.desc.read();
            fb += gd.free_blocks_count() as u64;
            fi += gd.free_inodes_count() as u64;
        }
        let (bb, bi) = self.count_bias;
        let fb = (fb as i64).saturating_add(bb).clamp(0, self.blocks_count as i64) as u64;
        let fi = (fi as i64).saturating_add(bi).clamp(0, self.inodes_count as i64) as u64;
        let mut sb = self.sb.write();
        sb.set_free_blocks_count(fb, self.has_incompat(ext4kit_format::features::incompat::BIT64));
        sb.free_inodes_count = fi as u32;
        sb.to_bytes_with_checksum()
    }

    /// At open: how far the superblock's free counts should stay from the
    /// groups' sums. The kernel writes the sums (its per-cpu counters are
    /// initialised from the descriptors), and so did we; but when a
    /// group's count is damaged — it disagrees with the group's bitmap —
    /// the superblock's own count is the one e2fsck agrees with, and
    /// summing would put the damage into it at the next superblock write
    /// (a new "Free blocks count wrong" from any operation at all). So the
    /// difference found at open is kept, and the superblock moves by what
    /// the groups move. When every group agrees with its bitmap the
    /// superblock is the stale one (a crash, say) and the sums are written,
    /// as the kernel's. Reads every bitmap only when the counts differ.
    pub(crate) fn damaged_count_bias(&self) -> (i64, i64) {
        let (mut fb, mut fi) = (0i64, 0i64);
        for grp in &self.groups {
            let gd = grp.desc.read();
            fb += gd.free_blocks_count() as i64;
            fi += gd.free_inodes_count() as i64;
        }
        let (sb_b, sb_i) = {
            let sb = self.sb.read();
            (sb.free_blocks_count() as i64, sb.free_inodes_count as i64)
        };
        let csum_groups = self.has_ro_compat(ro_compat::GDT_CSUM | ro_compat::METADATA_CSUM);
        let mut bias = (0, 0);
        if sb_b != fb {
            let lying = (0..self.groups.len()).any(|g| {
                let gd = *self.groups[g].desc.read();
                if csum_groups && gd.flags & BG_BLOCK_UNINIT != 0 {
                    return false;
                }
                match self.block_bitmap_of(g, &gd) {
                    Ok((bm, _)) => !self.block_bitmap_usable(g, &gd, &bm),
                    Err(_) => true,
                }
            });
            if lying {
                bias.0 = sb_b - fb;
            }
        }
        if sb_i != fi {
            let lying = (0..self.groups.len()).any(|g| {
                let gd = *self.groups[g].desc.read();
                if csum_groups && gd.flags & BG_INODE_UNINIT != 0 {
                    return false;
                }
                match self.buffer(gd.inode_bitmap()) {
                    Ok(bm) => !self.inode_bitmap_usable(g, &gd, &bm.data),
                    Err(_) => true,
                }
            });
            if lying {
                bias.1 = sb_i - fi;
            }
        }
        bias
    }

    /// Write the superblock through `h` (a journaled volume): bytes
    /// 1024..2048 of the block that holds them (block 0, or block 1 with
    /// 1 KiB blocks), so that it changes in `h`'s transaction.
    pub fn journal_super(&self, h: &mut crate::transaction::Handle<'_>) -> Result<()> {
        let _g = self.sb_lock.lock();
        let bytes = self.super_bytes();
        let at = ext4kit_format::superblock::SUPERBLOCK_OFFSET as usize % self.block_size;
        h.modify_superblock_block(|d| {
            d[at..at + bytes.len()].copy_from_slice(&bytes);
            Ok(())
        })
    }
}

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
