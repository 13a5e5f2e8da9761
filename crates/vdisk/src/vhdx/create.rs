//! A new, empty dynamic VHDX, laid out as MS-VHDX 2.1 asks and as qemu's
//! `vhdx_create` places it:
//!
//! | where            | what                                              |
//! |------------------|---------------------------------------------------|
//! | 0                | file type identifier: "vhdxfile", creator (UTF-16) |
//! | 64 KiB, 128 KiB  | the two headers (sequence 1 and 2, no log in use)  |
//! | 192 KiB, 256 KiB | the two region tables (BAT, metadata)              |
//! | 1 MiB            | the log, 1 MiB, empty (`LogGuid` zero: nothing to replay) |
//! | 2 MiB            | the BAT, rounded up to 1 MiB, every entry 0 (`PAYLOAD_BLOCK_NOT_PRESENT`) |
//! | after the BAT    | the metadata region, 1 MiB: table, then the five required items |
//!
//! The file ends at the metadata region; [`VhdxDisk`] appends payload
//! blocks there (1 MiB-aligned) as they are first written.
//!
//! Rules relied on: every region and the log are 1 MiB-aligned and do
//! not overlap (2.1); a BAT entry is 8 bytes and the table holds a sector
//! bitmap entry after every chunk-ratio payload entries (2.5); the
//! metadata items (2.6.2) live at or past 64 KiB into the region, each
//! flagged IsRequired, and the four describing the virtual disk also
//! IsVirtualDisk; the virtual disk size is a multiple of the logical
//! sector size and at most 64 TiB.
//!
//! The BAT and the log are never written: the file is empty, and the
//! bytes a write past a file's end skips read as zeros (POSIX), which is
//! what an empty BAT and an unused log hold. This keeps creating a
//! 64 TiB disk of 1 MiB blocks (a 512 MiB BAT) instant.

use std::io;
use std::sync::Arc;

use super::bat::Geometry;
use super::bytes::{put_u16, put_u32, put_u64, seal};
use super::guid::Guid;
use super::header::{Header, FILE_SIGNATURE, HEADER_OFFSETS};
use super::metadata::{
    Metadata, FILE_PARAMETERS, LOGICAL_SECTOR_SIZE, MAX_VIRTUAL_SIZE, PHYSICAL_SECTOR_SIZE, VIRTUAL_DISK_ID,
    VIRTUAL_DISK_SIZE,
};
use super::region::{BAT_GUID, METADATA_GUID, TABLE_OFFSETS, TABLE_SIZE};
use super::{VhdxDisk, MIB};
use crate::sizing::{invalid, unit_or};
use crate::{BlockDevice, DiskFormat};

const FORMAT: DiskFormat = DiskFormat::Vhdx;
/// The block size qemu's vhdx_create picks for a disk of `size` bytes:
/// small blocks for small disks (a freshly built image allocates a block
/// per region the filesystem touches), Hyper-V's 32 MiB from 100 GiB, 64
/// MiB past 32 TiB.
fn default_block(size: u64) -> u64 {
    const GIB: u64 = 1 << 30;
    match size {
        s if s > 32 * 1024 * GIB => 64 * MIB,
        s if s > 100 * GIB => 32 * MIB,
        s if s > GIB => 16 * MIB,
        _ => 8 * MIB,
    }
}
/// The log: at the end of the header section, 1 MiB (the least there is).
const LOG_AT: u64 = MIB;
const LOG_LEN: u64 = MIB;
/// The BAT: right after the log.
const BAT_AT: u64 = LOG_AT + LOG_LEN;
/// The metadata region's size: its 64 KiB table and five small items.
const METADATA_LEN: u64 = MIB;
/// The logical sector the guest sees (512, as qemu and Hyper-V default).
const LOGICAL_SECTOR: u32 = 512;
/// The physical sector reported to the guest (4096, as Hyper-V).
const PHYSICAL_SECTOR: u32 = 4096;
/// Where the items start in the metadata region (2.6.1.2: at least 64 KiB).
const ITEMS_AT: usize = 64 * 1024;
/// Metadata entry flags (2.6.1.2).
const IS_VIRTUAL_DISK: u32 = 1 << 1;
const IS_REQUIRED: u32 = 1 << 2;

