//! Logical-to-physical block mapping: extent trees of any depth, indirect
//! maps (direct, single, double, triple), and inline data.
//!
//! An extent tree is loaded once per cached inode into a sorted vector of
//! extents (the leaves in order), so a lookup is one binary search with no
//! I/O. Loading is defensive: child depth must be exactly parent depth - 1
//! (so the walk terminates), no node block may be visited twice, extents
//! must be sorted, non-overlapping and inside the filesystem.
//!
//! Indirect maps are walked per lookup through the metadata buffer cache.

use std::collections::HashSet;

use ext4kit_format::extent::{verify_block_checksum, Extent, ExtentNode, NodeEntries};
use ext4kit_format::indirect;
use ext4kit_format::inode::Inode;

use super::volume::Volume;
use super::{inode, xattr};
use crate::error::{Error, Result};

/// How a logical block (and the run that starts there) is backed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// Not allocated: reads as zeros for `len` blocks (`u64::MAX` past the
    /// last mapping).
    Hole {
        /// Length of the hole from the queried block.
        len: u64,
    },
    /// Allocated at `pblk` for `len` contiguous blocks; `uninit` extents read
    /// as zeros.
    Mapped {
        /// Physical block of the queried logical block.
        pblk: u64,
        /// Contiguous blocks from there.
        len: u64,
        /// Allocated but unwritten (fallocate).
        uninit: bool,
    },
}

/// The block map of one inode, ready for lookups.
#[derive(Debug, Clone)]
pub enum BlockMap {
    /// Extent tree, flattened to its leaves in logical order.
    Extents(Vec<Extent>),
    /// Classic indirect map: the 15 pointers of `i_block`.
    Indirect([u32; 15]),
    /// Data stored in the inode (inline_data); the bytes themselves.
    Inline(Vec<u8>),
    /// No data blocks at all (fast symlinks, devices, fifos, sockets).
    None,
}

impl BlockMap {
    /// Look up logical block `lblk`.
    pub fn map(&self, vol: &Volume, lblk: u64) -> Result<Mapping> {
        match self {
            BlockMap::Extents(ext) => Ok(map_extents(ext, lblk)),
            BlockMap::Indirect(root) => map_indirect(vol, root, lblk),
            BlockMap::Inline(_) | BlockMap::None => Ok(Mapping::Hole { len: u64::MAX }),
        }
    }

    /// First mapped logical block at or after `lblk` (SEEK_DATA), if any.
    /// Uninitialised extents count as data, as the kernel reports them
    /// through SEEK_DATA only when they have dirty pages: we report them as
    /// holes, which matches what reads return.
    pub fn next_data(&self, vol: &Volume, lblk: u64, limit: u64) -> Result<Option<u64>> {
        match self {
            BlockMap::Extents(ext) => {
                let i = ext.partition_point(|e| (e.block as u64 + e.length() as u64) <= lblk);
                for e in &ext[i..] {
                    if e.is_uninit() {
                        continue;
                    }
                    let s = (e.block as u64).max(lblk);
                    return Ok((s < limit).then_some(s));
                }
                Ok(None)
            }
            BlockMap::Indirect(_) => {
                let mut b = lblk;
                while b < limit {
                    match self.map(vol, b)? {
                        Mapping::Mapped { .. } => return Ok(Some(b)),
                        Mapping::Hole { len } => b = b.saturating_add(len.max(1)),
                    }
                }
                Ok(None)
            }
            BlockMap::Inline(_) => Ok((lblk < limit).then_some(lblk)),
            BlockMap::None => Ok(None),
        }
    }

    /// Every mapped (logical, physical, len) run below `limit`, in order,
    /// found in time proportional to what is mapped (not to the file size).
    pub fn runs(&self, vol: &Volume, limit: u64) -> Result<Vec<(u64, u64, u64)>> {
        let mut out = Vec::new();
        match self {
            BlockMap::Extents(ext) => {
                for e in ext {
                    let s = e.block as u64;
                    if s >= limit {
                        break;
                    }
                    if e.is_uninit() {
                        continue;
                    }
                    out.push((s, e.start(), (e.length() as u64).min(limit - s)));
                }
            }
            BlockMap::Indirect(root) => {
                let bs = vol.block_size();
                let mut walk = IndirectWalk {
                    vol,
                    limit,
                    seen: HashSet::new(),
                    out,
                };
                for (slot, &p) in root.iter().enumerate() {
                    if p == 0 {
                        continue;
                    }
                    let (depth, base) = match slot {
                        s if s < indirect::DIRECT => (0, s as u64),
                        indirect::IND => (1, 12),
                        indirect::DIND => (2, 12 + indirect::span(1, bs)),
                        _ => (3, 12 + indirect::span(1, bs) + indirect::span(2, bs)),
                    };
                    walk.walk(p as u64, depth, base)?;
                }
                out = walk.out;
                out.retain(|r| r.0 < limit);
                coalesce(&mut out);
            }
            BlockMap::Inline(_) | BlockMap::None => {}
        }
        Ok(out)
    }
}

