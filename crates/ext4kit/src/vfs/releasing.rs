//! Frees of unlinked inodes in flight, so `statfs` can wait for them.
//!
//! On the kernel's ext4 the blocks of a removed file are free when
//! `unlink(2)` returns (its last `iput` evicts it in the syscall). Over
//! FUSE the kernel keeps the inode until it sends FORGET, which it queues
//! ahead of later requests (`fuse_dev_do_read` reads pending forgets
//! first) but which a multi-threaded server may still be working on when
//! another thread answers the STATFS that `df` sends next: freeing a
//! 230 MiB file with dirty pages took about 280 ms (a server traced with
//! strace, which slows it), and `df` right after `rm; sync` showed the
//! disk still full (xfstests generic/015). `statfs` therefore waits until
//! no free is in flight.
//!
//! The wait is bounded ([`WAIT_CAP`]): under a stream of overlapping
//! frees the count need never reach zero, and a `statfs` that is late by
//! one free is better than one that never returns.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest a `statfs` waits for frees in flight.
const WAIT_CAP: Duration = Duration::from_secs(2);

/// The count of frees in flight and the condition `statfs` waits on.
#[derive(Debug, Default)]
pub(crate) struct Releasing {
    busy: AtomicUsize,
    lock: Mutex<()>,
    idle: Condvar,
}

/// One free in flight; the count goes down when it drops.
pub(crate) struct Release<'a>(&'a Releasing);

impl Releasing {
    /// Count a free (or a dropped hold that may free) until the guard
    /// drops: one add to a shared word, taken only by frees and by
    /// FORGETs of unlinked inodes.
    pub(crate) fn enter(&self) -> Release<'_> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Release(self)
    }

    /// Wait until no free is in flight, or [`WAIT_CAP`].
    pub(crate) fn wait_idle(&self) {
        if self.busy.load(Ordering::SeqCst) == 0 {
            return;
        }
        let end = Instant::now() + WAIT_CAP;
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        // Checked under the lock: the last leaver takes the lock before
        // notifying, so a count that reaches zero after this check
        // notifies a waiter already parked in `wait_timeout`.
        while self.busy.load(Ordering::SeqCst) != 0 {
            let now = Instant::now();
            if now >= end {
                return;
            }
            g = match self.idle.wait_timeout(g, end - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            let _g = self.0.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.0.idle.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_wait_returns_at_once_when_nothing_is_in_flight() {
        let r = Releasing::default();
        let t = Instant::now();
        r.wait_idle();
        assert!(t.elapsed() < Duration::from_millis(100));
    }

    #[test]
    fn a_wait_ends_when_the_last_free_ends() {
        let r = Arc::new(Releasing::default());
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let g = r.enter();
        let waiter = {
            let (r, done) = (r.clone(), done.clone());
            std::thread::spawn(move || {
                r.wait_idle();
                done.load(Ordering::SeqCst)
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        let nested = r.enter();
        drop(g);
        std::thread::sleep(Duration::from_millis(20));
        done.store(true, Ordering::SeqCst);
        drop(nested);
        assert!(waiter.join().unwrap(), "the wait returned before the last free ended");
    }

    #[test]
    fn a_wait_is_capped_when_frees_never_stop() {
        let r = Releasing::default();
        let _g = r.enter();
        let t = Instant::now();
        r.wait_idle();
        let waited = t.elapsed();
        assert!(waited >= WAIT_CAP && waited < WAIT_CAP * 3, "waited {waited:?}");
    }
}
