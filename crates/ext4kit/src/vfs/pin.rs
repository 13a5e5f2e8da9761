//! Open-file references that write no shared cache line.
//!
//! An open file keeps its inode (and the dentry it was opened through) in
//! memory, and an unlinked inode must not be freed while it is open. The
//! direct way — an `Arc` clone of the cached inode and of the dentry and an
//! increment of the inode's open count per open, the reverse per close — is
//! six read-modify-writes of lines that every opener of that file writes:
//! with N threads opening one file they bounce between cores on every open.
//! That is the kernel's `d_lock` / `d_count` traffic; the kernel's
//! lockref makes it one cmpxchg per get or put, still a shared write.
//!
//! Here an open file holds an [`OpenRef`] on a [`Pin`]: a per-thread
//! handle on one (inode, dentry) pair, cached by the thread that made it
//! (a few slots per thread, `SLOTS`). The pin holds the `Arc`s and one
//! unit of the inode's open count (`CachedInode::opens`) for as long as it
//! lives, and counts the open files on it in its own word (`state`), in
//! memory its thread allocated. So once a thread has opened a file, its
//! next opens and closes of it write only that word and the thread's own
//! cache: no shared line (the `percpu_ref` idea, per thread rather than
//! per CPU, with the pin found by the identity of the cached objects).
//!
//! The price is that `opens` overcounts: an idle pin (no file on it) still
//! holds its unit. Where the count must be exact — deciding whether an
//! unlinked inode is freed now or kept on the orphan list (`drop_link`),
//! and freeing it at the last close (`release_unlinked`) — the idle pins
//! are *revoked* first (`revoke_idle`, the slow path, under the inode's
//! `disk` write lock): each registered pin's word goes from 0 files to
//! `REVOKED` by compare-and-swap and gives its unit back. A pin's owner
//! takes an open by compare-and-swap on the same word (count + 1, unless
//! revoked), so for every pin exactly one of the two wins: either the
//! revocation sees the open (and the inode stays), or the open sees the
//! revocation and takes the slow path, which makes a new pin under the
//! inode's `disk` reader lock and finds no inode if it was freed meanwhile
//! (the argument of `evict::hold_inode`). The word lives in its own
//! allocation (`PinWord`, `vfs::pin_word`) which the inode's registry holds strongly, so
//! a revocation reaches a pin that is being dropped too; the drop gives
//! its unit back under the reader lock (compare-and-swap on the same word
//! first), so the write side counts either before it or after it, never
//! between its swap and its decrement.
//!
//! A pin's count says the inode is *alive*, not that it is the inode the
//! name the walk went through names: numbers are reused at once. What
//! makes an open by path open the right inode is the check after the
//! count that the walk's dentry is still cached (`open::open_walked`).
//!
//! The last close of an unlinked file: `drop_link` sets
//! `CachedInode::unlinked` before it revokes; a close drops its open
//! (SeqCst) and then reads the flag (SeqCst). Either the revocation comes
//! after the close's decrement and takes the pin's unit, or the close sees
//! the flag and calls `release_unlinked`, which revokes and frees.
//!
//! A pin's drop frees nothing itself (it has no `Fs`): it never needs to,
//! because an idle pin on an unlinked inode does not outlive the close
//! that made it idle — that close saw the flag and revoked it. So a drop
//! (a slot reused, a thread exiting, the last close of an uncached pin)
//! only gives an unrevoked unit back. It takes the inode's reader lock:
//! nothing may drop a pin, nor the last open file of one, while holding
//! that inode's `disk` lock.
//!
//! Memory: a pin keeps its inode and dentry from eviction (the caches skip
//! entries with other holders), so each thread keeps at most `SLOTS` of
//! them beyond its open files; a thread's pins go when it exits.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::dcache::Dentry;
use super::icache::CachedInode;
use super::pin_word::{PinWord, Revoke};

/// Pins cached per thread. Eight: the open-storm benchmark opens four files per
/// thread; a lookup scans the slots at two pointer compares each (not
/// measured on its own: the whole reopen is inside the storm's ~170 ns per
/// open/read/close). A thread cycling through more files than this takes
/// the slow path (shared writes) on every open.
const SLOTS: usize = 8;

