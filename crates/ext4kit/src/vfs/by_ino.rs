//! Opening files by inode number on behalf of a caller: what a frontend
//! that never sees paths (the FUSE server) needs besides the `*_at` calls.
//!
//! [`Fs::open_ino_as`] is `open(2)` after the path walk (the kernel's
//! `do_open` → `may_open` → `vfs_open` → `handle_truncate`) and
//! [`Fs::create_open_at`] is `open(O_CREAT)` of a name in a directory
//! (`lookup_open` → `vfs_create`, then the same open). Both return a
//! [`File`] that remembers whether its opener may keep setuid/setgid bits
//! across writes (`file_remove_privs`), which plain [`Fs::open_ino`] cannot.
//!
//! Locking: nothing new. Each step takes the locks of the engine call it
//! makes (creation: the parent's `disk` lock; truncation: the inode's), one
//! at a time; no two inode locks are held together.

use std::sync::Arc;

use ext4kit_format::inode::{flags as iflags, FileType};

use super::cred::{Cred, MAY_READ, MAY_WRITE};
use super::file::{File, OpenFlags};
use super::{Fs, Stat};
use crate::error::{Errno, Error, Result};

/// Who checks mode bits and ACLs at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermCheck {
    /// The engine checks `cred` against the inode (library callers).
    Engine,
    /// The caller already did (a FUSE mount with `default_permissions`:
    /// the kernel's `may_open` ran before OPEN was sent, and the flags we
    /// see may have been widened since — writeback caching turns O_WRONLY
    /// into O_RDWR — so checking them again would refuse legal opens).
    /// Immutable / append-only / read-only-filesystem checks still apply:
    /// the kernel cannot make them, it does not see the inode flags.
    Done,
}

impl Fs {
    /// `open(2)` of inode `ino` by `cred` with `flags` (O_CREAT/O_EXCL are
    /// ignored: the inode exists). Applies O_TRUNC to regular files.
    pub fn open_ino_as(&self, ino: u32, flags: OpenFlags, cred: &Cred, check: PermCheck) -> Result<Arc<File>> {
        self.open_inode(ino, flags, cred, check, false)
    }

    /// `open(O_CREAT)` of `name` in directory `parent`: create a regular
    /// file with permission bits `perm` (already masked by the umask)
    /// owned by `cred` (or the directory's group when it is set-group-id),
    /// then open it. When the name exists, O_EXCL gives EEXIST and
    /// otherwise the existing file is opened (with the permission check a
    /// plain open makes), as `open(2)` does after losing a creation race.
    /// Returns the attributes and the open file.
    pub fn create_open_at(
        &self,
        parent: u32,
        name: &[u8],
        perm: u16,
        flags: OpenFlags,
        cred: &Cred,
        check: PermCheck,
    ) -> Result<(Stat, Arc<File>)> {
        match self.mknod_at(parent, name, FileType::Regular, perm & 0o7777, (0, 0), cred) {
            Ok(st) => {
                // A file we just created is opened without a permission
                // check (its mode may well deny its creator, e.g. 0444).
                let f = self.open_inode(st.ino, flags, cred, check, true)?;
                Ok((self.stat_ino(st.ino)?, f))
            }
            Err(e) if e.errno() == Errno::EEXIST && !flags.excl => {
                let (ino, _) = self.lookup_at(parent, name)?.ok_or(e)?;
                let f = self.open_inode(ino, flags, cred, check, false)?;
                Ok((self.stat_ino(ino)?, f))
            }
            Err(e) => Err(e),
        }
    }

    fn open_inode(
        &self,
        ino: u32,
        flags: OpenFlags,
        cred: &Cred,
        check: PermCheck,
        created: bool,
    ) -> Result<Arc<File>> {
        let inode = self.inode(ino)?;
        if flags.directory && inode.ftype != FileType::Directory {
            return Err(Error::posix(Errno::ENOTDIR, format!("inode {ino} is not a directory")));
        }
        let write = flags.access.writes();
        if inode.ftype == FileType::Directory && (write || flags.trunc) {
            return Err(Error::posix(Errno::EISDIR, format!("inode {ino} is a directory")));
        }
        if check == PermCheck::Engine && !created {
            let mut mask = 0;
            if flags.access.reads() {
                mask |= MAY_READ;
            }
            if write || flags.trunc {
                mask |= MAY_WRITE;
            }
            if !cred.may(&inode.disk.read(), mask) {
                return Err(Error::posix(Errno::EACCES, format!("inode {ino}: permission denied")));
            }
        }
        {
            // may_open: IS_APPEND needs O_APPEND to write and forbids
            // O_TRUNC; IS_IMMUTABLE forbids writing at all.
            let f = inode.disk.read().base.flags;
            if (write || flags.trunc) && f & iflags::IMMUTABLE != 0
                || f & iflags::APPEND != 0 && (flags.trunc || write && !flags.append)
            {
                return Err(Error::posix(
                    Errno::EPERM,
                    format!("inode {ino}: immutable or append-only"),
                ));
            }
        }
        if (write || flags.trunc) && self.vol.read_only && inode.ftype == FileType::Regular {
            return Err(Error::posix(Errno::EROFS, format!("inode {ino}: read-only filesystem")));
        }
        if flags.trunc && inode.ftype == FileType::Regular && !created {
            self.truncate_inode(&inode, 0)?;
        }
        let mut file = File::new(inode, None, flags);
        // CAP_FSETID: only root's writes keep the setuid/setgid bits.
        file.privileged = cred.is_root();
        Ok(Arc::new(file))
    }
}
