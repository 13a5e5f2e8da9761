//! Changing the namespace: mkdir, rmdir, unlink and link (rename has its
//! own module, `rename.rs`; what happens at an inode's last link is in
//! `evict.rs`).
//!
//! Every operation has an inode-number core (`*_at`: what the FUSE server
//! calls) and a path wrapper. Each takes the caller's [`Cred`].
//!
//! Locking (the kernel's rules; ARCHITECTURE.md, "Locking and memory
//! ordering"):
//! - parents before children; a directory's record lock (`disk`, the
//!   `i_rwsem` analogue) is taken as a writer for any change to its entries;
//! - two parents (cross-directory rename) are taken under the filesystem's
//!   rename mutex (`s_vfs_rename_mutex`), ancestor first, otherwise lower
//!   inode number first — so rmdir (parent, then child directory) and a
//!   rename through the same two directories agree on the order;
//! - the inodes being moved, replaced or removed are locked after all
//!   parents, lower inode number first.
//!
//! The directory-entry changes themselves (and growing a directory) live
//! in the ext4 layer (`dir_insert`, `dir_delete`); this module orders them,
//! keeps link counts, times and the caches right, and decides when an inode
//! dies (`evict.rs`: freed at once, or through the orphan list). The
//! helpers rename shares with them (name checks, permission checks, link
//! counts) are `pub(super)` here.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ext4kit_format::dirent::NAME_MAX;
use ext4kit_format::features::ro_compat;
use ext4kit_format::inode::{FileType, Inode, TimeField};

use super::acl_inherit::CreateMode;
use super::cred::{Cred, MAY_EXEC, MAY_WRITE};
use super::evict::Death;
use super::icache::CachedInode;
use super::namei::{show, with_path};
use super::{Fs, Stat};
use crate::error::{Errno, Error, Result};
use crate::ext4::dir_insert::{self, NewEntry};
use crate::ext4::ialloc::{self, NewInode};
use crate::ext4::reservation::Reserver;
use crate::ext4::{balloc, dir, dir_delete, inode, orphan, owner_scan, release_check, BlockMap, DirRef};

/// The most links an inode may have (`EXT4_LINK_MAX`). A directory with
/// `dir_nlink` goes to a link count of 1 ("many") past it.
pub const LINK_MAX: u16 = 65000;

/// Check a single name component for a new entry.
pub(super) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::posix(
            Errno::EINVAL,
            format!("invalid name {:?}", String::from_utf8_lossy(name)),
        ));
    }
    if name.len() > NAME_MAX {
        return Err(Error::posix(
            Errno::ENAMETOOLONG,
            format!("{}: name longer than {NAME_MAX} bytes", show(name)),
        ));
    }
    Ok(())
}

pub(super) fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Split "/a/b/c" into ("/a/b", "c"), ignoring trailing slashes.
pub(super) fn split(path: &[u8]) -> Result<(&[u8], &[u8])> {
    let mut e = path.len();
    while e > 1 && path[e - 1] == b'/' {
        e -= 1;
    }
    let p = &path[..e];
    match p.iter().rposition(|&b| b == b'/') {
        Some(i) => Ok((if i == 0 { &b"/"[..] } else { &p[..i] }, &p[i + 1..])),
        None if p.is_empty() => Err(Error::posix(Errno::ENOENT, "empty path")),
        None => Ok((&b"/"[..], p)),
    }
}

/// Change a link count by `delta`, with dir_nlink's "1 means many" rule for
/// directories (`ext4_inc_count` / `ext4_dec_count`).
pub(super) fn add_links(rec: &mut Inode, delta: i32, dir_nlink: bool) {
    let n = rec.base.links_count;
    let is_dir = rec.file_type() == Some(FileType::Directory);
    if is_dir && n == 1 && dir_nlink {
        return; // "many": the true count is unknown and stays so
    }
    let v = n as i32 + delta;
    rec.base.links_count = if is_dir && dir_nlink && v >= LINK_MAX as i32 {
        1
    } else {
        v.max(0) as u16
    };
}

impl Fs {
    pub(super) fn dir_nlink(&self) -> bool {
        self.vol.geo().has_ro_compat(ro_compat::DIR_NLINK)
    }

    /// The cached inode of directory `ino` (ENOTDIR otherwise).
    pub(super) fn dir_inode(&self, ino: u32) -> Result<Arc<CachedInode>> {
        let d = self.inode(ino)?;
        if d.ftype != FileType::Directory {
            return Err(Error::posix(Errno::ENOTDIR, format!("inode {ino} is not a directory")));
        }
        Ok(d)
    }

