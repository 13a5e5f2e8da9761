//! A metadata area: its header and the circular buffer of metadata text
//! (`lib/format_text/layout.h`, `format-text.c`).
//!
//! On-disk rules relied on:
//! - A metadata area starts with a 512-byte header (`struct mda_header`):
//!   `checksum_xl` (u32, LVM's CRC of the rest of the 512 bytes), the magic
//!   `" LVM2 x[5A%r0N*>"`, `version` 1, `start` (u64, the area's own byte
//!   offset on the device: a header read elsewhere is refused) and `size`
//!   (u64, the whole area in bytes), then `raw_locn` entries (offset from
//!   the area's start, size, checksum of the text, flags), ended by one
//!   with offset 0. The first is the committed metadata; an offset of 0
//!   means the area holds none yet (a PV outside any VG).
//! - `RAW_LOCN_IGNORED` (flag 1) marks an area `pvchange
//!   --metadataignore` told LVM not to use.
//! - The text lives in the buffer after the header, which is circular:
//!   text that would run past the area's end continues right after the
//!   header, and its checksum runs over both pieces in order. The text
//!   is written with a trailing NUL.

use std::io;

use super::crc::{calc_crc, INITIAL_CRC};
use super::label::Area;
use super::{corrupt_lvm, unsupported_lvm};
use crate::BlockDevice;

/// `MDA_HEADER_SIZE`.
pub(crate) const MDA_HEADER_SIZE: u64 = 512;
/// `FMTT_MAGIC`.
const FMTT_MAGIC: &[u8; 16] = b" LVM2 x[5A%r0N*>";
/// `FMTT_VERSION`.
const FMTT_VERSION: u32 = 1;
/// `RAW_LOCN_IGNORED`.
const RAW_LOCN_IGNORED: u32 = 1;
/// The largest metadata text read. LVM's own default area is 1 MiB and a
/// VG of thousands of LVs needs a few; this bounds what a hostile
/// `raw_locn.size` can make us allocate.
pub(crate) const MAX_METADATA_TEXT: u64 = 32 << 20;

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// The committed metadata text in the metadata area `area` of `dev`,
/// without its trailing NULs; `None` if the area holds none or is ignored.
pub(crate) fn read_metadata(dev: &dyn BlockDevice, area: Area) -> io::Result<Option<Vec<u8>>> {
    let base = area.offset();
    let at = |what: &str| format!("metadata area at byte {base}: {what}");
    if area.size() < MDA_HEADER_SIZE {
        return Err(corrupt_lvm(at(&format!(
            "{} bytes is smaller than its header",
            area.size()
        ))));
    }
    let mut h = [0u8; MDA_HEADER_SIZE as usize];
    dev.read_at(base, &mut h)?;
    let stored = le32(&h, 0);
    let computed = calc_crc(INITIAL_CRC, &h[4..]);
    if &h[4..20] != FMTT_MAGIC {
        return Err(corrupt_lvm(at("header has no \" LVM2 x[5A%r0N*>\" magic")));
    }
    if stored != computed {
        return Err(corrupt_lvm(at(&format!(
            "header checksum {stored:#010x}, computed {computed:#010x}"
        ))));
    }
    let version = le32(&h, 20);
    if version != FMTT_VERSION {
        return Err(unsupported_lvm(at(&format!("header version {version}"))));
    }
    let start = le64(&h, 24);
    if start != base {
        return Err(corrupt_lvm(at(&format!("header says it is at byte {start}"))));
    }
    let mda_size = le64(&h, 32);
    if mda_size < MDA_HEADER_SIZE || mda_size > area.size() {
        return Err(corrupt_lvm(at(&format!(
            "header gives the area {mda_size} bytes; the PV header gives {}",
            area.size()
        ))));
    }
    // raw_locn[0]: offset u64, size u64, checksum u32, flags u32.
    let (offset, size, checksum, flags) = (le64(&h, 40), le64(&h, 48), le32(&h, 56), le32(&h, 60));
    if offset == 0 || flags & RAW_LOCN_IGNORED != 0 {
        return Ok(None);
    }
    let buffer = mda_size - MDA_HEADER_SIZE;
    if offset < MDA_HEADER_SIZE || offset >= mda_size || size == 0 || size > buffer {
        return Err(corrupt_lvm(at(&format!(
            "metadata text of {size} bytes at offset {offset} does not fit the area's {buffer}-byte buffer"
        ))));
    }
    if size > MAX_METADATA_TEXT {
        return Err(unsupported_lvm(at(&format!(
            "metadata text of {size} bytes is larger than the {MAX_METADATA_TEXT} bytes read"
        ))));
    }
    // Both fit in usize: size <= MAX_METADATA_TEXT.
    let first = size.min(mda_size - offset);
    let mut text = vec![0u8; size as usize];
    let (head, wrapped) = text.split_at_mut(first as usize);
    dev.read_at(base + offset, head)?;
    if !wrapped.is_empty() {
        dev.read_at(base + MDA_HEADER_SIZE, wrapped)?;
    }
    let computed = calc_crc(INITIAL_CRC, &text);
    if computed != checksum {
        return Err(corrupt_lvm(at(&format!(
            "metadata text checksum {checksum:#010x}, computed {computed:#010x}"
        ))));
    }
    while text.last() == Some(&0) {
        text.pop();
    }
    Ok(Some(text))
}

