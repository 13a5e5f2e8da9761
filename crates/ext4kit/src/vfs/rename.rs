//! Renaming: `rename(2)` and `renameat2(2)` with `RENAME_NOREPLACE` and
//! `RENAME_EXCHANGE` (`RENAME_WHITEOUT` is built on them in `whiteout.rs`).
//!
//! Split the way the kernel splits it.
//!
//! - **The VFS half** (fs/namei.c) is `rename`: check the names
//!   and flags (`do_renameat2`); take the rename mutex and both parents'
//!   locks in ancestor order (`lock_rename`, `lock_parents`); look
//!   both names up (`lookup_sides`); refuse the loops `lock_rename`
//!   traps and the type mismatches `vfs_rename` refuses
//!   (`check_traps`); lock the inodes moved or replaced
//!   (`Renaming::lock`); check permissions (`may_rename`).
//! - **The ext4 half** (fs/ext4/namei.c) is two functions:
//!   `rename_plain` (`ext4_rename`: move one name, replacing the
//!   target if there is one) and `cross_rename`
//!   (`ext4_cross_rename`: swap two names). Both work on per-side state,
//!   `Side` (the kernel's `struct ext4_renament`: the directory, the
//!   name, the inode it names, whether that is a directory, and the change
//!   to the directory's link count), through small helpers named for the
//!   kernel's: reading a moved directory's ".." before anything changes
//!   (`rename_dir_prepare`) and pointing it at the new parent
//!   (`rename_dir_finish`), taking the old name out
//!   (`rename_delete`), the parents' link counts
//!   (`update_dir_count`), a replaced target's last link
//!   (`drop_replaced_target`: out of the dentry cache, then freed or
//!   orphaned), and publishing the result (`rename_finish`).
//!
//! Everything that could refuse is checked before the handle opens —
//! including what the edits will read (a moved directory's "..", what a
//! replaced target's death frees, room for the new name), so a damaged
//! image refuses while nothing has changed. The edits then run in one
//! transaction on copies of the records (`NewRecords`); the copies are
//! published, and the dentry cache changed, only after the commit, under
//! the parents' locks.
//!
//! Locking (the kernel's rules, as in `namespace.rs`): a cross-directory
//! rename holds the rename mutex (`s_vfs_rename_mutex`) throughout, so no
//! directory changes parent meanwhile; the parents are locked ancestor
//! first, otherwise lower inode number first; the moved and replaced inodes
//! after all parents, lower inode number first.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ext4kit_format::inode::{FileType, Inode, TimeField, Timestamp};
use parking_lot::RwLockWriteGuard;

use super::cred::{Cred, MAY_WRITE};
use super::evict;
use super::evict::Death;
use super::icache::CachedInode;
use super::lookup;
use super::namei::show;
use super::namespace;
use super::namespace::{add_links, check_name, is_dot, LINK_MAX};
use super::super_block::SuperBlock;
use super::syncmode;
use super::target::Target;
use crate::error::{Errno, Error, Result};
use crate::ext4::dir_insert::{self, NewEntry};
use crate::ext4::transaction::Handle;
use crate::ext4::{balloc, bmap, dir, dir_delete, inode, owner_scan, release_check, BlockMap, DirRef, Volume};

/// How a rename treats an existing target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with EEXIST when the target exists (`RENAME_NOREPLACE`).
    pub noreplace: bool,
    /// Swap source and target atomically; both must exist (`RENAME_EXCHANGE`).
    pub exchange: bool,
    /// Leave a whiteout (a 0:0 character device) at the old name
    /// (`RENAME_WHITEOUT`, overlayfs' copy-up and delete; `whiteout.rs`).
    /// Not with `exchange` (EINVAL).
    pub whiteout: bool,
}

