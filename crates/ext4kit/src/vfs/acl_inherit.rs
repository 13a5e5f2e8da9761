//! Default-ACL inheritance for new inodes: the kernel's `posix_acl_create`
//! (fs/posix_acl.c), for a frontend that creates inodes on behalf of a
//! kernel that leaves it to the filesystem (FUSE with `FUSE_POSIX_ACL`
//! and `FUSE_DONT_MASK`: the kernel neither applies the umask nor the
//! parent's default ACL, it sends both the requested mode and the umask).
//!
//! The rules:
//! * a parent without a default ACL: the new mode is `mode & ~umask`, and
//!   the new inode gets no ACL;
//! * a parent with one: the umask is ignored; the new inode's access ACL
//!   is the default ACL with its owner, other and mask (or owning-group,
//!   when there is no mask) entries limited by the requested mode, and the
//!   mode's permission bits become those entries (`posix_acl_create_masq`);
//!   an access ACL that says no more than the mode is not stored; a new
//!   directory also inherits the default ACL itself as its own default.
//!
//! [`Fs::acl_create`] computes this from the parent (under its read lock);
//! the caller creates the inode with [`AclCreate::mode`] and then stores
//! the ACLs with [`Fs::apply_acl_create`]. Values are in the Linux xattr
//! format, as everywhere in the vfs layer.

use ext4kit_format::inode::FileType;
use ext4kit_format::xattr::acl_tag;

use super::cred::Cred;
use super::Fs;
use crate::error::{Errno, Error, Result};

/// Name of the default ACL attribute.
pub const ACL_DEFAULT_NAME: &[u8] = b"system.posix_acl_default";
/// Name of the access ACL attribute.
pub const ACL_ACCESS_NAME: &[u8] = b"system.posix_acl_access";

/// What a new inode gets from its parent (see the module comment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclCreate {
    /// Permission bits (and setuid/setgid/sticky as requested) to create
    /// the inode with.
    pub mode: u16,
    /// The access ACL to store, if it says more than the mode.
    pub access: Option<Vec<u8>>,
    /// The default ACL to store (new directories under a default ACL).
    pub default: Option<Vec<u8>>,
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

impl Fs {
    /// What an inode of type `ftype` created in directory `parent` with
    /// the requested `mode` (permission bits plus setuid/setgid/sticky)
    /// and the creator's `umask` gets (see the module comment). Symbolic
    /// links take neither umask nor ACLs (their mode is always 0777).
    pub fn acl_create(&self, parent: u32, ftype: FileType, mode: u16, umask: u16) -> Result<AclCreate> {
        let mode = mode & 0o7777;
        if ftype == FileType::Symlink {
            return Ok(AclCreate {
                mode,
                access: None,
                default: None,
            });
        }
        let default = match self.getxattr_ino(parent, ACL_DEFAULT_NAME, &Cred::root()) {
            Ok(v) if v.len() > 4 => v,
            Ok(_) => {
                return Ok(AclCreate {
                    mode: mode & !(umask & 0o777),
                    access: None,
                    default: None,
                })
            }
            Err(Error::Posix {
                errno: Errno::ENODATA, ..
            }) => {
                return Ok(AclCreate {
                    mode: mode & !(umask & 0o777),
                    access: None,
                    default: None,
                })
            }
            Err(e) => return Err(e),
        };
        let mut access = default.clone();
        let (new_mode, equiv) = create_masq(&mut access, mode).ok_or_else(|| {
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

    /// Store the ACLs [`Fs::acl_create`] computed on the new inode `ino`.
    /// The access ACL is stored as it is (the mode already matches it).
    pub fn apply_acl_create(&self, ino: u32, acl: &AclCreate) -> Result<()> {
        let root = Cred::root();
        if let Some(d) = &acl.default {
            self.setxattr_ino(ino, ACL_DEFAULT_NAME, d, 0, &root)?;
        }
        if let Some(a) = &acl.access {
            self.setxattr_ino(ino, ACL_ACCESS_NAME, a, 0, &root)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let fs = crate::vfs::mem_fs();
        let root = Cred::root();
        // No default ACL: the umask applies, nothing is stored.
        let plain = fs.acl_create(2, FileType::Regular, 0o666, 0o027).unwrap();
        assert_eq!(
            plain,
            AclCreate {
                mode: 0o640,
                access: None,
                default: None
            }
        );
        let d = fs.mkdir_at(2, b"d", 0o755, &root).unwrap();
        let default = acl(&[
            (acl_tag::USER_OBJ, 7, U),
            (acl_tag::USER, 7, 65534),
            (acl_tag::GROUP_OBJ, 5, U),
            (acl_tag::MASK, 7, U),
            (acl_tag::OTHER, 5, U),
        ]);
        fs.setxattr_ino(d.ino, ACL_DEFAULT_NAME, &default, 0, &root).unwrap();
        // Under it the umask is ignored; a directory inherits the default.
        let sub = fs.acl_create(d.ino, FileType::Directory, 0o777, 0o077).unwrap();
        assert_eq!(sub.mode, 0o775);
        assert_eq!(sub.default.as_deref(), Some(&default[..]));
        let st = fs.mkdir_at(d.ino, b"sub", sub.mode, &root).unwrap();
        fs.apply_acl_create(st.ino, &sub).unwrap();
        assert_eq!(fs.stat_ino(st.ino).unwrap().perm(), 0o775);
        assert_eq!(fs.getxattr_ino(st.ino, ACL_DEFAULT_NAME, &root).unwrap(), default);
        assert_eq!(
            fs.getxattr_ino(st.ino, ACL_ACCESS_NAME, &root).unwrap(),
            sub.access.unwrap()
        );
        // A file: no default of its own; symlinks take nothing.
        let f = fs.acl_create(d.ino, FileType::Regular, 0o640, 0o077).unwrap();
        assert_eq!((f.mode, f.default.is_none(), f.access.is_some()), (0o640, true, true));
        let l = fs.acl_create(d.ino, FileType::Symlink, 0o777, 0o077).unwrap();
        assert_eq!(
            l,
            AclCreate {
                mode: 0o777,
                access: None,
                default: None
            }
        );
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
