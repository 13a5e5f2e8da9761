//! The inode cache: one [`CachedInode`] per inode in use, shared by every
//! dentry and open file that refers to it.
//!
//! Lookups are lock-free reads of a concurrent map (an
//! `ext4kit_cache::Cache`); a reference is an `Arc` clone (an atomic
//! increment, never a lock: lock-free references on hot shared objects).
//! A miss reads the record unlocked too, and meanwhile a writer may cache
//! the inode, change it, write it back and see it evicted: so the cache
//! counts its removals (the miss rule of `ext4kit_cache`, by counted
//! removals) — an inode leaves the map only under its stripe's lock,
//! counted there, and a miss inserts what it read under that lock only if
//! no removal was counted since its read began, else it reads again.
//!
//! A hit clones the `Arc` it borrowed from the map, and eviction removes
//! an entry only when the map's is the only reference. Those two must
//! not cross: an evictor that read the count as 1 just before a reader's
//! clone, and then removed the entry, left the reader with an inode no
//! longer cached — and the next miss read a second copy of the same
//! inode, with its own lock and its own open count: an unlink deciding
//! through one copy could free an inode open through the other, and
//! changes made through one were lost to the other. (That was the
//! "eviction-vs-lookup race".) So both sides are a Dekker pair over two
//! words: the evictor raises `CachedInode::evicting`, fences, and then
//! reads the count; a reader increments the count (the clone), fences,
//! and then reads the flag (`Icache::claim`). With both fences SeqCst
//! one of them sees the other's write: either the evictor sees the clone
//! and keeps the inode, or the reader sees the flag and does not trust
//! its clone — it waits on the stripe's lock, which the evictor holds
//! from raising the flag to its verdict, and looks again. A hit
//! thus costs a fence and a read of a line nobody writes, and no shared
//! write beyond the `Arc` count it always took.
//!
//! The on-disk record
//! sits behind a reader/writer lock (the `i_rwsem` analogue) for the write
//! path; the size is mirrored in an atomic so SEEK_END and reads never take
//! that lock (lock-free lseek).
//!
//! `disk` is the inode as it is *now* in memory — size, times, block map —
//! not necessarily as it is on disk. Every change to it is made under its
//! write lock together with a dirtiness level (fsync costs O(dirty), and
//! fdatasync is real: `I_DIRTY` / `I_RDIRTY`): [`DIRTY_TIME`] when only
//! timestamps changed, [`DIRTY_DATA`] when something a later read of the
//! data depends on changed (size, block map, `i_blocks`). fsync writes the record when
//! either is set; fdatasync only for [`DIRTY_DATA`].

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwapOption;
use ext4kit_format::inode::{FileType, Inode};
use parking_lot::RwLock;

use super::pagecache::{PageBudget, PageMap};
use crate::error::{Errno, Error, Result};
use crate::ext4::{bmap, inode, BlockMap, Volume};
use ext4kit_cache::{Cache, CacheRef, Counted, Fill, Visit};

/// Only timestamps differ from the record on disk (`I_DIRTY`).
pub const DIRTY_TIME: u8 = 1;
/// Data-relevant fields differ: size, block map, `i_blocks` (`I_RDIRTY`).
pub const DIRTY_DATA: u8 = 2;