/// One side of a rename — the kernel's `struct ext4_renament`: a name in a
/// directory, the inode it names, and what the rename does to that
/// directory's link count.
struct Side<'n> {
    /// The directory holding the name.
    dir: u32,
    /// The name.
    name: &'n [u8],
    /// The inode the name names; `None` for a new name not there yet.
    inode: Option<Arc<CachedInode>>,
    /// Whether that inode is a directory (its ".." moves with it).
    is_dir: bool,
    /// The directory's link-count change (`dir_nlink_delta`): -1 when a
    /// subdirectory leaves it, +1 when one arrives.
    dir_nlink_delta: i32,
}

impl<'n> Side<'n> {
    fn new(dir: u32, name: &'n [u8]) -> Self {
        Side {
            dir,
            name,
            inode: None,
            is_dir: false,
            dir_nlink_delta: 0,
        }
    }

    /// The number of the inode the name names (0: none).
    fn ino(&self) -> u32 {
        self.inode.as_ref().map_or(0, |i| i.ino)
    }

    /// The type of the inode the name names, for its directory entry.
    fn ftype(&self) -> FileType {
        self.inode.as_ref().map_or(FileType::Regular, |i| i.ftype)
    }
}

/// The link-count changes of the two parents, as the kernel keeps them.
/// `ext4_rename`: the old directory loses a subdirectory when the source
/// moves away or a directory target is replaced; the new one gains one only
/// when nothing was replaced. `ext4_cross_rename`: across directories, a
/// directory swapped for a non-directory moves one link from its parent to
/// the other.
fn set_dir_nlink_deltas(old: &mut Side<'_>, new: &mut Side<'_>, exchange: bool) {
    let cross = old.dir != new.dir;
    if exchange {
        if cross && old.is_dir != new.is_dir {
            old.dir_nlink_delta = if old.is_dir { -1 } else { 1 };
            new.dir_nlink_delta = -old.dir_nlink_delta;
        }
    } else if old.is_dir {
        if cross || new.is_dir {
            old.dir_nlink_delta = -1;
        }
        if cross && !new.is_dir {
            new.dir_nlink_delta = 1;
        }
    }
}

/// `ext4_update_dir_count`: apply a side's link-count change to its
/// directory's record.
fn update_dir_count(side: &Side<'_>, dir: &mut Inode, dir_nlink: bool) {
    if side.dir_nlink_delta != 0 {
        add_links(dir, side.dir_nlink_delta, dir_nlink);
    }
}

/// `do_renameat2`'s checks of the names and flags, before any lookup.
fn check_names(old_name: &[u8], new_name: &[u8], flags: RenameFlags) -> Result<()> {
    check_name(old_name)?;
    check_name(new_name)?;
    if is_dot(old_name) || is_dot(new_name) {
        return Err(Error::posix(Errno::EBUSY, "cannot rename \".\" or \"..\""));
    }
    if flags.noreplace && flags.exchange {
        return Err(Error::posix(Errno::EINVAL, "RENAME_NOREPLACE with RENAME_EXCHANGE"));
    }
    Ok(())
}

/// Both parents' chains up to the root (each starting with the directory
/// itself), read under the rename mutex — no directory changes parent
/// while it is held — and before any directory lock. Empty within one
/// directory: there the order and the loop traps do not arise.
#[derive(Default)]
struct Ancestry {
    old: Vec<u32>,
    new: Vec<u32>,
}

impl Ancestry {
    /// `lock_rename`'s order: the ancestor first, otherwise the lower inode
    /// number first — so rmdir (parent, then child directory) and a rename
    /// through the same two directories agree on the order.
    fn old_first(&self, old_dir: u32, new_dir: u32) -> bool {
        if old_dir == new_dir || self.new.contains(&old_dir) {
            true
        } else if self.old.contains(&new_dir) {
            false
        } else {
            old_dir < new_dir
        }
    }
}

