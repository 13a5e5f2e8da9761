//! The header section (MS-VHDX 2.2): the file type identifier at 0, and
//! the two copies of the header at 64 KiB and 128 KiB.
//!
//! Rules relied on:
//! - File Type Identifier: `Signature` "vhdxfile" at offset 0 (2.2.1).
//! - Header (2.2.2): 4 KiB structure, `Signature` "head", `Checksum` the
//!   CRC-32C of the 4 KiB with the field zero. Of the two copies, the valid
//!   one with the greater `SequenceNumber` is current; if neither is valid
//!   the file is corrupt.
//! - `Version` must be 1, `LogVersion` 0; `LogOffset` and `LogLength` are
//!   multiples of 1 MiB.
//! - Updating the headers (2.2.2.1): write the non-current copy with
//!   `SequenceNumber` one greater, then flush; it is current once durable.
//!   `FileWriteGuid` changes before the first modification of the file in a
//!   session, `DataWriteGuid` before the first change a reader of the
//!   virtual disk could see.

use std::io;

use super::bytes::{crc_ok, put_u16, put_u32, put_u64, seal, u16_at, u32_at, u64_at};
use super::guid::Guid;
use super::{bad, read_checked, MIB};
use crate::BlockDevice;

/// "vhdxfile" at offset 0.
pub(crate) const FILE_SIGNATURE: &[u8; 8] = b"vhdxfile";
/// Where the two header copies are.
pub(crate) const HEADER_OFFSETS: [u64; 2] = [64 * 1024, 128 * 1024];
/// The header's size for its checksum.
pub(crate) const HEADER_SIZE: usize = 4096;
/// End of the header copies: nothing but header updates writes below it.
pub(crate) const HEADERS_END: u64 = 192 * 1024;
const SIGNATURE: &[u8; 4] = b"head";
const CHECKSUM: usize = 4;

/// One header copy's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) sequence: u64,
    pub(crate) file_write_guid: Guid,
    pub(crate) data_write_guid: Guid,
    pub(crate) log_guid: Guid,
    pub(crate) log_version: u16,
    pub(crate) version: u16,
    pub(crate) log_length: u32,
    pub(crate) log_offset: u64,
}

impl Header {
    /// The header in `b` (4 KiB), or `None` if its signature or checksum
    /// is wrong (a torn or never-written copy).
    pub(crate) fn parse(b: &[u8]) -> Option<Header> {
        if b.len() != HEADER_SIZE || &b[..4] != SIGNATURE || !crc_ok(b, CHECKSUM) {
            return None;
        }
        Some(Header {
            sequence: u64_at(b, 8),
            file_write_guid: Guid::at(b, 16),
            data_write_guid: Guid::at(b, 32),
            log_guid: Guid::at(b, 48),
            log_version: u16_at(b, 64),
            version: u16_at(b, 66),
            log_length: u32_at(b, 68),
            log_offset: u64_at(b, 72),
        })
    }

    /// The 4 KiB copy of this header, checksum filled in.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_SIZE];
        b[..4].copy_from_slice(SIGNATURE);
        put_u64(&mut b, 8, self.sequence);
        b[16..32].copy_from_slice(&self.file_write_guid.0);
        b[32..48].copy_from_slice(&self.data_write_guid.0);
        b[48..64].copy_from_slice(&self.log_guid.0);
        put_u16(&mut b, 64, self.log_version);
        put_u16(&mut b, 66, self.version);
        put_u32(&mut b, 68, self.log_length);
        put_u64(&mut b, 72, self.log_offset);
        seal(&mut b, CHECKSUM);
        b
    }
}

/// The current header and which copy (0 or 1) holds it.
#[derive(Debug, Clone)]
pub(crate) struct Current {
    pub(crate) header: Header,
    pub(crate) slot: usize,
}

