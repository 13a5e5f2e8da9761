//! The metadata region (MS-VHDX 2.6): the disk's geometry.
//!
//! Rules relied on:
//! - Metadata Table Header (2.6.1.1): 64 KiB table at the region's start,
//!   `Signature` "metadata", `EntryCount` at most 2047.
//! - Metadata Table Entry (2.6.1.2): `ItemId`, `Offset` (at least 64 KiB,
//!   relative to the region; zero only when `Length` is zero), `Length` (at
//!   most 1 MiB), `IsRequired` (bit 2): an unknown required item means the
//!   file cannot be opened. Each item appears once.
//! - Known items (2.6.2): File Parameters (`BlockSize`: a power of two from
//!   1 MiB to 256 MiB; `LeaveBlockAllocated` bit 0 (a fixed VHDX);
//!   `HasParent` bit 1 (a differencing VHDX)), Virtual Disk Size (a
//!   multiple of the logical sector size, at most 64 TiB), Virtual Disk ID
//!   (the page 83 identifier), Logical Sector Size and Physical Sector
//!   Size (512 or 4096). All five are required.

use std::io;

use super::bytes::{u16_at, u32_at, u64_at};
use super::guid::Guid;
use super::region::Region;
use super::{bad, read_checked, MIB};
use crate::BlockDevice;

const TABLE_SIZE: usize = 64 * 1024;
const MAX_ENTRIES: u16 = 2047;
const MAX_ITEM: u32 = 1024 * 1024;
/// The largest virtual disk the spec allows: 64 TiB.
pub(crate) const MAX_VIRTUAL_SIZE: u64 = 64 << 40;

pub(crate) const FILE_PARAMETERS: Guid = Guid::new(
    0xCAA1_6737,
    0xFA36,
    0x4D43,
    [0xB3, 0xB6, 0x33, 0xF0, 0xAA, 0x44, 0xE7, 0x6B],
);
pub(crate) const VIRTUAL_DISK_SIZE: Guid = Guid::new(
    0x2FA5_4224,
    0xCD1B,
    0x4876,
    [0xB2, 0x11, 0x5D, 0xBE, 0xD8, 0x3B, 0xF4, 0xB8],
);
pub(crate) const VIRTUAL_DISK_ID: Guid = Guid::new(
    0xBECA_12AB,
    0xB2E6,
    0x4523,
    [0x93, 0xEF, 0xC3, 0x09, 0xE0, 0x00, 0xC7, 0x46],
);
pub(crate) const LOGICAL_SECTOR_SIZE: Guid = Guid::new(
    0x8141_BF1D,
    0xA96F,
    0x4709,
    [0xBA, 0x47, 0xF2, 0x33, 0xA8, 0xFA, 0xAB, 0x5F],
);
pub(crate) const PHYSICAL_SECTOR_SIZE: Guid = Guid::new(
    0xCDA3_48C7,
    0x445D,
    0x4471,
    [0x9C, 0xC9, 0xE9, 0x88, 0x52, 0x51, 0xC5, 0x56],
);
pub(crate) const PARENT_LOCATOR: Guid = Guid::new(
    0xA8D3_5F2D,
    0xB30B,
    0x454D,
    [0xAB, 0xF7, 0xD3, 0xD8, 0x48, 0x34, 0xAB, 0x0C],
);

/// What the metadata says about the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Metadata {
    pub(crate) block_size: u64,
    pub(crate) leave_blocks_allocated: bool,
    pub(crate) virtual_size: u64,
    pub(crate) disk_id: Guid,
    pub(crate) logical_sector: u32,
    pub(crate) physical_sector: u32,
}

