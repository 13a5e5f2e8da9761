//! Free-space accounting for delayed allocation: the kernel's
//! `s_freeclusters_counter`, `s_dirtyclusters_counter`,
//! `ext4_has_free_clusters` and `ext4_claim_free_clusters` (balloc.c).
//!
//! Why: with delayed allocation a buffered write only fills pages; blocks
//! are chosen at writeback. Without accounting, write(2) accepts data the
//! filesystem has no room for and the loss is discovered at writeback —
//! at unmount, say — when nobody can be told any more (issue 19: a full
//! disk lost everything written since the mount). So each write *claims*
//! the blocks it will need (data plus the worst case of block-map growth)
//! here, and gets ENOSPC when they are not there; writeback then draws the
//! blocks it allocates from those claims ([`crate::transaction::Handle`]'s
//! reservation budget) and never has to find room of its own.
//!
//! Counters:
//! - `free`: the sum of the group descriptors' free-block counts, kept in
//!   step by the allocator (`balloc.rs`) under each group's lock, so the
//!   check costs one atomic load instead of a walk over every group;
//! - `dirty`: blocks claimed and not yet allocated (delayed pages' data
//!   and map-growth reservations, and the in-flight claim of an ordinary
//!   allocation between its check and its bitmap change).
//!
//! The rule (`ext4_has_free_clusters`): a claim of `n` succeeds when
//! `free >= n + dirty + r_blocks`, where the root reserve `r_blocks`
//! (`s_r_blocks_count`) is waived for root and for `s_def_resuid` /
//! `s_def_resgid` — the caller says whether it is one of them — and for
//! allocations that must not fail for want of the reserve (freeing map
//! nodes, the kernel's `EXT4_MB_USE_RESERVED`). Claims are serialised by a
//! mutex so that two claimers never both take the last blocks; the
//! counters themselves are atomics that readers (statfs) load freely.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::{Errno, Error, Result};

/// Who a claim is for, as far as the root reserve is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimant {
    /// An ordinary user: the last `s_r_blocks_count` blocks are not theirs.
    User,
    /// Root, `s_def_resuid`, a member of `s_def_resgid`, or an allocation
    /// that may use the reserve (`EXT4_MB_USE_RESERVED`).
    Reserved,
}

/// The volume's free-block and reservation counters (see the module doc).
#[derive(Debug, Default)]
pub struct Space {
    free: AtomicI64,
    dirty: AtomicU64,
    r_blocks: AtomicU64,
    claim: Mutex<()>,
}

impl Space {
    /// Counters for a volume whose groups hold `free` free blocks and
    /// whose root reserve is `r_blocks`.
    pub fn new(free: u64, r_blocks: u64) -> Self {
        Space {
            free: AtomicI64::new(free as i64),
            dirty: AtomicU64::new(0),
            r_blocks: AtomicU64::new(r_blocks),
            claim: Mutex::new(()),
        }
    }

    /// Free blocks in the bitmaps (claimed ones included).
    pub fn free(&self) -> u64 {
        self.free.load(Ordering::Acquire).max(0) as u64
    }

    /// Blocks claimed and not yet allocated.
    pub fn dirty(&self) -> u64 {
        self.dirty.load(Ordering::Acquire)
    }

    /// The root reserve (`s_r_blocks_count`).
    pub fn r_blocks(&self) -> u64 {
        self.r_blocks.load(Ordering::Relaxed)
    }

    /// Free blocks nobody has claimed (`f_bfree` as `ext4_statfs` reports
    /// it: free minus dirty).
    pub fn unclaimed(&self) -> u64 {
        self.free().saturating_sub(self.dirty())
    }

    /// How many blocks `who` could claim now.
    pub fn available(&self, who: Claimant) -> u64 {
        let rsv = match who {
            Claimant::User => self.r_blocks(),
            Claimant::Reserved => 0,
        };
        self.unclaimed().saturating_sub(rsv)
    }

