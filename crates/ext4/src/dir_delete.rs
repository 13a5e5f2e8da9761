//! Removing and retargeting names (`ext4_delete_entry`,
//! `ext4_generic_delete_entry`, the `ext4_setent` half of rename).
//!
//! A removed record is merged into the previous record's `rec_len`; the
//! first record of a block has no predecessor and is marked unused
//! (inode 0) instead. Directories never shrink and leaves never merge — the
//! kernel does not either, and e2fsck accepts empty leaves. In an indexed
//! directory the record is found through the index (O(depth) blocks).
//!
//! Callers hold the directory's inode lock (writer side).

use ext4kit_format::dirent;
use ext4kit_format::inode::FileType;

use super::bmap::BlockMap;
use super::dir_leaf::{self, LeafLayout};
use super::dirblock::{self, DirRef, LeafAccess};
use super::htree;
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// Where a name lives: its block, the record's offset, and the previous
/// record's offset in the same block (None when it is the first).
struct Found {
    pblk: u64,
    off: usize,
    prev: Option<usize>,
    ino: u32,
    ft: u8,
}

/// Locate `name`'s record, through the index when there is one.
fn find_record(vol: &Volume, dir: DirRef<'_>, name: &[u8]) -> Result<Option<Found>> {
    if matches!(dir.map, BlockMap::Inline(_)) {
        return Err(Error::Unsupported(format!(
            "changing entries of inline-data directory inode {} is not supported yet",
            dir.ino
        )));
    }
    let candidates: Vec<u64> = if dir.is_indexed(vol) {
        match htree::find(vol, dir, name, LeafAccess::Write)? {
            Some((l, _)) => vec![l],
            None => return Ok(None),
        }
    } else {
        let n = dir.nblocks(vol);
        dir.map
            .runs(vol, n)?
            .into_iter()
            .flat_map(|(l, _, len)| l..l + len)
            .collect()
    };
    let fmt = vol.geo().dir_format();
    let limit = LeafLayout::of(vol.geo()).limit();
    // The caller holds the directory's lock and changes the record
    // next: leaves are read as a writer's (drafts stay drafts).
    for lblk in candidates {
        let found = dirblock::with_leaf(vol, dir, lblk, LeafAccess::Write, |pblk, d| {
            let mut prev = None;
            for e in dirent::entries(&d[..limit.min(d.len())], fmt) {
                if e.inode != 0 && dirent::same_name(e.name, name) {
                    return Some(Found {
                        pblk,
                        off: e.offset,
                        prev,
                        ino: e.inode,
                        ft: e.file_type,
                    });
                }
                prev = Some(e.offset);
            }
            None
        })?;
        if let Some(f) = found.flatten() {
            return Ok(Some(f));
        }
    }
    Ok(None)
}

fn enoent(dir: DirRef<'_>, name: &[u8]) -> Error {
    Error::posix(
        Errno::ENOENT,
        format!(
            "{:?} not found in directory inode {}",
            String::from_utf8_lossy(name),
            dir.ino
        ),
    )
}

/// Remove `name` from a directory; returns the inode and type it
/// pointed at. ENOENT if absent; "." and ".." cannot be removed.
pub fn remove_link(vol: &Volume, h: &mut Handle<'_>, dir: DirRef<'_>, name: &[u8]) -> Result<(u32, Option<FileType>)> {
    if name == b"." || name == b".." {
        return Err(Error::posix(Errno::EINVAL, "cannot remove \".\" or \"..\""));
    }
    let f = find_record(vol, dir, name)?.ok_or_else(|| enoent(dir, name))?;
    let fmt = vol.geo().dir_format();
    let seed = dir.csum_seed(vol);
    h.modify(f.pblk, |d| {
        let e = dirent::entry_at(d, f.off, fmt);
        let (rec, nlen) = (e.rec_len, e.name.len());
        match f.prev {
            Some(p) => {
                let pe = dirent::entry_at(d, p, fmt);
                let (pi, pn, pft, prl) = (pe.inode, pe.name.to_vec(), pe.file_type, pe.rec_len);
                dirent::write_entry(d, p, pi, prl + rec, &pn, pft, fmt);
                // Clear the dead record so the name does not linger.
                d[f.off..f.off + dirent::DIRENT_HEADER + nlen].fill(0);
            }
            None => {
                d[f.off..f.off + 4].fill(0);
            }
        }
        dir_leaf::set_tail(d, seed);
        Ok(())
    })?;
    Ok((f.ino, FileType::from_dirent(f.ft)))
}

/// Point the existing entry `name` at `ino` (rename over an existing
/// target); returns the old inode. ENOENT if absent.
pub fn replace_link(
    vol: &Volume,
    h: &mut Handle<'_>,
    dir: DirRef<'_>,
    name: &[u8],
    ino: u32,
    ft: FileType,
) -> Result<u32> {
    let f = find_record(vol, dir, name)?.ok_or_else(|| enoent(dir, name))?;
    let fmt = vol.geo().dir_format();
    let seed = dir.csum_seed(vol);
    h.modify(f.pblk, |d| {
        d[f.off..f.off + 4].copy_from_slice(&ino.to_le_bytes());
        if fmt.filetype {
            d[f.off + 7] = ft.to_dirent();
        }
        dir_leaf::set_tail(d, seed);
        Ok(())
    })?;
    Ok(f.ino)
}
