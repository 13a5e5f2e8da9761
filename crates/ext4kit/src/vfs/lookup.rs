//! Lookup of one name in a directory given by inode number: what a frontend
//! that already holds the parent (the FUSE server: the kernel walks paths and
//! sends `LOOKUP(parent inode, name)`) needs instead of a path walk.
//!
//! The dentry cache is consulted first (lock-free read, no reference taken,
//! as in the path walk). On a miss the directory is searched on disk
//! (htree or linear) under the directory's shared lock. The result is not
//! inserted into the dentry cache: an insert needs the parent's dentry,
//! which a by-inode caller does not have, and the kernel in front of a FUSE
//! mount keeps its own dentry cache, so ours would be a second copy.

use ext4kit_format::dirent::NAME_MAX;
use ext4kit_format::inode::FileType;

use super::namei::{self, show, with_path};
use super::super_block::SuperBlock;
use super::target::{Named, Target};
use crate::error::{Errno, Error, Result};

/// The work of [`Fs::lookup_at`](crate::Fs::lookup_at).
pub(crate) fn lookup_at(sb: &SuperBlock, dir_ino: u32, name: &[u8]) -> Result<Option<(u32, FileType)>> {
    if name.len() > NAME_MAX {
        return Err(Error::posix(
            Errno::ENAMETOOLONG,
            format!("{}: name too long", show(name)),
        ));
    }
    if name.is_empty() || name.contains(&b'/') {
        return Err(Error::posix(
            Errno::EINVAL,
            format!("{:?}: not a single path component", show(name)),
        ));
    }
    let cached = sb.dcache().with(dir_ino, name, |d| (d.ino, d.ftype));
    let (ino, ftype) = match cached {
        Some(hit) => hit,
        None => namei::lookup_disk(sb, dir_ino, name)?.unwrap_or((0, None)),
    };
    if ino == 0 {
        return Ok(None);
    }
    let ftype = match ftype {
        Some(t) => t,
        // No `filetype` feature: the type comes from the inode.
        None => sb.inode(ino)?.ftype,
    };
    Ok(Some((ino, ftype)))
}

/// The inode `t` names: a path is walked (its final symlink followed as
/// `t` says), a name is looked up in its directory (ENOENT when absent).
pub(crate) fn target_ino(sb: &SuperBlock, t: Target<'_>) -> Result<u32> {
    match t.named() {
        Named::Path(p) => {
            // Walked under one pin of the dentry cache: the inode number is
            // all that is wanted, so no reference is taken on the dentry.
            let g = sb.dcache().pin();
            Ok(namei::resolve_in(sb, &g, p, t.follows())?.ino)
        }
        Named::At(dir, name) => match lookup_at(sb, dir, name)? {
            Some((ino, _)) => Ok(ino),
            None => Err(Error::posix(
                Errno::ENOENT,
                format!("{}: no such file or directory", show(name)),
            )),
        },
        Named::Ino(ino) => Ok(ino),
    }
}

/// `f` on the inode `t` names; a path names itself in `f`'s errors.
pub(crate) fn on_inode<T>(sb: &SuperBlock, t: Target<'_>, f: impl FnOnce(u32) -> Result<T>) -> Result<T> {
    let ino = target_ino(sb, t)?;
    f(ino).map_err(|e| annotate(e, t))
}

/// The directory and the name of the entry `t` names: a path's parent is
/// walked (following symlinks); an inode number names no entry (EINVAL).
pub(crate) fn entry<'a>(sb: &SuperBlock, t: Target<'a>) -> Result<(u32, &'a [u8])> {
    match t.named() {
        Named::Path(p) => {
            let (parent, name) = namei::split(p)?;
            let g = sb.dcache().pin();
            Ok((namei::resolve_in(sb, &g, parent, true)?.ino, name))
        }
        Named::At(dir, name) => Ok((dir, name)),
        Named::Ino(ino) => Err(Error::posix(
            Errno::EINVAL,
            format!("inode {ino}: an inode number names no directory entry"),
        )),
    }
}

/// `f` on the directory and name `t` names; a path names itself in
/// `f`'s errors.
pub(crate) fn on_entry<T>(sb: &SuperBlock, t: Target<'_>, f: impl FnOnce(u32, &[u8]) -> Result<T>) -> Result<T> {
    let (dir, name) = entry(sb, t)?;
    f(dir, name).map_err(|e| annotate(e, t))
}

/// Name a path target in a POSIX error's message (`namei::with_path`).
pub(crate) fn annotate(e: Error, t: Target<'_>) -> Error {
    match t.path_shown() {
        Some(p) => with_path(e, p),
        None => e,
    }
}

#[cfg(test)]
mod tests {
    use crate::Errno;
    use crate::NewInode;

    #[test]
    fn finds_names_by_parent_inode() {
        let fs = crate::vfs::mem_fs();
        let st = fs
            .write_file(&NewInode::file(b"/hello").mode(0o644).owner(0, 0), b"hi")
            .unwrap();
        let (ino, ft) = fs.lookup_at(2, b"hello").unwrap().unwrap();
        assert_eq!((ino, ft), (st.ino, crate::FileType::Regular));
        // Twice: the second may come from the dentry cache.
        fs.stat(b"/hello").unwrap();
        assert_eq!(fs.lookup_at(2, b"hello").unwrap().unwrap().0, st.ino);
        assert_eq!(fs.lookup_at(2, b"..").unwrap().unwrap().0, 2);
        assert!(fs.lookup_at(2, b"missing").unwrap().is_none());
        assert_eq!(fs.lookup_at(st.ino, b"x").unwrap_err().errno(), Errno::ENOTDIR);
        assert_eq!(fs.lookup_at(2, &[b'a'; 256]).unwrap_err().errno(), Errno::ENAMETOOLONG);
        assert_eq!(fs.lookup_at(2, b"a/b").unwrap_err().errno(), Errno::EINVAL);
    }
}
