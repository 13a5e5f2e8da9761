//! Frontend holds on inode numbers ([`crate::Fs::hold_inode`]): FUSE's
//! lookup counts, kept here by inode number, mostly a bit each, rather
//! than as references that keep whole inodes in memory.
//!
//! A hold says: this *number* must not be freed (and so not reused) until
//! the hold is dropped, because a frontend handed it out and may still be
//! asked about it (the kernel's FUSE inode for the node id lives until
//! FORGET, `fuse_forget_link`). It does not keep the inode cached: a held
//! inode that is clean, linked and not open is evicted like any other
//! (`Icache::evict`), and read back from disk when next used; its hold
//! count, living here, is exact whatever happened to the in-memory copy.
//! A mount whose kernel remembers a million inodes (a create storm on a
//! machine with memory to spare: the kernel's inode cache is bounded by
//! memory pressure, not by count) so costs about a bit per inode here
//! instead of a cached inode (~1 KiB) each.
//!
//! The rules that make a hold keep an unlinked inode allocated, as an
//! open file does (`ext4_evict_inode` runs only at the last `iput`; until
//! then an unlinked inode sits on the orphan list, `ext4_orphan_add` from
//! `ext4_unlink`):
//!
//! - **0 → 1** (`evict::hold_inode`'s slow path) under the inode's `disk`
//!   reader lock, after checking the record is not freed (mode 0).
//!   `drop_link` and `release_unlinked` read the count under the writer
//!   side when they decide between freeing and the orphan list: so either
//!   the decision sees the hold, or the hold sees the inode freed and
//!   fails (ENOENT).
//! - **n → n+1** needs no inode lock: while the count is above zero no
//!   decision can free the number (they all read a count above zero), so
//!   adding to it is just counting, under the shard mutex. A lookup of an
//!   inode the kernel already holds (the common case) takes one short
//!   uncontended-in-practice mutex and nothing of the inode's.
//! - **n → 0** (`evict::drop_holds`) under the shard mutex. `drop_link` sets
//!   `CachedInode::unlinked` before it takes the same mutex to read the
//!   count; so if the last drop came after that read (the inode went to
//!   the orphan list), the dropper, reading the flag after its mutex
//!   section, sees it set and frees the inode (`release_unlinked`, which
//!   waits for the writer lock and decides again). If it came before, the
//!   decision sees zero. An unlinked inode is never evicted from the inode
//!   cache (it could not be read back: its record says deleted), so the
//!   dropper finds the inode to free in the cache; an inode the cache does
//!   not have is linked, and a dropped hold leaves it alone.
//!
//! Lock order: an inode's `disk` lock, then a shard mutex; nothing is
//! taken under a shard mutex and nothing there does I/O.

use std::collections::HashMap;

use parking_lot::Mutex;

use ext4kit_cache::map::KeyHasher;

/// Shards: parallel lookups of different inodes rarely meet on one lock.
/// A shard owns whole 64-inode words of the held bitmap (see [`Shard`]).
const SHARDS: usize = 64;

/// Inodes per word of the held bitmap.
const WORD: u32 = 64;

/// A count that did not fit in a `u32` lives in `big` (a kernel that looks
/// one inode up four billion times between two FORGETs: `fuse_dentry_revalidate`
/// counts every revalidating lookup).
const BIG: u32 = u32::MAX;

/// Most held inodes are held once — the kernel counts one lookup per
/// CREATE or LOOKUP reply and usually keeps its dentry until it FORGETs —
/// so "held at all" is a bit in a word of 64 neighbouring inode numbers
/// and only counts above one take a table entry. A create storm allocates
/// neighbouring numbers: a million held inodes cost ~16,000 words (~0.4
/// MiB with the table's spare room) where a count per inode cost ~18
/// bytes each (18 MiB at the peak of 1,000,000 creates through the
/// mount, heaptrack).
#[derive(Debug, Default)]
struct Shard {
    /// `ino / WORD` → bit `ino % WORD` set when `ino` is held.
    held: HashMap<u32, u64, KeyHasher>,
    /// Inode number → holds when more than one, or [`BIG`]: see `big`.
    counts: HashMap<u32, u32, KeyHasher>,
    /// The counts of [`BIG`] entries.
    big: HashMap<u32, u64, KeyHasher>,
}

/// Give memory back after a mass FORGET (the kernel dropping its caches):
/// a table never shrinks by itself.
fn shrink<V>(m: &mut HashMap<u32, V, KeyHasher>) {
    let cap = m.capacity();
    if cap > 1024 && m.len() * 4 < cap {
        m.shrink_to(m.len() * 2);
    }
}

