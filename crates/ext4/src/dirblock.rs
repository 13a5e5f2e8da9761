//! The blocks of one directory: [`DirRef`] (a directory as every directory
//! operation takes it), mapping its logical blocks, reading a block as a
//! leaf checked once (the kernel's `ext4_read_dirblock`), searching one
//! leaf for a name (`search_dirblock`), and appending blocks
//! (`ext4_append`).
//!
//! Every directory block is structurally checked (and its checksum
//! verified) the first time it is read from disk — the verdict is kept with
//! the cached buffer — and scanned afterwards without re-checking.

use std::sync::Arc;

use ext4kit_format::dirent;
use ext4kit_format::features::{compat, incompat};
use ext4kit_format::inode::{flags, FileType, Inode};

use super::bmap::{BlockMap, Mapping};
use super::buffer::Buffer;
use super::dir_leaf;
use super::error::annotate;
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// A directory as needed for reading: its inode, number, and block map.
#[derive(Debug, Clone, Copy)]
pub struct DirRef<'a> {
    /// Inode number.
    pub ino: u32,
    /// The inode.
    pub inode: &'a Inode,
    /// Its block map.
    pub map: &'a BlockMap,
}

impl DirRef<'_> {
    /// Number of directory blocks implied by `i_size`.
    pub fn nblocks(&self, vol: &Volume) -> u64 {
        self.inode.size().div_ceil(vol.block_size() as u64)
    }

    /// Whether the directory carries an htree index we may use.
    pub fn is_indexed(&self, vol: &Volume) -> bool {
        self.inode.base.flags & flags::INDEX != 0 && vol.geo().has_compat(compat::DIR_INDEX)
    }

    /// The checksum seed of this directory's blocks (metadata_csum).
    pub(crate) fn csum_seed(&self, vol: &Volume) -> Option<u32> {
        vol.geo().inode_seed(self.ino, self.inode.base.generation)
    }
}

/// How a directory operation reads leaf blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeafAccess {
    /// A reader: a leaf's draft is published first (readers only ever see
    /// immutable versions, see `buffer.rs`).
    Read,
    /// A writer that holds the directory's lock for writing and is about
    /// to change it (create, link, unlink, rename): a leaf's draft is read
    /// in place and stays a draft, so the change edits it instead of
    /// copying the block (see `BufferCache::read_newest`).
    Write,
}

/// Refuse a directory larger than the kernel allows (2 GiB without
/// largedir; a larger i_size is corruption, and refusing it keeps scans of
/// hostile images bounded).
pub(crate) fn check_size(vol: &Volume, dir: DirRef<'_>) -> Result<()> {
    let max = if vol.geo().has_incompat(incompat::LARGEDIR) {
        1u64 << 40
    } else {
        1u64 << 32
    };
    if dir.inode.size() > max.min(vol.geo().blocks_count() * vol.block_size() as u64) {
        return Err(Error::corrupt_msg(
            format!("directory inode {}", dir.ino),
            "inode",
            format!("directory size {} is impossible", dir.inode.size()),
        ));
    }
    Ok(())
}

/// A directory whose map sends two logical blocks to one physical block
/// is corrupt — and on a hostile image would make a scan revisit the same
/// entries without bound — so refuse it.
pub(crate) fn check_distinct(dir: DirRef<'_>, runs: &[(u64, u64, u64)]) -> Result<()> {
    let mut r: Vec<(u64, u64)> = runs.iter().map(|&(_, p, n)| (p, n)).collect();
    r.sort_unstable();
    for w in r.windows(2) {
        if w[0].0 + w[0].1 > w[1].0 {
            return Err(Error::corrupt_msg(
                format!("directory inode {}", dir.ino),
                "block map",
                format!("physical block {} is mapped twice", w[1].0),
            ));
        }
    }
    Ok(())
}

/// Physical block of directory block `lblk` when it holds data (a hole or
/// an unwritten extent is `None`), counted as a directory block read.
fn data_pblk(vol: &Volume, dir: DirRef<'_>, lblk: u64) -> Result<Option<u64>> {
    vol.stats().count_dir_block();
    Ok(match dir.map.map(vol, lblk)? {
        Mapping::Mapped {
            pblk, uninit: false, ..
        } => Some(pblk),
        _ => None,
    })
}

/// Physical block of directory block `lblk`, which must be mapped (a
/// block an htree path or a rewrite names; a hole there is corruption).
pub(crate) fn pblk(vol: &Volume, dir: DirRef<'_>, lblk: u64) -> Result<u64> {
    match dir.map.map(vol, lblk)? {
        Mapping::Mapped { pblk, .. } => Ok(pblk),
        Mapping::Hole { .. } => Err(Error::corrupt_msg(
            format!("directory inode {}", dir.ino),
            "block map",
            format!("directory block {lblk} is a hole"),
        )),
    }
}

