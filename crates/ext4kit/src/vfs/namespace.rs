//! Changing the namespace: mkdir, rmdir, unlink and link (rename has its
//! own module, `rename.rs`; what happens at an inode's last link is in
//! `evict.rs`).
//!
//! Each operation names its entry with a [`Target`] (a path, or a name in
//! a directory: what the FUSE server has) and works on the directory's
//! inode and the name (`*_at`); each takes the caller's [`Cred`].
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

use super::acl_inherit;
use super::cred::{Cred, MAY_EXEC, MAY_WRITE};
use super::evict;
use super::evict::Death;
use super::icache::CachedInode;
use super::lookup;
use super::namei::show;
use super::request::NewInode;
use super::stat;
use super::super_block::SuperBlock;
use super::syncmode;
use super::target::Target;
use super::Stat;
use crate::error::{Errno, Error, Result};
use crate::ext4::dir_insert::{self, NewEntry};
use crate::ext4::ialloc;
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

pub(crate) fn dir_nlink(sb: &SuperBlock) -> bool {
    sb.vol().geo().has_ro_compat(ro_compat::DIR_NLINK)
}

/// The cached inode of directory `ino` (ENOTDIR otherwise).
pub(crate) fn dir_inode(sb: &SuperBlock, ino: u32) -> Result<Arc<CachedInode>> {
    let d = sb.inode(ino)?;
    if d.ftype != FileType::Directory {
        return Err(Error::posix(Errno::ENOTDIR, format!("inode {ino} is not a directory")));
    }
    Ok(d)
}

/// The block map of a locked inode: the cached one (maps change, and
/// the cache is reset, only under the writer side of the lock we hold)
/// or parsed from `rec`.
pub(crate) fn locked_map(sb: &SuperBlock, inode: &CachedInode, rec: &Inode) -> Result<Arc<BlockMap>> {
    inode.block_map_locked(sb.vol(), rec)
}

