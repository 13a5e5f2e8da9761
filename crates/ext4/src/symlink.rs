//! Symbolic links: "fast" links keep their target in `i_block` (targets
//! under 60 bytes, no data block; [`super::inode::is_fast_symlink`]),
//! "slow" links in a data block, and with inline_data in the inode's
//! inline area.

use ext4kit_format::inode::Inode;

use super::bmap::{BlockMap, Mapping};
use super::volume::Volume;
use crate::error::{Error, Result};

/// Read the target of symlink `ino` (record `rec`, block map `map`).
/// Public: the vfs layer's readlink.
pub fn read(vol: &Volume, ino: u32, rec: &Inode, map: &BlockMap) -> Result<Vec<u8>> {
    let size = rec.size();
    let loc = || format!("symlink inode {ino}");
    if size > vol.block_size() as u64 || size > 4096 * 16 {
        return Err(Error::corrupt_msg(
            loc(),
            "symlink",
            format!("target length {size} too long"),
        ));
    }
    let size = size as usize;
    match map {
        BlockMap::None => Ok(rec.base.block[..size.min(60)].to_vec()),
        BlockMap::Inline(d) => Ok(d[..size.min(d.len())].to_vec()),
        _ => match map.map(vol, 0)? {
            Mapping::Mapped {
                pblk, uninit: false, ..
            } => {
                let b = vol.buffer(pblk)?;
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
