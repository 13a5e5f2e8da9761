//! ext4kit: a user-space engine for ext2, ext3 and ext4 images.
//!
//! Open an image with [`Fs::open_image`] and use the POSIX-shaped API on the
//! returned `Arc<Fs>` from any number of threads, or give each worker a
//! [`Process`] with its own descriptor table.
//!
//! ```no_run
//! use ext4kit::{Fs, OpenOptions, OpenFlags};
//! let fs = Fs::open_image("disk.img", &OpenOptions::default())?;
//! for e in fs.read_dir(b"/")? {
//!     println!("{}", String::from_utf8_lossy(&e.name));
//! }
//! let f = fs.open(b"/etc/hostname", OpenFlags::default())?;
//! let mut buf = vec![0; 4096];
//! let n = f.read(&fs, &mut buf)?;
//! # Ok::<(), ext4kit::Error>(())
//! ```
//!
//! Layers (data flows down): [`vfs`] (caches, path walk, open files) →
//! [`ext4`] (ext4 semantics) → `ext4kit-format` (bytes) → `ext4kit-blockdev`.
//! The engine applies every filesystem rule itself (permissions, immutable
//! and append-only, the setuid/setgid/capability kill, default ACLs,
//! synchronous inodes and directories, the mount state): a frontend
//! translates its requests onto [`Fs`] and needs nothing else. [`device`],
//! [`mkfs`] and [`journal`] give it the rest of what it needs: devices and
//! partitions, making a filesystem, looking at a journal.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod device;
pub mod journal;
pub mod mkfs;
pub mod vfs;

/// The ext4 layer below (its own crate, so nothing in it can reach up into
/// [`vfs`]).
pub use ext4kit_ext4 as ext4;
pub use ext4kit_ext4::error;

/// The cache machinery below both layers: the memory budget, the cache
/// maps, clock eviction, the background worker and the cache type whose
/// misses never cache something older than a concurrent removal.
pub use ext4kit_cache as cache;

pub use device::Location;
pub use error::{Errno, Error, Result};
pub use ext4::{DirEntry, OpenOptions};
pub use ext4kit_format::inode::{FileType, Timestamp};
pub use ext4kit_format::time::Clock;
pub use vfs::acl_inherit::CreateMode;
pub use vfs::cred::Caller;
pub use vfs::mount::MountRecord;
pub use vfs::rename::RenameFlags;
pub use vfs::request::{Fallocate, WriteAt, WriteRequest, Written};
pub use vfs::{Access, Cred, DataLayout, Fd, File, Fs, FsInfo, FsStats, OpenFlags, Process, Run, Stat, Whence};
pub use vfs::{SetAttr, StatFs, TimeSet};

/// `Fs` is shared between threads by design; `File` and `Dentry` travel
/// between them; `Process` moves but is not shared (the unshared
/// descriptor table's lookup without atomics relies on it). Checked at compile time.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<Fs>();
    send_sync::<File>();
    send_sync::<vfs::Dentry>();
    send::<Process>();
};
