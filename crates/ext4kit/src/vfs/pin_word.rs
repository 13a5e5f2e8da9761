//! A pin's state word (`vfs::pin`): the count of open files on one pin,
//! or "revoked". It is what both sides of an inode's open count touch —
//! the pin's owner taking and dropping opens, the inode's registry of pins
//! (`CachedInode::pins`) revoking idle ones — so it sits below both the
//! inode cache and the pins.
//!
//! Held by the pin and by its inode's registry, so revocation can still
//! swap it while the pin is being dropped; allocated by the pin's thread
//! with the pin, and written only by that thread while the pin is cached
//! (revocation writes it once, on the slow path).

use std::sync::atomic::{AtomicU32, Ordering};

/// The bit of a revoked word: the pin gave its unit of the inode's open
/// count back and takes no more opens.
const REVOKED: u32 = 1 << 31;

/// What [`PinWord::revoke`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Revoke {
    /// The pin was idle and is revoked now: its unit is the caller's to
    /// give back.
    Revoked,
    /// Files are open on it: it stays.
    Busy,
    /// Revoked already (by its drop or an earlier revocation).
    Gone,
}

/// A pin's state word: the open files on it, or revoked.
#[derive(Debug)]
pub(crate) struct PinWord(AtomicU32);

impl PinWord {
    /// The word of a new pin, with its first open taken (so no revocation
    /// can take it before its first file exists).
    pub(crate) fn with_one_open() -> PinWord {
        PinWord(AtomicU32::new(1))
    }

    /// Whether it was revoked.
    pub(crate) fn revoked(&self) -> bool {
        self.0.load(Ordering::Relaxed) & REVOKED != 0
    }

    /// Take one open, unless revoked.
    pub(crate) fn try_acquire(&self) -> bool {
        let mut s = self.0.load(Ordering::Relaxed);
        while s & REVOKED == 0 {
            match self
                .0
                .compare_exchange_weak(s, s + 1, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
        false
    }

    /// Drop one open. SeqCst: ordered before the close's read of the
    /// inode's `unlinked` flag (`vfs::pin`).
    pub(crate) fn release(&self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }

    /// Revoke the pin if it is idle (0 files → revoked, by
    /// compare-and-swap), with `failure` as the ordering of a failed swap.
    pub(crate) fn revoke(&self, failure: Ordering) -> Revoke {
        match self.0.compare_exchange(0, REVOKED, Ordering::SeqCst, failure) {
            Ok(_) => Revoke::Revoked,
            Err(s) if s & REVOKED != 0 => Revoke::Gone,
            Err(_) => Revoke::Busy,
        }
    }

    /// Open files on the pin now (0 when revoked).
    pub(crate) fn open_files(&self) -> u32 {
        self.0.load(Ordering::Relaxed) & !REVOKED
    }
}
