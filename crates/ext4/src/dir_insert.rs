//! Adding names to directories (the insert half of the kernel's `namei.c`:
//! `ext4_add_entry`, `add_dirent_to_buf`, `ext4_init_new_dir`), and
//! rewriting ".." when a directory moves.
//!
//! A linear directory takes a new entry in the first record with enough
//! slack (`rec_len` minus the space its own name needs) in any block; when
//! no block has room it grows by one block — or, when it is a single full
//! block on a `dir_index` filesystem, it becomes an htree
//! (`dx_split::make_indexed_dir`). An indexed directory takes the entry in
//! the one leaf the hash selects (htree: an insert reads O(depth) blocks,
//! never scans the directory), splitting the leaf and the index when full
//! (`dx_split.rs`).
//!
//! Every function here expects the caller to hold the directory's inode
//! lock (writer side of `i_rwsem`): the blocks read through the cache
//! cannot change underneath between the read and the handle's `modify`.
//! Every changed leaf gets its checksum tail refreshed in the same handle.

use ext4kit_format::dirent::{self, NAME_MAX};
use ext4kit_format::features::{compat, incompat};
use ext4kit_format::htree::{parse_root, write_root};
use ext4kit_format::inode::{flags, FileType, Inode};

use super::bmap::{BlockMap, Mapping};
use super::dir_leaf::{self, LeafLayout, NewRec};
use super::dirblock::{self, DirRef};
use super::dx_split;
use super::htree::{self, InsertHint};
use super::owner_scan;
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// The entry [`add_link`] adds: `name` -> `ino` of type `ft`, and — after
/// [`dir::lookup_for_create`](super::dir::lookup_for_create) proved the
/// name absent from an indexed directory — where that lookup found room
/// for it, so the insert neither descends the index nor walks the leaf a
/// second time.
#[derive(Debug)]
pub struct NewEntry<'n> {
    /// The name (checked by [`check_name`]).
    pub name: &'n [u8],
    /// The inode it points at.
    pub ino: u32,
    /// The inode's type, recorded in the entry with the `filetype` feature.
    pub ft: FileType,
    /// The create's finding (`None`: look again).
    pub hint: Option<InsertHint<'n>>,
}

impl<'n> NewEntry<'n> {
    /// `name` -> `ino` of type `ft`, without a hint.
    pub fn new(name: &'n [u8], ino: u32, ft: FileType) -> Self {
        Self {
            name,
            ino,
            ft,
            hint: None,
        }
    }
}

/// Add an entry to a directory (`ext4_add_entry`).
///
/// `new_dir` is the caller's copy of the directory's record
/// (`dir.inode`'s contents), updated in place when the directory grows
/// (size, `i_blocks`, block map, INDEX flag); the caller writes it
/// through `h`. Returns true when the block map changed (the caller then
/// drops its cached map). On error (ENOSPC, ...) nothing has changed:
/// blocks are allocated before any directory block is modified. The
/// caller holds the directory's inode lock and has checked that the name
/// is not present. After a call that returned true, a further call on
/// the same directory needs a DirRef over the updated record and a
/// reloaded map (EINVAL otherwise).
pub fn add_link(
    vol: &Volume,
    h: &mut Handle<'_>,
    dir: DirRef<'_>,
    new_dir: &mut Inode,
    entry: NewEntry<'_>,
) -> Result<bool> {
    let NewEntry { name, ino, ft, hint } = entry;
    check_name(name)?;
    // A second add_link in one handle after the first grew the
    // directory must use a refreshed DirRef (new size and map): with a
    // stale one we would map a block that is already in use.
    if new_dir.size() != dir.inode.size() || (new_dir.base.flags ^ dir.inode.base.flags) & flags::INDEX != 0 {
        return Err(Error::posix(
            Errno::EINVAL,
            format!(
                "add_link on directory inode {}: the DirRef is older than the record (refresh it after the directory grew)",
                dir.ino
            ),
        ));
    }
    if matches!(dir.map, BlockMap::Inline(_)) {
        return Err(Error::Unsupported(format!(
            "adding entries to inline-data directory inode {} is not supported yet",
            dir.ino
        )));
    }
    let fmt = vol.geo().dir_format();
    let rec = NewRec {
        name,
        ino,
        ft: if fmt.filetype { ft.to_dirent() } else { 0 },
    };
    if dir.is_indexed(vol) {
        return dx_split::dx_add_entry(vol, h, dir, new_dir, rec, hint);
    }
    add_linear(vol, h, dir, new_dir, rec)
}

/// Add to a linear directory: the first block with room (the kernel scans
/// the same way); a full one-block directory becomes an htree; otherwise
/// a new block holding just the entry. An INDEX flag without the
/// dir_index feature is ignored and cleared, as the kernel's
/// `ext4_add_entry` fallback does.
fn add_linear(vol: &Volume, h: &mut Handle<'_>, dir: DirRef<'_>, new_dir: &mut Inode, rec: NewRec<'_>) -> Result<bool> {
    new_dir.base.flags &= !flags::INDEX;
    let layout = LeafLayout::of(vol.geo());
    let need = rec.rec_len();
    let seed = dir.csum_seed(vol);
    let nblocks = dir.nblocks(vol);
    for (lstart, _p, len) in dir.map.runs(vol, nblocks)? {
        for lblk in lstart..lstart + len {
            let Some(buf) = dirblock::read_leaf(vol, dir, lblk)? else {
                continue;
            };
            if let Some(off) = layout.find_slot(&buf.data, need) {
                h.modify(buf.block, |d| {
                    dir_leaf::insert_at(d, off, layout.fmt(), rec);
                    dir_leaf::set_tail(d, seed);
                    Ok(())
                })?;
                return Ok(false);
            }
        }
    }
    if nblocks == 1 && vol.geo().has_compat(compat::DIR_INDEX) {
        return dx_split::make_indexed_dir(vol, h, dir, new_dir, rec);
    }
    // Append a block holding just the new entry.
    let pblk = dirblock::append(vol, h, dir.ino, new_dir, 1)?[0];
    let b = layout.build(&[rec.to_rec()], seed)?;
    h.overwrite(pblk, b)?;
    Ok(true)
}