impl Shard {
    fn get(&self, ino: u32) -> u64 {
        let word = self.held.get(&(ino / WORD)).copied().unwrap_or(0);
        if word & (1 << (ino % WORD)) == 0 {
            return 0;
        }
        match self.counts.get(&ino) {
            None => 1,
            Some(&BIG) => self.big[&ino],
            Some(&n) => u64::from(n),
        }
    }

    fn set(&mut self, ino: u32, n: u64) {
        let (key, bit) = (ino / WORD, 1u64 << (ino % WORD));
        if n == 0 {
            if let Some(w) = self.held.get_mut(&key) {
                *w &= !bit;
                if *w == 0 {
                    self.held.remove(&key);
                    shrink(&mut self.held);
                }
            }
        } else {
            *self.held.entry(key).or_insert(0) |= bit;
        }
        if n <= 1 {
            if self.counts.remove(&ino).is_some() {
                shrink(&mut self.counts);
            }
            self.big.remove(&ino);
        } else if n < u64::from(BIG) {
            self.counts.insert(ino, n as u32);
            self.big.remove(&ino);
        } else {
            self.counts.insert(ino, BIG);
            self.big.insert(ino, n);
        }
    }
}

/// Hold counts by inode number (see the module doc).
#[derive(Debug)]
pub struct Holds {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for Holds {
    fn default() -> Self {
        Holds {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }
}

impl Holds {
    fn shard(&self, ino: u32) -> &Mutex<Shard> {
        &self.shards[(ino / WORD) as usize % SHARDS]
    }

    /// One more hold on `ino` if it is held already (`false`: it is not,
    /// nothing changed; the caller takes the first hold under the inode's
    /// lock and [`Self::add`]).
    pub(crate) fn add_if_held(&self, ino: u32) -> bool {
        let mut s = self.shard(ino).lock();
        match s.get(ino) {
            0 => false,
            n => {
                s.set(ino, n.saturating_add(1));
                true
            }
        }
    }

    /// One more hold on `ino`. The caller holds the inode's `disk` reader
    /// lock and saw it not freed (module doc, 0 → 1).
    pub(crate) fn add(&self, ino: u32) {
        let mut s = self.shard(ino).lock();
        let n = s.get(ino);
        s.set(ino, n.saturating_add(1));
    }

    /// Drop `n` holds on `ino` (more than it has: all of them). `true`
    /// when this dropped the last one.
    pub(crate) fn sub(&self, ino: u32, n: u64) -> bool {
        let mut s = self.shard(ino).lock();
        match s.get(ino) {
            0 => false,
            have => {
                let left = have.saturating_sub(n);
                s.set(ino, left);
                left == 0
            }
        }
    }

    /// Drop every hold; the numbers that had any.
    pub(crate) fn drain(&self) -> Vec<u32> {
        let mut all = Vec::new();
        for s in self.shards.iter() {
            let mut s = s.lock();
            for (key, word) in s.held.drain() {
                all.extend((0..WORD).filter(|b| word & (1 << b) != 0).map(|b| key * WORD + b));
            }
            s.counts.clear();
            s.big.clear();
            s.held.shrink_to_fit();
            s.counts.shrink_to_fit();
        }
        all
    }

    /// Holds on `ino` now (0: not held).
    pub fn count(&self, ino: u32) -> u64 {
        self.shard(ino).lock().get(ino)
    }

    /// Whether `ino` is held. For the decisions of `drop_link` and
    /// `release_unlinked`, under the inode's `disk` writer lock.
    pub(crate) fn is_held(&self, ino: u32) -> bool {
        self.count(ino) != 0
    }

    /// Number of inodes held.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().held.values().map(|w| w.count_ones() as usize).sum::<usize>())
            .sum()
    }

    /// Whether no inode is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the tables have allocated (entries and control bytes; an
    /// estimate of the heap they use, for tests and diagnostics).
    pub fn heap_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock();
                s.held.capacity() * (std::mem::size_of::<(u32, u64)>() + 1)
                    + s.counts.capacity() * (std::mem::size_of::<(u32, u32)>() + 1)
                    + s.big.capacity() * (std::mem::size_of::<(u32, u64)>() + 1)
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ext4::orphan;
    use crate::vfs::{mem_fs, Cred, Fs};
    use crate::NewInode;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Inodes on the orphan list (the classic chain and the orphan file).
    fn orphans(fs: &Fs) -> Vec<u32> {
        let mut v = orphan::chain(fs.volume()).unwrap();
        v.extend(orphan::file_slots(fs.volume()).unwrap().iter().map(|s| s.ino));
        v
    }

