//! The device under the filesystem and raw block I/O on it, bounded by
//! the filesystem's size: every block read or written that bypasses the
//! buffer cache (file data runs, checkpoints, the superblock's error
//! record) goes through here, so a damaged block pointer can never make us
//! read or write outside the filesystem, and a read-only volume never
//! writes.
//!
//! Locking: none of its own. The device does its own (positional I/O);
//! who may write which block when is the caller's rule (the buffer
//! cache's stripe locks, the checkpoint's ordering).

use std::sync::Arc;

use ext4kit_blockdev::BlockDevice;

use crate::error::{Errno, Error, Result};
use crate::geometry::Geometry;

/// The device, whether it may be written, and the block bounds raw I/O
/// checks against.
pub struct Disk {
    dev: Arc<dyn BlockDevice>,
    read_only: bool,
    block_size: usize,
    first_data_block: u64,
    blocks_count: u64,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("read_only", &self.read_only)
            .field("blocks_count", &self.blocks_count)
            .finish()
    }
}

impl Disk {
    /// `dev` holding a filesystem shaped as `geo` says.
    pub fn new(dev: Arc<dyn BlockDevice>, read_only: bool, geo: &Geometry) -> Disk {
        Disk {
            dev,
            read_only,
            block_size: geo.block_size(),
            first_data_block: geo.first_data_block(),
            blocks_count: geo.blocks_count(),
        }
    }

    /// The device underneath.
    #[inline]
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// Opened without write access: every write is refused (EROFS).
    #[inline]
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Read whole blocks starting at `block` into `buf` (a multiple of the
    /// block size), bypassing the cache. Used for file data runs.
    pub fn read_raw(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        let n = (buf.len() / self.block_size) as u64;
        if block < self.first_data_block && block != 0 || block.checked_add(n).is_none_or(|e| e > self.blocks_count) {
            return Err(Error::corrupt_msg(
                format!("block {block}"),
                "block map",
                format!(
                    "block {block}+{n} outside the filesystem ({} blocks)",
                    self.blocks_count
                ),
            ));
        }
        self.dev
            .read_at(block * self.block_size as u64, buf)
            .map_err(|e| Error::io(format!("reading block {block}"), e))
    }

    /// Write whole blocks at `block` straight to the device.
    pub fn write_raw(&self, block: u64, data: &[u8]) -> Result<()> {
        if self.read_only {
            return Err(Error::posix(Errno::EROFS, "filesystem is read-only"));
        }
        self.write_blocks(block, data, false)
    }

    /// Write metadata blocks home (the checkpoint): like [`Self::write_raw`],
    /// but block 0 may be among them when it holds the primary superblock
    /// (blocks larger than 1 KiB), which a journal logs like any other
    /// metadata block. File data never goes to block 0: a block map naming
    /// it is corrupt, and `write_raw` refuses it.
    pub fn write_meta_raw(&self, block: u64, data: &[u8]) -> Result<()> {
        self.write_blocks(block, data, self.block_size > 1024)
    }

    fn write_blocks(&self, block: u64, data: &[u8], sb_block_ok: bool) -> Result<()> {
        if self.read_only {
            return Err(Error::posix(Errno::EROFS, "filesystem is read-only"));
        }
        let n = (data.len() / self.block_size) as u64;
        if block == 0 && !sb_block_ok || block.checked_add(n).is_none_or(|e| e > self.blocks_count) {
            return Err(Error::corrupt_msg(
                format!("block {block}"),
                "block map",
                "write outside the filesystem",
            ));
        }
        self.dev
            .write_at(block * self.block_size as u64, data)
            .map_err(|e| Error::io(format!("writing block {block}"), e))
    }

    /// Refuse a metadata block pointer outside the filesystem (or block 0,
    /// which holds the boot sector and superblock, never a map's block).
    #[inline]
    pub fn check_meta_block(&self, block: u64) -> Result<()> {
        if block == 0 || block >= self.blocks_count {
            return Err(Error::corrupt_msg(
                format!("block {block}"),
                "block pointer",
                format!(
                    "metadata block {block} outside the filesystem ({} blocks)",
                    self.blocks_count
                ),
            ));
        }
        Ok(())
    }
}
