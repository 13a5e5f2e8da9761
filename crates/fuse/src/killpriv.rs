//! The FUSE side of clearing setuid/setgid and `security.capability`
//! when someone without the privilege to keep them changes a file: the
//! rule itself is the engine's (`ext4kit::vfs::killpriv`, the kernel's
//! `file_remove_privs`), applied by its write, truncate, fallocate and
//! chown paths; this module has what the protocol adds, negotiated with
//! `FUSE_HANDLE_KILLPRIV_V2`.
//!
//! With that flag the kernel leaves the setuid/setgid kill to us (its
//! `fuse_setattr` drops ATTR_KILL_SUID/ATTR_KILL_SGID) and marks the
//! superblock SB_NOSEC, so it stops asking for `security.capability`
//! before every write. What it still does, and what the mount translates:
//!
//! - WRITE carries `FUSE_WRITE_KILL_SUIDGID` when the writer lacks
//!   CAP_FSETID (`fuse_send_write_pages`): the engine's caller for a write
//!   without a handle; with one, the opener's CAP_FSETID (uid 0). The
//!   kernel does not refresh its cached mode after a write, so the mode a
//!   `stat` shows would stay stale for the whole attribute timeout: the
//!   attributes are invalidated ([`Invalidator`]) when the engine cleared
//!   something. The same for FALLOCATE, whose reply carries none either.
//! - truncation (SETATTR with a size): the reply carries the new mode.
//! - `security.capability` is removed by the kernel itself
//!   (`cap_inode_killpriv` → `__vfs_removexattr`), as a REMOVEXATTR in the
//!   writer's name, before a buffered write, a truncation or a fallocate;
//!   the engine removes it on every such change anyway (direct-I/O writes
//!   get no REMOVEXATTR: `fuse_direct_write_iter` does not call
//!   `file_remove_privs`). A user's own removexattr(2) of that name needs
//!   CAP_SETFCAP, which the kernel checks before sending anything
//!   (`cap_inode_removexattr`), so such a request from anyone but root is
//!   the kernel's kill and is carried out with root's rights
//!   ([`is_capability_kill`]); refusing it made every write to such a file
//!   fail (xfstests generic/688).
//!
//! CAP_FSETID is approximated by uid 0: FUSE requests carry no
//! capabilities (the WRITE flag is the kernel's own test, and exact).

use std::sync::OnceLock;

use ext4kit::vfs::killpriv::CAPABILITY;
use fuser::{INodeNo, Notifier};

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
    fn only_unprivileged_capability_removals_are_the_kernels() {
        assert!(is_capability_kill(b"security.capability", 65534));
        assert!(!is_capability_kill(b"security.capability", 0));
        assert!(!is_capability_kill(b"security.selinux", 65534));
        assert!(!is_capability_kill(b"user.capability", 65534));
    }
}