/// An inode in memory.
#[derive(Debug)]
pub struct CachedInode {
    /// Inode number.
    pub ino: u32,
    /// File type (fixed for the life of the inode).
    pub ftype: FileType,
    /// The on-disk record (the `i_rwsem` analogue guards changes).
    pub disk: RwLock<Inode>,
    /// `i_size`, readable without the lock.
    pub size: AtomicU64,
    /// Block map, loaded on first use and replaced wholesale on change, so
    /// readers never lock. The slot itself is made on first use too:
    /// dropping an `ArcSwap` pays the readers' debts (a walk of every
    /// thread's debt list), and in a create storm past the inode cache's
    /// limit an inode that never loaded its map is dropped per create —
    /// that walk, on cold memory, was ~0.6 µs of a create at 1,000,000
    /// files in one directory, and grew with the eviction the directory's
    /// size brings.
    map: OnceLock<ArcSwapOption<BlockMap>>,
    /// Cached file pages.
    pub pages: PageMap,
    /// Open files that keep an unlinked inode from being freed: one per
    /// live, unrevoked open-file pin (`vfs::pin`, which counts the open
    /// files on it in its own word). Exact only after `pin::revoke_idle`;
    /// an unlinked inode is freed when it reaches zero and no frontend
    /// holds its number (`Fs::hold_inode`: counted by number in
    /// `vfs::holds`, not here, so that a held inode can leave the cache).
    /// [`crate::vfs::pin::open_files`] counts files.
    pub opens: AtomicU32,
    /// The state words of this inode's open-file pins (`vfs::pin`), for
    /// revocation.
    pub(crate) pins: parking_lot::Mutex<Vec<Arc<super::pin_word::PinWord>>>,
    /// Its last link is gone (set by `drop_link` before it revokes idle
    /// pins; a close reads it after dropping its open: see `vfs::pin`).
    pub(crate) unlinked: AtomicBool,
    /// Made by `O_TMPFILE` without `O_EXCL` and not linked since: a link
    /// may give it its first name although its link count is 0 (the
    /// kernel's `I_LINKABLE`, set by `vfs_tmpfile`, cleared by
    /// `vfs_link`). Changed under the `disk` write lock.
    pub(crate) linkable: AtomicBool,
    /// [`DIRTY_TIME`] | [`DIRTY_DATA`]; changed under the `disk` write lock.
    dirty: AtomicU8,
    referenced: AtomicBool,
    /// An eviction is deciding about (or has made) this inode: raised by
    /// the evictor under its stripe's lock, lowered there if it
    /// keeps the inode, left up if it removed it. A reference taken from
    /// the map that finds it up is not trusted (`Icache::claim`).
    evicting: AtomicBool,
}

impl CachedInode {
    fn new(ino: u32, inode: Inode) -> Result<Self> {
        let ftype = inode.file_type().ok_or_else(|| {
            Error::corrupt_msg(
                format!("inode {ino}"),
                "inode",
                format!("invalid file type in mode {:#o}", inode.base.mode),
            )
        })?;
        Ok(CachedInode {
            ino,
            ftype,
            size: AtomicU64::new(inode.size()),
            disk: RwLock::new(inode),
            map: OnceLock::new(),
            pages: PageMap::default(),
            opens: AtomicU32::new(0),
            pins: Default::default(),
            unlinked: AtomicBool::new(false),
            linkable: AtomicBool::new(false),
            dirty: AtomicU8::new(0),
            // Unreferenced until used again (see `ext4kit_cache::clock`).
            referenced: AtomicBool::new(false),
            evicting: AtomicBool::new(false),
        })
    }

    /// The block map, loading it on first use.
    pub fn block_map(&self, vol: &Volume) -> Result<Arc<BlockMap>> {
        if let Some(m) = self.map.get().and_then(ArcSwapOption::load_full) {
            crate::vfs::shared::note(2);
            return Ok(m);
        }
        // Parse and publish under the shared lock: a writer changes the map
        // and resets the cached one under the exclusive side, so a map
        // parsed from an older record can never be stored after the reset.
        let rec = self.disk.read();
        self.block_map_locked(vol, &rec)
    }

    /// The block map, for a caller that already holds the `disk` lock
    /// (reading it through [`Self::block_map`] would take the lock again).
    pub fn block_map_locked(&self, vol: &Volume, rec: &Inode) -> Result<Arc<BlockMap>> {
        let slot = self.map.get_or_init(ArcSwapOption::empty);
        if let Some(m) = slot.load_full() {
            return Ok(m);
        }
        let m = Arc::new(bmap::load(vol, self.ino, rec)?);
        slot.store(Some(m.clone()));
        Ok(m)
    }

    /// Record that the in-memory record changed (`level`: [`DIRTY_TIME`]
    /// and/or [`DIRTY_DATA`]). Caller holds the `disk` write lock.
    pub fn mark_dirty(&self, level: u8) {
        self.dirty.fetch_or(level, Ordering::AcqRel);
    }

