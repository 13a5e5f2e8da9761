//! The FUSE server of ext4kit: `ext4kit mount IMAGE DIR` makes an ext2/3/4
//! image usable by every program, through the kernel's FUSE driver.
//!
//! It is a thin translation onto [`ext4kit::Fs`] ([`server`]): kernel node
//! ids to ext4 inode numbers ([`nodes`], the one place where FUSE's root 1
//! becomes ext4's root 2), engine results to attributes ([`attr`]) and
//! errors to errnos ([`errno`]), open files and directory listings to
//! handles ([`handles`]). The mount lifecycle is in [`lifecycle`]; refusing
//! images already in use in [`inuse`]. The filesystem may be one partition
//! of a partitioned disk or start at an offset (`-o partition=N`, `-o
//! offset=BYTES`: [`MountOptions::location`]); the engine opens the
//! image at that location. `-o noload` serves the home locations without journal replay,
//! read-only.
//!
//! # Read-only or read-write
//!
//! A mount is read-write unless `-o ro` is given or the image must not be
//! written: a read-only-compatible feature we cannot maintain, the
//! `read-only` feature, `mmp` (we do not run the MMP protocol), or an image
//! file we cannot open for writing. (A journal that needs recovery is
//! replayed first: on disk for a read-write mount, in memory for a
//! read-only one, as the kernel's mount does.) Then it mounts
//! read-only with a warning naming the reason, and `-o rw` is refused with
//! it. The reason is the engine's (`Fs::read_only_reason`: it decides
//! before writing anything); the policy is [`lifecycle`]'s. While mounted
//! read-write the superblock records the mount (`Fs::record_mount`:
//! `s_mnt_count` + 1, `s_mtime`, `s_last_mounted`, and `s_state` without
//! `EXT2_VALID_FS` on an image without a journal, as the kernel's
//! `ext4_setup_super`); a clean unmount (umount, SIGINT/SIGTERM/SIGHUP)
//! flushes everything, restores `s_state` and sets `s_wtime`
//! (`Fs::record_unmount`). A crash leaves an image e2fsck knows to check.
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
//!   directories may be cached by the kernel (`FOPEN_CACHE_DIR`; the
//!   listing is taken at the first READDIR, under the kernel's directory
//!   lock, so the cache never holds one older than its version), symlink
//!   targets too (`FUSE_CACHE_SYMLINKS`);
//! - files are opened with OPEN, replied with `FOPEN_KEEP_CACHE` and
//!   `FOPEN_NOFLUSH`: one round trip per open (RELEASE is sent in the
//!   background), because only OPEN can refuse a writable open of an
//!   immutable or append-only inode as ext4's `may_open` does (FUSE inodes
//!   carry no S_IMMUTABLE/S_APPEND for the kernel to check; xfstests
//!   generic/079). `-o no_open` (write-through caching only) trades that
//!   for speed: OPEN answers ENOSYS once and the kernel then opens and
//!   closes files without asking us (`FUSE_NO_OPEN_SUPPORT`); reads,
//!   writes, fsync, fallocate and lseek go by inode number, FLUSH answers
//!   ENOSYS once too, so open/read/close of a cached file costs no round
//!   trip at all, and an immutable file's first write is refused instead
//!   of its open. RELEASE is not needed for the last close of an unlinked
//!   file: the kernel keeps its lookup reference to an open file's inode
//!   until after the last close, and our reference ([`nodes`]) keeps the
//!   inode allocated until its FORGET. Each WRITE says whether it appends
//!   and whether to clear setuid/setgid (`FUSE_WRITE_KILL_SUIDGID`); the
//!   engine's write path refuses immutable inodes and positions
//!   append-only ones. `FUSE_ATOMIC_O_TRUNC` is not negotiated: with it
//!   the kernel hands O_TRUNC to OPEN before its ETXTBSY check, so a
//!   truncating open of a running binary emptied it (see `init`); O_TRUNC
//!   arrives as a SETATTR of the size after the check instead.

