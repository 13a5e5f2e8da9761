//! Symbolic links: "fast" links keep their target in `i_block` (targets
//! under 60 bytes, no data block), "slow" links in a data block, and with
//! inline_data in the inode's inline area.

use ext4kit_format::inode::Inode;

use super::bmap::{BlockMap, Mapping};
use super::volume::Volume;
use crate::error::{Error, Result};

impl Volume {
    /// The kernel's `ext4_inode_is_fast_symlink`: no data blocks besides a
    /// possible xattr block, and a target that fits in `i_block`.
    pub fn is_fast_symlink(&self, inode: &Inode) -> bool {
        if inode.has_inline_data() {
            return false;
        }
        let huge = self.geo().has_ro_compat(ext4kit_format::features::ro_compat::HUGE_FILE);
        let ea_blocks = if inode.file_acl() != 0 {
            (self.block_size() / 512) as u64
        } else {
            0
        };
        inode.blocks_512(huge, self.block_size() as u32) <= ea_blocks && inode.size() < 60
    }

    /// Read a symlink's target.
    pub fn read_link(&self, ino: u32, inode: &Inode, map: &BlockMap) -> Result<Vec<u8>> {
        let size = inode.size();
        let loc = || format!("symlink inode {ino}");
        if size > self.block_size() as u64 || size > 4096 * 16 {
            return Err(Error::corrupt_msg(
                loc(),
                "symlink",
                format!("target length {size} too long"),
            ));
        }
        let size = size as usize;
        match map {
            BlockMap::None => Ok(inode.base.block[..size.min(60)].to_vec()),
            BlockMap::Inline(d) => Ok(d[..size.min(d.len())].to_vec()),
            _ => match map.map(self, 0)? {
                Mapping::Mapped {
                    pblk, uninit: false, ..
                } => {
                    let b = self.buffer(pblk)?;
                    Ok(b.data[..size].to_vec())
                }
                _ => Err(Error::corrupt_msg(
                    loc(),
                    "symlink",
                    "slow symlink without a data block",
                )),
            },
        }
    }
}
