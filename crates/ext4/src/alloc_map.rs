//! Giving an empty inode its data blocks: map the whole range through
//! [`bmap_write::map_blocks`] (the one mapping path: extent trees of any depth,
//! or indirect maps on ext2/ext3 images, which never gain the extent
//! feature), then write the data into the new runs.
//!
//! Data blocks are written to the device before the handle commits the
//! metadata that points at them (ordered mode), so a crash never exposes a
//! block map pointing at stale data.

use ext4kit_format::inode::Inode;

use super::bmap_write::{self, MapRequest};
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// Store `data` as the contents of inode `ino` (record `rec`), which must
/// have no blocks yet. Updates size, block map and `i_blocks` in `rec`;
/// the caller writes the record through the same handle. On error no
/// block stays allocated (see [`bmap_write::map_blocks`]). Public: the
/// vfs layer's whole-file write for image building goes through it.
pub fn store(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode, data: &[u8]) -> Result<()> {
    if rec.size() != 0 || rec.base.blocks_lo != 0 || rec.base.blocks_high != 0 {
        return Err(Error::posix(Errno::EINVAL, format!("inode {ino} already has data")));
    }
    let bs = vol.block_size();
    let nblocks = data.len().div_ceil(bs) as u64;
    let runs = bmap_write::map_blocks(
        vol,
        h,
        ino,
        rec,
        MapRequest {
            lblk: 0,
            len: nblocks,
            uninit: false,
        },
    )?;
    // Data first (ordered mode), in one write per run.
    for r in &runs {
        let start = r.lblk as usize * bs;
        let end = (start + r.len as usize * bs).min(data.len());
        let mut buf = data[start..end].to_vec();
        buf.resize(r.len as usize * bs, 0);
        if let Err(e) = vol.disk().write_raw(r.pblk, &buf) {
            bmap_write::punch(vol, h, ino, rec, 0..u64::MAX)?;
            return Err(e);
        }
    }
    let size = data.len() as u64;
    rec.base.set_size(size);
    Ok(())
}
