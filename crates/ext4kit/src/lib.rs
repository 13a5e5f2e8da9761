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
//! let n = fs.read(&f, &mut buf)?;
//! # Ok::<(), ext4kit::Error>(())
//! ```
//!
//! Every call names what it acts on with a [`Target`]: a path, a name in
//! a directory ([`Target::at`]) or an inode number — one `stat`,
//! `setxattr` or `unlink` for a program with paths and for a server that
//! holds inode numbers. Calls that take more than a few arguments take a
//! request: a new inode of any kind is a [`NewInode`], an open on behalf
//! of a caller an [`OpenRequest`], a write by inode a [`WriteRequest`].
//! Each call that checks permissions takes the caller's [`Cred`].
//!
//! ```no_run
//! use ext4kit::{Access, Cred, Fs, NewInode, OpenFlags, OpenOptions, OpenRequest, Target};
//! let fs = Fs::open_image("disk.img", &OpenOptions { read_only: false, ..Default::default() })?;
//! // Image building: root makes the tree, with the owners it should have.
//! fs.create(&NewInode::dir(b"/home"))?;
//! fs.create(&NewInode::dir(b"/home/ada").mode(0o700).owner(1000, 1000))?;
//! // Acting for a user: her rights are checked, her umask applies.
//! let ada = Cred::user(1000, 1000);
//! let flags = OpenFlags { access: Access::WriteOnly, create: true, ..Default::default() };
//! let f = fs.open_as(b"/home/ada/notes", &OpenRequest::new(flags).mode((0o666, 0o022)).cred(&ada))?;
//! fs.write(&f, b"hello\n")?;
//! fs.fsync(&f)?;
//! fs.close_file(f)?;
//! // A server that holds inode numbers names an entry by its directory.
//! let home = fs.stat(b"/home/ada")?.ino;
//! fs.unlink(Target::at(home, b"notes"), &ada)?;
//! fs.sync()?;
//! # Ok::<(), ext4kit::Error>(())
//! ```
//!
//! Layers (data flows down): [`Fs`], the API, over [`vfs`] (caches, path
//! walk, open files, one module per operation) →
//! [`ext4`] (ext4 semantics) → `ext4kit-format` (bytes) → `ext4kit-blockdev`.
//! The engine applies every filesystem rule itself (permissions, immutable
//! and append-only, the setuid/setgid/capability kill, default ACLs,
//! synchronous inodes and directories, the mount state): a frontend
//! translates its requests onto [`Fs`] and needs nothing else. [`device`],
//! [`mkfs`] and [`journal`] give it the rest of what it needs: devices and
//! partitions, making a filesystem, looking at a journal.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod device;
pub mod journal;
pub mod mkfs;
pub mod readers;
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
/// What an inode record's checksum says ([`TableInode::check`]).
pub use ext4::inode_table_scan::RecordCheck;
pub use ext4::{DirEntry, OpenOptions};
pub use ext4kit_format::inode::{FileType, Timestamp};
pub use ext4kit_format::time::Clock;
pub use vfs::cred::Caller;
pub use vfs::mount::MountRecord;
pub use vfs::rename::RenameFlags;
pub use vfs::request::{
    CreateMode, Fallocate, NewInode, NodeKind, OpenRequest, PermCheck, WriteAt, WriteRequest, Written,
};
pub use vfs::{Access, Cred, DataLayout, Fd, File, Fs, FsInfo, FsStats, OpenFlags, Process, Run, Stat, Whence};
pub use vfs::{InodeTable, SetAttr, StatFs, SyncLevel, TableInode, Target, TimeSet};

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
