//! The ext4 layer: ext4 semantics over a block device — superblock and
//! groups, inodes, block maps, directories and htree, xattrs, symlinks.
//! It knows nothing of open files or caching policy above the metadata
//! buffer cache; the vfs layer calls down into it.

pub mod alloc_map;
pub mod balloc;
pub mod bmap;
pub mod bmap_write;
pub mod buffer;
pub mod checkpoint;
pub mod dir;
pub mod dir_delete;
pub mod dir_insert;
pub mod dx_split;
pub mod extent_tree;
pub mod fc_replay;
pub mod group;
pub mod htree;
pub mod ialloc;
pub mod indirect_map;
pub mod inode;
pub mod journal;
pub mod mkfs;
pub mod orphan;
pub mod symlink;
pub mod transaction;
pub mod volume;
pub mod xattr;
pub mod xattr_write;

pub use bmap::{BlockMap, Mapping};
pub use dir::{DirEntry, DirRef};
pub use inode::ROOT_INO;
pub use volume::{OpenOptions, Volume};
