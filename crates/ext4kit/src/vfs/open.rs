//! Opening files (`open(2)`, the kernel's `path_openat` and `do_open`):
//! by path, by a name in a directory, or by inode number, on behalf of a
//! caller ([`OpenRequest`]), with `O_CREAT` making the file and `O_TRUNC`
//! emptying it; and `O_TMPFILE`.
//!
//! Every open returns a [`File`] that remembers its opener: writes,
//! truncations and fallocates through it are the opener's
//! (`file_remove_privs`, the root reserve).
//!
//! An open by path counts itself on the thread's pin of the inode
//! (`vfs::pin`: the common open writes no shared line) and then checks
//! that the dentry its walk found is still cached (`open_walked`): inode
//! numbers are reused at once, and a pin says an inode is alive, not that
//! it is the one the name named.
//!
//! Locking: nothing new. Each step takes the locks of the engine call it
//! makes (creation: the parent's `disk` lock; truncation: the inode's), one
//! at a time; no two inode locks are held together.

use std::sync::Arc;

use ext4kit_format::inode::flags as iflags;
use ext4kit_format::inode::FileType;

use super::cred::{Caller, Cred, MAY_EXEC, MAY_READ, MAY_WRITE};
use super::file::{File, OpenFlags};
use super::icache::CachedInode;
use super::namei::{self, show};
use super::request::{CreateMode, NewInode, OpenRequest, PermCheck};
use super::super_block::SuperBlock;
use super::target::{Named, Target};
use super::{evict, io, lookup, pin, write};
use crate::error::{Errno, Error, Result};

/// The work of [`Fs::open`](crate::Fs::open) (root, no checks) and
/// [`Fs::open_as`](crate::Fs::open_as).
pub(crate) fn open(sb: &SuperBlock, t: Target<'_>, req: &OpenRequest<'_>) -> Result<Arc<File>> {
    match t.named() {
        Named::Path(p) => open_path(sb, p, req),
        Named::At(dir, name) if req.flags.create => create_open_at(sb, dir, name, req),
        _ => open_inode(sb, lookup::target_ino(sb, t)?, req, false),
    }
}

/// The work of [`Fs::open`](crate::Fs::open): as root; a path is opened
/// as `open(2)` opens it (immutable and append-only still refuse), an
/// inode number or a name in a directory with no checks at all (the tools
/// that walk a tree by inode numbers).
pub(crate) fn open_as_root(sb: &SuperBlock, t: Target<'_>, flags: OpenFlags) -> Result<Arc<File>> {
    match t.named() {
        Named::Path(p) => open_path(sb, p, &OpenRequest::new(flags)),
        _ => open_ino(sb, lookup::target_ino(sb, t)?, flags),
    }
}

/// `open(O_CREAT)` of `name` in directory `parent` (`lookup_open` →
/// `vfs_create`, then the open): a regular file made by the caller with
/// the request's mode, then opened. When the name exists, O_EXCL gives
/// EEXIST and otherwise the existing file is opened (with the permission
/// check a plain open makes), as `open(2)` does after losing a creation
/// race.
fn create_open_at(sb: &SuperBlock, parent: u32, name: &[u8], req: &OpenRequest<'_>) -> Result<Arc<File>> {
    let new = NewInode::file(Target::at(parent, name)).mode(req.mode).cred(req.cred);
    match write::create(sb, &new) {
        // A file we just created is opened without a permission check
        // (its mode may well deny its creator, e.g. 0444).
        Ok(st) => open_inode(sb, st.ino, req, true),
        Err(e) if e.errno() == Errno::EEXIST && !req.flags.excl => {
            // Created by someone else since the caller looked: nobody
            // checked the caller's rights on it yet, so the engine does.
            let (ino, _) = lookup::lookup_at(sb, parent, name)?.ok_or(e)?;
            open_inode(sb, ino, &req.check(PermCheck::Engine), false)
        }
        Err(e) => Err(e),
    }
}