/// `lock_rename`'s traps and `vfs_rename`'s type checks, before the
/// children are locked: a directory may not move into its own subtree, nor
/// a target be an ancestor of the source (both only across directories:
/// `up` is empty otherwise), and a plain rename replaces a directory only
/// with a directory and a non-directory only with a non-directory.
fn check_traps(up: &Ancestry, old: &Side<'_>, new: &Side<'_>, exchange: bool) -> Result<()> {
    if old.is_dir && up.new.contains(&old.ino()) {
        return Err(Error::posix(
            Errno::EINVAL,
            format!("{}: cannot move a directory into its own subtree", show(old.name)),
        ));
    }
    if new.is_dir && up.old.contains(&new.ino()) {
        return Err(Error::posix(
            if exchange { Errno::EINVAL } else { Errno::ENOTEMPTY },
            format!("{}: is an ancestor of the source", show(new.name)),
        ));
    }
    if !exchange && new.inode.is_some() {
        if old.is_dir && !new.is_dir {
            return Err(Error::posix(
                Errno::ENOTDIR,
                format!("{}: not a directory", show(new.name)),
            ));
        }
        if !old.is_dir && new.is_dir {
            return Err(Error::posix(
                Errno::EISDIR,
                format!("{}: is a directory", show(new.name)),
            ));
        }
    }
    Ok(())
}

/// The two parent directories, locked as writers for the whole rename
/// (`lock_rename`), with their block maps.
struct Parents<'a> {
    old_inode: &'a CachedInode,
    old_rec: RwLockWriteGuard<'a, Inode>,
    old_map: Arc<BlockMap>,
    new_inode: &'a CachedInode,
    /// The new directory's record and map when it is another directory.
    new_rec: Option<(RwLockWriteGuard<'a, Inode>, Arc<BlockMap>)>,
}

impl Parents<'_> {
    /// Whether the rename crosses directories.
    fn cross(&self) -> bool {
        self.new_rec.is_some()
    }

    /// The old directory, for the ext4 layer's directory operations.
    fn old_dir(&self) -> DirRef<'_> {
        DirRef {
            ino: self.old_inode.ino,
            inode: &self.old_rec,
            map: &self.old_map,
        }
    }

    /// The new directory (the old one within one directory).
    fn new_dir(&self) -> DirRef<'_> {
        match &self.new_rec {
            Some((rec, map)) => DirRef {
                ino: self.new_inode.ino,
                inode: rec,
                map,
            },
            None => self.old_dir(),
        }
    }
}

/// A rename with both sides looked up and everything it changes locked:
/// the parents, then the source inode and the target inode (if any).
/// Every record a rename rewrites — both directories, the source and a
/// replaced or exchanged target — must not lie in an inode-table block
/// another inode's map names (cross-linked: `owner_scan.rs`): refused
/// before the handle begins.
fn check_records(vol: &Volume, r: &Renaming<'_>) -> Result<()> {
    for ino in [r.old.dir, r.new.dir, r.old.ino(), r.new.ino()] {
        if ino != 0 {
            owner_scan::check_record(vol, ino)?;
        }
    }
    Ok(())
}

struct Renaming<'a> {
    old: &'a Side<'a>,
    new: &'a Side<'a>,
    flags: RenameFlags,
    dirs: Parents<'a>,
    /// The source inode and its record.
    src_inode: &'a CachedInode,
    src: RwLockWriteGuard<'a, Inode>,
    /// The target's record, when the new name exists.
    dst: Option<RwLockWriteGuard<'a, Inode>>,
}

impl<'a> Renaming<'a> {
    /// Lock the inodes moved or replaced, after all parents, lower inode
    /// number first.
    fn lock(dirs: Parents<'a>, old: &'a Side<'a>, new: &'a Side<'a>, flags: RenameFlags) -> Self {
        let src_inode = old.inode.as_deref().expect("the source was looked up");
        let (src, dst) = match new.inode.as_deref() {
            Some(d) if d.ino < src_inode.ino => {
                let t = d.disk.write();
                (src_inode.disk.write(), Some(t))
            }
            Some(d) => {
                let s = src_inode.disk.write();
                (s, Some(d.disk.write()))
            }
            None => (src_inode.disk.write(), None),
        };
        Renaming {
            old,
            new,
            flags,
            dirs,
            src_inode,
            src,
            dst,
        }
    }
}

