//! Path walk (the kernel's `namei.c`, RCU-walk flavour).
//!
//! Each component is looked up in the dentry cache by (directory inode,
//! name) with a lock-free read; the intermediate dentry is *borrowed* from
//! the cache for the duration of that step — no lock and no reference is
//! taken on it. Only on a cache miss does the walk go to disk (ext4 lookup
//! through the htree), insert a positive or negative dentry, and continue.
//! [`Fs::resolve`](crate::Fs::resolve) returns the final dentry with one reference;
//! `resolve_in` lends it under the caller's pin of the cache instead, which
//! is how `open` finds the thread's pin on it without a shared write.
//!
//! Symlinks are followed (at most 40 in one walk, ELOOP beyond) for every
//! component but the last, and for the last when asked to follow.

use std::borrow::Cow;
use std::sync::Arc;

use ext4kit_format::dirent::NAME_MAX;
use ext4kit_format::inode::FileType;

use super::dcache::{DcacheGuard, Dentry};
use super::super_block::SuperBlock;
use super::target::{Named, Target};
use crate::error::{Errno, Error, Result};
use crate::ext4::{dir, symlink};

/// Most symlinks followed in one walk (Linux `MAXSYMLINKS`).
pub const MAX_SYMLINKS: usize = 40;
/// Longest path accepted (Linux `PATH_MAX`).
pub const PATH_MAX: usize = 4096;

/// The work of [`Fs::resolve`](crate::Fs::resolve).
pub(crate) fn resolve(sb: &SuperBlock, path: &[u8], follow: bool) -> Result<Arc<Dentry>> {
    let g = sb.dcache().pin();
    let d = resolve_in(sb, &g, path, follow)?;
    // The caller's reference: an increment now, a decrement at its drop.
    super::shared::note(2);
    Ok(d.clone())
}

/// [`Fs::resolve`] without taking a reference on the result either:
/// the dentry is borrowed under `g`, the caller's pin of the dentry
/// cache (epoch-protected, like every dentry the walk passes), which is
/// what lets `open` find its pin with no shared write (`vfs::pin`).
pub(crate) fn resolve_in<'g>(
    sb: &'g SuperBlock,
    g: &'g DcacheGuard<'_>,
    path: &[u8],
    follow: bool,
) -> Result<&'g Arc<Dentry>> {
    if path.len() >= PATH_MAX {
        return Err(Error::posix(
            Errno::ENAMETOOLONG,
            format!("{}: path too long", show(path)),
        ));
    }
    let root = sb.dcache().root();
    let mut links = 0usize;
    // Component sources, innermost last: the path itself (borrowed, so a
    // walk without symlinks allocates nothing for components), then the
    // target of each symlink being followed.
    // Both vectors are inline for the common depths: a walk that fits
    // allocates nothing (it was two allocations per path-named call).
    let mut frames: Frames<'_> = smallvec::smallvec![(Cow::Borrowed(path), 0)];
    // The directories walked through, root first (for ".." and so that
    // the parent of a new dentry is at hand without a lookup).
    let mut stack: smallvec::SmallVec<[&'g Arc<Dentry>; 16]> = smallvec::SmallVec::new();
    stack.push(root);
    // Components are copied into a stack buffer: no allocation per step.
    let mut name_buf = [0u8; NAME_MAX + 1];
    while let Some((len, last)) = next_component(&mut frames, &mut name_buf) {
        if len > NAME_MAX {
            return Err(Error::posix(
                Errno::ENAMETOOLONG,
                format!("{}: name too long", show(path)),
            ));
        }
        let comp = &name_buf[..len];
        let cur = *stack.last().unwrap_or(&root);
        if cur.ftype != Some(FileType::Directory) {
            return Err(Error::posix(Errno::ENOTDIR, format!("{}: not a directory", show(path))));
        }
        if comp == b"." {
            continue;
        }
        if comp == b".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let next = match g.get(cur.ino, comp) {
            Some(d) => d,
            // The dentry goes in under the directory's shared lock, with
            // the lookup it records: writers change a directory and
            // then its dentries under the exclusive side, so what goes
            // in here is never older than the directory. Inserted after
            // the lock was dropped, a lookup's result could land after
            // an unlink's dentry removal (caching a name that is gone)
            // or after a create's (hiding one that exists) — until
            // evicted.
            None => lookup_disk_with(sb, cur.ino, comp, |hit| {
                let (ino, ft) = hit.unwrap_or((0, None));
                let ft = match (ino, ft) {
                    (0, _) => None,
                    (_, Some(t)) => Some(t),
                    // No filetype feature: the type comes from the inode.
                    (i, None) => Some(sb.icache().get(sb.vol(), i)?.ftype),
                };
                Ok(g.insert(cur, comp, ino, ft))
            })?,
        };
        if !next.is_positive() {
            return Err(Error::posix(
                Errno::ENOENT,
                format!("{}: no such file or directory", show(path)),
            ));
        }
        if next.ftype == Some(FileType::Symlink) && (!last || follow) {
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(Error::posix(
                    Errno::ELOOP,
                    format!("{}: too many levels of symbolic links", show(path)),
                ));
            }
            let target = read_link_ino(sb, next.ino)?;
            if target.is_empty() {
                return Err(Error::posix(Errno::ENOENT, format!("{}: empty symlink", show(path))));
            }
            if target.first() == Some(&b'/') {
                stack.truncate(1);
            }
            frames.push((Cow::Owned(target), 0));
            continue;
        }
        stack.push(next);
    }
    Ok(*stack.last().unwrap_or(&root))
}