/// A thread's handle on one (inode, dentry) pair: see the module doc.
#[derive(Debug)]
pub struct Pin {
    inode: Arc<CachedInode>,
    dentry: Option<Arc<Dentry>>,
    state: Arc<PinWord>,
}

impl Pin {
    /// The inode.
    pub(crate) fn inode(&self) -> &Arc<CachedInode> {
        &self.inode
    }

    /// A new pin with one open taken (so no revocation can take it before
    /// its first file exists), registered with the inode. Takes one unit of
    /// the inode's open count under its reader lock: `drop_link` and
    /// `release_unlinked` revoke and count under the writer side, so either
    /// they see this unit, or this sees the inode freed (mode 0): `None`.
    fn new(inode: &Arc<CachedInode>, dentry: Option<&Arc<Dentry>>) -> Option<Arc<Pin>> {
        let rec = inode.disk.read();
        if rec.base.mode == 0 {
            return None;
        }
        inode.opens.fetch_add(1, Ordering::AcqRel);
        let state = Arc::new(PinWord::with_one_open());
        let pin = Arc::new(Pin {
            inode: inode.clone(),
            dentry: dentry.cloned(),
            state: state.clone(),
        });
        {
            let mut reg = inode.pins.lock();
            // Revoked words are done with (a revoked pin takes no open
            // again, a dropped one revoked its own): this bounds the
            // registry by the live pins.
            reg.retain(|w| !w.revoked());
            reg.push(state);
        }
        drop(rec);
        // Reader lock (2), the unit (1, and 1 at the pin's end), the two
        // `Arc`s (2 each), the registry lock (2); the pin's end takes the
        // reader lock again (2).
        super::shared::note(12);
        Some(pin)
    }

    /// Take one open, unless revoked.
    fn try_acquire(&self) -> bool {
        self.state.try_acquire()
    }
}