/// The work of [`Fs::tmpfile_open`](crate::Fs::tmpfile_open).
pub(crate) fn tmpfile_open(sb: &SuperBlock, dir: Target<'_>, req: &OpenRequest<'_>) -> Result<Arc<File>> {
    let parent = lookup::target_ino(sb, dir)?;
    // O_EXCL: never linkable (`I_LINKABLE` is set only without it).
    let linkable = !req.flags.excl;
    let inode = write::tmpfile_inode(sb, parent, req.mode, linkable, req.cred)?;
    // The open's own flags: O_TMPFILE carries O_DIRECTORY, and creation,
    // exclusion and truncation were the tmpfile's.
    let flags = OpenFlags {
        create: false,
        excl: false,
        trunc: false,
        directory: false,
        ..req.flags
    };
    let req = OpenRequest {
        flags,
        check: PermCheck::Done,
        ..*req
    };
    // Opened from the cached inode itself: it has no name to find it
    // by again, and cannot be read back from disk (links 0).
    match open_cached(sb, &inode, &req, true) {
        Ok(f) => Ok(f),
        Err(e) => {
            // Never opened: free it now rather than at the next mount.
            if let Err(u) = evict::release_unlinked(sb, &inode) {
                eprintln!("ext4kit: freeing tmpfile inode {}: {u}", inode.ino);
            }
            Err(e)
        }
    }
}

/// `open(2)` of inode `ino` after the walk (the kernel's `do_open` →
/// `may_open` → `vfs_open` → `handle_truncate`); `created`: by this
/// call, so no permission check.
fn open_inode(sb: &SuperBlock, ino: u32, req: &OpenRequest<'_>, created: bool) -> Result<Arc<File>> {
    let inode = sb.inode(ino)?;
    open_cached(sb, &inode, req, created)
}

/// [`open_inode`] of a cached inode.
fn open_cached(sb: &SuperBlock, inode: &Arc<CachedInode>, req: &OpenRequest<'_>, created: bool) -> Result<Arc<File>> {
    let (flags, cred, check) = (req.flags, req.cred, req.check);
    let ino = inode.ino;
    let check_perm = check == PermCheck::Engine && !created;
    may_open(sb, inode, flags, cred, check_perm, &|| format!("inode {ino}"))?;
    if flags.trunc && inode.ftype == FileType::Regular && !created {
        io::truncate_inode(sb, inode, 0, &Caller::new(cred))?;
    }
    let r = super::pin::open(inode, None)
        .ok_or_else(|| crate::error::Error::posix(Errno::ENOENT, format!("inode {ino} was freed")))?;
    let mut file = File::new(r, flags);
    // Writes through it are the opener's (CAP_FSETID: only root's
    // keep the setuid/setgid bits).
    file.opener = cred.clone();
    Ok(Arc::new(file))
}

/// Open inode `ino` directly, as root, with no checks: what
/// [`Fs::open`](crate::Fs::open) does with an inode number (tools that
/// walk the tree by inode numbers).
fn open_ino(sb: &SuperBlock, ino: u32, flags: OpenFlags) -> Result<Arc<File>> {
    let inode = sb.inode(ino)?;
    if flags.directory && inode.ftype != FileType::Directory {
        return Err(Error::posix(Errno::ENOTDIR, format!("inode {ino} is not a directory")));
    }
    let r = pin::open(&inode, None).ok_or_else(|| Error::posix(Errno::ENOENT, format!("inode {ino} was freed")))?;
    Ok(Arc::new(File::new(r, flags)))
}

/// `open(2)` of `path` (the kernel's `path_openat`): walk it, create a
/// regular file for O_CREAT, check the caller's rights, apply O_TRUNC.
fn open_path(sb: &SuperBlock, path: &[u8], req: &OpenRequest<'_>) -> Result<Arc<File>> {
    // An inode freed between the walk and the open (a rename over the
    // name, an unlink) sends the open back to walk again: the name now
    // leads to another file, or nowhere. Each retry needs another
    // writer to have won the race, so a few are plenty.
    for _ in 0..16 {
        if let Some(f) = open_once(sb, path, req)? {
            return Ok(f);
        }
    }
    Err(Error::posix(
        Errno::ENOENT,
        format!("{}: removed again and again while being opened", show(path)),
    ))
}