/// Test support: write a metadata area header at `base` of `size` bytes
/// whose committed text (NUL added) starts `offset` bytes into the area,
/// wrapping round the buffer as LVM does.
#[cfg(test)]
pub(crate) fn write_mda(dev: &dyn BlockDevice, base: u64, size: u64, offset: u64, text: &[u8]) {
    let mut t = text.to_vec();
    t.push(0);
    let first = (t.len() as u64).min(size - offset) as usize;
    dev.write_at(base + offset, &t[..first]).unwrap();
    if first < t.len() {
        dev.write_at(base + MDA_HEADER_SIZE, &t[first..]).unwrap();
    }
    let mut h = [0u8; MDA_HEADER_SIZE as usize];
    h[4..20].copy_from_slice(FMTT_MAGIC);
    h[20..24].copy_from_slice(&FMTT_VERSION.to_le_bytes());
    h[24..32].copy_from_slice(&base.to_le_bytes());
    h[32..40].copy_from_slice(&size.to_le_bytes());
    h[40..48].copy_from_slice(&offset.to_le_bytes());
    h[48..56].copy_from_slice(&(t.len() as u64).to_le_bytes());
    h[56..60].copy_from_slice(&calc_crc(INITIAL_CRC, &t).to_le_bytes());
    let crc = calc_crc(INITIAL_CRC, &h[4..]);
    h[..4].copy_from_slice(&crc.to_le_bytes());
    dev.write_at(base, &h).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_blockdev::MemDevice;

    fn area(offset: u64, size: u64) -> Area {
        // Areas are built by the label parser; tests go through it.
        let l = super::super::label::build_label(
            0,
            "UuS4C4QRYkIOoXWr6FW1spdJrdPSaERv",
            1 << 20,
            &[(1 << 19, 0)],
            &[(offset, size)],
        );
        let d = MemDevice::new(1 << 20);
        d.write_at(0, &l).unwrap();
        super::super::label::physical_volume(&d)
            .unwrap()
            .unwrap()
            .metadata_areas()[0]
    }

    #[test]
    fn reads_plain_and_wrapped_text() {
        let d = MemDevice::new(1 << 20);
        write_mda(&d, 4096, 8192, 1024, b"vg { seqno = 1 }");
        assert_eq!(
            read_metadata(&d, area(4096, 8192)).unwrap().unwrap(),
            b"vg { seqno = 1 }"
        );

        // Text starting 10 bytes before the area's end continues after the header.
        let text: Vec<u8> = (0..300).map(|i| b'a' + (i % 26) as u8).collect();
        write_mda(&d, 4096, 8192, 8192 - 10, &text);
        assert_eq!(read_metadata(&d, area(4096, 8192)).unwrap().unwrap(), text);
        let mut first = [0u8; 10];
        d.read_at(4096 + 8192 - 10, &mut first).unwrap();
        assert_eq!(&first, &text[..10]);
    }

    #[test]
    fn empty_and_ignored_areas_hold_nothing() {
        let d = MemDevice::new(1 << 20);
        write_mda(&d, 4096, 8192, 1024, b"x");
        let mut h = [0u8; 512];
        d.read_at(4096, &mut h).unwrap();
        h[60] = 1; // RAW_LOCN_IGNORED
        let crc = calc_crc(INITIAL_CRC, &h[4..]);
        h[..4].copy_from_slice(&crc.to_le_bytes());
        d.write_at(4096, &h).unwrap();
        assert!(read_metadata(&d, area(4096, 8192)).unwrap().is_none());
    }

    fn patch(d: &MemDevice, base: u64, at: usize, bytes: &[u8]) {
        let mut h = [0u8; 512];
        d.read_at(base, &mut h).unwrap();
        h[at..at + bytes.len()].copy_from_slice(bytes);
        let crc = calc_crc(INITIAL_CRC, &h[4..]);
        h[..4].copy_from_slice(&crc.to_le_bytes());
        d.write_at(base, &h).unwrap();
    }

    #[test]
    fn hostile_headers_are_errors() {
        let d = MemDevice::new(1 << 20);
        let a = area(4096, 8192);
        // No magic.
        assert!(read_metadata(&d, a).unwrap_err().to_string().contains("magic"));
        // Bad checksum.
        write_mda(&d, 4096, 8192, 1024, b"vg {}");
        d.write_at(4096 + 100, b"x").unwrap();
        assert!(read_metadata(&d, a).unwrap_err().to_string().contains("checksum"));
        // Header copied from elsewhere.
        write_mda(&d, 4096, 8192, 1024, b"vg {}");
        patch(&d, 4096, 24, &0u64.to_le_bytes());
        assert!(read_metadata(&d, a).unwrap_err().to_string().contains("says it is at"));
        // Area larger than the PV header says.
        write_mda(&d, 4096, 8192, 1024, b"vg {}");
        patch(&d, 4096, 32, &u64::MAX.to_le_bytes());
        assert!(read_metadata(&d, a).is_err());
        // Text offset inside the header, past the area, text too big.
        for (o, z) in [
            (100u64, 10u64),
            (9000, 10),
            (1024, 8000),
            (1024, 0),
            (u64::MAX, u64::MAX),
        ] {
            write_mda(&d, 4096, 8192, 1024, b"vg {}");
            patch(&d, 4096, 40, &o.to_le_bytes());
            patch(&d, 4096, 48, &z.to_le_bytes());
            let e = read_metadata(&d, a).unwrap_err();
            assert!(e.to_string().contains("does not fit"), "{o} {z}: {e}");
        }
        // Text checksum.
        write_mda(&d, 4096, 8192, 1024, b"vg {}");
        d.write_at(4096 + 1025, b"X").unwrap();
        assert!(read_metadata(&d, a).unwrap_err().to_string().contains("text checksum"));
    }
}
