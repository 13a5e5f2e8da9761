//! The one cache type: a concurrent map read without locks, its clock
//! queue, and the proof that its misses obey the miss rule (crate doc).
//!
//! `Cache<K, V, P, S>` is generic over `P`, the way the cache knows that
//! a miss's value is not older than a concurrent removal:
//!
//! - [`Counted`] — the cache's own stripes ([`crate::stripe`]): removals
//!   are counted under a stripe lock ([`CacheRef::remove`],
//!   [`CacheRef::remove_if`] take its guard), and a miss inserts with
//!   [`CacheRef::fill`], which checks the count under the same lock. The
//!   buffer and inode caches.
//! - [`Excluded`] — a lock outside the cache: every miss reads and
//!   inserts ([`CacheRef::fill_excluded`]) holding, shared, a lock that
//!   every change of what it reads takes exclusively, so what it read is
//!   still current when it inserts; removals need no count. The dentry
//!   cache (a directory's lock).
//!
//! The type decides which operations exist: a `Counted` cache has no
//! uncounted removal, an `Excluded` one no count to check.
//!
//! A hit is a lookup in the papaya map under an epoch pin — no lock, no
//! write; what to do with the entry (clone it, borrow it, mark it
//! referenced) is the caller's. Writers install their newest version with
//! [`CacheRef::insert_current`] (replacing), which needs no proof.

use std::hash::{BuildHasher, Hash};

use crate::clock::{Clock, Visit};
use crate::map::{collector, FlushClock, KeyHasher};
use crate::stripe::{Miss, Stripe, StripeGuard};

/// A cache whose misses count removals on stripes of their keys.
pub struct Counted<X = ()> {
    stripes: Box<[Stripe<X>]>,
}

impl<X> std::fmt::Debug for Counted<X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counted({} stripes)", self.stripes.len())
    }
}

impl<X: Default> Counted<X> {
    /// `n` stripes (a power of two): a key's stripe is
    /// [`StripeKey::stripe`] modulo `n`.
    pub fn new(n: usize) -> Self {
        assert!(n.is_power_of_two(), "{n} stripes: a power of two");
        Counted {
            stripes: (0..n).map(|_| Stripe::default()).collect(),
        }
    }
}

/// A cache whose misses hold a lock outside it that excludes every change
/// of what they read (see the module doc).
#[derive(Debug, Default, Clone, Copy)]
pub struct Excluded;

/// Keys of a [`Counted`] cache: which stripe a key belongs to.
pub trait StripeKey {
    /// Any number; its low bits pick the stripe. Keys that are numbers
    /// (blocks, inodes) spread over the stripes as they are.
    fn stripe(&self) -> usize;
}

impl StripeKey for u64 {
    #[inline]
    fn stripe(&self) -> usize {
        *self as usize
    }
}

impl StripeKey for u32 {
    #[inline]
    fn stripe(&self) -> usize {
        *self as usize
    }
}

/// What [`CacheRef::fill`] did with a miss's value.
#[derive(Debug)]
pub enum Fill<T> {
    /// Inserted: the key was not cached.
    Inserted(T),
    /// Not inserted: the key is cached already (a racing miss, or a
    /// writer's version); this is the cached entry.
    Cached(T),
    /// Not inserted: a removal was counted on the key's stripe since the
    /// miss began, so what it read may be older than what is below. Read
    /// again.
    Stale,
}

/// What a conditional removal did: `Ok(Some)` removed this entry,
/// `Ok(None)` found nothing cached, `Err` kept this entry.
pub type Removed<'a, K, V> = Result<Option<(&'a K, &'a V)>, (&'a K, &'a V)>;

/// A cache map with its clock queue and its miss proof `P`.
pub struct Cache<K, V, P, S = KeyHasher> {
    map: papaya::HashMap<K, V, S>,
    clock: Clock<K>,
    proof: P,
}

impl<K, V, P, S> std::fmt::Debug for Cache<K, V, P, S>
where
    K: Hash + Eq + std::fmt::Debug,
    V: std::fmt::Debug,
    P: std::fmt::Debug,
    S: BuildHasher,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("len", &self.map.len())
            .field("queued", &self.clock.len())
            .field("proof", &self.proof)
            .finish()
    }
}