/// One attempt of [`open_path`]: `None` when the inode the walk found
/// was freed, or its name taken away, before the open counted itself
/// (see [`open_walked`]).
fn open_once(sb: &SuperBlock, path: &[u8], req: &OpenRequest<'_>) -> Result<Option<Arc<File>>> {
    let (flags, cred) = (req.flags, req.cred);
    let follow = !(flags.nofollow || (flags.create && flags.excl));
    if !flags.create && !flags.trunc {
        // The common open (a lock-free open that writes no shared
        // line): walk, find the thread's pin on
        // (inode, dentry), check the dentry is still cached, done —
        // nothing shared is written when this thread opened the file
        // before (see `vfs::pin`).
        let inode = {
            let g = sb.dcache().pin();
            let d = namei::resolve_in(sb, &g, path, follow)?;
            match open_walked(sb, Some(&g), d)? {
                Some(r) => r,
                None => return Ok(None),
            }
        };
        return finish_open(sb, inode, path, req, false).map(Some);
    }
    let mut created = false;
    let d = match namei::resolve(sb, path, follow) {
        Ok(d) => {
            if flags.create && flags.excl {
                return Err(Error::posix(Errno::EEXIST, format!("{}: file exists", show(path))));
            }
            d
        }
        Err(e) if e.errno() == Errno::ENOENT && flags.create => {
            let (parent, _) = split_last(path);
            let pd = namei::resolve(sb, parent, true)?;
            let dir = sb.inode(pd.ino)?;
            let (dir_mode, dir_gid) = {
                let r = dir.disk.read();
                if !cred.may(&r, MAY_WRITE | MAY_EXEC) {
                    return Err(Error::posix(
                        Errno::EACCES,
                        format!("{}: permission denied (creating in {})", show(path), show(parent)),
                    ));
                }
                (r.base.mode, r.gid())
            };
            // A setgid directory hands its group to new files.
            let gid = if dir_mode & 0o2000 != 0 { dir_gid } else { cred.gid };
            // The caller's rights on the directory were checked above: the
            // file is made by root, owned by the caller.
            let mode = CreateMode {
                perm: req.mode.perm & 0o7777,
                ..req.mode
            };
            match write::create(sb, &NewInode::file(path).mode(mode).owner(cred.uid, gid)) {
                Ok(_) => created = true,
                // Lost a race with another creator: open theirs.
                Err(e) if e.errno() == Errno::EEXIST && !flags.excl => {}
                Err(e) => return Err(e),
            }
            namei::resolve(sb, path, follow)?
        }
        Err(e) => return Err(e),
    };
    // Counted and checked before the truncation below: a walk that
    // lost a race must not truncate the inode number's next owner.
    let Some(inode) = open_walked(sb, None, &d)? else {
        // Ours, just created, renamed over or unlinked already: the
        // retry opens what the name leads to now (or says ENOENT).
        return Ok(None);
    };
    finish_open(sb, inode, path, req, created).map(Some)
}

