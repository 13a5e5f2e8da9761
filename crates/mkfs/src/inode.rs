//! Inode records as mke2fs writes them: the reserved inode numbers, a fresh
//! record with every time set, and the size and block-count fields.

use ext4kit_format::inode::{Inode, TimeField, Timestamp};

use crate::error::{MkfsError, Result};

/// The bad-blocks inode (`EXT2_BAD_INO`).
pub(crate) const BAD_INO: u32 = 1;
/// The root directory (`EXT2_ROOT_INO`).
pub(crate) const ROOT_INO: u32 = 2;
/// The resize inode (`EXT2_RESIZE_INO`).
pub(crate) const RESIZE_INO: u32 = 7;
/// The journal (`EXT2_JOURNAL_INO`).
pub(crate) const JOURNAL_INO: u32 = 8;
/// lost+found: the first non-reserved inode.
pub(crate) const LPF_INO: u32 = 11;
/// `s_first_ino` (`EXT2_GOOD_OLD_FIRST_INO`): 1..10 are reserved.
pub(crate) const FIRST_INO: u32 = 11;
/// `sizeof(struct ext2_inode_large)`: inodes at least this big get
/// `i_extra_isize = 32`.
const LARGE_INODE: u64 = 160;

/// What a fresh inode record holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewInode {
    /// `i_mode` (type and permissions; 0 for an unused reserved inode).
    pub(crate) mode: u16,
    /// `i_links_count`.
    pub(crate) links: u16,
    /// atime, ctime, mtime and crtime, in seconds.
    pub(crate) time: i64,
    /// Set `i_extra_isize = 32` when the record has room for the large
    /// fields (`extra_isize`, and every in-use inode of mke2fs).
    pub(crate) extra_isize: bool,
}

/// A fresh inode record of `inode_size` bytes.
pub(crate) fn new_inode(inode_size: u64, spec: NewInode) -> Result<Inode> {
    let mut ino = Inode::parse_raw(&vec![0u8; inode_size as usize]).map_err(|source| MkfsError::Format {
        context: "a new inode".into(),
        source,
    })?;
    ino.base.mode = spec.mode;
    ino.base.links_count = spec.links;
    if spec.extra_isize && inode_size >= LARGE_INODE {
        ino.extra.extra_isize = 32;
    }
    let ts = Timestamp {
        sec: spec.time,
        nsec: 0,
    };
    for f in [TimeField::Atime, TimeField::Ctime, TimeField::Mtime, TimeField::Crtime] {
        ino.set_time(f, ts);
    }
    Ok(ino)
}

/// Whether records of `inode_size` bytes carry the large fields
/// (`i_extra_isize` and the `_hi` / `crtime` times).
pub(crate) fn is_large(inode_size: u64) -> bool {
    inode_size >= LARGE_INODE
}

/// `i_size_lo` / `i_size_high`.
pub(crate) fn set_size(ino: &mut Inode, size: u64) {
    ino.base.set_size(size);
}

/// `i_blocks`: 512-byte sectors (no `HUGE_FILE` scaling: nothing mkfs
/// makes comes near 2^32 sectors).
pub(crate) fn set_blocks(ino: &mut Inode, fs_blocks: u64, bs: u64) {
    ino.base.set_blocks(fs_blocks * (bs / 512));
}