    /// The current dirtiness level.
    pub fn dirty_level(&self) -> u8 {
        self.dirty.load(Ordering::Acquire)
    }

    /// The record was written: nothing differs any more. Caller holds the
    /// `disk` write lock (so no change can slip between write and clear).
    pub fn clear_dirty(&self) {
        self.dirty.store(0, Ordering::Release);
    }

    /// Whether anything about this inode (record or pages) is unwritten.
    pub fn is_dirty(&self) -> bool {
        self.dirty_level() != 0 || self.pages.dirty_count() != 0
    }

    /// Forget the cached block map (after the write side changed it); the
    /// next reader loads the new one.
    pub fn reset_block_map(&self) {
        if let Some(slot) = self.map.get() {
            slot.store(None);
        }
        // Readers holding the old map recheck (see PageMap's `seq`).
        self.pages.bump();
    }

    /// Current size in bytes.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
}

/// The cache of in-memory inodes.
#[derive(Debug)]
pub struct Icache {
    /// The inodes, their eviction order, and per stripe of inode numbers
    /// the lock that orders removals against a miss's insert (see the
    /// module doc).
    map: Inodes,
    limit: usize,
    /// When to sweep, and whether the background worker does it.
    pub(crate) trigger: ext4kit_cache::flusher::Trigger,
    pages: Arc<PageBudget>,
}

/// Stripes of inode numbers (removal counts and their locks).
const STRIPES: usize = 64;

type Inodes = Cache<u32, Arc<CachedInode>, Counted>;
type MapRef<'a> = CacheRef<'a, u32, Arc<CachedInode>, Counted>;

impl Icache {
    /// A cache of about `limit` inodes (more while they are in use).
    pub fn new(limit: usize, pages: Arc<PageBudget>) -> Self {
        Icache {
            map: Cache::new(Default::default(), 1024, Counted::new(STRIPES)),
            limit: limit.max(64),
            trigger: Default::default(),
            pages,
        }
    }

    /// The in-memory inode `ino`, reading it from disk on a miss.
    pub fn get(&self, vol: &Volume, ino: u32) -> Result<Arc<CachedInode>> {
        self.get_or_read(ino, || inode::read(vol, ino))
    }

    /// The address of the cached inode `ino`, if cached — no reference
    /// taken, nothing written (it may be evicted the moment this returns:
    /// the address is only for comparing with objects the caller holds,
    /// as `pin::reopen` does).
    pub fn peek(&self, ino: u32) -> Option<*const CachedInode> {
        let m = self.map.pin();
        let i = m.get(&ino)?;
        crate::vfs::touch(&i.referenced);
        Some(Arc::as_ptr(i))
    }

    /// [`Self::get`] with the record read by `read` on a miss. What it
    /// read is cached only if no inode of its stripe left the cache during
    /// the read — one that did may have been a newer version of this one,
    /// written back and evicted after the read began — else it reads again.
    fn get_or_read(&self, ino: u32, mut read: impl FnMut() -> Result<Inode>) -> Result<Arc<CachedInode>> {
        if let Some(i) = self.cached(ino) {
            return Ok(i);
        }
        loop {
            let miss = self.map.miss(&ino);
            let fresh = Self::checked(ino, read()?)?;
            let g = self.map.lock(&ino);
            let m = self.map.pin();
            let got = match m.fill(&g, &miss, ino, fresh) {
                Fill::Stale => continue,
                Fill::Inserted(got) => {
                    let got = got.clone();
                    Self::inserted(&self.map);
                    got
                }
                // A racing miss's, or a writer's. Under the stripe lock no
                // entry has its eviction flag up, so this clone is good.
                Fill::Cached(got) => got.clone(),
            };
            drop((m, g));
            self.maybe_evict();
            return Ok(got);
        }
    }

    /// Count an insert on this thread: the creating threads would
    /// otherwise keep every old table (`ext4kit_cache::FlushClock`).
    fn inserted(map: &Inodes) {
        thread_local!(static INSERTS: ext4kit_cache::FlushClock = const { ext4kit_cache::FlushClock::new() });
        INSERTS.with(|c| map.tick(c));
    }

