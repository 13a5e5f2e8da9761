//! The page cache: file data in memory, one page per filesystem block,
//! indexed per inode by logical block number.
//!
//! Reads are lock-free lookups. A miss maps the block run once and reads
//! it with a single device read. Holes and unwritten extents are never
//! cached: they are zero-filled straight into the caller's buffer, so a
//! sparse multi-GiB file costs no memory.
//!
//! Write side (fsync costs O(dirty)). A page is never changed in place: a write builds
//! the new block contents and *replaces* the page's `Arc` in the map, so a
//! lock-free reader copies either the old or the new block, never a torn
//! mix, without any page lock. Each inode keeps a **dirty set** beside its
//! page map — an ordered set of the logical blocks whose pages are dirty —
//! so writeback (fsync) visits exactly the dirty pages in logical order and
//! its cost does not grow with the number of clean cached pages (an
//! `i_drtypages` list, as an ordered set).
//!
//! Invariant, kept under the dirty-set mutex: `lblk` is in the dirty set
//! exactly when the page in the map at `lblk` has its `dirty` flag set.
//! Writers insert (page, set entry) together under the mutex; writeback
//! clears both under the mutex and only if the map still holds the very
//! page it wrote (a page re-dirtied meanwhile is a new `Arc` and stays
//! dirty). The clock sweep removes a page with `remove_if(!dirty)`, which is
//! atomic against a concurrent replacement, so dirty pages are never
//! evicted.
//!
//! A miss never caches a page older than a concurrent removal (the miss
//! rule of `ext4kit_cache`, by counted removals): each file's dirty-set
//! mutex is an `ext4kit_cache::Stripe` whose count readers note before
//! they look at the block map and the disk, and a clean page goes in
//! under the mutex only if nothing was counted since (`insert_clean_at`).
//! Counted: writeback marking a page clean (after its write home; from
//! then on the sweep may drop it uncounted, and a page read from disk is
//! clean from the start), truncation and hole punching (pages dropped,
//! their blocks freed); and, without the mutex, a block map replaced,
//! which readers recheck (`PageMap::unchanged`). The map is the file's own
//! rather than an `ext4kit_cache::Cache`: it is created with the file's
//! first page and dropped with its last (see `PageMap::pages`), while the
//! count must outlive it.
//!
//! The global budget bounds memory: past it, clean pages not touched since
//! the last sweep are dropped; past the dirty budget, writers write back.
//!
//! Delayed allocation's books (the kernel's `i_reserved_data_blocks` and
//! `ext4_da_reserve_space` / `ext4_da_release_space`): each inode keeps
//! the dirty blocks that have no block on disk yet ([`Reservations`]) and
//! how many blocks it has claimed from the volume (`ext4::reserve`) for
//! them — one data block per page over a hole, plus the worst case of
//! block-map growth for them and for pages over unwritten extents. A write
//! claims before it accepts a byte; writeback draws its allocations from
//! the claims and settles the books; truncation, hole punching and the
//! death of the inode give back what the dropped pages held.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;

use parking_lot::Mutex;

use crate::error::{Errno, Error};
use crate::ext4::reservation::{self, Reserver};
use ext4kit_cache::{MemoryBudget, Miss, Stripe};

/// One cached block of file data.
#[derive(Debug)]
pub struct Page {
    /// The bytes (one filesystem block). Never modified after insertion.
    pub data: Box<[u8]>,
    referenced: AtomicBool,
    dirty: AtomicBool,
}

impl Page {
    /// A clean page holding `data` (read from disk).
    pub fn new(data: Box<[u8]>) -> Self {
        Page {
            data,
            referenced: AtomicBool::new(true),
            dirty: AtomicBool::new(false),
        }
    }

    fn new_dirty(data: Box<[u8]>) -> Self {
        Page {
            data,
            referenced: AtomicBool::new(true),
            dirty: AtomicBool::new(true),
        }
    }