fn coalesce(v: &mut Vec<(u64, u64, u64)>) {
    let mut w: Vec<(u64, u64, u64)> = Vec::with_capacity(v.len());
    for &r in v.iter() {
        if let Some(last) = w.last_mut() {
            if last.0 + last.2 == r.0 && last.1 + last.2 == r.1 {
                last.2 += r.2;
                continue;
            }
        }
        w.push(r);
    }
    *v = w;
}

/// A walk of an indirect map's blocks, collecting the mapped runs below
/// `limit`; a block met twice is a cycle (damage), not followed.
struct IndirectWalk<'a> {
    vol: &'a Volume,
    limit: u64,
    seen: HashSet<u64>,
    out: Vec<(u64, u64, u64)>,
}

impl IndirectWalk<'_> {
    /// Walk the subtree under `blk` (`depth` levels of pointer blocks above
    /// the data; 0: `blk` is data) mapping logical blocks from `base`.
    fn walk(&mut self, blk: u64, depth: usize, base: u64) -> Result<()> {
        if base >= self.limit {
            return Ok(());
        }
        if depth == 0 {
            self.out.push((base, blk, 1));
            return Ok(());
        }
        if !self.seen.insert(blk) {
            return Err(Error::corrupt_msg(
                format!("indirect block {blk}"),
                "indirect map",
                "block referenced twice (cycle)",
            ));
        }
        let buf = self.vol.buffer(blk)?;
        let per = self.vol.block_size() / 4;
        let span = indirect::span(depth - 1, self.vol.block_size());
        for i in 0..per {
            let p = indirect::pointer(&buf.data, i) as u64;
            if p != 0 {
                self.walk(p, depth - 1, base + i as u64 * span)?;
            }
        }
        Ok(())
    }
}

fn map_extents(ext: &[Extent], lblk: u64) -> Mapping {
    let i = ext.partition_point(|e| (e.block as u64 + e.length() as u64) <= lblk);
    match ext.get(i) {
        None => Mapping::Hole { len: u64::MAX },
        Some(e) if (e.block as u64) > lblk => Mapping::Hole {
            len: e.block as u64 - lblk,
        },
        Some(e) => {
            let d = lblk - e.block as u64;
            Mapping::Mapped {
                pblk: e.start() + d,
                len: e.length() as u64 - d,
                uninit: e.is_uninit(),
            }
        }
    }
}

fn map_indirect(vol: &Volume, root: &[u32; 15], lblk: u64) -> Result<Mapping> {
    let Some(path) = indirect::path_for(lblk, vol.block_size()) else {
        return Ok(Mapping::Hole { len: u64::MAX });
    };
    let mut p = root[path.root] as u64;
    if path.levels.is_empty() {
        if p == 0 {
            return Ok(Mapping::Hole { len: 1 });
        }
        // Extend over consecutive direct pointers.
        let mut len = 1;
        let mut s = path.root + 1;
        while s < indirect::DIRECT && root[s] as u64 == p + len {
            len += 1;
            s += 1;
        }
        return Ok(Mapping::Mapped {
            pblk: p,
            len,
            uninit: false,
        });
    }
    let depth = path.levels.len();
    for (lvl, &idx) in path.levels.iter().enumerate() {
        if p == 0 {
            let span = indirect::span(depth - lvl, vol.block_size());
            let left = span - (lblk_offset_within(&path.levels[lvl..], vol.block_size()));
            return Ok(Mapping::Hole { len: left.max(1) });
        }
        let buf = vol.buffer(p).map_err(|e| super::error::annotate(e, "indirect block"))?;
        let next = indirect::pointer(&buf.data, idx) as u64;
        if lvl + 1 == depth {
            if next == 0 {
                return Ok(Mapping::Hole { len: 1 });
            }
            let per = vol.block_size() / 4;
            let mut len = 1;
            let mut j = idx + 1;
            while j < per && indirect::pointer(&buf.data, j) as u64 == next + len {
                len += 1;
                j += 1;
            }
            return Ok(Mapping::Mapped {
                pblk: next,
                len,
                uninit: false,
            });
        }
        p = next;
    }
    Ok(Mapping::Hole { len: 1 })
}