    /// The block map of a locked inode: the cached one (maps change, and
    /// the cache is reset, only under the writer side of the lock we hold)
    /// or parsed from `rec`.
    pub(super) fn locked_map(&self, inode: &CachedInode, rec: &Inode) -> Result<Arc<BlockMap>> {
        inode.block_map_locked(&self.vol, rec)
    }

    pub(super) fn may_create(&self, dir: &Inode, cred: &Cred, what: &[u8]) -> Result<()> {
        super::iflags::check_create_in(dir, what)?;
        if !cred.may(dir, MAY_WRITE | MAY_EXEC) {
            return Err(Error::posix(
                Errno::EACCES,
                format!("{}: no write and search permission on the directory", show(what)),
            ));
        }
        Ok(())
    }

    /// `may_delete`: write+search on the directory, and with the sticky bit
    /// only the file's owner, the directory's owner or root.
    pub(super) fn may_delete(&self, dir: &Inode, victim: &Inode, cred: &Cred, what: &[u8]) -> Result<()> {
        self.may_create(dir, cred, what)?;
        super::iflags::check_delete(dir, victim, what)?;
        if dir.base.mode & 0o1000 != 0 && !cred.is_root() && cred.uid != victim.uid() && cred.uid != dir.uid() {
            return Err(Error::posix(
                Errno::EPERM,
                format!("{}: sticky directory: only the owner may remove it", show(what)),
            ));
        }
        Ok(())
    }

    /// Owner and group for a new inode in `dir`: the caller's, except that a
    /// set-group-id directory passes its group on (and, to subdirectories,
    /// its S_ISGID bit).
    fn new_owner(&self, dir: &Inode, cred: &Cred, ftype: FileType, perm: u16) -> (u32, u32, u16) {
        if dir.base.mode & 0o2000 != 0 {
            let perm = if ftype == FileType::Directory {
                perm | 0o2000
            } else {
                perm
            };
            (cred.uid, dir.gid(), perm)
        } else {
            (cred.uid, cred.gid, perm)
        }
    }

    /// Create directory `name` in directory `parent` (the mode as for
    /// [`Fs::mknod_at`]: a umask, or the parent's default ACL).
    pub fn mkdir_at(&self, parent: u32, name: &[u8], perm: impl Into<CreateMode>, cred: &Cred) -> Result<Stat> {
        self.mkdir_owned(parent, name, perm, cred, None)
    }

    /// [`Fs::mkdir_at`] with an explicit owner: image building copies owners
    /// from a source tree while acting with `cred`'s rights.
    pub fn mkdir_owned(
        &self,
        parent: u32,
        name: &[u8],
        perm: impl Into<CreateMode>,
        cred: &Cred,
        owner: Option<(u32, u32)>,
    ) -> Result<Stat> {
        let mode = perm.into();
        self.retry_enospc(|| self.mkdir_owned_once(parent, name, mode, cred, owner))
    }

