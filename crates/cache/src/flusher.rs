//! The background worker of one open filesystem: cache reclaim and
//! metadata checkpoints off the caller's thread — the kernel's kswapd and
//! jbd2 checkpointing, in one thread.
//!
//! Why: once a cache is at its limit, every insert is paid for by an
//! eviction, and once the dirty-metadata set is at its limit, commits pay
//! for a checkpoint. Done inline, that work landed on whichever caller
//! crossed the line: creating a million files in one directory, the clock
//! sweeps, the freeing of what they evicted and the checkpoint writes
//! were ~1.5 µs of a 10 µs create past 200,000 files and nothing at
//! 10,000 — the part of the curve that grew with the directory without
//! being about it.
//!
//! The rule that keeps memory bounded: a cache past its threshold *kicks*
//! the worker and goes on; a cache past its threshold by a further margin
//! (the worker has fallen behind, or there is no second CPU) does the work
//! itself, as the kernel's allocators fall back to direct reclaim. Caches
//! with no worker attached (unit tests, tools that build one cache) always
//! work inline. What the worker runs is given by its owner as a closure,
//! so this module knows nothing of the caches (they sit in both the vfs
//! and the ext4 layer; the closure is built by `vfs`, which sees both).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

/// How a cache asks for background work.
#[derive(Debug, Default)]
pub struct Signal {
    /// Set by the first kick since the worker last started a pass, so that
    /// every later kick (one per insert past the threshold) costs one load
    /// and no lock.
    kicked: AtomicBool,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct State {
    pending: bool,
    stop: bool,
}

impl Signal {
    /// Ask for a pass of the worker (cheap when one is already asked for).
    pub fn kick(&self) {
        if self.kicked.load(Ordering::Relaxed) || self.kicked.swap(true, Ordering::AcqRel) {
            return;
        }
        self.state.lock().pending = true;
        self.cv.notify_one();
    }

    /// Wait for a kick, or `tick` at most; false once the worker must stop.
    fn wait(&self, tick: Option<std::time::Duration>) -> bool {
        let mut s = self.state.lock();
        while !s.pending && !s.stop {
            match tick {
                Some(t) => {
                    if self.cv.wait_for(&mut s, t).timed_out() {
                        break;
                    }
                }
                None => self.cv.wait(&mut s),
            }
        }
        s.pending = false;
        // Cleared before the pass, so a kick during it asks for another.
        self.kicked.store(false, Ordering::Release);
        !s.stop
    }

    fn stop(&self) {
        self.state.lock().stop = true;
        self.cv.notify_one();
    }
}

/// Where a cache finds its worker's signal: empty until the owner spawns
/// one (and for caches that never get one).
pub type Slot = OnceLock<Arc<Signal>>;

/// Kick the worker of `slot` if there is one; false when the caller must
/// do the work itself.
pub fn kick(slot: &Slot) -> bool {
    match slot.get() {
        Some(s) => {
            s.kick();
            true
        }
        None => false,
    }
}

/// When a cache sweeps, and who does it: the state each evicting cache
/// (buffers, inodes, dentries) keeps beside its clock, so that the three
/// follow one rule. A cache over its threshold — its limit, or further
/// after a sweep that could not get below it — kicks the worker; over it
/// by `margin` more, the inserting caller sweeps itself. One sweep at a
/// time, and after one the next waits for a quarter of the limit of new
/// entries (a sweep may visit every entry when most are pinned: its cost
/// per insert stays constant).
#[derive(Debug, Default)]
pub struct Trigger {
    /// Size past which the next sweep runs (at least the limit).
    next: std::sync::atomic::AtomicUsize,
    sweeping: AtomicBool,
    /// The worker of the cache's filesystem, once it has one.
    pub worker: Slot,
}

impl Trigger {
    fn threshold(&self, limit: usize) -> usize {
        limit.max(self.next.load(Ordering::Relaxed))
    }

    /// Whether a cache of `size` (for `limit`) is due a sweep.
    pub fn due(&self, size: usize, limit: usize) -> bool {
        size > self.threshold(limit)
    }