    /// Whether the page holds data not yet written to disk.
    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::SeqCst)
    }
}

/// The pages of one inode, and its dirty set.
#[derive(Debug)]
pub struct PageMap {
    /// Created on the first page and dropped with the last: most cached
    /// inodes (a create storm, a `stat` walk) never cache a page, and each
    /// papaya map owns a collector of ~17 KiB whose setup cost dominated
    /// empty creates — and whose memory, counted nowhere, was 500 MiB of a
    /// server's 1 GiB after an untar of 30,000 small files with a 256 MiB
    /// budget (heaptrack). A map is charged to the page budget as
    /// [`MAP_BYTES`] while it exists ([`PageBudget::charge_map`]), so the
    /// page sweep frees maps as it frees pages. Changed only under the
    /// `dirty` mutex; readers load it lock-free (arc-swap's per-thread
    /// debt slots: no shared line written).
    pages: ArcSwapOption<ext4kit_cache::map::Map<u64, Arc<Page>>>,
    /// Logical blocks whose pages are dirty, in order (see the module
    /// doc), behind the stripe lock that also serialises every change to
    /// `pages` (readers of the map never take it). Its count moves
    /// whenever what a lock-free reader derived from the disk may have
    /// become stale: a page made clean by writeback (it may now be
    /// evicted, and a reader that read the block before the write must not
    /// cache its old bytes), pages dropped by truncate or hole punching
    /// (their blocks may be reused), and the block map replaced (a reader
    /// holding the old map may think a written block is a hole). Readers
    /// begin a miss ([`Self::miss`]) before the map and recheck it after
    /// using the disk or the map; on a change they undo what they inserted
    /// and redo the step. A plain write does not count: its page is in the
    /// map before any reader could miss it.
    dirty: Stripe<BTreeSet<u64>>,
    /// `dirty.len()`, readable without the mutex (read path fast check).
    ndirty: AtomicUsize,
    /// Delayed allocation's books (see the module doc). Changed only by
    /// callers holding the inode's write lock; the mutex makes the type
    /// shareable, it is never contended.
    resv: Mutex<Reservations>,
    /// The first write-back failure not yet reported (the kernel's
    /// `mapping->wb_err`): fsync and FLUSH report it once.
    wb_error: Mutex<Option<(Errno, String)>>,
    /// When the dirty set last went from empty to not (the kernel's
    /// `inode->dirtied_when`): the background worker writes back pages
    /// older than the commit interval. Changed under the `dirty` mutex.
    dirtied: Mutex<Option<std::time::Instant>>,
}

impl Default for PageMap {
    fn default() -> Self {
        PageMap {
            pages: ArcSwapOption::empty(),
            dirty: Stripe::default(),
            ndirty: AtomicUsize::new(0),
            resv: Mutex::default(),
            wb_error: Mutex::default(),
            dirtied: Mutex::default(),
        }
    }
}

/// Dirty blocks without a block on disk, and what the inode has claimed.
#[derive(Debug, Default)]
pub struct Reservations {
    /// Dirty logical blocks not yet allocated: `true` over a hole (holds a
    /// claimed data block), `false` over an unwritten extent (no data block
    /// to find, but its conversion may split the extent in three).
    delayed: BTreeMap<u64, bool>,
    /// Entries of `delayed` that are `true`.
    data: u64,
    /// Entries of `delayed` that are `false`.
    unwritten: u64,
    /// Blocks claimed from the volume for this inode (data + map growth).
    claimed: u64,
    /// The volume's counters, once something was claimed (so that dropping
    /// pages or the inode gives the claims back without a caller's help).
    space: Option<Arc<reservation::Reservations>>,
}

impl Reservations {
    /// Extents the delayed blocks may need: one per data block, two more
    /// per unwritten block converted (the split leaves up to three).
    fn extents(&self) -> u64 {
        self.data + 2 * self.unwritten
    }

