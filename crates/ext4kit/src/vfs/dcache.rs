//! The dentry cache: (parent inode, name) → dentry, positive or negative.
//!
//! Lock-free dentry references and a seqcount path walk, as they apply
//! here:
//! - Lookups are lock-free map reads under an epoch guard; the path walk
//!   borrows intermediate dentries from the map without taking a reference
//!   (no refcount traffic on `/`, `/usr`, ... when many threads resolve paths
//!   below them). `namei::resolve` clones the final dentry for its caller.
//! - A reference is an `Arc` clone: an atomic increment, never a lock (no
//!   lock at the zero transition either: eviction removes only entries
//!   whose count says the map is their only holder, `remove_if`).
//! - Each dentry's parent and name are atomically replaceable pointers;
//!   a rename (write path) swaps them under the rename lock and bumps the
//!   rename sequence. `d_path` reads the chain optimistically (borrowing
//!   each parent and name through arc-swap guards, no count written) and
//!   retries if the sequence moved, falling back to the shared side of the
//!   rename lock, so path builders never exclude one another.
//! - `open` does not clone the final dentry either: it borrows it under the
//!   walk's pin and finds its thread's pin on it (`vfs::pin`), which owns
//!   the reference an open file needs (the kernel's `lockref` traffic,
//!   made per-thread).
//! - A miss never caches a name older than a concurrent removal, by
//!   exclusion (the miss rule of `ext4kit_cache`): a lookup that misses
//!   reads the directory and inserts its dentry holding the directory's
//!   lock shared (`vfs::namei`), and every create, unlink and rename
//!   changes the directory, then its dentries, holding it exclusively. So
//!   what a lookup inserts is what the directory holds, and a dentry
//!   evicted meanwhile was no newer: removals need no count, and the
//!   cache is an `ext4kit_cache::Cache` with the `Excluded` proof.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use arc_swap::{ArcSwap, ArcSwapOption};

use ext4kit_cache::{Cache, CacheRef, Excluded, Visit};
use ext4kit_format::inode::FileType;
use parking_lot::RwLock;

/// A name in a directory, as cached.
#[derive(Debug)]
pub struct Dentry {
    /// The name (replaced on rename).
    pub name: ArcSwap<NameBytes>,
    /// The parent dentry; `None` only for the root.
    pub parent: ArcSwapOption<Dentry>,
    /// Inode number, or 0 for a negative dentry (the name does not exist).
    pub ino: u32,
    /// Type, when known from the directory entry.
    pub ftype: Option<FileType>,
    referenced: AtomicBool,
}

/// A dentry's name, shared by the dentry and its map key (one allocation
/// of the name per cached dentry, not two).
type Name = Arc<NameBytes>;

/// The bytes of a cached name: inline up to 24 bytes (most names), so the
/// name is one allocation with its reference counts, and reading it — a
/// lookup's compare, `d_path` — one pointer hop, not two as through an
/// `Arc<Box<[u8]>>`. (`ArcSwap` needs a sized type, hence not `Arc<[u8]>`.)
pub type NameBytes = smallvec::SmallVec<[u8; 24]>;

impl Dentry {
    /// A new dentry for `name` under `parent`, with the map key that
    /// shares its name.
    fn child(parent: &Arc<Dentry>, key: KeyRef<'_>, ino: u32, ftype: Option<FileType>) -> (Key, Arc<Dentry>) {
        let name: Name = Arc::new(NameBytes::from_slice(key.name));
        let key = Key {
            dir: key.dir,
            fp: key.fp,
            name: name.clone(),
        };
        let d = Arc::new(Dentry {
            name: ArcSwap::new(name),
            parent: ArcSwapOption::from(Some(parent.clone())),
            ino,
            ftype,
            // Unreferenced until used again (see `ext4kit_cache::clock`).
            referenced: AtomicBool::new(false),
        });
        (key, d)
    }

    /// Whether the name exists.
    pub fn is_positive(&self) -> bool {
        self.ino != 0
    }
}

/// A pinned view of the dentry cache (see [`Dcache::pin`]).
pub struct DcacheGuard<'a> {
    c: &'a Dcache,
    m: MapRef<'a>,
}

