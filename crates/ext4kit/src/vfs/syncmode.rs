//! Synchronous inodes, directories and filesystems: changes that are
//! durable when the call returns, as the kernel's ext4 makes them.
//!
//! - `IS_SYNC(inode)`: the filesystem was opened `sync` (the kernel's
//!   `SB_SYNCHRONOUS`, [`SyncMount::sync`]) or the inode has the
//!   synchronous flag (`chattr +S`, `EXT4_SYNC_FL`). A write to it is
//!   written back before it returns (`generic_write_sync`, fdatasync's
//!   level unless the open asked O_SYNC: io.rs); a truncate, fallocate,
//!   xattr or flag change commits its transaction (`ext4_handle_sync` in
//!   `ext4_truncate`, `ext4_punch_hole`, `ext4_xattr_set`,
//!   `ext4_ioctl_setflags`).
//! - `IS_DIRSYNC(dir)`: also `dirsync` ([`SyncMount::dirsync`]) or the
//!   directory's dirsync flag (`chattr +D`, `EXT4_DIRSYNC_FL`). A change
//!   of its entries — create, mkdir, mknod, symlink, link, unlink, rmdir,
//!   rename (either directory), O_TMPFILE — commits before it returns
//!   (`ext4_handle_sync` in fs/ext4/namei.c).
//!
//! "Commits" is fsync's second half: with a journal the running
//! transaction is committed (and the device flushed by the commit), without
//! one the dirty metadata is written home and the device flushed.

use ext4kit_format::inode::flags as fl;

use super::icache::CachedInode;
use super::Fs;
use crate::error::Result;

/// The filesystem-wide synchronous modes (mount options `sync` and
/// `dirsync`), given with the open options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncMount {
    /// Every change durable when it returns (`-o sync`).
    pub sync: bool,
    /// Directory changes durable when they return (`-o dirsync`).
    pub dirsync: bool,
}

impl Fs {
    /// The filesystem-wide synchronous modes.
    pub(crate) fn sync_mount(&self) -> SyncMount {
        self.sync_mount
    }

    /// `IS_SYNC` of an inode with flags `flags`.
    pub(crate) fn is_sync(&self, flags: u32) -> bool {
        self.sync_mount.sync || flags & fl::SYNC != 0
    }

    /// `IS_DIRSYNC` of a directory with flags `flags`.
    pub(crate) fn is_dirsync(&self, flags: u32) -> bool {
        self.sync_mount.sync || self.sync_mount.dirsync || flags & (fl::SYNC | fl::DIRSYNC) != 0
    }

    /// Make the change just made to `inode` durable (`ext4_handle_sync`):
    /// fsync's commit, which writes the record if it is dirty.
    pub(crate) fn commit_for(&self, inode: &CachedInode) -> Result<()> {
        self.fsync_inode(inode, false).map(|_| ())
    }

    /// After a change of the entries of directory `dir`, whose flags were
    /// `flags` under its lock: commit it if the directory is `IS_DIRSYNC`
    /// (the kernel makes such a handle synchronous). Called with no lock
    /// held; costs a flag test when nothing is synchronous.
    pub(crate) fn dirsync_after(&self, dir: &CachedInode, flags: u32) -> Result<()> {
        if self.is_dirsync(flags) {
            self.commit_for(dir)?;
        }
        Ok(())
    }

    /// [`Self::dirsync_after`] for directories `dirs` the caller no longer
    /// holds (a rename's two): their flags are read again.
    pub(crate) fn dirsync(&self, dirs: &[u32]) -> Result<()> {
        for &d in dirs {
            let dir = self.inode(d)?;
            let flags = dir.disk.read().base.flags;
            if self.is_dirsync(flags) {
                return self.commit_for(&dir);
            }
        }
        Ok(())
    }

    /// After a metadata change of `inode` (flags `flags` after it): commit
    /// it if the inode is `IS_SYNC`.
    pub(crate) fn sync_if_needed(&self, inode: &CachedInode, flags: u32) -> Result<()> {
        if self.is_sync(flags) {
            self.commit_for(inode)?;
        }
        Ok(())
    }
}