    /// A record read from disk as a cached inode, refused if it is free.
    fn checked(ino: u32, inode: Inode) -> Result<Arc<CachedInode>> {
        if inode.base.links_count == 0 && inode.base.mode == 0 {
            return Err(Error::corrupt_msg(
                format!("inode {ino}"),
                "inode",
                "a directory entry points at a free inode",
            ));
        }
        if inode.base.links_count == 0 {
            // Deleted (its record keeps the mode; ext4_iget says ESTALE).
            // An unlinked inode still in use is never read from disk: its
            // users' references keep it cached. Reading it back would
            // resurrect a freed inode — a lookup or a FUSE listing that
            // found the name just before an unlink — and freeing it again
            // at its last release corrupted the bitmaps.
            return Err(Error::posix(Errno::ENOENT, format!("inode {ino} was deleted")));
        }
        Ok(Arc::new(CachedInode::new(ino, inode)?))
    }

    /// Cache a record that was just written (a new inode): the next lookup
    /// finds it without reading the inode-table block back — which would
    /// also publish the block's draft, costing a copy of the block at the
    /// next inode written into it (see `ext4::buffer`).
    pub fn insert_new(&self, ino: u32, rec: Inode) -> Result<Arc<CachedInode>> {
        let fresh = Arc::new(CachedInode::new(ino, rec)?);
        let m = self.map.pin();
        let got = loop {
            // The newest record there is: no removal can make it stale.
            match m.insert_new(ino, fresh.clone()) {
                (_, true) => {
                    Self::inserted(&self.map);
                    break fresh;
                }
                // Cached already (a dead predecessor its freer has not
                // dropped yet). Taken as a hit is; if an eviction removed
                // it, ours goes in its place.
                (cur, false) => {
                    if let Some(c) = self.claim(&m, ino, cur) {
                        break c;
                    }
                }
            }
        };
        drop(m);
        self.maybe_evict();
        Ok(got)
    }

    /// The cached inode `ino`, if cached (nothing is read from disk).
    pub fn cached(&self, ino: u32) -> Option<Arc<CachedInode>> {
        let m = self.map.pin();
        let i = m.get(&ino)?;
        let got = self.claim(&m, ino, i)?;
        crate::vfs::touch(&got.referenced);
        crate::vfs::shared::note(2);
        Some(got)
    }

    /// Whether `ino` is cached and unlinked, read in place: no reference
    /// taken, no use recorded, nothing written (an entry borrowed under
    /// the map's pin stays alive until the pin drops, evicting or not).
    pub(crate) fn is_unlinked(&self, ino: u32) -> bool {
        let m = self.map.pin();
        m.get(&ino).is_some_and(|i| i.unlinked.load(Ordering::Acquire))
    }

    /// A counted reference to `v`, which the caller borrowed from the map
    /// as the entry of `ino` under the pin `m` — or to whatever replaced
    /// it, or `None` if an eviction removed it meanwhile. The reader's
    /// half of the Dekker pair in the module doc: the clone (the count's
    /// increment), a SeqCst fence, then the flag; the evictor raises the
    /// flag, fences, then reads the count.
    fn claim(&self, m: &MapRef<'_>, ino: u32, v: &Arc<CachedInode>) -> Option<Arc<CachedInode>> {
        let got = v.clone();
        fence(Ordering::SeqCst);
        if !got.evicting.load(Ordering::Relaxed) {
            return Some(got);
        }
        drop(got);
        // An evictor is deciding (it holds this lock from raising the flag
        // to its verdict) or has removed it: wait for the verdict. Under
        // the lock no entry of this stripe has the flag up, and none can be
        // removed: what the map holds now is safe to clone.
        let _g = self.map.lock(&ino);
        m.get(&ino).cloned()
    }

    /// Counted references to the cached inodes `pick` chooses (writeback
    /// collecting dirty inodes). Each is claimed as a hit is (see
    /// `Icache::claim`), so none is a copy an eviction just dropped.
    pub fn collect(&self, mut pick: impl FnMut(&CachedInode) -> bool) -> Vec<Arc<CachedInode>> {
        let m = self.map.pin();
        let mut out = Vec::new();
        for (ino, v) in m.iter() {
            if pick(v) {
                if let Some(got) = self.claim(&m, *ino, v) {
                    // Re-picked: an eviction may have put another in its place.
                    if Arc::ptr_eq(&got, v) || pick(&got) {
                        out.push(got);
                    }
                }
            }
        }
        out
    }

