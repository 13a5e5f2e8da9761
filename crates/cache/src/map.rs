//! The concurrent maps of the in-memory caches (buffers, inodes, dentries,
//! pages, descriptors) and the hasher they share.
//!
//! Keys are block and inode numbers and (directory, name) pairs, hashed on
//! every lookup of every cache: with std's SipHash (`RandomState`),
//! `hash_one` and `DefaultHasher::write` were ~4% of a create's samples
//! (creates into one directory, under `perf`); with foldhash the same run
//! to 200,000 files used ~4% less CPU. foldhash is built for exactly this — short keys,
//! hash tables — at a fraction of the cost, and is still seeded at random
//! per map, so a crafted image cannot choose numbers or names that collide
//! in every process (papaya also bounds probe lengths). The dentry cache
//! hashes each name once, with this hasher, into a fingerprint its key
//! carries, and its map folds only the directory into that (`dcache.rs`).
//!
//! Eviction order lives beside each map in a [`crate::clock::Clock`]; a
//! [`crate::Cache`] keeps the two together.

/// The hasher of the cache maps (and of the dentry cache's fingerprints).
pub type KeyHasher = foldhash::fast::RandomState;

/// A cache's concurrent map.
pub type Map<K, V> = papaya::HashMap<K, V, KeyHasher>;

/// A pinned view of a [`Map`].
pub type MapRef<'a, K, V> = papaya::HashMapRef<'a, K, V, KeyHasher, papaya::LocalGuard<'a>>;

/// An empty map with a freshly seeded hasher.
pub fn new<K, V>() -> Map<K, V> {
    papaya::HashMap::with_hasher(KeyHasher::default())
}

/// An empty map for a cache that evicts (buffers, inodes, dentries): its
/// removed entries are freed in batches of `batch` per thread (see
/// [`collector`]).
pub fn churning<K, V>(batch: usize) -> Map<K, V> {
    papaya::HashMap::builder()
        .hasher(KeyHasher::default())
        .collector(collector(batch))
        .build()
}

/// The memory reclaimer of a cache map whose entries are removed all the
/// time. papaya frees a removed entry once no reader can still hold it,
/// checked per batch of removals with a `membarrier(2)` — which interrupts
/// every CPU running one of our threads. seize's default batch of 32 made
/// that a system call per 16 creates once the caches evicted, and with the
/// background worker sweeping on one CPU and a create storm on the other,
/// each one an inter-processor interrupt: `membarrier` was 2 µs per create
/// of the worker's time at a million files in one directory and stalled the
/// creating thread too. Larger batches keep that many removed entries
/// alive a little longer (per thread: `batch` entries of this map).
pub fn collector(batch: usize) -> seize::Collector {
    seize::Collector::new().batch_size(batch)
}

/// How many inserts a thread makes into one kind of churning map between
/// two flushes of its retired batch ([`FlushClock`]).
const FLUSH_EVERY: u32 = 1024;

/// Makes the threads that insert into a churning map free its old tables.
///
/// A cache at its limit copies its table every few tens of thousands of
/// inserts (papaya does not reuse removed entries' slots), and the thread
/// that completes the copy retires the old table into *its own* batch —
/// which seize reclaims only once that thread has retired `batch` values.
/// The creating threads retire little else (the background worker sweeps,
/// so the removed entries go to its batch), so their batches held every
/// old table: 130 inode-cache and 41 dentry-cache tables, 30 MiB, alive at
/// the peak of 1,000,000 creates through the mount with a 64 MiB budget
/// (heaptrack; the tables grew with every insert, not with the cache).
/// Counting inserts per thread and flushing every [`FLUSH_EVERY`] bounds
/// what a thread keeps to the tables it retired since, for one
/// `membarrier(2)` per 1,024 inserts (see [`collector`]).
///
/// One per kind of map, as a `thread_local!`:
/// `thread_local!(static INSERTS: FlushClock = const { FlushClock::new() })`,
/// then `INSERTS.with(|c| c.tick(&map))` after each insert, outside the
/// insert's pin.
#[derive(Debug, Default)]
pub struct FlushClock(std::cell::Cell<u32>);

impl FlushClock {
    /// A clock at zero.
    pub const fn new() -> Self {
        FlushClock(std::cell::Cell::new(0))
    }

    /// Count an insert this thread made into `map`; every
    /// [`FLUSH_EVERY`]th hands the thread's retired batch of `map`'s
    /// collector to the reclaimer.
    pub fn tick<K, V, S>(&self, map: &papaya::HashMap<K, V, S>) {
        let n = self.0.get() + 1;
        if n < FLUSH_EVERY {
            self.0.set(n);
            return;
        }
        self.0.set(0);
        // A guard of the same collector on the same thread reaches the
        // same per-thread batch.
        papaya::Guard::flush(&map.guard());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_hash_with_independent_seeds() {
        use std::hash::BuildHasher;
        let (a, b) = (KeyHasher::default(), KeyHasher::default());
        // Two maps disagree on where most keys go (seeded at random).
        let same = (0u64..64).filter(|k| a.hash_one(k) == b.hash_one(k)).count();
        assert!(same < 4, "{same} of 64 keys hashed alike by two seeds");
        let m: Map<u32, u32> = new();
        let g = m.pin();
        for i in 0..1000 {
            g.insert(i, i * 2);
        }
        assert!((0..1000).all(|i| g.get(&i) == Some(&(i * 2))));
    }
}
