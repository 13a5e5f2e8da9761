//! Directories: linear blocks, inline directories, and the entry point for
//! lookups (which go through the htree when the directory is indexed, see
//! `htree.rs`).
//!
//! Seed 004: every directory block is structurally checked (and its
//! checksum verified) the first time it is read from disk — the verdict is
//! kept with the cached buffer — and scanned afterwards without re-checking.

use ext4kit_format::dirent::{self, DirFormat};
use ext4kit_format::features::incompat;
use ext4kit_format::inode::{flags, FileType, Inode};

use super::bmap::{BlockMap, Mapping};
use super::buffer::Buffer;
use super::error::annotate;
use super::htree::CreateLookup;
use super::volume::Volume;
use crate::error::{Error, Result};
use std::sync::Arc;

/// One name in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode number the name points to.
    pub ino: u32,
    /// The name as stored (bytes; not necessarily UTF-8).
    pub name: Vec<u8>,
    /// Type from the entry (`None` when the filesystem lacks `filetype`).
    pub file_type: Option<FileType>,
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
        self.inode.base.flags & flags::INDEX != 0 && vol.geo().has_compat(ext4kit_format::features::compat::DIR_INDEX)
    }
}

impl Volume {
    /// Largest directory size we accept (the kernel's limit is 2 GiB
    /// without largedir; a larger i_size is corruption, and refusing it keeps
    /// scans of hostile images bounded).
    fn check_dir_size(&self, dir: DirRef<'_>) -> Result<()> {
        let max = if self.geo().has_incompat(incompat::LARGEDIR) {
            1u64 << 40
        } else {
            1u64 << 32
        };
        if dir.inode.size() > max.min(self.geo().blocks_count() * self.block_size() as u64) {
            return Err(Error::corrupt_msg(
                format!("directory inode {}", dir.ino),
                "inode",
                format!("directory size {} is impossible", dir.inode.size()),
            ));
        }
        Ok(())
    }

