//! Second-chance (clock) eviction order for the caches' concurrent maps.
//!
//! The caches (buffers, inodes, dentries) are papaya maps, read lock-free.
//! Eviction must not walk those maps: papaya 0.2.5's iteration can spin
//! forever completing an incremental resize after many removals (seen as
//! an eviction sweep that never returned while allocating tables until the
//! process ran out of memory, past ~100,000 inodes). So each cache keeps
//! its keys in insertion order in a queue beside the map, and a sweep pops
//! keys, looks each one up, and either drops it (evicted, or already gone)
//! or puts it back (in use, dirty, or referenced since the last pass).
//!
//! The queue is touched only by inserts (one push) and sweeps (under its
//! mutex); lookups never see it.
//!
//! New entries start with their "referenced" bit clear: an entry earns its
//! second chance by being used again after it was cached, as the kernel's
//! new pages start on the inactive list. Entries used once — every dentry
//! and inode of a create storm, every inode of a `find` — then cost one
//! visit each to evict instead of two: creating a million files in one
//! directory, past 131,072 files each create evicts a dentry and an inode, and every visit
//! is a few cache misses (hash the key, probe the map, read the entry).

use std::collections::VecDeque;

use parking_lot::Mutex;

/// Keys a sweep takes from the queue at a time.
const BATCH: usize = 64;

/// What a sweep decided about one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// Still cached and staying: back of the queue.
    Keep,
    /// Evicted now, or no longer in the map: forget the key.
    Gone,
}

/// The eviction order of one cache.
#[derive(Debug)]
pub struct Clock<K> {
    q: Mutex<VecDeque<K>>,
}

impl<K> Default for Clock<K> {
    fn default() -> Self {
        Clock {
            q: Mutex::new(VecDeque::new()),
        }
    }
}

impl<K> Clock<K> {
    /// Record a key newly inserted in the map.
    pub fn push(&self, k: K) {
        self.q.lock().push_back(k);
    }

    /// Keys queued (live and stale).
    pub fn len(&self) -> usize {
        self.q.lock().len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.q.lock().is_empty()
    }

    /// Visit keys from the front until `done()` or every key has been seen
    /// twice (two clock passes: the first clears "referenced" bits, the
    /// second evicts). Returns how many keys were dropped.
    ///
    /// The queue is locked only to take a batch of keys and to put back
    /// the kept ones, never while visiting: inserts push onto the same
    /// queue, and a sweep by the background worker (`crate::flusher`)
    /// over tens of thousands of keys would otherwise hold every insert of
    /// the cache for milliseconds. Keys pushed during the sweep queue up
    /// behind it and wait for the next one; a batch's kept keys and any it
    /// had not visited when `done()` turned true go to the back.
    pub fn sweep(&self, mut done: impl FnMut() -> bool, mut visit: impl FnMut(&K) -> Visit) -> usize {
        let mut steps = self.q.lock().len() * 2;
        let mut dropped = 0;
        let mut batch: Vec<K> = Vec::with_capacity(BATCH);
        let mut kept: Vec<K> = Vec::with_capacity(BATCH);
        let mut finished = false;
        while !finished && steps > 0 {
            {
                let mut q = self.q.lock();
                q.extend(kept.drain(..));
                while batch.len() < BATCH && steps > 0 {
                    let Some(k) = q.pop_front() else { break };
                    batch.push(k);
                    steps -= 1;
                }
            }
            if batch.is_empty() {
                break;
            }
            for k in batch.drain(..) {
                if finished || done() {
                    finished = true;
                    kept.push(k);
                    continue;
                }
                match visit(&k) {
                    Visit::Keep => kept.push(k),
                    Visit::Gone => dropped += 1,
                }
            }
        }
        self.q.lock().extend(kept);
        dropped
    }

    /// Drop stale keys (removed from the map by other paths) once they
    /// outnumber the live entries, so the queue stays proportional to the
    /// cache: `live(k)` tells whether `k` is still in the map.
    pub fn compact_if(&self, map_len: usize, mut live: impl FnMut(&K) -> bool) {
        let mut q = self.q.lock();
        if q.len() <= 2 * map_len + 1024 {
            return;
        }
        q.retain(|k| live(k));
    }
}

/// Mark a cache entry as recently used for the clock sweep. Reads first and
/// writes only when the bit is clear, so a hot entry shared by many threads
/// stays in every core's cache in the shared state instead of bouncing on
/// each access (lock-free dentry references: hot shared objects must not
/// become write-shared).
#[inline]
pub fn touch(flag: &std::sync::atomic::AtomicBool) {
    if !flag.load(std::sync::atomic::Ordering::Relaxed) {
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_keeps_and_drops_in_order() {
        let c = Clock::default();
        for k in 0..10u32 {
            c.push(k);
        }
        let mut seen = Vec::new();
        // Evict even keys; stop after five evictions.
        let evicted = std::cell::Cell::new(0);
        let n = c.sweep(
            || evicted.get() >= 5,
            |&k| {
                seen.push(k);
                if k % 2 == 0 {
                    evicted.set(evicted.get() + 1);
                    Visit::Gone
                } else {
                    Visit::Keep
                }
            },
        );
        assert_eq!(n, 5);
        assert_eq!(seen, (0..9).collect::<Vec<_>>());
        assert_eq!(c.len(), 5);
        c.compact_if(0, |&k| k != 1);
        assert_eq!(c.len(), 5, "small queues are not compacted");
    }

    /// An insert during a sweep (the background worker's) goes through at
    /// once instead of waiting for the sweep, and its key is queued.
    #[test]
    fn pushes_are_not_held_up_by_a_sweep() {
        let c = std::sync::Arc::new(Clock::default());
        for k in 0..1000u32 {
            c.push(k);
        }
        let pushed = std::cell::Cell::new(0);
        c.sweep(
            || pushed.get() >= 3,
            |&k| {
                if k % 100 == 0 {
                    let (tx, rx) = std::sync::mpsc::channel();
                    let c2 = c.clone();
                    std::thread::spawn(move || {
                        c2.push(5000 + k);
                        let _ = tx.send(());
                    });
                    assert!(
                        rx.recv_timeout(std::time::Duration::from_secs(2)).is_ok(),
                        "a push waited for the sweep"
                    );
                    pushed.set(pushed.get() + 1);
                }
                Visit::Keep
            },
        );
        assert_eq!(c.len(), 1003, "every key kept, and the three pushed during the sweep");
    }
}
