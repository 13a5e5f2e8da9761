//! A stripe: the lock of a set of cache keys and the count of their
//! removals — the unit that makes "a miss never caches something older
//! than a concurrent removal" hold (the crate doc states the rule).
//!
//! A miss notes the count before it reads from below ([`Stripe::miss`]),
//! reads without any lock, then takes the stripe's lock and inserts only
//! if the count has not moved ([`StripeGuard::admits`]). Every removal of
//! a key of the stripe is counted under the lock, before or after the
//! entry leaves the map ([`StripeGuard::count_removal`]).
//!
//! # Why it holds (memory ordering)
//!
//! Let a writer's version `E` of key `k` be removed by `R`. Whoever
//! removes `E` has first seen that `E`'s bytes are below (written home: a
//! clean flag read with Acquire that the write-back stored with Release),
//! so `E`'s write home happens before `R`'s count. The miss of `k` loaded
//! the count with Acquire before its read, and checks it again under the
//! lock before its insert.
//!
//! - If the miss's first load saw `R`'s count (or a later one: counts are
//!   read-modify-writes, which continue the release sequence), that load
//!   synchronises with `R`'s Release increment, so `E`'s write home
//!   happens before the miss's read, which returns `E`'s bytes or newer.
//! - If it did not, then `R`'s critical section either precedes the
//!   miss's check — the lock orders `R`'s increment before the check's
//!   load, the count differs, nothing is inserted and the miss reads again
//!   — or follows it. Then `E` left the map only after the miss's insert:
//!   either `E` was cached when the miss inserted, and the insert (an
//!   insert-if-absent) found it and installed nothing, or `E` came in
//!   later with a replacing insert and displaced what the miss installed.
//!
//! So the load before the read needs Acquire, the increment Release (an
//! RMW, so later increments keep the release sequence), and the load under
//! the lock nothing: the lock orders it after every increment made under
//! the lock before. A miss begun while holding the lock
//! ([`StripeGuard::miss`]) cannot meet a removal at all.
//!
//! Writers install their versions with a replacing insert, never an
//! insert-if-absent: a newer version displaces whatever a miss installed.
//!
//! The count may be bumped earlier than the removal: at the moment an
//! entry becomes removable without a count. The page cache counts when
//! writeback marks a page clean (after its write home); its sweep then
//! removes clean pages uncounted. The argument is the same with `R` the
//! marking: a miss whose check precedes the marking inserts while `E` is
//! still dirty, hence still in the map (dirty pages are never removed).
//!
//! On x86-64 the Acquire load is a plain load and the increment a `lock
//! xadd` either way; on AArch64 an `ldar` and an `ldaddl`. A hit never
//! touches a stripe.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};

/// The lock of a set of cache keys, guarding `X` (what else the cache
/// keeps per stripe: the buffer cache's drafts, a file's dirty set), and
/// the count of removals of those keys.
#[derive(Debug, Default)]
pub struct Stripe<X = ()> {
    lock: parking_lot::Mutex<X>,
    removals: AtomicU64,
}

/// A miss in progress: the stripe's removal count when it began. Checked
/// under the stripe's lock with [`StripeGuard::admits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a miss is checked before its insert"]
pub struct Miss {
    removals: u64,
    /// The stripe it was begun on (compared in debug builds).
    stripe: usize,
}

/// A held stripe lock: the right to remove keys of the stripe, and to
/// insert what a miss read if nothing was removed meanwhile.
#[derive(Debug)]
pub struct StripeGuard<'a, X> {
    stripe: &'a Stripe<X>,
    guard: parking_lot::MutexGuard<'a, X>,
}

impl<X> Stripe<X> {
    /// A stripe guarding `x`, nothing counted yet.
    pub fn new(x: X) -> Self {
        Stripe {
            lock: parking_lot::Mutex::new(x),
            removals: AtomicU64::new(0),
        }
    }

    /// Begin a miss: call before reading from below.
    #[inline]
    pub fn miss(&self) -> Miss {
        Miss {
            // Acquire: pairs with the Release of `count_removal` (module
            // doc, first case), and keeps the read below after it.
            removals: self.removals.load(Ordering::Acquire),
            stripe: self.addr(),
        }
    }