/// One open of the inode dentry `d` (which a walk just found) names,
/// counted on the calling thread's pin (`vfs::pin`); `None` when the
/// inode was freed or `d` left the dentry cache meanwhile (the caller
/// walks again). `g`: the walk's pin of the dentry cache, when `d` is
/// borrowed under it.
///
/// The race this closes (the pins' stress (now in tests/open_race.rs) read 0 bytes of a 20-byte
/// file 1 run in 3–6 without it): a dentry holds an inode *number*,
/// and numbers are reused at once — ext4 hands out the lowest free one
/// in the group, so the file created right after a free usually gets
/// the number just freed. An opener's walk finds `h0` → inode 17 and is
/// descheduled; a rename over `h0` frees 17 (no open counted on it,
/// every idle pin revoked); the renamer's next write_file creates
/// `tmp` and gets number 17, empty until its write. The opener, back,
/// finds no pin of its own on the new `CachedInode` 17 and makes one:
/// `Pin::new` checks only that 17 is not freed, and it is not — it is
/// the new, still-empty file. The pin said "alive", not "the inode
/// this name named".
///
/// So after the count is taken (which keeps whatever inode it counted
/// from being freed until the open is closed), `d` must still be the
/// cached dentry of its name: unlink and rename take a dying name out
/// of the dentry cache before its inode is freed (`remove_at`,
/// `rename_at`), a dentry taken out never comes back (a new lookup
/// makes a new one; only a rename's source moves, alive), and the
/// check holds `d` (by the pin, and `g`), so no other dentry can have
/// its address. Cached at the check, then, `d`'s inode was not freed
/// before it, so it is the inode counted (the counted one exists only
/// after a free of `d`'s) — and the name led to it at the check: the
/// open takes effect there, and never opens a freed inode, its
/// number's next owner, or what a name renamed over used to be once
/// the rename has completed. The check is reads only (a map lookup
/// and two arc-swap guards, the thread's own debt slots): the common
/// open still writes no shared line. It runs on the thread's cached
/// pin too, though that pin was checked when it was made (so its inode
/// is `d`'s) — the same rule on both paths costs one map probe.
fn open_walked(
    sb: &SuperBlock,
    g: Option<&super::dcache::DcacheGuard<'_>>,
    d: &Arc<super::dcache::Dentry>,
) -> Result<Option<super::pin::OpenRef>> {
    // The thread's pin on (the cached inode of `d.ino`, `d`), if any;
    // looked up while `d` is held, so the addresses are live objects.
    let cached = sb
        .icache()
        .peek(d.ino)
        .and_then(|i| super::pin::reopen(i, Arc::as_ptr(d)));
    let r = match cached {
        Some(r) => r,
        None => {
            let inode = match sb.inode(d.ino) {
                Ok(i) => i,
                // Freed since the walk (its record says deleted).
                Err(e) if e.errno() == Errno::ENOENT => return Ok(None),
                Err(e) => return Err(e),
            };
            match super::pin::open(&inode, Some(d)) {
                Some(r) => r,
                // Freed between the lookup and the count.
                None => return Ok(None),
            }
        }
    };
    let cached_now = match g {
        Some(g) => g.holds(d),
        None => sb.dcache().pin().holds(d),
    };
    if !cached_now {
        // Its pin will never match a walk again (`d` is gone for
        // good): out of the thread's cache, and the open dropped as a
        // close is — the last user of an inode unlinked meanwhile
        // frees it.
        super::pin::uncache(r.pin());
        evict::close_open(sb, r)?;
        return Ok(None);
    }
    Ok(Some(r))
}

/// The checks and O_TRUNC of an open whose walk found `inode` (already
/// counted: an error closes it again).
fn finish_open(
    sb: &SuperBlock,
    inode: super::pin::OpenRef,
    path: &[u8],
    req: &OpenRequest<'_>,
    created: bool,
) -> Result<Arc<File>> {
    let (flags, cred) = (req.flags, req.cred);
    let checked = if flags.nofollow && inode.ftype == FileType::Symlink {
        Err(Error::posix(
            Errno::ELOOP,
            format!("{}: is a symbolic link (O_NOFOLLOW)", show(path)),
        ))
    } else {
        may_open(
            sb,
            &inode,
            flags,
            cred,
            !created && req.check == PermCheck::Engine,
            &|| show(path).to_string(),
        )
        .and_then(|()| {
            if flags.trunc && inode.ftype == FileType::Regular && !created {
                io::truncate_inode(sb, &inode, 0, &Caller::new(cred))?;
            }
            Ok(())
        })
    };
    if let Err(e) = checked {
        // Closed as any open is (an unlink since the count may have
        // left this the inode's last user).
        evict::close_open(sb, inode)?;
        return Err(e);
    }
    let mut file = File::new(inode, flags);
    file.opener = cred.clone();
    Ok(Arc::new(file))
}