/// Read and check the metadata region `r` (already checked to lie in the file).
pub(crate) fn read(file: &dyn BlockDevice, r: Region) -> io::Result<Metadata> {
    let mut t = vec![0u8; TABLE_SIZE];
    read_checked(file, r.offset, &mut t, "metadata table")?;
    let at = r.offset;
    if &t[..8] != b"metadata" {
        return Err(bad(format!("metadata table at {at}: no \"metadata\" signature")));
    }
    let count = u16_at(&t, 10);
    if count > MAX_ENTRIES {
        return Err(bad(format!(
            "metadata table at {at}: {count} entries (at most {MAX_ENTRIES})"
        )));
    }
    let mut items: Vec<(Guid, u64, u32)> = Vec::new();
    for i in 0..count as usize {
        let e = &t[32 + 32 * i..32 + 32 * (i + 1)];
        let id = Guid::at(e, 0);
        let (off, len, flags) = (u32_at(e, 16), u32_at(e, 20), u32_at(e, 24));
        let known = [
            FILE_PARAMETERS,
            VIRTUAL_DISK_SIZE,
            VIRTUAL_DISK_ID,
            LOGICAL_SECTOR_SIZE,
            PHYSICAL_SECTOR_SIZE,
            PARENT_LOCATOR,
        ]
        .contains(&id);
        if items.iter().any(|(g, ..)| *g == id) {
            return Err(bad(format!("metadata table at {at}: item {id} appears twice")));
        }
        let placed = if len == 0 {
            off == 0
        } else {
            len <= MAX_ITEM && off as usize >= TABLE_SIZE && u64::from(off) + u64::from(len) <= r.length
        };
        if !placed {
            return Err(bad(format!(
                "metadata table at {at}: item {id} at {off} of {len} bytes is outside the metadata region ({} \
                 bytes) or overlaps its table",
                r.length
            )));
        }
        if !known && flags & 4 != 0 {
            return Err(crate::unsupported(
                crate::DiskFormat::Vhdx,
                format!("metadata item {id} is required but not one this reader knows"),
            ));
        }
        items.push((id, r.offset + u64::from(off), len));
    }
    let item = |id: Guid, name: &str, need: usize| -> io::Result<Vec<u8>> {
        let (_, off, len) = items
            .iter()
            .find(|(g, ..)| *g == id)
            .ok_or_else(|| bad(format!("metadata at {at}: the required {name} item is missing")))?;
        if (*len as usize) < need {
            return Err(bad(format!(
                "metadata at {at}: the {name} item is {len} bytes, shorter than {need}"
            )));
        }
        let mut b = vec![0u8; need];
        read_checked(file, *off, &mut b, name)?;
        Ok(b)
    };

    let fp = item(FILE_PARAMETERS, "file parameters", 8)?;
    let block_size = u64::from(u32_at(&fp, 0));
    let bits = u32_at(&fp, 4);
    if bits & 2 != 0 {
        return Err(crate::unsupported(
            crate::DiskFormat::Vhdx,
            "this is a differencing VHDX (HasParent is set in its file parameters): its unchanged sectors live \
             in a parent disk, which is not supported; merge it into a standalone disk first (e.g. qemu-img \
             convert -O vhdx, or Hyper-V's Edit Disk > Merge)",
        ));
    }
    if !block_size.is_power_of_two() || !(MIB..=256 * MIB).contains(&block_size) {
        return Err(bad(format!(
            "metadata at {at}: block size {block_size} is not a power of two from 1 MiB to 256 MiB"
        )));
    }
    let sector = |id: Guid, name: &str| -> io::Result<u32> {
        let v = u32_at(&item(id, name, 4)?, 0);
        if v != 512 && v != 4096 {
            return Err(bad(format!("metadata at {at}: {name} {v} (must be 512 or 4096)")));
        }
        Ok(v)
    };
    let logical_sector = sector(LOGICAL_SECTOR_SIZE, "logical sector size")?;
    let physical_sector = sector(PHYSICAL_SECTOR_SIZE, "physical sector size")?;
    let virtual_size = u64_at(&item(VIRTUAL_DISK_SIZE, "virtual disk size", 8)?, 0);
    if virtual_size > MAX_VIRTUAL_SIZE || !virtual_size.is_multiple_of(u64::from(logical_sector)) {
        return Err(bad(format!(
            "metadata at {at}: virtual disk size {virtual_size} is over 64 TiB or not a multiple of the \
             {logical_sector}-byte logical sector"
        )));
    }
    let disk_id = Guid::at(&item(VIRTUAL_DISK_ID, "virtual disk id", 16)?, 0);
    Ok(Metadata {
        block_size,
        leave_blocks_allocated: bits & 1 != 0,
        virtual_size,
        disk_id,
        logical_sector,
        physical_sector,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vhdx::bytes::{put_u16, put_u32, put_u64};
    use crate::vhdx::testimg::{Spec, METADATA_AT};
    use ext4kit_blockdev::MemDevice;

    fn edited(edit: impl Fn(&mut [u8])) -> io::Result<Metadata> {
        let mut img = Spec::dynamic(8 * MIB).build();
        edit(&mut img[METADATA_AT as usize..METADATA_AT as usize + MIB as usize]);
        read(
            &MemDevice::growable(img),
            Region {
                offset: METADATA_AT,
                length: MIB,
            },
        )
    }

    /// Offset (in the region) of the item with this id.
    fn item_off(m: &[u8], id: Guid) -> usize {
        let n = u16_at(m, 10) as usize;
        (0..n)
            .map(|i| &m[32 + 32 * i..64 + 32 * i])
            .find(|e| Guid::at(e, 0) == id)
            .map(|e| u32_at(e, 16) as usize)
            .unwrap()
    }

    #[test]
    fn the_geometry_is_read() {
        let m = edited(|_| {}).unwrap();
        assert_eq!(m.virtual_size, 8 * MIB);
        assert_eq!(m.logical_sector, 512);
        assert!(!m.leave_blocks_allocated);
    }

    #[test]
    fn a_differencing_disk_is_refused_by_name() {
        let e = edited(|m| {
            let o = item_off(m, FILE_PARAMETERS);
            put_u32(m, o + 4, 2);
        })
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("differencing VHDX"), "{e}");
    }

    #[test]
    fn absurd_values_are_refused() {
        type Edit = Box<dyn Fn(&mut [u8])>;
        let cases: [(&str, Edit); 6] = [
            (
                "block size",
                Box::new(|m| put_u32(m, item_off(m, FILE_PARAMETERS), 3 * 1024 * 1024)),
            ),
            (
                "block size",
                Box::new(|m| put_u32(m, item_off(m, FILE_PARAMETERS), 512 * 1024 * 1024)),
            ),
            (
                "virtual disk size",
                Box::new(|m| put_u64(m, item_off(m, VIRTUAL_DISK_SIZE), 1 << 62)),
            ),
            (
                "logical sector size",
                Box::new(|m| put_u32(m, item_off(m, LOGICAL_SECTOR_SIZE), 1000)),
            ),
            ("entries", Box::new(|m| put_u16(m, 10, 60000))),
            ("outside", Box::new(|m| put_u32(m, 32 + 16, 0xFFFF_F000))),
        ];
        for (want, edit) in cases {
            let e = edited(edit).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert!(e.to_string().contains(want), "{want}: {e}");
        }
        let e = edited(|m| m[0] = b'X').unwrap_err();
        assert!(e.to_string().contains("signature"), "{e}");
    }
}