impl DcacheGuard<'_> {
    /// The cached dentry for `name` in directory `dir_ino`, borrowed.
    pub fn get(&self, dir_ino: u32, name: &[u8]) -> Option<&Arc<Dentry>> {
        let d = self.m.get(&self.c.key(dir_ino, name))?;
        crate::vfs::touch(&d.referenced);
        Some(d)
    }

    /// Whether `d` is still the cached dentry of its name: the check an
    /// open makes after counting itself (`Fs::open_walked`). Reads only —
    /// the parent and name through arc-swap guards (the calling thread's
    /// own debt slots), the map under this pin — so it writes no line
    /// other openers share. The root is never in the map and
    /// never goes away: always cached.
    pub fn holds(&self, d: &Arc<Dentry>) -> bool {
        let parent = d.parent.load();
        let Some(p) = parent.as_ref() else { return true };
        let name = d.name.load();
        self.m
            .get(&self.c.key(p.ino, &name[..]))
            .is_some_and(|cur| Arc::ptr_eq(cur, d))
    }

    /// Insert a lookup result; an entry inserted concurrently wins. The
    /// caller holds the directory's lock, shared, since before its lookup
    /// (the module doc).
    pub fn insert(&self, parent: &Arc<Dentry>, name: &[u8], ino: u32, ftype: Option<FileType>) -> &Arc<Dentry> {
        let (key, d) = Dentry::child(parent, self.c.key(parent.ino, name), ino, ftype);
        let (got, ours) = self.m.fill_excluded(key, d);
        if ours {
            self.c.inserted();
        }
        self.c.index_dir(got);
        self.c.maybe_evict(&self.m);
        got
    }
}

/// Map key: directory inode and name, owned; the map, the clock queue and
/// the dentry share one copy of the name.
///
/// The key carries a fingerprint of the name (a hash under the cache's own
/// random seed) and hashes as (directory, fingerprint), so hashing a key
/// never follows the pointer to its name. The map rehashes every live key
/// when it copies its table (papaya does not reuse the slots of removed
/// entries, so a cache at its limit copies its table every few tens of
/// thousands of inserts) and the eviction sweep hashes each key it
/// visits: past the dcache's limit, creating a million files in one
/// directory, both ran at one cold name — two cache misses, the `Arc` and
/// the bytes — per key.
#[derive(Debug, Clone)]
struct Key {
    dir: u32,
    fp: u64,
    name: Name,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.dir.hash(h);
        self.fp.hash(h);
    }
}

impl PartialEq for Key {
    fn eq(&self, o: &Key) -> bool {
        // The sweep looks a queued key up in the map, and both hold the
        // same name: equal pointers answer without reading the bytes.
        self.dir == o.dir && self.fp == o.fp && (Arc::ptr_eq(&self.name, &o.name) || **self.name == **o.name)
    }
}

impl Eq for Key {}

/// The dentry map's hasher. A key's fingerprint is already a seeded hash
/// of its name, so the map only folds the directory into it: hashing
/// (directory, fingerprint) again with the caches' foldhash was a second
/// hash per lookup on the path walk's hot path. Keys of one directory
/// differ only in their fingerprints, which an image cannot predict.
#[derive(Debug, Clone, Copy, Default)]
struct FpBuild;

impl std::hash::BuildHasher for FpBuild {
    type Hasher = FpHasher;
    fn build_hasher(&self) -> FpHasher {
        FpHasher(0)
    }
}

struct FpHasher(u64);

impl Hasher for FpHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Not reached by `Key`/`KeyRef` (they write a u32 and a u64); kept
        // correct for any other input all the same.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, dir: u32) {
        self.0 ^= (dir as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u64(&mut self, fp: u64) {
        self.0 ^= fp;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The dentry map with its clock.
type Dentries = Cache<Key, Arc<Dentry>, Excluded, FpBuild>;

/// A pinned view of the dentry map.
type MapRef<'a> = CacheRef<'a, Key, Arc<Dentry>, Excluded, FpBuild>;

/// Borrowed form of [`Key`] for allocation-free lookups; hashes identically.
#[derive(Clone, Copy)]
struct KeyRef<'a> {
    dir: u32,
    fp: u64,
    name: &'a [u8],
}

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.dir.hash(h);
        self.fp.hash(h);
    }
}