pub(crate) fn may_create(dir: &Inode, cred: &Cred, what: &[u8]) -> Result<()> {
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
pub(crate) fn may_delete(dir: &Inode, victim: &Inode, cred: &Cred, what: &[u8]) -> Result<()> {
    may_create(dir, cred, what)?;
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
fn new_owner(dir: &Inode, cred: &Cred, ftype: FileType, perm: u16) -> (u32, u32, u16) {
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

/// One attempt of [`Fs::create`](crate::Fs::create) for a directory
/// (`ext4_mkdir`): its "." and ".." block, its parent's link, and the
/// parent's default ACL as its own default.
pub(crate) fn mkdir_once(sb: &SuperBlock, parent: u32, name: &[u8], req: &NewInode<'_>) -> Result<Stat> {
    let (mode, cred, owner) = (req.create_mode(), req.cred, req.owner);
    check_name(name)?;
    if is_dot(name) {
        return Err(Error::posix(Errno::EEXIST, format!("{}: exists", show(name))));
    }
    let dir = dir_inode(sb, parent)?;
    let mut drec = dir.disk.write();
    if drec.base.links_count == 0 {
        return Err(Error::posix(
            Errno::ENOENT,
            format!("directory inode {parent} was removed"),
        ));
    }
    may_create(&drec, cred, name)?;
    let map = locked_map(sb, &dir, &drec)?;
    let dref = DirRef {
        ino: parent,
        inode: &drec,
        map: &map,
    };
    refuse_taken(sb, dref, name)?;
    if drec.base.links_count >= LINK_MAX && !dir_nlink(sb) {
        return Err(Error::posix(
            Errno::EMLINK,
            format!("directory inode {parent} has {LINK_MAX} subdirectories (no dir_nlink)"),
        ));
    }
    let acl = acl_inherit::acl_for_new(sb, parent, &drec, FileType::Directory, mode)?;
    let (uid, gid, perm) = match owner {
        Some((u, g)) => (u, g, acl.mode),
        None => new_owner(&drec, cred, FileType::Directory, acl.mode),
    };
    // The directory's first block is allocated after its inode, and the
    // name goes in after both: refuse now rather than half-way if
    // either would meet damage.
    balloc::check_allocatable(sb.vol(), sb.vol().geo().group_first_block_of_inode(parent))?;
    dir_insert::check_insertable(sb.vol(), dref)?;
    // No block for the directory's first block: ENOSPC now, before the
    // inode. An inode allocated and freed again (the undo below) still
    // leaves `bg_itable_unused` lowered, so that refusal would change
    // the image (the kernel's ext4_mkdir leaves it so too). Only a
    // concurrent allocation taking the last block in between can still
    // reach the undo.
    sb.vol().reservations().reserve(1, Reserver::User)?;
    sb.vol().reservations().release(1);
    let t = sb.now();
    let mut h = sb.vol().begin()?;
    let ino = ialloc::new_inode(sb.vol(), &mut h, parent, FileType::Directory)?;
    // A cached inode of this number is a dead predecessor whose freer
    // has not dropped it yet: the number is ours now.
    sb.icache().forget(ino);
    let mut rec = ialloc::new_record(
        sb.vol(),
        &ialloc::NewInode {
            ftype: FileType::Directory,
            perm,
            uid,
            gid,
            now: t,
            parent: (drec.base.flags, drec.extra.projid),
        },
    );
    rec.base.links_count = 2;
    if let Err(e) = dir_insert::init_dir(sb.vol(), &mut h, ino, &mut rec, parent) {
        ialloc::free_inode(sb.vol(), &mut h, ino, &rec)?;
        h.commit()?;
        return Err(e);
    }
    if let Err(e) = acl_inherit::store_inherited_acl(sb, &mut h, ino, &mut rec, &acl) {
        // ext4_init_acl failing fails the mkdir: nothing is left.
        evict::destroy(sb, &mut h, ino, &mut rec, t)?;
        h.commit()?;
        return Err(e);
    }
    inode::write(sb.vol(), &mut h, ino, &rec)?;
    let mut newd = drec.clone();
    let grew = match dir_insert::add_link(
        sb.vol(),
        &mut h,
        dref,
        &mut newd,
        NewEntry::new(name, ino, FileType::Directory),
    ) {
        Ok(g) => g,
        Err(e) => {
            // Undo: the new directory's block and inode go back.
            evict::destroy(sb, &mut h, ino, &mut rec, t)?;
            h.commit()?;
            return Err(e);
        }
    };
    add_links(&mut newd, 1, dir_nlink(sb));
    if newd.base.links_count == 1 && !dir_nlink(sb) {
        return Err(Error::posix(Errno::EMLINK, "directory link count overflow"));
    }
    newd.set_time(TimeField::Mtime, t);
    newd.set_time(TimeField::Ctime, t);
    inode::write(sb.vol(), &mut h, parent, &newd)?;
    h.commit()?;
    let newsize = newd.size();
    *drec = newd;
    if grew {
        dir.size.store(newsize, Ordering::Release);
        dir.reset_block_map();
    }
    // Under the directory's lock (see `create_at`).
    sb.dcache().added(parent, name, ino, FileType::Directory);
    let flags = drec.base.flags;
    drop(drec);
    syncmode::dirsync_after(sb, &dir, flags)?;
    stat::stat_ino(sb, ino)
}

/// Remove name `name` (not a directory) from directory `parent`.
fn unlink_at(sb: &SuperBlock, parent: u32, name: &[u8], cred: &Cred) -> Result<()> {
    check_name(name)?;
    if is_dot(name) {
        return Err(Error::posix(Errno::EISDIR, format!("{}: is a directory", show(name))));
    }
    remove_at(sb, parent, name, false, cred)
}

/// Remove the empty directory `name` from directory `parent`.
fn rmdir_at(sb: &SuperBlock, parent: u32, name: &[u8], cred: &Cred) -> Result<()> {
    check_name(name)?;
    if name == b"." {
        return Err(Error::posix(Errno::EINVAL, "rmdir of \".\""));
    }
    if name == b".." {
        return Err(Error::posix(Errno::ENOTEMPTY, "rmdir of \"..\""));
    }
    remove_at(sb, parent, name, true, cred)
}

fn remove_at(sb: &SuperBlock, parent: u32, name: &[u8], want_dir: bool, cred: &Cred) -> Result<()> {
    let dir = dir_inode(sb, parent)?;
    let mut drec = dir.disk.write();
    let map = locked_map(sb, &dir, &drec)?;
    let dref = DirRef {
        ino: parent,
        inode: &drec,
        map: &map,
    };
    let Some((ino, _)) = dir::lookup_for_write(sb.vol(), dref, name)? else {
        return Err(Error::posix(
            Errno::ENOENT,
            format!("{}: no such file or directory", show(name)),
        ));
    };
    let victim = sb.inode(ino)?;
    let is_dir = victim.ftype == FileType::Directory;
    if want_dir && !is_dir {
        return Err(Error::posix(Errno::ENOTDIR, format!("{}: not a directory", show(name))));
    }
    if !want_dir && is_dir {
        return Err(Error::posix(Errno::EISDIR, format!("{}: is a directory", show(name))));
    }
    let mut vrec = victim.disk.write();
    may_delete(&drec, &vrec, cred, name)?;
    if is_dir {
        let vmap = locked_map(sb, &victim, &vrec)?;
        let vref = DirRef {
            ino,
            inode: &vrec,
            map: &vmap,
        };
        if !dir::is_empty(sb.vol(), vref)? {
            return Err(Error::posix(
                Errno::ENOTEMPTY,
                format!("{}: directory not empty", show(name)),
            ));
        }
    }
    if is_dir || vrec.base.links_count <= 1 {
        // Its last name: look at everything its death will free while
        // the name is still there to refuse with (release_check.rs).
        release_check::release(sb.vol(), ino, &vrec)?;
    }
    // Both records are rewritten: neither may lie in a cross-linked
    // inode-table block (owner_scan.rs).
    owner_scan::check_record(sb.vol(), parent)?;
    owner_scan::check_record(sb.vol(), ino)?;
    let t = sb.now();
    let mut h = sb.vol().begin()?;
    dir_delete::remove_link(sb.vol(), &mut h, dref, name)?;
    let mut newd = drec.clone();
    if is_dir {
        add_links(&mut newd, -1, dir_nlink(sb));
    }
    newd.set_time(TimeField::Mtime, t);
    newd.set_time(TimeField::Ctime, t);
    inode::write(sb.vol(), &mut h, parent, &newd)?;
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
    sb.dcache().remove(parent, name);
    let died = evict::drop_link(sb, &mut h, &victim, &mut newv, t)?;
    h.commit()?;
    if died == Death::Orphaned {
        sb.vol().sync_super()?;
    }
    *drec = newd;
    *vrec = newv;
    drop(vrec);
    let flags = drec.base.flags;
    drop(drec);
    if died == Death::Freed {
        sb.icache().forget_if(&victim);
    }
    syncmode::dirsync_after(sb, &dir, flags)
}

/// Make `name` in directory `parent` another name of inode `ino`.
fn link_at(sb: &SuperBlock, ino: u32, parent: u32, name: &[u8], cred: &Cred) -> Result<Stat> {
    sb.retry_enospc(|| link_at_once(sb, ino, parent, name, cred))
}

/// EEXIST when directory `dref` (locked for writing) already has `name`.
fn refuse_taken(sb: &SuperBlock, dref: DirRef<'_>, name: &[u8]) -> Result<()> {
    if dir::lookup_for_write(sb.vol(), dref, name)?.is_some() {
        return Err(Error::posix(Errno::EEXIST, format!("{}: file exists", show(name))));
    }
    Ok(())
}

/// One attempt of [`link_at`].
fn link_at_once(sb: &SuperBlock, ino: u32, parent: u32, name: &[u8], cred: &Cred) -> Result<Stat> {
    check_name(name)?;
    if is_dot(name) {
        return Err(Error::posix(Errno::EEXIST, format!("{}: exists", show(name))));
    }
    let dir = dir_inode(sb, parent)?;
    let mut drec = dir.disk.write();
    may_create(&drec, cred, name)?;
    let map = locked_map(sb, &dir, &drec)?;
    let dref = DirRef {
        ino: parent,
        inode: &drec,
        map: &map,
    };
    refuse_taken(sb, dref, name)?;
    let target = sb.inode(ino)?;
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
    balloc::check_allocatable(sb.vol(), sb.vol().geo().group_first_block_of_inode(parent))?;
    dir_insert::check_insertable(sb.vol(), dref)?;
    let t = sb.now();
    let mut h = sb.vol().begin()?;
    let mut newd = drec.clone();
    let grew = dir_insert::add_link(
        sb.vol(),
        &mut h,
        dref,
        &mut newd,
        NewEntry::new(name, ino, target.ftype),
    )?;
    newd.set_time(TimeField::Mtime, t);
    newd.set_time(TimeField::Ctime, t);
    inode::write(sb.vol(), &mut h, parent, &newd)?;
    let mut newt = trec.clone();
    if first {
        orphan::remove(sb.vol(), &mut h, ino, &mut newt)?;
    }
    newt.base.links_count += 1;
    newt.set_time(TimeField::Ctime, t);
    inode::write(sb.vol(), &mut h, ino, &newt)?;
    h.commit()?;
    if first {
        // The chain's head, when it was the head, without a journal.
        sb.vol().sync_super()?;
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
    sb.dcache().added(parent, name, ino, target.ftype);
    drop(trec);
    let flags = drec.base.flags;
    drop(drec);
    syncmode::dirsync_after(sb, &dir, flags)?;
    stat::stat_ino(sb, ino)
}

/// The work of [`Fs::unlink`](crate::Fs::unlink).
pub(crate) fn unlink(sb: &SuperBlock, t: Target<'_>, cred: &Cred) -> Result<()> {
    lookup::on_entry(sb, t, |dir, name| unlink_at(sb, dir, name, cred))
}

/// The work of [`Fs::rmdir`](crate::Fs::rmdir).
pub(crate) fn rmdir(sb: &SuperBlock, t: Target<'_>, cred: &Cred) -> Result<()> {
    lookup::on_entry(sb, t, |dir, name| rmdir_at(sb, dir, name, cred))
}

/// The work of [`Fs::link`](crate::Fs::link): the source is never
/// followed (`link(2)` on Linux).
pub(crate) fn link(sb: &SuperBlock, src: Target<'_>, new: Target<'_>, cred: &Cred) -> Result<Stat> {
    let ino = lookup::target_ino(sb, src.nofollow())?;
    lookup::on_entry(sb, new, |dir, name| link_at(sb, ino, dir, name, cred))
}
