//! Clearing setuid/setgid and `security.capability` when someone without
//! the privilege to keep them changes a file — the FUSE server's half of
//! the kernel's `file_remove_privs`, negotiated with
//! `FUSE_HANDLE_KILLPRIV_V2`.
//!
//! With that flag the kernel leaves the setuid/setgid kill to us (its
//! `fuse_setattr` drops ATTR_KILL_SUID/ATTR_KILL_SGID) and marks the
//! superblock SB_NOSEC, so it stops asking for `security.capability`
//! before every write. What it still does, and what we do:
//!
//! - WRITE carries `FUSE_WRITE_KILL_SUIDGID` when the writer lacks
//!   CAP_FSETID (`fuse_send_write_pages`); we clear the bits then
//!   ([`kill_mode`]'s rule), before writing. The kernel does not refresh
//!   its cached mode after a write, so the mode a `stat` shows would stay
//!   stale for the whole attribute timeout: we invalidate the attributes
//!   ([`Invalidator`]) when something was cleared.
//! - truncation (SETATTR with a size) by a caller other than root: we
//!   clear the bits and the reply carries the new mode.
//! - FALLOCATE carries no flag; ext4's `ext4_fallocate` calls
//!   `file_modified` for every mode (allocate, punch, zero, collapse,
//!   insert), so a caller other than root clears the bits here too.
//! - `security.capability` is removed by the kernel itself
//!   (`cap_inode_killpriv` → `__vfs_removexattr`), as a REMOVEXATTR in the
//!   writer's name, before a buffered write, a truncation or a fallocate;
//!   not before a direct-I/O write (`cache=direct`: `fuse_direct_write_iter`
//!   does not call `file_remove_privs`), so there every WRITE removes it
//!   here, whoever writes (ext4 drops it on any write, root's included). A user's own removexattr(2) of that
//!   name needs CAP_SETFCAP, which the kernel checks before sending
//!   anything (`cap_inode_removexattr`), so such a request from anyone but
//!   root is the kernel's kill and is carried out with root's rights
//!   ([`is_capability_kill`]); refusing it made every write to such a file
//!   fail (xfstests generic/688).
//!
//! CAP_FSETID is approximated by uid 0: FUSE requests carry no
//! capabilities (the WRITE flag is the kernel's own test, and exact).

use std::sync::OnceLock;

use ext4kit_format::inode::Inode;
use ext4kit_format::xattr::XATTR_MAGIC;
use fuser::{INodeNo, Notifier};

/// The attribute name of file capabilities.
pub const CAPABILITY: &[u8] = b"security.capability";

/// The mode after a change of a file with mode `mode` by a caller
/// without CAP_FSETID, if anything is to be cleared: S_ISUID always;
/// S_ISGID when group execute is set, or when the caller is not in the
/// file's group (`in_group` false) — the kernel's `should_remove_suid` /
/// `setattr_should_drop_sgid` since 6.2, which ext4 applies to writes,
/// truncations and fallocate (the FUSE protocol's description mentions
/// group execute only; ext4 is the oracle).
pub fn kill_mode(mode: u16, in_group: bool) -> Option<u16> {
    let mut kill = 0;
    if mode & 0o4000 != 0 {
        kill |= 0o4000;
    }
    if mode & 0o2000 != 0 && (mode & 0o0010 != 0 || !in_group) {
        kill |= 0o2000;
    }
    (kill != 0).then_some(mode & !kill)
}

/// Whether inode record `rec` may carry extended attributes at all (an
/// xattr block, or the in-inode area's magic): a write checks for a file
/// capability only then, so writes to files without xattrs pay nothing.
pub fn may_have_xattrs(rec: &Inode) -> bool {
    let area = rec.in_inode_xattr_area();
    rec.file_acl() != 0 || area.get(..4) == Some(&XATTR_MAGIC.to_le_bytes()[..])
}

/// Whether a REMOVEXATTR of `name` by a caller with uid `uid` is the
/// kernel's removal of file capabilities on a change by an unprivileged
/// user (see the module documentation).
pub fn is_capability_kill(name: &[u8], uid: u32) -> bool {
    uid != 0 && name == CAPABILITY
}

/// Tells the kernel that attributes it caches changed behind a reply
/// that does not carry them (`FUSE_NOTIFY_INVAL_INODE` with a negative
/// offset: attributes only, no page-cache invalidation, so it takes no
/// lock the request in progress could hold). Set once the session
/// exists ([`Invalidator::attach`]); before that there is nothing cached.
#[derive(Default)]
pub struct Invalidator {
    notifier: OnceLock<Notifier>,
}

impl std::fmt::Debug for Invalidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invalidator")
            .field("attached", &self.notifier.get().is_some())
            .finish()
    }
}

impl Invalidator {
    /// Use the session's notifier from now on.
    pub fn attach(&self, n: Notifier) {
        let _ = self.notifier.set(n);
    }

    /// Drop the kernel's cached attributes of node `ino`. A failure (the
    /// kernel no longer knows the node: ENOENT) leaves nothing stale.
    pub fn attrs(&self, ino: INodeNo) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(ino, -1, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setuid_always_setgid_with_group_execute_or_for_outsiders() {
        for in_group in [true, false] {
            assert_eq!(kill_mode(0o6777, in_group), Some(0o0777));
            assert_eq!(kill_mode(0o4755, in_group), Some(0o0755));
            assert_eq!(kill_mode(0o2070, in_group), Some(0o0070));
            assert_eq!(kill_mode(0o0777, in_group), None);
        }
        // setgid without group execute stays for a member of the group
        // only (setattr_should_drop_sgid).
        assert_eq!(kill_mode(0o2644, true), None);
        assert_eq!(kill_mode(0o2644, false), Some(0o0644));
        assert_eq!(kill_mode(0o6644, true), Some(0o2644));
        assert_eq!(kill_mode(0o6644, false), Some(0o0644));
    }

    #[test]
    fn only_unprivileged_capability_removals_are_the_kernels() {
        assert!(is_capability_kill(b"security.capability", 65534));
        assert!(!is_capability_kill(b"security.capability", 0));
        assert!(!is_capability_kill(b"security.selinux", 65534));
        assert!(!is_capability_kill(b"user.capability", 65534));
    }
}