/// Check, before an operation that adds a name to `dir` begins changing
/// anything (its new inode is allocated before the name goes in), that
/// the insertion will not meet damage the lookup passed over: a hole
/// at block 0 (`ext4_read_dirblock`'s "Directory hole found"; a linear
/// lookup skips holes, but "." and ".." and the htree root live
/// there), or — for a one-block linear directory, which a full block
/// turns into an htree (`make_indexed_dir`) — a block 0 that does not
/// start with "." and "..". Without a journal, meeting either after the
/// inode was allocated would leave the image changed. The directory's
/// own record, which the insertion rewrites (mtime, size), must not lie
/// in a cross-linked inode-table block ([`owner_scan::check_record`]).
/// Reads only.
pub fn check_insertable(vol: &Volume, dir: DirRef<'_>) -> Result<()> {
    owner_scan::check_record(vol, dir.ino)?;
    if !matches!(dir.map, BlockMap::Extents(_) | BlockMap::Indirect(_)) || dir.nblocks(vol) == 0 {
        return Ok(());
    }
    let loc = || format!("directory inode {}", dir.ino);
    if let Mapping::Hole { .. } = dir.map.map(vol, 0)? {
        return Err(Error::corrupt_msg(loc(), "directory block", "block 0 is a hole"));
    }
    if dir.is_indexed(vol) || dir.nblocks(vol) != 1 || !vol.geo().has_compat(compat::DIR_INDEX) {
        return Ok(());
    }
    dx_split::read_dot_block(vol, dir).map(|_| ())
}

/// Give a new directory inode its first block holding "." and ".."
/// (and the checksum tail): `ext4_init_new_dir`. `inode` is the new
/// directory's record (written by the caller through `h`); its size
/// becomes one block.
pub fn init_dir(vol: &Volume, h: &mut Handle<'_>, ino: u32, inode: &mut Inode, parent_ino: u32) -> Result<()> {
    let fmt = vol.geo().dir_format();
    let ftb = if fmt.filetype {
        FileType::Directory.to_dirent()
    } else {
        0
    };
    let seed = vol.geo().inode_seed(ino, inode.base.generation);
    let pblk = dirblock::append(vol, h, ino, inode, 1)?[0];
    let limit = LeafLayout::of(vol.geo()).limit();
    let mut b = vec![0u8; vol.block_size()].into_boxed_slice();
    dirent::write_entry(&mut b, 0, ino, 12, b".", ftb, fmt);
    dirent::write_entry(&mut b, 12, parent_ino, limit - 12, b"..", ftb, fmt);
    dir_leaf::set_tail(&mut b, seed);
    h.overwrite(pblk, b)
}

/// Point ".." at `parent_ino` (a directory moved to another parent).
/// ".." is the second record of block 0 in both layouts; in an htree
/// root the dx checksum covers it, in a linear block the tail does.
pub fn set_dotdot(vol: &Volume, h: &mut Handle<'_>, dir: DirRef<'_>, parent_ino: u32) -> Result<()> {
    if matches!(dir.map, BlockMap::Inline(_)) {
        return Err(Error::Unsupported(format!(
            "changing \"..\" of inline-data directory inode {} is not supported yet",
            dir.ino
        )));
    }
    let seed = dir.csum_seed(vol);
    let fmt = vol.geo().dir_format();
    let loc = || format!("directory inode {}", dir.ino);
    if dir.is_indexed(vol) {
        let buf = htree::root_block(vol, dir)?.ok_or_else(|| Error::corrupt_msg(loc(), "htree root", "missing"))?;
        let (bs, large) = (vol.block_size(), vol.geo().has_incompat(incompat::LARGEDIR));
        return h.modify(buf.block, |d| {
            let mut root = parse_root(d, bs, large, None).map_err(|e| Error::corrupt(loc(), e))?;
            root.dotdot_inode = parent_ino;
            write_root(d, &root, bs, seed).map_err(|e| Error::corrupt(loc(), e))
        });
    }
    let buf = dirblock::read_leaf(vol, dir, 0)?
        .ok_or_else(|| Error::corrupt_msg(loc(), "directory block", "block 0 is a hole"))?;
    let first = dirent::entry_at(&buf.data, 0, fmt);
    let second = (first.rec_len + dirent::DIRENT_HEADER <= buf.data.len())
        .then(|| dirent::entry_at(&buf.data, first.rec_len, fmt));
    if first.name != b"." || second.is_none_or(|e| e.name != b"..") {
        return Err(Error::corrupt_msg(
            loc(),
            "directory block",
            "block 0 does not start with \".\" and \"..\"",
        ));
    }
    let off = first.rec_len;
    h.modify(buf.block, |d| {
        d[off..off + 4].copy_from_slice(&parent_ino.to_le_bytes());
        dir_leaf::set_tail(d, seed);
        Ok(())
    })
}

/// Names a directory entry can hold: 1..=255 bytes, no '/' or NUL, not
/// "." or "..".
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::posix(
            Errno::ENAMETOOLONG,
            format!("name of {} bytes is too long", name.len()),
        ));
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::posix(
            Errno::EINVAL,
            format!("invalid name {:?}", String::from_utf8_lossy(name)),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name(b"ok").is_ok());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name(&[b'x'; 256]).is_err());
        assert!(check_name(&[b'x'; 255]).is_ok());
    }
}