    /// One attempt of [`Self::mkdir_owned`].
    fn mkdir_owned_once(
        &self,
        parent: u32,
        name: &[u8],
        mode: CreateMode,
        cred: &Cred,
        owner: Option<(u32, u32)>,
    ) -> Result<Stat> {
        check_name(name)?;
        if is_dot(name) {
            return Err(Error::posix(Errno::EEXIST, format!("{}: exists", show(name))));
        }
        let dir = self.dir_inode(parent)?;
        let mut drec = dir.disk.write();
        if drec.base.links_count == 0 {
            return Err(Error::posix(
                Errno::ENOENT,
                format!("directory inode {parent} was removed"),
            ));
        }
        self.may_create(&drec, cred, name)?;
        let map = self.locked_map(&dir, &drec)?;
        let dref = DirRef {
            ino: parent,
            inode: &drec,
            map: &map,
        };
        if dir::lookup_for_write(&self.vol, dref, name)?.is_some() {
            return Err(Error::posix(Errno::EEXIST, format!("{}: file exists", show(name))));
        }
        if drec.base.links_count >= LINK_MAX && !self.dir_nlink() {
            return Err(Error::posix(
                Errno::EMLINK,
                format!("directory inode {parent} has {LINK_MAX} subdirectories (no dir_nlink)"),
            ));
        }
        let acl = self.acl_for_new(parent, &drec, FileType::Directory, mode)?;
        let (uid, gid, perm) = match owner {
            Some((u, g)) => (u, g, acl.mode),
            None => self.new_owner(&drec, cred, FileType::Directory, acl.mode),
        };
        // The directory's first block is allocated after its inode, and the
        // name goes in after both: refuse now rather than half-way if
        // either would meet damage.
        balloc::check_allocatable(&self.vol, self.vol.geo().group_first_block_of_inode(parent))?;
        dir_insert::check_insertable(&self.vol, dref)?;
        // No block for the directory's first block: ENOSPC now, before the
        // inode. An inode allocated and freed again (the undo below) still
        // leaves `bg_itable_unused` lowered, so that refusal would change
        // the image (the kernel's ext4_mkdir leaves it so too). Only a
        // concurrent allocation taking the last block in between can still
        // reach the undo.
        self.vol.reservations().reserve(1, Reserver::User)?;
        self.vol.reservations().release(1);
        let t = self.now();
        let mut h = self.vol.begin()?;
        let ino = ialloc::new_inode(&self.vol, &mut h, parent, FileType::Directory)?;
        // A cached inode of this number is a dead predecessor whose freer
        // has not dropped it yet: the number is ours now.
        self.icache.forget(ino);
        let mut rec = ialloc::new_record(
            &self.vol,
            &NewInode {
                ftype: FileType::Directory,
                perm,
                uid,
                gid,
                now: t,
                parent: (drec.base.flags, drec.extra.projid),
            },
        );
        rec.base.links_count = 2;
        if let Err(e) = dir_insert::init_dir(&self.vol, &mut h, ino, &mut rec, parent) {
            ialloc::free_inode(&self.vol, &mut h, ino, &rec)?;
            h.commit()?;
            return Err(e);
        }
        if let Err(e) = self.store_inherited_acl(&mut h, ino, &mut rec, &acl) {
            // ext4_init_acl failing fails the mkdir: nothing is left.
            self.destroy(&mut h, ino, &mut rec, t)?;
            h.commit()?;
            return Err(e);
        }
        inode::write(&self.vol, &mut h, ino, &rec)?;
        let mut newd = drec.clone();
        let grew = match dir_insert::add_link(
            &self.vol,
            &mut h,
            dref,
            &mut newd,
            NewEntry::new(name, ino, FileType::Directory),
        ) {
            Ok(g) => g,
            Err(e) => {
                // Undo: the new directory's block and inode go back.
                self.destroy(&mut h, ino, &mut rec, t)?;
                h.commit()?;
                return Err(e);
            }
        };
        add_links(&mut newd, 1, self.dir_nlink());
        if newd.base.links_count == 1 && !self.dir_nlink() {
            return Err(Error::posix(Errno::EMLINK, "directory link count overflow"));
        }
        newd.set_time(TimeField::Mtime, t);
        newd.set_time(TimeField::Ctime, t);
        inode::write(&self.vol, &mut h, parent, &newd)?;
        h.commit()?;
        let newsize = newd.size();
        *drec = newd;
        if grew {
            dir.size.store(newsize, Ordering::Release);
            dir.reset_block_map();
        }
        // Under the directory's lock (see `create_at`).
        self.dcache.added(parent, name, ino, FileType::Directory);
        let flags = drec.base.flags;
        drop(drec);
        self.dirsync_after(&dir, flags)?;
        self.stat_ino(ino)
    }

    /// Remove the name `name` (not a directory) from directory `parent`; the
    /// inode dies with its last link, or at its last close if still open.
    pub fn unlink_at(&self, parent: u32, name: &[u8], cred: &Cred) -> Result<()> {
        check_name(name)?;
        if is_dot(name) {
            return Err(Error::posix(Errno::EISDIR, format!("{}: is a directory", show(name))));
        }
        self.remove_at(parent, name, false, cred)
    }

    /// Remove the empty directory `name` from directory `parent`.
    pub fn rmdir_at(&self, parent: u32, name: &[u8], cred: &Cred) -> Result<()> {
        check_name(name)?;
        if name == b"." {
            return Err(Error::posix(Errno::EINVAL, "rmdir of \".\""));
        }
        if name == b".." {
            return Err(Error::posix(Errno::ENOTEMPTY, "rmdir of \"..\""));
        }
        self.remove_at(parent, name, true, cred)
    }

