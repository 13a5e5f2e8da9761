//! Changing an inode's block map: mapping (allocating) logical ranges,
//! punching them out, and converting unwritten extents to written.
//!
//! This is the one entry point the rest of the engine uses to change where
//! a file's blocks are — writeback, truncate, fallocate, directory growth —
//! so the map format (extent tree or indirect map) stays this module's
//! business.
//!
//! INTERIM implementation: extent maps limited to the root in `i_block`
//! (four extents, depth 0) and indirect maps limited to direct + single
//! indirect pointers. Anything larger answers `Unsupported` before changing
//! anything. Trees of any depth and double/triple indirect maps replace it.
//!
//! Caller rules (for every function here): the caller holds the inode's
//! write lock (`i_rwsem`), passes the current record in `inode`, and writes
//! the updated record through the same handle afterwards. Newly allocated
//! data blocks are NOT zeroed: the caller writes data (or zeroes) into them
//! before the handle commits (ordered mode).

use ext4kit_format::extent::{Extent, ExtentHeader, ExtentNode, NodeEntries, EXTENT_MAGIC};
use ext4kit_format::indirect;
use ext4kit_format::inode::{flags, Inode};

use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// Longest initialised extent (`EXT_INIT_MAX_LEN`).
const INIT_MAX: u64 = 32768;
/// Longest unwritten extent (`EXT_UNWRITTEN_MAX_LEN`).
const UNINIT_MAX: u64 = 32767;

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

