//! Changing indirect block maps (ext2/ext3 files, the kernel's
//! `fs/ext4/indirect.c`): twelve direct pointers, then single, double and
//! triple indirect blocks of `block_size / 4` pointers each.
//!
//! An edit works on a private copy of every indirect block it changes
//! (`IndState`), written back whole through the handle at the end, so the
//! buffer cache sees each block change once. Missing indirect blocks are
//! allocated zeroed just before the data they will point at
//! (`ext4_alloc_branch` puts the branch first); punching frees data
//! pointers in range and every indirect block it leaves with no pointers
//! (`ext4_free_branches`).
//!
//! Caller rules: the inode's write lock is held, so the indirect blocks of
//! this inode change under this edit only.

use std::collections::HashMap;

use ext4kit_format::indirect::{self, DIND, DIRECT, IND, TIND};

use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// An indirect map being edited.
pub(crate) struct IndState {
    ino: u32,
    /// The 15 pointers of `i_block`.
    pub root: [u32; 15],
    /// Changed (or new) indirect blocks, by block number.
    dirty: HashMap<u64, Vec<u8>>,
    /// Allocation goal for the next block (`ext4_find_goal`: after the
    /// previous block of the file).
    pub goal: u64,
    /// Indirect blocks allocated by this edit.
    pub meta_alloc: u64,
    /// Indirect blocks freed by this edit.
    pub meta_freed: u64,
    /// Data blocks freed by this edit.
    pub data_freed: u64,
}

/// Accumulates freed blocks into runs, freed together at the end
/// (`free_block_runs`: one bitmap change per group).
struct Freer {
    runs: Vec<(u64, u64)>,
}

impl Volume {
    /// Logical blocks an indirect map can address.
    pub(crate) fn ind_limit(&self) -> u64 {
        let bs = self.block_size();
        DIRECT as u64 + indirect::span(1, bs) + indirect::span(2, bs) + indirect::span(3, bs)
    }

    pub(crate) fn ind_state(&self, ino: u32, i_block: &[u8; 60], goal: u64) -> IndState {
        IndState {
            ino,
            root: indirect::root_pointers(i_block),
            dirty: HashMap::new(),
            goal,
            meta_alloc: 0,
            meta_freed: 0,
            data_freed: 0,
        }
    }

    /// Pointer `i` of indirect block `blk`, seen through the edit's copies.
    fn ind_ptr(&self, st: &IndState, blk: u64, i: usize) -> Result<u32> {
        if let Some(d) = st.dirty.get(&blk) {
            return Ok(indirect::pointer(d, i));
        }
        let buf = self
            .buffer(blk)
            .map_err(|e| super::error::annotate(e, &format!("indirect block of inode {}", st.ino)))?;
        Ok(indirect::pointer(&buf.data, i))
    }

    fn ind_set_ptr(&self, st: &mut IndState, blk: u64, i: usize, v: u32) -> Result<()> {
        let d = match st.dirty.entry(blk) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => slot.insert(self.buffer(blk)?.data.to_vec()),
        };
        d[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        Ok(())
    }

    /// Physical block of `lblk` (0 for a hole).
    pub(crate) fn ind_get(&self, st: &IndState, lblk: u64) -> Result<u32> {
        let Some(path) = indirect::path_for(lblk, self.block_size()) else {
            return Ok(0);
        };
        let mut p = st.root[path.root];
        for &i in &path.levels {
            if p == 0 {
                return Ok(0);
            }
            p = self.ind_ptr(st, p as u64, i)?;
        }
        Ok(p)
    }

    /// Allocate one zeroed indirect block.
    fn ind_new_block(&self, h: &mut Handle<'_>, st: &mut IndState) -> Result<u32> {
        let (b, _) = self.ind_alloc(h, st.goal, 1)?;
        st.goal = b + 1;
        st.meta_alloc += 1;
        st.dirty.insert(b, vec![0u8; self.block_size()]);
        Ok(b as u32)
    }

    /// Allocate for an indirect-mapped file: pointers are 32 bits, so on a
    /// 64bit filesystem the blocks must lie below 2^32 (mballoc's
    /// `EXT4_MAX_BLOCK_FILE_PHYS` rule for non-extent files). A run that
    /// does not is given back and the goal moves to the start.
    pub(crate) fn ind_alloc(&self, h: &mut Handle<'_>, goal: u64, want: u32) -> Result<(u64, u32)> {
        const LIMIT: u64 = 1 << 32;
        let mut goal = if goal >= LIMIT {
            self.geo().first_data_block()
        } else {
            goal
        };
        let mut want = want;
        // At most: the goal's try, a try from the start of the
        // filesystem, and a trimmed run that ends at the limit.
        for _ in 0..3 {
            let (p, n) = self.alloc_blocks(h, goal, want)?;
            if p + n as u64 <= LIMIT {
                return Ok((p, n));
            }
            self.free_run(h, p, n as u64)?;
            if p < LIMIT {
                want = (LIMIT - p) as u32;
                goal = p;
            } else {
                goal = self.geo().first_data_block();
            }
        }
        Err(Error::posix(
            Errno::ENOSPC,
            "no free block below 2^32 for an indirect-mapped file",
        ))
    }

    /// Make sure every indirect block on the way to `lblk` exists.
    pub(crate) fn ind_ensure_path(&self, h: &mut Handle<'_>, st: &mut IndState, lblk: u64) -> Result<()> {
        let path = self.ind_path(st.ino, lblk)?;
        if path.levels.is_empty() {
            return Ok(());
        }
        if st.root[path.root] == 0 {
            st.root[path.root] = self.ind_new_block(h, st)?;
        }
        let mut p = st.root[path.root] as u64;
        for &i in &path.levels[..path.levels.len() - 1] {
            let mut c = self.ind_ptr(st, p, i)?;
            if c == 0 {
                c = self.ind_new_block(h, st)?;
                self.ind_set_ptr(st, p, i, c)?;
            }
            p = c as u64;
        }
        Ok(())
    }

