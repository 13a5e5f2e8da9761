//! `statfs` numbers for the mount.

use ext4kit::Fs;

/// What `STATFS` replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Data blocks (total minus the fixed metadata overhead, as ext4).
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

/// The filesystem's counts, from the engine's `Fs::statfs` (live group
/// descriptor counts, overhead counted like `ext4_calculate_overhead`).
/// One function, so the reply is shaped in one place.
pub fn statfs(fs: &Fs) -> ext4kit::Result<StatFs> {
    let s = fs.statfs()?;
    Ok(StatFs {
        blocks: s.blocks,
        bfree: s.blocks_free,
        bavail: s.blocks_avail,
        files: s.files,
        ffree: s.files_free,
        bsize: s.block_size,
        namelen: s.name_max,
    })
}
