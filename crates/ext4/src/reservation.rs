//! Free-space accounting for delayed allocation: the kernel's
//! `s_freeclusters_counter`, `s_dirtyclusters_counter`,
//! `ext4_has_free_clusters` and `ext4_claim_free_clusters` (balloc.c).
//!
//! Why: with delayed allocation a buffered write only fills pages; blocks
//! are chosen at writeback. Without accounting, write(2) accepts data the
//! filesystem has no room for and the loss is discovered at writeback —
//! at unmount, say — when nobody can be told any more (a full disk would
//! lose everything written since the mount). So each write *reserves* the
//! blocks it will need (data plus the worst case of block-map growth)
//! here, and gets ENOSPC when they are not there; writeback then draws the
//! blocks it allocates from those reservations
//! ([`crate::transaction::Handle`]'s reservation budget) and never has to
//! find room of its own.
//!
//! Counters:
//! - `free`: the sum of the group descriptors' free-block counts, kept in
//!   step by the allocator (`balloc.rs`) under each group's lock, so the
//!   check costs one atomic load instead of a walk over every group;
//! - `dirty`: blocks reserved and not yet allocated (delayed pages' data
//!   and map-growth reservations, and the in-flight reservation of an
//!   ordinary allocation between its check and its bitmap change).
//!
//! The rule (`ext4_has_free_clusters`): a reservation of `n` succeeds when
//! `free >= n + dirty + r_blocks`, where the root reserve `r_blocks`
//! (`s_r_blocks_count`) is waived for root and for `s_def_resuid` /
//! `s_def_resgid` — the caller says whether it is one of them — and for
//! allocations that must not fail for want of the reserve (freeing map
//! nodes, the kernel's `EXT4_MB_USE_RESERVED`).
//!
//! Locking: reservations are serialised by a mutex so that two reservers
//! never both take the last blocks; the counters themselves are atomics
//! that readers (statfs) load freely.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::{Errno, Error, Result};

/// Who a reservation is for, as far as the root reserve is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserver {
    /// An ordinary user: the last `s_r_blocks_count` blocks are not theirs.
    User,
    /// Root, `s_def_resuid`, a member of `s_def_resgid`, or an allocation
    /// that may use the reserve (`EXT4_MB_USE_RESERVED`).
    Privileged,
}

/// The volume's free-block and reservation counters (see the module doc).
#[derive(Debug, Default)]
pub struct Reservations {
    free: AtomicI64,
    dirty: AtomicU64,
    r_blocks: AtomicU64,
    reserving: Mutex<()>,
}

impl Reservations {
    /// Counters for a volume whose groups hold `free` free blocks and
    /// whose root reserve is `r_blocks`.
    pub fn new(free: u64, r_blocks: u64) -> Self {
        Reservations {
            free: AtomicI64::new(free as i64),
            dirty: AtomicU64::new(0),
            r_blocks: AtomicU64::new(r_blocks),
            reserving: Mutex::new(()),
        }
    }

    /// Free blocks in the bitmaps (reserved ones included).
    pub fn free(&self) -> u64 {
        self.free.load(Ordering::Acquire).max(0) as u64
    }

    /// Blocks reserved and not yet allocated.
    pub fn dirty(&self) -> u64 {
        self.dirty.load(Ordering::Acquire)
    }

    /// The root reserve (`s_r_blocks_count`).
    pub fn r_blocks(&self) -> u64 {
        self.r_blocks.load(Ordering::Relaxed)
    }

    /// Free blocks nobody has reserved (`f_bfree` as `ext4_statfs` reports
    /// it: free minus dirty).
    pub fn unreserved(&self) -> u64 {
        self.free().saturating_sub(self.dirty())
    }

    /// How many blocks `who` could reserve now.
    pub fn available(&self, who: Reserver) -> u64 {
        let rsv = match who {
            Reserver::User => self.r_blocks(),
            Reserver::Privileged => 0,
        };
        self.unreserved().saturating_sub(rsv)
    }