    /// Claims this inode needs for its delayed blocks.
    fn target(&self, meta: &dyn Fn(u64) -> u64) -> u64 {
        if self.delayed.is_empty() {
            0
        } else {
            self.data + meta(self.extents())
        }
    }

    fn insert(&mut self, lblk: u64, hole: bool) {
        if self.delayed.insert(lblk, hole).is_none() {
            if hole {
                self.data += 1;
            } else {
                self.unwritten += 1;
            }
        }
    }

    fn remove(&mut self, lblk: u64) {
        match self.delayed.remove(&lblk) {
            Some(true) => self.data -= 1,
            Some(false) => self.unwritten -= 1,
            None => {}
        }
    }

    /// Give back what is claimed beyond `target` (or claim the shortfall
    /// without a check: the blocks are needed by pages already accepted).
    fn settle_to(&mut self, target: u64) {
        let Some(space) = &self.space else { return };
        if self.claimed > target {
            space.release(self.claimed - target);
        } else {
            space.force_reserve(target - self.claimed);
        }
        self.claimed = target;
    }
}

impl Drop for PageMap {
    fn drop(&mut self) {
        // An inode leaving the cache with claims (it should have none: a
        // dirty inode is not evicted) must not keep them forever.
        let r = self.resv.get_mut();
        if let Some(s) = &r.space {
            s.release(r.claimed);
        }
    }
}

impl PageMap {
    /// The map, created (and charged) if there is none; the caller holds
    /// the `dirty` mutex. Each map has its own collector: papaya 0.2.5 with
    /// one collector shared among page maps panicked in a resize under
    /// concurrent writers ("next_table().unwrap()" on None).
    fn map_or_init(&self, budget: &PageBudget) -> Arc<ext4kit_cache::map::Map<u64, Arc<Page>>> {
        if let Some(m) = self.pages.load_full() {
            return m;
        }
        let m = Arc::new(ext4kit_cache::map::new());
        self.pages.store(Some(m.clone()));
        budget.charge_map();
        m
    }

    /// Drop the map once it holds no page (and give back its charge); the
    /// caller holds the `dirty` mutex. Readers holding the old map find
    /// nothing in it and take the miss path, which makes a new one.
    fn drop_map_if_empty(&self, budget: &PageBudget) {
        let empty = self.pages.load().as_ref().is_some_and(|m| m.is_empty());
        if empty {
            self.pages.store(None);
            budget.release_maps(1);
        }
    }

    /// Whether this inode has a page map (charged to the budget).
    pub fn has_map(&self) -> bool {
        self.pages.load().is_some()
    }

    /// The cached page for logical block `lblk`.
    pub fn get(&self, lblk: u64) -> Option<Arc<Page>> {
        let g = self.pages.load();
        let m = g.as_ref()?.pin();
        let p = m.get(&lblk)?;
        crate::vfs::touch(&p.referenced);
        Some(p.clone())
    }

    /// Run `f` on the bytes of the cached page for `lblk`, without taking a
    /// reference on it.
    #[inline]
    pub fn with<R>(&self, lblk: u64, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let g = self.pages.load();
        let m = g.as_ref()?.pin();
        let p = m.get(&lblk)?;
        crate::vfs::touch(&p.referenced);
        Some(f(&p.data))
    }

