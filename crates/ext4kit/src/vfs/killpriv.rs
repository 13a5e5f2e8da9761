//! Clearing setuid, setgid and file capabilities when a file changes: the
//! rule of the kernel's `file_remove_privs` (writes, fallocate),
//! `do_truncate` (truncate, ftruncate, O_TRUNC) and `chown_common`
//! (chown), written once here and called by those paths (io.rs, attr.rs),
//! so every frontend gets it from the engine.
//!
//! The rules (fs/attr.c and fs/inode.c, Linux 6.2 and later):
//!
//! - a change of a regular file's data or size by a caller without
//!   CAP_FSETID clears S_ISUID, and S_ISGID when group execute is set or
//!   the caller is not in the file's group (`setattr_should_drop_suidgid`
//!   → `setattr_should_drop_sgid`); a caller with CAP_FSETID keeps both;
//! - a chown of anything but a directory clears S_ISUID whoever calls
//!   (`ATTR_KILL_SUID`), and S_ISGID by the same group rule, where
//!   CAP_FSETID counts as membership (`in_group_or_capable`);
//! - `security.capability` is removed by every such change, root's
//!   included (`security_inode_need_killpriv` → `cap_inode_killpriv`).
//!
//! Locking: the callers hold the inode's write lock (the `i_rwsem`
//! analogue) from the check to the change they make, so the bits are
//! cleared by the same change that triggers it.

use ext4kit_format::inode::Inode;
use ext4kit_format::xattr::XATTR_MAGIC;

use super::cred::{Caller, Cred};
use super::icache::{CachedInode, DIRTY_TIME};
use super::super_block::SuperBlock;
use crate::error::Result;
use crate::ext4::transaction::Handle;
use crate::ext4::xattr_write::{self, XattrChange, XATTR_REPLACE};
use crate::ext4::{inode, release_check, xattr};

/// The attribute name of file capabilities.
pub const CAPABILITY: &[u8] = b"security.capability";

const S_IFMT: u16 = 0o170000;
const S_IFREG: u16 = 0o100000;
const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_IXGRP: u16 = 0o0010;

/// `setattr_should_drop_sgid`: S_ISGID of a file with `mode` owned by group
/// `gid` goes when group execute is set, or when `in_group_or_capable`
/// says the caller is neither in that group nor holds CAP_FSETID. Returns
/// the bit to clear (0: none).
pub(crate) fn sgid_to_drop(mode: u16, gid: u32, in_group_or_capable: impl FnOnce(u32) -> bool) -> u16 {
    if mode & S_ISGID == 0 {
        0
    } else if mode & S_IXGRP != 0 || !in_group_or_capable(gid) {
        S_ISGID
    } else {
        0
    }
}

/// `setattr_should_drop_suidgid`: the bits a change of the data or size of
/// a file with `mode`, group `gid`, by `caller` clears (0: none).
pub(crate) fn suidgid_to_drop(mode: u16, gid: u32, caller: &Caller<'_>) -> u16 {
    if caller.fsetid || mode & S_IFMT != S_IFREG || mode & (S_ISUID | S_ISGID) == 0 {
        return 0;
    }
    (mode & S_ISUID) | sgid_to_drop(mode, gid, |g| caller.in_group(g))
}

/// The bits a chown (owner or group) of a non-directory with `mode`,
/// group `gid`, by `cred` clears: S_ISUID always, S_ISGID by
/// [`sgid_to_drop`] with root counted as a member.
pub(crate) fn chown_drops(mode: u16, gid: u32, cred: &Cred) -> u16 {
    (mode & S_ISUID) | sgid_to_drop(mode, gid, |g| cred.is_root() || cred.in_group(g))
}

/// Whether the record may carry extended attributes at all (an xattr
/// block, or the in-inode area's magic): only then is a capability looked
/// for, so changes of files without xattrs pay nothing.
fn may_have_xattrs(rec: &Inode) -> bool {
    let area = rec.in_inode_xattr_area();
    rec.file_acl() != 0 || area.get(..4) == Some(&XATTR_MAGIC.to_le_bytes()[..])
}

