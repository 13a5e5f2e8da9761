//! The extended-attribute calls (`setxattr`, `removexattr`, `getxattr`,
//! `listxattr`) with the Linux permission rules, by inode number and by
//! path.
//!
//! Permissions (the VFS's `xattr_permission` plus the handlers):
//! * writes to immutable or append-only inodes: EPERM;
//! * `trusted.*`: root only (writes EPERM; reads ENODATA and the names are
//!   not listed for others);
//! * `security.*`: anyone may read; writes need root (`cap_inode_setxattr`);
//! * `user.*`: only on regular files and directories (else writes EPERM,
//!   reads ENODATA); read or write permission on the inode (EACCES); in a
//!   sticky directory only the owner or root may write;
//! * `system.posix_acl_*`: set or removed by the owner or root (EPERM), not
//!   on symlinks (EOPNOTSUPP); a default ACL only on directories (EACCES).
//!   Setting the access ACL also sets the mode's permission bits from it,
//!   and an ACL equivalent to the mode is not stored at all
//!   (`posix_acl_update_mode`), as the kernel does.
//!
//! Every change sets ctime. Locking: the inode's write lock is held across
//! the check, the change and publishing the new record.

use ext4kit_format::inode::{flags, FileType, Inode, TimeField};
use ext4kit_format::xattr::{
    INDEX_POSIX_ACL_ACCESS, INDEX_POSIX_ACL_DEFAULT, INDEX_SECURITY, INDEX_TRUSTED, INDEX_USER,
};

use super::acl;
use super::acl::acl_mode;
use super::cred::{Cred, MAY_READ, MAY_WRITE};
use super::icache::CachedInode;
use super::lookup;
use super::namei::show;
use super::super_block::SuperBlock;
use super::syncmode;
use super::target::Target;
use crate::error::{Errno, Error, Result};
use crate::ext4::xattr_write::{self, xattr_key, XattrChange, XATTR_REPLACE};
use crate::ext4::{inode, release_check, xattr};

const S_ISGID: u16 = 0o2000;

/// Check `cred` may read (`write` false) or change attribute index
/// `index` of `inode`.
fn xattr_permission(
    sb: &SuperBlock,
    ci: &CachedInode,
    inode: &Inode,
    index: u8,
    write: bool,
    cred: &Cred,
) -> Result<()> {
    let ino = ci.ino;
    let deny = |errno, why: &str| Err(Error::posix(errno, format!("inode {ino}: {why}")));
    if write && inode.base.flags & (flags::IMMUTABLE | flags::APPEND) != 0 {
        return deny(Errno::EPERM, "immutable or append-only inode");
    }
    match index {
        INDEX_TRUSTED if !cred.is_root() => {
            if write {
                deny(Errno::EPERM, "trusted.* attributes need root")
            } else {
                deny(Errno::ENODATA, "no such attribute")
            }
        }
        INDEX_TRUSTED => Ok(()),
        INDEX_SECURITY if write && !cred.is_root() => deny(Errno::EPERM, "security.* attributes need root"),
        INDEX_SECURITY => Ok(()),
        INDEX_POSIX_ACL_ACCESS | INDEX_POSIX_ACL_DEFAULT if write => {
            if ci.ftype == FileType::Symlink {
                return deny(Errno::EOPNOTSUPP, "symbolic links have no ACLs");
            }
            if !cred.owner_or_root(inode) {
                return deny(Errno::EPERM, "only the owner may change ACLs");
            }
            Ok(())
        }
        INDEX_POSIX_ACL_ACCESS | INDEX_POSIX_ACL_DEFAULT => Ok(()),
        INDEX_USER => {
            if !matches!(ci.ftype, FileType::Regular | FileType::Directory) {
                return if write {
                    deny(Errno::EPERM, "user.* attributes only on files and directories")
                } else {
                    deny(Errno::ENODATA, "no such attribute")
                };
            }
            if write && ci.ftype == FileType::Directory && inode.base.mode & 0o1000 != 0 && !cred.owner_or_root(inode) {
                return deny(Errno::EPERM, "sticky directory");
            }
            let mask = if write { MAY_WRITE } else { MAY_READ };
            if acl::permission(sb, ino, inode, mask, cred)? {
                Ok(())
            } else {
                deny(Errno::EACCES, "permission denied")
            }
        }
        _ => deny(Errno::EOPNOTSUPP, "namespace not supported"),
    }
}

/// The work of [`Fs::setxattr`](crate::Fs::setxattr).
pub(crate) fn setxattr(
    sb: &SuperBlock,
    t: Target<'_>,
    name: &[u8],
    value: &[u8],
    flags: u32,
    cred: &Cred,
) -> Result<()> {
    lookup::on_inode(sb, t, |ino| {
        sb.retry_enospc(|| change_xattr(sb, ino, name, Some(value), flags, cred))
    })
}