    /// Point `lblk` at `pblk` (the path must exist: [`Self::ind_ensure_path`]).
    pub(crate) fn ind_set(&self, st: &mut IndState, lblk: u64, pblk: u32) -> Result<()> {
        let path = self.ind_path(st.ino, lblk)?;
        let Some((&last, upper)) = path.levels.split_last() else {
            st.root[path.root] = pblk;
            return Ok(());
        };
        let mut p = st.root[path.root] as u64;
        for &i in upper {
            p = self.ind_ptr(st, p, i)? as u64;
        }
        if p == 0 {
            return Err(Error::corrupt_msg(
                format!("inode {}", st.ino),
                "indirect map",
                format!("no indirect block on the way to logical block {lblk}"),
            ));
        }
        self.ind_set_ptr(st, p, last, pblk)
    }

    fn ind_path(&self, ino: u32, lblk: u64) -> Result<indirect::IndirectPath> {
        indirect::path_for(lblk, self.block_size()).ok_or_else(|| {
            Error::posix(
                Errno::EFBIG,
                format!("inode {ino}: logical block {lblk} is past the triple-indirect range"),
            )
        })
    }

    /// Blocks from `lblk` that share its last-level pointer block (or the
    /// direct pointers): a hole piece is allocated within one of them, so
    /// the indirect block is placed before its data.
    pub(crate) fn ind_piece_cap(&self, lblk: u64) -> u64 {
        let per = (self.block_size() / 4) as u64;
        if lblk < DIRECT as u64 {
            DIRECT as u64 - lblk
        } else {
            per - (lblk - DIRECT as u64) % per
        }
    }

    /// Unmap `[start, end)`: free data blocks and emptied indirect blocks.
    pub(crate) fn ind_punch(&self, h: &mut Handle<'_>, st: &mut IndState, start: u64, end: u64) -> Result<()> {
        let mut fr = Freer { runs: Vec::new() };
        for l in start.min(DIRECT as u64)..end.min(DIRECT as u64) {
            let p = std::mem::take(&mut st.root[l as usize]);
            if p != 0 {
                self.free_add(h, &mut fr, p as u64)?;
                st.data_freed += 1;
            }
        }
        let bs = self.block_size();
        let mut base = DIRECT as u64;
        for (slot, depth) in [(IND, 1usize), (DIND, 2), (TIND, 3)] {
            let span = indirect::span(depth, bs);
            let p = st.root[slot];
            if p != 0
                && start < base + span
                && end > base
                && self.ind_punch_tree(h, st, &mut fr, p as u64, depth, base, start, end)?
            {
                self.free_add(h, &mut fr, p as u64)?;
                st.dirty.remove(&(p as u64));
                st.meta_freed += 1;
                st.root[slot] = 0;
            }
            base += span;
        }
        self.free_flush(h, &mut fr)
    }

    /// Punch below indirect block `blk` (at `depth`, covering from `base`);
    /// true when it is left with no pointers (the caller frees it).
    #[allow(clippy::too_many_arguments)]
    fn ind_punch_tree(
        &self,
        h: &mut Handle<'_>,
        st: &mut IndState,
        fr: &mut Freer,
        blk: u64,
        depth: usize,
        base: u64,
        start: u64,
        end: u64,
    ) -> Result<bool> {
        let bs = self.block_size();
        let per = bs / 4;
        let span = indirect::span(depth - 1, bs);
        let lo = (start.saturating_sub(base) / span) as usize;
        let hi = (end.saturating_sub(base).div_ceil(span)).min(per as u64) as usize;
        for i in lo..hi {
            let p = self.ind_ptr(st, blk, i)?;
            if p == 0 {
                continue;
            }
            let cbase = base + i as u64 * span;
            if depth == 1 {
                self.free_add(h, fr, p as u64)?;
                st.data_freed += 1;
                self.ind_set_ptr(st, blk, i, 0)?;
            } else if self.ind_punch_tree(h, st, fr, p as u64, depth - 1, cbase, start, end)? {
                self.free_add(h, fr, p as u64)?;
                st.dirty.remove(&(p as u64));
                st.meta_freed += 1;
                self.ind_set_ptr(st, blk, i, 0)?;
            }
        }
        // Empty when no pointer is left (checked on our copy if we made one).
        let empty = match st.dirty.get(&blk) {
            Some(d) => d.iter().all(|&b| b == 0),
            None => self.buffer(blk)?.data.iter().all(|&b| b == 0),
        };
        Ok(empty)
    }

    fn free_add(&self, _h: &mut Handle<'_>, fr: &mut Freer, p: u64) -> Result<()> {
        if let Some((s, n)) = fr.runs.last_mut() {
            if *s + *n == p {
                *n += 1;
                return Ok(());
            }
        }
        fr.runs.push((p, 1));
        Ok(())
    }

    fn free_flush(&self, h: &mut Handle<'_>, fr: &mut Freer) -> Result<()> {
        let runs = std::mem::take(&mut fr.runs);
        self.free_block_runs(h, &runs)
    }

    /// Write the edit's indirect blocks and root pointers.
    pub(crate) fn ind_finish(&self, h: &mut Handle<'_>, st: IndState, i_block: &mut [u8; 60]) -> Result<()> {
        for (b, d) in st.dirty {
            h.overwrite(b, d.into_boxed_slice())?;
        }
        for (i, p) in st.root.iter().enumerate() {
            i_block[4 * i..4 * i + 4].copy_from_slice(&p.to_le_bytes());
        }
        Ok(())
    }
}