    /// Insert a clean page read from disk at `lblk`, unless a page is
    /// cached there already (that one is returned, `false`), or the write
    /// side counted something since `miss` — which the reader began before
    /// it looked at the block map — in which case nothing is inserted and
    /// `None` tells the reader to redo the step.
    ///
    /// The emptiness check, the count's check and the insertion happen
    /// under the map's mutex, which every change to the map holds (writes,
    /// writeback's `mark_clean`, truncation, eviction): a slot can only
    /// have become empty by eviction of a clean page or by truncation, and
    /// both happen after a count under the mutex (see `mark_clean` and
    /// `remove_range`), so a reader that finds the slot empty also sees the
    /// count. A stale page is thus never made visible. Only misses (which
    /// read the disk anyway) take the mutex; hits stay lock-free.
    ///
    /// This used to be one lock-free papaya `compute`. With concurrent
    /// writers on the map (reader inserts, writer inserts, sweeps) a clean
    /// page older than the disk was found cached about once in 100 runs of
    /// `file_io::readers_never_see_stale_or_torn_blocks` — after it the
    /// disk held the newer data — so papaya 0.2.5 is now only trusted with
    /// lock-free readers beside one writer at a time.
    pub fn insert_clean_at(
        &self,
        lblk: u64,
        page: Arc<Page>,
        miss: &Miss,
        budget: &PageBudget,
    ) -> Option<(Arc<Page>, bool)> {
        let w = self.dirty.lock();
        let map = self.map_or_init(budget);
        let m = map.pin();
        if let Some(v) = m.get(&lblk) {
            return Some((v.clone(), false));
        }
        if !w.admits(miss) {
            drop(m);
            self.drop_map_if_empty(budget);
            return None;
        }
        m.insert(lblk, page.clone());
        Some((page, true))
    }

    /// Begin a read that may cache pages: before the block map is looked
    /// at (see the `dirty` field).
    pub fn miss(&self) -> Miss {
        self.dirty.miss()
    }

    /// Whether nothing was counted since `m` began (checked without the
    /// lock; see the `dirty` field).
    pub fn unchanged(&self, m: &Miss) -> bool {
        self.dirty.unchanged(m)
    }

    /// Tell readers that what they derived from the disk may be stale (a
    /// block map replaced, a punch about to free blocks): uncounted by a
    /// check under way, so it is followed by a counted removal or checked
    /// by the readers themselves (`ext4kit_cache::Stripe::invalidate`).
    pub fn bump(&self) {
        self.dirty.invalidate();
    }

    /// Install new contents for blocks as dirty pages (replacing cached
    /// ones). Returns (pages that were not cached before, blocks that were
    /// not dirty before) for memory and dirty accounting.
    pub fn write_pages(
        &self,
        pages: impl IntoIterator<Item = (u64, Box<[u8]>)>,
        budget: &PageBudget,
    ) -> (usize, usize) {
        let mut set = self.dirty.lock();
        let map = self.map_or_init(budget);
        let m = map.pin();
        let (mut new_pages, mut new_dirty) = (0, 0);
        for (lblk, data) in pages {
            if m.insert(lblk, Arc::new(Page::new_dirty(data))).is_none() {
                new_pages += 1;
            }
            if set.insert(lblk) {
                new_dirty += 1;
            }
        }
        if new_dirty != 0 && set.len() == new_dirty {
            *self.dirtied.lock() = Some(std::time::Instant::now());
        }
        self.ndirty.store(set.len(), Ordering::Release);
        (new_pages, new_dirty)
    }

    /// Since when some page has been dirty (none: no dirty page).
    pub fn dirty_since(&self) -> Option<std::time::Instant> {
        *self.dirtied.lock()
    }

    /// The dirty blocks, in order (a copy: O(dirty), whatever is cached).
    pub fn dirty_blocks(&self) -> Vec<u64> {
        self.dirty.lock().iter().copied().collect()
    }

    /// Number of dirty pages.
    pub fn dirty_count(&self) -> usize {
        self.ndirty.load(Ordering::Acquire)
    }

    /// The first dirty block in `[start, end)`. Lock-free when nothing is
    /// dirty (the common case for a reader); otherwise a short mutex hold
    /// for an ordered-set range query.
    pub fn first_dirty_in(&self, start: u64, end: u64) -> Option<u64> {
        if self.dirty_count() == 0 || start >= end {
            return None;
        }
        self.dirty.lock().range(start..end).next().copied()
    }

