//! `statfs` numbers for the mount.

use ext4kit::Fs;

/// What `STATFS` replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Total data blocks.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks available to unprivileged users (free minus reserved).
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
}

/// The filesystem's counts. One function so it can switch to an engine
/// `Fs::statfs` when there is one: today it reads the superblock summary
/// (`Fs::info`), whose free counts the engine keeps current from the group
/// descriptors (`sync_super` sums them). Unlike the kernel's `ext4_statfs`
/// the metadata overhead is not subtracted from `blocks`.
pub fn statfs(fs: &Fs) -> StatFs {
    let i = fs.info();
    StatFs {
        blocks: i.blocks,
        bfree: i.free_blocks,
        bavail: i.free_blocks.saturating_sub(i.reserved_blocks),
        files: u64::from(i.inodes),
        ffree: u64::from(i.free_inodes),
        bsize: i.block_size,
        namelen: 255,
    }
}
