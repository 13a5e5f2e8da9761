//! Reading directories: listing (`ext4_readdir`), lookup by name — through
//! the htree when the directory is indexed (`htree.rs`), else by scanning
//! its leaves — the parent recorded in "..", and the emptiness test rmdir
//! needs (`ext4_empty_dir`). Linear and inline directories both.

use ext4kit_format::dirent::{self, DirFormat};
use ext4kit_format::features::incompat;
use ext4kit_format::inode::FileType;

use super::bmap::BlockMap;
use super::dir_leaf::LeafLayout;
use super::dirblock::{self, DirRef, LeafAccess};
use super::htree::{self, CreateLookup};
use super::volume::Volume;
use crate::error::{Error, Result};

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

/// Whether a block is an htree interior node: one empty record spanning
/// the block (which is also what an empty leaf looks like without
/// checksums — both hold no names, so readdir may skip either).
fn looks_like_dx_node(vol: &Volume, d: &[u8]) -> bool {
    let e = dirent::entry_at(d, 0, vol.geo().dir_format());
    e.inode == 0 && e.rec_len == vol.block_size() && e.name.is_empty()
}

/// Append the live records of `d` (inode not 0) to `out`, in order.
fn push_live(out: &mut Vec<DirEntry>, d: &[u8], fmt: DirFormat) {
    for e in dirent::entries(d, fmt) {
        if e.inode != 0 {
            out.push(DirEntry {
                ino: e.inode,
                name: e.name.to_vec(),
                file_type: FileType::from_dirent(e.file_type),
            });
        }
    }
}

/// Every entry of a directory, "." and ".." included, in block order.
pub fn readdir(vol: &Volume, dir: DirRef<'_>) -> Result<Vec<DirEntry>> {
    let fmt = vol.geo().dir_format();
    let mut out = Vec::new();
    if let BlockMap::Inline(data) = dir.map {
        return read_inline(vol, dir, data);
    }
    dirblock::check_size(vol, dir)?;
    let indexed = dir.is_indexed(vol);
    let nblocks = dir.nblocks(vol);
    let runs = dir.map.runs(vol, nblocks)?;
    dirblock::check_distinct(dir, &runs)?;
    for (lstart, _p, len) in runs {
        for lblk in lstart..lstart + len {
            let buf = if indexed && lblk == 0 {
                match htree::root_block(vol, dir)? {
                    Some(b) => b,
                    None => continue,
                }
            } else {
                let Some(raw) = dirblock::read_raw(vol, dir, lblk)? else {
                    continue;
                };
                if indexed && looks_like_dx_node(vol, &raw.data) {
                    continue;
                }
                match dirblock::read_leaf(vol, dir, lblk)? {
                    Some(b) => b,
                    None => continue,
                }
            };
            let limit = if vol.geo().csum_seed().is_some() && dirent::has_tail(&buf.data) {
                buf.data.len() - dirent::TAIL_SIZE
            } else {
                buf.data.len()
            };
            push_live(&mut out, &buf.data[..limit], fmt);
        }
    }
    Ok(out)
}

/// Find `name` in a directory: through the htree when indexed, else by
/// scanning. Returns the entry's inode number and type.
pub fn lookup(vol: &Volume, dir: DirRef<'_>, name: &[u8]) -> Result<Option<(u32, Option<FileType>)>> {
    lookup_as(vol, dir, name, LeafAccess::Read)
}

/// [`lookup`] for a caller that holds the directory's lock for writing and
/// is about to change it (the lookups of create, link, unlink and rename):
/// leaves are read as a writer's, so the change edits the leaf's draft in
/// place instead of copying the block.
pub fn lookup_for_write(vol: &Volume, dir: DirRef<'_>, name: &[u8]) -> Result<Option<(u32, Option<FileType>)>> {
    lookup_as(vol, dir, name, LeafAccess::Write)
}

/// [`lookup_for_write`] for a create: the entry if `name` is present, else
/// (in an indexed directory) where `add_link` will put it — found by the
/// same descent and leaf walk (see [`htree::InsertHint`]).
pub fn lookup_for_create<'n>(vol: &Volume, dir: DirRef<'_>, name: &'n [u8]) -> Result<CreateLookup<'n>> {
    let plain = |found: Option<(u32, Option<FileType>)>| match found {
        Some(_) => CreateLookup::Exists,
        None => CreateLookup::Absent(None),
    };
    if matches!(dir.map, BlockMap::Inline(_)) || name == b"." || name == b".." || !dir.is_indexed(vol) {
        return Ok(plain(lookup_for_write(vol, dir, name)?));
    }
    dirblock::check_size(vol, dir)?;
    htree::find_for_create(vol, dir, name)
}

