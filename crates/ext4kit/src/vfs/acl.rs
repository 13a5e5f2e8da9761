//! POSIX ACLs in permission checks and under chmod (fs/posix_acl.c).
//!
//! Values here are in the Linux xattr format (`posix_acl_xattr_header`
//! version 2, then 8-byte entries {tag u16, perm u16, id u32}), as
//! [`crate::ext4::xattr::list`] returns them; the ext4 disk format
//! conversion happens in the ext4 layer.

use ext4kit_format::inode::Inode;
use ext4kit_format::xattr::acl_tag;

use super::cred::Cred;
use super::super_block::SuperBlock;
use crate::error::Result;
use crate::ext4::xattr;

/// Name of the access ACL attribute.
pub(crate) const ACL_ACCESS: &[u8] = b"system.posix_acl_access";

/// Entries of an xattr-format ACL as (tag, perm, id); `None` if malformed.
fn entries(x: &[u8]) -> Option<Vec<(u16, u16, u32)>> {
    let body = x.get(4..)?;
    if body.len() % 8 != 0 {
        return None;
    }
    Some(
        body.chunks(8)
            .map(|e| {
                (
                    u16::from_le_bytes([e[0], e[1]]),
                    u16::from_le_bytes([e[2], e[3]]),
                    u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                )
            })
            .collect(),
    )
}

/// The mode bits an access ACL implies, and whether the ACL says no more
/// than the mode (`posix_acl_equiv_mode`: only owner, group, other).
pub(crate) fn acl_mode(x: &[u8]) -> Option<(u16, bool)> {
    let (mut user, mut group, mut mask, mut other) = (None, None, None, None);
    let mut named = false;
    for (tag, perm, _) in entries(x)? {
        let perm = perm & 7;
        match tag {
            acl_tag::USER_OBJ => user = Some(perm),
            acl_tag::GROUP_OBJ => group = Some(perm),
            acl_tag::MASK => mask = Some(perm),
            acl_tag::OTHER => other = Some(perm),
            acl_tag::USER | acl_tag::GROUP => named = true,
            _ => return None,
        }
    }
    let g = mask.or(group)?;
    Some((user? << 6 | g << 3 | other?, !named && mask.is_none()))
}

/// `__posix_acl_chmod`: carry new permission bits into an access ACL — the
/// owner and other entries, and the mask (or the owning group when there
/// is no mask). Named entries keep their bits; the mask limits them.
pub(crate) fn acl_chmod(x: &mut [u8], mode: u16) {
    let has_mask = entries(x).is_some_and(|es| es.iter().any(|e| e.0 == acl_tag::MASK));
    for e in x.get_mut(4..).unwrap_or_default().chunks_exact_mut(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = match tag {
            acl_tag::USER_OBJ => (mode >> 6) & 7,
            acl_tag::MASK => (mode >> 3) & 7,
            acl_tag::GROUP_OBJ if !has_mask => (mode >> 3) & 7,
            acl_tag::OTHER => mode & 7,
            _ => continue,
        };
        e[2..4].copy_from_slice(&perm.to_le_bytes());
    }
}

/// `posix_acl_permission` for a caller who is not the owner (the owner
/// class is decided from the mode before ACLs are consulted): a matching
/// named user, or the owning / named groups that grant `want`, limited by
/// the mask; else the other entry. `None` if the ACL is malformed.
pub(crate) fn acl_permission(x: &[u8], inode: &Inode, cred: &Cred, want: u16) -> Option<bool> {
    let es = entries(x)?;
    let mask = es.iter().find(|e| e.0 == acl_tag::MASK).map(|e| e.1);
    let masked = |perm: u16| perm & want == want && mask.is_none_or(|m| m & want == want);
    let mut found = false;
    for &(tag, perm, id) in &es {
        match tag {
            acl_tag::USER if id == cred.uid => return Some(masked(perm)),
            acl_tag::GROUP_OBJ if cred.in_group(inode.gid()) => {
                found = true;
                if perm & want == want {
                    return Some(masked(perm));
                }
            }
            acl_tag::GROUP if cred.in_group(id) => {
                found = true;
                if perm & want == want {
                    return Some(masked(perm));
                }
            }
            acl_tag::OTHER => return Some(!found && perm & want == want),
            _ => {}
        }
    }
    Some(false)
}

