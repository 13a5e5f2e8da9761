//! Little-endian fields and CRC-32C, as every VHDX structure stores them
//! (MS-VHDX 2.1: "all fields are little-endian"; 2.2.2, 2.2.3, 2.3.1: the
//! checksum is CRC-32C over the structure with the checksum field zero).
//!
//! The offsets passed here are the spec's fixed field offsets inside
//! buffers this module's callers allocated at the structure's fixed size,
//! never numbers read from the file.

/// The `u16` at `off`.
pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[off..off + 2]);
    u16::from_le_bytes(a)
}

/// The `u32` at `off`.
pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

/// The `u64` at `off`.
pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// Store `v` at `off`.
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

/// Store `v` at `off`.
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Store `v` at `off`.
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// CRC-32C of `b` as if its 4-byte checksum field at `field` held zero.
pub(crate) fn crc_without(b: &[u8], field: usize) -> u32 {
    let crc = crc32c::crc32c(&b[..field]);
    let crc = crc32c::crc32c_append(crc, &[0u8; 4]);
    crc32c::crc32c_append(crc, &b[field + 4..])
}

/// Whether the checksum field at `field` holds the CRC-32C of `b`.
pub(crate) fn crc_ok(b: &[u8], field: usize) -> bool {
    crc_without(b, field) == u32_at(b, field)
}

/// Fill in the checksum field at `field` of `b`.
pub(crate) fn seal(b: &mut [u8], field: usize) {
    let crc = crc_without(b, field);
    put_u32(b, field, crc);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_the_castagnoli_polynomial() {
        // RFC 3720 B.4: 32 bytes of zeros.
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8a91_36aa);
        let mut b = vec![7u8; 64];
        seal(&mut b, 4);
        assert!(crc_ok(&b, 4));
        b[40] ^= 1;
        assert!(!crc_ok(&b, 4));
    }
}
