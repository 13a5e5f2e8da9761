//! The metadata buffer cache: blocks of extent nodes, indirect maps,
//! directories and xattrs, keyed by physical block number.
//!
//! Concurrency: lookups are lock-free reads of a concurrent map (an
//! `ext4kit_cache::Cache`); a miss reads the block without holding any
//! lock, so two threads missing the same block may both read it and one
//! insert wins — harmless for clean metadata. What a miss read can be
//! older than the disk, though: a writer may cache the block, change it,
//! and have the change written home and evicted while the read is in
//! flight. So the cache counts its removals (the miss rule of
//! `ext4kit_cache`, by counted removals): a block leaves the map only under
//! its stripe lock, counted on the stripe, and a miss inserts what it read
//! under that lock only if no removal was counted since its read began
//! (else it reads again). Each buffer carries a once-only validation slot
//! (htree, no linear scan: a directory block is checked when it comes from
//! disk, then trusted).
//!
//! Writers change a block in its *draft*: a private copy kept under the
//! block's stripe lock ([`Drafts`]), edited in place by every later
//! transaction while no reader asks for the block. The map meanwhile holds
//! a placeholder for it, and a reader that finds one takes the stripe lock
//! and publishes the draft as a new immutable version (a move, not a copy);
//! the next writer starts a new draft from that. A reader therefore never
//! sees bytes that can change under it, and a block that only writers use
//! — group descriptors, bitmaps, the inode-table block new inodes are being
//! written into, a directory's own inode — is copied once per checkpoint
//! instead of once per change: copying whole 4 KiB blocks (and freeing the
//! old versions later) was a fifth of a create by 1,000,000 files in one
//! directory, and the part of it that grew with the directory.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use ext4kit_format::htree::{DxIndex, DxInfo};
use ext4kit_format::FormatError;

