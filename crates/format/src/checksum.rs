//! The two checksums ext4 uses.
//!
//! ext4 stores the *raw* CRC32C register (kernel `crc32c_le(seed, data)`, no
//! final inversion) and chains it: the output of one call seeds the next. The
//! `crc32c` crate implements the conventional CRC (pre- and post-inverted), so
//! `raw(s, d) = !crc32c_append(!s, d)`.
//!
//! CRC16 (ANSI, reflected polynomial 0xA001) protects group descriptors on
//! filesystems with `gdt_csum` but without `metadata_csum`.

/// Kernel-style `crc32c_le(seed, data)`: the raw register, no final xor.
#[inline]
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// The per-filesystem checksum seed: `s_checksum_seed` when the
/// `metadata_csum_seed` feature is set, otherwise `crc32c(~0, s_uuid)`.
pub fn fs_csum_seed(uuid: &[u8; 16], csum_seed_feature: bool, s_checksum_seed: u32) -> u32 {
    if csum_seed_feature {
        s_checksum_seed
    } else {
        crc32c(!0, uuid)
    }
}

/// The per-inode seed that extent, directory, htree and xattr checksums
/// chain from: `crc32c(crc32c(fs_seed, le32 inode), le32 generation)`.
pub fn inode_csum_seed(fs_seed: u32, ino: u32, generation: u32) -> u32 {
    let s = crc32c(fs_seed, &ino.to_le_bytes());
    crc32c(s, &generation.to_le_bytes())
}

const fn crc16_table() -> [u16; 256] {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u16;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xA001 } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}
static CRC16_TABLE: [u16; 256] = crc16_table();

/// CRC16 as used by `gdt_csum` (e2fsprogs `ext2fs_crc16`).
pub fn crc16(mut crc: u16, data: &[u8]) -> u16 {
    for &b in data {
        crc = (crc >> 8) ^ CRC16_TABLE[((crc ^ b as u16) & 0xff) as usize];
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_vector() {
        // Standard check value of CRC-32C over "123456789" is 0xE3069283;
        // the raw register from seed ~0 is its inverse.
        assert_eq!(!crc32c(!0, b"123456789"), 0xE306_9283);
    }

    #[test]
    fn crc32c_chains() {
        let a = crc32c(!0, b"hello ");
        assert_eq!(crc32c(a, b"world"), crc32c(!0, b"hello world"));
    }

    #[test]
    fn crc16_known_vector() {
        // CRC-16/ARC check value over "123456789" with initial 0 is 0xBB3D.
        assert_eq!(crc16(0, b"123456789"), 0xBB3D);
    }
}
