//! The metadata buffer cache: blocks of extent nodes, indirect maps,
//! directories and xattrs, keyed by physical block number.
//!
//! Concurrency: lookups are lock-free reads of a concurrent map (papaya);
//! a miss reads the block without holding any lock, so two threads missing
//! the same block may both read it and one insert wins — harmless for clean
//! metadata. Each buffer carries a once-only validation slot (seed 004: a
//! directory block is checked when it comes from disk, then trusted).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use ext4kit_format::htree::{DxIndex, DxInfo};
use ext4kit_format::FormatError;

use crate::clock::{Clock, Visit};

/// One cached block.
#[derive(Debug)]
pub struct Buffer {
    /// Physical block number.
    pub block: u64,
    /// The block's bytes.
    pub data: Box<[u8]>,
    /// Result of the structural check done the first time the block is used
    /// as a particular structure (directory leaf, dx node, ...).
    pub checked: OnceLock<Result<(), FormatError>>,
    /// The htree index this version holds (a dx root with its info, or a
    /// dx node), decoded once: a version never changes — writers install a
    /// new buffer — and every create probes the index twice (lookup, then
    /// insert). Re-decoding a root of 300 entries was a fifth of a create
    /// at 50,000 names, and grew with the directory (seed 004).
    dx: OnceLock<(Option<DxInfo>, Arc<DxIndex>)>,
    referenced: AtomicBool,
    /// Changed in memory and not yet written: never evicted (a later
    /// reader would otherwise fetch the stale disk copy).
    dirty: AtomicBool,
}

impl Buffer {
    /// Whether this version still has to reach the disk.
    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    /// Record that this version is on disk.
    pub fn mark_clean(&self) {
        self.dirty.store(false, Ordering::Release);
    }

    fn new(block: u64, data: Box<[u8]>) -> Self {
        Buffer {
            block,
            data,
            checked: OnceLock::new(),
            dx: OnceLock::new(),
            referenced: AtomicBool::new(true),
            dirty: AtomicBool::new(false),
        }
    }

    /// Run `check` the first time only; later calls return the stored verdict.
    pub fn check_once(&self, check: impl FnOnce(&[u8]) -> Result<(), FormatError>) -> Result<(), FormatError> {
        self.checked.get_or_init(|| check(&self.data)).clone()
    }

    /// The htree index of this version, decoded by `decode` the first time.
    pub fn dx_index(
        &self,
        decode: impl FnOnce(&[u8]) -> Result<(Option<DxInfo>, DxIndex), FormatError>,
    ) -> Result<(Option<DxInfo>, Arc<DxIndex>), FormatError> {
        if let Some(d) = self.dx.get() {
            return Ok(d.clone());
        }
        let (info, index) = decode(&self.data)?;
        Ok(self.dx.get_or_init(|| (info, Arc::new(index))).clone())
    }
}

/// Striped per-block write locks (the analogue of `lock_buffer`): a writer
/// of metadata block `b` holds stripe `b % N` from reading the current
/// version to installing the new one, so two transactions touching one
/// block (two inodes in one inode-table block) never lose an update.
/// Readers never take these locks.
#[derive(Debug)]
pub struct BlockLocks {
    stripes: Box<[parking_lot::Mutex<()>]>,
}

impl Default for BlockLocks {
    fn default() -> Self {
        BlockLocks {
            stripes: (0..1024).map(|_| parking_lot::Mutex::new(())).collect(),
        }
    }
}

impl BlockLocks {
    /// Lock the stripe of `block`.
    pub fn lock(&self, block: u64) -> parking_lot::MutexGuard<'_, ()> {
        self.stripes[(block % self.stripes.len() as u64) as usize].lock()
    }
}

/// Bounded concurrent cache of metadata blocks.
#[derive(Debug)]
pub struct BufferCache {
    map: crate::cachemap::Map<u64, Arc<Buffer>>,
    bytes: AtomicUsize,
    budget: usize,
    /// Eviction order (keys of `map`).
    clock: Clock<u64>,
    /// Cached bytes at which the next eviction sweep runs.
    next_evict: AtomicUsize,
    /// A sweep is running.
    evicting: std::sync::atomic::AtomicBool,
    block_size: usize,
    /// Blocks read from the device (cache misses).
    pub misses: AtomicU64,
    /// Lookups served from memory.
    pub hits: AtomicU64,
}