impl Drop for Pin {
    /// No file and no cache holds the pin any more (every [`OpenRef`]
    /// holds it, so its word is 0 or revoked): its unit goes back,
    /// unless a revocation took it already.
    ///
    /// Revoked here, by the same compare-and-swap a revocation makes, and
    /// under the inode's reader lock: `drop_link` and `release_unlinked`
    /// revoke and then count `opens` under the writer side, so they run
    /// wholly before this (and take the unit themselves, the swap here
    /// failing) or wholly after (and count without it). Before the
    /// registry held the word strongly, a revocation that met a pin whose
    /// last `Arc` was gone but whose drop had not yet given its unit back
    /// skipped it, counted the unit, and put the inode on the orphan list
    /// with nobody left to free it.
    fn drop(&mut self) {
        if self.state.revoked() {
            return;
        }
        let _rec = self.inode.disk.read();
        if self.state.revoke(Ordering::Relaxed) == Revoke::Revoked {
            self.inode.opens.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// One open of an inode: what an open file holds. Dereferences to the
/// inode; dropping it is the close.
#[derive(Debug)]
pub struct OpenRef(Arc<Pin>);

impl OpenRef {
    /// The pin this open is on.
    pub(crate) fn pin(&self) -> &Arc<Pin> {
        &self.0
    }

    /// The dentry the file was opened through (`None`: opened by number).
    pub fn dentry(&self) -> Option<&Arc<Dentry>> {
        self.0.dentry.as_ref()
    }
}

impl std::ops::Deref for OpenRef {
    type Target = Arc<CachedInode>;
    fn deref(&self) -> &Arc<CachedInode> {
        &self.0.inode
    }
}

impl Drop for OpenRef {
    fn drop(&mut self) {
        // SeqCst: ordered before the close's read of `unlinked` (module doc).
        self.0.state.release();
    }
}

struct Slots {
    pins: Vec<Arc<Pin>>,
    next: usize,
}

thread_local! {
    static CACHE: RefCell<Slots> = const { RefCell::new(Slots { pins: Vec::new(), next: 0 }) };
}

fn dentry_ptr(d: Option<&Arc<Dentry>>) -> *const Dentry {
    d.map_or(std::ptr::null(), Arc::as_ptr)
}

/// An open through the calling thread's cached pin for the inode at
/// `inode` and the dentry at `dentry` (null: none), if it has one that is
/// not revoked. Writes nothing shared.
///
/// Comparing addresses is sound: a cached pin holds both objects, so no
/// other object can have taken either address while it is cached. The
/// caller got `inode` from the inode cache and `dentry` from the dentry
/// cache just now, so a pin that matches is on the objects those caches
/// hold today (not on an inode freed and forgotten since).
pub(crate) fn reopen(inode: *const CachedInode, dentry: *const Dentry) -> Option<OpenRef> {
    CACHE
        .try_with(|c| {
            let c = c.borrow();
            let p = c
                .pins
                .iter()
                .find(|p| Arc::as_ptr(&p.inode) == inode && dentry_ptr(p.dentry.as_ref()) == dentry)?;
            p.try_acquire().then(|| OpenRef(p.clone()))
        })
        .ok()
        .flatten()
}

/// One open of `inode` through `dentry`: the calling thread's cached pin
/// when it has one, else a new pin (the slow path: shared writes), cached
/// in place of the oldest. `None`: the inode was freed. (Alive is all this
/// says: an open by path checks its dentry afterwards, `Fs::open_walked`.)
pub(crate) fn open(inode: &Arc<CachedInode>, dentry: Option<&Arc<Dentry>>) -> Option<OpenRef> {
    if let Some(r) = reopen(Arc::as_ptr(inode), dentry_ptr(dentry)) {
        return Some(r);
    }
    let pin = Pin::new(inode, dentry)?;
    let old = CACHE
        .try_with(|c| {
            let mut c = c.borrow_mut();
            // A revoked or stale pin for the same pair goes first.
            let same = c
                .pins
                .iter()
                .position(|p| Arc::ptr_eq(&p.inode, inode) && dentry_ptr(p.dentry.as_ref()) == dentry_ptr(dentry));
            match same {
                Some(i) => Some(std::mem::replace(&mut c.pins[i], pin.clone())),
                None if c.pins.len() < SLOTS => {
                    c.pins.push(pin.clone());
                    None
                }
                None => {
                    let i = c.next % SLOTS;
                    c.next = c.next.wrapping_add(1);
                    Some(std::mem::replace(&mut c.pins[i], pin.clone()))
                }
            }
        })
        .ok()
        .flatten();
    // Dropped outside the borrow: a pin's drop takes its inode's reader
    // lock, and may free the inode's memory.
    drop(old);
    Some(OpenRef(pin))
}

/// Take `pin` out of the calling thread's cache (if it is there): an open
/// whose dentry turned out stale (`Fs::open_walked`) — no walk will find
/// that dentry again, and the pin's unit must not keep the inode (perhaps
/// its number's next owner) counted meanwhile.
pub(crate) fn uncache(pin: &Arc<Pin>) {
    let old = CACHE
        .try_with(|c| {
            let mut c = c.borrow_mut();
            let i = c.pins.iter().position(|p| Arc::ptr_eq(p, pin))?;
            Some(c.pins.swap_remove(i))
        })
        .ok()
        .flatten();
    drop(old);
}

/// Give back the units of `inode`'s idle pins (module doc), so that
/// `opens` counts only open files and holds. Callers hold the inode's
/// `disk` write lock.
pub(crate) fn revoke_idle(inode: &CachedInode) {
    let mut reg = inode.pins.lock();
    // SeqCst on failure too: a failed swap (the pin is busy) must come
    // before that open's close in the one order of SeqCst operations, so
    // that the close, reading `unlinked` after its decrement, sees the
    // flag `drop_link` set before revoking (module doc).
    reg.retain(|w| match w.revoke(Ordering::SeqCst) {
        Revoke::Revoked => {
            inode.opens.fetch_sub(1, Ordering::AcqRel);
            false
        }
        Revoke::Busy => true,
        Revoke::Gone => false,
    });
}

/// Open files on `inode` now, summed over its pins (a snapshot: for tests
/// and diagnostics).
pub fn open_files(inode: &CachedInode) -> u32 {
    inode.pins.lock().iter().map(|w| w.open_files()).sum()
}

/// Drop the calling thread's cached pins (their units go back). For tests
/// that count units, and for a thread about to idle for long.
pub fn drop_cached() {
    let pins = CACHE
        .try_with(|c| std::mem::take(&mut c.borrow_mut().pins))
        .unwrap_or_default();
    drop(pins);
}