    /// After writeback wrote `page` for `lblk`: mark it clean if it is
    /// still the page cached there. Returns whether the block left the
    /// dirty set.
    pub fn mark_clean(&self, lblk: u64, page: &Arc<Page>) -> bool {
        let mut set = self.dirty.lock();
        let g = self.pages.load();
        let Some(map) = g.as_ref() else { return false };
        let m = map.pin();
        match m.get(&lblk) {
            Some(cur) if Arc::ptr_eq(cur, page) => {
                // Counted first: once the flag is clear the sweep may evict
                // the page uncounted, and a reader finding the slot empty
                // must see the count (`insert_clean_at`).
                set.count_removal();
                cur.dirty.store(false, Ordering::SeqCst);
                let was = set.remove(&lblk);
                if set.is_empty() {
                    *self.dirtied.lock() = None;
                }
                self.ndirty.store(set.len(), Ordering::Release);
                was
            }
            _ => false,
        }
    }

    /// Drop every page (dirty or not) in `[start, end)`: truncate and hole
    /// punching. Visits whichever is smaller, the range or the cached
    /// pages. Returns (pages dropped, dirty pages dropped).
    pub fn remove_range(&self, start: u64, end: u64, budget: &PageBudget) -> (usize, usize) {
        if start >= end {
            return (0, 0);
        }
        let mut set = self.dirty.lock();
        // Counted before anything goes (see `insert_clean_at`).
        set.count_removal();
        let mut dropped = 0;
        let g = self.pages.load();
        let Some(map) = g.as_ref() else {
            // No page was ever cached; the dirty set is empty too (a dirty
            // block always has its page).
            return (0, 0);
        };
        let m = map.pin();
        if end - start <= m.len() as u64 {
            for l in start..end {
                if m.remove(&l).is_some() {
                    dropped += 1;
                }
            }
        } else {
            let keys: Vec<u64> = m.keys().copied().filter(|k| (start..end).contains(k)).collect();
            for k in keys {
                if m.remove(&k).is_some() {
                    dropped += 1;
                }
            }
        }
        drop(m);
        drop(g);
        self.drop_map_if_empty(budget);
        let gone: Vec<u64> = set.range(start..end).copied().collect();
        for k in &gone {
            set.remove(k);
        }
        if set.is_empty() {
            *self.dirtied.lock() = None;
        }
        self.ndirty.store(set.len(), Ordering::Release);
        self.unreserve_range(start, end);
        (dropped, gone.len())
    }

    /// Dropped pages of `[start, end)` give back their claims
    /// (`ext4_da_release_space`): a data block each; the map-growth claim
    /// stays until writeback settles it, unless nothing is delayed any more.
    fn unreserve_range(&self, start: u64, end: u64) {
        let mut r = self.resv.lock();
        let gone: Vec<(u64, bool)> = r.delayed.range(start..end).map(|(&k, &v)| (k, v)).collect();
        if gone.is_empty() {
            return;
        }
        let mut data = 0;
        for (k, hole) in gone {
            r.remove(k);
            data += hole as u64;
        }
        let target = if r.delayed.is_empty() {
            0
        } else {
            r.claimed.saturating_sub(data)
        };
        r.settle_to(target);
    }

    /// Whether `lblk` is dirty with no block of its own on disk yet.
    pub fn is_delayed(&self, lblk: u64) -> bool {
        self.resv.lock().delayed.contains_key(&lblk)
    }