/// Check the file type identifier and pick the current header; its fields
/// are checked against the file (`file_size`) before anything follows them.
pub(crate) fn read_current(file: &dyn BlockDevice) -> io::Result<Current> {
    let file_size = file.size();
    let mut sig = [0u8; 8];
    read_checked(file, 0, &mut sig, "file type identifier")?;
    if &sig != FILE_SIGNATURE {
        return Err(bad("no \"vhdxfile\" signature at offset 0: not a VHDX file"));
    }
    let mut best: Option<Current> = None;
    for (slot, off) in HEADER_OFFSETS.into_iter().enumerate() {
        let mut b = vec![0u8; HEADER_SIZE];
        read_checked(file, off, &mut b, "header")?;
        if let Some(h) = Header::parse(&b) {
            if best.as_ref().is_none_or(|c| h.sequence > c.header.sequence) {
                best = Some(Current { header: h, slot });
            }
        }
    }
    let cur = best.ok_or_else(|| bad("neither header (at 64 KiB and 128 KiB) has a valid signature and checksum"))?;
    let h = &cur.header;
    let at = HEADER_OFFSETS[cur.slot];
    if h.version != 1 {
        return Err(crate::unsupported(
            crate::DiskFormat::Vhdx,
            format!("header at {at}: version {} (only version 1 exists)", h.version),
        ));
    }
    if h.log_version != 0 {
        return Err(crate::unsupported(
            crate::DiskFormat::Vhdx,
            format!("header at {at}: log version {} (only version 0 exists)", h.log_version),
        ));
    }
    let log_len = u64::from(h.log_length);
    if !h.log_offset.is_multiple_of(MIB) || !log_len.is_multiple_of(MIB) || h.log_offset < MIB {
        return Err(bad(format!(
            "header at {at}: log at {} of {} bytes is not 1 MiB-aligned past the header section",
            h.log_offset, h.log_length
        )));
    }
    if h.log_offset.checked_add(log_len).is_none_or(|end| end > file_size) {
        return Err(bad(format!(
            "header at {at}: log at {} of {} bytes runs past the end of the file ({file_size} bytes)",
            h.log_offset, h.log_length
        )));
    }
    Ok(cur)
}

/// Make `change` to the current header durably (2.2.2.1): the changed
/// header with the next sequence number goes to the other copy, then a
/// flush; done twice, so both copies end up holding the change and the
/// older one stays a valid fallback while the newer is being written.
pub(crate) fn update(file: &dyn BlockDevice, cur: &mut Current, change: impl Fn(&mut Header)) -> io::Result<()> {
    for _ in 0..2 {
        let mut h = cur.header.clone();
        change(&mut h);
        h.sequence = h
            .sequence
            .checked_add(1)
            .ok_or_else(|| bad("header sequence number is at its maximum"))?;
        let slot = 1 - cur.slot;
        file.write_at(HEADER_OFFSETS[slot], &h.to_bytes())?;
        file.flush()?;
        *cur = Current { header: h, slot };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vhdx::testimg::{corrupt_byte, Spec};
    use ext4kit_blockdev::MemDevice;

    #[test]
    fn the_valid_copy_with_the_higher_sequence_is_current() {
        let img = Spec::dynamic(8 * MIB).build();
        let dev = MemDevice::growable(img.clone());
        let mut cur = read_current(&dev).unwrap();
        let first = cur.header.clone();
        update(&dev, &mut cur, |h| h.file_write_guid = Guid::random()).unwrap();
        assert_eq!(cur.header.sequence, first.sequence + 2);
        let again = read_current(&dev).unwrap();
        assert_eq!(again.header, cur.header);
        // Tear the current copy: the other one (one sequence lower) wins.
        corrupt_byte(&dev, HEADER_OFFSETS[again.slot] + 100);
        let fallback = read_current(&dev).unwrap();
        assert_eq!(fallback.slot, 1 - again.slot);
        assert_eq!(fallback.header.sequence, again.header.sequence - 1);
        // Tear both: corrupt.
        corrupt_byte(&dev, HEADER_OFFSETS[fallback.slot] + 8);
        let e = read_current(&dev).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("neither header"), "{e}");
    }

    #[test]
    fn a_log_outside_the_file_or_a_bad_signature_is_refused() {
        let mut spec = Spec::dynamic(8 * MIB);
        spec.log_offset = 512 * MIB;
        let e = read_current(&MemDevice::growable(spec.build())).unwrap_err();
        assert!(e.to_string().contains("past the end of the file"), "{e}");
        let mut img = Spec::dynamic(8 * MIB).build();
        img[0] = b'X';
        let e = read_current(&MemDevice::growable(img)).unwrap_err();
        assert!(e.to_string().contains("not a VHDX"), "{e}");
        let e = read_current(&MemDevice::growable(b"vhdxfile".to_vec())).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}