fn lblk_offset_within(levels: &[usize], block_size: usize) -> u64 {
    let mut off = 0u64;
    let n = levels.len();
    for (i, &l) in levels.iter().enumerate() {
        off += l as u64 * indirect::span(n - 1 - i, block_size);
    }
    off
}

/// Build the block map of inode `ino` (record `rec`): extent trees are
/// read whole and checked here, once per cached inode, so every later
/// lookup is a binary search without I/O. Public: the vfs layer caches
/// one per inode.
pub fn load(vol: &Volume, ino: u32, rec: &Inode) -> Result<BlockMap> {
    use ext4kit_format::inode::FileType;
    if rec.has_inline_data() {
        return Ok(BlockMap::Inline(xattr::inline_data(vol, ino, rec)?));
    }
    match rec.file_type() {
        Some(FileType::CharDevice | FileType::BlockDevice | FileType::Fifo | FileType::Socket) => {
            return Ok(BlockMap::None)
        }
        Some(FileType::Symlink) if inode::is_fast_symlink(vol, rec) => return Ok(BlockMap::None),
        _ => {}
    }
    if rec.uses_extents() {
        load_extents(vol, ino, rec).map(BlockMap::Extents)
    } else {
        Ok(BlockMap::Indirect(indirect::root_pointers(&rec.base.block)))
    }
}

fn load_extents(vol: &Volume, ino: u32, rec: &Inode) -> Result<Vec<Extent>> {
    let loc = format!("extent tree of inode {ino}");
    let root = ExtentNode::parse(&rec.base.block).map_err(|e| Error::corrupt(&loc, e))?;
    let mut walk = ExtentWalk {
        vol,
        seed: vol.geo().inode_seed(ino, rec.base.generation),
        loc: &loc,
        seen: HashSet::new(),
        out: Vec::new(),
    };
    walk.walk(&root)?;
    let out = walk.out;
    for w in out.windows(2) {
        if w[0].block as u64 + w[0].length() as u64 > w[1].block as u64 {
            return Err(Error::corrupt_msg(
                &loc,
                "extent",
                format!("extents at {} and {} overlap", w[0].block, w[1].block),
            ));
        }
    }
    Ok(out)
}

/// A walk of an extent tree, collecting its leaves' extents in order.
/// Defensive: a child's depth must be its parent's minus one (so the walk
/// ends), no node block is visited twice, and every extent lies inside
/// the filesystem.
struct ExtentWalk<'a> {
    vol: &'a Volume,
    /// The inode's checksum seed (metadata_csum), for node tails.
    seed: Option<u32>,
    /// "extent tree of inode N", for errors.
    loc: &'a str,
    seen: HashSet<u64>,
    out: Vec<Extent>,
}

impl ExtentWalk<'_> {
    fn walk(&mut self, node: &ExtentNode) -> Result<()> {
        let loc = self.loc;
        match &node.entries {
            NodeEntries::Leaf(v) => {
                let geo = self.vol.geo();
                for e in v {
                    let end = e.start().checked_add(e.length() as u64);
                    if e.start() < geo.first_data_block() || end.is_none_or(|x| x > geo.blocks_count()) {
                        return Err(Error::corrupt_msg(
                            loc,
                            "extent",
                            format!(
                                "extent at logical {} maps blocks {}+{} outside the filesystem",
                                e.block,
                                e.start(),
                                e.length()
                            ),
                        ));
                    }
                    self.out.push(*e);
                }
            }
            NodeEntries::Index(v) => {
                for idx in v {
                    let blk = idx.leaf();
                    if !self.seen.insert(blk) {
                        return Err(Error::corrupt_msg(
                            loc,
                            "extent index",
                            format!("node block {blk} referenced twice"),
                        ));
                    }
                    let buf = self.vol.buffer(blk).map_err(|e| super::error::annotate(e, loc))?;
                    let child = ExtentNode::parse(&buf.data)
                        .map_err(|e| Error::corrupt(format!("{loc}, node block {blk}"), e))?;
                    if child.header.depth + 1 != node.header.depth {
                        return Err(Error::corrupt_msg(
                            format!("{loc}, node block {blk}"),
                            "extent header",
                            format!(
                                "depth {} under a node of depth {}",
                                child.header.depth, node.header.depth
                            ),
                        ));
                    }
                    if let Some(s) = self.seed {
                        buf.check_once(|d| verify_block_checksum(d, s))
                            .map_err(|e| Error::corrupt(format!("{loc}, node block {blk}"), e))?;
                    }
                    self.walk(&child)?;
                }
            }
        }
        Ok(())
    }
}
