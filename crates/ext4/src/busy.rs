//! Busy extents (the kernel's `ext4_free_data` in mballoc): with a
//! journal, a freed block is not handed out again until the transaction
//! that freed it has committed. Otherwise a crash before that commit would
//! leave the block with its old owner — the free is not in the log yet —
//! *and* the new owner's data, written home meanwhile.
//!
//! This is an allocation rule, not a journal rule: the journal only says
//! which transaction is running and which has committed
//! ([`ext4kit_jbd2::Jbd::running_tid`], [`ext4kit_jbd2::Jbd::committed_tid`]);
//! a run stops being busy once its freeing transaction is committed. The
//! kernel releases them from a commit callback; asking the journal when
//! allocating needs no callback and costs one atomic load.
//!
//! Runs the running transaction allocated itself and frees again are not
//! busy: no committed metadata ever owned them, so they are free for reuse
//! at once (an allocation undone after ENOSPC gives its blocks straight
//! back).
//!
//! Locking: two leaf mutexes, each held for one list operation.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::journal_io::Journal;

/// Freed runs waiting for their transaction to commit.
#[derive(Debug, Default)]
pub struct BusyExtents {
    /// Freed runs `(start, len, tid)` not to allocate until transaction
    /// `tid` commits.
    freed: Mutex<Vec<(u64, u64, u32)>>,
    /// Runs allocated by the running transaction (start → length), and
    /// that transaction's id: once it is no longer running, the runs are
    /// owned by committed metadata and the map is stale.
    allocated: Mutex<(u32, BTreeMap<u64, u64>)>,
}

impl BusyExtents {
    /// Note a run the running transaction allocated (see the module doc).
    /// Called inside the allocating handle.
    pub(crate) fn allocated(&self, jbd: &Journal, start: u64, len: u64) {
        let Some(tid) = jbd.running_tid() else { return };
        if len > 0 {
            let mut a = self.allocated.lock();
            if a.0 != tid {
                *a = (tid, BTreeMap::new());
            }
            a.1.insert(start, len);
        }
    }

    /// Note runs freed by the running transaction: busy until it commits,
    /// except the parts it allocated itself. Called inside the freeing
    /// handle.
    pub(crate) fn freed(&self, jbd: &Journal, runs: &[(u64, u64)]) {
        let Some(tid) = jbd.running_tid() else { return };
        let mut owned: Vec<(u64, u64)> = Vec::new();
        {
            let mut a = self.allocated.lock();
            if a.0 != tid {
                *a = (tid, BTreeMap::new());
            }
            for &(p, n) in runs {
                owned.extend(take_allocated(&mut a.1, p, n));
            }
        }
        let mut busy = self.freed.lock();
        busy.extend(owned.into_iter().map(|(p, n)| (p, n, tid)));
    }

    /// The busy blocks within `start..end`, as runs clipped to it (runs
    /// whose transaction has committed are dropped on the way).
    pub(crate) fn busy_in(&self, jbd: &Journal, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut busy = self.freed.lock();
        release_committed(&mut busy, jbd);
        busy.iter()
            .filter_map(|&(p, n, _)| {
                let (s, e) = (p.max(start), (p + n).min(end));
                (s < e).then(|| (s, e - s))
            })
            .collect()
    }

    /// Whether freed blocks wait for their transaction to commit (an
    /// ENOSPC is then worth a commit and a retry: the kernel's
    /// `ext4_should_retry_alloc`).
    pub fn any(&self, jbd: &Journal) -> bool {
        let mut busy = self.freed.lock();
        release_committed(&mut busy, jbd);
        !busy.is_empty()
    }
}

/// Drop the runs whose freeing transaction has committed.
fn release_committed(busy: &mut Vec<(u64, u64, u32)>, jbd: &Journal) {
    if let Some(c) = jbd.committed_tid() {
        busy.retain(|&(_, _, t)| !ext4kit_jbd2::revoke::tid_geq(c, t));
    }
}

/// Remove `p..p + n` from the allocated runs `alloc`; what of it was not
/// among them (the part committed metadata owned), as runs.
fn take_allocated(alloc: &mut BTreeMap<u64, u64>, p: u64, n: u64) -> Vec<(u64, u64)> {
    let mut rest = vec![(p, p + n)];
    let overlaps: Vec<(u64, u64)> = alloc
        .range(..p + n)
        .rev()
        .take_while(|&(&s, &l)| s + l > p || s >= p)
        .filter(|&(&s, &l)| s < p + n && s + l > p)
        .map(|(&s, &l)| (s, l))
        .collect();
    for (s, l) in overlaps {
        alloc.remove(&s);
        let (cs, ce) = (s.max(p), (s + l).min(p + n));
        if s < cs {
            alloc.insert(s, cs - s);
        }
        if s + l > ce {
            alloc.insert(ce, s + l - ce);
        }
        rest = rest
            .into_iter()
            .flat_map(|(a, b)| {
                let mut v = Vec::new();
                if a < cs.min(b) {
                    v.push((a, cs.min(b)));
                }
                if ce.max(a) < b {
                    v.push((ce.max(a), b));
                }
                v
            })
            .collect();
    }
    rest.into_iter()
        .filter(|(a, b)| a < b)
        .map(|(a, b)| (a, b - a))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balloc::{self, BlockRequest};
    use crate::volume::scratch_volume;

    #[test]
    fn a_free_of_what_the_running_transaction_allocated_is_not_busy() {
        let mut a = BTreeMap::from([(100, 10), (200, 5)]);
        // 95..105 overlaps the first allocated run's head.
        assert_eq!(take_allocated(&mut a, 95, 10), vec![(95, 5)]);
        assert_eq!(a, BTreeMap::from([(105, 5), (200, 5)]));
        // A run spanning both, and the gap between.
        assert_eq!(take_allocated(&mut a, 100, 110), vec![(100, 5), (110, 90), (205, 5)]);
        assert!(a.is_empty());
    }

    #[test]
    fn a_freed_block_is_busy_until_its_transaction_commits_and_its_log_copy_is_revoked() {
        let v = scratch_volume();
        // Allocate a block, log it as metadata, commit: it is live in the log.
        let mut h = v.begin().unwrap();
        let (blk, _) = balloc::new_blocks(&v, &mut h, BlockRequest::near(0, 1)).unwrap();
        h.overwrite(blk, vec![7u8; v.block_size()].into_boxed_slice()).unwrap();
        h.commit().unwrap();
        v.commit_running().unwrap();
        // Free it: busy now, revoked in the running transaction.
        let mut h = v.begin().unwrap();
        balloc::free_blocks(&v, &mut h, blk, 1).unwrap();
        h.commit().unwrap();
        assert!(v.has_busy_blocks());
        let mut h = v.begin().unwrap();
        for _ in 0..64 {
            let (b, n) = balloc::new_blocks(&v, &mut h, BlockRequest::near(blk, 1)).unwrap();
            assert!(!(b..b + n as u64).contains(&blk), "a busy block was handed out again");
        }
        drop(h);
        v.commit_running().unwrap();
        assert!(!v.has_busy_blocks(), "committed: nothing is busy any more");
        let j = crate::journal::open_journal(v.disk().device()).unwrap();
        let plan = ext4kit_jbd2::recover(&j);
        assert!(
            !plan.replay.contains_key(&blk),
            "the freed block's copy is revoked: {plan:?}"
        );
        assert!(plan.nr_revoke_hits >= 1);
    }
}
