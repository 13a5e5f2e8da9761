//! The region table (MS-VHDX 2.2.3): where the BAT and the metadata region
//! are in the file.
//!
//! Rules relied on:
//! - Two copies, at 192 KiB and 256 KiB, 64 KiB each: `Signature` "regi",
//!   `Checksum` the CRC-32C of the 64 KiB with the field zero,
//!   `EntryCount` at most 2047. The first valid copy is used.
//! - Region Table Entry (2.2.3.2): `Guid`, `FileOffset` (a multiple of
//!   1 MiB, at least 1 MiB), `Length` (a multiple of 1 MiB), `Required`
//!   (bit 0): a region this parser does not know and that is required
//!   means the file cannot be opened. Regions must not overlap; each GUID
//!   appears once; the BAT and metadata regions must both be present.

use std::io;

use super::bytes::{crc_ok, u32_at, u64_at};
use super::guid::Guid;
use super::{bad, read_checked, MIB};
use crate::BlockDevice;

/// Where the two region table copies are.
pub(crate) const TABLE_OFFSETS: [u64; 2] = [192 * 1024, 256 * 1024];
/// A region table copy's size.
pub(crate) const TABLE_SIZE: usize = 64 * 1024;
/// The most entries a table may hold.
const MAX_ENTRIES: u32 = 2047;
/// BAT region: 2DC27766-F623-4200-9D64-115E9BFD4A08.
pub(crate) const BAT_GUID: Guid = Guid::new(
    0x2DC2_7766,
    0xF623,
    0x4200,
    [0x9D, 0x64, 0x11, 0x5E, 0x9B, 0xFD, 0x4A, 0x08],
);
/// Metadata region: 8B7CA206-4790-4B9A-B8FE-575F050F886E.
pub(crate) const METADATA_GUID: Guid = Guid::new(
    0x8B7C_A206,
    0x4790,
    0x4B9A,
    [0xB8, 0xFE, 0x57, 0x5F, 0x05, 0x0F, 0x88, 0x6E],
);

/// A byte range of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) offset: u64,
    pub(crate) length: u64,
}

impl Region {
    /// One past the last byte (checked at parse time not to overflow).
    pub(crate) fn end(&self) -> u64 {
        self.offset + self.length
    }
}

/// The two regions a VHDX must have.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Regions {
    pub(crate) bat: Region,
    pub(crate) metadata: Region,
}

/// Read the region table: the first copy whose checksum holds.
pub(crate) fn read(file: &dyn BlockDevice) -> io::Result<Regions> {
    let mut first_err = None;
    for off in TABLE_OFFSETS {
        let mut b = vec![0u8; TABLE_SIZE];
        read_checked(file, off, &mut b, "region table")?;
        if &b[..4] != b"regi" || !crc_ok(&b, 4) {
            first_err.get_or_insert_with(|| bad(format!("region table at {off}: bad signature or checksum")));
            continue;
        }
        return parse(&b, off, file.size());
    }
    Err(first_err.unwrap_or_else(|| bad("no region table")))
}