/// The kernel's `may_open` for an inode about to be opened with
/// `flags`, after the path walk or the node lookup: ENOTDIR for
/// O_DIRECTORY on a non-directory, EISDIR for writing a directory, the
/// mode bits and ACLs when `check_perm` (not for a file this open just
/// created, nor when the caller checked already), EPERM for writing an
/// immutable inode or an append-only one without O_APPEND (or with
/// O_TRUNC), EROFS for writing a regular file on a read-only volume
/// (devices, fifos and sockets can be written there). `what` names the
/// inode in messages (a path, or "inode N").
pub(crate) fn may_open(
    sb: &SuperBlock,
    inode: &CachedInode,
    flags: OpenFlags,
    cred: &Cred,
    check_perm: bool,
    what: &dyn Fn() -> String,
) -> Result<()> {
    if flags.directory && inode.ftype != FileType::Directory {
        return Err(Error::posix(Errno::ENOTDIR, format!("{}: not a directory", what())));
    }
    let write = flags.access.writes() || flags.trunc;
    if inode.ftype == FileType::Directory && write {
        return Err(Error::posix(Errno::EISDIR, format!("{}: is a directory", what())));
    }
    // What follows reads the record only for a check whose outcome it
    // can change: permission bits for anyone but root (root may read
    // and write anything; open never asks for exec), immutable and
    // append-only for a write or truncation. A read-only open by root
    // takes no lock: a reader lock is a write to the lock word, which
    // every opener of the inode shares (opens write no shared line).
    if !write && (!check_perm || cred.is_root()) {
        return Ok(());
    }
    super::shared::note(2);
    let rec = inode.disk.read();
    if check_perm {
        let mut mask = 0;
        if flags.access.reads() {
            mask |= MAY_READ;
        }
        if write {
            mask |= MAY_WRITE;
        }
        if !cred.may(&rec, mask) {
            return Err(Error::posix(Errno::EACCES, format!("{}: permission denied", what())));
        }
    }
    let f = rec.base.flags;
    if write && f & iflags::IMMUTABLE != 0
        || f & iflags::APPEND != 0 && (flags.trunc || flags.access.writes() && !flags.append)
    {
        return Err(Error::posix(
            Errno::EPERM,
            format!("{}: immutable or append-only", what()),
        ));
    }
    if write && sb.vol().read_only() && inode.ftype == FileType::Regular {
        return Err(Error::posix(Errno::EROFS, format!("{}: read-only filesystem", what())));
    }
    Ok(())
}

/// "/a/b/c" -> ("/a/b", "c"), trailing slashes ignored.
fn split_last(path: &[u8]) -> (&[u8], &[u8]) {
    let mut e = path.len();
    while e > 1 && path[e - 1] == b'/' {
        e -= 1;
    }
    let p = &path[..e];
    match p.iter().rposition(|&b| b == b'/') {
        Some(0) => (b"/", &p[1..]),
        Some(i) => (&p[..i], &p[i + 1..]),
        None => (b"/", p),
    }
}

#[cfg(test)]
mod tests {
    use crate::NewInode;
    use crate::{Cred, OpenFlags, RenameFlags};

    use crate::vfs::mem_fs as fs;

    /// The window the pins' stress (tests/open_race.rs) hit 1 run in 3–6, made to happen on
    /// one thread: a walk finds `/h0` → inode N; before the open counts
    /// itself, a rename over `/h0` frees N and a create reuses N (empty).
    /// The open must not open the new file (`open_walked` says `None`:
    /// walk again) — and then opens what `/h0` is now.
    #[test]
    fn an_open_whose_inode_number_was_reused_walks_again() {
        let fs = fs();
        let root = Cred::root();
        fs.write_file(&NewInode::file(b"/h0").mode(0o644).owner(0, 0), b"old contents")
            .unwrap();
        // The walk's result, held as a walk borrows it.
        let d = fs.resolve(b"/h0").unwrap();
        let n = d.ino;
        fs.write_file(&NewInode::file(b"/tmp").mode(0o644).owner(0, 0), b"new contents")
            .unwrap();
        fs.rename(b"/tmp", b"/h0", RenameFlags::default(), &root).unwrap();
        // The next file gets the lowest free number: the one just freed.
        fs.write_file(&NewInode::file(b"/next").mode(0o644).owner(0, 0), b"")
            .unwrap();
        assert_eq!(fs.stat(b"/next").unwrap().ino, n, "the number was reused");
        assert!(
            super::open_walked(fs.sb(), None, &d).unwrap().is_none(),
            "opened the freed number's next owner through a stale dentry"
        );
        let f = fs.open(b"/h0", OpenFlags::default()).unwrap();
        let mut buf = [0u8; 32];
        let got = fs.pread(&f, 0, &mut buf).unwrap();
        assert_eq!(&buf[..got], b"new contents");
        fs.close_file(f).unwrap();
    }

