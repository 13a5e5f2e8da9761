//! A new, empty dynamic VHD, laid out as qemu's `vpc_create` lays it out:
//! a copy of the footer at 0, the dynamic header at 512, the BAT at 1536
//! (every entry `0xFFFFFFFF`: no block in the file, reads as zeros),
//! padded to whole sectors, then the footer. Blocks are appended by
//! [`VhdDisk`] as they are written.
//!
//! The size: the footer records both a CHS geometry and `current_size`.
//! Virtual PC, and qemu for creator "qemu", take the disk to be the
//! geometry's size; Hyper-V, Windows, and qemu for creator "qem2", take
//! `current_size` (see `footer::Footer::virtual_size`). So, as qemu does:
//! [`VhdSizing::Geometry`] rounds the size up to the first geometry that
//! holds it and records that size in both places; [`VhdSizing::Exact`]
//! keeps the size as asked, records the geometry that fits inside it,
//! and says "qem2" so qemu reads `current_size`. A disk at or past the
//! largest geometry (65535 x 16 x 255, about 127 GiB) is read by its
//! `current_size` by every reader, so it keeps its size either way.
//!
//! The largest disk is 2040 GiB (qemu's `VHD_MAX_SECTORS`): BAT entries
//! address the file in 32-bit sector numbers, so the file cannot pass
//! 2 TiB, and the disk with its block bitmaps and tables must fit in it.

use std::io;
use std::sync::Arc;

use super::dynamic::{HEADER_LEN, UNALLOCATED};
use super::footer::{checksum, FOOTER_LEN, MAX_GEOMETRY_SECTORS};
use super::{VhdDisk, FORMAT};
use crate::sizing::VhdSizing;
use crate::sizing::{invalid, unit_or, SECTOR};
use crate::BlockDevice;

/// qemu's (and Virtual PC's) block size.
const DEFAULT_BLOCK: u64 = 2 << 20;
/// The largest disk: 0xff000000 sectors (qemu's `VHD_MAX_SECTORS`).
pub(crate) const MAX_SIZE: u64 = 0xff00_0000 * SECTOR;
/// Where the dynamic header is (right after the footer copy).
const HEADER_AT: u64 = FOOTER_LEN as u64;
/// Where the BAT is (right after the header).
const BAT_AT: u64 = HEADER_AT + HEADER_LEN as u64;
/// VHD time stamps count seconds from 2000-01-01 00:00:00 UTC.
const VHD_EPOCH: u64 = 946_684_800;

/// A CHS geometry: cylinders, heads, sectors per track.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chs(u16, u8, u8);

impl Chs {
    fn sectors(self) -> u64 {
        self.0 as u64 * self.1 as u64 * self.2 as u64
    }
}

/// The geometry for `total` sectors, by the VHD spec's appendix
/// ("CHS Calculation"), as qemu's `calculate_geometry` implements it: at
/// most `total` sectors (rounded down), capped at 65535 x 16 x 255.
fn geometry(total: u64) -> Chs {
    let total = total.min(MAX_GEOMETRY_SECTORS);
    let (spt, heads, cth);
    if total >= 65535 * 16 * 63 {
        spt = 255;
        heads = 16;
        cth = total / spt;
    } else {
        let mut s = 17;
        let mut c = total / s;
        let mut h = c.div_ceil(1024).max(4);
        if c >= h * 1024 || h > 16 {
            s = 31;
            h = 16;
            c = total / s;
        }
        if c >= h * 1024 {
            s = 63;
            h = 16;
            c = total / s;
        }
        (spt, heads, cth) = (s, h, c);
    }
    Chs((cth / heads) as u16, heads as u8, spt as u8)
}

/// The disk's size and geometry for a request of `size` bytes (whole
/// sectors), as qemu's `vpc_co_create` decides them.
fn sizing(size: u64, how: VhdSizing) -> (u64, Chs) {
    let total = size / SECTOR;
    match how {
        VhdSizing::Exact => (size, geometry(total)),
        VhdSizing::Geometry => {
            // The first geometry holding at least `total` sectors: try
            // one sector more until it fits (at most heads x sectors per
            // track tries, the step between two geometries).
            let want = total.min(MAX_GEOMETRY_SECTORS);
            let mut extra = 0;
            let mut chs = geometry(want);
            while chs.sectors() < want {
                extra += 1;
                chs = geometry(want + extra);
            }
            if chs.sectors() == MAX_GEOMETRY_SECTORS {
                (size, chs)
            } else {
                (chs.sectors() * SECTOR, chs)
            }
        }
    }
}