    /// `ino` is not in the inode cache after evictions of all that may go
    /// (a few tries: the background worker may hold it for a moment).
    fn evicted(fs: &Fs, ino: u32) -> bool {
        crate::vfs::pin::drop_cached();
        fs.sync().unwrap();
        for _ in 0..50 {
            fs.sb().icache().evict_unused();
            if fs.sb().icache().peek(ino).is_none() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        false
    }

    /// A held inode is evicted like any clean, linked, unused one; its
    /// holds survive by number. Unlinked while evicted, it is read back
    /// and goes to the orphan list (not freed), stays cached from then on,
    /// and the last dropped hold frees it.
    #[test]
    fn a_held_inode_evicted_then_unlinked_is_orphaned_until_its_last_hold_goes() {
        let fs = mem_fs();
        let root = Cred::root();
        let free0 = fs.statfs().unwrap();
        let st = fs
            .write_file(&NewInode::file(b"/held").mode(0o644).owner(0, 0), &[7u8; 5000])
            .unwrap();
        let ino = st.ino;
        {
            let inode = fs.inode(ino).unwrap();
            fs.hold_inode(&inode).unwrap();
            fs.hold_inode(&inode).unwrap();
        }
        assert_eq!(fs.holds().count(ino), 2);
        assert!(evicted(&fs, ino), "a held, clean, linked inode may leave the cache");
        assert_eq!(fs.holds().count(ino), 2, "its holds did not go with it");
        // A hold taken while it is out of the cache reads it back.
        fs.hold_inode(&fs.inode(ino).unwrap()).unwrap();
        fs.drop_holds(ino, 1).unwrap();
        assert!(evicted(&fs, ino));

        fs.unlink(b"/held", &root).unwrap();
        assert_eq!(orphans(&fs), vec![ino], "held: orphaned, not freed");
        assert_eq!(fs.stat(ino).unwrap().nlink, 0);
        assert!(
            !evicted(&fs, ino),
            "an unlinked inode stays cached (it cannot be read back)"
        );
        for i in 0..20 {
            let s = fs
                .write_file(
                    &NewInode::file(format!("/n{i}").as_bytes()).mode(0o644).owner(0, 0),
                    b"x",
                )
                .unwrap();
            assert_ne!(s.ino, ino, "a held inode number was reused");
        }
        fs.drop_holds(ino, 1).unwrap();
        assert_eq!(orphans(&fs), vec![ino], "one hold left");
        fs.drop_holds(ino, 1).unwrap();
        assert!(orphans(&fs).is_empty(), "the last hold freed it");
        assert!(fs.holds().is_empty());
        assert!(fs.inode(ino).is_err(), "freed");
        for i in 0..20 {
            fs.unlink(format!("/n{i}").as_bytes(), &root).unwrap();
        }
        fs.sync().unwrap();
        let free1 = fs.statfs().unwrap();
        assert_eq!(
            (free1.blocks_free, free1.files_free),
            (free0.blocks_free, free0.files_free),
            "inode and blocks freed"
        );
    }

    /// Rename over a held, evicted inode orphans it too; dropping every
    /// hold at once (a session's end) frees it.
    #[test]
    fn a_held_inode_renamed_over_is_freed_when_all_holds_go() {
        let fs = mem_fs();
        let root = Cred::root();
        let free0 = fs.statfs().unwrap();
        let a = fs
            .write_file(&NewInode::file(b"/a").mode(0o644).owner(0, 0), b"a")
            .unwrap();
        fs.write_file(&NewInode::file(b"/b").mode(0o644).owner(0, 0), b"b")
            .unwrap();
        fs.hold_inode(&fs.inode(a.ino).unwrap()).unwrap();
        assert!(evicted(&fs, a.ino));
        fs.rename(b"/b", b"/a", Default::default(), &root).unwrap();
        assert_eq!(orphans(&fs), vec![a.ino]);
        fs.drop_all_holds().unwrap();
        assert!(orphans(&fs).is_empty());
        fs.unlink(b"/a", &root).unwrap();
        fs.sync().unwrap();
        let free1 = fs.statfs().unwrap();
        assert_eq!(
            (free1.blocks_free, free1.files_free),
            (free0.blocks_free, free0.files_free)
        );
    }

    /// Holds taken and dropped, inodes evicted and read back, and unlinks,
    /// all at once: every inode is freed exactly once, when its last user
    /// goes, and nothing is left on the orphan list or allocated.
    #[test]
    fn holds_evictions_and_unlinks_race_without_leaks_or_double_frees() {
        let fs = mem_fs();
        let root = Cred::root();
        let free0 = fs.statfs().unwrap();
        for round in 0..30 {
            let inos: Vec<u32> = (0..8)
                .map(|i| {
                    fs.write_file(
                        &NewInode::file(format!("/r{i}").as_bytes()).mode(0o644).owner(0, 0),
                        b"data",
                    )
                    .unwrap()
                    .ino
                })
                .collect();
            let stop = Arc::new(AtomicBool::new(false));
            let evictor = {
                let (fs, stop) = (fs.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        fs.sb().icache().evict_unused();
                    }
                })
            };
            let holders: Vec<_> = (0..2)
                .map(|t| {
                    let (fs, inos) = (fs.clone(), inos.clone());
                    std::thread::spawn(move || {
                        for k in 0..400usize {
                            let ino = inos[(k * 3 + t) % inos.len()];
                            let Ok(i) = fs.inode(ino) else { continue };
                            // The reference we hold is the cached inode
                            // (or a dead one the unlink dropped).
                            let ok = fs.sb().icache().peek(ino) == Some(Arc::as_ptr(&i))
                                || i.unlinked.load(Ordering::SeqCst);
                            assert!(ok, "round {round}: a second copy of inode {ino}");
                            if fs.hold_inode(&i).is_ok() {
                                drop(i);
                                std::thread::yield_now();
                                fs.drop_holds(ino, 1).unwrap();
                            }
                        }
                    })
                })
                .collect();
            for i in 0..8 {
                fs.unlink(format!("/r{i}").as_bytes(), &root).unwrap();
                std::thread::yield_now();
            }
            for h in holders {
                h.join().unwrap();
            }
            stop.store(true, Ordering::Relaxed);
            evictor.join().unwrap();
            assert!(fs.holds().is_empty());
            assert!(orphans(&fs).is_empty(), "round {round}: left on the orphan list");
        }
        crate::vfs::pin::drop_cached();
        fs.sync().unwrap();
        let free1 = fs.statfs().unwrap();
        assert_eq!(
            (free1.blocks_free, free1.files_free),
            (free0.blocks_free, free0.files_free),
            "every inode freed exactly once"
        );
    }