/// The regions of the table in `b` (a valid copy read at `at`).
fn parse(b: &[u8], at: u64, file_size: u64) -> io::Result<Regions> {
    let count = u32_at(b, 8);
    if count > MAX_ENTRIES {
        return Err(bad(format!(
            "region table at {at}: {count} entries (at most {MAX_ENTRIES})"
        )));
    }
    let mut seen: Vec<(Guid, Region)> = Vec::new();
    for i in 0..count as usize {
        let e = &b[16 + 32 * i..16 + 32 * (i + 1)];
        let guid = Guid::at(e, 0);
        let r = Region {
            offset: u64_at(e, 16),
            length: u64::from(u32_at(e, 24)),
        };
        let required = u32_at(e, 28) & 1 != 0;
        let known = guid == BAT_GUID || guid == METADATA_GUID;
        if !known {
            if required {
                return Err(crate::unsupported(
                    crate::DiskFormat::Vhdx,
                    format!("region table at {at}: required region {guid} is not one this reader knows"),
                ));
            }
            continue;
        }
        if !r.offset.is_multiple_of(MIB) || !r.length.is_multiple_of(MIB) || r.offset < MIB || r.length == 0 {
            return Err(bad(format!(
                "region table at {at}: region {guid} at {} of {} bytes is not a non-empty 1 MiB-aligned range past \
                 the header section",
                r.offset, r.length
            )));
        }
        if r.offset.checked_add(r.length).is_none_or(|end| end > file_size) {
            return Err(bad(format!(
                "region table at {at}: region {guid} at {} of {} bytes runs past the end of the file ({file_size} \
                 bytes)",
                r.offset, r.length
            )));
        }
        if let Some((g, _)) = seen
            .iter()
            .find(|(g, o)| *g == guid || (r.offset < o.end() && o.offset < r.end()))
        {
            return Err(bad(format!(
                "region table at {at}: region {guid} repeats or overlaps region {g}"
            )));
        }
        seen.push((guid, r));
    }
    let find = |g: Guid, name: &str| {
        seen.iter()
            .find(|(x, _)| *x == g)
            .map(|(_, r)| *r)
            .ok_or_else(|| bad(format!("region table at {at}: no {name} region")))
    };
    Ok(Regions {
        bat: find(BAT_GUID, "BAT")?,
        metadata: find(METADATA_GUID, "metadata")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vhdx::bytes::{put_u32, put_u64, seal};
    use crate::vhdx::testimg::Spec;
    use ext4kit_blockdev::MemDevice;

    fn with_table(edit: impl Fn(&mut [u8])) -> io::Result<Regions> {
        let mut img = Spec::dynamic(8 * MIB).build();
        for off in TABLE_OFFSETS {
            let t = &mut img[off as usize..off as usize + TABLE_SIZE];
            edit(t);
            seal(t, 4);
        }
        read(&MemDevice::growable(img))
    }

    #[test]
    fn a_good_table_names_both_regions() {
        let r = with_table(|_| {}).unwrap();
        assert!(r.bat.offset >= MIB && r.metadata.offset >= MIB);
    }

    #[test]
    fn hostile_tables_are_refused() {
        // The BAT overlapping the metadata region.
        let e = with_table(|t| {
            let meta_off = u64_at(t, 16 + 32 + 16);
            put_u64(t, 16 + 16, meta_off);
        })
        .unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        // Past the end of the file.
        let e = with_table(|t| put_u64(t, 16 + 16, 1 << 50)).unwrap_err();
        assert!(e.to_string().contains("past the end"), "{e}");
        // Offset into the header section.
        let e = with_table(|t| put_u64(t, 16 + 16, 0)).unwrap_err();
        assert!(e.to_string().contains("1 MiB-aligned"), "{e}");
        // Too many entries.
        let e = with_table(|t| put_u32(t, 8, 5000)).unwrap_err();
        assert!(e.to_string().contains("entries"), "{e}");
        // An unknown required region: unsupported, not corrupt.
        let e = with_table(|t| {
            put_u32(t, 8, 3);
            t[16 + 64] = 0x42;
            put_u64(t, 16 + 64 + 16, 100 * MIB);
            put_u32(t, 16 + 64 + 28, 1);
        })
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
        // Both copies' checksums wrong.
        let mut img = Spec::dynamic(8 * MIB).build();
        for off in TABLE_OFFSETS {
            img[off as usize + 20] ^= 1;
        }
        let e = read(&MemDevice::growable(img)).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
    }

    #[test]
    fn a_torn_first_copy_falls_back_to_the_second() {
        let mut img = Spec::dynamic(8 * MIB).build();
        img[TABLE_OFFSETS[0] as usize + 20] ^= 1;
        assert!(read(&MemDevice::growable(img)).is_ok());
    }
}