impl papaya::Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, k: &Key) -> bool {
        self.dir == k.dir && self.fp == k.fp && *self.name == **k.name
    }
}

/// Deepest chain `d_path` follows: a path of `PATH_MAX` (4096) bytes has
/// at most 2048 components.
const MAX_DEPTH: usize = 2048;

/// A seqcount: writers make it odd while changing, readers retry if it moved.
#[derive(Debug, Default)]
pub struct SeqCount(AtomicU64);

impl SeqCount {
    /// Start a read section: the (even) sequence to check against.
    pub fn read_begin(&self) -> u64 {
        loop {
            let s = self.0.load(Ordering::Acquire);
            if s & 1 == 0 {
                return s;
            }
            std::hint::spin_loop();
        }
    }

    /// Whether a read section that began at `s` must retry.
    pub fn read_retry(&self, s: u64) -> bool {
        std::sync::atomic::fence(Ordering::Acquire);
        self.0.load(Ordering::Relaxed) != s
    }

    /// Enter a write section (caller holds the writer lock).
    pub fn write_begin(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    /// Leave a write section.
    pub fn write_end(&self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// The dentry cache.
#[derive(Debug)]
pub struct Dcache {
    /// The dentries and their eviction order.
    map: Dentries,
    root: Arc<Dentry>,
    /// Bumped around every rename (the kernel's `rename_lock` sequence).
    pub rename_seq: SeqCount,
    /// Taken exclusively by renames, shared by `d_path` after retries.
    pub rename_lock: RwLock<()>,
    limit: usize,
    /// d_path calls that had to fall back to the lock.
    pub d_path_fallbacks: AtomicU64,
    /// Directory inode -> its (only) dentry, weakly held so the index never
    /// keeps a dentry alive. Operations that name a directory by inode
    /// number (the FUSE server, `*_at` calls) find its dentry here to keep
    /// the cache and `d_path` right across renames.
    dirs: ext4kit_cache::map::Map<u32, Weak<Dentry>>,
    /// One cross-directory rename at a time (the kernel's
    /// `s_vfs_rename_mutex`): while held, no directory changes parent, so
    /// "is A an ancestor of B" answers stay true for the whole rename.
    pub rename_mutex: parking_lot::Mutex<()>,
    /// Seeds the names' fingerprints (see [`Key`]): random per cache, so an
    /// image cannot choose names whose fingerprints collide.
    names: ext4kit_cache::map::KeyHasher,
    /// When to sweep, and whether the background worker does it.
    pub(crate) trigger: ext4kit_cache::flusher::Trigger,
}

impl Dcache {
    /// A cache for a filesystem whose root is inode `root_ino`.
    pub fn new(root_ino: u32, limit: usize) -> Self {
        let root = Arc::new(Dentry {
            name: ArcSwap::from_pointee(NameBytes::from_slice(b"/")),
            parent: ArcSwapOption::empty(),
            ino: root_ino,
            ftype: Some(FileType::Directory),
            referenced: AtomicBool::new(true),
        });
        Dcache {
            map: Cache::new(FpBuild, 1024, Excluded),
            root,
            rename_seq: SeqCount::default(),
            rename_lock: RwLock::new(()),
            limit: limit.max(256),
            d_path_fallbacks: AtomicU64::new(0),
            dirs: ext4kit_cache::map::new(),
            rename_mutex: parking_lot::Mutex::new(()),
            names: Default::default(),
            trigger: Default::default(),
        }
    }

    fn key<'a>(&self, dir: u32, name: &'a [u8]) -> KeyRef<'a> {
        use std::hash::BuildHasher;
        KeyRef {
            dir,
            fp: self.names.hash_one(name),
            name,
        }
    }

    /// The owned key of a dentry that takes `name` in `dir`.
    fn key_of(&self, dir: u32, name: Name) -> Key {
        Key {
            fp: self.key(dir, &name).fp,
            dir,
            name,
        }
    }

    /// The root dentry.
    pub fn root(&self) -> &Arc<Dentry> {
        &self.root
    }

    /// Pin the cache for a walk: dentries borrowed through the returned
    /// guard stay valid (epoch-protected) until it is dropped, even if they
    /// are evicted meanwhile — which is what lets a walk hold intermediate
    /// dentries without references.
    pub fn pin(&self) -> DcacheGuard<'_> {
        DcacheGuard {
            c: self,
            m: self.map.pin(),
        }
    }

