//! The FUSE server of ext4kit: `ext4kit mount IMAGE DIR` makes an ext2/3/4
//! image usable by every program, through the kernel's FUSE driver.
//!
//! It is a thin translation onto [`ext4kit::Fs`] ([`server`]): kernel node
//! ids to ext4 inode numbers ([`nodes`], the one place where FUSE's root 1
//! becomes ext4's root 2), engine results to attributes ([`attr`]) and
//! errors to errnos ([`errno`]), open files and directory listings to
//! handles ([`handles`]). The mount lifecycle is in [`lifecycle`]; refusing
//! images already in use in [`inuse`].
//!
//! # Caching and timeouts
//!
//! While mounted, this server is the only writer of the image: the image is
//! locked (`flock`) and refused if the kernel or another FUSE server has it
//! mounted. Every change therefore passes through the kernel in front of us,
//! and the kernel updates or drops its own caches for the objects a request
//! touches (a write updates size and page cache; unlink/rename/create drop
//! or replace the dentries involved and invalidate the parent's attributes
//! and cached listing). Nothing changes behind the kernel's back, so:
//!
//! - entry and attribute timeouts are long ([`server::TTL`], one day, as
//!   virtiofs' `cache=always`), negative lookups are cached with the same
//!   timeout (a reply with node id 0);
//! - open files keep their page cache across opens (`FOPEN_KEEP_CACHE`),
//!   directories may be cached by the kernel (`FOPEN_CACHE_DIR`), symlink
//!   targets too (`FUSE_CACHE_SYMLINKS`);
//! - read-only mounts negotiate `FUSE_NO_OPEN_SUPPORT`: OPEN answers ENOSYS
//!   once and the kernel then opens and closes files without asking us
//!   (reads and SEEK_DATA/SEEK_HOLE go by inode number), so open/close of
//!   a cached file costs no round trip at all.
//!
//! The invalidation we rely on is the kernel's own, after requests it
//! sends. Should the engine ever change something on its own (none does
//! today: no background jobs edit the namespace), it must notify the kernel
//! (`Notifier::inval_inode` / `inval_entry`).
//!
//! # Permissions
//!
//! Always mounted with `default_permissions`: the kernel checks mode bits,
//! owners and groups (including supplementary groups, which FUSE requests
//! do not carry) against the attributes we return, before sending the
//! request. `ACCESS` is still answered (via `Cred::may`) for kernels or
//! configurations that send it.
//!
//! # Threads
//!
//! N request threads (`--threads`, default: the number of CPUs), each with
//! its own cloned `/dev/fuse` descriptor when it can be opened; lookups and
//! readdirs in one directory may run in parallel (`FUSE_PARALLEL_DIROPS`).
//! The engine underneath is built for that: lock-free caches, per-inode
//! locks, no filesystem-wide lock.
//!
//! # Not yet served
//!
//! The mount is read-only until the write engine is merged: `-o rw` is
//! refused with [`lifecycle::RW_PENDING`] and every write request (setattr,
//! mknod, mkdir, unlink, rmdir, symlink, rename, link, create, write,
//! fallocate, setxattr, removexattr, copy_file_range) answers EROFS.

pub mod attr;
pub mod errno;
mod fusermount;
pub mod handles;
pub mod inuse;
pub mod lifecycle;
pub mod nodes;
pub mod server;
pub mod state;
pub mod statfs;
mod sys;

pub use lifecycle::{mount, parse_options, run_detached, run_foreground, unmount, MountOptions, Mounted, SUBTYPE};
pub use server::{CacheMode, Ext4Fuse};