impl Volume {
    /// Map logical blocks `[lblk, lblk + len)` of inode `ino`, allocating
    /// every hole (goal: right after the previous mapped block, else the
    /// start of the inode's group) and recording it in the block map;
    /// `i_blocks` grows by what was allocated (map metadata included). New
    /// extents are unwritten when `uninit` (fallocate); indirect maps have
    /// no unwritten state and answer EOPNOTSUPP for it, as the kernel does.
    /// Blocks already mapped are returned as they are (`new: false`).
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
        if inode.base.flags & flags::EXTENTS != 0 {
            self.map_extents_root(h, ino, inode, lblk, len, uninit)
        } else if uninit {
            Err(Error::posix(
                Errno::EOPNOTSUPP,
                format!("inode {ino}: unwritten blocks need an extent-mapped file"),
            ))
        } else {
            self.map_indirect_small(h, ino, inode, lblk, len)
        }
    }

    /// Unmap and free every block in `[start, end)` (`end = u64::MAX` for
    /// truncate), splitting an extent whose middle is punched, and lower
    /// `i_blocks` by what was freed.
    pub fn punch_blocks(&self, h: &mut Handle<'_>, ino: u32, inode: &mut Inode, start: u64, end: u64) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        if inode.base.flags & flags::EXTENTS != 0 {
            let mut ext = root_extents(ino, inode)?;
            let mut out = Vec::with_capacity(ext.len() + 1);
            let mut freed: Vec<(u64, u64)> = Vec::new();
            for e in ext.drain(..) {
                let (s, l) = (e.block as u64, e.length() as u64);
                let (ps, pe) = (s.max(start), (s + l).min(end));
                if ps >= pe {
                    out.push(e);
                    continue;
                }
                if s < ps {
                    out.push(Extent::new(s as u32, (ps - s) as u32, e.start(), e.is_uninit()));
                }
                freed.push((e.start() + (ps - s), pe - ps));
                if pe < s + l {
                    out.push(Extent::new(
                        pe as u32,
                        (s + l - pe) as u32,
                        e.start() + (pe - s),
                        e.is_uninit(),
                    ));
                }
            }
            if out.len() > 4 {
                return Err(Error::Unsupported(format!(
                    "inode {ino}: punching this range needs an extent tree deeper than the inode root (not yet)"
                )));
            }
            set_root_extents(inode, &out);
            for (p, n) in freed {
                self.free_run(h, p, n)?;
                sub_blocks(inode, n, self.block_size);
            }
            Ok(())
        } else {
            let bs = self.block_size;
            let per = (bs / 4) as u64;
            let mut root = indirect::root_pointers(&inode.base.block);
            if root[indirect::DIND] != 0 || root[indirect::TIND] != 0 {
                return Err(Error::Unsupported(format!(
                    "inode {ino}: double/triple indirect maps are not writable yet"
                )));
            }
            let mut freed = 0u64;
            for l in start.min(indirect::DIRECT as u64)..end.min(indirect::DIRECT as u64) {
                let p = std::mem::take(&mut root[l as usize]);
                if p != 0 {
                    self.free_run(h, p as u64, 1)?;
                    freed += 1;
                }
            }
            let ib = root[indirect::IND] as u64;
            if ib != 0 {
                let lo = start.max(indirect::DIRECT as u64) - indirect::DIRECT as u64;
                let hi = end.saturating_sub(indirect::DIRECT as u64).min(per);
                let mut ptrs = self.buffer(ib)?.data.to_vec();
                for i in lo..hi {
                    let o = 4 * i as usize;
                    let p = u32::from_le_bytes([ptrs[o], ptrs[o + 1], ptrs[o + 2], ptrs[o + 3]]);
                    if p != 0 {
                        self.free_run(h, p as u64, 1)?;
                        freed += 1;
                        ptrs[o..o + 4].fill(0);
                    }
                }
                if ptrs.iter().all(|&b| b == 0) {
                    self.free_run(h, ib, 1)?;
                    freed += 1;
                    root[indirect::IND] = 0;
                } else if lo < hi {
                    h.overwrite(ib, ptrs.into_boxed_slice())?;
                }
            }
            for (i, p) in root.iter().enumerate() {
                inode.base.block[4 * i..4 * i + 4].copy_from_slice(&p.to_le_bytes());
            }
            sub_blocks(inode, freed, bs);
            Ok(())
        }
    }

    /// Mark `[lblk, lblk + len)` written: unwritten extents there become
    /// ordinary ones (split where the range covers only part of one). The
    /// caller has written the data first.
    pub fn mark_written(&self, _h: &mut Handle<'_>, ino: u32, inode: &mut Inode, lblk: u64, len: u64) -> Result<()> {
        if inode.base.flags & flags::EXTENTS == 0 || len == 0 {
            return Ok(());
        }
        let end = lblk.saturating_add(len);
        let ext = root_extents(ino, inode)?;
        let mut out: Vec<Extent> = Vec::with_capacity(ext.len() + 2);
        for e in ext {
            let (s, l) = (e.block as u64, e.length() as u64);
            let (ps, pe) = (s.max(lblk), (s + l).min(end));
            if !e.is_uninit() || ps >= pe {
                out.push(e);
                continue;
            }
            if s < ps {
                out.push(Extent::new(s as u32, (ps - s) as u32, e.start(), true));
            }
            out.push(Extent::new(ps as u32, (pe - ps) as u32, e.start() + (ps - s), false));
            if pe < s + l {
                out.push(Extent::new(pe as u32, (s + l - pe) as u32, e.start() + (pe - s), true));
            }
        }
        let out = merge(out);
        if out.len() > 4 {
            return Err(Error::Unsupported(format!(
                "inode {ino}: converting this range needs an extent tree deeper than the inode root (not yet)"
            )));
        }
        set_root_extents(inode, &out);
        Ok(())
    }

    /// Free `n` blocks from `p`, a group at a time (an extent may cross a
    /// group boundary; `free_blocks` takes one group).
    fn free_run(&self, h: &mut Handle<'_>, mut p: u64, mut n: u64) -> Result<()> {
        while n > 0 {
            let g = (p - self.first_data_block) / self.blocks_per_group;
            let group_end = self.group_first_block(g) + self.blocks_per_group;
            let k = n.min(group_end - p);
            self.free_blocks(h, p, k as u32)?;
            p += k;
            n -= k;
        }
        Ok(())
    }

    fn map_extents_root(
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
            .filter(|&e| e <= 1 << 32)
            .ok_or_else(|| Error::posix(Errno::EFBIG, format!("inode {ino}: block {lblk}+{len} past 2^32")))?;
        let mut ext = root_extents(ino, inode)?;
        let mut runs = Vec::new();
        let mut new_runs: Vec<(u64, u64)> = Vec::new();
        let mut l = lblk;
        let g = ((ino - 1) / self.inodes_per_group) as u64;
        let mut goal = self.group_first_block(g);
        while l < end {
            let i = ext.partition_point(|e| e.block as u64 + e.length() as u64 <= l);
            if let Some(e) = ext.get(i).filter(|e| (e.block as u64) <= l) {
                let off = l - e.block as u64;
                let n = (e.length() as u64 - off).min(end - l);
                runs.push(MappedRun {
                    lblk: l,
                    pblk: e.start() + off,
                    len: n,
                    uninit: e.is_uninit(),
                    new: false,
                });
                goal = e.start() + off + n;
                l += n;
                continue;
            }
            if let Some(prev) = i.checked_sub(1).and_then(|k| ext.get(k)) {
                goal = prev.start() + prev.length() as u64 + (l - prev.block as u64 - prev.length() as u64);
            }
            let hole_end = ext.get(i).map_or(end, |e| (e.block as u64).min(end));
            let cap = if uninit { UNINIT_MAX } else { INIT_MAX };
            let want = (hole_end - l).min(cap) as u32;
            let (p, n) = match self.alloc_blocks(h, goal, want) {
                Ok(r) => r,
                Err(e) => {
                    for (p, n) in new_runs {
                        self.free_run(h, p, n)?;
                    }
                    return Err(e);
                }
            };
            new_runs.push((p, n as u64));
            ext.insert(i, Extent::new(l as u32, n, p, uninit));
            runs.push(MappedRun {
                lblk: l,
                pblk: p,
                len: n as u64,
                uninit,
                new: true,
            });
            goal = p + n as u64;
            l += n as u64;
        }
        let ext = merge(ext);
        if ext.len() > 4 {
            for (p, n) in new_runs {
                self.free_run(h, p, n)?;
            }
            return Err(Error::Unsupported(format!(
                "inode {ino}: more than four extents need an extent tree below the inode root (not yet)"
            )));
        }
        set_root_extents(inode, &ext);
        add_blocks(inode, new_runs.iter().map(|r| r.1).sum(), self.block_size);
        Ok(runs)
    }

    fn map_indirect_small(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        inode: &mut Inode,
        lblk: u64,
        len: u64,
    ) -> Result<Vec<MappedRun>> {
        let bs = self.block_size;
        let per = (bs / 4) as u64;
        let end = lblk.saturating_add(len);
        if end > indirect::DIRECT as u64 + per {
            return Err(Error::Unsupported(format!(
                "inode {ino}: blocks past the single-indirect range need double-indirect maps (not yet)"
            )));
        }
        let mut root = indirect::root_pointers(&inode.base.block);
        let mut ind: Option<Vec<u8>> = match root[indirect::IND] {
            0 => None,
            b => Some(self.buffer(b as u64)?.data.to_vec()),
        };
        let g = ((ino - 1) / self.inodes_per_group) as u64;
        let mut goal = self.group_first_block(g);
        let mut runs: Vec<MappedRun> = Vec::new();
        let mut allocated = 0u64;
        let mut new_ind = None;
        for l in lblk..end {
            let cur = if l < indirect::DIRECT as u64 {
                root[l as usize]
            } else {
                let o = 4 * (l - indirect::DIRECT as u64) as usize;
                ind.as_ref()
                    .map_or(0, |b| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]))
            };
            let (p, new) = if cur != 0 {
                (cur as u64, false)
            } else {
                if l >= indirect::DIRECT as u64 && ind.is_none() {
                    let (ib, _) = self.alloc_blocks(h, goal, 1)?;
                    allocated += 1;
                    new_ind = Some(ib);
                    root[indirect::IND] = ib as u32;
                    ind = Some(vec![0u8; bs]);
                    goal = ib + 1;
                }
                let (p, _) = self.alloc_blocks(h, goal, 1)?;
                allocated += 1;
                if l < indirect::DIRECT as u64 {
                    root[l as usize] = p as u32;
                } else if let Some(b) = ind.as_mut() {
                    let o = 4 * (l - indirect::DIRECT as u64) as usize;
                    b[o..o + 4].copy_from_slice(&(p as u32).to_le_bytes());
                }
                (p, true)
            };
            goal = p + 1;
            match runs.last_mut() {
                Some(r) if r.pblk + r.len == p && r.new == new => r.len += 1,
                _ => runs.push(MappedRun {
                    lblk: l,
                    pblk: p,
                    len: 1,
                    uninit: false,
                    new,
                }),
            }
        }
        let _ = new_ind;
        if let Some(b) = ind {
            if end > indirect::DIRECT as u64 {
                h.overwrite(root[indirect::IND] as u64, b.into_boxed_slice())?;
            }
        }
        for (i, p) in root.iter().enumerate() {
            inode.base.block[4 * i..4 * i + 4].copy_from_slice(&p.to_le_bytes());
        }
        add_blocks(inode, allocated, bs);
        Ok(runs)
    }
}

