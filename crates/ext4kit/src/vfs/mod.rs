//! The vfs layer: the [`Fs`] handle every frontend calls (`fs.rs`, the
//! API), the filesystem's state it wraps (`super_block.rs`: the volume and
//! the caches), one module per operation, and the caches and concurrency
//! machinery of the five principles (dentry cache and lock-free path walk,
//! inode cache, page cache, open files with atomic positions, descriptor
//! tables).

pub mod acl;
pub mod acl_inherit;
pub mod attr;
pub mod cred;
pub mod dcache;
mod evict;
mod export;
pub mod fdtable;
mod fiemap;
pub mod file;
mod fill_super;
mod fs;
pub mod fslabel;
pub mod holds;
pub mod icache;
pub mod iflags;
mod inode_table;
pub mod io;
pub mod killpriv;
pub mod lookup;
pub mod mount;
pub mod namei;
pub mod namespace;
mod open;
pub mod pagecache;
pub mod pin;
mod pin_word;
mod read;
mod read_write;
mod readdir;
mod releasing;
pub mod rename;
pub mod request;
pub mod shared;
mod stat;
mod super_block;
pub mod syncmode;
mod target;
pub mod whiteout;
pub mod write;
pub mod writeback;
pub mod xattr_ops;

/// An empty 8 MiB filesystem made by our mkfs in memory, opened
/// read-write: what the unit tests beside the vfs code start from.
#[cfg(test)]
pub(crate) fn mem_fs() -> std::sync::Arc<Fs> {
    let dev = std::sync::Arc::new(ext4kit_blockdev::MemDevice::new(8 << 20));
    ext4kit_mkfs::mkfs(&*dev, 8 << 20, &ext4kit_mkfs::MkfsOptions::default()).unwrap();
    let opts = crate::OpenOptions {
        read_only: false,
        cache_budget: 8 << 20,
        ..Default::default()
    };
    Fs::open_device(dev, &opts).unwrap()
}

pub use attr::{SetAttr, StatFs, TimeSet};
pub use cred::Cred;
pub use dcache::Dentry;
pub use fdtable::{Fd, Process};
pub use fiemap::{DataLayout, Run};
pub use file::{Access, File, OpenFlags, Whence};
pub use fs::Fs;
pub use icache::CachedInode;
pub use inode_table::{InodeTable, TableInode};
pub use stat::{statx_attributes, FsInfo, FsStats, Stat};
pub use target::Target;
pub use writeback::{SyncLevel, WritebackStats};

pub(crate) use ext4kit_cache::clock::touch;
