//! The write side of the `Fs` API (growing: see the write-engine issue).
//!
//! Every operation follows the same shape: resolve the parent, take the
//! parent directory's inode lock (the `i_rwsem` analogue, writer side),
//! check the name on disk, open a transaction handle, allocate and write
//! the new inode, link it into the directory, update the parent's times,
//! commit, and only then publish the new name in the dentry cache.

use std::sync::Arc;

use ext4kit_format::dirent::NAME_MAX;
use ext4kit_format::inode::{FileType, TimeField};

use ext4kit_format::inode::Inode;

use super::acl_inherit::CreateMode;
use super::cred::{Cred, MAY_EXEC, MAY_WRITE};
use super::icache::CachedInode;
use super::namei::{show, with_path};
use super::{Fs, Stat};
use crate::error::{Errno, Error, Result};
use crate::ext4::bmap_write::{self, MapRequest};
use crate::ext4::dir_insert::{self, NewEntry};
use crate::ext4::htree::CreateLookup;
use crate::ext4::ialloc::{self, NewInode};
use crate::ext4::transaction::Handle;
use crate::ext4::xattr_write;
use crate::ext4::{alloc_map, balloc, bmap, dir, inode, orphan, DirRef};

/// Split "/a/b/c" into ("/a/b", "c"); trailing slashes ignored.
fn split_parent(path: &[u8]) -> Result<(&[u8], &[u8])> {
    let p = {
        let mut e = path.len();
        while e > 1 && path[e - 1] == b'/' {
            e -= 1;
        }
        &path[..e]
    };
    let cut = p.iter().rposition(|&b| b == b'/');
    let (parent, name) = match cut {
        Some(i) => (if i == 0 { &b"/"[..] } else { &p[..i] }, &p[i + 1..]),
        None => (&b"/"[..], p),
    };
    if name.is_empty() || name == b"." || name == b".." {
        return Err(Error::posix(Errno::EEXIST, format!("{}: exists", show(path))));
    }
    if name.len() > NAME_MAX {
        return Err(Error::posix(
            Errno::ENAMETOOLONG,
            format!("{}: name too long", show(path)),
        ));
    }
    Ok((parent, name))
}

impl Fs {
    /// Create an empty regular file (`open(O_CREAT|O_EXCL)` without the open).
    pub fn create(&self, path: &[u8], perm: u16, uid: u32, gid: u32) -> Result<Stat> {
        self.mknod(path, FileType::Regular, perm, uid, gid, (0, 0))
    }

    /// Create a file, fifo, socket or device node owned by `uid`:`gid`
    /// (image building: no permission check).
    pub fn mknod(&self, path: &[u8], ftype: FileType, perm: u16, uid: u32, gid: u32, rdev: (u32, u32)) -> Result<Stat> {
        let (parent_path, name) = split_parent(path)?;
        let parent = self.resolve(parent_path, true)?;
        self.mknod_owned(parent.ino, name, ftype, perm, rdev, &Cred::root(), Some((uid, gid)))
            .map_err(|e| with_path(e, path))
    }

    /// Create a symbolic link at `path` pointing to `target`.
    pub fn symlink(&self, target: &[u8], path: &[u8], uid: u32, gid: u32) -> Result<Stat> {
        let (parent_path, name) = split_parent(path)?;
        let parent = self.resolve(parent_path, true)?;
        self.symlink_owned(parent.ino, name, target, &Cred::root(), Some((uid, gid)))
            .map_err(|e| with_path(e, path))
    }

    /// Create a file, fifo, socket or device node `name` in directory
    /// `parent`, owned by the caller (or the directory's group when it is
    /// set-group-id).
    ///
    /// `perm` is the requested mode; with a umask ([`CreateMode`]) it is
    /// applied unless the parent's default ACL is inherited instead
    /// (`vfs::acl_inherit`). A directory with the dirsync flag (or a
    /// `sync`/`dirsync` filesystem) has the change durable at the return.
    pub fn mknod_at(
        &self,
        parent: u32,
        name: &[u8],
        ftype: FileType,
        perm: impl Into<CreateMode>,
        rdev: (u32, u32),
        cred: &Cred,
    ) -> Result<Stat> {
        self.mknod_owned(parent, name, ftype, perm, rdev, cred, None)
    }

