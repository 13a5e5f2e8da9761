//! The cache machinery of ext4kit, with nothing of ext4 in it: the memory
//! budget ([`budget`]), the concurrent maps and their hasher ([`map`]),
//! clock eviction ([`clock`]), the background worker ([`flusher`]), and
//! the one cache type ([`Cache`], built on [`Stripe`]) whose misses obey
//! the rule below. ext4's buffer cache and the vfs layer's inode, dentry
//! and page caches are built on it; it sits below both, so neither layer
//! reaches into the other for it.
//!
//! # The miss rule
//!
//! **A miss never caches something older than a concurrent removal.**
//! Every cache is read without locks, and a miss reads what it will cache
//! from below (the device; for inodes, the buffer cache) without locks
//! too. By the time it inserts, a writer may have cached a newer version
//! of the same key, changed it, written it home — and seen it removed:
//! evicted once clean, or forgotten. Inserting what the miss read would
//! then cache bytes older than the disk's: every later reader sees them,
//! and the next writer starts from them and undoes the write on disk.
//!
//! Exactly: a miss may install the value it read only if no entry of its
//! key that may be newer than that read has left the map between the
//! start of the read and the insert. Two ways to know it:
//!
//! 1. **Counted removals** ([`Counted`], [`stripe`]): every removal is
//!    counted on its key's stripe under the stripe's lock; a miss loads
//!    the count (Acquire) before its read and inserts under the lock only
//!    if the count has not moved, else it reads again. The argument, with
//!    the orderings it needs, is in [`stripe`]'s doc.
//! 2. **Exclusion** ([`Excluded`]): the miss holds, from before its read
//!    to its insert, a lock that every change of what it reads takes
//!    exclusively. What it read is current when it inserts, so an entry
//!    removed meanwhile was no newer than it: nothing needs counting.
//!
//! # The four caches
//!
//! | cache | proof | the lock | what is counted |
//! |---|---|---|---|
//! | metadata buffers (ext4 `buffer.rs`) | counted | 1,024 stripes by block number; the stripe lock is also the block's write lock, guarding its draft | evictions (of clean buffers only) and forgets (freed blocks). A writer reads a block under its stripe lock: a miss that no removal can meet |
//! | inodes (vfs `icache.rs`) | counted | 64 stripes by inode number; also the evictor's side of the eviction-against-lookup handshake | evictions (of clean, linked, unused inodes) and forgets (freed inodes) |
//! | file pages (vfs `pagecache.rs`) | counted | one [`Stripe`] per file: the dirty-set mutex, under which every change to the file's pages is made | writeback marking a page clean (after its write home: from then on the sweep may drop it uncounted) and truncation or hole punching (pages dropped, blocks freed); a replaced block map is an uncounted [`Stripe::invalidate`] that readers recheck |
//! | dentries (vfs `dcache.rs`) | excluded | the directory's lock: a lookup reads the directory and inserts the dentry holding it shared; create, unlink and rename change the directory and then its dentries holding it exclusively | nothing: dentries are published after the directory changes, so an evicted dentry is never newer than the directory |
//!
//! The page cache uses the rule's stripe with a map of its own rather than
//! a [`Cache`]: a file's map is created at its first page and dropped with
//! its last (a papaya map with its collector is 17 KiB; made eagerly for
//! every cached inode it was 499 MiB for 30,000 files, heaptrack), while
//! its count must outlive the map, and its sweep walks the one file's map
//! instead of keeping a clock queue per file.
//!
//! What none of the four may add for it: a hit is a map lookup under an
//! epoch pin — no lock, no atomic read-modify-write, no clone beyond what
//! the cache always took (the dentry cache's walk borrows, the inode cache
//! clones its `Arc`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod budget;
pub mod cache;
pub mod clock;
pub mod flusher;
pub mod map;
pub mod stripe;

pub use budget::MemoryBudget;
pub use cache::{Cache, CacheRef, Counted, Excluded, Fill, Removed, StripeKey};
pub use clock::{Clock, Visit};
pub use map::{FlushClock, KeyHasher};
pub use stripe::{Miss, Stripe, StripeGuard};
