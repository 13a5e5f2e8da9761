//! Changing an inode's block map: mapping (allocating) logical ranges,
//! punching them out, and converting unwritten extents to written.
//!
//! This is the one entry point the rest of the engine uses to change where
//! a file's blocks are — writeback, truncate, fallocate, directory growth —
//! so the map format (extent tree or indirect map) stays this module's
//! business.
//!
//! Extent trees of any depth are changed by [`super::extent_tree`],
//! indirect maps (direct, single, double, triple) by
//! [`super::indirect_map`]; this module decides what to change.
//!
//! ENOSPC (or any error) part-way through [`Volume::map_blocks`]: every
//! block this call allocated is punched out again before the error is
//! returned, so the map is as it was before the call and no block leaks
//! (blocks that were already mapped stay mapped). The handle then holds
//! the allocate-and-give-back bitmap changes and `inode` its unchanged map:
//! writing the record and committing is harmless, dropping the handle is
//! too (the in-memory counters already match the bitmaps).
//!
//! Punching the middle of an extent and converting part of an unwritten
//! one can need a new tree node; those may use the root reserve
//! (`s_r_blocks_count`), like the kernel's `EXT4_EX_NOFAIL`, so truncate
//! and unlink work on a filesystem an unprivileged writer has filled.
//! Data blocks and nodes for new mappings never do (see `alloc_blocks`).
//!
//! Caller rules (for every function here): the caller holds the inode's
//! write lock (`i_rwsem`), passes the current record in `inode`, and writes
//! the updated record through the same handle afterwards. Newly allocated
//! data blocks are NOT zeroed: the caller writes data (or zeroes) into them
//! before the handle commits (ordered mode).

use ext4kit_format::extent::Extent;
use ext4kit_format::inode::{flags, Inode};

use super::extent_tree::{convert_leaf, merge, punch_leaf, EditKind, INIT_MAX, UNINIT_MAX};
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// A run of logical blocks as mapped after [`Volume::map_blocks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedRun {
    /// First logical block.
    pub lblk: u64,
    /// First physical block.
    pub pblk: u64,
    /// Blocks in the run.
    pub len: u64,
    /// Unwritten (reads as zeros until [`Volume::mark_written`]).
    pub uninit: bool,
    /// Allocated by this call (its contents are garbage until written).
    pub new: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MapKind {
    Extents,
    Indirect,
    NoBlocks,
    Inline,
}

/// Extent trees address logical blocks below 2^32 (`ee_block` is 32 bits).
const EXTENT_LIMIT: u64 = 1 << 32;

