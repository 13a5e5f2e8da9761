//! Extended attributes of an inode: the in-inode area after the extra
//! fields, then the external block named by `i_file_acl` (which may be
//! shared between inodes, refcounted). The format layer parses and checks
//! both; here we fetch the bytes and present names in their full form.
//!
//! `system.posix_acl_access` / `_default` are stored in ext4's compact ACL
//! format and converted to the format of the Linux xattr syscalls on the
//! way out, as the kernel does. `system.data` (inline data) is internal and
//! not listed.

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

impl Volume {
    /// Raw entries (in-inode first, then the block), unconverted.
    pub(crate) fn xattr_entries(&self, ino: u32, inode: &Inode) -> Result<Vec<XattrEntry>> {
        let mut out = xattr::parse_ibody(inode.in_inode_xattr_area())
            .map_err(|e| Error::corrupt(format!("in-inode xattrs of inode {ino}"), e))?;
        let blk = inode.file_acl();
        if blk != 0 {
            let buf = self
                .buffer(blk)
                .map_err(|e| annotate(e, &format!("xattr block of inode {ino}")))?;
            let seed = self.geo().csum_seed();
            let (_hdr, entries) = xattr::parse_block(&buf.data, blk, seed)
                .map_err(|e| Error::corrupt(format!("xattr block {blk} of inode {ino}"), e))?;
            out.extend(entries);
        }
        if let Some(e) = out.iter().find(|e| e.value_inum != 0) {
            return Err(self.ea_inode_value(ino, e));
        }
        Ok(out)
    }

    /// Every user-visible attribute as (full name, value).
    pub fn xattrs(&self, ino: u32, inode: &Inode) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        for e in self.xattr_entries(ino, inode)? {
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
    pub(crate) fn inline_data(&self, ino: u32, inode: &Inode) -> Result<Vec<u8>> {
        let mut data = inode.base.block.to_vec();
        if let Some(e) = self
            .xattr_entries(ino, inode)?
            .into_iter()
            .find(|e| e.name_index == IDX_SYSTEM && e.name == b"data")
        {
            data.extend_from_slice(&e.value);
        }
        Ok(data)
    }
}