    /// Run `f` on the cached dentry for `name` in `dir_ino`, without taking
    /// a reference.
    pub fn with<R>(&self, dir_ino: u32, name: &[u8], f: impl FnOnce(&Arc<Dentry>) -> R) -> Option<R> {
        self.pin().get(dir_ino, name).map(f)
    }

    /// Insert what a directory lookup found (`ino == 0`: negative entry)
    /// and return the cached dentry (an existing one wins a race).
    pub fn insert(&self, parent: &Arc<Dentry>, name: &[u8], ino: u32, ftype: Option<FileType>) -> Arc<Dentry> {
        self.pin().insert(parent, name, ino, ftype).clone()
    }

    /// Record that `name` in `parent` now refers to `ino` (after a create),
    /// replacing a negative or stale entry.
    pub fn set(&self, parent: &Arc<Dentry>, name: &[u8], ino: u32, ftype: Option<FileType>) -> Arc<Dentry> {
        let (key, d) = Dentry::child(parent, self.key(parent.ino, name), ino, ftype);
        let m = self.map.pin();
        match m.insert_current(key, d.clone()) {
            None => self.inserted(),
            // The entry it replaces (negative, or stale) keeps its place
            // in the clock; a directory's stops being indexed.
            Some(old) => self.unindex_dir(old),
        }
        self.index_dir(&d);
        self.maybe_evict(&m);
        d
    }

    /// Count an insert on this thread (see [`ext4kit_cache::map::FlushClock`]:
    /// the creating threads would otherwise keep every old table).
    fn inserted(&self) {
        thread_local!(static INSERTS: ext4kit_cache::FlushClock = const { ext4kit_cache::FlushClock::new() });
        INSERTS.with(|c| self.map.tick(c));
    }

    /// Second-chance sweep down to three quarters of the limit once the map
    /// passes its threshold. Dentries in use (held by a walk's caller, an
    /// open file, or a child's parent pointer) stay. One sweeper at a time;
    /// after a sweep that could not reach the target, the next waits for a
    /// quarter of the limit of new entries, so a sweep's O(n) walk costs
    /// O(1) per insert whatever is pinned.
    fn maybe_evict(&self, m: &MapRef<'_>) {
        // Past the threshold the background worker sweeps; only past it by
        // half the limit again (the worker is behind) do we.
        if self.trigger.sweep_here(m.len(), self.limit, self.limit / 2) {
            self.sweep(m);
        }
    }

    /// The background worker's pass: sweep if over the threshold.
    pub fn reclaim(&self) {
        let m = self.map.pin();
        if self.trigger.due(m.len(), self.limit) {
            self.sweep(&m);
        }
    }

    fn sweep(&self, m: &MapRef<'_>) {
        self.trigger.sweep(self.limit, || {
            // In clock order, never by iterating the map (see ext4kit_cache::clock).
            let target = self.limit / 4 * 3;
            m.sweep(
                || m.len() <= target,
                |k| {
                    let Some(v) = m.get(k) else { return Visit::Gone };
                    if Arc::strong_count(v) > 1 || v.referenced.swap(false, Ordering::Relaxed) {
                        return Visit::Keep;
                    }
                    match m.remove_if(k, |_, v| Arc::strong_count(v) == 1) {
                        Ok(_) => Visit::Gone,
                        Err(_) => Visit::Keep,
                    }
                },
            );
            m.len()
        });
    }

    fn index_dir(&self, d: &Arc<Dentry>) {
        if d.ftype == Some(FileType::Directory) && d.ino != 0 {
            let m = self.dirs.pin();
            if m.get(&d.ino)
                .and_then(Weak::upgrade)
                .is_none_or(|cur| !Arc::ptr_eq(&cur, d))
            {
                m.insert(d.ino, Arc::downgrade(d));
            }
        }
    }

