//! Listing a directory (the kernel's `iterate_dir`): every entry, "." and
//! ".." included, read under the directory's shared lock with the block
//! map taken in step with the record.

use ext4kit_format::inode::FileType;

use super::lookup;
use super::namei::show;
use super::super_block::SuperBlock;
use super::target::Target;
use crate::error::{Errno, Error, Result};
use crate::ext4::{dir, DirEntry, DirRef};

/// Entries of the directory `t` names ([`Fs::read_dir`](crate::Fs::read_dir)).
pub(crate) fn read_dir(sb: &SuperBlock, t: Target<'_>) -> Result<Vec<DirEntry>> {
    let ino = lookup::target_ino(sb, t)?;
    read_dir_ino(sb, ino).map_err(|e| match (e, t.path_shown()) {
        (
            Error::Posix {
                errno: Errno::ENOTDIR, ..
            },
            Some(p),
        ) => Error::posix(Errno::ENOTDIR, format!("{}: not a directory", show(p))),
        (e, _) => e,
    })
}

/// Entries of directory inode `ino`.
pub(crate) fn read_dir_ino(sb: &SuperBlock, ino: u32) -> Result<Vec<DirEntry>> {
    let dir = sb.inode(ino)?;
    if dir.ftype != FileType::Directory {
        return Err(Error::posix(Errno::ENOTDIR, format!("inode {ino} is not a directory")));
    }
    let inode = dir.disk.read(); // held for the listing, not copied
    let map = dir.block_map_locked(sb.vol(), &inode)?; // in step with the record
    let mut v = dir::readdir(
        sb.vol(),
        DirRef {
            ino,
            inode: &inode,
            map: &map,
        },
    )?;
    drop(inode);
    // Entries without a type (no `filetype` feature) get it from the inode.
    for e in v.iter_mut().filter(|e| e.file_type.is_none()) {
        e.file_type = Some(sb.inode(e.ino)?.ftype);
    }
    Ok(v)
}

/// The removed names still held in the blocks of the directory `t`
/// names ([`Fs::deleted_entries`](crate::Fs::deleted_entries)), read under
/// its shared lock like a listing.
pub(crate) fn deleted_entries(sb: &SuperBlock, t: Target<'_>) -> Result<Vec<DirEntry>> {
    let ino = lookup::target_ino(sb, t)?;
    let dir = sb.inode(ino)?;
    if dir.ftype != FileType::Directory {
        return Err(Error::posix(Errno::ENOTDIR, format!("inode {ino} is not a directory")));
    }
    let inode = dir.disk.read();
    let map = dir.block_map_locked(sb.vol(), &inode)?;
    crate::ext4::dir_slack::deleted_entries(
        sb.vol(),
        DirRef {
            ino,
            inode: &inode,
            map: &map,
        },
    )
}