//! # Round trips and busy polling
//!
//! A request costs a round trip through the kernel: on these 2-vCPU
//! virtual machines ~110-250 µs when the server thread has to be woken on
//! another, halted CPU. While requests keep coming (up to 2 ms after the
//! last one; `-o busy_poll=0` turns it off) the mount spends one CPU to
//! avoid that ([`busypoll`]): on two CPUs a spinning thread keeps the
//! caller's other CPU busy so the server is woken on the caller's own
//! (18-20 µs per round trip); on more, one server thread spins on its
//! descriptor (~30 µs here). Most of the work above is about sending fewer
//! requests; busy polling makes the rest cheaper. Measured with `getxattr`
//! of a missing name in a loop (one round trip each, medians of 5 × 5000).
//!
//! File data (`-o cache=`, [`CacheMode`]); the default is write-through:
//! the kernel page cache serves reads (and keeps them across opens), every
//! `write()` is sent at once (up to `max_write` = 1 MiB per request), and
//! the engine's own page cache buffers it (delayed allocation; written back
//! by fsync, memory pressure or unmount). Measured on this 2-core VM
//! (release build, 3 GiB image, `/tmp/bench` scripts: dd, fio psync
//! 4 KiB over 256 MiB for 8 s, cat of 3000 small files; the machine is
//! shared and noisy, so runs differ by up to 2x — ranges are two or three
//! runs; seconds or IOPS):
//!
//! | workload | write-through | write-back cache | direct I/O |
//! |---|---|---|---|
//! | dd 1 GiB bs=1M conv=fsync | 4.6–7.8 s | 5.5–12.4 s | 4.0–9.1 s |
//! | read it back (caches dropped) | 1.4–4.2 s | 2.0–6.9 s | 1.2–4.7 s |
//! | dd 100 MB bs=4k conv=fsync | 0.7–1.4 s (6.6 s before KILLPRIV_V2) | 2.6–3.8 s | 1.2–1.5 s |
//! | dd 200 KB bs=1 conv=fsync | 7.0–16 s | 7.2–13.7 s | 9.5–23 s |
//! | fio 4k randwrite | 14.1k (3.3–5.3k before KILLPRIV_V2) | 5.7–12.7k | 8.0–17.2k |
//! | fio 4k randread | 8.2–15.7k | 11.1–19.8k | 8.4–12.5k |
//! | cat 3000 small files ×5, warm | 3.6–4.1 s | 5.2–5.5 s | 6.1–16.8 s |
//! | cat one 1 MiB file ×300 | 0.50 s | 0.47 s | 1.18 s |
//!
//! `FUSE_HANDLE_KILLPRIV_V2` matters most: without it the kernel sends a
//! GETXATTR(security.capability) before every write() to decide whether
//! to kill setuid bits (`file_remove_privs`); with it the mount gets
//! SB_NOSEC and we clear the bits ourselves (writes by openers without
//! CAP_FSETID, truncations and fallocate by non-root callers: [`killpriv`]).
//!
//! Write-back caching wins some small-write cases but is not the default.
//! Above all, the kernel then accepts write() into its own cache without
//! asking us, so a full disk cannot be refused where the writer sees it
//! (ext4's delayed-allocation reservation, which write-through keeps): a
//! writer of a 64 MiB image had 6.5 GB accepted while every write-back
//! failed with ENOSPC. The failure reaches only fsync and close (the
//! kernel's error on the file) and `ext4kit umount`'s exit status
//! ([`server::LostWriteback`]). Also,
//! the kernel keeps written data to itself until it writes pages back,
//! and FUSE's SEEK_DATA/SEEK_HOLE (`fuse_lseek`) does not write back
//! first, so a freshly written sparse file reports holes where its data is
//! (the rw tests fail that way with `cache=writeback`); it also made
//! sequential writes slower (FUSE's strict dirty limits). Direct I/O wins
//! cold sequential reads (no double caching), but every read of hot data
//! becomes a round trip (warm re-reads 1.5–4× slower), which the page-cache
//! modes answer without us. Write-through keeps SEEK_DATA, mmap (written
//! back at munmap/msync through WRITE) and read caching exact, and with
//! KILLPRIV_V2 its writes are as fast as direct I/O's: it is the default.