    /// The dentry of directory `ino`, when cached.
    pub fn dir(&self, ino: u32) -> Option<Arc<Dentry>> {
        if ino == self.root.ino {
            return Some(self.root.clone());
        }
        self.dirs.pin().get(&ino).and_then(Weak::upgrade)
    }

    /// Forget `name` in directory `dir_ino` (after unlink or rmdir, or before
    /// publishing a new name): the next lookup goes to disk. Whoever holds
    /// the dentry keeps it, detached.
    pub fn remove(&self, dir_ino: u32, name: &[u8]) {
        let m = self.map.pin();
        if let Some(d) = m.remove(&self.key(dir_ino, name)) {
            self.unindex_dir(d);
        }
    }

    /// A directory dentry leaving the map leaves the by-inode index too
    /// (unless the index already names another dentry of that inode).
    fn unindex_dir(&self, d: &Arc<Dentry>) {
        if d.ftype == Some(FileType::Directory) {
            let dm = self.dirs.pin();
            if dm
                .get(&d.ino)
                .and_then(Weak::upgrade)
                .is_some_and(|cur| Arc::ptr_eq(&cur, d))
            {
                dm.remove(&d.ino);
            }
        }
    }

    /// Record that a name was added: drop any negative entry and publish the
    /// positive one when the parent's dentry is known.
    pub fn added(&self, dir_ino: u32, name: &[u8], ino: u32, ftype: FileType) {
        // `set` replaces what is there in one step: a separate remove first
        // was one more probe of the map per create, on cold memory once
        // the directory is large.
        match self.dir(dir_ino) {
            Some(p) => {
                self.set(&p, name, ino, Some(ftype));
            }
            None => self.remove(dir_ino, name),
        }
    }

    /// Record a rename (or, with `exchange`, a swap) in the cache. The moved
    /// dentry keeps its identity, so holders (open directories, `d_path`)
    /// see the new name; the rename sequence makes concurrent `d_path`
    /// readers retry.
    pub fn renamed(&self, old_dir: u32, old_name: &[u8], new_dir: u32, new_name: &[u8], exchange: bool) {
        let m = self.map.pin();
        let src = m.remove(&self.key(old_dir, old_name)).cloned();
        let dst = m.remove(&self.key(new_dir, new_name)).cloned();
        let (np, op) = (self.dir(new_dir), self.dir(old_dir));
        if let (Some(d), Some(np)) = (src.filter(|d| d.is_positive()), np) {
            self.move_dentry(&d, &np, new_name);
            // The moved dentry joins the clock under its new key (its old
            // key there is stale now): without it, a renamed dentry was
            // never evicted.
            m.insert_current(self.key_of(new_dir, d.name.load_full()), d);
        }
        if exchange {
            if let (Some(d), Some(op)) = (dst.filter(|d| d.is_positive()), op) {
                self.move_dentry(&d, &op, old_name);
                m.insert_current(self.key_of(old_dir, d.name.load_full()), d);
            }
        } else if let Some(d) = dst.filter(|d| d.ftype == Some(FileType::Directory)) {
            let dm = self.dirs.pin();
            if dm
                .get(&d.ino)
                .and_then(Weak::upgrade)
                .is_some_and(|cur| Arc::ptr_eq(&cur, &d))
            {
                dm.remove(&d.ino);
            }
        }
    }

    /// Number of cached dentries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Build the absolute path of `d` (the kernel's `d_path`): an optimistic
    /// walk up the parent chain validated by the rename sequence, retried a
    /// few times, then done under the shared rename lock.
    pub fn d_path(&self, d: &Arc<Dentry>) -> Vec<u8> {
        for _ in 0..3 {
            let s = self.rename_seq.read_begin();
            let p = Self::build_path(d);
            if !self.rename_seq.read_retry(s) {
                return p;
            }
        }
        self.d_path_fallbacks.fetch_add(1, Ordering::Relaxed);
        let _g = self.rename_lock.read();
        Self::build_path(d)
    }

    fn build_path(d: &Dentry) -> Vec<u8> {
        let mut out = Vec::new();
        Self::append_path(d, MAX_DEPTH, &mut out);
        if out.is_empty() {
            out.push(b'/');
        }
        out
    }