use ext4kit_cache::{Cache, Counted, Fill, MemoryBudget, Visit};

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
    /// at 50,000 names, and grew with the directory.
    dx: OnceLock<(Option<DxInfo>, Arc<DxIndex>)>,
    referenced: AtomicBool,
    /// Changed in memory and not yet written: never evicted (a later
    /// reader would otherwise fetch the stale disk copy).
    dirty: AtomicBool,
    /// A placeholder: the block's bytes are in its stripe's draft, and
    /// `data` is empty. Only ever seen inside this module.
    draft: bool,
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
            // Unreferenced until used again (see `ext4kit_cache::clock`).
            referenced: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            draft: false,
        }
    }

    /// A version installed by a writer: dirty, and structurally vouched for.
    fn written(block: u64, data: Box<[u8]>) -> Self {
        let b = Buffer::new(block, data);
        let _ = b.checked.set(Ok(()));
        b.dirty.store(true, Ordering::Relaxed);
        b
    }

    /// The map's entry for a block whose bytes are in a draft. Dirty, so
    /// eviction keeps it (and with it the draft's accounting).
    fn placeholder(block: u64) -> Self {
        Buffer {
            draft: true,
            ..Buffer::written(block, Box::default())
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

/// The drafts of the blocks of one stripe of the per-block write locks
/// (the analogue of `lock_buffer`): the cache's stripe locks guard them. A
/// writer of metadata block `b` holds stripe `b % N` from reading the
/// block to finishing its change, so two transactions touching one block
/// (two inodes in one inode-table block) never lose an update; a reader
/// takes it only to publish a draft, and a writer's read of a block it is
/// about to change (`read_newest`) to read the draft in place. The same
/// lock orders removals against misses (the module doc).
#[derive(Debug, Default)]
pub struct Drafts {
    drafts: foldhash::HashMap<u64, Box<[u8]>>,
}

/// A held stripe lock.
pub type StripeGuard<'a> = ext4kit_cache::StripeGuard<'a, Drafts>;

/// Stripes of the write locks (and of the removal counts).
const STRIPES: usize = 1024;

/// The map, its clock and its stripes.
type Buffers = Cache<u64, Arc<Buffer>, Counted<Drafts>>;
type BuffersRef<'a> = ext4kit_cache::CacheRef<'a, u64, Arc<Buffer>, Counted<Drafts>>;

/// Bounded concurrent cache of metadata blocks.
#[derive(Debug)]
pub struct BufferCache {
    /// The buffers, their eviction order, and per stripe of blocks the
    /// write lock with the drafts it guards and the count of removals a
    /// miss compares before its read and before its insert.
    map: Buffers,
    /// The memory shared with the page cache; the buffer bytes in it are
    /// the ones cached here.
    budget: Arc<MemoryBudget>,
    /// When to sweep, and whether the background worker does it.
    pub trigger: ext4kit_cache::flusher::Trigger,
    block_size: usize,
    /// Blocks read from the device (cache misses).
    pub misses: AtomicU64,
    /// Lookups served from memory.
    pub hits: AtomicU64,
}

impl BufferCache {
    /// A cache of `block_size` blocks within `budget` (see `crate::budget`).
    pub fn new(block_size: usize, budget: Arc<MemoryBudget>) -> Self {
        BufferCache {
            // 256 removed versions (4 KiB each) per thread at most: 1 MiB.
            map: Cache::new(Default::default(), 256, Counted::new(STRIPES)),
            budget,
            trigger: Default::default(),
            block_size,
            misses: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    /// Lock `block`'s stripe: the right to change it (see [`Stripe`]).
    pub fn lock(&self, block: u64) -> StripeGuard<'_> {
        self.map.lock(&block)
    }

    /// The cached buffer for `block`, reading it with `read` on a miss.
    pub fn get<E>(&self, block: u64, mut read: impl FnMut(&mut [u8]) -> Result<(), E>) -> Result<Arc<Buffer>, E> {
        loop {
            {
                let m = self.map.pin();
                if let Some(b) = m.get(&block).filter(|b| !b.draft) {
                    return Ok(self.hit(b.clone()));
                }
            }
            // A draft: publish it (or find it published).
            if let Some(b) = self.peek(block) {
                return Ok(self.hit(b));
            }
            // A miss reads without any lock: a block that is not cached is
            // clean, so the disk holds its current bytes — unless a newer
            // version is written and evicted during the read, which `fill`
            // detects before it caches anything.
            let got = self.fill(None, block, &mut read)?;
            if !got.draft {
                return Ok(got);
            }
            // A writer cached the block and started a draft meanwhile:
            // what we read may be older than it. Once more, from the top.
        }
    }

    /// [`Self::get`] for a caller holding `block`'s stripe (`g`).
    pub fn get_locked<E>(
        &self,
        g: &mut StripeGuard<'_>,
        block: u64,
        read: impl FnMut(&mut [u8]) -> Result<(), E>,
    ) -> Result<Arc<Buffer>, E> {
        match self.peek_locked(g, block) {
            Some(b) => Ok(self.hit(b)),
            // Under the stripe lock no draft can appear: the insert wins, or
            // loses to a reader's miss of the same (clean) bytes.
            None => self.fill(Some(g), block, read),
        }
    }

    fn hit(&self, b: Arc<Buffer>) -> Arc<Buffer> {
        ext4kit_cache::clock::touch(&b.referenced);
        self.hits.fetch_add(1, Ordering::Relaxed);
        b
    }

    /// Read `block` with `read` and cache it; what is cached by then wins.
    /// `held` is the block's stripe lock when the caller holds it: then no
    /// removal can happen during the read. Without it, the read runs
    /// unlocked and its result goes in under the lock only if no block of
    /// the stripe left the map meanwhile — one that did may have been a
    /// newer version of this block, written home after our read began and
    /// then evicted, and caching our older bytes would hide that write
    /// from every later reader and writer.
    fn fill<E>(
        &self,
        held: Option<&mut StripeGuard<'_>>,
        block: u64,
        mut read: impl FnMut(&mut [u8]) -> Result<(), E>,
    ) -> Result<Arc<Buffer>, E> {
        self.misses.fetch_add(1, Ordering::Relaxed);
        if let Some(g) = held {
            // A miss under the stripe lock: no removal can meet it, so
            // this loop runs once.
            loop {
                let miss = g.miss();
                let mut data = vec![0u8; self.block_size].into_boxed_slice();
                read(&mut data)?;
                if let Some(got) = self.insert_read(g, &miss, block, data) {
                    return Ok(got);
                }
            }
        }
        loop {
            let miss = self.map.miss(&block);
            let mut data = vec![0u8; self.block_size].into_boxed_slice();
            read(&mut data)?;
            let g = self.lock(block);
            if let Some(got) = self.insert_read(&g, &miss, block, data) {
                return Ok(got);
            }
        }
    }

    /// Cache what a miss of `block` read, under its stripe lock `g`; what
    /// is cached by then wins. `None`: a removal was counted since the
    /// miss began (see `fill`).
    fn insert_read(
        &self,
        g: &StripeGuard<'_>,
        miss: &ext4kit_cache::Miss,
        block: u64,
        data: Box<[u8]>,
    ) -> Option<Arc<Buffer>> {
        let m = self.map.pin();
        match m.fill(g, miss, block, Arc::new(Buffer::new(block, data))) {
            Fill::Inserted(b) => {
                let b = b.clone();
                self.added(&m);
                Some(b)
            }
            Fill::Cached(b) => Some(b.clone()),
            Fill::Stale => None,
        }
    }

    /// Run `f` on `block`'s newest bytes for a writer about to change it:
    /// its draft, read in place and left unpublished, else its current
    /// version (read on a miss and passed through `check` first). A
    /// reader's `get` would publish the draft, and the change that follows
    /// would then have to copy the block into a new one: a directory
    /// leaf's lookup-then-insert paid a 4 KiB copy per create that way.
    /// The caller must hold whatever orders writers of `block` (a
    /// directory's lock for its leaves), since the bytes may change once
    /// `f` returns.
    pub fn read_newest<R, E>(
        &self,
        block: u64,
        read: impl FnMut(&mut [u8]) -> Result<(), E>,
        check: impl FnOnce(&Buffer) -> Result<(), E>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, E> {
        let mut g = self.lock(block);
        if let Some(d) = g.drafts.get(&block) {
            return Ok(f(d));
        }
        // No draft under the stripe lock: get_locked publishes nothing.
        let b = self.get_locked(&mut g, block, read)?;
        check(&b)?;
        Ok(f(&b.data))
    }

    /// Change `block` through `f`, in its draft: the first change since the
    /// block was last published copies the current version (`current`,
    /// which the caller reads under `g`); later ones edit the draft in
    /// place. `f` must fail before it changes anything — there is no
    /// private copy to throw away when the draft already exists.
    pub fn modify<R, E>(
        &self,
        g: &mut StripeGuard<'_>,
        block: u64,
        current: impl FnOnce(&mut StripeGuard<'_>) -> Result<Arc<Buffer>, E>,
        f: impl FnOnce(&mut [u8]) -> Result<R, E>,
    ) -> Result<R, E> {
        if let Some(d) = g.drafts.get_mut(&block) {
            return f(d);
        }
        let cur = current(g)?;
        let mut copy = cur.data.clone();
        let r = f(&mut copy)?;
        self.install_draft(g, block, copy);
        Ok(r)
    }

    /// Replace `block`'s bytes wholesale (a freshly allocated block) as its
    /// draft; the caller holds its stripe.
    pub fn install_draft(&self, g: &mut StripeGuard<'_>, block: u64, data: Box<[u8]>) {
        if g.drafts.insert(block, data).is_none() {
            let m = self.map.pin();
            // The placeholder goes in while the stripe is held, so a reader
            // that finds it finds the draft too once it gets the lock.
            if m.insert_current(block, Arc::new(Buffer::placeholder(block))).is_none() {
                self.added(&m);
            }
        }
    }

    /// Account for a block newly in the map, and sweep when over budget.
    /// Both ways in count: reads that miss, and blocks installed by
    /// `replace` (new inode-table blocks, directory leaves, extent nodes),
    /// which in a create storm are most of them — with only misses
    /// counted, the cache grew to 3.5 times its budget by 800,000 creates.
    fn added(&self, m: &BuffersRef<'_>) {
        let now = self.budget.charge_buffers(self.block_size);
        let limit = self.budget.buffer_limit();
        // Past the threshold the background worker sweeps; only past it by
        // another quarter of the limit (the worker is behind) do we.
        if self.trigger.sweep_here(now, limit, limit / 4) {
            self.sweep_down(m, limit);
        }
    }

    /// The background worker's pass: sweep if over the threshold.
    pub fn reclaim(&self) {
        let limit = self.budget.buffer_limit();
        if self.trigger.due(self.cached_bytes(), limit) {
            self.sweep_down(&self.map.pin(), limit);
        }
    }

    /// Sweep to three quarters of `limit` (dirty buffers stay, so it may
    /// stop short).
    fn sweep_down(&self, m: &BuffersRef<'_>, limit: usize) {
        self.trigger.sweep(limit, || {
            self.evict(m, limit / 4 * 3);
            self.cached_bytes()
        });
    }

    /// Give the page cache back its share: evict clean buffers down to the
    /// buffers' own quarter of the budget (see `crate::budget`). Called by
    /// the page side when it is short; a no-op while a sweep runs.
    pub fn give_back(&self) {
        let share = self.budget.buffer_share();
        if self.cached_bytes() <= share {
            return;
        }
        // Shrunk below its share, the cache may grow to its limit again
        // before the next sweep.
        self.trigger.sweep_then(|| {
            self.evict(&self.map.pin(), share);
            0
        });
    }

    /// The current version of `block` if cached (no device read); a draft
    /// is published first.
    pub fn peek(&self, block: u64) -> Option<Arc<Buffer>> {
        {
            let m = self.map.pin();
            match m.get(&block) {
                None => return None,
                Some(b) if !b.draft => return Some(b.clone()),
                Some(_) => {}
            }
        }
        self.peek_locked(&mut self.lock(block), block)
    }

    /// [`Self::peek`] for a caller holding `block`'s stripe: a draft becomes
    /// the block's new published version, its bytes moved, not copied.
    pub fn peek_locked(&self, g: &mut StripeGuard<'_>, block: u64) -> Option<Arc<Buffer>> {
        let m = self.map.pin();
        let cur = m.get(&block)?;
        if !cur.draft {
            return Some(cur.clone());
        }
        let Some(data) = g.drafts.remove(&block) else {
            // Placeholders are inserted and drafts removed only together,
            // under the stripe lock: this cannot happen. Were it to, the
            // placeholder goes and the block is read again.
            debug_assert!(false, "placeholder of block {block} without a draft");
            if m.remove(g, &block).is_some() {
                self.budget.release_buffers(self.block_size);
            }
            return None;
        };
        let b = Arc::new(Buffer::written(block, data));
        m.insert_current(block, b.clone());
        Some(b)
    }

    /// Whether `b` is `block`'s current version (not replaced, no draft
    /// started since), without publishing anything.
    pub fn is_current(&self, block: u64, b: &Arc<Buffer>) -> bool {
        self.map.pin().get(&block).is_some_and(|c| Arc::ptr_eq(c, b))
    }

    /// Whether `block` is cached (as a version or a draft).
    pub fn contains(&self, block: u64) -> bool {
        self.map.pin().get(&block).is_some()
    }

    /// Drop a block and any draft of it (it was freed); the caller holds
    /// its stripe.
    pub fn forget_locked(&self, g: &mut StripeGuard<'_>, block: u64) {
        g.drafts.remove(&block);
        let m = self.map.pin();
        if m.remove(g, &block).is_some() {
            self.budget.release_buffers(self.block_size);
        }
        m.compact();
    }

    /// Second-chance (clock) eviction down to `target` bytes: a buffer
    /// used since the last sweep survives once.
    /// In clock order, never by iterating the map (see
    /// `ext4kit_cache::clock`). A block whose stripe is locked stays this
    /// time: the sweep runs inside `added`, whose callers may hold a stripe
    /// lock themselves.
    fn evict(&self, m: &BuffersRef<'_>, target: usize) {
        m.sweep(
            || self.cached_bytes() <= target,
            |blk| {
                let Some(b) = m.get(blk) else { return Visit::Gone };
                if b.dirty.load(Ordering::Acquire) || b.referenced.swap(false, Ordering::Relaxed) {
                    return Visit::Keep;
                }
                let Some(mut g) = self.map.try_lock(blk) else {
                    return Visit::Keep;
                };
                // Counted: a miss of this block that began before may have
                // read older bytes than this (clean) version's.
                match m.remove_if(&mut g, blk, |_, b| !b.dirty.load(Ordering::Acquire)) {
                    Ok(Some(_)) => {
                        self.budget.release_buffers(self.block_size);
                        Visit::Gone
                    }
                    Ok(None) => Visit::Gone,
                    Err(_) => Visit::Keep,
                }
            },
        );
    }

    /// Bytes currently cached.
    pub fn cached_bytes(&self) -> usize {
        self.budget.buffer_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_miss_and_budget() {
        let c = BufferCache::new(1024, Arc::new(MemoryBudget::fixed(32 * 1024, 0)));
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

    /// With a background worker attached that never runs, the cache still
    /// stays within a quarter of its limit above its threshold: past that
    /// margin the inserting caller sweeps itself. And the worker's pass
    /// brings it back under the limit.
    #[test]
    fn a_worker_that_falls_behind_leaves_the_sweep_to_the_caller() {
        let c = BufferCache::new(1024, Arc::new(MemoryBudget::fixed(64 * 1024, 0)));
        c.trigger
            .worker
            .set(Arc::new(ext4kit_cache::flusher::Signal::default()))
            .unwrap();
        let mut most = 0;
        for i in 0..2000u64 {
            c.get(i, |_| -> Result<(), ()> { Ok(()) }).unwrap();
            most = most.max(c.cached_bytes());
        }
        assert!(most > 64 * 1024, "past the limit the sweep was left to the worker");
        assert!(
            most <= 64 * 1024 + 16 * 1024 + 1024,
            "{most} bytes cached for a 64 KiB limit"
        );
        c.reclaim();
        assert!(
            c.cached_bytes() <= 64 * 1024,
            "{} bytes after the worker's pass",
            c.cached_bytes()
        );
    }

    /// Blocks installed by transactions (never read) count against the
    /// budget too: once written (clean), they are evicted like read ones.
    #[test]
    fn installed_blocks_respect_the_budget() {
        let c = BufferCache::new(1024, Arc::new(MemoryBudget::fixed(32 * 1024, 0)));
        for i in 0..2000u64 {
            c.install_draft(&mut c.lock(i), i, vec![i as u8; 1024].into_boxed_slice());
            c.peek(i).unwrap().mark_clean();
        }
        assert!(c.cached_bytes() <= 32 * 1024, "{} bytes cached", c.cached_bytes());
        assert_eq!(c.peek(1999).unwrap().data[0], 1999u64 as u8);
    }

    /// Buffers that grew into the pages' share while pages were idle shrink
    /// back to their own quarter when the page side asks (`give_back`);
    /// dirty ones stay.
    #[test]
    fn give_back_returns_the_pages_share() {
        let budget = Arc::new(MemoryBudget::new(1 << 20, 1024));
        let c = BufferCache::new(1024, budget.clone());
        for i in 0..600u64 {
            c.install_draft(&mut c.lock(i), i, vec![1; 1024].into_boxed_slice());
            if i >= 10 {
                c.peek(i).unwrap().mark_clean();
            }
        }
        assert!(
            c.cached_bytes() > budget.buffer_share(),
            "{} bytes cached",
            c.cached_bytes()
        );
        c.give_back();
        assert!(
            c.cached_bytes() <= budget.buffer_share(),
            "{} bytes after give_back",
            c.cached_bytes()
        );
        assert!((0..10).all(|i| c.contains(i)), "dirty buffers are never given back");
    }

    fn no_read(_: &mut [u8]) -> Result<(), ()> {
        panic!("the block is cached")
    }

    /// A writer's later changes edit its draft in place, unseen by a reader
    /// holding the version published before; the next reader publishes the
    /// draft, and the writer after that starts a new one.
    #[test]
    fn drafts_are_edited_in_place_and_published_on_read() {
        let c = BufferCache::new(16, Arc::new(MemoryBudget::fixed(1 << 20, 0)));
        let old = c.get(7, |d| -> Result<(), ()> {
            d.fill(1);
            Ok(())
        });
        let old = old.unwrap();
        let change = |byte: usize, v: u8| set_byte(&c, 7, byte, v);
        change(0, 2);
        change(1, 3);
        assert_eq!(&old.data[..2], &[1, 1], "a published version never changes");
        assert!(c.lock(7).drafts.contains_key(&7), "the draft stays private");
        let new = c.get(7, no_read).unwrap();
        assert_eq!(&new.data[..3], &[2, 3, 1]);
        assert!(new.is_dirty() && !c.lock(7).drafts.contains_key(&7));
        change(2, 4);
        assert_eq!(new.data[2], 1, "a published draft is copied again, not edited");
        assert_eq!(c.peek(7).unwrap().data[2], 4);
    }

    /// Set byte `at` of `block` as a writer does: through its draft.
    fn set_byte(c: &BufferCache, block: u64, at: usize, v: u8) {
        let mut g = c.lock(block);
        c.modify(
            &mut g,
            block,
            |g| c.get_locked(g, block, no_read),
            |d| -> Result<(), ()> {
                d[at] = v;
                Ok(())
            },
        )
        .unwrap();
    }

    /// A writer's read (`read_newest`) sees the draft's bytes and leaves
    /// it a draft, so the next change edits it in place; on a block with
    /// no draft it reads (and checks) the current version, and a failed
    /// check is the caller's error.
    #[test]
    fn a_writers_read_sees_the_draft_and_leaves_it_private() {
        let c = BufferCache::new(16, Arc::new(MemoryBudget::fixed(1 << 20, 0)));
        let fill = |v: u8| {
            move |d: &mut [u8]| -> Result<(), ()> {
                d.fill(v);
                Ok(())
            }
        };
        let ok = |_: &Buffer| Ok(());
        // Set byte `at` of block 5 through its draft; where the draft is now.
        let change = |at: usize, v: u8| {
            set_byte(&c, 5, at, v);
            c.lock(5).drafts[&5].as_ptr()
        };
        assert_eq!(c.read_newest(5, fill(1), ok, |d| d[0]), Ok(1), "a miss reads the disk");
        let first = change(0, 2);
        assert_eq!(c.read_newest(5, no_read, ok, |d| d[0]), Ok(2), "the draft's bytes");
        assert!(c.lock(5).drafts.contains_key(&5), "still a draft, not published");
        assert_eq!(change(1, 3), first, "edited in place, not copied");
        assert_eq!(&c.get(5, no_read).unwrap().data[..3], &[2, 3, 1]);
        assert_eq!(
            c.read_newest(6, fill(7), |_| Err(()), |d| d[0]),
            Err(()),
            "a failed check"
        );
    }

    /// A reader's miss reads the disk without holding any lock. Should a
    /// writer meanwhile cache the block, change it, have the change
    /// written home and see it evicted — all before the reader's read
    /// returns — what the reader read is older than the disk and must not
    /// be cached: every later reader would see the old bytes, and the next
    /// writer would start its draft from them and undo the change on disk.
    #[test]
    fn a_miss_that_raced_a_write_and_an_eviction_caches_the_newer_bytes() {
        let c = BufferCache::new(16, Arc::new(MemoryBudget::fixed(1 << 20, 0)));
        let disk = std::cell::Cell::new(1u8);
        let mut reads = 0;
        let got = c
            .get(7, |d| -> Result<(), ()> {
                reads += 1;
                // What the device returns: read before the write below lands.
                let before = disk.get();
                if reads == 1 {
                    let mut g = c.lock(7);
                    let read_disk = |d: &mut [u8]| -> Result<(), ()> {
                        d.fill(disk.get());
                        Ok(())
                    };
                    c.modify(
                        &mut g,
                        7,
                        |g| c.get_locked(g, 7, read_disk),
                        |d| -> Result<(), ()> {
                            d[0] = 2;
                            Ok(())
                        },
                    )
                    .unwrap();
                    // The checkpoint: publish, write home, mark clean.
                    let v = c.peek_locked(&mut g, 7).unwrap();
                    disk.set(v.data[0]);
                    v.mark_clean();
                    drop(g);
                    c.evict(&c.map.pin(), 0);
                    assert!(!c.contains(7), "the written version was evicted");
                }
                d.fill(before);
                Ok(())
            })
            .unwrap();
        assert_eq!(got.data[0], 2, "the reader got the bytes on disk");
        assert_eq!(c.get(7, no_read).unwrap().data[0], 2, "and cached them");
    }

    /// A change that fails makes no draft; a freed block's draft goes with it.
    #[test]
    fn failed_changes_and_forgotten_blocks_leave_no_draft() {
        let c = BufferCache::new(16, Arc::new(MemoryBudget::fixed(1 << 20, 0)));
        let mut g = c.lock(3);
        let r = c.modify(
            &mut g,
            3,
            |g| {
                c.get_locked(g, 3, |d| -> Result<(), ()> {
                    d.fill(9);
                    Ok(())
                })
            },
            |_| -> Result<(), ()> { Err(()) },
        );
        assert!(r.is_err() && g.drafts.is_empty());
        c.install_draft(&mut g, 3, vec![5; 16].into_boxed_slice());
        c.forget_locked(&mut g, 3);
        drop(g);
        assert!(!c.contains(3) && c.lock(3).drafts.is_empty() && c.cached_bytes() == 0);
    }
}