/// The records a rename rewrites: copies of the locked ones, edited while
/// the handle is open and published only after it commits.
struct NewRecords {
    old_dir: Inode,
    /// The new directory's, when it is another directory.
    new_dir: Option<Inode>,
    src: Inode,
    dst: Option<Inode>,
}

impl NewRecords {
    fn copy(r: &Renaming<'_>) -> Self {
        NewRecords {
            old_dir: r.dirs.old_rec.clone(),
            new_dir: r.dirs.new_rec.as_ref().map(|(rec, _)| (**rec).clone()),
            src: r.src.clone(),
            dst: r.dst.as_deref().cloned(),
        }
    }

    /// The new directory's record (the old one's within one directory).
    fn new_dir_mut(&mut self) -> &mut Inode {
        self.new_dir.as_mut().unwrap_or(&mut self.old_dir)
    }

    /// The times every rename sets: the moved inode's ctime, both
    /// directories' mtime and ctime.
    fn touch(&mut self, t: Timestamp) {
        self.src.set_time(TimeField::Ctime, t);
        for r in [Some(&mut self.old_dir), self.new_dir.as_mut()].into_iter().flatten() {
            r.set_time(TimeField::Mtime, t);
            r.set_time(TimeField::Ctime, t);
        }
    }
}

/// The work of [`Fs::rename`](crate::Fs::rename) (but `RENAME_WHITEOUT`:
/// `whiteout.rs`): durable at the return when either directory is dirsync
/// (`ext4_rename`'s `ext4_handle_sync`, `vfs::syncmode`).
pub(crate) fn rename(sb: &SuperBlock, old: Target<'_>, new: Target<'_>, flags: RenameFlags, cred: &Cred) -> Result<()> {
    let (old_dir, old_name) = lookup::entry(sb, old)?;
    let (new_dir, new_name) = lookup::entry(sb, new)?;
    sb.retry_enospc(|| {
        rename_once(
            sb,
            Side::new(old_dir, old_name),
            Side::new(new_dir, new_name),
            flags,
            cred,
        )
    })
    .and_then(|()| syncmode::dirsync(sb, &[old_dir, new_dir]))
    .map_err(|e| lookup::annotate(e, old))
}

/// One attempt of [`rename`]: the VFS's part, then
/// [`rename_plain`] or [`cross_rename`].
fn rename_once(sb: &SuperBlock, mut old: Side<'_>, mut new: Side<'_>, flags: RenameFlags, cred: &Cred) -> Result<()> {
    check_names(old.name, new.name, flags)?;
    let cross = old.dir != new.dir;
    // s_vfs_rename_mutex: one cross-directory rename at a time, so the
    // ancestor checks below stay true until the rename is done.
    let _rename_guard = cross.then(|| sb.dcache().rename_mutex.lock());
    let od = namespace::dir_inode(sb, old.dir)?;
    let nd = namespace::dir_inode(sb, new.dir)?;
    let up = if cross {
        Ancestry {
            old: ancestry(sb, old.dir)?,
            new: ancestry(sb, new.dir)?,
        }
    } else {
        Ancestry::default()
    };
    let dirs = lock_parents(sb, &od, &nd, &up)?;
    if !lookup_sides(sb, &dirs, &mut old, &mut new, flags)? {
        return Ok(()); // two names of one inode: POSIX says do nothing
    }
    check_traps(&up, &old, &new, flags.exchange)?;
    let r = Renaming::lock(dirs, &old, &new, flags);
    may_rename(&r, cred)?;
    if flags.exchange {
        cross_rename(sb, r)
    } else {
        rename_plain(sb, r)
    }
}

/// Directory `dir` and its ancestors up to the root (walking ".." on
/// disk). Callers hold the rename mutex and no directory lock: under the
/// mutex no directory changes parent, so the chain stays true for the
/// whole rename.
fn ancestry(sb: &SuperBlock, mut dir: u32) -> Result<Vec<u32>> {
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
        let d = namespace::dir_inode(sb, dir)?;
        let rec = d.disk.read();
        let map = namespace::locked_map(sb, &d, &rec)?;
        let r = DirRef {
            ino: dir,
            inode: &rec,
            map: &map,
        };
        dir = dir::dotdot(sb.vol(), r)?;
        chain.push(dir);
    }
    Ok(chain)
}