    /// A directory whose map sends two logical blocks to one physical block
    /// is corrupt — and on a hostile image would make a scan revisit the
    /// same entries without bound — so refuse it.
    fn check_distinct(&self, dir: DirRef<'_>, runs: &[(u64, u64, u64)]) -> Result<()> {
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

    /// Physical block of directory block `lblk` when it holds data (a
    /// hole or an unwritten extent is `None`), counted as a directory
    /// block read.
    fn dir_block_pblk(&self, dir: DirRef<'_>, lblk: u64) -> Result<Option<u64>> {
        self.stats().count_dir_block();
        Ok(match dir.map.map(self, lblk)? {
            Mapping::Mapped {
                pblk, uninit: false, ..
            } => Some(pblk),
            _ => None,
        })
    }

    /// Read logical block `lblk` of a directory as a raw buffer (no checks).
    pub(crate) fn dir_block_raw(&self, dir: DirRef<'_>, lblk: u64) -> Result<Option<Arc<Buffer>>> {
        let Some(pblk) = self.dir_block_pblk(dir, lblk)? else {
            return Ok(None);
        };
        self.buffer(pblk)
            .map(Some)
            .map_err(|e| annotate(e, &format!("directory inode {} block {lblk}", dir.ino)))
    }

    /// The structural check of leaf `lblk`, run once per cached version
    /// (seed 004: checked when it comes from disk, then trusted).
    fn check_leaf(&self, dir: DirRef<'_>, lblk: u64, buf: &Buffer) -> Result<()> {
        let fmt = self.geo().dir_format();
        let seed = self.geo().inode_seed(dir.ino, dir.inode.base.generation);
        buf.check_once(|d| dirent::check_block(d, fmt, seed)).map_err(|e| {
            Error::corrupt(
                format!("directory inode {} block {lblk} (disk block {})", dir.ino, buf.block),
                e,
            )
        })
    }

    /// Read logical block `lblk` of a directory as a leaf, checked once.
    pub(crate) fn dir_leaf(&self, dir: DirRef<'_>, lblk: u64) -> Result<Option<Arc<Buffer>>> {
        let Some(buf) = self.dir_block_raw(dir, lblk)? else {
            return Ok(None);
        };
        self.check_leaf(dir, lblk, &buf)?;
        Ok(Some(buf))
    }

    /// Run `f` on leaf `lblk` (its physical block and bytes), read as
    /// `access` says and checked once as a leaf; `None` for a hole.
    pub(crate) fn with_leaf<R>(
        &self,
        dir: DirRef<'_>,
        lblk: u64,
        access: LeafAccess,
        f: impl FnOnce(u64, &[u8]) -> R,
    ) -> Result<Option<R>> {
        if access == LeafAccess::Read {
            return Ok(self.dir_leaf(dir, lblk)?.map(|b| f(b.block, &b.data)));
        }
        let Some(pblk) = self.dir_block_pblk(dir, lblk)? else {
            return Ok(None);
        };
        self.disk().check_meta_block(pblk)?;
        // A draft is not checked again: every leaf draft starts from a
        // version checked here or by `dir_leaf`, or from a leaf we built.
        self.bcache()
            .read_newest(
                pblk,
                |d| self.disk().read_raw(pblk, d),
                |buf| self.check_leaf(dir, lblk, buf),
                |d| f(pblk, d),
            )
            .map(Some)
            .map_err(|e| annotate(e, &format!("directory inode {} block {lblk}", dir.ino)))
    }

    /// Whether a block is an htree interior node: one empty record spanning
    /// the block (which is also what an empty leaf looks like without
    /// checksums — both hold no names, so readdir may skip either).
    fn looks_like_dx_node(&self, d: &[u8]) -> bool {
        let e = dirent::entry_at(d, 0, self.geo().dir_format());
        e.inode == 0 && e.rec_len == self.block_size() && e.name.is_empty()
    }

    /// Every entry of a directory, "." and ".." included, in block order.
    pub fn read_dir(&self, dir: DirRef<'_>) -> Result<Vec<DirEntry>> {
        let fmt = self.geo().dir_format();
        let mut out = Vec::new();
        if let BlockMap::Inline(data) = dir.map {
            return self.read_inline_dir(dir, data);
        }
        self.check_dir_size(dir)?;
        let indexed = dir.is_indexed(self);
        let nblocks = dir.nblocks(self);
        let runs = dir.map.runs(self, nblocks)?;
        self.check_distinct(dir, &runs)?;
        for (lstart, _p, len) in runs {
            for lblk in lstart..lstart + len {
                let buf = if indexed && lblk == 0 {
                    match self.dx_root_block(dir)? {
                        Some(b) => b,
                        None => continue,
                    }
                } else {
                    let Some(raw) = self.dir_block_raw(dir, lblk)? else {
                        continue;
                    };
                    if indexed && self.looks_like_dx_node(&raw.data) {
                        continue;
                    }
                    match self.dir_leaf(dir, lblk)? {
                        Some(b) => b,
                        None => continue,
                    }
                };
                let limit = if self.geo().csum_seed().is_some() && dirent::has_tail(&buf.data) {
                    buf.data.len() - dirent::TAIL_SIZE
                } else {
                    buf.data.len()
                };
                for e in dirent::entries(&buf.data[..limit], fmt) {
                    if e.inode != 0 {
                        out.push(DirEntry {
                            ino: e.inode,
                            name: e.name.to_vec(),
                            file_type: FileType::from_dirent(e.file_type),
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    /// Find `name` in a directory: through the htree when indexed, else by
    /// scanning. Returns the entry's inode number and type.
    pub fn lookup(&self, dir: DirRef<'_>, name: &[u8]) -> Result<Option<(u32, Option<FileType>)>> {
        self.lookup_as(dir, name, LeafAccess::Read)
    }

    /// [`Self::lookup`] for a caller that holds the directory's lock for
    /// writing and is about to change it (the lookups of create, link,
    /// unlink and rename): leaves are read with `LeafAccess::Write`.
    pub fn lookup_for_write(&self, dir: DirRef<'_>, name: &[u8]) -> Result<Option<(u32, Option<FileType>)>> {
        self.lookup_as(dir, name, LeafAccess::Write)
    }

    /// [`Self::lookup_for_write`] for a create: the entry if `name` is
    /// present, else (in an indexed directory) where `add_link` will put it
    /// — found by the same descent and leaf walk (see `htree::InsertHint`).
    pub fn lookup_for_create<'n>(&self, dir: DirRef<'_>, name: &'n [u8]) -> Result<CreateLookup<'n>> {
        let plain = |found: Option<(u32, Option<FileType>)>| match found {
            Some(_) => CreateLookup::Exists,
            None => CreateLookup::Absent(None),
        };
        if matches!(dir.map, BlockMap::Inline(_)) || name == b"." || name == b".." || !dir.is_indexed(self) {
            return Ok(plain(self.lookup_for_write(dir, name)?));
        }
        self.check_dir_size(dir)?;
        self.dx_find_for_create(dir, name)
    }

    fn lookup_as(&self, dir: DirRef<'_>, name: &[u8], access: LeafAccess) -> Result<Option<(u32, Option<FileType>)>> {
        if let BlockMap::Inline(data) = dir.map {
            return Ok(self
                .read_inline_dir(dir, data)?
                .into_iter()
                .find(|e| e.name == name)
                .map(|e| (e.ino, e.file_type)));
        }
        self.check_dir_size(dir)?;
        if dir.is_indexed(self) {
            // "." and ".." live in the dx root, outside every hash bucket.
            match name {
                b"." => return Ok(Some((dir.ino, Some(FileType::Directory)))),
                b".." => return Ok(Some((self.dotdot(dir)?, Some(FileType::Directory)))),
                _ => return self.dx_lookup(dir, name, access),
            }
        }
        let nblocks = dir.nblocks(self);
        let runs = dir.map.runs(self, nblocks)?;
        self.check_distinct(dir, &runs)?;
        for (lstart, _p, len) in runs {
            for lblk in lstart..lstart + len {
                if let Some(hit) = self.search_leaf(dir, lblk, name, access)? {
                    return Ok(Some(hit));
                }
            }
        }
        Ok(None)
    }

    /// Scan one leaf block for `name`.
    pub(crate) fn search_leaf(
        &self,
        dir: DirRef<'_>,
        lblk: u64,
        name: &[u8],
        access: LeafAccess,
    ) -> Result<Option<(u32, Option<FileType>)>> {
        let fmt = self.geo().dir_format();
        let hit = self.with_leaf(dir, lblk, access, |_, d| {
            dirent::entries(d, fmt)
                .find(|e| e.inode != 0 && dirent::same_name(e.name, name))
                .map(|e| (e.inode, FileType::from_dirent(e.file_type)))
        })?;
        Ok(hit.flatten())
    }

    /// Entries of an inline directory: `i_block[0..4]` is the parent inode,
    /// records fill the rest of `i_block` and continue in `system.data`.
    fn read_inline_dir(&self, dir: DirRef<'_>, data: &[u8]) -> Result<Vec<DirEntry>> {
        let loc = || format!("inline directory inode {}", dir.ino);
        if data.len() < 4 {
            return Err(Error::corrupt_msg(
                loc(),
                "inline directory",
                "shorter than its parent pointer",
            ));
        }
        let parent = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let mut out = vec![
            DirEntry {
                ino: dir.ino,
                name: b".".to_vec(),
                file_type: Some(FileType::Directory),
            },
            DirEntry {
                ino: parent,
                name: b"..".to_vec(),
                file_type: Some(FileType::Directory),
            },
        ];
        let fmt = DirFormat {
            block_size: self.block_size(),
            filetype: self.geo().has_incompat(incompat::FILETYPE),
        };
        let ibody_end = data.len().min(60);
        for part in [&data[4..ibody_end], &data[ibody_end..]] {
            if part.is_empty() {
                continue;
            }
            dirent::check_block(part, fmt, None).map_err(|e| Error::corrupt(loc(), e))?;
            for e in dirent::entries(part, fmt) {
                if e.inode != 0 {
                    out.push(DirEntry {
                        ino: e.inode,
                        name: e.name.to_vec(),
                        file_type: FileType::from_dirent(e.file_type),
                    });
                }
            }
        }
        Ok(out)
    }
}
