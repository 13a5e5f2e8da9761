//! Changing indirect block maps (ext2/ext3 files, the kernel's
//! `fs/ext4/indirect.c`): twelve direct pointers, then single, double and
//! triple indirect blocks of `block_size / 4` pointers each.
//!
//! An edit works on a private copy of every indirect block it changes
//! ([`IndirectMap`]), written back whole through the handle at the end, so the
//! buffer cache sees each block change once. Missing indirect blocks are
//! allocated zeroed just before the data they will point at
//! (`ext4_alloc_branch` puts the branch first); punching frees data
//! pointers in range and every indirect block it leaves with no pointers
//! (`ext4_free_branches`).
//!
//! Caller rules: the inode's write lock is held, so the indirect blocks of
//! this inode change under this edit only.

use std::collections::HashMap;
use std::ops::Range;

use ext4kit_format::indirect::{self, DIND, DIRECT, IND, TIND};

use super::balloc::{self, BlockRequest};
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// Logical blocks an indirect map can address.
pub(crate) fn limit(vol: &Volume) -> u64 {
    let bs = vol.block_size();
    DIRECT as u64 + indirect::span(1, bs) + indirect::span(2, bs) + indirect::span(3, bs)
}

/// An indirect map being edited: the root pointers and private copies of
/// the indirect blocks changed so far.
pub(crate) struct IndirectMap<'a> {
    vol: &'a Volume,
    ino: u32,
    /// The 15 pointers of `i_block`.
    root: [u32; 15],
    /// Changed (or new) indirect blocks, by block number.
    dirty: HashMap<u64, Vec<u8>>,
    /// Allocation goal for the next block (`ext4_find_goal`: after the
    /// previous block of the file).
    goal: u64,
    /// Indirect blocks allocated by this edit.
    meta_alloc: u64,
    /// Indirect blocks freed by this edit.
    meta_freed: u64,
    /// Data blocks freed by this edit.
    data_freed: u64,
}

/// The state of one punch: its range and the blocks freed so far, given
/// back together at the end (`balloc::free_runs`: one bitmap change per
/// group).
struct Punch {
    start: u64,
    end: u64,
    runs: Vec<(u64, u64)>,
}

impl Punch {
    fn free(&mut self, p: u64) {
        if let Some((s, n)) = self.runs.last_mut() {
            if *s + *n == p {
                *n += 1;
                return;
            }
        }
        self.runs.push((p, 1));
    }
}