    /// Reserve `n` blocks for `who`, or ENOSPC naming what is left
    /// (`ext4_claim_free_clusters`).
    pub fn reserve(&self, n: u64, who: Reserver) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let _g = self.reserving.lock();
        let avail = self.available(who);
        if avail < n {
            return Err(enospc(n, avail, who, self.r_blocks()));
        }
        self.dirty.fetch_add(n, Ordering::AcqRel);
        Ok(())
    }

    /// Reserve as many of `n` blocks as `who` may have, at least one
    /// (ENOSPC when none): an ordinary allocation's partial grant.
    pub fn reserve_up_to(&self, n: u64, who: Reserver) -> Result<u64> {
        let _g = self.reserving.lock();
        let avail = self.available(who);
        if avail == 0 {
            return Err(enospc(n.max(1), 0, who, self.r_blocks()));
        }
        let got = n.min(avail);
        self.dirty.fetch_add(got, Ordering::AcqRel);
        Ok(got)
    }

    /// Add `n` to the reservations without a check: a reservation that
    /// must be kept although its estimate was exceeded (writeback used more
    /// map blocks than reserved and the pages left still need theirs).
    pub fn force_reserve(&self, n: u64) {
        if n != 0 {
            self.dirty.fetch_add(n, Ordering::AcqRel);
        }
    }

    /// Give back `n` reserved blocks (written back, truncated, or an
    /// allocation done). Never below zero: an accounting slip must not
    /// turn into a wrapped counter that refuses every write.
    pub fn release(&self, n: u64) {
        if n == 0 {
            return;
        }
        let mut cur = self.dirty.load(Ordering::Acquire);
        loop {
            let new = cur.saturating_sub(n);
            match self
                .dirty
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(c) => cur = c,
            }
        }
    }

    /// The bitmaps lost (`delta < 0`) or gained free blocks; called by
    /// the allocator under the group lock that changed them.
    pub fn free_changed(&self, delta: i64) {
        self.free.fetch_add(delta, Ordering::AcqRel);
    }
}

fn enospc(want: u64, avail: u64, who: Reserver, r_blocks: u64) -> Error {
    let why = match who {
        Reserver::User if r_blocks > 0 => format!(
            "no room for {want} more block(s): {avail} free outside the {r_blocks} reserved for root and the blocks \
             already promised to data not yet written"
        ),
        _ => format!(
            "no room for {want} more block(s): {avail} free that are not already promised to data not yet written"
        ),
    };
    Error::posix(Errno::ENOSPC, why)
}

/// Worst-case block-map blocks that mapping `n` new extents may allocate,
/// for a map whose nodes hold `per_node` entries (`ext4_ext_calc_metadata_amount`
/// in the spirit of the old kernel's per-inode metadata reservation).
///
/// Split nodes are half full, so each level needs `n / (per_node / 2)`
/// new nodes (rounded up), up to a single node; two more cover the tree
/// growing a level (`ext4_ext_grow_indepth`) and the first split of a full
/// node on the insertion path.
pub fn worst_map_blocks(per_node: u64, n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let half = (per_node / 2).max(1);
    let mut total = 0;
    let mut level = n;
    loop {
        level = level.div_ceil(half);
        total += level;
        if level <= 1 {
            break;
        }
    }
    total + 2
}

/// Worst-case map blocks for `n` new extents (or indirect pointers) in
/// the block map of `inode` on a filesystem of `block_size`-byte blocks:
/// what a buffered write reserves besides its data blocks, so that
/// writeback finds room for the map too.
pub fn worst_map_growth(block_size: usize, inode: &ext4kit_format::inode::Inode, n: u64) -> u64 {
    let bs = block_size as u64;
    if inode.uses_extents() {
        // ext4_extent_header + 12-byte entries.
        worst_map_blocks((bs - 12) / 12, n)
    } else {
        // Indirect blocks are never split: full nodes of bs/4 pointers,
        // and one more for the double/triple indirect block a range
        // can cross into.
        worst_map_blocks(bs / 2, n) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_respect_dirty_and_the_root_reserve() {
        let s = Reservations::new(100, 10);
        s.reserve(80, Reserver::User).unwrap();
        assert_eq!(s.unreserved(), 20);
        let e = s.reserve(11, Reserver::User).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOSPC);
        assert!(e.to_string().contains("10 reserved for root"), "{e}");
        s.reserve(10, Reserver::User).unwrap();
        // Root may take the reserve, and nothing beyond.
        s.reserve(10, Reserver::Privileged).unwrap();
        assert!(s.reserve(1, Reserver::Privileged).is_err());
        // An allocation of reserved blocks: free and dirty drop together.
        s.free_changed(-50);
        s.release(50);
        assert_eq!((s.free(), s.dirty()), (50, 50));
        s.release(1000);
        assert_eq!(s.dirty(), 0, "never below zero");
        assert_eq!(s.reserve_up_to(80, Reserver::User).unwrap(), 40);
    }

    #[test]
    fn worst_map_blocks_grows_with_the_extents() {
        assert_eq!(worst_map_blocks(84, 0), 0);
        assert_eq!(worst_map_blocks(84, 1), 3);
        // 1000 extents, half-full leaves of 42: 24 leaves, 1 index, +2.
        assert_eq!(worst_map_blocks(84, 1000), 24 + 1 + 2);
    }
}