/// Lock both parents as writers in `lock_rename`'s order (one lock
/// within one directory) and load their block maps.
fn lock_parents<'a>(sb: &SuperBlock, od: &'a CachedInode, nd: &'a CachedInode, up: &Ancestry) -> Result<Parents<'a>> {
    let (old_rec, new_rec) = if od.ino == nd.ino {
        (od.disk.write(), None)
    } else if up.old_first(od.ino, nd.ino) {
        let a = od.disk.write();
        (a, Some(nd.disk.write()))
    } else {
        let b = nd.disk.write();
        (od.disk.write(), Some(b))
    };
    let old_map = namespace::locked_map(sb, od, &old_rec)?;
    let new_rec = match new_rec {
        Some(rec) => {
            let map = namespace::locked_map(sb, nd, &rec)?;
            Some((rec, map))
        }
        None => None,
    };
    Ok(Parents {
        old_inode: od,
        old_rec,
        old_map,
        new_inode: nd,
        new_rec,
    })
}

/// Look both names up under the parents' locks and fill in the sides.
/// `Ok(false)`: both names are links to one inode, and POSIX says the
/// rename does nothing.
fn lookup_sides(
    sb: &SuperBlock,
    dirs: &Parents<'_>,
    old: &mut Side<'_>,
    new: &mut Side<'_>,
    flags: RenameFlags,
) -> Result<bool> {
    if dirs.old_rec.base.links_count == 0 || dirs.new_dir().inode.base.links_count == 0 {
        return Err(Error::posix(Errno::ENOENT, "rename in a removed directory"));
    }
    let Some((sino, _)) = dir::lookup_for_write(sb.vol(), dirs.old_dir(), old.name)? else {
        return Err(Error::posix(
            Errno::ENOENT,
            format!("{}: no such file or directory", show(old.name)),
        ));
    };
    let tgt = dir::lookup_for_write(sb.vol(), dirs.new_dir(), new.name)?.map(|(i, _)| i);
    if flags.exchange && tgt.is_none() {
        return Err(Error::posix(
            Errno::ENOENT,
            format!("{}: no such file or directory", show(new.name)),
        ));
    }
    if flags.noreplace && tgt.is_some() {
        return Err(Error::posix(Errno::EEXIST, format!("{}: file exists", show(new.name))));
    }
    if tgt == Some(sino) {
        return Ok(false);
    }
    let src = sb.inode(sino)?;
    let dst = tgt.map(|i| sb.inode(i)).transpose()?;
    old.is_dir = src.ftype == FileType::Directory;
    new.is_dir = dst.as_ref().is_some_and(|d| d.ftype == FileType::Directory);
    old.inode = Some(src);
    new.inode = dst;
    set_dir_nlink_deltas(old, new, flags.exchange);
    Ok(true)
}

/// `vfs_rename`'s permission checks: the source may leave its
/// directory and the target be replaced or created (`may_delete`,
/// `may_create`); a directory moving to another parent needs write
/// permission on itself, for its "..".
fn may_rename(r: &Renaming<'_>, cred: &Cred) -> Result<()> {
    let (old, new) = (r.old, r.new);
    namespace::may_delete(&r.dirs.old_rec, &r.src, cred, old.name)?;
    match &r.dst {
        Some(t) => namespace::may_delete(r.dirs.new_dir().inode, t, cred, new.name)?,
        None => namespace::may_create(r.dirs.new_dir().inode, cred, new.name)?,
    }
    let cross = r.dirs.cross();
    if cross && old.is_dir && !cred.may(&r.src, MAY_WRITE) {
        return Err(Error::posix(
            Errno::EACCES,
            format!(
                "{}: moving a directory needs write permission on it (\"..\")",
                show(old.name)
            ),
        ));
    }
    if cross && r.flags.exchange && new.is_dir && r.dst.as_ref().is_some_and(|t| !cred.may(t, MAY_WRITE)) {
        return Err(Error::posix(
            Errno::EACCES,
            format!("{}: moving a directory needs write permission on it", show(new.name)),
        ));
    }
    Ok(())
}