    /// Past the sweep threshold, kick the background worker; past it by
    /// half the limit again (the worker is behind), sweep here. Not under
    /// a stripe lock: the sweep takes them.
    fn maybe_evict(&self) {
        if self.trigger.sweep_here(self.map.len(), self.limit, self.limit / 2) {
            self.sweep();
        }
    }

    /// The background worker's pass: sweep if over the threshold.
    pub fn reclaim(&self) {
        if self.trigger.due(self.map.len(), self.limit) {
            self.sweep();
        }
    }

    /// Inodes in use or dirty stay, so a sweep may stop short of its
    /// target (see `ext4kit_cache::flusher::Trigger` for what follows then).
    fn sweep(&self) {
        let m = self.map.pin();
        self.trigger.sweep(self.limit, || {
            self.evict(&m);
            m.len()
        });
    }

    /// Drop unused inodes (clock: one sweep of grace for recently used),
    /// in the order of the cache's clock (never by iterating the map: see
    /// `ext4kit_cache::clock`).
    fn evict(&self, m: &MapRef<'_>) {
        self.evict_to(m, self.limit / 4 * 3);
    }

    /// Evict every inode nothing keeps (both clock passes: recently used
    /// ones too). For tests.
    #[cfg(test)]
    pub(crate) fn evict_unused(&self) {
        self.evict_to(&self.map.pin(), 0);
    }