//! The invalidation we rely on is the kernel's own, after requests it
//! sends. Should the engine ever change something on its own (none does
//! today: no background jobs edit the namespace), it must notify the kernel
//! (`Notifier::inval_inode` / `inval_entry`).
//!
//! # Permissions and credentials
//!
//! Always mounted with `default_permissions`: the kernel checks mode bits,
//! owners and groups (including supplementary groups, which FUSE requests
//! do not carry) against the attributes we return, before sending the
//! request. Every request still passes the caller's uid/gid (and groups,
//! read from /proc for non-root callers) to the engine as a `Cred`: new
//! inodes belong to the caller (or take a set-group-id directory's group),
//! sticky directories, xattr namespaces and immutable/append-only inodes are
//! the engine's checks, and writes by non-root openers clear setuid. OPEN
//! leaves mode bits to the kernel (`PermCheck::Done`: with write-back
//! caching the kernel widens O_WRONLY to O_RDWR). SETATTR from a caller who
//! is neither owner nor root can only be one the kernel made itself (the
//! setuid kill after a write, or write-back's time flush) and runs with
//! root's rights. `ACCESS` is answered via the engine for configurations
//! that send it.
//!
//! # Transport
//!
//! Requests travel between the kernel and the server one of two ways
//! (`-o transport=auto|uring|dev`, [`TransportChoice`]; the default is
//! `$EXT4KIT_TRANSPORT`, else `auto`):
//!
//! - **FUSE over io_uring** (Linux 6.14+), used when the kernel offers it
//!   in FUSE_INIT, which it does only while the fuse module's parameter
//!   `enable_uring` is Y (root: `echo Y >
//!   /sys/module/fuse/parameters/enable_uring`; it applies to mounts made
//!   after). The mount never changes that parameter itself: it is
//!   machine-wide, and enabling it is the administrator's decision. The
//!   kernel keeps one request queue per possible CPU and queues a request
//!   on the caller's CPU; each queue has its own server threads, each with
//!   its own io_uring and ring entry, pinned to that CPU, so the caller's
//!   own CPU answers and a request costs one `io_uring_enter` (commit of
//!   the reply + fetch of the next request) instead of a `read()` and a
//!   `write()` on `/dev/fuse`. FORGET, BATCH_FORGET and INTERRUPT still
//!   come through `/dev/fuse` (one thread reads it), and notifications
//!   ([`killpriv::Invalidator`]) are still written to it
//!   (fs/fuse/dev_uring.c, `fuse_io_uring_ops`). The transport lives in our
//!   copy of fuser (`vendor/fuser/src/uring.rs`; fuser 0.18 has none and
//!   keeps its request dispatch private).
//! - **`/dev/fuse`**: N threads each `read()` requests and `write()`
//!   replies, each on its own cloned descriptor when it can be opened.
//!
//! `auto` falls back to `/dev/fuse` when the kernel does not offer io_uring
//! or its rings cannot be set up (a refused registration makes the kernel
//! go back to `/dev/fuse` for the connection); `uring` refuses to mount
//! then, naming the reason; `dev` never asks for io_uring.
//! [`Mounted::transport`] and [`Mounted::describe`] say which one a mount
//! uses (`ext4kit mount -v` prints it, the server's status file records
//! it). Busy polling ([`busypoll`]) is for `/dev/fuse` only: over io_uring
//! the server thread of the caller's own CPU is woken, which is what the
//! spinning buys on `/dev/fuse`.
//!
//! # Threads
//!
//! N request threads (`--threads`, default: the number of CPUs; over
//! io_uring at least one per CPU queue, `N / queues` each), on `/dev/fuse`
//! each with its own cloned descriptor when it can be opened; lookups and
//! readdirs in one directory may run in parallel (`FUSE_PARALLEL_DIROPS`),
//! reads of one file too (`FUSE_ASYNC_READ`), with up to
//! [`server::MAX_BACKGROUND`] background requests; with the read-spinning
//! style of busy polling, the thread reading the session's own descriptor
//! is the one that spins. The engine
//! underneath is built for that: lock-free caches, per-inode locks, no
//! filesystem-wide lock. A panic in any thread of a serving process is
//! written to stderr with a backtrace and named in the unmount's result
//! ([`panics`], which also says what it does to the mount).
//!
//! # POSIX extras
//!
//! POSIX ACLs with the kernel enforcing them and us inheriting default
//! ACLs (`FUSE_POSIX_ACL` + `FUSE_DONT_MASK`, see `Ext4Fuse::init`); the
//! setuid/setgid/capability kill ([`killpriv`]); file handles across
//! cache drops and remounts ([`export`]); RENAME_WHITEOUT
//! (`ext4kit::vfs::whiteout`); inode flags and the label ([`ioctl`]);
//! O_TMPFILE (FUSE_TMPFILE: an unnamed inode on the orphan list, which
//! LINK names unless it was opened O_EXCL, `Fs::tmpfile_open_at`) and
//! statx's birth time (FUSE_STATX, from `i_crtime`). Both requests are
//! decoded by our copy of fuser (`vendor/fuser/VENDORED.md`). Each is
//! compared with the kernel's ext4 in the cli crate's
//! `tests/posix_gaps.rs`.
//!
//! # Not served
//!
//! POSIX byte-range and BSD locks are left to the kernel (local to the
//! mount, which is the only user of the image); ioctls other than the
//! flag and label ones (FIEMAP, ...) answer ENOTTY and `bmap` ENOSYS.
//! statx's attributes (immutable, append-only, nodump...): FUSE_STATX
//! answers them as `ext4_getattr` does (`Stat::statx_attributes`), but
//! the kernel's FUSE (6.18) copies only the birth time out of the reply
//! (`fuse_do_statx`), so statx through the mount shows none of them;
//! lsattr's ioctl does. Inode flags are not
//! visible to the kernel (FUSE inodes carry no S_IMMUTABLE/S_APPEND), so
//! with `-o no_open` an open for writing of an immutable or append-only
//! file succeeds and its first write is refused instead (by default OPEN
//! is served and refuses it, as ext4 does).

pub mod attr;
pub mod busypoll;
pub mod errno;
pub mod export;
mod fusermount;
pub mod handles;
pub mod inuse;
pub mod ioctl;
pub mod killpriv;
pub mod lifecycle;
pub mod nodes;
pub mod panics;
pub mod readahead;
pub mod server;

pub mod statfs;
mod sys;

pub use fuser::Transport;
pub use inuse::SUBTYPE;
pub use lifecycle::{
    mount, parse_options, run_detached, run_foreground, unmount, MountOptions, Mounted, TransportChoice,
};
pub use server::{CacheMode, Ext4Fuse};