    /// Whether nothing was counted since `m` began, checked without the
    /// lock: for readers that derived more than one value from below (a
    /// file's block map, then a block) and recheck before trusting it.
    /// Only a check under the lock ([`StripeGuard::admits`]) may precede
    /// an insert.
    #[inline]
    pub fn unchanged(&self, m: &Miss) -> bool {
        debug_assert_eq!(m.stripe, self.addr(), "a miss checked on another stripe");
        self.removals.load(Ordering::Acquire) == m.removals
    }

    /// Count an invalidation without taking the lock: misses that check
    /// after it fail, but one checking at the same moment under the lock
    /// may not see it. So it never stands in for [`StripeGuard::count_removal`]:
    /// the page cache uses it where what changes is not an entry but what
    /// readers derive from below (a file's block map replaced), which they
    /// recheck with [`Self::unchanged`], or ahead of a counted removal
    /// under the lock (a hole punched: its pages are dropped next).
    pub fn invalidate(&self) {
        self.removals.fetch_add(1, Ordering::Release);
    }

    /// Take the stripe's lock.
    #[inline]
    pub fn lock(&self) -> StripeGuard<'_, X> {
        StripeGuard {
            stripe: self,
            guard: self.lock.lock(),
        }
    }

    /// Take the stripe's lock if it is free (sweeps, which may run while
    /// their caller holds a stripe of the same cache).
    #[inline]
    pub fn try_lock(&self) -> Option<StripeGuard<'_, X>> {
        Some(StripeGuard {
            stripe: self,
            guard: self.lock.try_lock()?,
        })
    }

    fn addr(&self) -> usize {
        self as *const Self as usize
    }
}

impl<X> StripeGuard<'_, X> {
    /// Whether a miss begun with `m` may insert what it read: no removal
    /// was counted on this stripe since. The caller inserts before it
    /// drops this guard.
    #[inline]
    pub fn admits(&self, m: &Miss) -> bool {
        debug_assert_eq!(m.stripe, self.stripe.addr(), "a miss checked on another stripe");
        // Relaxed: every count made under the lock before we took it is
        // ordered before this load by the lock itself (module doc).
        self.stripe.removals.load(Ordering::Relaxed) == m.removals
    }

    /// Count a removal of a key of this stripe (the entry leaves the map
    /// under this guard, just before or after), or the moment an entry
    /// becomes removable uncounted (module doc).
    #[inline]
    pub fn count_removal(&mut self) {
        // Release: a miss whose Acquire load sees this count also sees
        // the removed version's write home (module doc, first case).
        self.stripe.removals.fetch_add(1, Ordering::Release);
    }

    /// Whether this is a guard of `s`.
    pub(crate) fn is_of(&self, s: &Stripe<X>) -> bool {
        std::ptr::eq(self.stripe, s)
    }

    /// Begin a miss while holding the lock: no removal can come between
    /// its read and its insert, so [`Self::admits`] passes it.
    #[inline]
    pub fn miss(&self) -> Miss {
        Miss {
            removals: self.stripe.removals.load(Ordering::Relaxed),
            stripe: self.stripe.addr(),
        }
    }
}

impl<X> Deref for StripeGuard<'_, X> {
    type Target = X;
    #[inline]
    fn deref(&self) -> &X {
        &self.guard
    }
}

impl<X> DerefMut for StripeGuard<'_, X> {
    #[inline]
    fn deref_mut(&mut self) -> &mut X {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removal_counted_after_a_miss_began_refuses_it() {
        let s = Stripe::new(0u32);
        let m = s.miss();
        assert!(s.lock().admits(&m) && s.unchanged(&m));
        s.lock().count_removal();
        assert!(!s.lock().admits(&m) && !s.unchanged(&m));
        let m2 = s.miss();
        assert!(s.lock().admits(&m2));
        s.invalidate();
        assert!(!s.lock().admits(&m2), "an invalidation counts too");
        let mut g = s.lock();
        let held = g.miss();
        *g += 1;
        assert!(g.admits(&held), "a miss under the lock meets no removal");
        assert_eq!(*g, 1);
    }
}