/// The work of [`Fs::permission`](crate::Fs::permission).
pub(crate) fn permission(sb: &SuperBlock, ino: u32, inode: &Inode, mask: u8, cred: &Cred) -> Result<bool> {
    if cred.is_root() || cred.uid == inode.uid() || inode.base.mode & 0o070 == 0 {
        return Ok(cred.may(inode, mask));
    }
    let acl = xattr::list(sb.vol(), ino, inode)?
        .into_iter()
        .find(|(n, _)| n == ACL_ACCESS);
    match acl.and_then(|(_, v)| acl_permission(&v, inode, cred, mask as u16 & 7)) {
        Some(ok) => Ok(ok),
        None => Ok(cred.may(inode, mask)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_format::inode::{InodeBase, InodeExtra};

    const U: u32 = u32::MAX;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut x = 2u32.to_le_bytes().to_vec();
        for &(t, p, id) in entries {
            x.extend_from_slice(&t.to_le_bytes());
            x.extend_from_slice(&p.to_le_bytes());
            x.extend_from_slice(&id.to_le_bytes());
        }
        x
    }

    fn inode(mode: u16, uid: u16, gid: u16) -> Inode {
        let mut base = InodeBase::parse_raw(&[0u8; 128]);
        base.mode = mode;
        base.uid = uid;
        base.gid = gid;
        Inode {
            base,
            extra: InodeExtra::parse_raw(&[0u8; 32]),
            tail: Default::default(),
        }
    }

    #[test]
    fn mode_bits_and_equivalence() {
        assert_eq!(
            acl_mode(&acl(&[(1, 6, U), (4, 4, U), (0x20, 0, U)])),
            Some((0o640, true))
        );
        let full = acl(&[(1, 7, U), (2, 6, 1000), (4, 4, U), (0x10, 5, U), (0x20, 1, U)]);
        assert_eq!(acl_mode(&full), Some((0o751, false)));
        assert_eq!(acl_mode(&acl(&[(4, 4, U), (0x20, 0, U)])), None);
        assert_eq!(acl_mode(&[2, 0, 0]), None);
    }

    #[test]
    fn chmod_rewrites_owner_mask_other() {
        let mut x = acl(&[(1, 7, U), (2, 6, 1000), (4, 4, U), (0x10, 5, U), (0x20, 1, U)]);
        acl_chmod(&mut x, 0o540);
        assert_eq!(
            x,
            acl(&[(1, 5, U), (2, 6, 1000), (4, 4, U), (0x10, 4, U), (0x20, 0, U)])
        );
        let mut y = acl(&[(1, 7, U), (4, 4, U), (0x20, 1, U)]);
        acl_chmod(&mut y, 0o620);
        assert_eq!(y, acl(&[(1, 6, U), (4, 2, U), (0x20, 0, U)]));
    }

    #[test]
    fn permission_follows_posix_acl_permission() {
        // u::rw-, u:1000:rwx, g::r--, g:3000:-w-, m::r-x, o::---
        let x = acl(&[
            (1, 6, U),
            (2, 7, 1000),
            (4, 4, U),
            (8, 2, 3000),
            (0x10, 5, U),
            (0x20, 0, U),
        ]);
        let i = inode(0o100650, 1, 20);
        let c = |uid, gid, groups: &[u32]| Cred {
            uid,
            gid,
            groups: groups.to_vec(),
        };
        // Named user: rwx limited by the mask r-x.
        assert_eq!(acl_permission(&x, &i, &c(1000, 1, &[]), 4), Some(true));
        assert_eq!(acl_permission(&x, &i, &c(1000, 1, &[]), 1), Some(true));
        assert_eq!(acl_permission(&x, &i, &c(1000, 1, &[]), 2), Some(false));
        // Owning group r--.
        assert_eq!(acl_permission(&x, &i, &c(5, 20, &[]), 4), Some(true));
        assert_eq!(acl_permission(&x, &i, &c(5, 20, &[]), 2), Some(false));
        // Named group -w- masked away by r-x.
        assert_eq!(acl_permission(&x, &i, &c(5, 5, &[3000]), 2), Some(false));
        // A matching group that does not grant: no fallback to other.
        assert_eq!(acl_permission(&x, &i, &c(5, 5, &[3000]), 4), Some(false));
        // Nobody in particular: other ---.
        assert_eq!(acl_permission(&x, &i, &c(5, 5, &[]), 4), Some(false));
        let open = acl(&[(1, 6, U), (4, 0, U), (0x20, 4, U)]);
        assert_eq!(acl_permission(&open, &i, &c(5, 5, &[]), 4), Some(true));
        assert_eq!(acl_permission(&open, &i, &c(5, 20, &[]), 4), Some(false));
    }
}