    /// The thread's cached pin is checked too: with `/h0` open on this
    /// thread (its pin busy), a rename over the name keeps the old inode
    /// as an orphan; an open whose walk found the old dentry before the
    /// rename must not open it once the rename is done (`None`), and the
    /// old inode is freed at its last close.
    #[test]
    fn a_cached_pin_on_a_name_renamed_over_is_not_reused() {
        let fs = fs();
        let root = Cred::root();
        let free0 = fs.statfs().unwrap().files_free;
        fs.write_file(&NewInode::file(b"/h0").mode(0o644).owner(0, 0), b"old contents")
            .unwrap();
        let held = fs.open(b"/h0", OpenFlags::default()).unwrap();
        let d = fs.resolve(b"/h0").unwrap();
        fs.write_file(&NewInode::file(b"/tmp").mode(0o644).owner(0, 0), b"new contents")
            .unwrap();
        fs.rename(b"/tmp", b"/h0", RenameFlags::default(), &root).unwrap();
        assert_eq!(fs.statfs().unwrap().files_free, free0 - 2, "the old /h0 is open: kept");
        assert!(
            super::open_walked(fs.sb(), None, &d).unwrap().is_none(),
            "reopened a name renamed over"
        );
        let mut buf = [0u8; 32];
        let got = fs.pread(&held, 0, &mut buf).unwrap();
        assert_eq!(&buf[..got], b"old contents");
        fs.close_file(held).unwrap();
        assert_eq!(fs.statfs().unwrap().files_free, free0 - 1, "freed at its last close");
    }

    #[test]
    fn split_last_component() {
        assert_eq!(super::split_last(b"/a/b/c"), (&b"/a/b"[..], &b"c"[..]));
        assert_eq!(super::split_last(b"/c//"), (&b"/"[..], &b"c"[..]));
        assert_eq!(super::split_last(b"c"), (&b"/"[..], &b"c"[..]));
    }
}

#[cfg(test)]
mod tests_by_inode {
    use crate::ext4::orphan;
    use crate::vfs::request::PermCheck;
    use crate::{Cred, Errno, OpenFlags};
    use crate::{NewInode, OpenRequest, Target};

    use crate::vfs::mem_fs as fs;

    const RDWR: i32 = crate::vfs::file::O_RDWR;

