//! Caller credentials and the classic Unix permission check.
//!
//! Library callers and the FUSE server pass the credentials of whoever
//! asked; the CLI passes [`Cred::root`] (it edits images it was given).
//! The check is `generic_permission()` without ACLs: owner class, then
//! group class (primary or supplementary), then other; root may read and
//! write anything and may execute anything with at least one x bit.

use ext4kit_format::inode::Inode;

/// Read permission (the `MAY_READ` mask bit).
pub const MAY_READ: u8 = 4;
/// Write permission.
pub const MAY_WRITE: u8 = 2;
/// Execute / search permission.
pub const MAY_EXEC: u8 = 1;

/// Who is asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    /// Effective (filesystem) user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Cred {
    /// The superuser: every permission check passes (except exec of a file
    /// with no x bit at all, as in the kernel).
    pub fn root() -> Self {
        Cred {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
    }

    /// An ordinary user with no supplementary groups.
    pub fn user(uid: u32, gid: u32) -> Self {
        Cred {
            uid,
            gid,
            groups: Vec::new(),
        }
    }

    /// Whether this is uid 0 (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN).
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether `gid` is the caller's group or one of its supplementary ones.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Whether the caller owns `inode` or is root: the kernel's
    /// `inode_owner_or_capable` (CAP_FOWNER), which guards chmod, explicit
    /// times, inode flags and trusted/system xattrs.
    pub fn owner_or_root(&self, inode: &Inode) -> bool {
        self.is_root() || self.uid == inode.uid()
    }

    /// Whether the caller may access `inode` for `mask` (MAY_* bits).
    pub fn may(&self, inode: &Inode, mask: u8) -> bool {
        let mode = inode.base.mode;
        if self.is_root() {
            // Root bypasses r/w; exec needs some x bit unless a directory.
            let is_dir = mode & 0o170000 == 0o040000;
            return mask & MAY_EXEC == 0 || is_dir || mode & 0o111 != 0;
        }
        let class = if self.uid == inode.uid() {
            (mode >> 6) & 7
        } else if self.in_group(inode.gid()) {
            (mode >> 3) & 7
        } else {
            mode & 7
        } as u8;
        class & mask == mask
    }
}

/// Who changes a file's data or size, as the rules that depend on the
/// caller see them: the setuid/setgid kill (`file_remove_privs`, see
/// `vfs::killpriv`) and the root reserve (`ext4_has_free_clusters`).
#[derive(Clone, Copy)]
pub struct Caller<'a> {
    /// The caller's ids (and the groups known for it).
    pub cred: &'a Cred,
    /// CAP_FSETID: changes by this caller keep setuid and setgid.
    pub fsetid: bool,
    /// Supplementary groups not in `cred.groups`, asked for only when a
    /// rule needs to know whether the caller is in a file's group (the
    /// setgid kill of a file without group execute). A FUSE request
    /// carries no groups: the mount reads them from /proc only then.
    pub more_groups: Option<&'a dyn Fn() -> Vec<u32>>,
}

impl std::fmt::Debug for Caller<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("cred", self.cred)
            .field("fsetid", &self.fsetid)
            .field("more_groups", &self.more_groups.is_some())
            .finish()
    }
}

/// The superuser's credentials, for callers that act as root.
static ROOT: Cred = Cred {
    uid: 0,
    gid: 0,
    groups: Vec::new(),
};

impl<'a> Caller<'a> {
    /// `cred` with the capability root has and others lack (the library's
    /// model of capabilities: uid 0 has them all).
    pub fn new(cred: &'a Cred) -> Self {
        Caller {
            cred,
            fsetid: cred.is_root(),
            more_groups: None,
        }
    }

    /// Root: keeps setuid/setgid, may use the root reserve.
    pub fn root() -> Caller<'static> {
        Caller::new(&ROOT)
    }

    /// Whether `gid` is one of the caller's groups (fetching the groups
    /// not known yet only now).
    pub fn in_group(&self, gid: u32) -> bool {
        self.cred.in_group(gid) || self.more_groups.is_some_and(|f| f().contains(&gid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_format::inode::InodeBase;

    fn inode(mode: u16, uid: u16, gid: u16) -> Inode {
        let mut base = InodeBase::parse_raw(&[0u8; 128]);
        base.mode = mode;
        base.uid = uid;
        base.gid = gid;
        Inode {
            base,
            extra: ext4kit_format::inode::InodeExtra::parse_raw(&[0u8; 32]),
            tail: Default::default(),
        }
    }

    #[test]
    fn owner_group_other_classes() {
        let i = inode(0o100640, 10, 20);
        assert!(Cred::user(10, 99).may(&i, MAY_READ | MAY_WRITE));
        assert!(!Cred::user(10, 99).may(&i, MAY_EXEC));
        assert!(Cred::user(11, 20).may(&i, MAY_READ));
        assert!(!Cred::user(11, 20).may(&i, MAY_WRITE));
        let mut c = Cred::user(11, 5);
        assert!(!c.may(&i, MAY_READ));
        c.groups.push(20);
        assert!(c.may(&i, MAY_READ));
        // The owner class applies even when it grants less than "other".
        let j = inode(0o100007, 10, 20);
        assert!(!Cred::user(10, 20).may(&j, MAY_READ));
        assert!(Cred::user(12, 21).may(&j, MAY_READ));
    }

    #[test]
    fn root_needs_an_x_bit_to_execute_files() {
        assert!(Cred::root().may(&inode(0o100000, 1, 1), MAY_READ | MAY_WRITE));
        assert!(!Cred::root().may(&inode(0o100644, 1, 1), MAY_EXEC));
        assert!(Cred::root().may(&inode(0o100744, 1, 1), MAY_EXEC));
        assert!(Cred::root().may(&inode(0o040000, 1, 1), MAY_EXEC));
    }
}