    /// Claim `n` blocks for `who`, or ENOSPC naming what is left
    /// (`ext4_claim_free_clusters`).
    pub fn claim(&self, n: u64, who: Claimant) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let _g = self.claim.lock();
        let avail = self.available(who);
        if avail < n {
            return Err(enospc(n, avail, who, self.r_blocks()));
        }
        self.dirty.fetch_add(n, Ordering::AcqRel);
        Ok(())
    }

    /// Claim as many of `n` blocks as `who` may have, at least one
    /// (ENOSPC when none): an ordinary allocation's partial grant.
    pub fn claim_up_to(&self, n: u64, who: Claimant) -> Result<u64> {
        let _g = self.claim.lock();
        let avail = self.available(who);
        if avail == 0 {
            return Err(enospc(n.max(1), 0, who, self.r_blocks()));
        }
        let got = n.min(avail);
        self.dirty.fetch_add(got, Ordering::AcqRel);
        Ok(got)
    }

    /// Add `n` to the claims without a check: a reservation that must be
    /// kept although its estimate was exceeded (writeback used more map
    /// blocks than reserved and the pages left still need theirs).
    pub fn force_claim(&self, n: u64) {
        if n != 0 {
            self.dirty.fetch_add(n, Ordering::AcqRel);
        }
    }

    /// Give back `n` claimed blocks (written back, truncated, or an
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

fn enospc(want: u64, avail: u64, who: Claimant, r_blocks: u64) -> Error {
    let why = match who {
        Claimant::User if r_blocks > 0 => format!(
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

impl crate::volume::Volume {
    /// Worst-case map blocks for `n` new extents (or indirect pointers) in
    /// the block map of `inode`: what a buffered write claims besides its
    /// data blocks, so that writeback finds room for the map too.
    pub fn worst_map_growth(&self, inode: &ext4kit_format::inode::Inode, n: u64) -> u64 {
        let bs = self.block_size() as u64;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_respect_dirty_and_the_root_reserve() {
        let s = Space::new(100, 10);
        s.claim(80, Claimant::User).unwrap();
        assert_eq!(s.unclaimed(), 20);
        let e = s.claim(11, Claimant::User).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOSPC);
        assert!(e.to_string().contains("10 reserved for root"), "{e}");
        s.claim(10, Claimant::User).unwrap();
        // Root may take the reserve, and nothing beyond.
        s.claim(10, Claimant::Reserved).unwrap();
        assert!(s.claim(1, Claimant::Reserved).is_err());
        // An allocation of claimed blocks: free and dirty drop together.
        s.free_changed(-50);
        s.release(50);
        assert_eq!((s.free(), s.dirty()), (50, 50));
        s.release(1000);
        assert_eq!(s.dirty(), 0, "never below zero");
        assert_eq!(s.claim_up_to(80, Claimant::User).unwrap(), 40);
    }

    #[test]
    fn worst_map_blocks_grows_with_the_extents() {
        assert_eq!(worst_map_blocks(84, 0), 0);
        assert_eq!(worst_map_blocks(84, 1), 3);
        // 1000 extents, half-full leaves of 42: 24 leaves, 1 index, +2.
        assert_eq!(worst_map_blocks(84, 1000), 24 + 1 + 2);
    }

    /// Ordinary allocations see the claims; a handle given claimed blocks
    /// (writeback) draws from them without a check; the free counter stays
    /// the sum of the group descriptors.
    #[test]
    fn allocations_respect_claims_and_draw_from_the_handle() {
        let v = crate::volume::scratch_volume();
        let groups = |v: &crate::volume::Volume| -> u64 {
            v.groups.iter().map(|g| g.desc.read().free_blocks_count() as u64).sum()
        };
        let free = v.space.free();
        assert_eq!(free, groups(&v));
        let avail = v.space.available(Claimant::User);
        v.space.claim(avail, Claimant::User).unwrap();
        let mut h = v.begin().unwrap();
        let e = v.alloc_blocks(&mut h, 0, 1).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOSPC, "{e}");
        h.add_reserved(10);
        let (p, n) = v.alloc_blocks(&mut h, 0, 4).unwrap();
        assert!((1..=4).contains(&n));
        assert_eq!(h.reserved_left(), 10 - n as u64);
        assert_eq!(v.space.dirty(), avail - n as u64, "the blocks drawn left the claims");
        assert_eq!(v.space.free(), free - n as u64);
        assert_eq!(v.space.free(), groups(&v));
        v.free_blocks(&mut h, p, n).unwrap();
        assert_eq!(v.space.free(), groups(&v));
        h.commit().unwrap();
    }
}
