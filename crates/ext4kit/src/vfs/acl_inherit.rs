//! Default-ACL inheritance for new inodes: the kernel's `posix_acl_create`
//! (fs/posix_acl.c) as `ext4_init_acl` applies it to every inode
//! `ext4_new_inode` makes — files, directories, device nodes, O_TMPFILE —
//! inside the creating transaction, so a new inode never exists, even
//! after a crash, with more or less access than its parent's default ACL
//! gives, and a failure to store the ACLs fails the creation with nothing
//! left behind.
//!
//! The rules:
//! * a parent without a default ACL: the new mode is `mode & ~umask`, and
//!   the new inode gets no ACL;
//! * a parent with one: the umask is ignored; the new inode's access ACL
//!   is the default ACL with its owner, other and mask (or owning-group,
//!   when there is no mask) entries limited by the requested mode, and the
//!   mode's permission bits become those entries (`posix_acl_create_masq`);
//!   an access ACL that says no more than the mode is not stored; a new
//!   directory also inherits the default ACL itself as its own default;
//! * symbolic links take neither (their mode is always 0777).
//!
//! The creating paths (write.rs, namespace.rs) call `acl_for_new`
//! under the parent's lock and `store_inherited_acl` with the new
//! record before it is first written. Values are in the Linux xattr
//! format, as everywhere in the vfs layer.

use ext4kit_format::inode::{FileType, Inode};
use ext4kit_format::xattr::acl_tag;

use super::request::CreateMode;
use super::super_block::SuperBlock;
use crate::error::{Errno, Error, Result};
use crate::ext4::transaction::Handle;
use crate::ext4::xattr;
use crate::ext4::xattr_write::{self, XattrChange};

/// Name of the default ACL attribute.
pub const ACL_DEFAULT_NAME: &[u8] = b"system.posix_acl_default";
/// Name of the access ACL attribute.
pub const ACL_ACCESS_NAME: &[u8] = b"system.posix_acl_access";

/// What a new inode gets from its parent (see the module comment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AclCreate {
    /// Permission bits (and setuid/setgid/sticky as requested) to create
    /// the inode with.
    pub(crate) mode: u16,
    /// The access ACL to store, if it says more than the mode.
    pub(crate) access: Option<Vec<u8>>,
    /// The default ACL to store (new directories under a default ACL).
    pub(crate) default: Option<Vec<u8>>,
}

/// `posix_acl_create_masq`: limit the inherited ACL `acl` (xattr format)
/// by `mode` and return the resulting mode and whether the ACL is
/// equivalent to it (only owner, group and other entries). `None` if the
/// ACL is malformed or lacks a required entry.
pub fn create_masq(acl: &mut [u8], mode: u16) -> Option<(u16, bool)> {
    if acl.len() < 4 || !(acl.len() - 4).is_multiple_of(8) {
        return None;
    }
    let mut new = mode & !0o777;
    let mut equiv = true;
    let (mut user, mut other, mut group, mut mask) = (false, false, None, None);
    for (i, e) in acl[4..].chunks_exact_mut(8).enumerate() {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        match tag {
            acl_tag::USER_OBJ => {
                let p = perm & ((mode >> 6) & 7);
                e[2..4].copy_from_slice(&p.to_le_bytes());
                new |= p << 6;
                user = true;
            }
            acl_tag::USER | acl_tag::GROUP => equiv = false,
            acl_tag::GROUP_OBJ => group = Some(i),
            acl_tag::MASK => {
                mask = Some(i);
                equiv = false;
            }
            acl_tag::OTHER => {
                let p = perm & (mode & 7);
                e[2..4].copy_from_slice(&p.to_le_bytes());
                new |= p;
                other = true;
            }
            _ => return None,
        }
    }
    let gi = mask.or(group)?;
    if !user || !other {
        return None;
    }
    let e = &mut acl[4 + gi * 8..4 + gi * 8 + 8];
    let p = u16::from_le_bytes([e[2], e[3]]) & ((mode >> 3) & 7);
    e[2..4].copy_from_slice(&p.to_le_bytes());
    new |= p << 3;
    Some((new, equiv))
}

/// What an inode of type `ftype` created in directory `parent` (its
/// record `dir`, which the caller holds locked) with `mode` gets (see
/// the module comment).
pub(crate) fn acl_for_new(
    sb: &SuperBlock,
    parent: u32,
    dir: &Inode,
    ftype: FileType,
    mode: CreateMode,
) -> Result<AclCreate> {
    let perm = mode.perm & 0o7777;
    let plain = |m| AclCreate {
        mode: m,
        access: None,
        default: None,
    };
    if ftype == FileType::Symlink {
        return Ok(plain(perm));
    }
    let default = xattr::list(sb.vol(), parent, dir)?
        .into_iter()
        .find(|(n, _)| n == ACL_DEFAULT_NAME)
        .map(|(_, v)| v)
        .filter(|v| v.len() > 4);
    let Some(default) = default else {
        return Ok(plain(perm & !(mode.umask & 0o777)));
    };
    let mut access = default.clone();
    let (new_mode, equiv) = create_masq(&mut access, perm).ok_or_else(|| {
        Error::posix(
            Errno::EIO,
            format!("inode {parent}: the default ACL is malformed; run e2fsck"),
        )
    })?;
    Ok(AclCreate {
        mode: new_mode,
        access: (!equiv).then_some(access),
        default: (ftype == FileType::Directory).then_some(default),
    })
}