    fn remove_at(&self, parent: u32, name: &[u8], want_dir: bool, cred: &Cred) -> Result<()> {
        let dir = self.dir_inode(parent)?;
        let mut drec = dir.disk.write();
        let map = self.locked_map(&dir, &drec)?;
        let dref = DirRef {
            ino: parent,
            inode: &drec,
            map: &map,
        };
        let Some((ino, _)) = dir::lookup_for_write(&self.vol, dref, name)? else {
            return Err(Error::posix(
                Errno::ENOENT,
                format!("{}: no such file or directory", show(name)),
            ));
        };
        let victim = self.inode(ino)?;
        let is_dir = victim.ftype == FileType::Directory;
        if want_dir && !is_dir {
            return Err(Error::posix(Errno::ENOTDIR, format!("{}: not a directory", show(name))));
        }
        if !want_dir && is_dir {
            return Err(Error::posix(Errno::EISDIR, format!("{}: is a directory", show(name))));
        }
        let mut vrec = victim.disk.write();
        self.may_delete(&drec, &vrec, cred, name)?;
        if is_dir {
            let vmap = self.locked_map(&victim, &vrec)?;
            let vref = DirRef {
                ino,
                inode: &vrec,
                map: &vmap,
            };
            if !dir::is_empty(&self.vol, vref)? {
                return Err(Error::posix(
                    Errno::ENOTEMPTY,
                    format!("{}: directory not empty", show(name)),
                ));
            }
        }
        if is_dir || vrec.base.links_count <= 1 {
            // Its last name: look at everything its death will free while
            // the name is still there to refuse with (release_check.rs).
            release_check::release(&self.vol, ino, &vrec)?;
        }
        // Both records are rewritten: neither may lie in a cross-linked
        // inode-table block (owner_scan.rs).
        owner_scan::check_record(&self.vol, parent)?;
        owner_scan::check_record(&self.vol, ino)?;
        let t = self.now();
        let mut h = self.vol.begin()?;
        dir_delete::remove_link(&self.vol, &mut h, dref, name)?;
        let mut newd = drec.clone();
        if is_dir {
            add_links(&mut newd, -1, self.dir_nlink());
        }
        newd.set_time(TimeField::Mtime, t);
        newd.set_time(TimeField::Ctime, t);
        inode::write(&self.vol, &mut h, parent, &newd)?;
        let mut newv = vrec.clone();
        newv.set_time(TimeField::Ctime, t);
        if is_dir {
            newv.base.links_count = 0; // "." and the name go together
        } else {
            add_links(&mut newv, -1, false);
        }
        // Out of the dentry cache before the inode can be freed and its
        // number reused: an open that found this dentry checks, after it
        // has counted itself on the inode, that the dentry is still cached
        // (`Fs::open_once`) — so it never opens the number's next owner.
        // Under the directory's lock (see `create_at`).
        self.dcache.remove(parent, name);
        let died = self.drop_link(&mut h, &victim, &mut newv, t)?;
        h.commit()?;
        if died == Death::Orphaned {
            self.vol.sync_super()?;
        }
        *drec = newd;
        *vrec = newv;
        drop(vrec);
        let flags = drec.base.flags;
        drop(drec);
        if died == Death::Freed {
            self.icache.forget_if(&victim);
        }
        self.dirsync_after(&dir, flags)
    }

    /// Give inode `ino` (not a directory) another name: `name` in `parent`.
    pub fn link_at(&self, ino: u32, parent: u32, name: &[u8], cred: &Cred) -> Result<Stat> {
        self.retry_enospc(|| self.link_at_once(ino, parent, name, cred))
    }

