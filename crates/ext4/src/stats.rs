//! Counters of the volume's I/O, for tests and benchmarks: directory
//! blocks looked at, inode records read and written. The assertions they
//! serve are cost bounds — an htree lookup reads a handful of blocks, not
//! the directory; fdatasync writes no inode record.
//!
//! Locking: none. Relaxed atomics: a counter orders nothing, and readers
//! only compare values taken before and after an operation on one thread.

use std::sync::atomic::{AtomicU64, Ordering};

/// The volume's counters (see the module doc).
#[derive(Debug, Default)]
pub struct Stats {
    dir_block_reads: AtomicU64,
    inode_reads: AtomicU64,
    inode_writes: AtomicU64,
}

impl Stats {
    /// Count one directory block looked at by a lookup or readdir (cached
    /// or not).
    #[inline]
    pub fn count_dir_block(&self) {
        self.dir_block_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Count one inode record read from the device.
    #[inline]
    pub fn count_inode_read(&self) {
        self.inode_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Count one inode record written through a handle.
    #[inline]
    pub fn count_inode_write(&self) {
        self.inode_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Directory blocks looked at by lookups and readdir so far.
    pub fn dir_block_reads(&self) -> u64 {
        self.dir_block_reads.load(Ordering::Relaxed)
    }

    /// Inode records read from the device so far.
    pub fn inode_reads(&self) -> u64 {
        self.inode_reads.load(Ordering::Relaxed)
    }

    /// Inode records written through a handle so far.
    pub fn inode_writes(&self) -> u64 {
        self.inode_writes.load(Ordering::Relaxed)
    }
}
