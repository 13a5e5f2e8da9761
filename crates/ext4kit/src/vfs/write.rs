//! Making inodes: one [`NewInode`] request for every kind (`creat`,
//! `mknod`, `symlink`; directories through `namespace::mkdir_once`),
//! `O_TMPFILE`'s nameless inode, and `sync(2)`.
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

use super::acl_inherit;
use super::cred::{Cred, MAY_EXEC, MAY_WRITE};
use super::icache::CachedInode;
use super::namei::show;
use super::request::{CreateMode, NewInode, NodeKind};
use super::stat;
use super::super_block::SuperBlock;
use super::syncmode;
use super::writeback;
use super::Stat;
use super::{lookup, namespace};
use crate::error::{Errno, Error, Result};
use crate::ext4::bmap_write::{self, MapRequest};
use crate::ext4::dir_insert::{self, NewEntry};
use crate::ext4::htree::CreateLookup;
use crate::ext4::ialloc;
use crate::ext4::transaction::Handle;
use crate::ext4::xattr_write;
use crate::ext4::{alloc_map, balloc, bmap, dir, inode, orphan, DirRef};

/// The work of [`Fs::create`](crate::Fs::create): a new inode of any
/// kind and its name, in one transaction.
pub(crate) fn create(sb: &SuperBlock, req: &NewInode<'_>) -> Result<Stat> {
    lookup::on_entry(sb, req.at, |parent, name| {
        sb.retry_enospc(|| match req.kind {
            NodeKind::Dir => namespace::mkdir_once(sb, parent, name, req),
            NodeKind::Symlink(target) => symlink_once(sb, parent, name, target, req),
            _ => mknod_once(sb, parent, name, req),
        })
    })
}

