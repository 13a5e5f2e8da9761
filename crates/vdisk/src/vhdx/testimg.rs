//! Hand-built VHDX images for the unit tests, laid out per MS-VHDX: the
//! header section, a 1 MiB log at 1 MiB, the metadata region at 2 MiB, the
//! BAT at 3 MiB, payload blocks after it. Not an oracle (the integration
//! test checks against qemu-img); a way to make each structure and break
//! it on purpose.

use ext4kit_blockdev::MemDevice;

use super::bat::{Geometry, FULLY_PRESENT};
use super::bytes::{put_u16, put_u32, put_u64, seal};
use super::guid::Guid;
use super::header::{Header, HEADER_OFFSETS};
use super::metadata::{self, Metadata};
use super::region::{BAT_GUID, METADATA_GUID, TABLE_OFFSETS, TABLE_SIZE};
use super::MIB;
use crate::BlockDevice;

pub(crate) const LOG_AT: u64 = MIB;
pub(crate) const METADATA_AT: u64 = 2 * MIB;
pub(crate) const BAT_AT: u64 = 3 * MIB;

/// What image to build.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) virtual_size: u64,
    pub(crate) block_size: u64,
    pub(crate) logical_sector: u32,
    pub(crate) fixed: bool,
    pub(crate) log_guid: Guid,
    pub(crate) log_offset: u64,
}

impl Spec {
    /// A dynamic disk of `size` bytes, 1 MiB blocks, 512-byte sectors.
    pub(crate) fn dynamic(size: u64) -> Spec {
        Spec {
            virtual_size: size,
            block_size: MIB,
            logical_sector: 512,
            fixed: false,
            log_guid: Guid::ZERO,
            log_offset: LOG_AT,
        }
    }

    pub(crate) fn geometry(&self) -> Geometry {
        Geometry::new(&Metadata {
            block_size: self.block_size,
            leave_blocks_allocated: self.fixed,
            virtual_size: self.virtual_size,
            disk_id: Guid::ZERO,
            logical_sector: self.logical_sector,
            physical_sector: 4096,
        })
    }

    /// Where the payload blocks start.
    pub(crate) fn payload_at(&self) -> u64 {
        BAT_AT + (self.geometry().entries * 8).div_ceil(MIB).max(1) * MIB
    }

    pub(crate) fn build(&self) -> Vec<u8> {
        let geo = self.geometry();
        let bat_len = self.payload_at() - BAT_AT;
        let mut size = self.payload_at();
        if self.fixed {
            size += geo.data_blocks * self.block_size;
        }
        let mut img = vec![0u8; size as usize];
        img[..8].copy_from_slice(b"vhdxfile");
        for (i, off) in HEADER_OFFSETS.into_iter().enumerate() {
            let h = Header {
                sequence: 1 + i as u64,
                file_write_guid: Guid::new(0x1111, 1, 1, [1; 8]),
                data_write_guid: Guid::new(0x2222, 2, 2, [2; 8]),
                log_guid: self.log_guid,
                log_version: 0,
                version: 1,
                log_length: MIB as u32,
                log_offset: self.log_offset,
            };
            img[off as usize..off as usize + 4096].copy_from_slice(&h.to_bytes());
        }
        for off in TABLE_OFFSETS {
            let t = &mut img[off as usize..off as usize + TABLE_SIZE];
            t[..4].copy_from_slice(b"regi");
            put_u32(t, 8, 2);
            for (i, (g, at, len)) in [(BAT_GUID, BAT_AT, bat_len), (METADATA_GUID, METADATA_AT, MIB)]
                .into_iter()
                .enumerate()
            {
                let e = &mut t[16 + 32 * i..48 + 32 * i];
                e[..16].copy_from_slice(&g.0);
                put_u64(e, 16, at);
                put_u32(e, 24, len as u32);
                put_u32(e, 28, 1);
            }
            seal(t, 4);
        }
        let m = &mut img[METADATA_AT as usize..(METADATA_AT + MIB) as usize];
        m[..8].copy_from_slice(b"metadata");
        let items: [(Guid, u32, u32); 5] = [
            (metadata::FILE_PARAMETERS, 0x10000, 8),
            (metadata::VIRTUAL_DISK_SIZE, 0x10008, 8),
            (metadata::VIRTUAL_DISK_ID, 0x10010, 16),
            (metadata::LOGICAL_SECTOR_SIZE, 0x10020, 4),
            (metadata::PHYSICAL_SECTOR_SIZE, 0x10024, 4),
        ];
        put_u16(m, 10, items.len() as u16);
        for (i, (g, off, len)) in items.into_iter().enumerate() {
            let e = &mut m[32 + 32 * i..64 + 32 * i];
            e[..16].copy_from_slice(&g.0);
            put_u32(e, 16, off);
            put_u32(e, 20, len);
            put_u32(e, 24, 4 | 2);
        }
        put_u32(m, 0x10000, self.block_size as u32);
        put_u32(m, 0x10004, u32::from(self.fixed));
        put_u64(m, 0x10008, self.virtual_size);
        m[0x10010..0x10020].copy_from_slice(&Guid::new(0xD15C, 0x1D, 0x83, [3; 8]).0);
        put_u32(m, 0x10020, self.logical_sector);
        put_u32(m, 0x10024, 4096);
        if self.fixed {
            for b in 0..geo.data_blocks {
                let at = (BAT_AT + geo.index(b) * 8) as usize;
                put_u64(&mut img, at, (self.payload_at() + b * self.block_size) | FULLY_PRESENT);
            }
        }
        img
    }
}