impl Volume {
    /// Map logical blocks `[lblk, lblk + len)` of inode `ino`, allocating
    /// every hole (goal: right after the previous mapped block, else the
    /// start of the inode's group) and recording it in the block map;
    /// `i_blocks` grows by what was allocated (map metadata included). New
    /// extents are unwritten when `uninit` (fallocate); indirect maps have
    /// no unwritten state and answer EOPNOTSUPP for it, as the kernel does.
    /// Blocks already mapped are returned as they are (`new: false`).
    /// On error nothing this call allocated stays allocated.
    pub fn map_blocks(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        inode: &mut Inode,
        lblk: u64,
        len: u64,
        uninit: bool,
    ) -> Result<Vec<MappedRun>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        match self.map_kind(inode) {
            MapKind::Extents | MapKind::Indirect => {}
            MapKind::NoBlocks => {
                return Err(Error::posix(
                    Errno::EINVAL,
                    format!("inode {ino} keeps no data blocks (device, fifo, socket or fast symlink)"),
                ))
            }
            MapKind::Inline => {
                return Err(Error::Unsupported(format!(
                    "inode {ino}: inline data must be moved to blocks before mapping blocks"
                )))
            }
        }
        if inode.base.flags & flags::EXTENTS != 0 {
            self.map_extents(h, ino, inode, lblk, len, uninit)
        } else if uninit {
            Err(Error::posix(
                Errno::EOPNOTSUPP,
                format!("inode {ino}: unwritten blocks need an extent-mapped file"),
            ))
        } else {
            self.map_indirect(h, ino, inode, lblk, len)
        }
    }

    /// Unmap and free every block in `[start, end)` (`end = u64::MAX` for
    /// truncate), splitting an extent whose middle is punched, freeing map
    /// blocks left empty (the tree loses depth when it fits in the inode
    /// again), and lower `i_blocks` by what was freed.
    pub fn punch_blocks(&self, h: &mut Handle<'_>, ino: u32, inode: &mut Inode, start: u64, end: u64) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        match self.map_kind(inode) {
            MapKind::Extents | MapKind::Indirect => {}
            // i_block holds no pointers: nothing to free.
            MapKind::NoBlocks => return Ok(()),
            MapKind::Inline => {
                return Err(Error::Unsupported(format!(
                    "inode {ino}: punching inline data is not done through the block map"
                )))
            }
        }
        if inode.base.flags & flags::EXTENTS != 0 {
            if start >= EXTENT_LIMIT {
                return Ok(());
            }
            let mut freed: Vec<(u64, u64)> = Vec::new();
            let goal = self.inode_goal(ino);
            let cx = self.ext_edit(h, ino, inode, goal, start, end, EditKind::Punch, &mut |leaf| {
                punch_leaf(leaf, start, end, &mut freed);
                Ok(())
            })?;
            // Directory and symlink blocks live in the buffer cache; freeing
            // drops them from it (`forget_freed`).
            let data: u64 = freed.iter().map(|&(_, n)| n).sum();
            // One bitmap change per group, however fragmented the range.
            self.free_block_runs(h, &freed)?;
            add_blocks(inode, cx.meta_alloc, self.block_size());
            sub_blocks(inode, data + cx.meta_freed, self.block_size());
            Ok(())
        } else {
            let mut st = self.ind_state(ino, &inode.base.block, self.inode_goal(ino));
            self.ind_punch(h, &mut st, start, end)?;
            let freed = st.data_freed + st.meta_freed;
            self.ind_finish(h, st, &mut inode.base.block)?;
            sub_blocks(inode, freed, self.block_size());
            Ok(())
        }
    }

    /// Mark `[lblk, lblk + len)` written: unwritten extents there become
    /// ordinary ones (split where the range covers only part of one, then
    /// merged with written neighbours). The caller has written the data
    /// first. Indirect maps have nothing unwritten: a no-op.
    pub fn mark_written(&self, h: &mut Handle<'_>, ino: u32, inode: &mut Inode, lblk: u64, len: u64) -> Result<()> {
        if self.map_kind(inode) != MapKind::Extents || len == 0 || lblk >= EXTENT_LIMIT {
            return Ok(());
        }
        let end = lblk.saturating_add(len);
        let goal = self.inode_goal(ino);
        let cx = self.ext_edit(h, ino, inode, goal, lblk, end, EditKind::Convert, &mut |leaf| {
            convert_leaf(leaf, lblk, end);
            Ok(())
        })?;
        add_blocks(inode, cx.meta_alloc, self.block_size());
        sub_blocks(inode, cx.meta_freed, self.block_size());
        Ok(())
    }

    /// Free `n` blocks from `p`, a group at a time (an extent may cross a
    /// group boundary; `free_blocks` takes one group).
    pub(crate) fn free_run(&self, h: &mut Handle<'_>, p: u64, n: u64) -> Result<()> {
        self.free_block_runs(h, &[(p, n)])
    }

    /// What `i_block` holds for this inode. Devices, fifos, sockets and
    /// fast symlinks keep no pointers there (a symlink's target text must
    /// never be read as block numbers); inline data is not a block map.
    fn map_kind(&self, inode: &Inode) -> MapKind {
        use ext4kit_format::inode::FileType;
        if inode.has_inline_data() {
            return MapKind::Inline;
        }
        match inode.file_type() {
            Some(FileType::CharDevice | FileType::BlockDevice | FileType::Fifo | FileType::Socket) => {
                return MapKind::NoBlocks
            }
            // ext4_inode_is_fast_symlink: a target is there (size > 0) and
            // no block holds it. A fresh symlink (size 0) is being given
            // its target block.
            Some(FileType::Symlink) if inode.size() > 0 && self.is_fast_symlink(inode) => return MapKind::NoBlocks,
            _ => {}
        }
        if inode.uses_extents() {
            MapKind::Extents
        } else {
            MapKind::Indirect
        }
    }

    /// Default allocation goal: the start of the inode's group
    /// (`ext4_inode_to_goal_block` without the per-process colour).
    fn inode_goal(&self, ino: u32) -> u64 {
        let g = ((ino.max(1) - 1) / self.geo().inodes_per_group()) as u64;
        self.geo().group_first_block(g)
    }

    fn map_extents(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        inode: &mut Inode,
        lblk: u64,
        len: u64,
        uninit: bool,
    ) -> Result<Vec<MappedRun>> {
        let end = lblk
            .checked_add(len)
            .filter(|&e| e <= EXTENT_LIMIT)
            .ok_or_else(|| Error::posix(Errno::EFBIG, format!("inode {ino}: block {lblk}+{len} past 2^32")))?;
        let mut runs = Vec::new();
        let mut l = lblk;
        while l < end {
            let found = match self.ext_find(ino, inode, l) {
                Ok(f) => f,
                Err(e) => return self.map_unwind(h, ino, inode, &runs, e),
            };
            if let Some(e) = found.cur {
                let off = l - e.block as u64;
                let n = (e.length() as u64 - off).min(end - l);
                runs.push(MappedRun {
                    lblk: l,
                    pblk: e.start() + off,
                    len: n,
                    uninit: e.is_uninit(),
                    new: false,
                });
                l += n;
                continue;
            }
            // ext4_ext_find_goal: where the previous extent would continue.
            let goal = match found.prev {
                Some(p) => p.start() + (l - p.block as u64),
                None => runs.last().map_or_else(|| self.inode_goal(ino), |r| r.pblk + r.len),
            };
            let hole_end = found.next_start.map_or(end, |n| n.min(end));
            let cap = if uninit { UNINIT_MAX } else { INIT_MAX };
            let want = (hole_end - l).min(cap) as u32;
            let (p, n) = match self.alloc_blocks(h, goal, want) {
                Ok(r) => r,
                Err(e) => return self.map_unwind(h, ino, inode, &runs, e),
            };
            let ext = Extent::new(l as u32, n, p, uninit);
            let edit = self.ext_edit(h, ino, inode, p, l, l + n as u64, EditKind::Insert, &mut |leaf| {
                let pos = leaf.partition_point(|e| e.block < ext.block);
                leaf.insert(pos, ext);
                merge(leaf);
                Ok(())
            });
            let cx = match edit {
                Ok(cx) => cx,
                Err(e) => {
                    self.free_run(h, p, n as u64)?;
                    return self.map_unwind(h, ino, inode, &runs, e);
                }
            };
            add_blocks(inode, n as u64 + cx.meta_alloc, self.block_size());
            sub_blocks(inode, cx.meta_freed, self.block_size());
            runs.push(MappedRun {
                lblk: l,
                pblk: p,
                len: n as u64,
                uninit,
                new: true,
            });
            l += n as u64;
        }
        Ok(runs)
    }

    /// Undo the new runs of a failed `map_blocks` and return its error.
    fn map_unwind(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        inode: &mut Inode,
        runs: &[MappedRun],
        err: Error,
    ) -> Result<Vec<MappedRun>> {
        for r in runs.iter().rev().filter(|r| r.new) {
            self.punch_blocks(h, ino, inode, r.lblk, r.lblk + r.len)?;
        }
        Err(err)
    }

    fn map_indirect(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        inode: &mut Inode,
        lblk: u64,
        len: u64,
    ) -> Result<Vec<MappedRun>> {
        let end = lblk
            .checked_add(len)
            .filter(|&e| e <= self.ind_limit())
            .ok_or_else(|| {
                Error::posix(
                    Errno::EFBIG,
                    format!("inode {ino}: block {lblk}+{len} past the triple-indirect range"),
                )
            })?;
        let mut st = self.ind_state(ino, &inode.base.block, self.inode_goal(ino));
        let mut runs: Vec<MappedRun> = Vec::new();
        let mut data_alloc = 0u64;
        let r = self.map_indirect_runs(h, &mut st, lblk, end, &mut runs, &mut data_alloc);
        if let Err(e) = r {
            // Punch what this call mapped (and, at the failing block, any
            // indirect blocks it left empty) back out.
            let mut at_fail = runs.last().map_or(lblk, |r| r.lblk + r.len);
            for r in runs.iter().rev().filter(|r| r.new) {
                self.ind_punch(h, &mut st, r.lblk, r.lblk + r.len)?;
            }
            while at_fail < end && self.ind_get(&st, at_fail)? != 0 {
                at_fail += 1;
            }
            if at_fail < end {
                self.ind_punch(h, &mut st, at_fail, at_fail + 1)?;
            }
            let net = st.meta_alloc + data_alloc;
            let freed = st.meta_freed + st.data_freed;
            self.ind_finish(h, st, &mut inode.base.block)?;
            add_blocks(inode, net, self.block_size());
            sub_blocks(inode, freed, self.block_size());
            return Err(e);
        }
        let alloc = st.meta_alloc + data_alloc;
        self.ind_finish(h, st, &mut inode.base.block)?;
        add_blocks(inode, alloc, self.block_size());
        Ok(runs)
    }

    fn map_indirect_runs(
        &self,
        h: &mut Handle<'_>,
        st: &mut super::indirect_map::IndState,
        lblk: u64,
        end: u64,
        runs: &mut Vec<MappedRun>,
        data_alloc: &mut u64,
    ) -> Result<()> {
        if lblk > 0 {
            let prev = self.ind_get(st, lblk - 1)?;
            if prev != 0 {
                st.goal = prev as u64 + 1;
            }
        }
        let mut l = lblk;
        while l < end {
            let p = self.ind_get(st, l)?;
            if p != 0 {
                push_run(runs, l, p as u64, 1, false);
                st.goal = p as u64 + 1;
                l += 1;
                continue;
            }
            // A hole piece inside one pointer block: its path first, then
            // one contiguous data run.
            let cap = self.ind_piece_cap(l).min(end - l);
            let mut n = 1;
            while n < cap && self.ind_get(st, l + n)? == 0 {
                n += 1;
            }
            self.ind_ensure_path(h, st, l)?;
            let (pb, got) = self.ind_alloc(h, st.goal, n as u32)?;
            *data_alloc += got as u64;
            for k in 0..got as u64 {
                if let Err(e) = self.ind_set(st, l + k, (pb + k) as u32) {
                    // Blocks not yet in the map go straight back.
                    self.free_run(h, pb + k, got as u64 - k)?;
                    *data_alloc -= got as u64 - k;
                    if k > 0 {
                        push_run(runs, l, pb, k, true);
                    }
                    return Err(e);
                }
            }
            push_run(runs, l, pb, got as u64, true);
            st.goal = pb + got as u64;
            l += got as u64;
        }
        Ok(())
    }
}

