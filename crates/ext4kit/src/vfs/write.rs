//! The write side of the `Fs` API (growing: see the write-engine issue).
//!
//! Every operation follows the same shape: resolve the parent, take the
//! parent directory's inode lock (the `i_rwsem` analogue, writer side),
//! check the name on disk, open a transaction handle, allocate and write
//! the new inode, link it into the directory, update the parent's times,
//! commit, and only then publish the new name in the dentry cache.

use std::time::{SystemTime, UNIX_EPOCH};

use ext4kit_format::dirent::NAME_MAX;
use ext4kit_format::inode::{FileType, TimeField, Timestamp};

use super::namei::show;
use super::{Fs, Stat};
use crate::error::{Errno, Error, Result};
use crate::ext4::ialloc::NewInode;
use crate::ext4::DirRef;

/// The current time as an ext4 timestamp (honours `SOURCE_DATE_EPOCH` for
/// reproducible images).
pub fn now() -> Timestamp {
    if let Some(s) = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
    {
        return Timestamp { sec: s, nsec: 0 };
    }
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

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

    /// Create a file, fifo, socket or device node.
    pub fn mknod(&self, path: &[u8], ftype: FileType, perm: u16, uid: u32, gid: u32, rdev: (u32, u32)) -> Result<Stat> {
        if matches!(ftype, FileType::Directory | FileType::Symlink) {
            return Err(Error::posix(
                Errno::EINVAL,
                format!("{}: mknod cannot make a {ftype:?}", show(path)),
            ));
        }
        self.create_inode(path, ftype, perm, uid, gid, |rec| {
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

    /// Create a symbolic link at `path` pointing to `target`.
    pub fn symlink(&self, target: &[u8], path: &[u8], uid: u32, gid: u32) -> Result<Stat> {
        if target.is_empty() || target.len() >= ext4kit_format::dirent::NAME_MAX * 16 {
            return Err(Error::posix(
                Errno::ENAMETOOLONG,
                format!("{}: bad symlink target length", show(path)),
            ));
        }
        if target.len() >= 60 {
            return Err(Error::posix(
                Errno::ENOSPC,
                format!(
                    "{}: symlink targets of 60 bytes or more need a data block (not supported yet)",
                    show(path)
                ),
            ));
        }
        self.create_inode(path, FileType::Symlink, 0o777, uid, gid, |rec| {
            // A fast symlink: the target lives in i_block, no extent header.
            rec.base.flags &= !ext4kit_format::inode::flags::EXTENTS;
            rec.base.block = [0; 60];
            rec.base.block[..target.len()].copy_from_slice(target);
            rec.base.size_lo = target.len() as u32;
            Ok(())
        })
    }

    fn create_inode(
        &self,
        path: &[u8],
        ftype: FileType,
        perm: u16,
        uid: u32,
        gid: u32,
        init: impl FnOnce(&mut ext4kit_format::inode::Inode) -> Result<()>,
    ) -> Result<Stat> {
        let (parent_path, name) = split_parent(path)?;
        let parent = self.resolve(parent_path, true)?;
        let dir = self.inode(parent.ino)?;
        if dir.ftype != FileType::Directory {
            return Err(Error::posix(
                Errno::ENOTDIR,
                format!("{}: not a directory", show(parent_path)),
            ));
        }
        let map = dir.block_map(&self.vol)?;
        // i_rwsem, writer side: one namespace change in this directory at a time.
        let mut dir_rec = dir.disk.write();
        let dref = DirRef {
            ino: dir.ino,
            inode: &dir_rec,
            map: &map,
        };
        if self.vol.lookup(dref, name)?.is_some() {
            return Err(Error::posix(Errno::EEXIST, format!("{}: file exists", show(path))));
        }
        let t = now();
        let mut h = self.vol.begin()?;
        let ino = self.vol.alloc_inode(&mut h, dir.ino, false)?;
        let mut rec = self.vol.new_inode_record(&NewInode {
            ftype,
            perm,
            uid,
            gid,
            now: t,
        });
        init(&mut rec)?;
        self.vol.write_inode(&mut h, ino, &rec)?;
        let mut new_dir = dir_rec.clone();
        let map_changed = self.vol.add_link(&mut h, dref, &mut new_dir, name, ino, ftype)?;
        new_dir.set_time(TimeField::Mtime, t);
        new_dir.set_time(TimeField::Ctime, t);
        self.vol.write_inode(&mut h, dir.ino, &new_dir)?;
        h.commit()?;
        dir.size.store(new_dir.size(), std::sync::atomic::Ordering::Release);
        *dir_rec = new_dir;
        if map_changed {
            dir.reset_block_map();
        }
        drop(dir_rec);
        self.dcache.set(&parent, name, ino, Some(ftype));
        self.stat_ino(ino)
    }

    /// Create a regular file at `path` holding `data` (an interim entry
    /// point for image building until `pwrite` through the page cache
    /// lands; it uses the same allocation and mapping code writeback will).
    pub fn write_file(&self, path: &[u8], data: &[u8], perm: u16, uid: u32, gid: u32) -> Result<Stat> {
        let st = self.create(path, perm, uid, gid)?;
        let inode = self.inode(st.ino)?;
        let mut rec = inode.disk.write();
        let mut new = rec.clone();
        let mut h = self.vol.begin()?;
        self.vol.write_new_data(&mut h, st.ino, &mut new, data)?;
        self.vol.write_inode(&mut h, st.ino, &new)?;
        h.commit()?;
        inode.size.store(new.size(), std::sync::atomic::Ordering::Release);
        inode.reset_block_map();
        *rec = new;
        drop(rec);
        self.stat_ino(st.ino)
    }

    /// Write the superblock's summary counters and flush the device.
    pub fn sync(&self) -> Result<()> {
        self.vol.sync_super()?;
        if !self.vol.read_only {
            self.vol
                .device()
                .flush()
                .map_err(|e| Error::io("flushing the device", e))?;
        }
        Ok(())
    }
}