/// A pinned view of a [`Cache`]: entries borrowed through it stay valid
/// until it is dropped, even if they are removed meanwhile.
pub struct CacheRef<'a, K, V, P, S = KeyHasher> {
    cache: &'a Cache<K, V, P, S>,
    map: papaya::HashMapRef<'a, K, V, S, papaya::LocalGuard<'a>>,
}

impl<K, V, P, S> Cache<K, V, P, S>
where
    K: Hash + Eq,
    S: BuildHasher,
{
    /// An empty cache hashing with `hasher`, whose removed entries are
    /// freed in batches of `batch` per thread (see
    /// [`crate::map::collector`]).
    pub fn new(hasher: S, batch: usize, proof: P) -> Self {
        Cache {
            map: papaya::HashMap::builder()
                .hasher(hasher)
                .collector(collector(batch))
                .build(),
            clock: Clock::default(),
            proof,
        }
    }

    /// Pin the cache for lookups (an epoch guard; no lock).
    #[inline]
    pub fn pin(&self) -> CacheRef<'_, K, V, P, S> {
        CacheRef {
            cache: self,
            map: self.map.pin(),
        }
    }

    /// Number of cached entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is cached.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Count an insert this thread made (see [`FlushClock`]): the
    /// inserting threads would otherwise keep every old table.
    #[inline]
    pub fn tick(&self, inserts: &FlushClock) {
        inserts.tick(&self.map);
    }

    /// Keys queued for eviction (live and stale).
    pub fn queued(&self) -> usize {
        self.clock.len()
    }
}

impl<K, V, X, S> Cache<K, V, Counted<X>, S>
where
    K: Hash + Eq + StripeKey,
    S: BuildHasher,
{
    #[inline]
    fn stripe(&self, k: &K) -> &Stripe<X> {
        let s = &self.proof.stripes;
        &s[k.stripe() & (s.len() - 1)]
    }

    /// Begin a miss of `k`: call before reading its value from below.
    #[inline]
    pub fn miss(&self, k: &K) -> Miss {
        self.stripe(k).miss()
    }

    /// Lock `k`'s stripe.
    #[inline]
    pub fn lock(&self, k: &K) -> StripeGuard<'_, X> {
        self.stripe(k).lock()
    }

    /// Lock `k`'s stripe if it is free.
    #[inline]
    pub fn try_lock(&self, k: &K) -> Option<StripeGuard<'_, X>> {
        self.stripe(k).try_lock()
    }
}

impl<'a, K, V, P, S> CacheRef<'a, K, V, P, S>
where
    K: Hash + Eq,
    S: BuildHasher,
{
    /// The cached entry of `k`: a hit, or `None`.
    #[inline]
    pub fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        Q: Hash + papaya::Equivalent<K> + ?Sized,
    {
        self.map.get(k)
    }

    /// Number of cached entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is cached.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Every cached entry, in no order. Eviction never walks the map
    /// (see [`crate::clock`]); this is for rare scans.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter()
    }

    /// Visit queued keys in clock order until `done()` (see
    /// [`Clock::sweep`]); `visit` removes through this view. Then drop
    /// queued keys no longer cached once they outnumber the entries.
    /// Returns how many keys were dropped from the queue.
    pub fn sweep(&self, done: impl FnMut() -> bool, visit: impl FnMut(&K) -> Visit) -> usize {
        let n = self.cache.clock.sweep(done, visit);
        self.compact();
        n
    }

    /// Drop queued keys no longer cached, once they outnumber the entries
    /// (after removals outside a sweep).
    pub fn compact(&self) {
        self.cache
            .clock
            .compact_if(self.map.len(), |k| self.map.get(k).is_some());
    }
}