/// `ext4_init_acl`: store the ACLs [`acl_for_new`] computed on the
/// new inode `ino` (record `rec`, not yet written) in the creating
/// handle `h`. The access ACL is stored as it is (the mode already
/// matches it).
pub(crate) fn store_inherited_acl(
    sb: &SuperBlock,
    h: &mut Handle<'_>,
    ino: u32,
    rec: &mut Inode,
    acl: &AclCreate,
) -> Result<()> {
    for (name, value) in [(ACL_DEFAULT_NAME, &acl.default), (ACL_ACCESS_NAME, &acl.access)] {
        if let Some(v) = value {
            xattr_write::set(
                sb.vol(),
                h,
                ino,
                rec,
                XattrChange {
                    name,
                    value: Some(v),
                    flags: 0,
                },
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NewInode, NodeKind, Target};

    fn acl(es: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = 2u32.to_le_bytes().to_vec();
        for &(t, p, id) in es {
            v.extend_from_slice(&t.to_le_bytes());
            v.extend_from_slice(&p.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    const U: u32 = u32::MAX;

    #[test]
    fn mask_limits_group_class_and_mode_follows() {
        // default: u::rwx u:65534:rwx g::r-x m::rwx o::r-x, creat(0666)
        let mut a = acl(&[
            (acl_tag::USER_OBJ, 7, U),
            (acl_tag::USER, 7, 65534),
            (acl_tag::GROUP_OBJ, 5, U),
            (acl_tag::MASK, 7, U),
            (acl_tag::OTHER, 5, U),
        ]);
        assert_eq!(create_masq(&mut a, 0o666), Some((0o664, false)));
        let want = acl(&[
            (acl_tag::USER_OBJ, 6, U),
            (acl_tag::USER, 7, 65534),
            (acl_tag::GROUP_OBJ, 5, U),
            (acl_tag::MASK, 6, U),
            (acl_tag::OTHER, 4, U),
        ]);
        assert_eq!(a, want);
    }

    #[test]
    fn minimal_acl_is_equivalent_and_limits_the_group_entry() {
        let mut a = acl(&[
            (acl_tag::USER_OBJ, 7, U),
            (acl_tag::GROUP_OBJ, 0, U),
            (acl_tag::OTHER, 7, U),
        ]);
        assert_eq!(create_masq(&mut a, 0o2775), Some((0o2705, true)));
    }

    #[test]
    fn new_inodes_inherit_or_take_the_umask() {
        use crate::Cred;
        let fs = crate::vfs::mem_fs();
        let root = Cred::root();
        // No default ACL: the umask applies, nothing is stored.
        let plain = fs
            .create(
                &NewInode::new(Target::at(2, b"plain"), NodeKind::File)
                    .mode(CreateMode {
                        perm: 0o666,
                        umask: 0o027,
                    })
                    .cred(&root),
            )
            .unwrap();
        assert_eq!(plain.perm(), 0o640);
        assert!(fs.xattrs(plain.ino).unwrap().is_empty());
        let d = fs
            .create(&NewInode::dir(Target::at(2, b"d")).mode(0o755).cred(&root))
            .unwrap();
        let default = acl(&[
            (acl_tag::USER_OBJ, 7, U),
            (acl_tag::USER, 7, 65534),
            (acl_tag::GROUP_OBJ, 5, U),
            (acl_tag::MASK, 7, U),
            (acl_tag::OTHER, 5, U),
        ]);
        fs.setxattr(d.ino, ACL_DEFAULT_NAME, &default, 0, &root).unwrap();
        // Under it the umask is ignored; a directory inherits the default.
        let st = fs
            .create(
                &NewInode::dir(Target::at(d.ino, b"sub"))
                    .mode(CreateMode {
                        perm: 0o777,
                        umask: 0o077,
                    })
                    .cred(&root),
            )
            .unwrap();
        assert_eq!(st.perm(), 0o775);
        assert_eq!(fs.getxattr(st.ino, ACL_DEFAULT_NAME, &root).unwrap(), default);
        let mut want = default.clone();
        create_masq(&mut want, 0o777).unwrap();
        assert_eq!(fs.getxattr(st.ino, ACL_ACCESS_NAME, &root).unwrap(), want);
        // A file: no default of its own; symlinks take nothing.
        let f = fs
            .create(
                &NewInode::new(Target::at(d.ino, b"f"), NodeKind::File)
                    .mode(CreateMode {
                        perm: 0o640,
                        umask: 0o077,
                    })
                    .cred(&root),
            )
            .unwrap();
        assert_eq!(f.perm(), 0o640);
        assert!(fs.getxattr(f.ino, ACL_DEFAULT_NAME, &root).is_err());
        assert!(fs.getxattr(f.ino, ACL_ACCESS_NAME, &root).is_ok());
        let l = fs
            .create(&NewInode::symlink(Target::at(d.ino, b"l"), b"f").cred(&root))
            .unwrap();
        assert!(fs.xattrs(l.ino).unwrap().is_empty());
    }

    #[test]
    fn malformed_acls_are_refused() {
        let mut a = acl(&[(acl_tag::USER_OBJ, 7, U), (acl_tag::OTHER, 7, U)]);
        assert_eq!(create_masq(&mut a, 0o777), None);
        let mut a = acl(&[(0x99, 7, U)]);
        assert_eq!(create_masq(&mut a, 0o777), None);
        assert_eq!(create_masq(&mut [1, 2, 3], 0o777), None);
    }
}