    #[test]
    fn counts_go_up_and_down_by_number() {
        let h = Holds::default();
        assert!(!h.add_if_held(7), "not held: the first hold is the caller's");
        h.add(7);
        assert!(h.add_if_held(7));
        assert_eq!(h.count(7), 2);
        assert!(!h.sub(7, 1));
        assert!(h.sub(7, 5), "more than it has drops them all");
        assert_eq!(h.count(7), 0);
        assert!(!h.sub(7, 1), "dropping an unheld number is harmless");
        assert!(h.is_empty());
    }

    #[test]
    fn counts_past_u32_are_exact() {
        let h = Holds::default();
        h.add(9);
        {
            let mut s = h.shard(9).lock();
            s.set(9, u64::from(u32::MAX) - 1);
        }
        assert!(h.add_if_held(9));
        assert!(h.add_if_held(9));
        assert_eq!(h.count(9), u64::from(u32::MAX) + 1);
        assert!(!h.sub(9, 2));
        assert_eq!(h.count(9), u64::from(u32::MAX) - 1);
        assert!(!h.sub(9, 1));
        assert!(h.sub(9, u64::from(u32::MAX)));
        assert!(h.is_empty());
        assert!(h.shard(9).lock().big.is_empty());
    }

    #[test]
    fn a_million_holds_cost_a_bit_each_and_go_back() {
        let h = Holds::default();
        for ino in 11..1_000_011 {
            h.add(ino);
        }
        // Every 7th looked up once more, as a kernel revalidating does.
        for ino in (11..1_000_011).step_by(7) {
            assert!(h.add_if_held(ino));
        }
        assert_eq!(h.len(), 1_000_000);
        assert_eq!(
            (h.count(10), h.count(11), h.count(12), h.count(1_000_009)),
            (0, 2, 1, 1)
        );
        let bytes = h.heap_bytes();
        // ~15,600 words and ~143,000 counts of two (with spare room).
        assert!(bytes < 4 << 20, "{bytes} bytes for a million holds");
        for ino in (11..1_000_011).step_by(7) {
            assert!(!h.sub(ino, 1), "one of two holds left");
        }
        let drained = h.drain();
        assert_eq!(drained.len(), 1_000_000);
        assert_eq!(drained.iter().min().copied(), Some(11));
        assert_eq!(drained.iter().max().copied(), Some(1_000_010));
        assert!(h.is_empty());
        for ino in 11..1_000_011 {
            h.add(ino);
        }
        for ino in 11..1_000_011 {
            assert!(h.sub(ino, 1));
        }
        assert!(
            h.heap_bytes() < 1 << 20,
            "{} bytes after every hold went",
            h.heap_bytes()
        );
    }
}