    /// One attempt of [`Self::link_at`].
    fn link_at_once(&self, ino: u32, parent: u32, name: &[u8], cred: &Cred) -> Result<Stat> {
        check_name(name)?;
        if is_dot(name) {
            return Err(Error::posix(Errno::EEXIST, format!("{}: exists", show(name))));
        }
        let dir = self.dir_inode(parent)?;
        let mut drec = dir.disk.write();
        self.may_create(&drec, cred, name)?;
        let map = self.locked_map(&dir, &drec)?;
        let dref = DirRef {
            ino: parent,
            inode: &drec,
            map: &map,
        };
        if dir::lookup_for_write(&self.vol, dref, name)?.is_some() {
            return Err(Error::posix(Errno::EEXIST, format!("{}: file exists", show(name))));
        }
        let target = self.inode(ino)?;
        if target.ftype == FileType::Directory {
            return Err(Error::posix(
                Errno::EPERM,
                format!("{}: hard links to directories", show(name)),
            ));
        }
        let mut trec = target.disk.write();
        super::iflags::check_link(&trec, name)?;
        // An inode with no name gets one only if it is an O_TMPFILE made
        // without O_EXCL and never linked (vfs_link: `i_nlink == 0 &&
        // !(i_state & I_LINKABLE)` is ENOENT); that first link takes it
        // off the orphan list in the same transaction (__ext4_link →
        // ext4_orphan_del).
        let first = trec.base.links_count == 0;
        if first && (trec.base.mode == 0 || !target.linkable.load(Ordering::SeqCst)) {
            return Err(Error::posix(Errno::ENOENT, format!("inode {ino} has been unlinked")));
        }
        if trec.base.links_count >= LINK_MAX {
            return Err(Error::posix(
                Errno::EMLINK,
                format!("inode {ino} already has {LINK_MAX} links"),
            ));
        }
        // The directory may grow: refuse now if allocation or the
        // insertion would meet damage.
        balloc::check_allocatable(&self.vol, self.vol.geo().group_first_block_of_inode(parent))?;
        dir_insert::check_insertable(&self.vol, dref)?;
        let t = self.now();
        let mut h = self.vol.begin()?;
        let mut newd = drec.clone();
        let grew = dir_insert::add_link(
            &self.vol,
            &mut h,
            dref,
            &mut newd,
            NewEntry::new(name, ino, target.ftype),
        )?;
        newd.set_time(TimeField::Mtime, t);
        newd.set_time(TimeField::Ctime, t);
        inode::write(&self.vol, &mut h, parent, &newd)?;
        let mut newt = trec.clone();
        if first {
            orphan::remove(&self.vol, &mut h, ino, &mut newt)?;
        }
        newt.base.links_count += 1;
        newt.set_time(TimeField::Ctime, t);
        inode::write(&self.vol, &mut h, ino, &newt)?;
        h.commit()?;
        if first {
            // The chain's head, when it was the head, without a journal.
            self.vol.sync_super()?;
            // Named now: a close no longer frees it (a close that read the
            // flag before waits for `trec` in `release_unlinked` and finds
            // the link), and a later unlink makes a plain orphan of it.
            target.unlinked.store(false, Ordering::SeqCst);
            target.linkable.store(false, Ordering::SeqCst);
        }
        let newsize = newd.size();
        *drec = newd;
        *trec = newt;
        if grew {
            dir.size.store(newsize, Ordering::Release);
            dir.reset_block_map();
        }
        // Under the directory's lock (see `create_at`).
        self.dcache.added(parent, name, ino, target.ftype);
        drop(trec);
        let flags = drec.base.flags;
        drop(drec);
        self.dirsync_after(&dir, flags)?;
        self.stat_ino(ino)
    }

    // ---- path wrappers ----

    /// `mkdir(2)`.
    pub fn mkdir(&self, path: &[u8], perm: impl Into<CreateMode>, cred: &Cred) -> Result<Stat> {
        let (p, name) = split(path)?;
        let parent = self.resolve(p, true)?;
        self.mkdir_at(parent.ino, name, perm, cred)
            .map_err(|e| with_path(e, path))
    }

    /// `unlink(2)`.
    pub fn unlink(&self, path: &[u8], cred: &Cred) -> Result<()> {
        let (p, name) = split(path)?;
        let parent = self.resolve(p, true)?;
        self.unlink_at(parent.ino, name, cred).map_err(|e| with_path(e, path))
    }

    /// `rmdir(2)`.
    pub fn rmdir(&self, path: &[u8], cred: &Cred) -> Result<()> {
        let (p, name) = split(path)?;
        let parent = self.resolve(p, true)?;
        self.rmdir_at(parent.ino, name, cred).map_err(|e| with_path(e, path))
    }

    /// `link(2)`: `new_path` becomes another name of `old_path` (not followed
    /// if a symlink, as Linux `link` does).
    pub fn link(&self, old_path: &[u8], new_path: &[u8], cred: &Cred) -> Result<Stat> {
        let src = self.resolve(old_path, false)?;
        let (p, name) = split(new_path)?;
        let parent = self.resolve(p, true)?;
        self.link_at(src.ino, parent.ino, name, cred)
            .map_err(|e| with_path(e, new_path))
    }
}