/// Whether inode `ino` (record `rec`) has a file capability.
fn has_capability(sb: &SuperBlock, ino: u32, rec: &Inode) -> Result<bool> {
    if !may_have_xattrs(rec) {
        return Ok(false);
    }
    Ok(xattr::list(sb.vol(), ino, rec)?.iter().any(|(n, _)| n == CAPABILITY))
}

/// Remove `security.capability` from inode `ino` (record `rec`, locked
/// by the caller) in handle `h`, if it has one; the caller writes the
/// record. Returns whether one was removed.
pub(crate) fn drop_capability(sb: &SuperBlock, h: &mut Handle<'_>, ino: u32, rec: &mut Inode) -> Result<bool> {
    if !has_capability(sb, ino, rec)? {
        return Ok(false);
    }
    release_check::xattr_change(sb.vol(), ino, rec)?;
    xattr_write::set(
        sb.vol(),
        h,
        ino,
        rec,
        XattrChange {
            name: CAPABILITY,
            value: None,
            flags: XATTR_REPLACE,
        },
    )?;
    Ok(true)
}

/// `file_remove_privs` before `caller` changes the data or size of
/// `inode`, whose record `rec` the caller holds locked for writing:
/// clear the bits [`suidgid_to_drop`] names (in memory, written with
/// the change's own record update) and remove a file capability (in a
/// transaction of its own, committed now, as the kernel's
/// `notify_change` does before the change). Returns whether the mode
/// changed (a frontend caching attributes must drop them).
pub(crate) fn remove_privs(sb: &SuperBlock, inode: &CachedInode, rec: &mut Inode, caller: &Caller<'_>) -> Result<bool> {
    let mut changed = false;
    if has_capability(sb, inode.ino, rec)? {
        let mut new = rec.clone();
        let mut h = sb.vol().begin()?;
        drop_capability(sb, &mut h, inode.ino, &mut new)?;
        new.set_time(ext4kit_format::inode::TimeField::Ctime, sb.now());
        inode::write(sb.vol(), &mut h, inode.ino, &new)?;
        h.commit()?;
        *rec = new;
    }
    let kill = suidgid_to_drop(rec.base.mode, rec.gid(), caller);
    if kill != 0 {
        rec.base.mode &= !kill;
        // A mode change is metadata fdatasync need not write; fsync does.
        inode.mark_dirty(DIRTY_TIME);
        changed = true;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setuid_always_setgid_with_group_execute_or_for_outsiders() {
        let member = Cred::user(1000, 50);
        let outsider = Cred::user(1000, 60);
        for cred in [&member, &outsider] {
            let c = Caller::new(cred);
            assert_eq!(suidgid_to_drop(0o106777, 50, &c), 0o6000);
            assert_eq!(suidgid_to_drop(0o104755, 50, &c), 0o4000);
            assert_eq!(suidgid_to_drop(0o102070, 50, &c), 0o2000);
            assert_eq!(suidgid_to_drop(0o100777, 50, &c), 0);
        }
        // setgid without group execute stays for a member of the group only.
        assert_eq!(suidgid_to_drop(0o102644, 50, &Caller::new(&member)), 0);
        assert_eq!(suidgid_to_drop(0o102644, 50, &Caller::new(&outsider)), 0o2000);
        // Supplementary groups are fetched only for that question.
        let more = || vec![50];
        let late = Caller {
            more_groups: Some(&more),
            ..Caller::new(&outsider)
        };
        assert_eq!(suidgid_to_drop(0o102644, 50, &late), 0);
        // CAP_FSETID keeps everything; directories and devices keep theirs.
        assert_eq!(suidgid_to_drop(0o106777, 50, &Caller::root()), 0);
        assert_eq!(suidgid_to_drop(0o046777, 50, &Caller::new(&outsider)), 0);
        // chown: setuid always, setgid by the group rule with root a member.
        assert_eq!(chown_drops(0o106644, 50, &Cred::root()), 0o4000);
        assert_eq!(chown_drops(0o106654, 50, &Cred::root()), 0o6000);
        assert_eq!(chown_drops(0o102644, 50, &outsider), 0o2000);
    }
}