    /// [`Fs::mknod_at`] with an explicit owner: image building copies
    /// owners from a source tree while acting with `cred`'s rights.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod_owned(
        &self,
        parent: u32,
        name: &[u8],
        ftype: FileType,
        perm: impl Into<CreateMode>,
        rdev: (u32, u32),
        cred: &Cred,
        owner: Option<(u32, u32)>,
    ) -> Result<Stat> {
        let mode = perm.into();
        self.retry_enospc(|| self.mknod_owned_once(parent, name, ftype, mode, rdev, cred, owner))
    }

    /// One attempt of [`Self::mknod_owned`].
    #[allow(clippy::too_many_arguments)]
    fn mknod_owned_once(
        &self,
        parent: u32,
        name: &[u8],
        ftype: FileType,
        perm: CreateMode,
        rdev: (u32, u32),
        cred: &Cred,
        owner: Option<(u32, u32)>,
    ) -> Result<Stat> {
        if matches!(ftype, FileType::Directory | FileType::Symlink) {
            return Err(Error::posix(
                Errno::EINVAL,
                format!("{}: mknod cannot make a {ftype:?}", show(name)),
            ));
        }
        self.create_at(parent, name, ftype, perm, cred, owner, |_, _, _, rec| {
            if matches!(ftype, FileType::CharDevice | FileType::BlockDevice) {
                let (ma, mi) = rdev;
                if ma < 256 && mi < 256 {
                    rec.base.block[0..4].copy_from_slice(&((ma << 8) | mi).to_le_bytes());
                } else {
                    let enc = (mi & 0xff) | (ma << 8) | ((mi & !0xff) << 12);
                    rec.base.block[4..8].copy_from_slice(&enc.to_le_bytes());
                }
            }
            Ok(())
        })
    }

    /// Create symbolic link `name` in directory `parent` pointing to
    /// `target`: a fast symlink (target in `i_block`) under 60 bytes, else
    /// one data block, as the kernel does.
    pub fn symlink_at(&self, parent: u32, name: &[u8], target: &[u8], cred: &Cred) -> Result<Stat> {
        self.symlink_owned(parent, name, target, cred, None)
    }

    /// [`Fs::symlink_at`] with an explicit owner (image building).
    pub fn symlink_owned(
        &self,
        parent: u32,
        name: &[u8],
        target: &[u8],
        cred: &Cred,
        owner: Option<(u32, u32)>,
    ) -> Result<Stat> {
        self.retry_enospc(|| self.symlink_owned_once(parent, name, target, cred, owner))
    }

    /// One attempt of [`Self::symlink_owned`].
    fn symlink_owned_once(
        &self,
        parent: u32,
        name: &[u8],
        target: &[u8],
        cred: &Cred,
        owner: Option<(u32, u32)>,
    ) -> Result<Stat> {
        let bs = self.vol.block_size();
        if target.is_empty() || target.len() >= bs.min(4096) {
            return Err(Error::posix(
                Errno::ENAMETOOLONG,
                format!("{}: symlink target must be 1 to {} bytes", show(name), bs.min(4096) - 1),
            ));
        }
        self.create_at(
            parent,
            name,
            FileType::Symlink,
            0o777.into(),
            cred,
            owner,
            |vol, h, ino, rec| {
                if target.len() < 60 {
                    // A fast symlink: the target lives in i_block, no extent header.
                    rec.base.flags &= !ext4kit_format::inode::flags::EXTENTS;
                    rec.base.block = [0; 60];
                    rec.base.block[..target.len()].copy_from_slice(target);
                    rec.base.set_size(target.len() as u64);
                    return Ok(());
                }
                // Map while the size is still 0: a symlink with a size and
                // no blocks counts as fast, which has no block map to extend.
                let runs = bmap_write::map_blocks(
                    vol,
                    h,
                    ino,
                    rec,
                    MapRequest {
                        lblk: 0,
                        len: 1,
                        uninit: false,
                    },
                )?;
                rec.base.set_size(target.len() as u64);
                let run = runs
                    .first()
                    .ok_or_else(|| Error::posix(Errno::EIO, "no block mapped for a symlink"))?;
                let mut b = vec![0u8; bs];
                b[..target.len()].copy_from_slice(target);
                // Data before the metadata that points at it (ordered mode).
                vol.disk().write_raw(run.pblk, &b)
            },
        )
    }

    /// The creation path every inode kind shares: under the parent's
    /// inode lock (i_rwsem, writer side) check the name, allocate and
    /// initialise the inode (`init` may map blocks through the handle),
    /// link it in (growing the directory if needed), update the parent's
    /// times, commit, then publish the name in the dentry cache. A failure
    /// after the inode was allocated gives it back (logical undo).
    ///
    /// The new inode inherits its parent's default ACL in the same
    /// transaction (`ext4_init_acl`, `vfs::acl_inherit`).
    #[allow(clippy::too_many_arguments)]
    fn create_at(
        &self,
        parent: u32,
        name: &[u8],
        ftype: FileType,
        mode: CreateMode,
        cred: &Cred,
        owner: Option<(u32, u32)>,
        init: impl FnOnce(&crate::ext4::Volume, &mut Handle<'_>, u32, &mut Inode) -> Result<()>,
    ) -> Result<Stat> {
        if name.is_empty() || name == b"." || name == b".." {
            return Err(Error::posix(Errno::EEXIST, format!("{}: exists", show(name))));
        }
        if name.len() > NAME_MAX {
            return Err(Error::posix(
                Errno::ENAMETOOLONG,
                format!("{}: name too long", show(name)),
            ));
        }
        if name.contains(&b'/') || name.contains(&0) {
            return Err(Error::posix(Errno::EINVAL, format!("{}: invalid name", show(name))));
        }
        let dir = self.inode(parent)?;
        if dir.ftype != FileType::Directory {
            return Err(Error::posix(Errno::ENOTDIR, format!("inode {parent}: not a directory")));
        }
        // i_rwsem, writer side: one namespace change in this directory at a time.
        let mut dir_rec = dir.disk.write();
        if dir_rec.base.links_count == 0 {
            return Err(Error::posix(
                Errno::ENOENT,
                format!("directory inode {parent} was removed"),
            ));
        }
        super::iflags::check_create_in(&dir_rec, name)?;
        if !cred.may(&dir_rec, MAY_WRITE | MAY_EXEC) {
            return Err(Error::posix(
                Errno::EACCES,
                format!("{}: no write and search permission on the directory", show(name)),
            ));
        }
        let map = dir.block_map_locked(&self.vol, &dir_rec)?;
        let dref = DirRef {
            ino: parent,
            inode: &dir_rec,
            map: &map,
        };
        // The lookup that proves the name absent also finds where it goes.
        let hint = match dir::lookup_for_create(&self.vol, dref, name)? {
            CreateLookup::Exists => return Err(Error::posix(Errno::EEXIST, format!("{}: file exists", show(name)))),
            CreateLookup::Absent(hint) => hint,
        };
        let (uid, gid) = match owner {
            Some(o) => o,
            None if dir_rec.base.mode & 0o2000 != 0 => (cred.uid, dir_rec.gid()),
            None => (cred.uid, cred.gid),
        };
        let acl = self.acl_for_new(parent, &dir_rec, ftype, mode)?;
        // Blocks (a growing directory, a symlink's) and the name come
        // after the inode: refuse now if allocation or the insertion would
        // meet damage (release_check.rs, dir_insert.rs).
        balloc::check_allocatable(&self.vol, self.vol.geo().group_first_block_of_inode(parent))?;
        dir_insert::check_insertable(&self.vol, dref)?;
        let t = self.now();
        let mut h = self.vol.begin()?;
        let ino = ialloc::new_inode(&self.vol, &mut h, parent, ftype)?;
        // A cached inode of this number is a dead predecessor whose freer
        // has not dropped it yet: the number is ours now.
        self.icache.forget(ino);
        let mut rec = ialloc::new_record(
            &self.vol,
            &NewInode {
                ftype,
                perm: acl.mode,
                uid,
                gid,
                now: t,
                parent: (dir_rec.base.flags, dir_rec.extra.projid),
            },
        );
        let mut new_dir = dir_rec.clone();
        let linked = init(&self.vol, &mut h, ino, &mut rec)
            .and_then(|()| self.store_inherited_acl(&mut h, ino, &mut rec, &acl))
            .and_then(|()| inode::write(&self.vol, &mut h, ino, &rec))
            .and_then(|()| {
                dir_insert::add_link(
                    &self.vol,
                    &mut h,
                    dref,
                    &mut new_dir,
                    NewEntry {
                        name,
                        ino,
                        ft: ftype,
                        hint,
                    },
                )
            });
        let grew = match linked {
            Ok(g) => g,
            Err(e) => {
                // Logical undo: blocks the init mapped, an xattr block the
                // ACLs took, and the inode go back.
                if matches!(
                    bmap::load(&self.vol, ino, &rec),
                    Ok(crate::ext4::BlockMap::Extents(_) | crate::ext4::BlockMap::Indirect(_))
                ) {
                    bmap_write::punch(&self.vol, &mut h, ino, &mut rec, 0..u64::MAX)?;
                }
                if rec.file_acl() != 0 {
                    xattr_write::drop_block(&self.vol, &mut h, ino, &mut rec)?;
                }
                rec.base.links_count = 0;
                rec.base.dtime = t.sec as u32;
                inode::write(&self.vol, &mut h, ino, &rec)?;
                ialloc::free_inode(&self.vol, &mut h, ino, &rec)?;
                h.commit()?;
                return Err(e);
            }
        };
        new_dir.set_time(TimeField::Mtime, t);
        new_dir.set_time(TimeField::Ctime, t);
        inode::write(&self.vol, &mut h, parent, &new_dir)?;
        h.commit()?;
        *dir_rec = new_dir;
        if grew {
            dir.size.store(dir_rec.size(), std::sync::atomic::Ordering::Release);
            dir.reset_block_map();
        }
        // The dentry changes under the directory's lock, as the kernel's
        // d_instantiate under i_rwsem: after it, a later unlink or create
        // of the same name could run first and ours would overwrite its
        // entry with a stale one (a dead inode, or a name that is gone).
        self.dcache.added(parent, name, ino, ftype);
        let flags = dir_rec.base.flags;
        drop(dir_rec);
        let inode = self.icache.insert_new(ino, rec)?;
        let st = Stat::from_inode(&self.vol, ino, &inode.disk.read());
        self.dirsync_after(&dir, flags)?;
        Ok(st)
    }

    /// `O_TMPFILE`'s inode (`ext4_tmpfile`): a regular file with permission
    /// bits `perm` owned as [`Fs::mknod_at`] would own it in directory
    /// `parent`, but with no name: its link count is 0 and it is on the
    /// orphan list from the transaction that allocates it, so a crash
    /// before its last close leaves an orphan that the next mount or
    /// e2fsck frees. The directory itself is not changed (no entry, no
    /// times), as in the kernel. The caller opens the returned inode at
    /// once and closes it with [`Fs::close_file`]; `linkable` (no
    /// `O_EXCL`) lets [`Fs::link_at`] give it a name later.
    ///
    /// It inherits the parent's default ACL as a created file does
    /// (`ext4_tmpfile` → `ext4_new_inode` → `ext4_init_acl`), and a
    /// directory with the dirsync flag has the change durable at the
    /// return (`ext4_tmpfile`'s `ext4_handle_sync`).
    pub(crate) fn tmpfile_inode(
        &self,
        parent: u32,
        mode: CreateMode,
        linkable: bool,
        cred: &Cred,
    ) -> Result<Arc<CachedInode>> {
        self.retry_enospc(|| self.tmpfile_inode_once(parent, mode, linkable, cred))
    }

    /// One attempt of [`Self::tmpfile_inode`].
    fn tmpfile_inode_once(
        &self,
        parent: u32,
        mode: CreateMode,
        linkable: bool,
        cred: &Cred,
    ) -> Result<Arc<CachedInode>> {
        if self.vol.read_only() {
            return Err(Error::posix(Errno::EROFS, "filesystem is read-only"));
        }
        let dir = self.inode(parent)?;
        if dir.ftype != FileType::Directory {
            return Err(Error::posix(Errno::ENOTDIR, format!("inode {parent}: not a directory")));
        }
        // The parent's lock as a creation takes it: its flags and owner
        // are read once, and a concurrent rmdir either comes first (ENOENT)
        // or after.
        let dir_rec = dir.disk.write();
        if dir_rec.base.links_count == 0 {
            return Err(Error::posix(
                Errno::ENOENT,
                format!("directory inode {parent} was removed"),
            ));
        }
        // vfs_tmpfile: inode_permission(dir, MAY_WRITE | MAY_EXEC), which
        // refuses an immutable directory (EPERM) before the mode bits.
        super::iflags::check_create_in(&dir_rec, b"(O_TMPFILE)")?;
        if !cred.may(&dir_rec, MAY_WRITE | MAY_EXEC) {
            return Err(Error::posix(
                Errno::EACCES,
                "O_TMPFILE: no write and search permission on the directory",
            ));
        }
        let gid = if dir_rec.base.mode & 0o2000 != 0 {
            dir_rec.gid()
        } else {
            cred.gid
        };
        let acl = self.acl_for_new(parent, &dir_rec, FileType::Regular, mode)?;
        let t = self.now();
        let mut h = self.vol.begin()?;
        let ino = ialloc::new_inode(&self.vol, &mut h, parent, FileType::Regular)?;
        // A cached inode of this number is a dead predecessor (see `create_at`).
        self.icache.forget(ino);
        let mut rec = ialloc::new_record(
            &self.vol,
            &NewInode {
                ftype: FileType::Regular,
                perm: acl.mode,
                uid: cred.uid,
                gid,
                now: t,
                parent: (dir_rec.base.flags, dir_rec.extra.projid),
            },
        );
        let dir_flags = dir_rec.base.flags;
        drop(dir_rec);
        if let Err(e) = self.store_inherited_acl(&mut h, ino, &mut rec, &acl) {
            // The creation fails whole (ext4_init_acl): the inode and an
            // xattr block the ACLs took go back.
            if rec.file_acl() != 0 {
                xattr_write::drop_block(&self.vol, &mut h, ino, &mut rec)?;
            }
            ialloc::free_inode(&self.vol, &mut h, ino, &rec)?;
            h.commit()?;
            return Err(e);
        }
        // d_tmpfile drops the link new_inode gave, ext4_tmpfile puts the
        // inode on the orphan list; one transaction with the allocation.
        rec.base.links_count = 0;
        // (It fails only when the journal refuses the superblock, which
        // aborts the journal: as for an unlink's orphan, `drop_link`.)
        orphan::add(&self.vol, &mut h, ino, &mut rec)?;
        h.commit()?;
        // Without a journal the orphan chain's head is in the superblock
        // only (as after an unlink of an open file, `remove_at`).
        self.vol.sync_super()?;
        let inode = self.icache.insert_new(ino, rec)?;
        // No name: its last close frees it (`after_close`), unless a link
        // gives it one first.
        inode.unlinked.store(true, std::sync::atomic::Ordering::SeqCst);
        inode.linkable.store(linkable, std::sync::atomic::Ordering::SeqCst);
        self.dirsync_after(&dir, dir_flags)?;
        Ok(inode)
    }

    /// Create a regular file at `path` holding `data` (an interim entry
    /// point for image building until `pwrite` through the page cache
    /// lands; it uses the same allocation and mapping code writeback will).
    pub fn write_file(&self, path: &[u8], data: &[u8], perm: u16, uid: u32, gid: u32) -> Result<Stat> {
        let st = self.create(path, perm, uid, gid)?;
        let inode = self.inode(st.ino)?;
        self.retry_enospc(|| {
            let mut rec = inode.disk.write();
            let mut new = rec.clone();
            let mut h = self.vol.begin()?;
            alloc_map::store(&self.vol, &mut h, st.ino, &mut new, data)?;
            inode::write(&self.vol, &mut h, st.ino, &new)?;
            h.commit()?;
            inode.size.store(new.size(), std::sync::atomic::Ordering::Release);
            inode.reset_block_map();
            *rec = new;
            Ok(())
        })?;
        self.stat_ino(st.ino)
    }

    /// sync(2): write back every dirty page and inode, write the
    /// superblock's summary counters, and make it all durable *and home*:
    /// with a journal, the running transaction is committed, everything is
    /// checkpointed and the log emptied, so that the image file is complete
    /// on its own (no replay needed) — what a program building an image
    /// expects of `sync` — which is more than the kernel's `ext4_sync_fs`
    /// (a commit); fsync and fdatasync commit only. Without a journal, a
    /// checkpoint of every dirty metadata block. Then the device is
    /// flushed.
    ///
    /// A file whose data cannot be written back (an I/O error on the image)
    /// does not stop the rest: everything else is still committed and
    /// written home, and the first failure is returned at the end — one
    /// file's failure never costs another file's metadata.
    pub fn sync(&self) -> Result<()> {
        let wb = self.writeback_all();
        let recover = self.vol.jbd().needs_recovery_on_disk();
        if !self.vol.metadata_changed().load(std::sync::atomic::Ordering::Relaxed) && !recover {
            // Nothing changed since the open (every operation refused, or
            // only data overwritten in place): no superblock or journal
            // write, so a refused command leaves the image byte-identical.
            if !self.vol.read_only() {
                self.vol
                    .disk()
                    .device()
                    .flush()
                    .map_err(|e| Error::io("flushing the device", e))?;
            }
            return wb;
        }
        let rest = (|| {
            self.vol.sync_super()?;
            if self.vol.jbd().is_journaled() {
                self.vol.close_journal(false)?;
            } else {
                self.vol.checkpoint()?;
            }
            if !self.vol.read_only() {
                self.vol
                    .disk()
                    .device()
                    .flush()
                    .map_err(|e| Error::io("flushing the device", e))?;
            }
            Ok(())
        })();
        wb.and(rest)
    }
}