    /// Claim the blocks a write of the blocks `new` (logical block, `true`
    /// over a hole, `false` over an unwritten extent; in ascending order,
    /// none delayed yet) needs, for `who`. `meta(n)` is the worst-case map
    /// growth for `n` extents. Returns how many of `new` (a prefix) are
    /// covered and now delayed: all of them, or as many as the free space
    /// allows — the write then stops short before the first one left out —
    /// or an ENOSPC error when not even the first fits.
    pub fn reserve(
        &self,
        space: &Arc<reservation::Reservations>,
        who: Reserver,
        new: &[(u64, bool)],
        meta: &dyn Fn(u64) -> u64,
    ) -> crate::error::Result<usize> {
        if new.is_empty() {
            return Ok(0);
        }
        let mut r = self.resv.lock();
        if r.space.is_none() {
            r.space = Some(space.clone());
        }
        // What the books need with the first k of `new` added.
        let need = |k: usize| {
            let holes = new[..k].iter().filter(|n| n.1).count() as u64;
            let unwritten = k as u64 - holes;
            let data = r.data + holes;
            (data + meta(data + 2 * (r.unwritten + unwritten))).saturating_sub(r.claimed)
        };
        let mut take = new.len();
        let mut err = None;
        loop {
            match space.reserve(need(take), who) {
                Ok(()) => break,
                Err(e) => {
                    err.get_or_insert(e);
                    if take == 1 {
                        return Err(err.unwrap_or_else(|| Error::posix(Errno::ENOSPC, "no space")));
                    }
                    // The largest prefix that fits: claims grow with k.
                    let avail = space.available(who);
                    let (mut lo, mut hi) = (1usize, take - 1);
                    while lo < hi {
                        let mid = (lo + hi).div_ceil(2);
                        if need(mid) <= avail {
                            lo = mid;
                        } else {
                            hi = mid - 1;
                        }
                    }
                    take = lo;
                }
            }
        }
        let claimed_now = need(take);
        r.claimed += claimed_now;
        for &(l, hole) in &new[..take] {
            r.insert(l, hole);
        }
        Ok(take)
    }

    /// Writeback hands every claim of this inode to its transaction (the
    /// allocations draw from them); returns how many.
    pub fn take_claims(&self) -> u64 {
        std::mem::take(&mut self.resv.lock().claimed)
    }

    /// After writeback: the blocks in `mapped` have blocks on disk now;
    /// `left` claimed blocks came back from the transaction unused. Keep
    /// what the blocks still delayed need, give back the rest.
    pub fn settle(&self, mapped: impl IntoIterator<Item = u64>, left: u64, meta: &dyn Fn(u64) -> u64) {
        let mut r = self.resv.lock();
        for l in mapped {
            r.remove(l);
        }
        r.claimed += left;
        let target = r.target(meta);
        r.settle_to(target);
    }

    /// Blocks this inode has claimed (tests, statfs checks).
    pub fn claimed(&self) -> u64 {
        self.resv.lock().claimed
    }

    /// Remember a write-back failure for the next fsync or FLUSH (the
    /// first one wins until reported).
    pub fn set_wb_error(&self, e: &Error) {
        let mut w = self.wb_error.lock();
        if w.is_none() {
            *w = Some((e.errno(), e.to_string()));
        }
    }

    /// Whether a write-back failure waits to be reported.
    pub fn has_wb_error(&self) -> bool {
        self.wb_error.lock().is_some()
    }

    /// The write-back failure not yet reported, once.
    pub fn take_wb_error(&self) -> Option<Error> {
        self.wb_error
            .lock()
            .take()
            .map(|(errno, msg)| Error::posix(errno, format!("an earlier write-back failed: {msg}")))
    }

    /// Number of cached pages.
    pub fn len(&self) -> usize {
        self.pages.load().as_ref().map_or(0, |m| m.len())
    }

    /// Whether no page is cached.
    pub fn is_empty(&self) -> bool {
        self.pages.load().as_ref().is_none_or(|m| m.is_empty())
    }

