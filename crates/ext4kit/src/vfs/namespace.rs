//! Changing the namespace: mkdir, rmdir, unlink, link, rename — and the
//! end of an inode's life (freeing it at its last link, or at its last
//! close through the orphan list).
//!
//! Every operation has an inode-number core (`*_at`: what the FUSE server
//! calls) and a path wrapper. Each takes the caller's [`Cred`].
//!
//! Locking (the kernel's rules, DESIGN "Concurrency rules"):
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
//! dies.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ext4kit_format::dirent::NAME_MAX;
use ext4kit_format::features::ro_compat;
use ext4kit_format::inode::{FileType, Inode, TimeField, Timestamp};
use parking_lot::RwLockWriteGuard;

use super::cred::{Cred, MAY_EXEC, MAY_WRITE};
use super::icache::CachedInode;
use super::namei::{show, with_path};
use super::write::now;
use super::{Fs, Stat};
use crate::error::{Errno, Error, Result};
use crate::ext4::dir_insert::{self, NewEntry};
use crate::ext4::ialloc::{self, NewInode};
use crate::ext4::reservation::Reserver;
use crate::ext4::{
    balloc, bmap, bmap_write, dir, dir_delete, inode, orphan, owner_scan, release_check, xattr_write, BlockMap, DirRef,
};

/// The most links an inode may have (`EXT4_LINK_MAX`). A directory with
/// `dir_nlink` goes to a link count of 1 ("many") past it.
pub const LINK_MAX: u16 = 65000;

/// How a rename treats an existing target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with EEXIST when the target exists (`RENAME_NOREPLACE`).
    pub noreplace: bool,
    /// Swap source and target atomically; both must exist (`RENAME_EXCHANGE`).
    pub exchange: bool,
}

