//! Giving an empty inode its data blocks: map the whole range through
//! [`Volume::map_blocks`] (the one mapping path: extent trees of any depth,
//! or indirect maps on ext2/ext3 images, which never gain the extent
//! feature), then write the data into the new runs.
//!
//! Data blocks are written to the device before the handle commits the
//! metadata that points at them (ordered mode), so a crash never exposes a
//! block map pointing at stale data.

use ext4kit_format::inode::Inode;

use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

impl Volume {
    /// Store `data` as the contents of `inode` (number `ino`), which must
    /// have no blocks yet. Updates size, block map and `i_blocks` in
    /// `inode`; the caller writes the inode through the same handle. On
    /// error no block stays allocated (see `map_blocks`).
    pub fn write_new_data(&self, h: &mut Handle<'_>, ino: u32, inode: &mut Inode, data: &[u8]) -> Result<()> {
        if inode.size() != 0 || inode.base.blocks_lo != 0 || inode.base.blocks_high != 0 {
            return Err(Error::posix(Errno::EINVAL, format!("inode {ino} already has data")));
        }
        let bs = self.block_size();
        let nblocks = data.len().div_ceil(bs) as u64;
        let runs = self.map_blocks(h, ino, inode, 0, nblocks, false)?;
        // Data first (ordered mode), in one write per run.
        for r in &runs {
            let start = r.lblk as usize * bs;
            let end = (start + r.len as usize * bs).min(data.len());
            let mut buf = data[start..end].to_vec();
            buf.resize(r.len as usize * bs, 0);
            if let Err(e) = self.disk().write_raw(r.pblk, &buf) {
                self.punch_blocks(h, ino, inode, 0, u64::MAX)?;
                return Err(e);
            }
        }
        let size = data.len() as u64;
        inode.base.set_size(size);
        Ok(())
    }
}
