//! The ext4 layer of ext4kit: ext4 semantics over a block device —
//! superblock and groups, inodes, block maps, directories and htree,
//! xattrs, symlinks, orphans, the metadata buffer cache and what the
//! journal (jbd2's) sees of it, transaction handles, journal recovery at
//! open and fast-commit replay.
//!
//! It knows nothing of open files, paths or the page cache: the vfs layer
//! (the `ext4kit` crate) calls down into it, and this crate cannot call up
//! — it is a crate of its own so that the compiler holds that direction
//! (ARCHITECTURE.md's layers). The cache machinery both layers use (memory
//! budget, concurrent maps, clock sweeps, the background worker, the cache
//! type) is the `ext4kit-cache` crate, below both.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod error;
pub mod fs_errors;

pub mod alloc_map;
pub mod balloc;
pub mod bitmap;
pub mod bmap;
pub mod bmap_write;
pub mod buffer;
pub mod busy;
pub mod dir;
pub mod dir_delete;
pub mod dir_insert;
pub mod dir_leaf;
pub mod dir_slack;
pub mod dirblock;
pub mod disk;
pub mod dx_split;
pub mod extent_tree;
pub mod fc_replay;
pub mod geometry;
pub mod group;
pub mod htree;
pub mod ialloc;
pub mod indirect_map;
pub mod inode;
pub mod inode_table_scan;
pub mod journal;
pub mod journal_io;
pub mod orphan;
pub mod orphan_links;
pub mod owner_scan;
pub mod owners;
pub mod release_check;
pub mod reservation;
pub mod stats;
pub mod superblock;
pub mod symlink;
pub mod system_zone;
pub mod transaction;
pub mod volume;
pub mod write_access;
pub mod xattr;
pub mod xattr_write;

pub use bmap::{BlockMap, Mapping};
pub use dir::DirEntry;
pub use dirblock::DirRef;
pub use error::{Errno, Error, Result};
pub use inode::ROOT_INO;
pub use volume::{OpenOptions, Volume};
