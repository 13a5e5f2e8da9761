//! Reading the inode tables whole, record by record, in inode order, with
//! the inode bitmap's verdict on each: what forensic tools need (TSK's
//! `ils`, a timeline), which a path walk cannot give — an inode the bitmap
//! calls free keeps its record until the slot is reused, and the kernel's
//! unlink (`ext4_free_inode`) leaves mode, owner, atime and crtime in it
//! (and stamps `i_dtime`, `i_mtime` and `i_ctime` with the deletion).
//!
//! Read-only and bounded: the tables are read straight from the device in
//! runs of at most [`CHUNK_BLOCKS`] blocks (each block's cached version
//! overlaid, so an open that replayed the journal in memory is seen as
//! replayed), never through the buffer cache, so a scan of a large image
//! neither evicts the cache nor grows it. Which records are read is
//! e2fsck's pass 1 choice: a group flagged `INODE_UNINIT` holds no records
//! (its table may never have been written), and on checksummed
//! filesystems the table's tail past `bg_itable_unused` holds none either,
//! unless the bitmap marks an inode there in use. A record that is all
//! zeros was never written and is not returned.

use ext4kit_format::group_desc::BG_INODE_UNINIT;
use ext4kit_format::inode::{Inode, GOOD_OLD_INODE_SIZE};
use ext4kit_format::FormatError;

use crate::bitmap::test_bit;
use crate::error::Result;
use crate::owner_scan::read_current;
use crate::volume::Volume;

/// Most inode-table blocks read at once: 1 MiB with 4 KiB blocks.
pub const CHUNK_BLOCKS: usize = 256;

/// What the record's own check says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordCheck {
    /// `metadata_csum`: the stored checksum matches the record.
    ChecksumValid,
    /// `metadata_csum`: the stored checksum does not match (a record
    /// half-written, overwritten, or never an inode at all).
    ChecksumInvalid,
    /// The filesystem keeps no inode checksums.
    NoChecksum,
    /// `i_extra_isize` does not fit the record: only its first 128 bytes
    /// were decoded (no nanoseconds, no creation time).
    Malformed,
}

/// One record of an inode table, as [`InodeTableScan`] read it.
#[derive(Debug, Clone)]
pub struct TableRecord {
    ino: u32,
    in_use: Option<bool>,
    record: Inode,
    check: RecordCheck,
}

impl TableRecord {
    /// The inode number.
    pub fn ino(&self) -> u32 {
        self.ino
    }

    /// The inode bitmap's verdict: `Some(true)` when the bit is set (in
    /// use), `Some(false)` when free, `None` when the group's bitmap block
    /// lies outside the filesystem and cannot be read.
    pub fn in_use(&self) -> Option<bool> {
        self.in_use
    }

    /// The decoded record (see [`TableRecord::check`] for how far to trust it).
    pub fn record(&self) -> &Inode {
        &self.record
    }

    /// What the record's checksum (or its layout) says about it.
    pub fn check(&self) -> RecordCheck {
        self.check
    }
}

/// Every written record of every inode table ([`scan`]), an iterator of
/// `Result<TableRecord>`: a device error ends it with that error.
#[derive(Debug)]
pub struct InodeTableScan<'v> {
    vol: &'v Volume,
    /// The group being read, the next group to open, and the group's
    /// records still to read (`next..end`).
    group: usize,
    next_group: usize,
    next: usize,
    end: usize,
    /// The group's inode bitmap, if it could be read.
    bitmap: Option<Vec<u8>>,
    /// Table blocks read ahead: `chunk` holds records `chunk_first..`.
    chunk: Vec<u8>,
    chunk_first: usize,
    chunk_records: usize,
    failed: bool,
}

/// Read every inode table (see the module doc). Nothing is read until the
/// iterator is advanced.
pub fn scan(vol: &Volume) -> InodeTableScan<'_> {
    InodeTableScan {
        vol,
        group: 0,
        next_group: 0,
        next: 0,
        end: 0,
        bitmap: None,
        chunk: Vec::new(),
        chunk_first: 0,
        chunk_records: 0,
        failed: false,
    }
}