    /// [`Self::evict`] down to `target` inodes.
    fn evict_to(&self, m: &MapRef<'_>, target: usize) {
        let (mut released, mut maps) = (0, 0);
        m.sweep(
            || m.len() <= target,
            |ino| {
                let Some(v) = m.get(ino) else { return Visit::Gone };
                // Only the map holds it: nobody can be using it. A dirty
                // inode stays until written back (its state lives only here).
                if Arc::strong_count(v) > 1
                    || v.is_dirty()
                    || v.referenced.swap(false, Ordering::Relaxed)
                    || !Self::evictable(v)
                {
                    return Visit::Keep;
                }
                let Some(mut g) = self.map.try_lock(ino) else {
                    return Visit::Keep;
                };
                // Under the lock: what the map holds now (a forget may have
                // replaced the entry since the look above).
                let Some(v) = m.get(ino) else { return Visit::Gone };
                // The evictor's half of the Dekker pair (module doc): flag
                // up, fence, then the count. A reader whose clone this
                // does not see sees the flag and waits on the stripe lock.
                v.evicting.store(true, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                if Arc::strong_count(v) > 1 {
                    v.evicting.store(false, Ordering::Relaxed);
                    return Visit::Keep;
                }
                // The map's is the only reference: the state only users
                // change (dirtiness, the unlinked flag, a write-back
                // error) is as the last of them left it. Its `Arc` drop was
                // a release decrement that the count's read saw; the
                // acquire fence after that read pairs with it (as in
                // `Arc::drop` itself).
                fence(Ordering::Acquire);
                if !Self::evictable(v) {
                    v.evicting.store(false, Ordering::Relaxed);
                    return Visit::Keep;
                }
                // Nobody can take a reference now (readers wait on the
                // stripe lock): the entry goes, counted, and the flag stays
                // up on it for readers that cloned it meanwhile.
                match m.remove_if(&mut g, ino, |_, cur| Arc::ptr_eq(cur, v)) {
                    Ok(Some((_, v))) => {
                        released += v.pages.len();
                        maps += usize::from(v.pages.has_map());
                        Visit::Gone
                    }
                    Ok(None) => Visit::Gone,
                    Err(_) => {
                        v.evicting.store(false, Ordering::Relaxed);
                        Visit::Keep
                    }
                }
            },
        );
        self.pages.release(released);
        self.pages.release_maps(maps);
    }

    /// Whether nothing but the cached copy itself would be lost with it:
    /// not dirty (its state lives only here until written back), not
    /// unlinked (an unlinked inode cannot be read back, its record says
    /// deleted; one that frontends hold or files have open waits for its
    /// last release here, `vfs::holds`), and no write-back failure waiting
    /// for the next fsync. An inode frontends merely hold is evictable:
    /// its hold lives by number (`vfs::holds`).
    fn evictable(v: &CachedInode) -> bool {
        !v.is_dirty() && !v.unlinked.load(Ordering::Acquire) && !v.pages.has_wb_error()
    }

    /// Drop inode `ino` from the cache (it was freed: a later inode with the
    /// same number must be read afresh). Holders keep their reference.
    pub fn forget(&self, ino: u32) {
        let m = self.map.pin();
        let mut g = self.map.lock(&ino);
        if let Some(v) = m.remove(&mut g, &ino) {
            self.pages.release(v.pages.len());
            self.pages.release_maps(usize::from(v.pages.has_map()));
        }
        drop(g);
        m.compact();
    }

    /// Drop `inode` from the cache if it is still the cached one for its
    /// number. The freeing side uses this: by the time it gets here the
    /// number may already belong to a new inode (allocation sees the freed
    /// bit at once), whose cache entry must stay.
    pub fn forget_if(&self, inode: &CachedInode) {
        let m = self.map.pin();
        let mut g = self.map.lock(&inode.ino);
        if m.get(&inode.ino)
            .is_some_and(|cur| std::ptr::eq(Arc::as_ptr(cur), inode))
        {
            if let Some(v) = m.remove(&mut g, &inode.ino) {
                self.pages.release(v.pages.len());
                self.pages.release_maps(usize::from(v.pages.has_map()));
            }
        }
    }

    /// Number of cached inodes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Visit every cached inode (for page-cache eviction). The callback
    /// borrows; to keep an inode, use [`Self::collect`] (a clone of the
    /// borrow could be of an inode an eviction is removing).
    pub fn for_each(&self, mut f: impl FnMut(&Arc<CachedInode>) -> bool) {
        let m = self.map.pin();
        for (_, v) in m.iter() {
            if !f(v) {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_cache::budget::MemoryBudget;

    fn record(size: u32) -> Inode {
        let mut r = Inode::parse_raw(&[0u8; 256]).unwrap();
        r.base.mode = 0o100644;
        r.base.links_count = 1;
        r.base.set_size(size.into());
        r
    }

    /// With a background worker attached that never runs, the cache grows
    /// at most half its limit past its threshold before the inserting
    /// caller sweeps; the worker's pass brings it back under the limit.
    #[test]
    fn a_worker_that_falls_behind_leaves_the_sweep_to_the_caller() {
        let c = Icache::new(
            256,
            Arc::new(PageBudget::new(Arc::new(MemoryBudget::new(1 << 20, 4096)), 4096)),
        );
        c.trigger
            .worker
            .set(Arc::new(ext4kit_cache::flusher::Signal::default()))
            .unwrap();
        let mut most = 0;
        for ino in 100..3000 {
            c.insert_new(ino, record(0)).unwrap();
            most = most.max(c.map.len());
        }
        assert!(most > 256, "past the limit the sweep was left to the worker");
        assert!(most <= 256 + 128 + 1, "{most} inodes cached for a limit of 256");
        c.reclaim();
        assert!(c.map.len() <= 256, "{} inodes after the worker's pass", c.map.len());
    }

    /// A miss reads the record unlocked. Should a writer meanwhile cache
    /// the inode, change it, write it back and see it evicted, what the
    /// miss read is older than the disk and must not be cached: later
    /// users would see the old size, and a change made through it would
    /// undo the writer's.
    #[test]
    fn a_miss_that_raced_a_change_and_an_eviction_caches_the_newer_record() {
        let c = Icache::new(
            64,
            Arc::new(PageBudget::new(Arc::new(MemoryBudget::new(1 << 20, 4096)), 4096)),
        );
        let disk = std::cell::Cell::new(1u32);
        let mut reads = 0;
        let got = c
            .get_or_read(5, || {
                reads += 1;
                // What the device returns: read before the write below.
                let before = record(disk.get());
                if reads == 1 {
                    let w = c.get_or_read(5, || Ok(record(disk.get()))).unwrap();
                    w.disk.write().base.size_lo = 2;
                    disk.set(2);
                    drop(w);
                    for ino in 100..160 {
                        c.insert_new(ino, record(0)).unwrap();
                    }
                    c.evict(&c.map.pin());
                    assert!(c.map.pin().get(&5).is_none(), "the changed inode was evicted");
                }
                Ok(before)
            })
            .unwrap();
        assert_eq!(got.disk.read().size(), 2, "the miss got the record on disk");
        assert!(Arc::ptr_eq(&got, &c.get_or_read(5, || panic!("cached")).unwrap()));
    }

    /// Readers cloning hits while an evictor sweeps the same inodes: every
    /// reference a reader holds is to the inode the cache holds (no second
    /// copy of one inode). Before `claim`, an evictor that read the count
    /// as 1 just before a reader's clone removed the entry anyway, and the
    /// next miss read a second copy.
    #[test]
    fn a_hit_never_keeps_an_inode_an_eviction_dropped() {
        use std::sync::atomic::AtomicUsize;
        let c = Arc::new(Icache::new(
            64,
            Arc::new(PageBudget::new(Arc::new(MemoryBudget::new(1 << 20, 4096)), 4096)),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicUsize::new(0));
        let evictor = {
            let (c, stop) = (c.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // No grace for recently used inodes: these all are.
                    c.for_each(|i| {
                        i.referenced.store(false, Ordering::Relaxed);
                        true
                    });
                    c.evict_unused();
                }
            })
        };
        let t0 = std::time::Instant::now();
        let readers: Vec<_> = (0..3)
            .map(|t| {
                let (c, reads) = (c.clone(), reads.clone());
                std::thread::spawn(move || {
                    let mut round = 0u32;
                    // Until the evictor has made many evictions (it may
                    // get little CPU on a small machine), at most 20 s.
                    while (round < 20_000 || reads.load(Ordering::Relaxed) < 2_000)
                        && t0.elapsed() < std::time::Duration::from_secs(20)
                    {
                        round += 1;
                        let ino = 10 + (round * 7 + t * 13) % 32;
                        let i = c
                            .get_or_read(ino, || {
                                reads.fetch_add(1, Ordering::Relaxed);
                                Ok(record(ino))
                            })
                            .unwrap();
                        // While we hold it, it is the cached one.
                        assert_eq!(c.peek(ino), Some(Arc::as_ptr(&i)), "a second copy of inode {ino}");
                        let j = c.cached(ino).expect("held, so cached");
                        assert!(Arc::ptr_eq(&i, &j));
                        if round.is_multiple_of(64) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        evictor.join().unwrap();
        let reads = reads.load(Ordering::Relaxed);
        assert!(reads > 32, "the evictor never evicted ({reads} reads)");
    }

    /// What is not evictable stays: a dirty inode, an unlinked one (it
    /// could not be read back) and one with a write-back error to report.
    #[test]
    fn dirty_unlinked_and_failed_inodes_stay() {
        let c = Icache::new(
            64,
            Arc::new(PageBudget::new(Arc::new(MemoryBudget::new(1 << 20, 4096)), 4096)),
        );
        let a = c.insert_new(20, record(1)).unwrap();
        a.mark_dirty(DIRTY_TIME);
        let b = c.insert_new(21, record(1)).unwrap();
        b.unlinked.store(true, Ordering::SeqCst);
        let d = c.insert_new(22, record(1)).unwrap();
        d.pages.set_wb_error(&Error::posix(Errno::EIO, "test"));
        c.insert_new(23, record(1)).unwrap();
        drop((a, b, d));
        c.evict_unused();
        assert!(c.peek(20).is_some() && c.peek(21).is_some() && c.peek(22).is_some());
        assert!(c.peek(23).is_none(), "a clean, linked, unused inode goes");
        assert!(c.cached(22).unwrap().pages.take_wb_error().is_some());
        c.evict_unused();
        assert!(c.peek(22).is_none(), "reported, it may go");
    }
}