impl<'a> IndirectMap<'a> {
    /// Start editing inode `ino`'s map (its `i_block`), allocating from
    /// `goal` on.
    pub(crate) fn new(vol: &'a Volume, ino: u32, i_block: &[u8; 60], goal: u64) -> IndirectMap<'a> {
        IndirectMap {
            vol,
            ino,
            root: indirect::root_pointers(i_block),
            dirty: HashMap::new(),
            goal,
            meta_alloc: 0,
            meta_freed: 0,
            data_freed: 0,
        }
    }

    /// Where the next block is allocated.
    pub(crate) fn set_goal(&mut self, goal: u64) {
        self.goal = goal;
    }

    /// Indirect blocks this edit allocated.
    pub(crate) fn meta_alloc(&self) -> u64 {
        self.meta_alloc
    }

    /// Blocks this edit freed, indirect and data.
    pub(crate) fn freed(&self) -> u64 {
        self.meta_freed + self.data_freed
    }

    /// Allocate up to `want` blocks at the goal. Pointers are 32 bits, so
    /// on a 64bit filesystem the blocks must lie below 2^32 (mballoc's
    /// `EXT4_MAX_BLOCK_FILE_PHYS` rule for non-extent files). A run that
    /// does not is given back and the goal moves to the start.
    pub(crate) fn alloc(&self, h: &mut Handle<'_>, want: u32) -> Result<(u64, u32)> {
        const LIMIT: u64 = 1 << 32;
        let vol = self.vol;
        let mut goal = if self.goal >= LIMIT {
            vol.geo().first_data_block()
        } else {
            self.goal
        };
        let mut want = want;
        // At most: the goal's try, a try from the start of the filesystem,
        // and a trimmed run that ends at the limit.
        for _ in 0..3 {
            let (p, n) = balloc::new_blocks(vol, h, BlockRequest::near(goal, want))?;
            if p + n as u64 <= LIMIT {
                return Ok((p, n));
            }
            balloc::free_runs(vol, h, &[(p, n as u64)])?;
            if p < LIMIT {
                want = (LIMIT - p) as u32;
                goal = p;
            } else {
                goal = vol.geo().first_data_block();
            }
        }
        Err(Error::posix(
            Errno::ENOSPC,
            "no free block below 2^32 for an indirect-mapped file",
        ))
    }

    /// Pointer `i` of indirect block `blk`, seen through the edit's copies.
    fn ptr(&self, blk: u64, i: usize) -> Result<u32> {
        if let Some(d) = self.dirty.get(&blk) {
            return Ok(indirect::pointer(d, i));
        }
        let buf = self
            .vol
            .buffer(blk)
            .map_err(|e| super::error::annotate(e, &format!("indirect block of inode {}", self.ino)))?;
        Ok(indirect::pointer(&buf.data, i))
    }

    fn set_ptr(&mut self, blk: u64, i: usize, v: u32) -> Result<()> {
        let d = match self.dirty.entry(blk) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => slot.insert(self.vol.buffer(blk)?.data.to_vec()),
        };
        d[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        Ok(())
    }

    /// Physical block of `lblk` (0 for a hole).
    pub(crate) fn get(&self, lblk: u64) -> Result<u32> {
        let Some(path) = indirect::path_for(lblk, self.vol.block_size()) else {
            return Ok(0);
        };
        let mut p = self.root[path.root];
        for &i in &path.levels {
            if p == 0 {
                return Ok(0);
            }
            p = self.ptr(p as u64, i)?;
        }
        Ok(p)
    }

    /// Allocate one zeroed indirect block.
    fn new_block(&mut self, h: &mut Handle<'_>) -> Result<u32> {
        let (b, _) = self.alloc(h, 1)?;
        self.goal = b + 1;
        self.meta_alloc += 1;
        self.dirty.insert(b, vec![0u8; self.vol.block_size()]);
        Ok(b as u32)
    }

    /// Make sure every indirect block on the way to `lblk` exists.
    pub(crate) fn ensure_path(&mut self, h: &mut Handle<'_>, lblk: u64) -> Result<()> {
        let path = self.path(lblk)?;
        if path.levels.is_empty() {
            return Ok(());
        }
        if self.root[path.root] == 0 {
            self.root[path.root] = self.new_block(h)?;
        }
        let mut p = self.root[path.root] as u64;
        for &i in &path.levels[..path.levels.len() - 1] {
            let mut c = self.ptr(p, i)?;
            if c == 0 {
                c = self.new_block(h)?;
                self.set_ptr(p, i, c)?;
            }
            p = c as u64;
        }
        Ok(())
    }

    /// Point `lblk` at `pblk` (the path must exist: [`Self::ensure_path`]).
    pub(crate) fn set(&mut self, lblk: u64, pblk: u32) -> Result<()> {
        let path = self.path(lblk)?;
        let Some((&last, upper)) = path.levels.split_last() else {
            self.root[path.root] = pblk;
            return Ok(());
        };
        let mut p = self.root[path.root] as u64;
        for &i in upper {
            p = self.ptr(p, i)? as u64;
        }
        if p == 0 {
            return Err(Error::corrupt_msg(
                format!("inode {}", self.ino),
                "indirect map",
                format!("no indirect block on the way to logical block {lblk}"),
            ));
        }
        self.set_ptr(p, last, pblk)
    }

    fn path(&self, lblk: u64) -> Result<indirect::IndirectPath> {
        indirect::path_for(lblk, self.vol.block_size()).ok_or_else(|| {
            Error::posix(
                Errno::EFBIG,
                format!(
                    "inode {}: logical block {lblk} is past the triple-indirect range",
                    self.ino
                ),
            )
        })
    }

    /// Blocks from `lblk` that share its last-level pointer block (or the
    /// direct pointers): a hole piece is allocated within one of them, so
    /// the indirect block is placed before its data.
    pub(crate) fn piece_cap(&self, lblk: u64) -> u64 {
        let per = (self.vol.block_size() / 4) as u64;
        if lblk < DIRECT as u64 {
            DIRECT as u64 - lblk
        } else {
            per - (lblk - DIRECT as u64) % per
        }
    }

    /// Unmap `[range.start, range.end)`: free data blocks and emptied
    /// indirect blocks.
    pub(crate) fn punch(&mut self, h: &mut Handle<'_>, range: Range<u64>) -> Result<()> {
        let mut pu = Punch {
            start: range.start,
            end: range.end,
            runs: Vec::new(),
        };
        let (start, end) = (pu.start, pu.end);
        for l in start.min(DIRECT as u64)..end.min(DIRECT as u64) {
            let p = std::mem::take(&mut self.root[l as usize]);
            if p != 0 {
                pu.free(p as u64);
                self.data_freed += 1;
            }
        }
        let bs = self.vol.block_size();
        let mut base = DIRECT as u64;
        for (slot, depth) in [(IND, 1usize), (DIND, 2), (TIND, 3)] {
            let span = indirect::span(depth, bs);
            let p = self.root[slot];
            if p != 0 && start < base + span && end > base && self.punch_tree(&mut pu, p as u64, depth, base)? {
                pu.free(p as u64);
                self.dirty.remove(&(p as u64));
                self.meta_freed += 1;
                self.root[slot] = 0;
            }
            base += span;
        }
        balloc::free_runs(self.vol, h, &pu.runs)
    }

    /// Punch below indirect block `blk` (at `depth`, covering from `base`);
    /// true when it is left with no pointers (the caller frees it).
    fn punch_tree(&mut self, pu: &mut Punch, blk: u64, depth: usize, base: u64) -> Result<bool> {
        let bs = self.vol.block_size();
        let per = bs / 4;
        let span = indirect::span(depth - 1, bs);
        let lo = (pu.start.saturating_sub(base) / span) as usize;
        let hi = (pu.end.saturating_sub(base).div_ceil(span)).min(per as u64) as usize;
        for i in lo..hi {
            let p = self.ptr(blk, i)?;
            if p == 0 {
                continue;
            }
            let cbase = base + i as u64 * span;
            if depth == 1 {
                pu.free(p as u64);
                self.data_freed += 1;
                self.set_ptr(blk, i, 0)?;
            } else if self.punch_tree(pu, p as u64, depth - 1, cbase)? {
                pu.free(p as u64);
                self.dirty.remove(&(p as u64));
                self.meta_freed += 1;
                self.set_ptr(blk, i, 0)?;
            }
        }
        // Empty when no pointer is left (checked on our copy if we made one).
        let empty = match self.dirty.get(&blk) {
            Some(d) => d.iter().all(|&b| b == 0),
            None => self.vol.buffer(blk)?.data.iter().all(|&b| b == 0),
        };
        Ok(empty)
    }

    /// Write the edit's indirect blocks and root pointers.
    pub(crate) fn finish(self, h: &mut Handle<'_>, i_block: &mut [u8; 60]) -> Result<()> {
        for (b, d) in self.dirty {
            h.overwrite(b, d.into_boxed_slice())?;
        }
        for (i, p) in self.root.iter().enumerate() {
            i_block[4 * i..4 * i + 4].copy_from_slice(&p.to_le_bytes());
        }
        Ok(())
    }
}