impl<'a, K, V, P, S> CacheRef<'a, K, V, P, S>
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// Install a writer's version of `k`, replacing what is cached: the
    /// newest there is, so no removal can have made it stale. Returns the
    /// entry it replaced.
    #[inline]
    pub fn insert_current(&self, k: K, v: V) -> Option<&V> {
        let old = self.map.insert(k.clone(), v);
        if old.is_none() {
            self.cache.clock.push(k);
        }
        old
    }

    /// Install `v` for `k` unless something is cached there, for a value
    /// no removal can have made stale (a record just written for a new
    /// inode). The cached entry, and whether it is `v`.
    #[inline]
    pub fn insert_new(&self, k: K, v: V) -> (&V, bool) {
        self.insert_absent(k, v)
    }

    fn insert_absent(&self, k: K, v: V) -> (&V, bool) {
        // papaya's plain insert-if-absent (`get_or_insert` is this too),
        // not its `compute`: see `PageMap::insert_clean_at` in the vfs
        // for what `compute` did under concurrent writers.
        match self.map.try_insert(k.clone(), v) {
            Ok(got) => {
                self.cache.clock.push(k);
                (got, true)
            }
            Err(e) => (e.current, false),
        }
    }
}

impl<'a, K, V, X, S> CacheRef<'a, K, V, Counted<X>, S>
where
    K: Hash + Eq + Clone + StripeKey,
    S: BuildHasher,
{
    /// Install what a miss of `k` read, under `g`, the lock of `k`'s
    /// stripe: only if no removal was counted since the miss began
    /// (`m`, from [`Cache::miss`] before the read, or from
    /// [`StripeGuard::miss`] for a read made under `g`), and only if `k`
    /// is not cached already.
    #[inline]
    pub fn fill(&self, g: &StripeGuard<'_, X>, m: &Miss, k: K, v: V) -> Fill<&V> {
        debug_assert!(g.is_of(self.cache.stripe(&k)), "a fill under another stripe's lock");
        if !g.admits(m) {
            return Fill::Stale;
        }
        match self.insert_absent(k, v) {
            (got, true) => Fill::Inserted(got),
            (got, false) => Fill::Cached(got),
        }
    }

    /// Remove `k`, counted on its stripe (`g`, held).
    #[inline]
    pub fn remove(&self, g: &mut StripeGuard<'_, X>, k: &K) -> Option<&V> {
        g.count_removal();
        self.map.remove(k)
    }

    /// Remove `k` if `pred` says so of its entry, counted on its stripe
    /// (`g`, held) whether it goes or not.
    #[inline]
    pub fn remove_if(&self, g: &mut StripeGuard<'_, X>, k: &K, pred: impl FnMut(&K, &V) -> bool) -> Removed<'_, K, V> {
        g.count_removal();
        self.map.remove_if(k, pred)
    }
}

impl<'a, K, V, S> CacheRef<'a, K, V, Excluded, S>
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// Install what a miss of `k` read, unless `k` is cached already. The
    /// caller has held, from before its read until now, a lock that every
    /// change of what it read takes exclusively (the dentry cache: the
    /// directory's, shared). The cached entry, and whether it is `v`.
    #[inline]
    pub fn fill_excluded(&self, k: K, v: V) -> (&V, bool) {
        self.insert_absent(k, v)
    }

    /// Remove `k`. Nothing is counted: misses prove themselves by the
    /// lock they hold.
    #[inline]
    pub fn remove<Q>(&self, k: &Q) -> Option<&V>
    where
        Q: Hash + papaya::Equivalent<K> + ?Sized,
    {
        self.map.remove(k)
    }

    /// Remove `k` if `pred` says so of its entry.
    #[inline]
    pub fn remove_if<Q>(&self, k: &Q, pred: impl FnMut(&K, &V) -> bool) -> Removed<'_, K, V>
    where
        Q: Hash + papaya::Equivalent<K> + ?Sized,
    {
        self.map.remove_if(k, pred)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    /// A cached version of a key: its number, and whether it is still to
    /// be written home.
    #[derive(Debug)]
    struct Version {
        n: u64,
        dirty: AtomicBool,
    }

    fn version(n: u64, dirty: bool) -> Arc<Version> {
        Arc::new(Version {
            n,
            dirty: AtomicBool::new(dirty),
        })
    }

    const KEYS: u64 = 4;
    const SLOTS: usize = 3;

    /// What the model runs: interleaved steps of misses, writers, write
    /// home, eviction and hits.
    #[derive(Debug, Clone)]
    enum Op {
        /// A miss of `key` begins in `slot` (its read comes later).
        Begin { slot: usize, key: u64 },
        /// The miss in `slot` reads below now (once).
        Read { slot: usize },
        /// The miss in `slot` inserts what it read (reading now if it
        /// has not yet).
        Finish { slot: usize },
        /// A writer installs a new version of `key` (dirty).
        Write { key: u64 },
        /// `key`'s cached version is written home and marked clean.
        WriteHome { key: u64 },
        /// `key` is evicted if cached and clean.
        Evict { key: u64 },
        /// A lookup of `key`.
        Hit { key: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        let slot = 0..SLOTS;
        let key = 0..KEYS;
        prop_oneof![
            (slot.clone(), key.clone()).prop_map(|(slot, key)| Op::Begin { slot, key }),
            slot.clone().prop_map(|slot| Op::Read { slot }),
            slot.prop_map(|slot| Op::Finish { slot }),
            key.clone().prop_map(|key| Op::Write { key }),
            key.clone().prop_map(|key| Op::WriteHome { key }),
            key.clone().prop_map(|key| Op::Evict { key }),
            key.prop_map(|key| Op::Hit { key }),
        ]
    }

    /// A cache under test, driven the way its users drive it.
    trait Subject {
        fn miss(&self, key: u64) -> Miss;
        /// Insert a miss's read; the cached version afterwards, or `None`
        /// for a refused (stale) miss.
        fn fill(&self, m: &Miss, key: u64, n: u64) -> Option<u64>;
        fn write(&self, key: u64, n: u64);
        /// Mark the cached version clean; the number written home.
        fn write_home(&self, key: u64) -> Option<u64>;
        fn evict(&self, key: u64);
        fn get(&self, key: u64) -> Option<u64>;
    }

    /// A [`Counted`] cache: removals counted when they happen (the buffer
    /// and inode caches). Two stripes, so keys share them.
    type Counting = Cache<u64, Arc<Version>, Counted>;

    impl Subject for Counting {
        fn miss(&self, key: u64) -> Miss {
            Cache::miss(self, &key)
        }
        fn fill(&self, m: &Miss, key: u64, n: u64) -> Option<u64> {
            let g = self.lock(&key);
            match self.pin().fill(&g, m, key, version(n, false)) {
                Fill::Inserted(v) | Fill::Cached(v) => Some(v.n),
                Fill::Stale => None,
            }
        }
        fn write(&self, key: u64, n: u64) {
            let _g = self.lock(&key);
            self.pin().insert_current(key, version(n, true));
        }
        fn write_home(&self, key: u64) -> Option<u64> {
            let m = self.pin();
            let v = m.get(&key).filter(|v| v.dirty.load(Ordering::Acquire))?;
            v.dirty.store(false, Ordering::Release);
            Some(v.n)
        }
        fn evict(&self, key: u64) {
            let mut g = self.lock(&key);
            let _ = self
                .pin()
                .remove_if(&mut g, &key, |_, v| !v.dirty.load(Ordering::Acquire));
        }
        fn get(&self, key: u64) -> Option<u64> {
            self.pin().get(&key).map(|v| v.n)
        }
    }

    /// One [`Stripe`] and a map of its own, counting when a version is
    /// written home and evicting uncounted (the page cache).
    struct AtClean {
        stripe: Stripe,
        map: crate::map::Map<u64, Arc<Version>>,
    }

    impl Subject for AtClean {
        fn miss(&self, _: u64) -> Miss {
            self.stripe.miss()
        }
        fn fill(&self, m: &Miss, key: u64, n: u64) -> Option<u64> {
            let g = self.stripe.lock();
            let map = self.map.pin();
            if let Some(v) = map.get(&key) {
                return Some(v.n);
            }
            g.admits(m).then(|| map.get_or_insert(key, version(n, false)).n)
        }
        fn write(&self, key: u64, n: u64) {
            let _g = self.stripe.lock();
            self.map.pin().insert(key, version(n, true));
        }
        fn write_home(&self, key: u64) -> Option<u64> {
            let mut g = self.stripe.lock();
            let map = self.map.pin();
            let v = map.get(&key).filter(|v| v.dirty.load(Ordering::Acquire))?;
            // Counted before the page may go: from here the sweep drops it
            // uncounted.
            g.count_removal();
            v.dirty.store(false, Ordering::Release);
            Some(v.n)
        }
        fn evict(&self, key: u64) {
            let _g = self.stripe.lock();
            let _ = self.map.pin().remove_if(&key, |_, v| !v.dirty.load(Ordering::Acquire));
        }
        fn get(&self, key: u64) -> Option<u64> {
            self.map.pin().get(&key).map(|v| v.n)
        }
    }

    /// Run `ops` against `c` and a model of what is below: the disk's
    /// version of each key and the newest version made. Whatever is cached
    /// — after a miss's insert, at a hit, after every step — is the newest.
    fn check(c: &dyn Subject, ops: &[Op]) -> Result<(), TestCaseError> {
        let mut disk = [0u64; KEYS as usize];
        let mut newest = [0u64; KEYS as usize];
        let mut slots: [Option<(u64, Miss, Option<u64>)>; SLOTS] = [None; SLOTS];
        for op in ops {
            match *op {
                Op::Begin { slot, key } => slots[slot] = Some((key, c.miss(key), None)),
                Op::Read { slot } => {
                    if let Some((key, _, read @ None)) = &mut slots[slot] {
                        *read = Some(disk[*key as usize]);
                    }
                }
                Op::Finish { slot } => {
                    if let Some((key, m, read)) = slots[slot].take() {
                        let n = read.unwrap_or(disk[key as usize]);
                        if let Some(got) = c.fill(&m, key, n) {
                            prop_assert_eq!(got, newest[key as usize], "a miss of {} read {}", key, n);
                        }
                    }
                }
                Op::Write { key } => {
                    newest[key as usize] += 1;
                    c.write(key, newest[key as usize]);
                }
                Op::WriteHome { key } => {
                    if let Some(n) = c.write_home(key) {
                        disk[key as usize] = n;
                    }
                }
                Op::Evict { key } => c.evict(key),
                Op::Hit { key } => {
                    if let Some(n) = c.get(key) {
                        prop_assert_eq!(n, newest[key as usize]);
                    }
                }
            }
            for key in 0..KEYS {
                if let Some(n) = c.get(key) {
                    prop_assert_eq!(n, newest[key as usize], "key {} after {:?}", key, op);
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Counted at removal ([`Counted`]): no interleaving of misses
        /// with writes, write-home and eviction caches an old version.
        #[test]
        fn a_miss_never_caches_a_version_older_than_a_removal(ops in proptest::collection::vec(op(), 1..60)) {
            check(&Counting::new(KeyHasher::default(), 32, Counted::new(2)), &ops)?;
        }

        /// Counted when a version becomes clean, evicted uncounted (the
        /// page cache's use of [`Stripe`]): the same.
        #[test]
        fn counting_at_write_home_is_as_good(ops in proptest::collection::vec(op(), 1..60)) {
            check(&AtClean { stripe: Stripe::default(), map: crate::map::new() }, &ops)?;
        }
    }

    /// The same rule with real threads, where it rests on the orderings
    /// (stripe.rs): a writer makes versions under the stripe lock and
    /// writes them home unlocked; an evictor removes clean ones; readers
    /// miss with a pause between the steps. Whatever a miss finds or
    /// inserts is, under the lock, the newest version.
    #[test]
    fn threads_never_cache_an_old_version() {
        const K: u64 = 4;
        let c: Arc<Counting> = Arc::new(Cache::new(KeyHasher::default(), 32, Counted::new(2)));
        let disk: Arc<[AtomicU64]> = (0..K).map(|_| AtomicU64::new(0)).collect();
        let newest: Arc<[AtomicU64]> = (0..K).map(|_| AtomicU64::new(0)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let (stale, inserted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let writer = {
            let (c, disk, newest, stop) = (c.clone(), disk.clone(), newest.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = i % K;
                    i += 1;
                    let v = {
                        let _g = c.lock(&key);
                        let n = newest[key as usize].load(Ordering::Relaxed) + 1;
                        newest[key as usize].store(n, Ordering::Relaxed);
                        let v = version(n, true);
                        c.pin().insert_current(key, v.clone());
                        v
                    };
                    // The write home, then the clean mark that lets the
                    // evictor take it (Release: the evictor's Acquire
                    // sees the write home too).
                    disk[key as usize].store(v.n, Ordering::Relaxed);
                    v.dirty.store(false, Ordering::Release);
                    if i.is_multiple_of(64) {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let evictor = {
            let (c, stop) = (c.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = i % K;
                    i += 1;
                    if let Some(mut g) = c.try_lock(&key) {
                        let _ = c.pin().remove_if(&mut g, &key, |_, v| !v.dirty.load(Ordering::Acquire));
                    }
                }
            })
        };
        let readers: Vec<_> = (0..2)
            .map(|t| {
                let (c, disk, newest) = (c.clone(), disk.clone(), newest.clone());
                let (stale, inserted) = (stale.clone(), inserted.clone());
                std::thread::spawn(move || {
                    let t0 = std::time::Instant::now();
                    let mut i = 0u64;
                    // Until both outcomes were seen many times (the other
                    // threads may get little CPU on a small machine), at
                    // most 20 s.
                    while (stale.load(Ordering::Relaxed) < 1000 || inserted.load(Ordering::Relaxed) < 1000)
                        && t0.elapsed() < std::time::Duration::from_secs(20)
                    {
                        i += 1;
                        let key = (i * 7 + t) % K;
                        if let Some(v) = c.pin().get(&key) {
                            assert!(v.n <= newest[key as usize].load(Ordering::Relaxed) + 1);
                            continue;
                        }
                        let m = c.miss(&key);
                        spin(i % 50);
                        let n = disk[key as usize].load(Ordering::Relaxed);
                        spin(i % 31);
                        let g = c.lock(&key);
                        let want = newest[key as usize].load(Ordering::Relaxed);
                        match c.pin().fill(&g, &m, key, version(n, false)) {
                            Fill::Inserted(v) => {
                                inserted.fetch_add(1, Ordering::Relaxed);
                                assert_eq!(v.n, want, "a miss of {key} cached an old version");
                            }
                            Fill::Cached(v) => assert_eq!(v.n, want),
                            Fill::Stale => {
                                stale.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        evictor.join().unwrap();
        // The races happened: some misses were refused, some inserted.
        let (stale, inserted) = (stale.load(Ordering::Relaxed), inserted.load(Ordering::Relaxed));
        assert!(stale > 0 && inserted > 0, "{stale} refused, {inserted} inserted");
    }

    fn spin(n: u64) {
        for _ in 0..n {
            std::hint::spin_loop();
        }
    }

    /// The clock follows the map: new keys are queued once, replaced ones
    /// not again, and a sweep drops what it evicts.
    #[test]
    fn inserts_queue_keys_and_sweeps_evict_them() {
        let c: Cache<u64, u64, Excluded> = Cache::new(KeyHasher::default(), 32, Excluded);
        let m = c.pin();
        assert!(m.fill_excluded(1, 10).1);
        assert_eq!(m.fill_excluded(1, 11), (&10, false));
        assert_eq!(m.insert_current(1, 12), Some(&10));
        assert!(m.insert_current(2, 20).is_none());
        assert_eq!(c.queued(), 2);
        let n = m.sweep(
            || false,
            |k| match m.remove_if(k, |_, v| *v >= 20) {
                Ok(_) => Visit::Gone,
                Err(_) => Visit::Keep,
            },
        );
        assert_eq!((n, m.get(&1), m.get(&2)), (1, Some(&12), None));
    }
}
