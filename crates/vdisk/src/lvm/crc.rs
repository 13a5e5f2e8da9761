//! LVM2's checksum (`lib/misc/crc.c`, `calc_crc`).
//!
//! The label sector, the metadata area header and the metadata text are
//! each protected by the reflected CRC-32 polynomial (0xEDB88320) as LVM
//! computes it: the running value starts at LVM's own `INITIAL_CRC`
//! (0xf597a6cf), with no inversion before or after. A checksum over two
//! pieces (the metadata text when it wraps round the circular buffer) is
//! the first piece's result continued over the second.

/// `INITIAL_CRC` in `lib/misc/crc.h`.
pub(crate) const INITIAL_CRC: u32 = 0xf597_a6cf;

const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xedb8_8320 } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// `calc_crc(initial, buf, len)`.
pub(crate) fn calc_crc(initial: u32, buf: &[u8]) -> u32 {
    buf.iter().fold(initial, |crc, &b| {
        TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_lvm() {
        // Without LVM's initial value and with the usual inversions this is
        // the ordinary CRC-32, whose check value for "123456789" is known.
        assert_eq!(!calc_crc(!0, b"123456789"), 0xcbf4_3926);
        // Continuing over a split equals one pass over the whole.
        let whole = calc_crc(INITIAL_CRC, b"hello, world");
        assert_eq!(calc_crc(calc_crc(INITIAL_CRC, b"hello, "), b"world"), whole);
    }
}