    /// After an insert brought the cache to `size`: kick the worker if a
    /// sweep is due; true when the caller must sweep itself (no worker, or
    /// `margin` past the threshold).
    pub fn sweep_here(&self, size: usize, limit: usize, margin: usize) -> bool {
        let t = self.threshold(limit);
        size > t && (size > t + margin || !kick(&self.worker))
    }

    /// Run `sweep` unless another sweep is running; it returns the cache's
    /// size after it, and the next sweep waits for `limit / 4` more.
    pub fn sweep(&self, limit: usize, sweep: impl FnOnce() -> usize) {
        self.sweep_then(|| sweep() + limit / 4);
    }

    /// [`Self::sweep`] where `sweep` returns the next threshold itself.
    pub fn sweep_then(&self, sweep: impl FnOnce() -> usize) {
        if self.sweeping.swap(true, Ordering::Acquire) {
            return;
        }
        let next = sweep();
        self.next.store(next, Ordering::Relaxed);
        self.sweeping.store(false, Ordering::Release);
    }
}

/// The worker thread; stopping (or dropping) it waits for its current
/// pass to end.
#[derive(Debug)]
pub struct Flusher {
    signal: Arc<Signal>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Start a worker that runs `pass` once per kick (kicks that arrive
    /// during a pass ask for one more pass, not one each).
    pub fn spawn(name: &str, pass: impl FnMut() + Send + 'static) -> std::io::Result<Flusher> {
        Self::spawn_ticking(name, None, pass)
    }

    /// [`Self::spawn`], also running `pass` every `tick` without a kick
    /// (the journal's commit interval is checked that way).
    pub fn spawn_ticking(
        name: &str,
        tick: Option<std::time::Duration>,
        mut pass: impl FnMut() + Send + 'static,
    ) -> std::io::Result<Flusher> {
        let signal = Arc::new(Signal::default());
        let s = signal.clone();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            while s.wait(tick) {
                pass();
            }
        })?;
        Ok(Flusher {
            signal,
            thread: Some(thread),
        })
    }

    /// The signal caches kick.
    pub fn signal(&self) -> &Arc<Signal> {
        &self.signal
    }

    /// Stop the worker and wait for it.
    pub fn stop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.signal.stop();
            // A pass that panicked has already printed its message; the
            // caches it left are still consistent (every pass step is a
            // cache operation any caller thread could have run).
            let _ = t.join();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn kicks_run_passes_and_stop_waits_for_the_thread() {
        let passes = Arc::new(AtomicUsize::new(0));
        let p = passes.clone();
        let mut f = Flusher::spawn("test-flusher", move || {
            p.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        assert_eq!(passes.load(Ordering::SeqCst), 0, "no pass without a kick");
        let slot = Slot::new();
        assert!(!kick(&slot), "no worker attached: the caller works inline");
        slot.set(f.signal().clone()).unwrap();
        assert!(kick(&slot));
        wait_until("the first pass", || passes.load(Ordering::SeqCst) >= 1);
        // A kick after a pass began asks for another pass.
        kick(&slot);
        wait_until("the second pass", || passes.load(Ordering::SeqCst) >= 2);
        f.stop();
        let n = passes.load(Ordering::SeqCst);
        kick(&slot);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(passes.load(Ordering::SeqCst), n, "a stopped worker runs no pass");
    }

    /// A sweep that stops short (entries pinned) moves the threshold a
    /// quarter of the limit past where it stopped; without a worker the
    /// caller sweeps as soon as a sweep is due, with one only past the
    /// margin.
    #[test]
    fn a_short_sweep_moves_the_threshold_and_the_worker_takes_the_rest() {
        let t = Trigger::default();
        assert!(!t.due(100, 100) && t.due(101, 100));
        assert!(t.sweep_here(101, 100, 50), "no worker: the caller sweeps");
        t.sweep(100, || 90);
        assert!(!t.due(101, 100) && !t.due(115, 100) && t.due(116, 100));
        t.worker.set(Arc::new(Signal::default())).unwrap();
        assert!(!t.sweep_here(160, 100, 50), "within the margin: the worker's");
        assert!(t.sweep_here(166, 100, 50), "past the margin: the caller's");
        t.sweep_then(|| 0);
        assert!(t.due(101, 100), "the threshold never drops below the limit");
    }
}
