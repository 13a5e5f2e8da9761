//! The revoke table of recovery (fs/jbd2/revoke.c, recovery side).
//!
//! A revoke record says: the copies of this filesystem block logged in
//! this transaction or earlier must not be replayed (the block was freed
//! and may since hold someone else's data, which is not journaled in
//! ordered mode). The table keeps, per block, the newest transaction that
//! revoked it; a logged copy from transaction `t` is skipped when that
//! newest revoke is at `t` or later. Transaction ids wrap, so "later" is
//! jbd2's `tid_gt`.

use std::collections::HashMap;

/// `tid_gt(x, y)`: x is after y, modulo 2^32.
pub fn tid_gt(x: u32, y: u32) -> bool {
    (x.wrapping_sub(y) as i32) > 0
}

/// `tid_geq(x, y)`.
pub fn tid_geq(x: u32, y: u32) -> bool {
    (x.wrapping_sub(y) as i32) >= 0
}

/// Revoked blocks and the newest transaction that revoked each.
#[derive(Debug, Default)]
pub struct RevokeTable {
    newest: HashMap<u64, u32>,
}

impl RevokeTable {
    /// `jbd2_journal_set_revoke`: block `blk` is revoked by transaction
    /// `tid`; of several revokes the newest counts.
    pub fn set(&mut self, blk: u64, tid: u32) {
        self.newest
            .entry(blk)
            .and_modify(|t| {
                if tid_gt(tid, *t) {
                    *t = tid
                }
            })
            .or_insert(tid);
    }

    /// `jbd2_journal_test_revoke`: whether a copy of `blk` logged in
    /// transaction `tid` is revoked.
    pub fn test(&self, blk: u64, tid: u32) -> bool {
        match self.newest.get(&blk) {
            Some(&t) => !tid_gt(tid, t),
            None => false,
        }
    }

    /// How many distinct blocks are revoked.
    pub fn len(&self) -> usize {
        self.newest.len()
    }

    /// Whether nothing is revoked.
    pub fn is_empty(&self) -> bool {
        self.newest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoke_hides_its_own_and_older_copies_only() {
        let mut r = RevokeTable::default();
        r.set(100, 5);
        r.set(100, 3);
        assert!(r.test(100, 5));
        assert!(r.test(100, 4));
        assert!(!r.test(100, 6));
        assert!(!r.test(101, 1));
        // Across the wrap of transaction ids.
        r.set(7, u32::MAX);
        assert!(r.test(7, u32::MAX - 1));
        assert!(!r.test(7, 0));
        r.set(7, 1);
        assert!(r.test(7, 0));
        assert_eq!(r.len(), 2);
    }
}
