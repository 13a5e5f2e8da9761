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
//! ENOSPC (or any error) part-way through [`map_blocks`]: every block
//! this call allocated is punched out again before the error is returned,
//! so the map is as it was before the call and no block leaks (blocks
//! that were already mapped stay mapped). The handle then holds the
//! allocate-and-give-back bitmap changes and `rec` its unchanged map:
//! writing the record and committing is harmless, dropping the handle is
//! too (the in-memory counters already match the bitmaps).
//!
//! Punching the middle of an extent and converting part of an unwritten
//! one can need a new tree node; those may use the root reserve
//! (`s_r_blocks_count`), like the kernel's `EXT4_EX_NOFAIL`, so truncate
//! and unlink work on a filesystem an unprivileged writer has filled.
//! Data blocks and nodes for new mappings never do (see `balloc::new_blocks`).
//!
//! Caller rules (for every function here): the caller holds the inode's
//! write lock (`i_rwsem`), passes the current record in `rec`, and writes
//! the updated record through the same handle afterwards. Newly allocated
//! data blocks are NOT zeroed: the caller writes data (or zeroes) into them
//! before the handle commits (ordered mode).

use std::ops::Range;

use ext4kit_format::extent::Extent;
use ext4kit_format::inode::{flags, Inode};

use super::balloc::{self, BlockRequest};
use super::extent_tree::{self, convert_leaf, merge, punch_leaf, Edit, EditKind, INIT_MAX, UNINIT_MAX};
use super::indirect_map::{self, IndirectMap};
use super::inode::{add_blocks, is_fast_symlink, sub_blocks};
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// A run of logical blocks as mapped after [`map_blocks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedRun {
    /// First logical block.
    pub lblk: u64,
    /// First physical block.
    pub pblk: u64,
    /// Blocks in the run.
    pub len: u64,
    /// Unwritten (reads as zeros until [`mark_written`]).
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

/// A range to map: the kernel's `struct ext4_map_blocks` as
/// `ext4_map_blocks` takes it with `EXT4_GET_BLOCKS_CREATE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapRequest {
    /// First logical block.
    pub lblk: u64,
    /// Blocks to map.
    pub len: u64,
    /// New extents are unwritten (fallocate; `EXT4_GET_BLOCKS_UNWRIT_EXT`).
    pub uninit: bool,
}