/// The file type identifier: signature and, at 8, the creator in UTF-16
/// (2.2.1; informational, at most 256 characters).
fn identifier() -> Vec<u8> {
    let mut b = FILE_SIGNATURE.to_vec();
    let creator = concat!("ext4kit ", env!("CARGO_PKG_VERSION"));
    b.extend(creator.encode_utf16().flat_map(u16::to_le_bytes));
    b
}

/// The region table naming the BAT (`bat_len` bytes at [`BAT_AT`]) and
/// the metadata region (at `metadata_at`), checksum sealed.
fn region_table(bat_len: u64, metadata_at: u64) -> Vec<u8> {
    let mut t = vec![0u8; TABLE_SIZE];
    t[..4].copy_from_slice(b"regi");
    put_u32(&mut t, 8, 2);
    let regions = [(BAT_GUID, BAT_AT, bat_len), (METADATA_GUID, metadata_at, METADATA_LEN)];
    for (i, (guid, at, len)) in regions.into_iter().enumerate() {
        let e = &mut t[16 + 32 * i..16 + 32 * (i + 1)];
        e[..16].copy_from_slice(&guid.0);
        put_u64(e, 16, at);
        put_u32(e, 24, len as u32);
        put_u32(e, 28, 1); // Required
    }
    seal(&mut t, 4);
    t
}

/// The metadata region of a dynamic disk described by `m`.
fn metadata_region(m: &Metadata) -> Vec<u8> {
    let mut r = vec![0u8; METADATA_LEN as usize];
    r[..8].copy_from_slice(b"metadata");
    let disk = IS_REQUIRED | IS_VIRTUAL_DISK;
    let items: [(_, usize, u32); 5] = [
        (FILE_PARAMETERS, 8, IS_REQUIRED),
        (VIRTUAL_DISK_SIZE, 8, disk),
        (VIRTUAL_DISK_ID, 16, disk),
        (LOGICAL_SECTOR_SIZE, 4, disk),
        (PHYSICAL_SECTOR_SIZE, 4, disk),
    ];
    put_u16(&mut r, 10, items.len() as u16);
    let mut at = ITEMS_AT;
    let mut places = [0usize; 5];
    for (i, (id, len, flags)) in items.into_iter().enumerate() {
        let e = &mut r[32 + 32 * i..32 + 32 * (i + 1)];
        e[..16].copy_from_slice(&id.0);
        put_u32(e, 16, at as u32);
        put_u32(e, 20, len as u32);
        put_u32(e, 24, flags);
        places[i] = at;
        at += len;
    }
    // File parameters: block size, then flags (LeaveBlocksAllocated and
    // HasParent clear: a dynamic disk with no parent).
    put_u32(&mut r, places[0], m.block_size as u32);
    put_u64(&mut r, places[1], m.virtual_size);
    r[places[2]..places[2] + 16].copy_from_slice(&m.disk_id.0);
    put_u32(&mut r, places[3], m.logical_sector);
    put_u32(&mut r, places[4], m.physical_sector);
    r
}

