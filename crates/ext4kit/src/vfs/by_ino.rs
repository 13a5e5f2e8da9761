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

use super::acl_inherit::CreateMode;
use super::cred::{Caller, Cred};
use super::file::{File, OpenFlags};
use super::icache::CachedInode;
use super::{Fs, Stat};
use crate::error::{Errno, Error, Result};
use crate::ext4::{inode, ROOT_INO};

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
    /// file with mode `perm` (a umask, or the parent's default ACL, as for
    /// [`Fs::mknod_at`]) owned by `cred` (or the directory's group when it
    /// is set-group-id),
    /// then open it. When the name exists, O_EXCL gives EEXIST and
    /// otherwise the existing file is opened (with the permission check a
    /// plain open makes), as `open(2)` does after losing a creation race.
    /// Returns the attributes and the open file.
    pub fn create_open_at(
        &self,
        parent: u32,
        name: &[u8],
        perm: impl Into<CreateMode>,
        flags: OpenFlags,
        cred: &Cred,
        check: PermCheck,
    ) -> Result<(Stat, Arc<File>)> {
        match self.mknod_at(parent, name, FileType::Regular, perm, (0, 0), cred) {
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

    /// `open(O_TMPFILE)` in directory `parent` (`vfs_tmpfile` →
    /// `ext4_tmpfile`, then the open): a regular file with mode `perm` (a
    /// umask, or the parent's default ACL) and no name, open with `flags`
    /// (its access mode; O_CREAT, O_EXCL, O_TRUNC and O_DIRECTORY are the
    /// caller's to strip). With `linkable` (the open had no O_EXCL) a later
    /// [`Fs::link_at`] may name it; otherwise its last close frees it.
    /// Close it with [`Fs::close_file`].
    pub fn tmpfile_open_at(
        &self,
        parent: u32,
        perm: impl Into<CreateMode>,
        flags: OpenFlags,
        linkable: bool,
        cred: &Cred,
    ) -> Result<(Stat, Arc<File>)> {
        let inode = self.tmpfile_inode(parent, perm.into(), linkable, cred)?;
        let st = Stat::from_inode(&self.vol, inode.ino, &inode.disk.read());
        // Opened from the cached inode itself: it has no name to find it
        // by again, and cannot be read back from disk (links 0).
        match self.open_cached(&inode, flags, cred, PermCheck::Done, true) {
            Ok(f) => Ok((st, f)),
            Err(e) => {
                // Never opened: free it now rather than at the next mount.
                if let Err(u) = self.release_unlinked(&inode) {
                    eprintln!("ext4kit: freeing tmpfile inode {}: {u}", inode.ino);
                }
                Err(e)
            }
        }
    }

    /// The attributes of the inode a file handle names (`name_to_handle_at`,
    /// NFS export: a frontend's handles are inode numbers), checked as
    /// ext4's `ext4_nfs_get_inode` checks them before anything is read for
    /// a number that came from a user: ESTALE for a reserved inode other
    /// than the root, a number past `s_inodes_count`, or an inode that is
    /// free or unlinked (no links); the record is read without caching
    /// first, so a free inode's never enters the inode cache (`ext4_iget`).
    pub fn stat_by_handle(&self, ino: u32) -> Result<Stat> {
        let stale = || Error::posix(Errno::ESTALE, format!("inode {ino}: stale file handle"));
        let (first_ino, count) = {
            let sb = self.vol.sb().read();
            (sb.first_ino, sb.inodes_count)
        };
        if (ino < first_ino && ino != ROOT_INO) || ino > count || ino == 0 {
            return Err(stale());
        }
        let keep_eio = |e: Error| if e.errno() == Errno::EIO { e } else { stale() };
        let rec = inode::read(&self.vol, ino).map_err(keep_eio)?;
        if rec.base.links_count == 0 || rec.base.mode == 0 {
            return Err(stale());
        }
        self.stat_ino(ino).map_err(keep_eio)
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
        self.open_cached(&inode, flags, cred, check, created)
    }

    fn open_cached(
        &self,
        inode: &Arc<CachedInode>,
        flags: OpenFlags,
        cred: &Cred,
        check: PermCheck,
        created: bool,
    ) -> Result<Arc<File>> {
        let ino = inode.ino;
        let check_perm = check == PermCheck::Engine && !created;
        self.may_open(inode, flags, cred, check_perm, &|| format!("inode {ino}"))?;
        if flags.trunc && inode.ftype == FileType::Regular && !created {
            self.truncate_inode(inode, 0, &Caller::new(cred))?;
        }
        let r = super::pin::open(inode, None)
            .ok_or_else(|| crate::error::Error::posix(Errno::ENOENT, format!("inode {ino} was freed")))?;
        let mut file = File::new(r, flags);
        // Writes through it are the opener's (CAP_FSETID: only root's
        // keep the setuid/setgid bits).
        file.opener = cred.clone();
        Ok(Arc::new(file))
    }
}

#[cfg(test)]
mod tests {
    use super::PermCheck;
    use crate::ext4::orphan;
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

    #[test]
    fn tmpfiles_are_orphans_until_linked_and_freed_at_last_close() {
        let fs = fs();
        let root = Cred::root();
        let rw = OpenFlags::from_bits(RDWR);
        let free0 = fs.statfs().unwrap().files_free;
        // Never linked: an orphan while open, freed by its close.
        let (st, f) = fs.tmpfile_open_at(2, 0o600, rw, true, &root).unwrap();
        assert_eq!((st.nlink, st.ftype, st.perm()), (0, crate::FileType::Regular, 0o600));
        assert_eq!(orphan::chain(&fs.vol).unwrap(), vec![st.ino]);
        assert_eq!(fs.statfs().unwrap().files_free, free0 - 1);
        f.pwrite(&fs, 0, &[7u8; 10000]).unwrap();
        fs.fsync_inode(&f.inode, false).unwrap();
        // The directory did not change.
        assert!(fs.read_dir_ino(2).unwrap().iter().all(|e| e.ino != st.ino));
        fs.close_file(f).unwrap();
        assert!(orphan::chain(&fs.vol).unwrap().is_empty());
        assert_eq!(fs.statfs().unwrap().files_free, free0);

        // Linked: off the orphan list, a name, data kept, alive after close.
        let (st, f) = fs.tmpfile_open_at(2, 0o640, rw, true, &root).unwrap();
        f.pwrite(&fs, 0, b"tmpfile data").unwrap();
        let linked = fs.link_at(st.ino, 2, b"named", &root).unwrap();
        assert_eq!((linked.ino, linked.nlink), (st.ino, 1));
        assert!(orphan::chain(&fs.vol).unwrap().is_empty());
        // Only the first link is the tmpfile's: after unlinking the name
        // again it is a plain unlinked open file, which cannot be relinked.
        fs.unlink_at(2, b"named", &root).unwrap();
        assert_eq!(orphan::chain(&fs.vol).unwrap(), vec![st.ino]);
        let e = fs.link_at(st.ino, 2, b"again", &root).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOENT);
        fs.close_file(f).unwrap();
        assert_eq!(fs.statfs().unwrap().files_free, free0);

        let (st, f) = fs.tmpfile_open_at(2, 0o640, rw, true, &root).unwrap();
        f.pwrite(&fs, 0, b"kept").unwrap();
        fs.link_at(st.ino, 2, b"kept", &root).unwrap();
        fs.close_file(f).unwrap();
        let (ino, _) = fs.lookup_at(2, b"kept").unwrap().unwrap();
        assert_eq!(ino, st.ino);
        let g = fs
            .open_ino_as(ino, OpenFlags::default(), &root, PermCheck::Engine)
            .unwrap();
        let mut b = [0u8; 8];
        assert_eq!(g.pread(&fs, 0, &mut b).unwrap(), 4);
        assert_eq!(&b[..4], b"kept");
        fs.close_file(g).unwrap();

        // O_EXCL: never linkable (ENOENT, as vfs_link without I_LINKABLE).
        let (st, f) = fs.tmpfile_open_at(2, 0o600, rw, false, &root).unwrap();
        let e = fs.link_at(st.ino, 2, b"excl", &root).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOENT);
        fs.close_file(f).unwrap();
        assert!(orphan::chain(&fs.vol).unwrap().is_empty());
        assert_eq!(fs.statfs().unwrap().files_free, free0 - 1);

        // The directory's write permission is needed, as for a create.
        let user = Cred::user(1000, 1000);
        let e = fs.tmpfile_open_at(2, 0o600, rw, true, &user).unwrap_err();
        assert_eq!(e.errno(), Errno::EACCES);
    }
}