/// Map logical blocks `[req.lblk, req.lblk + req.len)` of inode `ino`
/// (record `rec`), allocating every hole (goal: right after the previous
/// mapped block, else the start of the inode's group) and recording it in
/// the block map; `i_blocks` grows by what was allocated (map metadata
/// included). New extents are unwritten when `req.uninit` (fallocate);
/// indirect maps have no unwritten state and answer EOPNOTSUPP for it, as
/// the kernel does. Blocks already mapped are returned as they are
/// (`new: false`). On error nothing this call allocated stays allocated.
/// Public: the vfs layer's writeback and fallocate map through it.
pub fn map_blocks(
    vol: &Volume,
    h: &mut Handle<'_>,
    ino: u32,
    rec: &mut Inode,
    req: MapRequest,
) -> Result<Vec<MappedRun>> {
    if req.len == 0 {
        return Ok(Vec::new());
    }
    match map_kind(vol, rec) {
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
    if rec.base.flags & flags::EXTENTS != 0 {
        map_extents(vol, h, ino, rec, req)
    } else if req.uninit {
        Err(Error::posix(
            Errno::EOPNOTSUPP,
            format!("inode {ino}: unwritten blocks need an extent-mapped file"),
        ))
    } else {
        map_indirect(vol, h, ino, rec, req)
    }
}

/// Unmap and free every block in `range` (`start..u64::MAX` for
/// truncate), splitting an extent whose middle is punched, freeing map
/// blocks left empty (the tree loses depth when it fits in the inode
/// again), and lower `i_blocks` by what was freed. Public: the vfs layer's
/// truncate, hole punch and eviction.
pub fn punch(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode, range: Range<u64>) -> Result<()> {
    let Range { start, end } = range;
    if start >= end {
        return Ok(());
    }
    match map_kind(vol, rec) {
        MapKind::Extents | MapKind::Indirect => {}
        // i_block holds no pointers: nothing to free.
        MapKind::NoBlocks => return Ok(()),
        MapKind::Inline => {
            return Err(Error::Unsupported(format!(
                "inode {ino}: punching inline data is not done through the block map"
            )))
        }
    }
    let bs = vol.block_size();
    if rec.base.flags & flags::EXTENTS != 0 {
        if start >= EXTENT_LIMIT {
            return Ok(());
        }
        let mut freed: Vec<(u64, u64)> = Vec::new();
        let nodes = extent_tree::edit(
            vol,
            h,
            ino,
            rec,
            Edit {
                goal: inode_goal(vol, ino),
                start,
                end,
                kind: EditKind::Punch,
                leaf: &mut |leaf| {
                    punch_leaf(leaf, start, end, &mut freed);
                    Ok(())
                },
            },
        )?;
        // Directory and symlink blocks live in the buffer cache; freeing
        // drops them from it (`forget_freed`).
        let data: u64 = freed.iter().map(|&(_, n)| n).sum();
        // One bitmap change per group, however fragmented the range.
        balloc::free_runs(vol, h, &freed)?;
        add_blocks(rec, nodes.added, bs);
        sub_blocks(rec, data + nodes.removed, bs);
        Ok(())
    } else {
        let mut map = IndirectMap::new(vol, ino, &rec.base.block, inode_goal(vol, ino));
        map.punch(h, start..end)?;
        let freed = map.freed();
        map.finish(h, &mut rec.base.block)?;
        sub_blocks(rec, freed, bs);
        Ok(())
    }
}

/// Mark `range` written: unwritten extents there become ordinary ones
/// (split where the range covers only part of one, then merged with
/// written neighbours). The caller has written the data first. Indirect
/// maps have nothing unwritten: a no-op. Public: the vfs layer's
/// writeback into fallocated blocks.
pub fn mark_written(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode, range: Range<u64>) -> Result<()> {
    let Range { start, end } = range;
    if map_kind(vol, rec) != MapKind::Extents || start >= end || start >= EXTENT_LIMIT {
        return Ok(());
    }
    let nodes = extent_tree::edit(
        vol,
        h,
        ino,
        rec,
        Edit {
            goal: inode_goal(vol, ino),
            start,
            end,
            kind: EditKind::Convert,
            leaf: &mut |leaf| {
                convert_leaf(leaf, start, end);
                Ok(())
            },
        },
    )?;
    add_blocks(rec, nodes.added, vol.block_size());
    sub_blocks(rec, nodes.removed, vol.block_size());
    Ok(())
}

/// What `i_block` holds for this inode. Devices, fifos, sockets and fast
/// symlinks keep no pointers there (a symlink's target text must never be
/// read as block numbers); inline data is not a block map.
fn map_kind(vol: &Volume, rec: &Inode) -> MapKind {
    use ext4kit_format::inode::FileType;
    if rec.has_inline_data() {
        return MapKind::Inline;
    }
    match rec.file_type() {
        Some(FileType::CharDevice | FileType::BlockDevice | FileType::Fifo | FileType::Socket) => {
            return MapKind::NoBlocks
        }
        // ext4_inode_is_fast_symlink: a target is there (size > 0) and no
        // block holds it. A fresh symlink (size 0) is being given its
        // target block.
        Some(FileType::Symlink) if rec.size() > 0 && is_fast_symlink(vol, rec) => return MapKind::NoBlocks,
        _ => {}
    }
    if rec.uses_extents() {
        MapKind::Extents
    } else {
        MapKind::Indirect
    }
}

/// Default allocation goal: the start of the inode's group
/// (`ext4_inode_to_goal_block` without the per-process colour).
fn inode_goal(vol: &Volume, ino: u32) -> u64 {
    let g = ((ino.max(1) - 1) / vol.geo().inodes_per_group()) as u64;
    vol.geo().group_first_block(g)
}

fn map_extents(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode, req: MapRequest) -> Result<Vec<MappedRun>> {
    let MapRequest { lblk, len, uninit } = req;
    let bs = vol.block_size();
    let end = lblk
        .checked_add(len)
        .filter(|&e| e <= EXTENT_LIMIT)
        .ok_or_else(|| Error::posix(Errno::EFBIG, format!("inode {ino}: block {lblk}+{len} past 2^32")))?;
    let mut runs = Vec::new();
    let mut l = lblk;
    while l < end {
        let found = match extent_tree::find(vol, ino, rec, l) {
            Ok(f) => f,
            Err(e) => {
                unwind(vol, h, ino, rec, &runs)?;
                return Err(e);
            }
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
            None => runs.last().map_or_else(|| inode_goal(vol, ino), |r| r.pblk + r.len),
        };
        let hole_end = found.next_start.map_or(end, |n| n.min(end));
        let cap = if uninit { UNINIT_MAX } else { INIT_MAX };
        let want = (hole_end - l).min(cap) as u32;
        let (p, n) = match balloc::new_blocks(vol, h, BlockRequest::near(goal, want)) {
            Ok(r) => r,
            Err(e) => {
                unwind(vol, h, ino, rec, &runs)?;
                return Err(e);
            }
        };
        let ext = Extent::new(l as u32, n, p, uninit);
        let edited = extent_tree::edit(
            vol,
            h,
            ino,
            rec,
            Edit {
                goal: p,
                start: l,
                end: l + n as u64,
                kind: EditKind::Insert,
                leaf: &mut |leaf| {
                    let pos = leaf.partition_point(|e| e.block < ext.block);
                    leaf.insert(pos, ext);
                    merge(leaf);
                    Ok(())
                },
            },
        );
        let nodes = match edited {
            Ok(nodes) => nodes,
            Err(e) => {
                balloc::free_runs(vol, h, &[(p, n as u64)])?;
                unwind(vol, h, ino, rec, &runs)?;
                return Err(e);
            }
        };
        add_blocks(rec, n as u64 + nodes.added, bs);
        sub_blocks(rec, nodes.removed, bs);
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

/// Punch out the new runs of a failing `map_blocks`, so that it leaves
/// the map as it found it.
fn unwind(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode, runs: &[MappedRun]) -> Result<()> {
    for r in runs.iter().rev().filter(|r| r.new) {
        punch(vol, h, ino, rec, r.lblk..r.lblk + r.len)?;
    }
    Ok(())
}

fn map_indirect(
    vol: &Volume,
    h: &mut Handle<'_>,
    ino: u32,
    rec: &mut Inode,
    req: MapRequest,
) -> Result<Vec<MappedRun>> {
    let MapRequest { lblk, len, .. } = req;
    let bs = vol.block_size();
    let end = lblk
        .checked_add(len)
        .filter(|&e| e <= indirect_map::limit(vol))
        .ok_or_else(|| {
            Error::posix(
                Errno::EFBIG,
                format!("inode {ino}: block {lblk}+{len} past the triple-indirect range"),
            )
        })?;
    let mut map = IndirectMap::new(vol, ino, &rec.base.block, inode_goal(vol, ino));
    let mut runs: Vec<MappedRun> = Vec::new();
    let r = map_indirect_runs(vol, h, &mut map, lblk..end, &mut runs);
    // What this call allocated for data: the new runs it mapped.
    let data_alloc: u64 = runs.iter().filter(|r| r.new).map(|r| r.len).sum();
    if let Err(e) = r {
        // Punch what this call mapped (and, at the failing block, any
        // indirect blocks it left empty) back out.
        let mut at_fail = runs.last().map_or(lblk, |r| r.lblk + r.len);
        for r in runs.iter().rev().filter(|r| r.new) {
            map.punch(h, r.lblk..r.lblk + r.len)?;
        }
        while at_fail < end && map.get(at_fail)? != 0 {
            at_fail += 1;
        }
        if at_fail < end {
            map.punch(h, at_fail..at_fail + 1)?;
        }
        let net = map.meta_alloc() + data_alloc;
        let freed = map.freed();
        map.finish(h, &mut rec.base.block)?;
        add_blocks(rec, net, bs);
        sub_blocks(rec, freed, bs);
        return Err(e);
    }
    let alloc = map.meta_alloc() + data_alloc;
    map.finish(h, &mut rec.base.block)?;
    add_blocks(rec, alloc, bs);
    Ok(runs)
}

/// Map `range` through `map`, appending to `runs`: holes are allocated a
/// piece at a time, each piece inside one pointer block, its indirect
/// blocks placed before its data.
fn map_indirect_runs(
    vol: &Volume,
    h: &mut Handle<'_>,
    map: &mut IndirectMap<'_>,
    range: Range<u64>,
    runs: &mut Vec<MappedRun>,
) -> Result<()> {
    let Range { start: lblk, end } = range;
    if lblk > 0 {
        let prev = map.get(lblk - 1)?;
        if prev != 0 {
            map.set_goal(prev as u64 + 1);
        }
    }
    let mut l = lblk;
    while l < end {
        let p = map.get(l)?;
        if p != 0 {
            push_run(runs, l, p as u64, 1, false);
            map.set_goal(p as u64 + 1);
            l += 1;
            continue;
        }
        // A hole piece inside one pointer block: its path first, then one
        // contiguous data run.
        let cap = map.piece_cap(l).min(end - l);
        let mut n = 1;
        while n < cap && map.get(l + n)? == 0 {
            n += 1;
        }
        map.ensure_path(h, l)?;
        let (pb, got) = map.alloc(h, n as u32)?;
        for k in 0..got as u64 {
            if let Err(e) = map.set(l + k, (pb + k) as u32) {
                // Blocks not yet in the map go straight back.
                balloc::free_runs(vol, h, &[(pb + k, got as u64 - k)])?;
                if k > 0 {
                    push_run(runs, l, pb, k, true);
                }
                return Err(e);
            }
        }
        push_run(runs, l, pb, got as u64, true);
        map.set_goal(pb + got as u64);
        l += got as u64;
    }
    Ok(())
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
