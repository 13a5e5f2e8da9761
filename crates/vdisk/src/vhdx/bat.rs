//! The Block Allocation Table (MS-VHDX 2.5): where each payload block of
//! the virtual disk is in the file, if anywhere.
//!
//! Rules relied on:
//! - BAT Entry (2.5.1): 64 bits, `State` in bits 0-2, `FileOffsetMB` (the
//!   block's offset in the file in 1 MiB units) in bits 20-63.
//! - Payload BAT Entry States (2.5.1.1): `PAYLOAD_BLOCK_NOT_PRESENT` (0),
//!   `UNDEFINED` (1), `ZERO` (2) and `UNMAPPED` (3) have no data in the
//!   file and read as zeros when there is no parent; `FULLY_PRESENT` (6)
//!   reads from `FileOffsetMB`; `PARTIALLY_PRESENT` (7) exists only in a
//!   differencing VHDX. qemu spells `UNMAPPED` as 5 (from the 0.95 draft);
//!   both read as zeros.
//! - Interleaving (2.5): chunk ratio = (2^23 * LogicalSectorSize) /
//!   BlockSize; after every chunk ratio payload entries comes one sector
//!   bitmap entry, so payload block `i` is entry `i + i / chunk ratio`.
//!   Sector bitmap blocks hold data only for a differencing VHDX; they are
//!   not followed here.
//! - Size (2.5): data blocks = ceil(VirtualDiskSize / BlockSize); for a
//!   fixed or dynamic VHDX the last BAT entry is the last payload block's,
//!   so the table has data blocks + (data blocks - 1) / chunk ratio
//!   entries, and the BAT region must hold them.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::bytes::u64_at;
use super::metadata::Metadata;
use super::region::Region;
use super::{bad, read_checked, MIB};
use crate::BlockDevice;

pub(crate) const NOT_PRESENT: u64 = 0;
pub(crate) const UNDEFINED: u64 = 1;
pub(crate) const ZERO: u64 = 2;
pub(crate) const UNMAPPED: u64 = 3;
/// qemu's value for `UNMAPPED` (the 0.95 draft's).
pub(crate) const UNMAPPED_QEMU: u64 = 5;
pub(crate) const FULLY_PRESENT: u64 = 6;
pub(crate) const PARTIALLY_PRESENT: u64 = 7;
const STATE_MASK: u64 = 7;
const OFFSET_MASK: u64 = !(MIB - 1);

/// The disk's block arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) block_size: u64,
    pub(crate) virtual_size: u64,
    pub(crate) chunk_ratio: u64,
    pub(crate) data_blocks: u64,
    /// Entries the BAT must hold.
    pub(crate) entries: u64,
}

impl Geometry {
    /// The geometry `m` implies (its values already range-checked, so the
    /// chunk ratio is a power of two from 16 to 2^14).
    pub(crate) fn new(m: &Metadata) -> Geometry {
        let chunk_ratio = ((1u64 << 23) * u64::from(m.logical_sector)) / m.block_size;
        let data_blocks = m.virtual_size.div_ceil(m.block_size);
        let entries = if data_blocks == 0 {
            0
        } else {
            data_blocks + (data_blocks - 1) / chunk_ratio
        };
        Geometry {
            block_size: m.block_size,
            virtual_size: m.virtual_size,
            chunk_ratio,
            data_blocks,
            entries,
        }
    }

    /// The BAT index of payload block `block`.
    pub(crate) fn index(&self, block: u64) -> u64 {
        block + block / self.chunk_ratio
    }

    /// Bytes of the virtual disk payload block `block` holds (the last may
    /// be short).
    pub(crate) fn block_len(&self, block: u64) -> u64 {
        self.block_size.min(self.virtual_size - block * self.block_size)
    }
}

/// Where a payload block's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Block {
    /// Nowhere: the block reads as zeros.
    Zero,
    /// At this file offset.
    Data(u64),
}

/// The payload entries of a BAT, held in memory. Entries are atomics so
/// readers take no lock; only an allocation (serialized by its caller)
/// changes one, and only from a zero state to `FULLY_PRESENT`.
#[derive(Debug)]
pub(crate) struct Bat {
    /// One raw entry per payload block (sector bitmap entries are skipped).
    payload: Vec<AtomicU64>,
    region: Region,
    geo: Geometry,
}

/// What payload entry `raw` of block `block` means, checked for a
/// non-differencing disk.
fn decode(raw: u64, block: u64) -> io::Result<Block> {
    match raw & STATE_MASK {
        NOT_PRESENT | UNDEFINED | ZERO | UNMAPPED | UNMAPPED_QEMU => Ok(Block::Zero),
        FULLY_PRESENT => Ok(Block::Data(raw & OFFSET_MASK)),
        PARTIALLY_PRESENT => Err(bad(format!(
            "BAT entry of payload block {block} is PARTIALLY_PRESENT, which only a differencing disk may use"
        ))),
        s => Err(bad(format!(
            "BAT entry of payload block {block} has the reserved state {s}"
        ))),
    }
}