/// The extents of a depth-0 root (an empty list for a fresh inode).
fn root_extents(ino: u32, inode: &Inode) -> Result<Vec<Extent>> {
    let node = ExtentNode::parse(&inode.base.block).map_err(|e| Error::corrupt(format!("inode {ino}"), e))?;
    match node.entries {
        NodeEntries::Leaf(v) => Ok(v),
        NodeEntries::Index(_) => Err(Error::Unsupported(format!(
            "inode {ino}: changing extent trees deeper than the inode root is not supported yet"
        ))),
    }
}

fn set_root_extents(inode: &mut Inode, ext: &[Extent]) {
    let node = ExtentNode {
        header: ExtentHeader {
            magic: EXTENT_MAGIC,
            entries: ext.len() as u16,
            max: 4,
            depth: 0,
            generation: 0,
        },
        entries: NodeEntries::Leaf(ext.to_vec()),
    };
    inode.base.block = [0; 60];
    node.serialize_into(&mut inode.base.block);
}

/// Join neighbours that are contiguous logically and physically and share
/// the unwritten state, within the length limits.
fn merge(ext: Vec<Extent>) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::with_capacity(ext.len());
    for e in ext {
        if let Some(last) = out.last_mut() {
            let cap = if e.is_uninit() { UNINIT_MAX } else { INIT_MAX };
            let ll = last.length() as u64;
            if last.is_uninit() == e.is_uninit()
                && last.block as u64 + ll == e.block as u64
                && last.start() + ll == e.start()
                && ll + e.length() as u64 <= cap
            {
                *last = Extent::new(last.block, (ll + e.length() as u64) as u32, last.start(), e.is_uninit());
                continue;
            }
        }
        out.push(e);
    }
    out
}

/// `i_blocks` counts 512-byte sectors (files under 2^48 sectors; the
/// HUGE_FILE per-inode unit is never set by us).
fn add_blocks(inode: &mut Inode, n: u64, bs: usize) {
    let cur = (inode.base.blocks_high as u64) << 32 | inode.base.blocks_lo as u64;
    set_sectors(inode, cur + n * (bs as u64 / 512));
}

fn sub_blocks(inode: &mut Inode, n: u64, bs: usize) {
    let cur = (inode.base.blocks_high as u64) << 32 | inode.base.blocks_lo as u64;
    set_sectors(inode, cur.saturating_sub(n * (bs as u64 / 512)));
}

fn set_sectors(inode: &mut Inode, s: u64) {
    inode.base.blocks_lo = s as u32;
    inode.base.blocks_high = (s >> 32) as u16;
}
