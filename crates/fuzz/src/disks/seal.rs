//! Re-sealing checksums after edits, so a corrupted field passes the
//! format's checksum check and reaches the parser behind it (as it would
//! in an image from a buggy or malicious writer).

use super::map::{get, put, Seal};

/// LVM2's CRC: the reflected CRC-32 polynomial, initial value 0xf597a6cf,
/// no final inversion (lib/misc/crc.c).
pub fn lvm_crc(buf: &[u8]) -> u32 {
    let mut crc = 0xf597_a6cfu32;
    for &b in buf {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    crc
}

/// VHD's checksum: the one's complement of the byte sum, the checksum
/// field itself counted as zero.
fn vhd_sum(b: &[u8], field: usize) -> u32 {
    let s: u32 = b.iter().enumerate().filter(|(i, _)| !(field..field + 4).contains(i)).map(|(_, &x)| x as u32).sum();
    !s
}

/// CRC-32C of `len` bytes at `off` with the 4-byte field at `off + 4`
/// zeroed, stored there (VHDX headers, region tables, log entries).
pub fn vhdx_crc(img: &mut [u8], off: usize, len: usize) {
    let Some(s) = img.get_mut(off..off.saturating_add(len)) else { return };
    s[4..8].fill(0);
    let c = crc32c::crc32c(s);
    s[4..8].copy_from_slice(&c.to_le_bytes());
}

/// Recompute one seal in `img` (file 0).
pub fn apply(img: &mut [u8], seal: Seal) {
    match seal {
        Seal::VhdFooter(o) => {
            if let Some(s) = img.get(o..o + 512) {
                let c = vhd_sum(s, 64);
                put(img, o + 64, 4, true, c as u64);
            }
        }
        Seal::VhdDynamic(o) => {
            if let Some(s) = img.get(o..o + 1024) {
                let c = vhd_sum(s, 36);
                put(img, o + 36, 4, true, c as u64);
            }
        }
        Seal::VhdxHeader(o) => vhdx_crc(img, o, 4096),
        Seal::VhdxRegion(o) => vhdx_crc(img, o, 64 << 10),
        Seal::LvmLabel(o) => {
            if let Some(s) = img.get(o + 20..o + 512) {
                let c = lvm_crc(s);
                put(img, o + 16, 4, false, c as u64);
            }
        }
        Seal::LvmMda(o) => {
            // The text's CRC (raw_locn.checksum) first, then the header's.
            let start = get(img, o + 24, 8, false).unwrap_or(0);
            let (toff, tsize) = (get(img, o + 40, 8, false).unwrap_or(0), get(img, o + 48, 8, false).unwrap_or(0));
            let t = start.saturating_add(toff) as usize;
            if let Some(text) = img.get(t..t.saturating_add(tsize as usize)) {
                let c = lvm_crc(text);
                put(img, o + 56, 4, false, c as u64);
            }
            if let Some(s) = img.get(o + 4..o + 512) {
                let c = lvm_crc(s);
                put(img, o, 4, false, c as u64);
            }
        }
    }
}