/// Read logical block `lblk` of a directory as a raw buffer (no checks).
pub(crate) fn read_raw(vol: &Volume, dir: DirRef<'_>, lblk: u64) -> Result<Option<Arc<Buffer>>> {
    let Some(pblk) = data_pblk(vol, dir, lblk)? else {
        return Ok(None);
    };
    vol.buffer(pblk)
        .map(Some)
        .map_err(|e| annotate(e, &format!("directory inode {} block {lblk}", dir.ino)))
}

/// The structural check of leaf `lblk`, run once per cached version: a
/// leaf is checked when it comes from disk, then trusted.
fn check_leaf(vol: &Volume, dir: DirRef<'_>, lblk: u64, buf: &Buffer) -> Result<()> {
    let fmt = vol.geo().dir_format();
    let seed = dir.csum_seed(vol);
    buf.check_once(|d| dirent::check_block(d, fmt, seed)).map_err(|e| {
        Error::corrupt(
            format!("directory inode {} block {lblk} (disk block {})", dir.ino, buf.block),
            e,
        )
    })
}

/// Read logical block `lblk` of a directory as a leaf, checked once.
pub(crate) fn read_leaf(vol: &Volume, dir: DirRef<'_>, lblk: u64) -> Result<Option<Arc<Buffer>>> {
    let Some(buf) = read_raw(vol, dir, lblk)? else {
        return Ok(None);
    };
    check_leaf(vol, dir, lblk, &buf)?;
    Ok(Some(buf))
}

/// Run `f` on leaf `lblk` (its physical block and bytes), read as
/// `access` says and checked once as a leaf; `None` for a hole.
pub(crate) fn with_leaf<R>(
    vol: &Volume,
    dir: DirRef<'_>,
    lblk: u64,
    access: LeafAccess,
    f: impl FnOnce(u64, &[u8]) -> R,
) -> Result<Option<R>> {
    if access == LeafAccess::Read {
        return Ok(read_leaf(vol, dir, lblk)?.map(|b| f(b.block, &b.data)));
    }
    let Some(pblk) = data_pblk(vol, dir, lblk)? else {
        return Ok(None);
    };
    vol.disk().check_meta_block(pblk)?;
    // A draft is not checked again: every leaf draft starts from a
    // version checked here or by `read_leaf`, or from a leaf we built.
    vol.bcache()
        .read_newest(
            pblk,
            |d| vol.disk().read_raw(pblk, d),
            |buf| check_leaf(vol, dir, lblk, buf),
            |d| f(pblk, d),
        )
        .map(Some)
        .map_err(|e| annotate(e, &format!("directory inode {} block {lblk}", dir.ino)))
}

/// Scan one leaf block for `name` (`search_dirblock`).
pub(crate) fn search_leaf(
    vol: &Volume,
    dir: DirRef<'_>,
    lblk: u64,
    name: &[u8],
    access: LeafAccess,
) -> Result<Option<(u32, Option<FileType>)>> {
    let fmt = vol.geo().dir_format();
    let hit = with_leaf(vol, dir, lblk, access, |_, d| dir_leaf::find_name(d, fmt, name))?;
    Ok(hit.flatten())
}

/// Map `n` new blocks at the end of directory `ino` (the blocks from
/// `new_dir`'s `i_size` on) and set `i_size` to cover them
/// (`ext4_append`); returns their physical blocks in logical order.
/// Nothing is written into them: the caller overwrites each one in the
/// same handle.
pub(crate) fn append(vol: &Volume, h: &mut Handle<'_>, ino: u32, new_dir: &mut Inode, n: u64) -> Result<Vec<u64>> {
    let lblk = new_dir.size().div_ceil(vol.block_size() as u64);
    // Without large_dir a directory's i_size_high must stay zero (it
    // was i_dir_acl; e2fsck pass 1 insists), so 4 GiB is the end.
    let size = (lblk + n) * vol.block_size() as u64;
    if size > u32::MAX as u64 && !vol.geo().has_incompat(incompat::LARGEDIR) {
        return Err(Error::posix(
            Errno::ENOSPC,
            format!("directory inode {ino} would exceed 4 GiB without large_dir"),
        ));
    }
    let runs = vol.map_blocks(h, ino, new_dir, lblk, n, false)?;
    let mut out = Vec::with_capacity(n as usize);
    for r in runs {
        out.extend(r.pblk..r.pblk + r.len);
    }
    if out.len() as u64 != n {
        return Err(Error::posix(
            Errno::EIO,
            format!("directory inode {ino}: mapped {} of {n} new blocks", out.len()),
        ));
    }
    new_dir.base.set_size(size);
    Ok(out)
}
