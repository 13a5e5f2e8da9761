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

use ext4kit_format::inode::FileType;

use super::cred::Cred;
use super::file::{File, OpenFlags};
use super::{Fs, Stat};
use crate::error::{Errno, Result};

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
                // Created by someone else since the caller looked: nobody
                // checked the caller's rights on it yet, so the engine does.
                let (ino, _) = self.lookup_at(parent, name)?.ok_or(e)?;
                let f = self.open_inode(ino, flags, cred, PermCheck::Engine, false)?;
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
        let check_perm = check == PermCheck::Engine && !created;
        self.may_open(&inode, flags, cred, check_perm, &|| format!("inode {ino}"))?;
        if flags.trunc && inode.ftype == FileType::Regular && !created {
            self.truncate_inode(&inode, 0)?;
        }
        let r = super::pin::open(&inode, None)
            .ok_or_else(|| crate::error::Error::posix(Errno::ENOENT, format!("inode {ino} was freed")))?;
        let mut file = File::new(r, flags);
        // CAP_FSETID: only root's writes keep the setuid/setgid bits.
        file.privileged = cred.is_root();
        Ok(Arc::new(file))
    }
}

#[cfg(test)]
mod tests {
    use super::PermCheck;
    use crate::{Cred, Errno, OpenFlags};

    use crate::vfs::mem_fs as fs;

    const RDWR: i32 = crate::vfs::file::O_RDWR;

    #[test]
    fn create_open_owns_opens_and_races_like_open_2() {
        let fs = fs();
        fs.setattr_ino(
            2,
            &crate::SetAttr {
                mode: Some(0o777),
                ..Default::default()
            },
            &Cred::root(),
        )
        .unwrap();
        let user = Cred::user(1000, 1000);
        // Created 0400: its creator still gets the descriptor it asked for.
        let (st, f) = fs
            .create_open_at(2, b"f", 0o400, OpenFlags::from_bits(RDWR), &user, PermCheck::Engine)
            .unwrap();
        assert_eq!((st.uid, st.gid, st.perm()), (1000, 1000, 0o400));
        f.pwrite(&fs, 0, b"data").unwrap();
        fs.close_file(f).unwrap();
        // It exists now: O_EXCL fails; without it the existing file is
        // opened with a permission check (0400: no writing).
        let excl = OpenFlags::from_bits(RDWR | crate::vfs::file::O_EXCL | crate::vfs::file::O_CREAT);
        let e = fs
            .create_open_at(2, b"f", 0o600, excl, &user, PermCheck::Done)
            .unwrap_err();
        assert_eq!(e.errno(), Errno::EEXIST);
        let e = fs
            .create_open_at(2, b"f", 0o600, OpenFlags::from_bits(RDWR), &user, PermCheck::Done)
            .unwrap_err();
        assert_eq!(e.errno(), Errno::EACCES);
        let (_, f) = fs
            .create_open_at(2, b"f", 0o600, OpenFlags::default(), &user, PermCheck::Done)
            .unwrap();
        let mut b = [0u8; 8];
        assert_eq!(f.pread(&fs, 0, &mut b).unwrap(), 4);
    }

    #[test]
    fn open_by_inode_checks_truncates_and_tracks_privilege() {
        let fs = fs();
        let st = fs.write_file(b"/s", b"0123456789", 0o4666, 0, 0).unwrap();
        let user = Cred::user(1000, 1000);
        // PermCheck::Engine: mode bits decide; Done: the caller did.
        fs.setattr_ino(
            st.ino,
            &crate::SetAttr {
                mode: Some(0o4600),
                ..Default::default()
            },
            &Cred::root(),
        )
        .unwrap();
        let rw = OpenFlags::from_bits(RDWR);
        assert_eq!(
            fs.open_ino_as(st.ino, rw, &user, PermCheck::Engine)
                .unwrap_err()
                .errno(),
            Errno::EACCES
        );
        let f = fs.open_ino_as(st.ino, rw, &user, PermCheck::Done).unwrap();
        // A non-root opener's write clears setuid (file_remove_privs).
        f.pwrite(&fs, 0, b"x").unwrap();
        assert_eq!(fs.stat_ino(st.ino).unwrap().perm() & 0o7000, 0);
        fs.close_file(f).unwrap();
        // O_TRUNC empties it; a directory cannot be opened for writing.
        let t = OpenFlags::from_bits(RDWR | crate::vfs::file::O_TRUNC);
        fs.open_ino_as(st.ino, t, &Cred::root(), PermCheck::Engine).unwrap();
        assert_eq!(fs.stat_ino(st.ino).unwrap().size, 0);
        assert_eq!(
            fs.open_ino_as(2, rw, &Cred::root(), PermCheck::Engine)
                .unwrap_err()
                .errno(),
            Errno::EISDIR
        );
    }
}