/// One descriptor of a hand-built log entry.
#[derive(Debug, Clone)]
pub(crate) enum LogDesc {
    /// Write these 4096 bytes at this offset.
    Data(u64, Vec<u8>),
    /// Zero this many bytes at this offset.
    Zero(u64, u64),
}

/// A log entry per MS-VHDX 2.3.1: header and descriptors in the first
/// sectors, then one data sector per data descriptor; checksum sealed.
pub(crate) fn log_entry(guid: Guid, seq: u64, tail: u32, descs: &[LogDesc]) -> Vec<u8> {
    let desc_sectors = (descs.len() + 2).div_ceil(128);
    let data: Vec<&Vec<u8>> = descs
        .iter()
        .filter_map(|d| match d {
            LogDesc::Data(_, b) => Some(b),
            LogDesc::Zero(..) => None,
        })
        .collect();
    let len = (desc_sectors + data.len()) * 4096;
    let mut e = vec![0u8; len];
    e[..4].copy_from_slice(b"loge");
    put_u32(&mut e, 8, len as u32);
    put_u32(&mut e, 12, tail);
    put_u64(&mut e, 16, seq);
    put_u32(&mut e, 24, descs.len() as u32);
    e[32..48].copy_from_slice(&guid.0);
    let mut k = desc_sectors * 4096;
    for (i, d) in descs.iter().enumerate() {
        let p = 64 + 32 * i;
        match d {
            LogDesc::Zero(off, n) => {
                e[p..p + 4].copy_from_slice(b"zero");
                put_u64(&mut e, p + 8, *n);
                put_u64(&mut e, p + 16, *off);
            }
            LogDesc::Data(off, b) => {
                e[p..p + 4].copy_from_slice(b"desc");
                e[p + 4..p + 8].copy_from_slice(&b[4092..4096]);
                e[p + 8..p + 16].copy_from_slice(&b[..8]);
                put_u64(&mut e, p + 16, *off);
                e[k..k + 4].copy_from_slice(b"data");
                put_u32(&mut e, k + 4, (seq >> 32) as u32);
                e[k + 8..k + 4092].copy_from_slice(&b[8..4092]);
                put_u32(&mut e, k + 4092, seq as u32);
                k += 4096;
            }
        }
        put_u64(&mut e, p + 24, seq);
    }
    seal(&mut e, 4);
    e
}

/// Flip bits of the byte at `off` of `dev` (a torn or damaged write).
pub(crate) fn corrupt_byte(dev: &MemDevice, off: u64) {
    let mut b = [0u8; 1];
    dev.read_at(off, &mut b).expect("the byte to damage is in the image");
    dev.write_at(off, &[b[0] ^ 0x5a]).expect("the image is writable");
}