/// `EXT4_DIR_LINK_MAX`: a directory receiving a subdirectory must have
/// room for its link, unless `dir_nlink` lets the count saturate.
fn check_dir_link_max(sb: &SuperBlock, r: &Renaming<'_>) -> Result<()> {
    if namespace::dir_nlink(sb) {
        return Ok(());
    }
    if r.new.dir_nlink_delta > 0 && r.dirs.new_dir().inode.base.links_count >= LINK_MAX {
        return Err(Error::posix(
            Errno::EMLINK,
            "target directory has too many subdirectories",
        ));
    }
    if r.old.dir_nlink_delta > 0 && r.dirs.old_rec.base.links_count >= LINK_MAX {
        return Err(Error::posix(
            Errno::EMLINK,
            "source directory has too many subdirectories",
        ));
    }
    Ok(())
}

/// `ext4_rename_dir_prepare`: read a directory's ".." before anything
/// changes. A directory moving to another parent has its ".." edited
/// later; a damaged one must refuse the rename now (release_check.rs's
/// rule: refuse while nothing has changed).
fn rename_dir_prepare(sb: &SuperBlock, ino: u32, rec: &Inode) -> Result<()> {
    let map = bmap::load(sb.vol(), ino, rec)?;
    dir::dotdot(
        sb.vol(),
        DirRef {
            ino,
            inode: rec,
            map: &map,
        },
    )?;
    Ok(())
}

/// `ext4_rename_dir_finish`: point a moved directory's ".." at its new
/// parent.
fn rename_dir_finish(sb: &SuperBlock, h: &mut Handle<'_>, dir: DirRef<'_>, parent: u32) -> Result<()> {
    dir_insert::set_dotdot(sb.vol(), h, dir, parent)
}

/// [`rename_dir_finish`] for the source directory, moving into
/// the new parent (through its cached block map).
fn rename_dir_finish_source(sb: &SuperBlock, h: &mut Handle<'_>, r: &Renaming<'_>) -> Result<()> {
    let map = namespace::locked_map(sb, r.src_inode, &r.src)?;
    let moved = DirRef {
        ino: r.old.ino(),
        inode: &r.src,
        map: &map,
    };
    rename_dir_finish(sb, h, moved, r.new.dir)
}

/// `ext4_rename_delete`: take the old name out. Within one directory
/// the new name may have grown it; the name is then looked up through
/// the grown record, whose map the cached one is not (as the kernel
/// re-reads with `force_reread`).
fn rename_delete(sb: &SuperBlock, h: &mut Handle<'_>, r: &Renaming<'_>, recs: &NewRecords, grew: bool) -> Result<()> {
    if !r.dirs.cross() && grew {
        let map = bmap::load(sb.vol(), r.old.dir, &recs.old_dir)?;
        let dir = DirRef {
            ino: r.old.dir,
            inode: &recs.old_dir,
            map: &map,
        };
        dir_delete::remove_link(sb.vol(), h, dir, r.old.name)?;
    } else {
        dir_delete::remove_link(sb.vol(), h, r.dirs.old_dir(), r.old.name)?;
    }
    Ok(())
}