    #[test]
    fn create_open_owns_opens_and_races_like_open_2() {
        let fs = fs();
        fs.setattr(
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
        let create = |bits: i32, mode: u16, check: PermCheck| {
            let req = OpenRequest::new(OpenFlags::from_bits(bits | crate::vfs::file::O_CREAT))
                .mode(mode)
                .cred(&user)
                .check(check);
            fs.open_as(Target::at(2, b"f"), &req)
        };
        let f = create(RDWR, 0o400, PermCheck::Engine).unwrap();
        let st = fs.stat(f.inode.ino).unwrap();
        assert_eq!((st.uid, st.gid, st.perm()), (1000, 1000, 0o400));
        fs.pwrite(&f, 0, b"data").unwrap();
        fs.close_file(f).unwrap();
        // It exists now: O_EXCL fails; without it the existing file is
        // opened with a permission check (0400: no writing).
        let e = create(RDWR | crate::vfs::file::O_EXCL, 0o600, PermCheck::Done).unwrap_err();
        assert_eq!(e.errno(), Errno::EEXIST);
        let e = create(RDWR, 0o600, PermCheck::Done).unwrap_err();
        assert_eq!(e.errno(), Errno::EACCES);
        let f = create(0, 0o600, PermCheck::Done).unwrap();
        let mut b = [0u8; 8];
        assert_eq!(fs.pread(&f, 0, &mut b).unwrap(), 4);
    }

    #[test]
    fn open_by_inode_checks_truncates_and_tracks_privilege() {
        let fs = fs();
        let st = fs
            .write_file(&NewInode::file(b"/s").mode(0o4666).owner(0, 0), b"0123456789")
            .unwrap();
        let user = Cred::user(1000, 1000);
        // PermCheck::Engine: mode bits decide; Done: the caller did.
        fs.setattr(
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
            fs.open_as(st.ino, &OpenRequest::new(rw).cred(&user).check(PermCheck::Engine))
                .unwrap_err()
                .errno(),
            Errno::EACCES
        );
        let f = fs
            .open_as(st.ino, &OpenRequest::new(rw).cred(&user).check(PermCheck::Done))
            .unwrap();
        // A non-root opener's write clears setuid (file_remove_privs).
        fs.pwrite(&f, 0, b"x").unwrap();
        assert_eq!(fs.stat(st.ino).unwrap().perm() & 0o7000, 0);
        fs.close_file(f).unwrap();
        // O_TRUNC empties it; a directory cannot be opened for writing.
        let t = OpenFlags::from_bits(RDWR | crate::vfs::file::O_TRUNC);
        fs.open_as(
            st.ino,
            &OpenRequest::new(t).cred(&Cred::root()).check(PermCheck::Engine),
        )
        .unwrap();
        assert_eq!(fs.stat(st.ino).unwrap().size, 0);
        assert_eq!(
            fs.open_as(2, &OpenRequest::new(rw).cred(&Cred::root()).check(PermCheck::Engine))
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
        let tmpfile = |fs: &crate::Fs, dir: u32, req: &OpenRequest<'_>, linkable: bool| {
            let flags = OpenFlags {
                excl: !linkable,
                ..req.flags
            };
            let f = fs.tmpfile_open(dir, &OpenRequest { flags, ..*req })?;
            Ok::<_, crate::Error>((fs.stat(f.inode.ino)?, f))
        };
        // Never linked: an orphan while open, freed by its close.
        let (st, f) = tmpfile(&fs, 2, &OpenRequest::new(rw).mode(0o600).cred(&root), true).unwrap();
        assert_eq!((st.nlink, st.ftype, st.perm()), (0, crate::FileType::Regular, 0o600));
        assert_eq!(orphan::chain(fs.volume()).unwrap(), vec![st.ino]);
        assert_eq!(fs.statfs().unwrap().files_free, free0 - 1);
        fs.pwrite(&f, 0, &[7u8; 10000]).unwrap();
        fs.fsync_inode(&f.inode, crate::SyncLevel::All).unwrap();
        // The directory did not change.
        assert!(fs.read_dir(2).unwrap().iter().all(|e| e.ino != st.ino));
        fs.close_file(f).unwrap();
        assert!(orphan::chain(fs.volume()).unwrap().is_empty());
        assert_eq!(fs.statfs().unwrap().files_free, free0);

        // Linked: off the orphan list, a name, data kept, alive after close.
        let (st, f) = tmpfile(&fs, 2, &OpenRequest::new(rw).mode(0o640).cred(&root), true).unwrap();
        fs.pwrite(&f, 0, b"tmpfile data").unwrap();
        let linked = fs.link(st.ino, Target::at(2, b"named"), &root).unwrap();
        assert_eq!((linked.ino, linked.nlink), (st.ino, 1));
        assert!(orphan::chain(fs.volume()).unwrap().is_empty());
        // Only the first link is the tmpfile's: after unlinking the name
        // again it is a plain unlinked open file, which cannot be relinked.
        fs.unlink(Target::at(2, b"named"), &root).unwrap();
        assert_eq!(orphan::chain(fs.volume()).unwrap(), vec![st.ino]);
        let e = fs.link(st.ino, Target::at(2, b"again"), &root).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOENT);
        fs.close_file(f).unwrap();
        assert_eq!(fs.statfs().unwrap().files_free, free0);

        let (st, f) = tmpfile(&fs, 2, &OpenRequest::new(rw).mode(0o640).cred(&root), true).unwrap();
        fs.pwrite(&f, 0, b"kept").unwrap();
        fs.link(st.ino, Target::at(2, b"kept"), &root).unwrap();
        fs.close_file(f).unwrap();
        let (ino, _) = fs.lookup_at(2, b"kept").unwrap().unwrap();
        assert_eq!(ino, st.ino);
        let g = fs
            .open_as(
                ino,
                &OpenRequest::new(OpenFlags::default())
                    .cred(&root)
                    .check(PermCheck::Engine),
            )
            .unwrap();
        let mut b = [0u8; 8];
        assert_eq!(fs.pread(&g, 0, &mut b).unwrap(), 4);
        assert_eq!(&b[..4], b"kept");
        fs.close_file(g).unwrap();

        // O_EXCL: never linkable (ENOENT, as vfs_link without I_LINKABLE).
        let (st, f) = tmpfile(&fs, 2, &OpenRequest::new(rw).mode(0o600).cred(&root), false).unwrap();
        let e = fs.link(st.ino, Target::at(2, b"excl"), &root).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOENT);
        fs.close_file(f).unwrap();
        assert!(orphan::chain(fs.volume()).unwrap().is_empty());
        assert_eq!(fs.statfs().unwrap().files_free, free0 - 1);

        // The directory's write permission is needed, as for a create.
        let user = Cred::user(1000, 1000);
        let e = fs
            .tmpfile_open(2, &OpenRequest::new(rw).mode(0o600).cred(&user))
            .unwrap_err();
        assert_eq!(e.errno(), Errno::EACCES);
    }
}
