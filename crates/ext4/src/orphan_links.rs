//! The orphan chain's links in memory (the kernel's `NEXT_ORPHAN`, kept in
//! the in-core inode): each orphan's successor on the chain, so that every
//! record written for an orphan takes its link from here and never a stale
//! one from a cached record (see `orphan.rs` for the chain itself).
//!
//! Locking: the mutex serialises list changes and is held across the block
//! update that writes a link, so a link is never written stale; it is taken
//! before the superblock's update lock and before block locks.

use std::collections::HashMap;

use parking_lot::{Mutex, MutexGuard};

/// Each orphan's successor on the chain (0 ends it). Starts empty: the
/// chain found on disk at open is emptied by recovery before anything is
/// added.
#[derive(Debug, Default)]
pub struct OrphanLinks {
    links: Mutex<HashMap<u32, u32>>,
}

impl OrphanLinks {
    /// Lock the links (see the module doc for the lock order).
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, HashMap<u32, u32>> {
        self.links.lock()
    }
}