impl Bat {
    /// Read the BAT of a disk of geometry `geo` from `region` (already
    /// checked to lie inside the file); every payload entry's state is
    /// checked, its offset is checked by [`super::layout`].
    pub(crate) fn read(file: &dyn BlockDevice, region: Region, geo: Geometry) -> io::Result<Bat> {
        let bytes = geo
            .entries
            .checked_mul(8)
            .filter(|&n| n <= region.length)
            .ok_or_else(|| {
                bad(format!(
                "BAT region at {} holds {} bytes, too few for the {} entries a {}-byte disk of {}-byte blocks needs",
                region.offset, region.length, geo.entries, geo.virtual_size, geo.block_size
            ))
            })?;
        let mut payload = Vec::with_capacity(geo.data_blocks as usize);
        let mut block = 0u64;
        let mut chunk = vec![0u8; MIB as usize];
        let mut done = 0u64;
        while done < bytes {
            let n = (bytes - done).min(MIB) as usize;
            read_checked(file, region.offset + done, &mut chunk[..n], "BAT")?;
            for (k, e) in chunk[..n].chunks_exact(8).enumerate() {
                let index = done / 8 + k as u64;
                if block < geo.data_blocks && geo.index(block) == index {
                    let raw = u64_at(e, 0);
                    decode(raw, block)?;
                    payload.push(AtomicU64::new(raw));
                    block += 1;
                }
            }
            done += n as u64;
        }
        Ok(Bat { payload, region, geo })
    }

    /// Where payload block `block` is.
    pub(crate) fn lookup(&self, block: u64) -> Block {
        // Every stored entry passed `decode` (at read, or as we wrote it).
        decode(self.raw(block), block).unwrap_or(Block::Zero)
    }

    /// The raw entry of payload block `block`.
    pub(crate) fn raw(&self, block: u64) -> u64 {
        self.payload[block as usize].load(Ordering::Acquire)
    }

    /// Point payload block `block` at `offset` (1 MiB-aligned) as
    /// `FULLY_PRESENT`; returns the raw entry to write to the file.
    pub(crate) fn set_present(&self, block: u64, offset: u64) -> u64 {
        debug_assert_eq!(offset % MIB, 0);
        let raw = offset | FULLY_PRESENT;
        self.payload[block as usize].store(raw, Ordering::Release);
        raw
    }

    /// The file offset of payload block `block`'s entry.
    pub(crate) fn entry_offset(&self, block: u64) -> u64 {
        self.region.offset + self.geo.index(block) * 8
    }

    /// The file space a block that reads as zeros still has reserved: a
    /// `ZERO`, `UNMAPPED` or `UNDEFINED` entry may keep its `FileOffsetMB`
    /// (qemu's fixed VHDX marks untouched blocks `ZERO` at their
    /// preallocated place), which a write may reuse once
    /// [`super::layout`] found it inside the file and apart from
    /// everything else.
    pub(crate) fn reserved(&self, block: u64) -> Option<u64> {
        let raw = self.raw(block);
        let off = raw & OFFSET_MASK;
        (matches!(raw & STATE_MASK, UNDEFINED | ZERO | UNMAPPED | UNMAPPED_QEMU) && off != 0).then_some(off)
    }

    /// Payload blocks and their places in the file, for layout checks.
    pub(crate) fn present(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.geo.data_blocks).filter_map(|b| match self.lookup(b) {
            Block::Data(off) => Some((b, off)),
            Block::Zero => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(vsize: u64, block: u64, lss: u32) -> Geometry {
        Geometry::new(&Metadata {
            block_size: block,
            leave_blocks_allocated: false,
            virtual_size: vsize,
            disk_id: Default::default(),
            logical_sector: lss,
            physical_sector: 4096,
        })
    }

    #[test]
    fn chunk_ratio_and_interleaving_follow_the_spec() {
        // 2^23 * 512 / 32 MiB = 128 payload entries per sector bitmap entry.
        let g = geo(10 << 30, 32 * MIB, 512);
        assert_eq!(g.chunk_ratio, 128);
        assert_eq!(g.data_blocks, 320);
        assert_eq!(g.index(127), 127);
        assert_eq!(g.index(128), 129, "entry 128 is the first sector bitmap entry");
        assert_eq!(g.entries, 320 + 319 / 128);
        assert_eq!(geo(64 * MIB, MIB, 4096).chunk_ratio, 32768);
        assert_eq!(geo(0, MIB, 512).entries, 0);
        let g = geo(3 * MIB + 512, MIB, 512);
        assert_eq!((g.data_blocks, g.block_len(3)), (4, 512));
    }

    #[test]
    fn states_decode_as_the_spec_says() {
        for s in [NOT_PRESENT, UNDEFINED, ZERO, UNMAPPED, UNMAPPED_QEMU] {
            assert_eq!(decode(s | (5 * MIB), 0).unwrap(), Block::Zero);
        }
        assert_eq!(decode(FULLY_PRESENT | (5 * MIB), 0).unwrap(), Block::Data(5 * MIB));
        assert!(decode(PARTIALLY_PRESENT, 3)
            .unwrap_err()
            .to_string()
            .contains("PARTIALLY_PRESENT"));
        assert!(decode(4, 3).is_err());
    }
}