/// The replaced target loses its name (`ext4_rename`: `ext4_dec_count`,
/// or `clear_nlink` for an empty directory, whose "." goes with the
/// name; then `ext4_orphan_add` at no links). It leaves the dentry
/// cache before it can be freed and its number reused (see
/// `remove_at`), then is freed now or kept on the orphan list until its
/// last close (`drop_link`, which writes its record).
fn drop_replaced_target(
    sb: &SuperBlock,
    h: &mut Handle<'_>,
    r: &Renaming<'_>,
    recs: &mut NewRecords,
    t: Timestamp,
) -> Result<Death> {
    let (Some(target), Some(rec)) = (r.new.inode.as_deref(), recs.dst.as_mut()) else {
        return Ok(Death::Alive);
    };
    rec.set_time(TimeField::Ctime, t);
    if r.new.is_dir {
        rec.base.links_count = 0;
    } else {
        add_links(rec, -1, false);
    }
    sb.dcache().remove(r.new.dir, r.new.name);
    evict::drop_link(sb, h, target, rec, t)
}

/// `ext4_rename`: move the source's name to the new name, replacing
/// the target if there is one.
fn rename_plain(sb: &SuperBlock, r: Renaming<'_>) -> Result<()> {
    let (old, new) = (r.old, r.new);
    let cross = r.dirs.cross();
    if let (Some(t), true) = (&r.dst, new.is_dir) {
        let map = bmap::load(sb.vol(), new.ino(), t)?;
        let target = DirRef {
            ino: new.ino(),
            inode: t,
            map: &map,
        };
        if !dir::is_empty(sb.vol(), target)? {
            return Err(Error::posix(
                Errno::ENOTEMPTY,
                format!("{}: directory not empty", show(new.name)),
            ));
        }
    }
    check_dir_link_max(sb, &r)?;
    if cross && old.is_dir {
        rename_dir_prepare(sb, old.ino(), &r.src)?;
    }
    match r.dst.as_deref() {
        // Everything the replaced target's death frees, checked while
        // its name is still there to refuse with (release_check.rs).
        Some(t) if new.is_dir || t.base.links_count <= 1 => release_check::release(sb.vol(), new.ino(), t)?,
        Some(_) => {}
        // The new name may grow its directory.
        None => {
            balloc::check_allocatable(sb.vol(), sb.vol().geo().group_first_block_of_inode(new.dir))?;
            dir_insert::check_insertable(sb.vol(), r.dirs.new_dir())?;
        }
    }
    check_records(sb.vol(), &r)?;

    let t = sb.now();
    let mut h = sb.vol().begin()?;
    let mut recs = NewRecords::copy(&r);
    let mut grew = false;
    let mut death = Death::Alive;
    if new.inode.is_some() {
        // ext4_setent: the new name now names the source.
        dir_delete::replace_link(sb.vol(), &mut h, r.dirs.new_dir(), new.name, old.ino(), old.ftype())?;
        death = drop_replaced_target(sb, &mut h, &r, &mut recs, t)?;
    } else {
        let entry = NewEntry::new(new.name, old.ino(), old.ftype());
        grew = dir_insert::add_link(sb.vol(), &mut h, r.dirs.new_dir(), recs.new_dir_mut(), entry)?;
    }
    rename_delete(sb, &mut h, &r, &recs, grew)?;
    if old.is_dir {
        if cross {
            rename_dir_finish_source(sb, &mut h, &r)?;
        }
        let dir_nlink = namespace::dir_nlink(sb);
        update_dir_count(old, &mut recs.old_dir, dir_nlink);
        update_dir_count(new, recs.new_dir_mut(), dir_nlink);
    }
    recs.touch(t);
    // The target's record went with its last link (`drop_link`).
    write_records(sb, &mut h, &r, &recs, false)?;
    h.commit()?;
    rename_finish(sb, r, recs, grew, death)
}