/// The work of [`Fs::removexattr`](crate::Fs::removexattr).
pub(crate) fn removexattr(sb: &SuperBlock, t: Target<'_>, name: &[u8], cred: &Cred) -> Result<()> {
    lookup::on_inode(sb, t, |ino| change_xattr(sb, ino, name, None, XATTR_REPLACE, cred))
}

fn change_xattr(sb: &SuperBlock, ino: u32, name: &[u8], value: Option<&[u8]>, flags: u32, cred: &Cred) -> Result<()> {
    let (index, _) = xattr_key(name)?;
    let ci = sb.inode(ino)?;
    let mut rec = ci.disk.write();
    xattr_permission(sb, &ci, &rec, index, true, cred)?;
    let mut new = rec.clone();
    let mut value = value;
    let mut flags = flags;
    if let Some(v) = value {
        if index == INDEX_POSIX_ACL_DEFAULT && ci.ftype != FileType::Directory {
            return Err(Error::posix(
                Errno::EACCES,
                format!("inode {ino}: default ACLs only on directories"),
            ));
        }
        let is_acl = matches!(index, INDEX_POSIX_ACL_ACCESS | INDEX_POSIX_ACL_DEFAULT);
        if is_acl && v.len() == 4 {
            // An ACL with no entries is no ACL (posix_acl_from_xattr gives NULL).
            value = None;
            flags &= !XATTR_REPLACE;
        } else if index == INDEX_POSIX_ACL_ACCESS {
            let (perm, equiv) =
                acl_mode(v).ok_or_else(|| Error::posix(Errno::EINVAL, format!("inode {ino}: invalid POSIX ACL")))?;
            let mut mode = (new.base.mode & !0o777) | perm;
            if !cred.is_root() && !cred.in_group(new.gid()) {
                mode &= !S_ISGID;
            }
            new.base.mode = mode;
            if equiv {
                value = None;
                flags &= !XATTR_REPLACE;
            }
        }
    }
    // The xattr block may be rewritten, copied or freed: checked while
    // nothing has changed (release_check.rs).
    release_check::xattr_change(sb.vol(), ino, &new)?;
    let mut h = sb.vol().begin()?;
    match xattr_write::set(sb.vol(), &mut h, ino, &mut new, XattrChange { name, value, flags }) {
        // Dropping an ACL that is not there (an equivalent or empty ACL).
        Err(Error::Posix {
            errno: Errno::ENODATA, ..
        }) if flags & XATTR_REPLACE == 0 && value.is_none() => {}
        r => r?,
    }
    new.set_time(TimeField::Ctime, sb.now());
    inode::write(sb.vol(), &mut h, ino, &new)?;
    h.commit()?;
    *rec = new;
    let flags = rec.base.flags;
    drop(rec);
    // ext4_xattr_set: a synchronous inode's change is durable now.
    syncmode::sync_if_needed(sb, &ci, flags)
}

/// [`getxattr`] on inode `ino`.
fn getxattr_ino(sb: &SuperBlock, ino: u32, name: &[u8], cred: &Cred) -> Result<Vec<u8>> {
    let (index, _) = xattr_key(name)?;
    let ci = sb.inode(ino)?;
    let rec = ci.disk.read();
    xattr_permission(sb, &ci, &rec, index, false, cred)?;
    xattr::list(sb.vol(), ino, &rec)?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
        .ok_or_else(|| Error::posix(Errno::ENODATA, format!("inode {ino}: no attribute {}", show(name))))
}

/// [`listxattr`] on inode `ino`.
fn listxattr_ino(sb: &SuperBlock, ino: u32, cred: &Cred) -> Result<Vec<Vec<u8>>> {
    Ok(xattrs_ino(sb, ino)?
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| cred.is_root() || !n.starts_with(b"trusted."))
        .collect())
}

/// The work of [`Fs::getxattr`](crate::Fs::getxattr).
pub(crate) fn getxattr(sb: &SuperBlock, t: Target<'_>, name: &[u8], cred: &Cred) -> Result<Vec<u8>> {
    lookup::on_inode(sb, t, |ino| getxattr_ino(sb, ino, name, cred))
}

/// The work of [`Fs::listxattr`](crate::Fs::listxattr).
pub(crate) fn listxattr(sb: &SuperBlock, t: Target<'_>, cred: &Cred) -> Result<Vec<Vec<u8>>> {
    lookup::on_inode(sb, t, |ino| listxattr_ino(sb, ino, cred))
}

/// Every extended attribute of the inode `t` names, with its value and
/// without permission checks; a path's final symlink is not followed
/// ([`Fs::xattrs`](crate::Fs::xattrs)).
pub(crate) fn xattrs(sb: &SuperBlock, t: Target<'_>) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    lookup::on_inode(sb, t.nofollow(), |ino| xattrs_ino(sb, ino))
}

/// Every extended attribute of inode `ino`, without permission checks.
fn xattrs_ino(sb: &SuperBlock, ino: u32) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let i = sb.inode(ino)?;
    let disk = i.disk.read();
    xattr::list(sb.vol(), ino, &disk)
}