    /// Append `d`'s path below the root to `out`, ancestors first. The
    /// parents and names are borrowed through arc-swap guards (a slot of
    /// the calling thread's own debt list), not cloned: a clone is an
    /// increment of a count every path builder through that dentry
    /// writes — `/`'s children are on every path. (Past the eight guards
    /// a thread holds at once, arc-swap falls back to a clone.) Bounded by
    /// `depth`: a longer chain is a cycle a racing rename made for a
    /// moment, and the caller's sequence check retries.
    fn append_path(d: &Dentry, depth: usize, out: &mut Vec<u8>) {
        let parent = d.parent.load();
        let Some(p) = parent.as_ref() else { return };
        if depth > 0 {
            Self::append_path(p, depth - 1, out);
        }
        out.push(b'/');
        out.extend_from_slice(&d.name.load());
    }

    /// Move `d` under `new_parent` with `new_name` (the rename primitive:
    /// writers serialise on the rename lock and bump the sequence).
    pub fn move_dentry(&self, d: &Arc<Dentry>, new_parent: &Arc<Dentry>, new_name: &[u8]) {
        let _g = self.rename_lock.write();
        self.rename_seq.write_begin();
        d.parent.store(Some(new_parent.clone()));
        d.name.store(Arc::new(NameBytes::from_slice(new_name)));
        self.rename_seq.write_end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two names with one fingerprint (forced here; 1 in 2^64 by chance)
    /// are still two keys: the fingerprint only spares hashing the bytes.
    #[test]
    fn keys_with_equal_fingerprints_compare_their_names() {
        let (a, b): (Name, Name) = (
            Arc::new(NameBytes::from_slice(b"a")),
            Arc::new(NameBytes::from_slice(b"b")),
        );
        let ka = Key {
            dir: 2,
            fp: 7,
            name: a.clone(),
        };
        let kb = Key { dir: 2, fp: 7, name: b };
        assert_ne!(ka, kb);
        let ka2 = Key {
            dir: 2,
            fp: 7,
            name: Arc::new(NameBytes::from_slice(b"a")),
        };
        assert_eq!(ka, ka2, "equal names in separate allocations");
        let r = KeyRef {
            dir: 2,
            fp: 7,
            name: b"b",
        };
        assert!(papaya::Equivalent::equivalent(&r, &kb) && !papaya::Equivalent::equivalent(&r, &ka));
        let m: papaya::HashMap<Key, u32, FpBuild> = papaya::HashMap::with_hasher(FpBuild);
        let g = m.pin();
        g.insert(ka.clone(), 1);
        g.insert(kb.clone(), 2);
        assert_eq!((g.get(&ka), g.get(&kb), g.len()), (Some(&1), Some(&2), 2));
        // Key and KeyRef hash alike (else no lookup finds an entry), and the
        // directory moves the hash of an equal fingerprint.
        use std::hash::BuildHasher;
        let r_a = KeyRef {
            dir: 2,
            fp: 7,
            name: b"a",
        };
        assert_eq!(FpBuild.hash_one(&ka), FpBuild.hash_one(r_a));
        assert_ne!(FpBuild.hash_one(&ka), FpBuild.hash_one(KeyRef { dir: 3, ..r_a }));
        // A different directory with the same name and fingerprint.
        assert_eq!(
            g.get(&KeyRef {
                dir: 3,
                fp: 7,
                name: b"a"
            }),
            None
        );
    }

    #[test]
    fn insert_lookup_and_d_path() {
        let c = Dcache::new(2, 1000);
        let a = c.insert(c.root(), b"a", 12, Some(FileType::Directory));
        let b = c.insert(&a, b"b", 13, Some(FileType::Regular));
        assert_eq!(c.with(12, b"b", |d| d.ino), Some(13));
        assert_eq!(c.with(12, b"zz", |d| d.ino), None);
        assert_eq!(c.d_path(&b), b"/a/b".to_vec());
        assert_eq!(c.d_path(c.root()), b"/".to_vec());
        let neg = c.insert(&a, b"missing", 0, None);
        assert!(!neg.is_positive());
    }

    /// A created name replaces what was cached for it in one step: a
    /// negative entry becomes positive (one entry, not two), and a
    /// directory's dentry that is replaced leaves the by-inode index.
    #[test]
    fn added_replaces_negative_and_stale_entries() {
        let c = Dcache::new(2, 1000);
        c.insert(c.root(), b"x", 0, None);
        c.added(2, b"x", 5, FileType::Regular);
        assert_eq!(c.with(2, b"x", |d| d.ino), Some(5));
        assert_eq!(c.len(), 1);
        c.added(2, b"d", 7, FileType::Directory);
        assert!(c.dir(7).is_some());
        c.added(2, b"d", 9, FileType::Regular);
        assert!(c.dir(7).is_none(), "the replaced directory dentry is unindexed");
        assert_eq!(c.with(2, b"d", |d| d.ino), Some(9));
        // Under a parent whose dentry is not cached, the name is forgotten.
        c.insert(c.root(), b"sub", 40, Some(FileType::Directory));
        c.remove(2, b"sub");
        c.added(40, b"y", 6, FileType::Regular);
        assert_eq!(c.with(40, b"y", |d| d.ino), None);
    }

    /// Renamed dentries stay evictable: a rename storm keeps the cache
    /// near its limit (they used to leave the eviction queue for good).
    /// With a background worker attached that never runs, the cache grows
    /// at most half its limit past its threshold before the inserting
    /// caller sweeps; the worker's pass brings it back under the limit.
    #[test]
    fn a_worker_that_falls_behind_leaves_the_sweep_to_the_caller() {
        let c = Dcache::new(2, 256);
        c.trigger
            .worker
            .set(Arc::new(ext4kit_cache::flusher::Signal::default()))
            .unwrap();
        let mut most = 0;
        for i in 0..3000u32 {
            c.set(c.root(), format!("f{i}").as_bytes(), 100 + i, Some(FileType::Regular));
            most = most.max(c.len());
        }
        assert!(most > 256, "past the limit the sweep was left to the worker");
        assert!(most <= 256 + 128 + 1, "{most} dentries cached for a limit of 256");
        c.reclaim();
        assert!(c.len() <= 256, "{} dentries after the worker's pass", c.len());
    }

    #[test]
    fn renamed_dentries_are_still_evicted() {
        let c = Dcache::new(2, 256);
        for i in 0..2000u32 {
            let old = format!("a{i}");
            c.insert(c.root(), old.as_bytes(), 100 + i, Some(FileType::Regular));
            c.renamed(2, old.as_bytes(), 2, format!("b{i}").as_bytes(), false);
        }
        for i in 0..100u32 {
            c.insert(c.root(), format!("c{i}").as_bytes(), 5000 + i, Some(FileType::Regular));
        }
        assert!(
            c.len() <= 256 + 256 / 4 + 1,
            "{} dentries cached for a limit of 256",
            c.len()
        );
        assert_eq!(
            c.with(2, b"b1999", |d| d.ino),
            Some(2099),
            "the newest renamed entry is still there"
        );
    }

    #[test]
    fn d_path_under_concurrent_renames_is_always_a_valid_path() {
        let c = Arc::new(Dcache::new(2, 1000));
        let x = c.insert(c.root(), b"x", 10, Some(FileType::Directory));
        let y = c.insert(c.root(), b"y", 11, Some(FileType::Directory));
        let f = c.insert(&x, b"f", 12, Some(FileType::Regular));
        let stop = Arc::new(AtomicBool::new(false));
        let renamer = {
            let (c, f, x, y, stop) = (c.clone(), f.clone(), x.clone(), y.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (p, n) = if i.is_multiple_of(2) {
                        (&y, &b"g"[..])
                    } else {
                        (&x, &b"f"[..])
                    };
                    c.move_dentry(&f, p, n);
                    i += 1;
                }
                i
            })
        };
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (c, f) = (c.clone(), f.clone());
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let p = c.d_path(&f);
                        assert!(
                            p == b"/x/f" || p == b"/y/g",
                            "torn path {:?}",
                            String::from_utf8_lossy(&p)
                        );
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        assert!(renamer.join().unwrap() > 0);
    }
}