/// `ext4_cross_rename` (`RENAME_EXCHANGE`): each name now names the
/// other's inode; directories swapped across parents take their ".."
/// and a link with them.
fn cross_rename(sb: &SuperBlock, r: Renaming<'_>) -> Result<()> {
    let (old, new) = (r.old, r.new);
    let cross = r.dirs.cross();
    check_dir_link_max(sb, &r)?;
    if cross {
        if old.is_dir {
            rename_dir_prepare(sb, old.ino(), &r.src)?;
        }
        if let (true, Some(t)) = (new.is_dir, r.dst.as_deref()) {
            rename_dir_prepare(sb, new.ino(), t)?;
        }
    }
    check_records(sb.vol(), &r)?;

    let t = sb.now();
    let mut h = sb.vol().begin()?;
    let mut recs = NewRecords::copy(&r);
    // ext4_setent on both sides.
    dir_delete::replace_link(sb.vol(), &mut h, r.dirs.old_dir(), old.name, new.ino(), new.ftype())?;
    dir_delete::replace_link(sb.vol(), &mut h, r.dirs.new_dir(), new.name, old.ino(), old.ftype())?;
    if cross {
        if old.is_dir {
            rename_dir_finish_source(sb, &mut h, &r)?;
        }
        if let (true, Some(tr)) = (new.is_dir, r.dst.as_deref()) {
            let map = bmap::load(sb.vol(), new.ino(), tr)?;
            let moved = DirRef {
                ino: new.ino(),
                inode: tr,
                map: &map,
            };
            rename_dir_finish(sb, &mut h, moved, old.dir)?;
        }
        let dir_nlink = namespace::dir_nlink(sb);
        update_dir_count(new, recs.new_dir_mut(), dir_nlink);
        update_dir_count(old, &mut recs.old_dir, dir_nlink);
    }
    if let Some(tr) = recs.dst.as_mut() {
        tr.set_time(TimeField::Ctime, t);
    }
    recs.touch(t);
    write_records(sb, &mut h, &r, &recs, true)?;
    h.commit()?;
    rename_finish(sb, r, recs, false, Death::Alive)
}

/// Write the rewritten records through `h`: both directories, the
/// source, and (`with_target`) the target.
fn write_records(
    sb: &SuperBlock,
    h: &mut Handle<'_>,
    r: &Renaming<'_>,
    recs: &NewRecords,
    with_target: bool,
) -> Result<()> {
    inode::write(sb.vol(), h, r.old.dir, &recs.old_dir)?;
    if let Some(n) = &recs.new_dir {
        inode::write(sb.vol(), h, r.new.dir, n)?;
    }
    inode::write(sb.vol(), h, r.old.ino(), &recs.src)?;
    if let (true, Some(t)) = (with_target, &recs.dst) {
        inode::write(sb.vol(), h, r.new.ino(), t)?;
    }
    Ok(())
}

/// After the commit: publish the new records, move the names in the
/// dentry cache (under both directories' locks, see `create_at`), drop
/// the locks, then let a grown directory's size and map be read again
/// and forget a freed target.
fn rename_finish(sb: &SuperBlock, r: Renaming<'_>, recs: NewRecords, grew: bool, death: Death) -> Result<()> {
    if death == Death::Orphaned {
        // The orphan chain's head, without a journal.
        sb.vol().sync_super()?;
    }
    let Renaming {
        old,
        new,
        flags,
        dirs,
        src_inode: _,
        mut src,
        mut dst,
    } = r;
    let Parents {
        old_inode,
        old_rec: mut old_dir,
        new_inode,
        new_rec: new_dir,
        ..
    } = dirs;
    let mut new_dir = new_dir.map(|(rec, _)| rec);
    let new_size = recs.new_dir.as_ref().unwrap_or(&recs.old_dir).size();
    *old_dir = recs.old_dir;
    if let (Some(g), Some(n)) = (new_dir.as_mut(), recs.new_dir) {
        **g = n;
    }
    *src = recs.src;
    if let (Some(g), Some(n)) = (dst.as_mut(), recs.dst) {
        **g = n;
    }
    sb.dcache()
        .renamed(old.dir, old.name, new.dir, new.name, flags.exchange);
    drop(dst);
    drop(src);
    let grown = if new_dir.is_some() { new_inode } else { old_inode };
    drop(new_dir);
    drop(old_dir);
    if grew {
        grown.size.store(new_size, Ordering::Release);
        grown.reset_block_map();
    }
    if let (Death::Freed, Some(d)) = (death, &new.inode) {
        sb.icache().forget_if(d);
    }
    Ok(())
}
