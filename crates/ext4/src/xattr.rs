//! Extended attributes of an inode: the in-inode area after the extra
//! fields, then the external block named by `i_file_acl` (which may be
//! shared between inodes, refcounted). The format layer parses and checks
//! both; here we fetch the bytes and present names in their full form.
//!
//! `system.posix_acl_access` / `_default` are stored in ext4's compact ACL
//! format and converted to the format of the Linux xattr syscalls on the
//! way out, as the kernel does. `system.data` (inline data) is internal and
//! not listed.

use ext4kit_format::features::incompat;
use ext4kit_format::inode::Inode;
use ext4kit_format::xattr::{self, XattrEntry};

use super::error::annotate;
use super::volume::Volume;
use crate::error::{Error, Result};

/// Name index of `system.posix_acl_access`.
const IDX_ACL_ACCESS: u8 = 2;
/// Name index of `system.posix_acl_default`.
const IDX_ACL_DEFAULT: u8 = 3;
/// Name index of `system.` (inline data's `system.data`).
const IDX_SYSTEM: u8 = 7;

/// Raw entries of inode `ino` (record `rec`): in-inode first, then the
/// block, unconverted. An entry whose value lives in an EA inode is
/// refused ([`ea_inode_error`]).
pub(crate) fn entries(vol: &Volume, ino: u32, rec: &Inode) -> Result<Vec<XattrEntry>> {
    let mut out = xattr::parse_ibody(rec.in_inode_xattr_area())
        .map_err(|e| Error::corrupt(format!("in-inode xattrs of inode {ino}"), e))?;
    let blk = rec.file_acl();
    if blk != 0 {
        let buf = vol
            .buffer(blk)
            .map_err(|e| annotate(e, &format!("xattr block of inode {ino}")))?;
        let seed = vol.geo().csum_seed();
        let (_hdr, entries) = xattr::parse_block(&buf.data, blk, seed)
            .map_err(|e| Error::corrupt(format!("xattr block {blk} of inode {ino}"), e))?;
        out.extend(entries);
    }
    if let Some(e) = out.iter().find(|e| e.value_inum != 0) {
        return Err(ea_inode_error(vol, ino, e));
    }
    Ok(out)
}

/// Every user-visible attribute of inode `ino` as (full name, value), ACLs
/// in the xattr syscalls' format. Public: the vfs layer's listxattr and
/// getxattr.
pub fn list(vol: &Volume, ino: u32, rec: &Inode) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for e in entries(vol, ino, rec)? {
        if e.name_index == IDX_SYSTEM && e.name == b"data" {
            continue;
        }
        let value = if e.name_index == IDX_ACL_ACCESS || e.name_index == IDX_ACL_DEFAULT {
            xattr::acl_disk_to_xattr(&e.value).map_err(|err| Error::corrupt(format!("ACL of inode {ino}"), err))?
        } else {
            e.value.clone()
        };
        out.push((e.full_name(), value));
    }
    Ok(out)
}

/// The bytes of an inline-data inode: `i_block` then `system.data`.
pub(crate) fn inline_data(vol: &Volume, ino: u32, rec: &Inode) -> Result<Vec<u8>> {
    let mut data = rec.base.block.to_vec();
    if let Some(e) = entries(vol, ino, rec)?
        .into_iter()
        .find(|e| e.name_index == IDX_SYSTEM && e.name == b"data")
    {
        data.extend_from_slice(&e.value);
    }
    Ok(data)
}

/// The error for an xattr whose value lives in an EA inode: damage on an
/// image without the `ea_inode` feature (the kernel's
/// `ext4_xattr_inode_iget`: "ea_inode feature is not enabled"), otherwise
/// a feature we do not write.
pub(crate) fn ea_inode_error(vol: &Volume, ino: u32, e: &XattrEntry) -> Error {
    let what = format!(
        "xattr {} stores its value in inode {}",
        String::from_utf8_lossy(&e.full_name()),
        e.value_inum
    );
    if vol.geo().has_incompat(incompat::EA_INODE) {
        Error::Unsupported(format!("inode {ino}: {what} (ea_inode)"))
    } else {
        Error::corrupt_msg(
            format!("inode {ino}"),
            "xattr entry",
            format!("{what}, but the filesystem has no ea_inode feature"),
        )
    }
}