impl InodeTableScan<'_> {
    /// Open the next group that holds records; `false` when none is left.
    fn advance_group(&mut self) -> Result<bool> {
        let vol = self.vol;
        let geo = vol.geo();
        let bs = vol.block_size();
        let ipg = geo.inodes_per_group() as usize;
        loop {
            self.group = self.next_group;
            let Some(grp) = vol.groups().get(self.group) else {
                return Ok(false);
            };
            self.next_group += 1;
            let gd = *grp.desc().read();
            let csum_groups = geo.has_group_desc_csum();
            if csum_groups && gd.flags & BG_INODE_UNINIT != 0 {
                continue;
            }
            let mut bm = vec![0u8; bs];
            let bitmap = read_current(vol, grp.inode_bitmap(), &mut bm)?.then_some(bm);
            // A bitmap holds one bit per inode of the group, at most a block's worth.
            let bits = ipg.min(bs * 8);
            let last_used = bitmap
                .as_ref()
                .and_then(|bm| (0..bits).rev().find(|&i| test_bit(bm, i)))
                .map_or(0, |i| i + 1);
            let by_unused = if csum_groups {
                ipg - (gd.itable_unused() as usize).min(ipg)
            } else {
                ipg
            };
            self.bitmap = bitmap;
            self.next = 0;
            self.end = by_unused.max(last_used).min(ipg);
            self.chunk_records = 0;
            self.chunk_first = 0;
            if self.end > 0 {
                return Ok(true);
            }
        }
    }

    /// Read the table blocks holding records `self.next..` of the group.
    /// `false` when the table lies outside the filesystem (a damaged
    /// descriptor): the rest of the group is skipped.
    fn fill_chunk(&mut self) -> Result<bool> {
        let vol = self.vol;
        let bs = vol.block_size();
        let isz = vol.geo().inode_size();
        let per_block = (bs / isz).max(1);
        let first_block = self.next / per_block;
        let blocks = (self.end.div_ceil(per_block) - first_block).min(CHUNK_BLOCKS);
        self.chunk.resize(blocks * bs, 0);
        let Some(table) = vol.groups().get(self.group).map(|g| g.inode_table()) else {
            return Ok(false);
        };
        if !read_current(vol, table + first_block as u64, &mut self.chunk)? {
            return Ok(false);
        }
        self.chunk_first = first_block * per_block;
        self.chunk_records = blocks * per_block;
        Ok(true)
    }

    /// The next record, or `None` at the end of the tables.
    fn step(&mut self) -> Result<Option<TableRecord>> {
        let geo = self.vol.geo();
        let isz = geo.inode_size();
        let ipg = geo.inodes_per_group() as usize;
        loop {
            if self.next >= self.end && !self.advance_group()? {
                return Ok(None);
            }
            if self.next >= self.chunk_first + self.chunk_records && !self.fill_chunk()? {
                self.next = self.end;
                continue;
            }
            let i = self.next;
            self.next += 1;
            let at = (i - self.chunk_first) * isz;
            let Some(raw) = self.chunk.get(at..at + isz) else {
                continue;
            };
            if raw.iter().all(|&b| b == 0) {
                continue;
            }
            let ino = (self.group * ipg + i + 1) as u32;
            let (record, check) = match Inode::parse(raw, ino, geo.csum_seed()) {
                Ok(r) if geo.csum_seed().is_some() => (r, RecordCheck::ChecksumValid),
                Ok(r) => (r, RecordCheck::NoChecksum),
                Err(FormatError::Checksum { .. }) => match Inode::parse_raw(raw) {
                    Ok(r) => (r, RecordCheck::ChecksumInvalid),
                    Err(_) => continue,
                },
                Err(_) => match Inode::parse_raw(&raw[..GOOD_OLD_INODE_SIZE.min(raw.len())]) {
                    Ok(r) => (r, RecordCheck::Malformed),
                    Err(_) => continue,
                },
            };
            let in_use = self.bitmap.as_ref().map(|bm| i < bm.len() * 8 && test_bit(bm, i));
            return Ok(Some(TableRecord {
                ino,
                in_use,
                record,
                check,
            }));
        }
    }
}

impl Iterator for InodeTableScan<'_> {
    type Item = Result<TableRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(r) => r.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}
