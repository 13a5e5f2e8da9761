//! The dynamic disk header and the block allocation table (BAT).
//!
//! Header ("Dynamic Disk Header Format", 1024 bytes, big-endian): cookie
//! "cxsparse" (0), data offset (8, unused), table offset (16: the BAT),
//! header version (24), max table entries (28), block size (32), checksum
//! (36, as the footer's), then the parent fields of differencing disks.
//!
//! The BAT holds one big-endian u32 per block: the sector where the block
//! starts in the file, or `0xFFFFFFFF` when the block was never written
//! (it reads as zeros). A block in the file is its sector bitmap (one bit
//! per 512-byte sector, padded to whole sectors) followed by the block's
//! data.

use std::sync::atomic::{AtomicU32, Ordering};

use super::footer::{be32, be64, checksum};

/// `"cxsparse"`.
const COOKIE: &[u8; 8] = b"cxsparse";
/// Size of the dynamic disk header.
pub(super) const HEADER_LEN: usize = 1024;
/// A BAT entry for a block not in the file.
pub(super) const UNALLOCATED: u32 = 0xFFFF_FFFF;

/// The dynamic header's fields we use.
#[derive(Debug, Clone, Copy)]
pub(super) struct Header {
    /// Byte offset of the BAT.
    pub(super) table_offset: u64,
    /// BAT entries.
    pub(super) max_entries: u32,
    /// Bytes of data per block (a power of two, 2 MiB by default).
    pub(super) block_size: u64,
}

impl Header {
    /// Check `raw` as a dynamic header.
    pub(super) fn parse(raw: &[u8; HEADER_LEN]) -> Result<Header, String> {
        if &raw[..8] != COOKIE {
            return Err("no \"cxsparse\" cookie".into());
        }
        let stored = be32(raw, 36);
        let computed = checksum(raw, 36);
        if stored != computed {
            return Err(format!("checksum {stored:#010x}, the bytes sum to {computed:#010x}"));
        }
        let block_size = be32(raw, 32) as u64;
        // qemu's vpc_open: a power of two of at least one sector.
        if !block_size.is_power_of_two() || block_size < 512 {
            return Err(format!("block size {block_size} is not a power of two of at least 512"));
        }
        Ok(Header {
            table_offset: be64(raw, 16),
            max_entries: be32(raw, 28),
            block_size,
        })
    }

    /// Bytes of the sector bitmap in front of each block's data.
    pub(super) fn bitmap_len(&self) -> u64 {
        (self.block_size / 512).div_ceil(8).next_multiple_of(512)
    }
}

/// The BAT in memory. Entries are atomics: a reader loads an entry without
/// a lock, and an allocation stores it only after the block's bytes are in
/// the file (Release/Acquire), so a reader that sees the entry reads data.
#[derive(Debug)]
pub(super) struct Bat {
    entries: Vec<AtomicU32>,
    /// BAT sectors changed since the last flush (written at the flush,
    /// after the blocks they point to are durable).
    dirty: parking_lot::Mutex<std::collections::BTreeSet<u64>>,
}

impl Bat {
    /// The BAT from its bytes (big-endian u32s).
    pub(super) fn from_bytes(raw: &[u8]) -> Bat {
        Bat {
            entries: raw.chunks_exact(4).map(|c| AtomicU32::new(be32(c, 0))).collect(),
            dirty: Default::default(),
        }
    }

    /// Entry `i`'s sector, if the block is allocated.
    pub(super) fn get(&self, i: u64) -> Option<u32> {
        let e = self.entries.get(i as usize)?.load(Ordering::Acquire);
        (e != UNALLOCATED).then_some(e)
    }

    /// Point entry `i` at `sector`; its BAT sector is written at the next flush.
    pub(super) fn set(&self, i: u64, sector: u32) {
        self.entries[i as usize].store(sector, Ordering::Release);
        self.dirty.lock().insert(i * 4 / 512);
    }

    /// The BAT sectors to write, as (index of the sector in the BAT, bytes), clearing the set.
    pub(super) fn take_dirty(&self) -> Vec<(u64, [u8; 512])> {
        let sectors = std::mem::take(&mut *self.dirty.lock());
        sectors
            .into_iter()
            .map(|s| {
                let mut b = [0xFFu8; 512];
                for (k, chunk) in b.chunks_exact_mut(4).enumerate() {
                    if let Some(e) = self.entries.get((s * 128) as usize + k) {
                        chunk.copy_from_slice(&e.load(Ordering::Acquire).to_be_bytes());
                    }
                }
                (s, b)
            })
            .collect()
    }

    /// Put sectors back after a failed write, so the next flush retries them.
    pub(super) fn redirty(&self, sectors: impl IntoIterator<Item = u64>) {
        self.dirty.lock().extend(sectors);
    }

    /// Allocated entries as (block index, sector).
    pub(super) fn allocated(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| Some((i as u64, e.load(Ordering::Acquire))).filter(|x| x.1 != UNALLOCATED))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A header as qemu writes one.
    pub(crate) fn header(table_offset: u64, max_entries: u32, block_size: u32) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(COOKIE);
        h[8..16].copy_from_slice(&u64::MAX.to_be_bytes());
        h[16..24].copy_from_slice(&table_offset.to_be_bytes());
        h[24..28].copy_from_slice(&0x0001_0000u32.to_be_bytes());
        h[28..32].copy_from_slice(&max_entries.to_be_bytes());
        h[32..36].copy_from_slice(&block_size.to_be_bytes());
        let c = checksum(&h, 36);
        h[36..40].copy_from_slice(&c.to_be_bytes());
        h
    }

    #[test]
    fn bitmap_is_whole_sectors() {
        let h = Header::parse(&header(1536, 4, 2 << 20)).unwrap();
        assert_eq!(h.bitmap_len(), 512);
        let h = Header::parse(&header(1536, 4, 4096)).unwrap();
        assert_eq!(h.bitmap_len(), 512);
        assert!(Header::parse(&header(1536, 4, 3000))
            .unwrap_err()
            .contains("power of two"));
    }

    #[test]
    fn dirty_sectors_carry_every_entry_of_the_sector() {
        let mut raw = vec![0xFFu8; 1024];
        raw[4..8].copy_from_slice(&77u32.to_be_bytes());
        let bat = Bat::from_bytes(&raw);
        assert_eq!(bat.get(1), Some(77));
        assert_eq!(bat.get(0), None);
        bat.set(200, 9);
        let d = bat.take_dirty();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].0, 1);
        assert_eq!(be32(&d[0].1, (200 - 128) * 4), 9);
        assert!(bat.take_dirty().is_empty());
    }
}