/// Look a name up on disk in directory inode `dir_ino`.
pub(crate) fn lookup_disk(sb: &SuperBlock, dir_ino: u32, name: &[u8]) -> Result<Option<(u32, Option<FileType>)>> {
    lookup_disk_with(sb, dir_ino, name, Ok)
}

/// [`lookup_disk`], with `then` run on the result while the
/// directory's shared lock is still held (no create, unlink or rename
/// in it can come between).
pub(crate) fn lookup_disk_with<R>(
    sb: &SuperBlock,
    dir_ino: u32,
    name: &[u8],
    then: impl FnOnce(Option<(u32, Option<FileType>)>) -> Result<R>,
) -> Result<R> {
    let dir = sb.icache().get(sb.vol(), dir_ino)?;
    if dir.ftype != FileType::Directory {
        return Err(Error::posix(
            Errno::ENOTDIR,
            format!("inode {dir_ino} is not a directory"),
        ));
    }
    // Shared side of the directory lock held across the lookup instead of
    // copying the record (the copy allocated on every dcache miss). The
    // map is taken under the lock: a growing insert changes record and
    // map together under the writer side.
    let inode = dir.disk.read();
    let map = dir.block_map_locked(sb.vol(), &inode)?;
    let hit = dir::lookup(
        sb.vol(),
        crate::ext4::DirRef {
            ino: dir_ino,
            inode: &inode,
            map: &map,
        },
        name,
    )?;
    then(hit)
}

/// Component sources of a walk: the path, then each symlink target being
/// followed (innermost last).
type Frames<'a> = smallvec::SmallVec<[(Cow<'a, [u8]>, usize); 2]>;

/// The next non-empty component across the frames, and whether it is the
/// last one of the whole walk.
/// The component is copied into `out` (truncated past its size; the
/// returned length is the real one, so callers can reject long names).
fn next_component(frames: &mut Frames<'_>, out: &mut [u8]) -> Option<(usize, bool)> {
    loop {
        let (buf, pos) = frames.last_mut()?;
        let rest = &buf[*pos..];
        let skip = rest.iter().take_while(|&&b| b == b'/').count();
        let start = *pos + skip;
        if start >= buf.len() {
            frames.pop();
            continue;
        }
        let len = buf[start..]
            .iter()
            .position(|&b| b == b'/')
            .unwrap_or(buf.len() - start);
        let n = len.min(out.len());
        out[..n].copy_from_slice(&buf[start..start + n]);
        *pos = start + len;
        let last = frames.iter().all(|(b, p)| b[*p..].iter().all(|&c| c == b'/'));
        return Some((len, last));
    }
}

/// Split "/a/b/c" into ("/a/b", "c"), ignoring trailing slashes.
pub(crate) fn split(path: &[u8]) -> Result<(&[u8], &[u8])> {
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

/// Paths in messages: lossy UTF-8.
pub(crate) fn show(p: &[u8]) -> String {
    let s = String::from_utf8_lossy(p);
    if s.is_empty() {
        "/".into()
    } else {
        s.into_owned()
    }
}

/// Name the path a caller gave in a POSIX error's message: the path
/// targets of every call use this (`lookup::annotate`), so a message names the
/// path once, replacing the bare final name the inode-level call put first.
pub(crate) fn with_path(e: Error, path: &[u8]) -> Error {
    match e {
        Error::Posix { errno, msg } => {
            let shown = show(path);
            if msg.starts_with(&*shown) {
                return Error::posix(errno, msg);
            }
            let name = path.rsplit(|&b| b == b'/').find(|c| !c.is_empty()).unwrap_or(path);
            let rest = msg.strip_prefix(&format!("{}: ", show(name))).unwrap_or(&msg);
            Error::posix(errno, format!("{shown}: {rest}"))
        }
        e => e,
    }
}

/// The dentry of the path `t` names ([`Fs::resolve`](crate::Fs::resolve)).
pub(crate) fn resolve_target(sb: &SuperBlock, t: Target<'_>) -> Result<Arc<Dentry>> {
    match t.named() {
        Named::Path(p) => resolve(sb, p, t.follows()),
        _ => Err(Error::posix(Errno::EINVAL, "only a path has a dentry to walk to")),
    }
}

/// Target of symlink inode `ino` (`vfs_readlink`).
pub(crate) fn read_link_ino(sb: &SuperBlock, ino: u32) -> Result<Vec<u8>> {
    let i = sb.inode(ino)?;
    if i.ftype != FileType::Symlink {
        return Err(Error::posix(
            Errno::EINVAL,
            format!("inode {ino} is not a symbolic link"),
        ));
    }
    let map = i.block_map(sb.vol())?;
    let disk = i.disk.read();
    symlink::read(sb.vol(), ino, &disk, &map)
}