    /// Drop clean pages not referenced since the last sweep; returns how
    /// many. Dirty pages are skipped; holding the map's mutex, no page can
    /// be replaced or re-dirtied between the check and the removal. Not
    /// counted: a clean page was counted when it became clean, or read
    /// clean from disk (see the module doc).
    pub fn sweep(&self, budget: &PageBudget) -> usize {
        // Under the map's mutex, like every change to the map (see
        // `insert_clean_at`). Page maps are per inode and see far less
        // churn than the caches whose sweeps moved to `ext4kit_cache::clock`
        // (papaya iteration after heavy removal is the hazard described
        // there).
        let _w = self.dirty.lock();
        let Some(map) = self.pages.load_full() else { return 0 };
        let m = map.pin();
        let mut n = 0;
        for (k, p) in m.iter() {
            if p.is_dirty() || p.referenced.swap(false, Ordering::Relaxed) {
                continue;
            }
            m.remove(k);
            n += 1;
        }
        drop(m);
        self.drop_map_if_empty(budget);
        n
    }
}

/// What an inode's page map costs beside its pages: papaya's map with its
/// own seize collector (two thread-local tables of cache-padded slots), its
/// counter and first table — 17 KiB each measured (heaptrack: 499 MiB for
/// 30,000 maps).
pub const MAP_BYTES: usize = 17 << 10;

/// Memory accounting shared by every inode's page map, within the budget
/// the page cache shares with the metadata buffers (`ext4kit_cache::budget`).
#[derive(Debug)]
pub struct PageBudget {
    budget: Arc<MemoryBudget>,
    dirty: AtomicUsize,
    page_size: usize,
}

impl PageBudget {
    /// Pages of `page_size` bytes within `budget`; an eighth of the whole
    /// budget may be dirty before writers must write back.
    pub fn new(budget: Arc<MemoryBudget>, page_size: usize) -> Self {
        PageBudget {
            budget,
            dirty: AtomicUsize::new(0),
            page_size,
        }
    }

    /// Account for `n` new pages; true when the budget is now exceeded.
    pub fn charge(&self, n: usize) -> bool {
        self.budget.charge_pages(n * self.page_size) > self.limit()
    }

    /// Release `n` pages.
    pub fn release(&self, n: usize) {
        self.budget.release_pages(n * self.page_size);
    }

    /// Account for a new page map ([`MAP_BYTES`]); the next page charge
    /// sees it and sweeps if the budget is exceeded.
    pub fn charge_map(&self) {
        self.budget.charge_pages(MAP_BYTES);
    }

    /// `n` page maps went away (emptied, or their inodes left the cache).
    pub fn release_maps(&self, n: usize) {
        if n != 0 {
            self.budget.release_pages(n * MAP_BYTES);
        }
    }

    /// Account for `n` newly dirty pages; true when the dirty budget is now
    /// exceeded.
    pub fn charge_dirty(&self, n: usize) -> bool {
        self.dirty.fetch_add(n * self.page_size, Ordering::Relaxed) + n * self.page_size
            > self.budget.dirty_page_limit()
    }

    /// `n` pages were written back (or dropped).
    pub fn release_dirty(&self, n: usize) {
        self.dirty.fetch_sub(n * self.page_size, Ordering::Relaxed);
    }

    /// Whether dirty pages exceed the dirty budget.
    pub fn dirty_over(&self) -> bool {
        self.dirty.load(Ordering::Relaxed) > self.budget.dirty_page_limit()
    }

    /// Bytes of dirty pages.
    pub fn dirty_bytes(&self) -> usize {
        self.dirty.load(Ordering::Relaxed)
    }

    /// Bytes in use.
    pub fn used(&self) -> usize {
        self.budget.page_bytes()
    }

