//! Reading inode records from the inode tables.
//!
//! Inode `n` lives in group `(n-1) / s_inodes_per_group` at index
//! `(n-1) % s_inodes_per_group` of that group's table. On checksummed
//! filesystems a group flagged INODE_UNINIT, or an index beyond
//! `bg_itable_unused`, holds no valid inode: the table may be garbage.

use ext4kit_format::features::ro_compat;
use ext4kit_format::group_desc::BG_INODE_UNINIT;
use ext4kit_format::inode::Inode;

use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// The root directory's inode number.
pub const ROOT_INO: u32 = 2;

impl Volume {
    /// Read and verify inode `ino`.
    pub fn read_inode(&self, ino: u32) -> Result<Inode> {
        if ino == 0 || ino > self.geo().inodes_count() {
            return Err(Error::corrupt_msg(
                format!("inode {ino}"),
                "inode number",
                format!("outside 1..={}", self.geo().inodes_count()),
            ));
        }
        let idx = ino - 1;
        let g = (idx / self.geo().inodes_per_group()) as usize;
        let i = idx % self.geo().inodes_per_group();
        let group = self.groups().get(g).ok_or_else(|| {
            Error::corrupt_msg(
                format!("inode {ino}"),
                "inode number",
                format!("group {g} does not exist"),
            )
        })?;
        let gd = *group.desc().read();
        if self.geo().has_ro_compat(ro_compat::GDT_CSUM | ro_compat::METADATA_CSUM)
            && (gd.flags & BG_INODE_UNINIT != 0
                || i >= self.geo().inodes_per_group().saturating_sub(gd.itable_unused()))
        {
            return Err(Error::posix(
                Errno::EUCLEAN,
                format!("inode {ino} is in the unused part of group {g}'s inode table (a directory entry points at a free inode)"),
            ));
        }
        let off = i as u64 * self.geo().inode_size() as u64;
        let blk = gd.inode_table() + off / self.block_size() as u64;
        let within = (off % self.block_size() as u64) as usize;
        let buf = self
            .buffer(blk)
            .map_err(|e| super::error::annotate(e, &format!("inode table of group {g}")))?;
        self.stats().count_inode_read();
        Inode::parse(
            &buf.data[within..within + self.geo().inode_size()],
            ino,
            self.geo().csum_seed(),
        )
        .map_err(|e| Error::corrupt(format!("inode {ino} (block {blk})"), e))
    }
}