/// One attempt of [`create`] for a regular file, a fifo, a socket or a
/// device node: a device's number goes in `i_block` as the kernel puts it
/// (`ext4_init_special_inode`: the old 8-bit encoding when both halves
/// fit, the new one in the second word otherwise).
fn mknod_once(sb: &SuperBlock, parent: u32, name: &[u8], req: &NewInode<'_>) -> Result<Stat> {
    let rdev = match req.kind {
        NodeKind::CharDevice(ma, mi) | NodeKind::BlockDevice(ma, mi) => Some((ma, mi)),
        _ => None,
    };
    create_at(sb, parent, name, req, |_, _, _, rec| {
        if let Some((ma, mi)) = rdev {
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

/// One attempt of [`create`] for a symbolic link to `target`: a fast
/// symlink (target in `i_block`) under 60 bytes, else one data block, as
/// the kernel does; its mode is always 0777.
fn symlink_once(sb: &SuperBlock, parent: u32, name: &[u8], target: &[u8], req: &NewInode<'_>) -> Result<Stat> {
    let bs = sb.vol().block_size();
    if target.is_empty() || target.len() >= bs.min(4096) {
        return Err(Error::posix(
            Errno::ENAMETOOLONG,
            format!("{}: symlink target must be 1 to {} bytes", show(name), bs.min(4096) - 1),
        ));
    }
    create_at(sb, parent, name, req, |vol, h, ino, rec| {
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
    })
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
fn create_at(
    sb: &SuperBlock,
    parent: u32,
    name: &[u8],
    req: &NewInode<'_>,
    init: impl FnOnce(&crate::ext4::Volume, &mut Handle<'_>, u32, &mut Inode) -> Result<()>,
) -> Result<Stat> {
    let (ftype, mode, cred) = (req.kind.file_type(), req.create_mode(), req.cred);
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
    let dir = sb.inode(parent)?;
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
    let map = dir.block_map_locked(sb.vol(), &dir_rec)?;
    let dref = DirRef {
        ino: parent,
        inode: &dir_rec,
        map: &map,
    };
    // The lookup that proves the name absent also finds where it goes.
    let hint = match dir::lookup_for_create(sb.vol(), dref, name)? {
        CreateLookup::Exists => return Err(Error::posix(Errno::EEXIST, format!("{}: file exists", show(name)))),
        CreateLookup::Absent(hint) => hint,
    };
    let (uid, gid) = match req.owner {
        Some(o) => o,
        None if dir_rec.base.mode & 0o2000 != 0 => (cred.uid, dir_rec.gid()),
        None => (cred.uid, cred.gid),
    };
    let acl = acl_inherit::acl_for_new(sb, parent, &dir_rec, ftype, mode)?;
    // Blocks (a growing directory, a symlink's) and the name come
    // after the inode: refuse now if allocation or the insertion would
    // meet damage (release_check.rs, dir_insert.rs).
    balloc::check_allocatable(sb.vol(), sb.vol().geo().group_first_block_of_inode(parent))?;
    dir_insert::check_insertable(sb.vol(), dref)?;
    let t = sb.now();
    let mut h = sb.vol().begin()?;
    let ino = ialloc::new_inode(sb.vol(), &mut h, parent, ftype)?;
    // A cached inode of this number is a dead predecessor whose freer
    // has not dropped it yet: the number is ours now.
    sb.icache().forget(ino);
    let mut rec = ialloc::new_record(
        sb.vol(),
        &ialloc::NewInode {
            ftype,
            perm: acl.mode,
            uid,
            gid,
            now: t,
            parent: (dir_rec.base.flags, dir_rec.extra.projid),
        },
    );
    let mut new_dir = dir_rec.clone();
    let linked = init(sb.vol(), &mut h, ino, &mut rec)
        .and_then(|()| acl_inherit::store_inherited_acl(sb, &mut h, ino, &mut rec, &acl))
        .and_then(|()| inode::write(sb.vol(), &mut h, ino, &rec))
        .and_then(|()| {
            dir_insert::add_link(
                sb.vol(),
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
                bmap::load(sb.vol(), ino, &rec),
                Ok(crate::ext4::BlockMap::Extents(_) | crate::ext4::BlockMap::Indirect(_))
            ) {
                bmap_write::punch(sb.vol(), &mut h, ino, &mut rec, 0..u64::MAX)?;
            }
            if rec.file_acl() != 0 {
                xattr_write::drop_block(sb.vol(), &mut h, ino, &mut rec)?;
            }
            rec.base.links_count = 0;
            rec.base.dtime = t.sec as u32;
            inode::write(sb.vol(), &mut h, ino, &rec)?;
            ialloc::free_inode(sb.vol(), &mut h, ino, &rec)?;
            h.commit()?;
            return Err(e);
        }
    };
    new_dir.set_time(TimeField::Mtime, t);
    new_dir.set_time(TimeField::Ctime, t);
    inode::write(sb.vol(), &mut h, parent, &new_dir)?;
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
    sb.dcache().added(parent, name, ino, ftype);
    let flags = dir_rec.base.flags;
    drop(dir_rec);
    let inode = sb.icache().insert_new(ino, rec)?;
    let st = Stat::from_inode(sb.vol(), ino, &inode.disk.read());
    syncmode::dirsync_after(sb, &dir, flags)?;
    Ok(st)
}

/// `O_TMPFILE`'s inode (`ext4_tmpfile`): a regular file with permission
/// bits `perm` owned as a created file would be in directory
/// `parent`, but with no name: its link count is 0 and it is on the
/// orphan list from the transaction that allocates it, so a crash
/// before its last close leaves an orphan that the next mount or
/// e2fsck frees. The directory itself is not changed (no entry, no
/// times), as in the kernel. The caller opens the returned inode at
/// once and closes it with [`Fs::close_file`]; `linkable` (no
/// `O_EXCL`) lets a link give it a name later.
///
/// It inherits the parent's default ACL as a created file does
/// (`ext4_tmpfile` → `ext4_new_inode` → `ext4_init_acl`), and a
/// directory with the dirsync flag has the change durable at the
/// return (`ext4_tmpfile`'s `ext4_handle_sync`).
pub(crate) fn tmpfile_inode(
    sb: &SuperBlock,
    parent: u32,
    mode: CreateMode,
    linkable: bool,
    cred: &Cred,
) -> Result<Arc<CachedInode>> {
    sb.retry_enospc(|| tmpfile_inode_once(sb, parent, mode, linkable, cred))
}

/// One attempt of [`tmpfile_inode`].
fn tmpfile_inode_once(
    sb: &SuperBlock,
    parent: u32,
    mode: CreateMode,
    linkable: bool,
    cred: &Cred,
) -> Result<Arc<CachedInode>> {
    if sb.vol().read_only() {
        return Err(Error::posix(Errno::EROFS, "filesystem is read-only"));
    }
    let dir = sb.inode(parent)?;
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
    let acl = acl_inherit::acl_for_new(sb, parent, &dir_rec, FileType::Regular, mode)?;
    let t = sb.now();
    let mut h = sb.vol().begin()?;
    let ino = ialloc::new_inode(sb.vol(), &mut h, parent, FileType::Regular)?;
    // A cached inode of this number is a dead predecessor (see `create_at`).
    sb.icache().forget(ino);
    let mut rec = ialloc::new_record(
        sb.vol(),
        &ialloc::NewInode {
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
    if let Err(e) = acl_inherit::store_inherited_acl(sb, &mut h, ino, &mut rec, &acl) {
        // The creation fails whole (ext4_init_acl): the inode and an
        // xattr block the ACLs took go back.
        if rec.file_acl() != 0 {
            xattr_write::drop_block(sb.vol(), &mut h, ino, &mut rec)?;
        }
        ialloc::free_inode(sb.vol(), &mut h, ino, &rec)?;
        h.commit()?;
        return Err(e);
    }
    // d_tmpfile drops the link new_inode gave, ext4_tmpfile puts the
    // inode on the orphan list; one transaction with the allocation.
    rec.base.links_count = 0;
    // (It fails only when the journal refuses the superblock, which
    // aborts the journal: as for an unlink's orphan, `drop_link`.)
    orphan::add(sb.vol(), &mut h, ino, &mut rec)?;
    h.commit()?;
    // Without a journal the orphan chain's head is in the superblock
    // only (as after an unlink of an open file, `remove_at`).
    sb.vol().sync_super()?;
    let inode = sb.icache().insert_new(ino, rec)?;
    // No name: its last close frees it (`after_close`), unless a link
    // gives it one first.
    inode.unlinked.store(true, std::sync::atomic::Ordering::SeqCst);
    inode.linkable.store(linkable, std::sync::atomic::Ordering::SeqCst);
    syncmode::dirsync_after(sb, &dir, dir_flags)?;
    Ok(inode)
}

/// The work of [`Fs::write_file`](crate::Fs::write_file).
pub(crate) fn write_file(sb: &SuperBlock, req: &NewInode<'_>, data: &[u8]) -> Result<Stat> {
    if req.kind != NodeKind::File {
        return Err(Error::posix(Errno::EINVAL, "write_file makes regular files only"));
    }
    let st = create(sb, req)?;
    let inode = sb.inode(st.ino)?;
    sb.retry_enospc(|| {
        let mut rec = inode.disk.write();
        let mut new = rec.clone();
        let mut h = sb.vol().begin()?;
        alloc_map::store(sb.vol(), &mut h, st.ino, &mut new, data)?;
        inode::write(sb.vol(), &mut h, st.ino, &new)?;
        h.commit()?;
        inode.size.store(new.size(), std::sync::atomic::Ordering::Release);
        inode.reset_block_map();
        *rec = new;
        Ok(())
    })?;
    stat::stat_ino(sb, st.ino)
}

/// The work of [`Fs::sync`](crate::Fs::sync).
pub(crate) fn sync(sb: &SuperBlock) -> Result<()> {
    let wb = writeback::writeback_all(sb);
    let recover = sb.vol().jbd().needs_recovery_on_disk();
    if !sb.vol().metadata_changed().load(std::sync::atomic::Ordering::Relaxed) && !recover {
        // Nothing changed since the open (every operation refused, or
        // only data overwritten in place): no superblock or journal
        // write, so a refused command leaves the image byte-identical.
        if !sb.vol().read_only() {
            sb.vol()
                .disk()
                .device()
                .flush()
                .map_err(|e| Error::io("flushing the device", e))?;
        }
        return wb;
    }
    let rest = (|| {
        sb.vol().sync_super()?;
        if sb.vol().jbd().is_journaled() {
            sb.vol().close_journal(false)?;
        } else {
            sb.vol().checkpoint()?;
        }
        if !sb.vol().read_only() {
            sb.vol()
                .disk()
                .device()
                .flush()
                .map_err(|e| Error::io("flushing the device", e))?;
        }
        Ok(())
    })();
    wb.and(rest)
}