fn lookup_as(
    vol: &Volume,
    dir: DirRef<'_>,
    name: &[u8],
    access: LeafAccess,
) -> Result<Option<(u32, Option<FileType>)>> {
    if let BlockMap::Inline(data) = dir.map {
        return Ok(read_inline(vol, dir, data)?
            .into_iter()
            .find(|e| e.name == name)
            .map(|e| (e.ino, e.file_type)));
    }
    dirblock::check_size(vol, dir)?;
    if dir.is_indexed(vol) {
        // "." and ".." live in the dx root, outside every hash bucket.
        match name {
            b"." => return Ok(Some((dir.ino, Some(FileType::Directory)))),
            b".." => return Ok(Some((dotdot(vol, dir)?, Some(FileType::Directory)))),
            _ => return htree::lookup(vol, dir, name, access),
        }
    }
    let nblocks = dir.nblocks(vol);
    let runs = dir.map.runs(vol, nblocks)?;
    dirblock::check_distinct(dir, &runs)?;
    for (lstart, _p, len) in runs {
        for lblk in lstart..lstart + len {
            if let Some(hit) = dirblock::search_leaf(vol, dir, lblk, name, access)? {
                return Ok(Some(hit));
            }
        }
    }
    Ok(None)
}

/// The parent directory recorded in `dir`'s ".." entry. An indexed
/// directory keeps "." and ".." in its dx root, where hash lookups never
/// look, so this reads them from block 0 directly.
pub fn dotdot(vol: &Volume, dir: DirRef<'_>) -> Result<u32> {
    let loc = || format!("directory inode {}", dir.ino);
    if let BlockMap::Inline(data) = dir.map {
        // Inline directories store the parent as the first 4 bytes.
        return data
            .get(0..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| Error::corrupt_msg(loc(), "inline directory", "too short for a parent"));
    }
    if dir.is_indexed(vol) {
        let buf = htree::root_block(vol, dir)?.ok_or_else(|| Error::corrupt_msg(loc(), "htree root", "missing"))?;
        let large = vol.geo().has_incompat(incompat::LARGEDIR);
        let root = ext4kit_format::htree::parse_root(&buf.data, vol.block_size(), large, None)
            .map_err(|e| Error::corrupt(loc(), e))?;
        return Ok(root.dotdot_inode);
    }
    let fmt = vol.geo().dir_format();
    let buf = dirblock::read_leaf(vol, dir, 0)?
        .ok_or_else(|| Error::corrupt_msg(loc(), "directory block", "block 0 is a hole"))?;
    let first = dirent::entry_at(&buf.data, 0, fmt);
    let second = (first.rec_len + dirent::DIRENT_HEADER <= buf.data.len())
        .then(|| dirent::entry_at(&buf.data, first.rec_len, fmt));
    match second {
        Some(e) if first.name == b"." && e.name == b".." => Ok(e.inode),
        _ => Err(Error::corrupt_msg(
            loc(),
            "directory block",
            "block 0 does not start with \".\" and \"..\"",
        )),
    }
}

/// Whether the directory holds nothing but "." and ".." (may scan).
pub fn is_empty(vol: &Volume, dir: DirRef<'_>) -> Result<bool> {
    if let BlockMap::Inline(_) = dir.map {
        return Ok(readdir(vol, dir)?.iter().all(|e| e.name == b"." || e.name == b".."));
    }
    // Walk blocks directly so a large directory stops at its first name.
    let indexed = dir.is_indexed(vol);
    let fmt = vol.geo().dir_format();
    let nblocks = dir.nblocks(vol);
    for (lstart, _p, len) in dir.map.runs(vol, nblocks)? {
        for lblk in lstart..lstart + len {
            if indexed && lblk == 0 {
                continue; // the root holds only "." and ".." as names
            }
            if indexed {
                if let Some(raw) = dirblock::read_raw(vol, dir, lblk)? {
                    let e = dirent::entry_at(&raw.data, 0, fmt);
                    if e.inode == 0 && e.rec_len == vol.block_size() {
                        continue; // an index node
                    }
                }
            }
            let Some(buf) = dirblock::read_leaf(vol, dir, lblk)? else {
                continue;
            };
            let limit = LeafLayout::of(vol.geo()).limit().min(buf.data.len());
            let mut first = true;
            for e in dirent::entries(&buf.data[..limit], fmt) {
                let dot = !indexed && lblk == 0 && first && e.name == b".";
                let dotdot = !indexed && lblk == 0 && e.name == b"..";
                first = false;
                if e.inode != 0 && !dot && !dotdot {
                    return Ok(false);
                }
            }
        }
    }
    Ok(true)
}

/// Entries of an inline directory: `i_block[0..4]` is the parent inode,
/// records fill the rest of `i_block` and continue in `system.data`.
fn read_inline(vol: &Volume, dir: DirRef<'_>, data: &[u8]) -> Result<Vec<DirEntry>> {
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
        block_size: vol.block_size(),
        filetype: vol.geo().has_incompat(incompat::FILETYPE),
    };
    let ibody_end = data.len().min(60);
    for part in [&data[4..ibody_end], &data[ibody_end..]] {
        if part.is_empty() {
            continue;
        }
        dirent::check_block(part, fmt, None).map_err(|e| Error::corrupt(loc(), e))?;
        push_live(&mut out, part, fmt);
    }
    Ok(out)
}