    /// Bytes the page cache may use now (what the buffers leave).
    pub fn limit(&self) -> usize {
        self.budget.page_limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(b: u8) -> Box<[u8]> {
        vec![b; 16].into_boxed_slice()
    }

    fn budget() -> PageBudget {
        PageBudget::new(Arc::new(MemoryBudget::new(64 << 20, 4096)), 4096)
    }

    /// A clean page as a reader caches it.
    fn read_in(m: &PageMap, l: u64, b: &PageBudget) {
        assert!(m
            .insert_clean_at(l, Arc::new(Page::new(block(0))), &m.miss(), b)
            .is_some());
    }

    #[test]
    fn dirty_set_tracks_written_pages_in_order() {
        let (m, b) = (PageMap::default(), budget());
        for l in 0..100 {
            read_in(&m, l, &b);
        }
        assert_eq!(m.write_pages([(50, block(1)), (7, block(2))], &b), (0, 2));
        assert_eq!(m.write_pages([(7, block(3)), (200, block(4))], &b), (1, 1));
        assert_eq!(m.dirty_blocks(), vec![7, 50, 200]);
        assert_eq!(m.first_dirty_in(8, 1000), Some(50));
        assert_eq!(m.first_dirty_in(51, 200), None);
        assert_eq!(m.with(7, |d| d[0]), Some(3));
    }

    #[test]
    fn redirtied_page_stays_dirty() {
        let (m, b) = (PageMap::default(), budget());
        m.write_pages([(5, block(1))], &b);
        let written = m.get(5).unwrap();
        // A writer replaces the page while "writeback" writes the old one.
        m.write_pages([(5, block(2))], &b);
        assert!(!m.mark_clean(5, &written));
        assert_eq!(m.dirty_blocks(), vec![5]);
        let cur = m.get(5).unwrap();
        assert!(m.mark_clean(5, &cur));
        assert!(m.dirty_blocks().is_empty());
        assert!(!cur.is_dirty());
    }

    #[test]
    fn sweep_never_drops_dirty_pages() {
        let (m, b) = (PageMap::default(), budget());
        read_in(&m, 1, &b);
        m.write_pages([(2, block(1))], &b);
        // Two sweeps: the first clears reference bits, the second evicts.
        m.sweep(&b);
        m.sweep(&b);
        assert!(m.get(1).is_none());
        assert!(m.get(2).is_some_and(|p| p.is_dirty()));
    }

    #[test]
    fn remove_range_drops_pages_and_dirty_entries() {
        let (m, b) = (PageMap::default(), budget());
        for l in 0..10 {
            read_in(&m, l, &b);
        }
        m.write_pages([(3, block(1)), (8, block(1)), (1 << 40, block(1))], &b);
        let s = m.miss();
        assert_eq!(m.remove_range(5, u64::MAX, &b), (6, 2));
        assert!(!m.unchanged(&s));
        assert_eq!(m.len(), 5);
        assert_eq!(m.dirty_blocks(), vec![3]);
        assert_eq!(m.remove_range(0, 2, &b), (2, 0));
    }

    #[test]
    fn a_page_map_is_charged_while_it_exists() {
        let (m, b) = (PageMap::default(), budget());
        assert!(!m.has_map());
        assert_eq!(b.used(), 0, "no page, no map, no charge");
        read_in(&m, 1, &b);
        m.write_pages([(2, block(1))], &b);
        assert!(m.has_map());
        assert_eq!(b.used(), MAP_BYTES, "the map is charged once (pages are the caller's)");
        // The sweep takes the clean page, not the dirty one: the map stays.
        m.sweep(&b);
        m.sweep(&b);
        assert_eq!((m.len(), b.used()), (1, MAP_BYTES));
        let dirty = m.get(2).unwrap();
        assert!(m.mark_clean(2, &dirty));
        m.sweep(&b);
        m.sweep(&b);
        assert!(!m.has_map(), "the sweep that took the last page dropped the map");
        assert_eq!(b.used(), 0);
        assert!(m.get(2).is_none() && m.with(2, |_| ()).is_none());
        // A reader's miss makes a new one; truncation drops it again.
        read_in(&m, 7, &b);
        assert_eq!(b.used(), MAP_BYTES);
        assert_eq!(m.remove_range(0, u64::MAX, &b), (1, 0));
        assert!(!m.has_map());
        assert_eq!(b.used(), 0);
    }
}