fn push_run(runs: &mut Vec<MappedRun>, lblk: u64, pblk: u64, len: u64, new: bool) {
    if let Some(r) = runs.last_mut() {
        if r.lblk + r.len == lblk && r.pblk + r.len == pblk && r.new == new {
            r.len += len;
            return;
        }
    }
    runs.push(MappedRun {
        lblk,
        pblk,
        len,
        uninit: false,
        new,
    });
}

/// `i_blocks` counts 512-byte sectors, or filesystem blocks when the inode
/// carries EXT4_HUGE_FILE_FL (`ext4_inode_blocks_set`); we never set that
/// flag but keep its unit on inodes that have it. `blocks_high` only has a
/// meaning with the huge_file feature, which is the only way a file reaches
/// 2^32 sectors.
pub(crate) fn add_blocks(inode: &mut Inode, n: u64, bs: usize) {
    let cur = inode.base.blocks();
    inode.base.set_blocks(cur + n * unit(inode, bs));
}

pub(crate) fn sub_blocks(inode: &mut Inode, n: u64, bs: usize) {
    let cur = inode.base.blocks();
    inode.base.set_blocks(cur.saturating_sub(n * unit(inode, bs)));
}

fn unit(inode: &Inode, bs: usize) -> u64 {
    if inode.base.flags & flags::HUGE_FILE != 0 {
        1
    } else {
        bs as u64 / 512
    }
}