impl BufferCache {
    /// A cache holding at most about `budget` bytes of `block_size` blocks.
    pub fn new(block_size: usize, budget: usize) -> Self {
        BufferCache {
            map: crate::cachemap::new(),
            bytes: AtomicUsize::new(0),
            budget: budget.max(block_size * 16),
            clock: Clock::default(),
            next_evict: AtomicUsize::new(budget.max(block_size * 16)),
            evicting: std::sync::atomic::AtomicBool::new(false),
            block_size,
            misses: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    /// The cached buffer for `block`, reading it with `read` on a miss.
    pub fn get<E>(&self, block: u64, read: impl FnOnce(&mut [u8]) -> Result<(), E>) -> Result<Arc<Buffer>, E> {
        {
            let m = self.map.pin();
            if let Some(b) = m.get(&block) {
                crate::vfs::touch(&b.referenced);
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(b.clone());
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let mut data = vec![0u8; self.block_size].into_boxed_slice();
        read(&mut data)?;
        let buf = Arc::new(Buffer::new(block, data));
        let m = self.map.pin();
        let got = m.get_or_insert(block, buf.clone()).clone();
        if Arc::ptr_eq(&got, &buf) {
            self.added(&m, block);
        }
        Ok(got)
    }

    /// Account for a block newly in the map, and sweep when over budget.
    /// Both ways in count: reads that miss, and blocks installed by
    /// `replace` (new inode-table blocks, directory leaves, extent nodes),
    /// which in a create storm are most of them — with only misses
    /// counted, the cache grew to 3.5 times its budget by 800,000 creates.
    fn added(&self, m: &crate::cachemap::MapRef<'_, u64, Arc<Buffer>>, block: u64) {
        self.clock.push(block);
        let now = self.bytes.fetch_add(self.block_size, Ordering::Relaxed) + self.block_size;
        if now > self.next_evict.load(Ordering::Relaxed) && !self.evicting.swap(true, Ordering::Acquire) {
            self.evict(m);
            // A sweep that could not reach the target (dirty buffers
            // stay) is not repeated for another quarter of the budget
            // of new blocks: a sweep is O(n), its cost per insert O(1).
            let after = self.bytes.load(Ordering::Relaxed);
            self.next_evict
                .store(self.budget.max(after + self.budget / 4), Ordering::Relaxed);
            self.evicting.store(false, Ordering::Release);
        }
    }

    /// Install a new version of `block` (a transaction modified it). Readers
    /// that hold the old `Arc<Buffer>` keep a consistent snapshot; new
    /// lookups see the new bytes. The caller holds the block's write lock
    /// (see [`BlockLocks`]) so versions are installed in order, and vouches
    /// for the structure, so the new buffer starts out checked.
    pub fn replace(&self, block: u64, data: Box<[u8]>) -> Arc<Buffer> {
        let b = Arc::new(Buffer::new(block, data));
        let _ = b.checked.set(Ok(()));
        b.dirty.store(true, Ordering::Release);
        let m = self.map.pin();
        if m.insert(block, b.clone()).is_none() {
            self.added(&m, block);
        }
        b
    }

    /// The current version of `block` if cached (no device read).
    pub fn peek(&self, block: u64) -> Option<Arc<Buffer>> {
        self.map.pin().get(&block).cloned()
    }

    /// Drop a block (after it was rewritten or freed).
    pub fn forget(&self, block: u64) {
        let m = self.map.pin();
        if m.remove(&block).is_some() {
            self.bytes.fetch_sub(self.block_size, Ordering::Relaxed);
        }
        self.clock.compact_if(m.len(), |blk| m.get(blk).is_some());
    }

    /// Second-chance (clock) eviction down to three quarters of the budget:
    /// a buffer used since the last sweep survives once.
    /// In clock order, never by iterating the map (see `crate::clock`).
    fn evict(&self, m: &crate::cachemap::MapRef<'_, u64, Arc<Buffer>>) {
        let target = self.budget / 4 * 3;
        self.clock.sweep(
            || self.bytes.load(Ordering::Relaxed) <= target,
            |blk| {
                let Some(b) = m.get(blk) else { return Visit::Gone };
                if b.dirty.load(Ordering::Acquire) || b.referenced.swap(false, Ordering::Relaxed) {
                    return Visit::Keep;
                }
                match m.remove_if(blk, |_, b| !b.dirty.load(Ordering::Acquire)) {
                    Ok(Some(_)) => {
                        self.bytes.fetch_sub(self.block_size, Ordering::Relaxed);
                        Visit::Gone
                    }
                    Ok(None) => Visit::Gone,
                    Err(_) => Visit::Keep,
                }
            },
        );
        self.clock.compact_if(m.len(), |blk| m.get(blk).is_some());
    }

    /// Bytes currently cached.
    pub fn cached_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_miss_and_budget() {
        let c = BufferCache::new(1024, 32 * 1024);
        for i in 0..200u64 {
            let b = c.get(i, |d| -> Result<(), ()> {
                d[0] = i as u8;
                Ok(())
            });
            assert_eq!(b.unwrap().data[0], i as u8);
        }
        assert!(c.cached_bytes() <= 32 * 1024);
        let b = c.get(199, |_| -> Result<(), ()> { panic!("should hit") }).unwrap();
        assert_eq!(b.data[0], 199);
        assert!(c.get(5000, |_| Err(7)).is_err());
    }

    /// Blocks installed by transactions (never read) count against the
    /// budget too: once written (clean), they are evicted like read ones.
    #[test]
    fn installed_blocks_respect_the_budget() {
        let c = BufferCache::new(1024, 32 * 1024);
        for i in 0..2000u64 {
            c.replace(i, vec![i as u8; 1024].into_boxed_slice()).mark_clean();
        }
        assert!(c.cached_bytes() <= 32 * 1024, "{} bytes cached", c.cached_bytes());
        assert_eq!(c.peek(1999).unwrap().data[0], 1999u64 as u8);
    }
}
