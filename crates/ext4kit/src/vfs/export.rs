//! What exporting a filesystem needs (NFS, `name_to_handle_at`): a file
//! handle is an inode number, and it names live inodes only — checked as
//! ext4's `ext4_nfs_get_inode` checks it before anything is read for a
//! number that came from a user.

use super::stat;
use super::super_block::SuperBlock;
use super::Stat;
use crate::error::{Errno, Error, Result};
use crate::ext4::{inode, ROOT_INO};

/// The work of [`Fs::stat_by_handle`](crate::Fs::stat_by_handle).
pub(crate) fn stat_by_handle(sb: &SuperBlock, ino: u32) -> Result<Stat> {
    let stale = || Error::posix(Errno::ESTALE, format!("inode {ino}: stale file handle"));
    let (first_ino, count) = {
        let s = sb.vol().sb().read();
        (s.first_ino, s.inodes_count)
    };
    if (ino < first_ino && ino != ROOT_INO) || ino > count || ino == 0 {
        return Err(stale());
    }
    let keep_eio = |e: Error| if e.errno() == Errno::EIO { e } else { stale() };
    let rec = inode::read(sb.vol(), ino).map_err(keep_eio)?;
    if rec.base.links_count == 0 || rec.base.mode == 0 {
        return Err(stale());
    }
    stat::stat_ino(sb, ino).map_err(keep_eio)
}