/// The footer of a new dynamic disk of `size` bytes.
fn footer(size: u64, chs: Chs, how: VhdSizing) -> [u8; FOOTER_LEN] {
    let mut f = [0u8; FOOTER_LEN];
    f[..8].copy_from_slice(b"conectix");
    f[8..12].copy_from_slice(&2u32.to_be_bytes()); // features: "reserved", always set
    f[12..16].copy_from_slice(&0x0001_0000u32.to_be_bytes()); // format version 1.0
    f[16..24].copy_from_slice(&HEADER_AT.to_be_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    f[24..28].copy_from_slice(&(now.saturating_sub(VHD_EPOCH) as u32).to_be_bytes());
    // The creator application decides, for qemu, whether the geometry or
    // `current_size` is the disk's size (see the module comment).
    f[28..32].copy_from_slice(match how {
        VhdSizing::Geometry => b"qemu",
        VhdSizing::Exact => b"qem2",
    });
    f[32..36].copy_from_slice(&0x0005_0003u32.to_be_bytes()); // as qemu: Virtual PC 2007's version
    f[36..40].copy_from_slice(b"Wi2k");
    f[40..48].copy_from_slice(&size.to_be_bytes()); // original size
    f[48..56].copy_from_slice(&size.to_be_bytes()); // current size
    f[56..58].copy_from_slice(&chs.0.to_be_bytes());
    f[58] = chs.1;
    f[59] = chs.2;
    f[60..64].copy_from_slice(&3u32.to_be_bytes()); // dynamic
    let id: [u8; 16] = rand::random();
    f[68..84].copy_from_slice(&id);
    let c = checksum(&f, 64);
    f[64..68].copy_from_slice(&c.to_be_bytes());
    f
}

/// The dynamic header: the BAT at [`BAT_AT`] with `entries` entries of
/// `block`-byte blocks.
fn header(entries: u32, block: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(b"cxsparse");
    // Data offset: unused; all ones (the spec says 0xFFFFFFFF, Microsoft's
    // tools expect all 64 bits set, as qemu writes it).
    h[8..16].copy_from_slice(&u64::MAX.to_be_bytes());
    h[16..24].copy_from_slice(&BAT_AT.to_be_bytes());
    h[24..28].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    h[28..32].copy_from_slice(&entries.to_be_bytes());
    h[32..36].copy_from_slice(&block.to_be_bytes());
    let c = checksum(&h, 36);
    h[36..40].copy_from_slice(&c.to_be_bytes());
    h
}

/// Create a dynamic VHD of at least `size` bytes (whole sectors) in the
/// empty `file`, with blocks of `block` bytes (default 2 MiB).
pub(crate) fn create(file: Arc<dyn BlockDevice>, size: u64, block: Option<u64>, how: VhdSizing) -> io::Result<VhdDisk> {
    let block = unit_or(FORMAT, block, DEFAULT_BLOCK, 512 << 10..=16 << 20, "block size")?;
    let (size, chs) = sizing(size, how);
    if size > MAX_SIZE {
        return Err(invalid(
            FORMAT,
            format_args!("a disk of {size} bytes is over the VHD limit of 2040 GiB ({MAX_SIZE} bytes)"),
        ));
    }
    // At most 2040 GiB / 512 KiB entries: fits the u32 field.
    let entries = size.div_ceil(block);
    // The BAT in whole sectors, the padding all ones too, so a flush that
    // writes a whole BAT sector (VhdDisk) stays inside it.
    let bat_len = (entries * 4).next_multiple_of(SECTOR);
    file.write_at(HEADER_AT, &header(entries as u32, block as u32))?;
    let chunk = vec![0xFFu8; bat_len.min(1 << 20) as usize];
    debug_assert_eq!(UNALLOCATED, u32::from_be_bytes([0xFF; 4]));
    let mut done = 0;
    while done < bat_len {
        let n = (bat_len - done).min(chunk.len() as u64);
        file.write_at(BAT_AT + done, &chunk[..n as usize])?;
        done += n;
    }
    // The footer at the end, then its copy in the first sector last: a
    // file cut short before it is not taken for a VHD.
    let f = footer(size, chs, how);
    file.write_at(BAT_AT + bat_len, &f)?;
    file.flush()?;
    file.write_at(0, &f)?;
    file.flush()?;
    VhdDisk::open(file, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DiskImage;
    use ext4kit_blockdev::MemDevice;

    const MIB: u64 = 1 << 20;

    #[test]
    fn geometry_follows_the_spec_appendix() {
        // 1 MiB: 2048 sectors; 17 sectors per track, 4 heads, 30 cylinders
        // hold 2040; the first geometry holding 2048 is 31 cylinders.
        assert_eq!(geometry(2048), Chs(30, 4, 17));
        assert_eq!(sizing(MIB, VhdSizing::Geometry), (31 * 4 * 17 * 512, Chs(31, 4, 17)));
        assert_eq!(sizing(MIB, VhdSizing::Exact), (MIB, Chs(30, 4, 17)));
        // Past 65535 x 16 x 63 sectors: 255 sectors per track.
        assert_eq!(geometry(65535 * 16 * 63).2, 255);
        // At and past the largest geometry: capped, and the size is kept.
        let big = 200 << 30;
        assert_eq!(sizing(big, VhdSizing::Geometry), (big, Chs(65535, 16, 255)));
        for size in [MIB, 64 * MIB + 512, 3 << 30, 100 << 30, 127 << 30] {
            let (s, chs) = sizing(size, VhdSizing::Geometry);
            assert!(s >= size, "{size}: {s}");
            assert!(s - size < 16 * 255 * 512 || chs.sectors() == MAX_GEOMETRY_SECTORS);
        }
    }

    #[test]
    fn a_new_disk_opens_as_written_and_grows_as_blocks_are_written() {
        let file = Arc::new(MemDevice::growable(Vec::new()));
        let disk = create(file.clone(), 64 * MIB + 512, None, VhdSizing::Geometry).unwrap();
        assert!(disk.size() >= 64 * MIB + 512);
        let layer = disk.layer();
        assert_eq!(layer.variant, "dynamic");
        assert!(layer.details.contains(&("blocks allocated".into(), "0".into())));
        // Footer copy, header, BAT of 33 entries padded to 512, footer.
        assert_eq!(file.size(), 512 + 1024 + 512 + 512);
        let img = file.to_vec();
        assert_eq!(&img[..512], &img[2048..]);
        disk.write_at(disk.size() - 512, &[9u8; 512]).unwrap();
        disk.flush().unwrap();
        drop(disk);
        let again = VhdDisk::open(file, false).unwrap();
        let mut s = [0u8; 512];
        again.read_at(again.size() - 512, &mut s).unwrap();
        assert_eq!(s, [9u8; 512]);
    }

    #[test]
    fn exact_sizing_keeps_the_size_and_says_qem2() {
        let file = Arc::new(MemDevice::growable(Vec::new()));
        let disk = create(file, 64 * MIB + 512, None, VhdSizing::Exact).unwrap();
        assert_eq!(disk.size(), 64 * MIB + 512);
        assert!(disk.layer().details.contains(&("creator".into(), "qem2".into())));
    }

    #[test]
    fn past_2040_gib_or_with_an_odd_block_size_is_refused() {
        let file = Arc::new(MemDevice::growable(Vec::new()));
        let e = create(file.clone(), MAX_SIZE + 512, None, VhdSizing::Geometry).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("2040 GiB"), "{e}");
        let e = create(file.clone(), MIB, Some(3 << 20), VhdSizing::Geometry).unwrap_err();
        assert!(e.to_string().contains("block size"), "{e}");
        assert_eq!(file.size(), 0);
        // The limit itself is accepted (the BAT only: blocks are sparse).
        let disk = create(file, MAX_SIZE, None, VhdSizing::Exact).unwrap();
        assert_eq!(disk.size(), MAX_SIZE);
    }
}