/// Create a dynamic VHDX of `size` bytes (whole sectors) in the empty
/// `file`, with blocks of `block` bytes (by default as qemu picks them:
/// [`default_block`]).
pub(crate) fn create(file: Arc<dyn BlockDevice>, size: u64, block: Option<u64>) -> io::Result<VhdxDisk> {
    let block = unit_or(FORMAT, block, default_block(size), MIB..=256 * MIB, "block size")?;
    if size > MAX_VIRTUAL_SIZE {
        return Err(invalid(
            FORMAT,
            format_args!("a disk of {size} bytes is over the VHDX limit of 64 TiB ({MAX_VIRTUAL_SIZE} bytes)"),
        ));
    }
    let meta = Metadata {
        block_size: block,
        leave_blocks_allocated: false,
        virtual_size: size,
        disk_id: Guid::random(),
        logical_sector: LOGICAL_SECTOR,
        physical_sector: PHYSICAL_SECTOR,
    };
    let geo = Geometry::new(&meta);
    let bat_len = (geo.entries * 8).next_multiple_of(MIB);
    let metadata_at = BAT_AT + bat_len;

    // Everything but the identifier, then a flush, then the identifier:
    // a file cut short before it is not taken for a VHDX.
    file.write_at(metadata_at, &metadata_region(&meta))?;
    let table = region_table(bat_len, metadata_at);
    for at in TABLE_OFFSETS {
        file.write_at(at, &table)?;
    }
    let (file_write_guid, data_write_guid) = (Guid::random(), Guid::random());
    for (i, at) in HEADER_OFFSETS.into_iter().enumerate() {
        let h = Header {
            sequence: 1 + i as u64,
            file_write_guid,
            data_write_guid,
            log_guid: Guid::ZERO,
            log_version: 0,
            version: 1,
            log_length: LOG_LEN as u32,
            log_offset: LOG_AT,
        };
        file.write_at(at, &h.to_bytes())?;
    }
    file.flush()?;
    file.write_at(0, &identifier())?;
    file.flush()?;
    VhdxDisk::open(file, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DiskImage;
    use ext4kit_blockdev::MemDevice;

    #[test]
    fn a_new_disk_opens_with_the_geometry_asked_for() {
        let file = Arc::new(MemDevice::growable(Vec::new()));
        let disk = create(file.clone(), 64 * MIB + 512, Some(32 * MIB)).unwrap();
        assert_eq!(disk.size(), 64 * MIB + 512);
        assert_eq!(file.size(), BAT_AT + MIB + METADATA_LEN);
        let layer = disk.layer();
        assert_eq!(layer.variant, "dynamic");
        assert!(layer.details.contains(&("block size".into(), "32 MiB".into())));
        assert!(layer.details.contains(&("allocated blocks".into(), "0 of 3".into())));
        disk.write_at(disk.size() - 512, &[5u8; 512]).unwrap();
        disk.flush().unwrap();
        drop(disk);
        let again = VhdxDisk::open(file, false).unwrap();
        let mut s = [0u8; 512];
        again.read_at(again.size() - 512, &mut s).unwrap();
        assert_eq!(s, [5u8; 512]);
        assert!(!again.layer().details.iter().any(|(k, _)| k == "log"));
    }

    #[test]
    fn the_largest_disk_has_its_bat_interleaved_with_bitmap_entries() {
        let file = Arc::new(MemDevice::growable(Vec::new()));
        let disk = create(file.clone(), MAX_VIRTUAL_SIZE, Some(32 * MIB)).unwrap();
        assert_eq!(disk.size(), MAX_VIRTUAL_SIZE);
        // 2 Mi payload entries of 32 MiB, a sector bitmap entry after
        // every 128: 2113535 entries, 16.1 MiB, so a 17 MiB BAT.
        assert_eq!(file.size(), BAT_AT + 17 * MIB + METADATA_LEN);
    }

    #[test]
    fn the_default_block_size_grows_with_the_disk_as_qemus() {
        const GIB: u64 = 1 << 30;
        for (size, block) in [
            (MIB, 8),
            (GIB, 8),
            (GIB + 512, 16),
            (200 * GIB, 32),
            (40 * 1024 * GIB, 64),
        ] {
            assert_eq!(default_block(size), block * MIB, "{size}");
        }
    }

    #[test]
    fn past_64_tib_or_with_an_odd_block_size_is_refused() {
        let file = Arc::new(MemDevice::growable(Vec::new()));
        let e = create(file.clone(), MAX_VIRTUAL_SIZE + 512, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("64 TiB"), "{e}");
        for bad in [MIB / 2, 3 * MIB, 512 * MIB] {
            let e = create(file.clone(), MIB, Some(bad)).unwrap_err();
            assert!(e.to_string().contains("block size"), "{e}");
        }
        assert_eq!(file.size(), 0);
    }
}