/// Check a single name component for a new entry.
fn check_name(name: &[u8]) -> Result<()> {
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

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Split "/a/b/c" into ("/a/b", "c"), ignoring trailing slashes.
fn split(path: &[u8]) -> Result<(&[u8], &[u8])> {
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
fn add_links(rec: &mut Inode, delta: i32, dir_nlink: bool) {
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
    fn dir_nlink(&self) -> bool {
        self.vol.geo().has_ro_compat(ro_compat::DIR_NLINK)
    }

    /// The cached inode of directory `ino` (ENOTDIR otherwise).
    fn dir_inode(&self, ino: u32) -> Result<Arc<CachedInode>> {
        let d = self.inode(ino)?;
        if d.ftype != FileType::Directory {
            return Err(Error::posix(Errno::ENOTDIR, format!("inode {ino} is not a directory")));
        }
        Ok(d)
    }

    /// The block map of a locked inode: the cached one (maps change, and
    /// the cache is reset, only under the writer side of the lock we hold)
    /// or parsed from `rec`.
    fn locked_map(&self, inode: &CachedInode, rec: &Inode) -> Result<Arc<BlockMap>> {
        inode.block_map_locked(&self.vol, rec)
    }

    fn may_create(&self, dir: &Inode, cred: &Cred, what: &[u8]) -> Result<()> {
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
    fn may_delete(&self, dir: &Inode, victim: &Inode, cred: &Cred, what: &[u8]) -> Result<()> {
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

    /// Create directory `name` in directory `parent`.
    pub fn mkdir_at(&self, parent: u32, name: &[u8], perm: u16, cred: &Cred) -> Result<Stat> {
        self.mkdir_owned(parent, name, perm, cred, None)
    }

    /// [`Fs::mkdir_at`] with an explicit owner: image building copies owners
    /// from a source tree while acting with `cred`'s rights.
    pub fn mkdir_owned(
        &self,
        parent: u32,
        name: &[u8],
        perm: u16,
        cred: &Cred,
        owner: Option<(u32, u32)>,
    ) -> Result<Stat> {
        self.retry_enospc(|| self.mkdir_owned_once(parent, name, perm, cred, owner))
    }

    /// One attempt of [`Self::mkdir_owned`].
    fn mkdir_owned_once(
        &self,
        parent: u32,
        name: &[u8],
        perm: u16,
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
        let (uid, gid, perm) = match owner {
            Some((u, g)) => (u, g, perm & 0o7777),
            None => self.new_owner(&drec, cred, FileType::Directory, perm & 0o7777),
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
        let t = now();
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
        drop(drec);
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
        let t = now();
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
        drop(drec);
        if died == Death::Freed {
            self.icache.forget_if(&victim);
        }
        Ok(())
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
        let t = now();
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
        drop(drec);
        self.stat_ino(ino)
    }

    /// Directory `dir` and its ancestors up to the root (walking ".." on
    /// disk). Callers hold the rename mutex and no directory lock: under the
    /// mutex no directory changes parent, so the chain stays true for the
    /// whole rename.
    fn ancestry(&self, mut dir: u32) -> Result<Vec<u32>> {
        let root = crate::ext4::ROOT_INO;
        let mut chain = vec![dir];
        while dir != root {
            if chain.len() > 65536 {
                return Err(Error::corrupt_msg(
                    format!("directory inode {dir}"),
                    "directory",
                    "the \"..\" chain loops or is absurdly deep",
                ));
            }
            let d = self.dir_inode(dir)?;
            let rec = d.disk.read();
            let map = self.locked_map(&d, &rec)?;
            let r = DirRef {
                ino: dir,
                inode: &rec,
                map: &map,
            };
            dir = dir::dotdot(&self.vol, r)?;
            chain.push(dir);
        }
        Ok(chain)
    }

    /// Rename `old_name` in `old_dir` to `new_name` in `new_dir`.
    pub fn rename_at(
        &self,
        old_dir: u32,
        old_name: &[u8],
        new_dir: u32,
        new_name: &[u8],
        flags: RenameFlags,
        cred: &Cred,
    ) -> Result<()> {
        self.retry_enospc(|| self.rename_at_once(old_dir, old_name, new_dir, new_name, flags, cred))
    }

    /// One attempt of [`Self::rename_at`].
    fn rename_at_once(
        &self,
        old_dir: u32,
        old_name: &[u8],
        new_dir: u32,
        new_name: &[u8],
        flags: RenameFlags,
        cred: &Cred,
    ) -> Result<()> {
        check_name(old_name)?;
        check_name(new_name)?;
        if is_dot(old_name) || is_dot(new_name) {
            return Err(Error::posix(Errno::EBUSY, "cannot rename \".\" or \"..\""));
        }
        if flags.noreplace && flags.exchange {
            return Err(Error::posix(Errno::EINVAL, "RENAME_NOREPLACE with RENAME_EXCHANGE"));
        }
        let cross = old_dir != new_dir;
        // s_vfs_rename_mutex: one cross-directory rename at a time, so the
        // ancestor checks below stay true until the rename is done.
        let _rename_guard = cross.then(|| self.dcache.rename_mutex.lock());
        let od = self.dir_inode(old_dir)?;
        let nd = self.dir_inode(new_dir)?;
        // Ancestor chains, read before any directory lock is taken.
        let (old_up, new_up) = if cross {
            (self.ancestry(old_dir)?, self.ancestry(new_dir)?)
        } else {
            (Vec::new(), Vec::new())
        };
        // Parent locks: ancestor first, else lower inode number first.
        let old_first = if !cross || new_up.contains(&old_dir) {
            true
        } else if old_up.contains(&new_dir) {
            false
        } else {
            old_dir < new_dir
        };
        let (mut orec, mut nrec): (RwLockWriteGuard<'_, Inode>, Option<RwLockWriteGuard<'_, Inode>>) = if !cross {
            (od.disk.write(), None)
        } else if old_first {
            let a = od.disk.write();
            (a, Some(nd.disk.write()))
        } else {
            let b = nd.disk.write();
            (od.disk.write(), Some(b))
        };
        let omap = self.locked_map(&od, &orec)?;
        let nmap = match &nrec {
            Some(r) => Some(self.locked_map(&nd, r)?),
            None => None,
        };
        let oref = DirRef {
            ino: old_dir,
            inode: &orec,
            map: &omap,
        };
        let nref = match (&nrec, &nmap) {
            (Some(r), Some(m)) => DirRef {
                ino: new_dir,
                inode: r,
                map: m,
            },
            _ => oref,
        };
        if orec.base.links_count == 0 || nref.inode.base.links_count == 0 {
            return Err(Error::posix(Errno::ENOENT, "rename in a removed directory"));
        }
        let Some((sino, _)) = dir::lookup_for_write(&self.vol, oref, old_name)? else {
            return Err(Error::posix(
                Errno::ENOENT,
                format!("{}: no such file or directory", show(old_name)),
            ));
        };
        let tgt = dir::lookup_for_write(&self.vol, nref, new_name)?.map(|(i, _)| i);
        if flags.exchange && tgt.is_none() {
            return Err(Error::posix(
                Errno::ENOENT,
                format!("{}: no such file or directory", show(new_name)),
            ));
        }
        if flags.noreplace && tgt.is_some() {
            return Err(Error::posix(Errno::EEXIST, format!("{}: file exists", show(new_name))));
        }
        if tgt == Some(sino) {
            return Ok(()); // two names of one inode: POSIX says do nothing
        }
        let src = self.inode(sino)?;
        let dst = tgt.map(|i| self.inode(i)).transpose()?;
        let s_dir = src.ftype == FileType::Directory;
        let d_dir = dst.as_ref().is_some_and(|d| d.ftype == FileType::Directory);
        if cross {
            // lock_rename's traps, checked before anything else about the
            // pair: the source may not be an ancestor of the target ...
            if s_dir && new_up.contains(&sino) {
                return Err(Error::posix(
                    Errno::EINVAL,
                    format!("{}: cannot move a directory into its own subtree", show(old_name)),
                ));
            }
            // ... nor the target an ancestor of the source.
            if d_dir && old_up.contains(&t_ino(&dst)) {
                return Err(Error::posix(
                    if flags.exchange {
                        Errno::EINVAL
                    } else {
                        Errno::ENOTEMPTY
                    },
                    format!("{}: is an ancestor of the source", show(new_name)),
                ));
            }
        }
        if !flags.exchange && dst.is_some() {
            if s_dir && !d_dir {
                return Err(Error::posix(
                    Errno::ENOTDIR,
                    format!("{}: not a directory", show(new_name)),
                ));
            }
            if !s_dir && d_dir {
                return Err(Error::posix(
                    Errno::EISDIR,
                    format!("{}: is a directory", show(new_name)),
                ));
            }
        }
        // Child locks after all parents, lower inode number first.
        let (mut srec, mut trec) = match &dst {
            Some(d) if d.ino < sino => {
                let t = d.disk.write();
                (src.disk.write(), Some(t))
            }
            Some(d) => {
                let s = src.disk.write();
                (s, Some(d.disk.write()))
            }
            None => (src.disk.write(), None),
        };
        self.may_delete(&orec, &srec, cred, old_name)?;
        match &trec {
            Some(t) => self.may_delete(nref.inode, t, cred, new_name)?,
            None => self.may_create(nref.inode, cred, new_name)?,
        }
        if cross && s_dir && !cred.may(&srec, MAY_WRITE) {
            return Err(Error::posix(
                Errno::EACCES,
                format!(
                    "{}: moving a directory needs write permission on it (\"..\")",
                    show(old_name)
                ),
            ));
        }
        if cross && flags.exchange && d_dir && trec.as_ref().is_some_and(|t| !cred.may(t, MAY_WRITE)) {
            return Err(Error::posix(
                Errno::EACCES,
                format!("{}: moving a directory needs write permission on it", show(new_name)),
            ));
        }
        if let (false, Some(t), true) = (flags.exchange, &trec, d_dir) {
            let tm = bmap::load(&self.vol, t_ino(&dst), t)?;
            let r = DirRef {
                ino: t_ino(&dst),
                inode: t,
                map: &tm,
            };
            if !dir::is_empty(&self.vol, r)? {
                return Err(Error::posix(
                    Errno::ENOTEMPTY,
                    format!("{}: directory not empty", show(new_name)),
                ));
            }
        }
        // Link-count limits on the receiving directory.
        let dir_nlink = self.dir_nlink();
        if cross && s_dir && !d_dir && nref.inode.base.links_count >= LINK_MAX && !dir_nlink {
            return Err(Error::posix(
                Errno::EMLINK,
                "target directory has too many subdirectories",
            ));
        }
        if cross && flags.exchange && d_dir && !s_dir && orec.base.links_count >= LINK_MAX && !dir_nlink {
            return Err(Error::posix(
                Errno::EMLINK,
                "source directory has too many subdirectories",
            ));
        }

        // What the rename will edit beyond the two names, checked while
        // nothing has changed (release_check.rs): a moved directory's
        // "..", and everything a replaced target's death frees.
        if cross {
            let moved = [
                (s_dir, sino, Some(&*srec)),
                (flags.exchange && d_dir, t_ino(&dst), trec.as_deref()),
            ];
            for (is_dir, ino, rec) in moved {
                let (true, Some(rec)) = (is_dir, rec) else { continue };
                let m = bmap::load(&self.vol, ino, rec)?;
                dir::dotdot(
                    &self.vol,
                    DirRef {
                        ino,
                        inode: rec,
                        map: &m,
                    },
                )?;
            }
        }
        if let (false, Some(tr)) = (flags.exchange, trec.as_deref()) {
            if d_dir || tr.base.links_count <= 1 {
                release_check::release(&self.vol, t_ino(&dst), tr)?;
            }
        }
        if !flags.exchange && dst.is_none() {
            // The new name may grow its directory.
            balloc::check_allocatable(&self.vol, self.vol.geo().group_first_block_of_inode(new_dir))?;
            dir_insert::check_insertable(&self.vol, nref)?;
        }
        // Every record the rename rewrites: none may lie in a cross-linked
        // inode-table block (owner_scan.rs).
        for ino in [old_dir, new_dir, sino]
            .into_iter()
            .chain(dst.as_ref().map(|_| t_ino(&dst)))
        {
            owner_scan::check_record(&self.vol, ino)?;
        }
        let t = now();
        let mut h = self.vol.begin()?;
        let mut new_o = orec.clone();
        let mut new_n = nrec.as_deref().cloned();
        let mut new_s = srec.clone();
        let mut new_t = trec.as_deref().cloned();
        let mut o_grew = false;
        let mut n_grew = false;
        let mut death = Death::Alive;
        if flags.exchange {
            let (tino, tft) = (t_ino(&dst), dst.as_ref().map_or(FileType::Regular, |d| d.ftype));
            dir_delete::replace_link(&self.vol, &mut h, oref, old_name, tino, tft)?;
            dir_delete::replace_link(&self.vol, &mut h, nref, new_name, sino, src.ftype)?;
            if cross {
                if s_dir {
                    let sm = self.locked_map(&src, &srec)?;
                    dir_insert::set_dotdot(
                        &self.vol,
                        &mut h,
                        DirRef {
                            ino: sino,
                            inode: &srec,
                            map: &sm,
                        },
                        new_dir,
                    )?;
                }
                if let (true, Some(tr)) = (d_dir, trec.as_deref()) {
                    let tm = bmap::load(&self.vol, tino, tr)?;
                    dir_insert::set_dotdot(
                        &self.vol,
                        &mut h,
                        DirRef {
                            ino: tino,
                            inode: tr,
                            map: &tm,
                        },
                        old_dir,
                    )?;
                }
                let n = new_n.as_mut().unwrap_or(&mut new_o);
                match (s_dir, d_dir) {
                    (true, false) => add_links(n, 1, dir_nlink),
                    (false, true) => add_links(n, -1, dir_nlink),
                    _ => {}
                }
                match (s_dir, d_dir) {
                    (true, false) => add_links(&mut new_o, -1, dir_nlink),
                    (false, true) => add_links(&mut new_o, 1, dir_nlink),
                    _ => {}
                }
            }
            if let Some(tr) = new_t.as_mut() {
                tr.set_time(TimeField::Ctime, t);
            }
        } else {
            if let Some(dd) = &dst {
                dir_delete::replace_link(&self.vol, &mut h, nref, new_name, sino, src.ftype)?;
                let tr = new_t.as_mut().expect("target record locked with the target");
                tr.set_time(TimeField::Ctime, t);
                if d_dir {
                    tr.base.links_count = 0;
                } else {
                    add_links(tr, -1, false);
                }
                // Out of the dentry cache before the target can be freed
                // and its number reused (see `remove_at`).
                self.dcache.remove(new_dir, new_name);
                death = self.drop_link(&mut h, dd, tr, t)?;
            } else {
                let n = new_n.as_mut().unwrap_or(&mut new_o);
                let grew = dir_insert::add_link(&self.vol, &mut h, nref, n, NewEntry::new(new_name, sino, src.ftype))?;
                if cross {
                    n_grew = grew;
                } else {
                    o_grew = grew;
                }
            }
            // Remove the old name. In the same directory an insert may have
            // grown it: look the name up through the updated record.
            if !cross && o_grew {
                // The cached map is the pre-growth one: parse the grown record.
                let m = bmap::load(&self.vol, old_dir, &new_o)?;
                dir_delete::remove_link(
                    &self.vol,
                    &mut h,
                    DirRef {
                        ino: old_dir,
                        inode: &new_o,
                        map: &m,
                    },
                    old_name,
                )?;
            } else {
                dir_delete::remove_link(&self.vol, &mut h, oref, old_name)?;
            }
            // Link counts as ext4_rename keeps them: the old directory loses
            // a subdirectory when the source moves away or a directory
            // target is replaced; the new one gains one only when nothing
            // was replaced.
            if s_dir {
                if cross {
                    let sm = self.locked_map(&src, &srec)?;
                    dir_insert::set_dotdot(
                        &self.vol,
                        &mut h,
                        DirRef {
                            ino: sino,
                            inode: &srec,
                            map: &sm,
                        },
                        new_dir,
                    )?;
                }
                if cross || d_dir {
                    add_links(&mut new_o, -1, dir_nlink);
                }
                if cross && !d_dir {
                    add_links(new_n.as_mut().unwrap_or(&mut new_o), 1, dir_nlink);
                }
            }
        }
        new_s.set_time(TimeField::Ctime, t);
        for r in [Some(&mut new_o), new_n.as_mut()].into_iter().flatten() {
            r.set_time(TimeField::Mtime, t);
            r.set_time(TimeField::Ctime, t);
        }
        inode::write(&self.vol, &mut h, old_dir, &new_o)?;
        if let Some(n) = &new_n {
            inode::write(&self.vol, &mut h, new_dir, n)?;
        }
        inode::write(&self.vol, &mut h, sino, &new_s)?;
        if let (Some(tr), Death::Alive) = (&new_t, death) {
            inode::write(&self.vol, &mut h, t_ino(&dst), tr)?;
        }
        h.commit()?;
        if death == Death::Orphaned {
            self.vol.sync_super()?;
        }
        let o_size = new_o.size();
        let n_size = new_n.as_ref().map_or(o_size, |n| n.size());
        *orec = new_o;
        if let (Some(g), Some(n)) = (nrec.as_mut(), new_n) {
            **g = n;
        }
        *srec = new_s;
        if let (Some(g), Some(n)) = (trec.as_mut(), new_t) {
            **g = n;
        }
        // Under both directories' locks (see `create_at`).
        self.dcache
            .renamed(old_dir, old_name, new_dir, new_name, flags.exchange);
        drop(trec);
        drop(srec);
        drop(nrec);
        drop(orec);
        if o_grew {
            od.size.store(o_size, Ordering::Release);
            od.reset_block_map();
        }
        if n_grew {
            nd.size.store(n_size, Ordering::Release);
            nd.reset_block_map();
        }
        if let (Death::Freed, Some(d)) = (death, &dst) {
            self.icache.forget_if(d);
        }
        Ok(())
    }

    /// After a link count went down: if it reached zero, free the inode now
    /// (nobody has it open) or put it on the orphan list (freed at the last
    /// close). Writes `rec` through `h` in every case but `Alive`.
    fn drop_link(
        &self,
        h: &mut crate::ext4::transaction::Handle<'_>,
        inode: &CachedInode,
        rec: &mut Inode,
        t: Timestamp,
    ) -> Result<Death> {
        if rec.base.links_count > 0 {
            inode::write(&self.vol, h, inode.ino, rec)?;
            return Ok(Death::Alive);
        }
        // Flag first, then revoke the idle pins, then count: a close that
        // drops the last open after the revocation looked at its pin sees
        // the flag (`vfs::pin`) and frees the inode itself.
        inode.unlinked.store(true, Ordering::SeqCst);
        super::pin::revoke_idle(inode);
        // Open files and frontend holds keep it: on the orphan list until
        // the last close or dropped hold (`vfs::holds` for why reading the
        // count here, under the inode's writer lock, after the flag, is
        // enough).
        if inode.opens.load(Ordering::SeqCst) > 0 || self.holds.is_held(inode.ino) {
            orphan::add(&self.vol, h, inode.ino, rec)?;
            return Ok(Death::Orphaned);
        }
        self.discard_pages(inode);
        self.destroy(h, inode.ino, rec, t)?;
        // Dead in memory (the record on disk keeps its mode): a late
        // releaser or holder must not free or use it again.
        rec.base.mode = 0;
        Ok(Death::Freed)
    }

    /// Drop every cached page of a dying inode, dirty ones included (their
    /// data has nowhere to go), with the page budget's accounting, and stop
    /// readers from trusting the old block map.
    fn discard_pages(&self, inode: &CachedInode) {
        inode.pages.bump();
        let (pages, dirty) = inode.pages.remove_range(0, u64::MAX, &self.pages);
        self.pages.release(pages);
        self.pages.release_dirty(dirty);
        inode.clear_dirty();
        inode.size.store(0, Ordering::Release);
        inode.reset_block_map();
    }

    /// Free everything inode `ino` owns and the inode itself (`ext4_evict_inode`):
    /// data and map blocks, the xattr block, then the record (links 0,
    /// `i_dtime` set, as e2fsck expects of a deleted inode) and its bitmap bit.
    fn destroy(
        &self,
        h: &mut crate::ext4::transaction::Handle<'_>,
        ino: u32,
        rec: &mut Inode,
        t: Timestamp,
    ) -> Result<()> {
        if matches!(
            bmap::load(&self.vol, ino, rec)?,
            BlockMap::Extents(_) | BlockMap::Indirect(_)
        ) {
            bmap_write::punch(&self.vol, h, ino, rec, 0..u64::MAX)?;
        }
        xattr_write::drop_block(&self.vol, h, ino, rec)?;
        rec.base.links_count = 0;
        rec.base.set_size(0);
        rec.base.dtime = t.sec as u32;
        inode::write(&self.vol, h, ino, rec)?;
        ialloc::free_inode(&self.vol, h, ino, rec)
    }

    /// The last close of inode `inode`: if it has no name left, it leaves
    /// the orphan list and is freed.
    pub fn release_unlinked(&self, inode: &CachedInode) -> Result<()> {
        super::shared::note(2);
        let mut rec = inode.disk.write();
        if rec.base.links_count != 0 || rec.base.mode == 0 {
            return Ok(());
        }
        // Idle pins give their units back first (`vfs::pin`); then the
        // count is of open files and holds only.
        super::pin::revoke_idle(inode);
        if inode.opens.load(Ordering::SeqCst) != 0 || self.holds.is_held(inode.ino) {
            return Ok(());
        }
        let t = now();
        let mut h = self.vol.begin()?;
        let mut new = rec.clone();
        self.discard_pages(inode);
        orphan::remove(&self.vol, &mut h, inode.ino, &mut new)?;
        self.destroy(&mut h, inode.ino, &mut new, t)?;
        h.commit()?;
        self.vol.sync_super()?;
        new.base.mode = 0; // dead: a late releaser must not free it twice
        *rec = new;
        drop(rec);
        self.icache.forget_if(inode);
        Ok(())
    }

    /// Close an open file: drop this reference, and if it was the last open
    /// of an inode that has no name left, free the inode (the last close of
    /// an unlinked file). Frontends call this instead of just dropping the
    /// `Arc<File>`; a file dropped without it stays on the orphan list until
    /// the next open of the image frees it.
    pub fn close_file(&self, file: Arc<super::File>) -> Result<()> {
        // The pin's own count (its thread's line), not the inode's.
        let pin = file.inode.pin().clone();
        drop(file);
        self.after_pin_dropped(pin)
    }

    /// Close an open that never became a file (an open that failed its
    /// checks, or whose dentry went stale): as [`Fs::close_file`].
    pub(crate) fn close_open(&self, open: super::pin::OpenRef) -> Result<()> {
        let pin = open.pin().clone();
        drop(open);
        self.after_pin_dropped(pin)
    }

    /// After an open on `pin` was dropped: `pin` is the caller's own
    /// reference, which ends the pin when nothing else (its thread's cache,
    /// another open) holds it.
    fn after_pin_dropped(&self, pin: Arc<super::pin::Pin>) -> Result<()> {
        if Arc::strong_count(&pin) == 1 {
            // The pin left its thread's cache and this close ends it: its
            // unit of `opens` goes back (a shared write, off the common path).
            let inode = pin.inode().clone();
            super::shared::note(2);
            drop(pin);
            return self.after_close(&inode);
        }
        self.after_close(pin.inode())
    }

    /// After a close or a dropped hold: free the inode if that was the
    /// last user of an unlinked one. Reads two shared words, writes
    /// nothing unless the inode is unlinked (see `vfs::pin` for why the
    /// flag is read after the open was dropped).
    fn after_close(&self, inode: &CachedInode) -> Result<()> {
        if inode.unlinked.load(Ordering::SeqCst) || inode.opens.load(Ordering::Acquire) == 0 {
            self.release_unlinked(inode)?;
        }
        Ok(())
    }

    /// Keep `inode` allocated as an open file does, for a frontend that
    /// hands its number out and may be asked about it after its last name
    /// is gone. FUSE's lookup count is that: until FORGET the kernel may
    /// send requests for the node id, and were the inode freed and its
    /// number reused, they would reach another file (the kernel, seeing the
    /// id come back with a new generation, marks its inode bad: EIO,
    /// ESTALE, a missed ETXTBSY). Unlinked while held, it waits on the
    /// orphan list like an open file. Pair with [`Fs::drop_hold`] or
    /// [`Fs::drop_holds`].
    ///
    /// A hold is a count by inode number (`vfs::holds`), not a reference:
    /// a held inode that is clean, linked and not open may leave the inode
    /// cache, and its hold stays exact.
    ///
    /// ENOENT when the inode was freed meanwhile (a lookup that found the
    /// name just before an unlink freed it): the first hold is taken under
    /// the inode's lock, where `drop_link` decides between freeing and the
    /// orphan list, so either the unlink sees the hold or the hold sees the
    /// inode dead. Further holds on a held number take no inode lock (a
    /// held number cannot be freed; see `vfs::holds`).
    pub fn hold_inode(&self, inode: &CachedInode) -> Result<()> {
        // `unlinked` is set on every dead in-memory inode (`drop_link`
        // sets it before freeing): such a copy goes the slow way and is
        // refused there, even if its number has a new, held owner.
        if !inode.unlinked.load(Ordering::Acquire) && self.holds.add_if_held(inode.ino) {
            return Ok(());
        }
        let rec = inode.disk.read();
        if rec.base.mode == 0 {
            return Err(Error::posix(Errno::ENOENT, format!("inode {} was freed", inode.ino)));
        }
        self.holds.add(inode.ino);
        Ok(())
    }

    /// Undo one [`Fs::hold_inode`]; the last hold or close of an inode that
    /// has no name left frees it.
    pub fn drop_hold(&self, inode: &CachedInode) -> Result<()> {
        self.drop_holds(inode.ino, 1)
    }

    /// Undo `n` [`Fs::hold_inode`]s of inode number `ino` (FUSE's
    /// `FORGET(ino, n)`; more than it has drops them all). The last hold
    /// of an inode that has no name left and is not open frees it.
    pub fn drop_holds(&self, ino: u32, n: u64) -> Result<()> {
        if !self.holds.sub(ino, n) {
            return Ok(());
        }
        self.after_last_hold(ino)
    }

    /// Drop every hold (a frontend's session ended: the kernel sends no
    /// FORGET for what it still had), freeing the unlinked inodes they
    /// kept. Tries them all and reports the first failure.
    pub fn drop_all_holds(&self) -> Result<()> {
        let mut first = None;
        for ino in self.holds.drain() {
            if let Err(e) = self.after_last_hold(ino) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The frontend holds of inode numbers (read-only view: counts, size).
    pub fn holds(&self) -> &Arc<super::holds::Holds> {
        &self.holds
    }

    /// The last hold of `ino` went: free it if it is an unlinked inode
    /// nothing else uses. The flag is read after the hold count's mutex
    /// section, so a `drop_link` that saw the hold (and orphaned the
    /// inode) is seen here (`vfs::holds`, n → 0). An unlinked inode is
    /// never evicted (`Icache::evict`), so not cached means linked (or
    /// freed already): nothing to do, and nothing read from disk.
    fn after_last_hold(&self, ino: u32) -> Result<()> {
        match self.icache.cached(ino) {
            Some(inode) if inode.unlinked.load(Ordering::SeqCst) => self.release_unlinked(&inode),
            _ => Ok(()),
        }
    }

    /// Finish what the orphan list says was left half done, as the kernel
    /// does at mount (`ext4_orphan_cleanup`) and e2fsck does
    /// (`release_orphan_inodes`): an orphan with no links left (unlinked
    /// while open) is freed; one that still has links was being truncated
    /// and loses its blocks past `i_size`. Both the classic chain
    /// (`s_last_orphan`) and the orphan file (`orphan_file`) are read; both
    /// are empty afterwards. Returns how many inodes were freed.
    pub fn recover_orphans(&self) -> Result<usize> {
        if self.vol.read_only() {
            return Ok(0);
        }
        let chain = orphan::chain(&self.vol)?;
        let slots = orphan::file_slots(&self.vol)?;
        let present = self.vol.sb().read().feature_ro_compat & ro_compat::ORPHAN_PRESENT != 0;
        if chain.is_empty() && slots.is_empty() && !present {
            return Ok(0);
        }
        let t = now();
        let mut h = self.vol.begin()?;
        let mut freed = 0;
        let mut seen = std::collections::HashSet::new();
        for ino in chain.iter().copied().chain(slots.iter().map(|s| s.ino)) {
            if !seen.insert(ino) {
                continue;
            }
            let mut rec = inode::read(&self.vol, ino)?;
            rec.base.dtime = 0;
            if rec.base.links_count == 0 {
                self.destroy(&mut h, ino, &mut rec, t)?;
                freed += 1;
            } else {
                // A truncate that did not finish: free what lies past the
                // size (ext4_truncate).
                let keep = rec.size().div_ceil(self.vol.block_size() as u64);
                if matches!(
                    rec.file_type(),
                    Some(FileType::Regular | FileType::Directory | FileType::Symlink)
                ) && matches!(
                    bmap::load(&self.vol, ino, &rec)?,
                    BlockMap::Extents(_) | BlockMap::Indirect(_)
                ) {
                    bmap_write::punch(&self.vol, &mut h, ino, &mut rec, keep..u64::MAX)?;
                }
                inode::write(&self.vol, &mut h, ino, &rec)?;
            }
        }
        if !slots.is_empty() {
            orphan::clear_file_slots(&self.vol, &mut h, &slots)?;
        }
        h.commit()?;
        {
            let mut sb = self.vol.sb().write();
            sb.last_orphan = 0;
            sb.feature_ro_compat &= !ro_compat::ORPHAN_PRESENT;
        }
        self.vol.sync_super()?;
        Ok(freed)
    }

    // ---- path wrappers ----

    /// `mkdir(2)`.
    pub fn mkdir(&self, path: &[u8], perm: u16, cred: &Cred) -> Result<Stat> {
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

    /// `renameat2(2)`.
    pub fn rename(&self, old_path: &[u8], new_path: &[u8], flags: RenameFlags, cred: &Cred) -> Result<()> {
        let (op, on) = split(old_path)?;
        let (np, nn) = split(new_path)?;
        let a = self.resolve(op, true)?;
        let b = self.resolve(np, true)?;
        self.rename_at(a.ino, on, b.ino, nn, flags, cred)
            .map_err(|e| with_path(e, old_path))
    }
}

fn t_ino(d: &Option<Arc<CachedInode>>) -> u32 {
    d.as_ref().map_or(0, |d| d.ino)
}

/// What became of an inode whose link count dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Death {
    /// Still has names.
    Alive,
    /// No names, still open: on the orphan list.
    Orphaned,
    /// Freed.
    Freed,
}
