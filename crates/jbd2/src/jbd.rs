//! The journal of a filesystem open for writing (the kernel's `journal_t`):
//! handles, the running transaction and its commit to the log, and the
//! checkpoint that writes committed blocks home — or, without a log
//! (ext2, `^has_journal`, a journal that cannot be written), handles whose
//! blocks go straight to the checkpoint set, as the kernel's no-journal
//! ext4 hands out handles that only mark buffers dirty.
//!
//! Every metadata change of the filesystem goes through a [`Handle`] of
//! this: nothing else writes metadata, which is what lets a journal make
//! the changes atomic. The filesystem's side is a [`Buffers`]
//! implementation, passed to every call that may capture, write or flush.
//!
//! Locking, in order: the log (commits and checkpoints, one at a time);
//! the barrier (a commit closing the running transaction, handles in
//! flight); the revoke books (`logged`, `committing`); the running
//! transaction. The checkpoint set's own locks are leaves; its I/O lock is
//! held for a whole checkpoint.

use std::time::Duration;

use ext4kit_format::time::Clock;
use parking_lot::MutexGuard;

use crate::buffers::{Buffer, Buffers};
use crate::checkpoint::{Checkpoint, Versions};
use crate::commit::{commit_interval, Committer, JournalStats};
use crate::log::Log;
use crate::transaction::{Fullness, Handle, Stopped};

/// A filesystem's journal (see the module doc), over block versions `B`.
pub struct Jbd<B: Buffer> {
    checkpoint: Checkpoint<B>,
    /// The log side; none without a journal.
    journal: Option<Committer>,
}

impl<B: Buffer> std::fmt::Debug for Jbd<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jbd")
            .field("journal", &self.journal)
            .field("checkpoint", &self.checkpoint)
            .finish()
    }
}

impl<B: Buffer> Jbd<B> {
    /// No journal: stopped handles' blocks go straight to the checkpoint
    /// set (ext2, `^has_journal`, or a read-only filesystem).
    pub fn unjournaled() -> Self {
        Jbd {
            checkpoint: Checkpoint::default(),
            journal: None,
        }
    }

    /// A journal writing to `log` (see [`Log::start`]), committing the
    /// running transaction once it is `commit_interval` old (the kernel's
    /// `commit=`; `None` or zero: 5 s; never under a fixed clock, a
    /// reproducible build), its commit blocks stamped with `clock`'s time.
    pub fn journaled(log: Log, commit_interval_asked: Option<Duration>, clock: Clock) -> Self {
        Jbd {
            checkpoint: Checkpoint::default(),
            journal: Some(Committer::new(
                log,
                commit_interval(commit_interval_asked, &clock),
                clock,
            )),
        }
    }

    /// Whether there is a log (else handles' blocks go straight home at
    /// checkpoints).
    #[inline]
    pub fn is_journaled(&self) -> bool {
        self.journal.is_some()
    }

    /// Start a handle: a member of the running transaction until
    /// [`Self::stop`] (or its drop).
    #[inline]
    pub fn begin(&self) -> Handle<'_, B> {
        match &self.journal {
            Some(j) => Handle::joining(j.txns()),
            None => Handle::unjournaled(&self.checkpoint),
        }
    }

    /// Stop `h` (`jbd2_journal_stop`): its blocks join the running
    /// transaction — what a commit writes is each block's *current*
    /// version, not the one this handle made: another handle may have
    /// changed the same block since (two allocations in one bitmap), and
    /// a buffer belongs to the running transaction, not to one handle.
    /// Past its limit the background worker commits the transaction;
    /// past twice that, or with no worker, this call does.
    ///
    /// Without a journal the blocks join the checkpoint set, which the
    /// worker writes home over its budget; past half as much again — the
    /// worker is behind — or after the worker failed, this call does, and
    /// returns what it meets.
    pub fn stop<IO: Buffers<Buffer = B>>(&self, h: &mut Handle<'_, B>, io: &IO) -> Result<(), IO::Error> {
        let limit = io.checkpoint_limit();
        match h.hand_over(Some(limit)) {
            Stopped::Transaction(full) => {
                if full == Fullness::Overfull || full == Fullness::Full && !self.checkpoint.kick_worker() {
                    self.commit_running(io)?;
                }
            }
            Stopped::Checkpoint => {
                let cp = &self.checkpoint;
                if cp.len() > limit && (cp.len() > limit + limit / 2 || cp.failed() || !cp.kick_worker()) {
                    let r = self.checkpoint(io);
                    cp.set_failed(r.is_err());
                    r?;
                }
            }
        }
        Ok(())
    }

    /// Commit the running transaction if transaction `tid` (or an earlier
    /// one) has not been committed yet: the group commit behind fsync.
    /// Returns once `tid`'s changes are durable in the log. A no-op
    /// without a journal.
    pub fn commit_upto<IO: Buffers<Buffer = B>>(&self, tid: u32, io: &IO) -> Result<(), IO::Error> {
        match &self.journal {
            Some(j) => j.commit_upto(tid, &self.checkpoint, io),
            None => Ok(()),
        }
    }

    /// Commit whatever the running transaction holds now (waiting for a
    /// commit in flight first: a change may sit in it).
    pub fn commit_running<IO: Buffers<Buffer = B>>(&self, io: &IO) -> Result<(), IO::Error> {
        match &self.journal {
            Some(j) => j.commit_upto(j.txns().running_tid(), &self.checkpoint, io),
            None => Ok(()),
        }
    }

    /// The background worker's commit: the running transaction, if it is
    /// older than the commit interval or past its size limit. A failure is
    /// kept for the next caller to meet (its commit fails the same way).
    pub fn commit_if_due<IO: Buffers<Buffer = B>>(&self, io: &IO) {
        if let Some(j) = &self.journal {
            if j.txns().commit_due() {
                let _ = self.commit_running(io);
            }
        }
    }

    /// Write every committed block home (see `checkpoint.rs`); with a
    /// journal, then flush and empty the log. Without one nothing is
    /// flushed: the caller flushes before it promises durability.
    pub fn checkpoint<IO: Buffers<Buffer = B>>(&self, io: &IO) -> Result<(), IO::Error> {
        match &self.journal {
            Some(j) => j.checkpoint(&self.checkpoint, io),
            None => self.checkpoint.write_home(io, Versions::Current),
        }
    }

    /// The background worker's checkpoint: only over budget. A failure
    /// leaves the blocks dirty and hands the retry, and the error, to the
    /// next stopping handle.
    pub fn checkpoint_if_over<IO: Buffers<Buffer = B>>(&self, io: &IO) {
        if self.checkpoint.len() > io.checkpoint_limit() && self.checkpoint(io).is_err() {
            self.checkpoint.set_failed(true);
        }
    }

    /// Quiesce the journal: commit, write everything home, empty the log,
    /// clear `needs_recovery` at home and flush. After this the filesystem
    /// needs no recovery and is complete on its own; a later handle starts
    /// the log again (setting the flag first). A no-op without a journal.
    pub fn close<IO: Buffers<Buffer = B>>(&self, io: &IO) -> Result<(), IO::Error> {
        match &self.journal {
            Some(j) => j.close(&self.checkpoint, io),
            None => Ok(()),
        }
    }

    /// Blocks `runs` were freed by the running transaction (called inside
    /// the freeing handle): each one with a live copy in the log is
    /// revoked, and until the free commits its committed version stays
    /// the checkpoint's to write — the committed filesystem still owns the
    /// block — then it is dropped, so that no checkpoint writes it over
    /// the block's next owner. Keeping the blocks from reuse until then is
    /// the allocator's business ([`Self::committed_tid`] says when).
    pub fn forget(&self, runs: &[(u64, u64)]) {
        if let Some(j) = &self.journal {
            j.forget(runs);
        }
    }

    /// Abort the journal (`jbd2_journal_abort`) with no handle in hand
    /// (see [`Handle::abort`]).
    pub fn abort(&self) {
        if let Some(j) = &self.journal {
            j.txns().abort();
        }
    }

    /// Whether the journal was aborted (nothing commits or checkpoints).
    pub fn is_aborted(&self) -> bool {
        self.journal.as_ref().is_some_and(|j| j.txns().is_aborted())
    }

    /// Id of the running transaction (stable inside a handle: no commit
    /// can close it meanwhile).
    #[inline]
    pub fn running_tid(&self) -> Option<u32> {
        self.journal.as_ref().map(|j| j.txns().running_tid())
    }

    /// Id of the last committed transaction.
    #[inline]
    pub fn committed_tid(&self) -> Option<u32> {
        self.journal.as_ref().and_then(|j| j.committed_tid())
    }

    /// Whether the running transaction has nothing to commit (always,
    /// without a journal).
    pub fn running_is_empty(&self) -> bool {
        self.journal.as_ref().is_none_or(|j| j.txns().running_is_empty())
    }

    /// The commit interval (none without a journal or under a fixed
    /// clock).
    pub fn commit_interval(&self) -> Option<Duration> {
        self.journal.as_ref().and_then(|j| j.txns().interval())
    }

    /// Whether `needs_recovery` was written home by this journal and not
    /// yet cleared: a sync must then close the journal even if nothing
    /// changed.
    pub fn needs_recovery_on_disk(&self) -> bool {
        self.journal.as_ref().is_some_and(|j| j.needs_recovery_on_disk())
    }

    /// Commit counters (none without a journal).
    pub fn stats(&self) -> Option<&JournalStats> {
        self.journal.as_ref().map(|j| j.stats())
    }

    /// Blocks committed and not yet written home.
    pub fn checkpoint_len(&self) -> usize {
        self.checkpoint.len()
    }

    /// Hold off checkpoints while freed blocks are forgotten (see
    /// [`Checkpoint::hold`]).
    pub fn hold_checkpoint(&self) -> MutexGuard<'_, ()> {
        self.checkpoint.hold()
    }

    /// Attach the background worker that commits and checkpoints: `kick`
    /// wakes it. Without one every commit and checkpoint runs inline.
    pub fn set_worker(&self, kick: Box<dyn Fn() + Send + Sync>) {
        self.checkpoint.set_worker(kick);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::testing::{Mem, MemBuffer};

    /// One handle changing `blocks` (to `v`), stopped.
    fn change(jbd: &Jbd<MemBuffer>, mem: &Mem, blocks: std::ops::Range<u64>, v: u8) {
        for b in blocks {
            let mut h = jbd.begin();
            mem.change(b, v);
            h.note(b);
            jbd.stop(&mut h, mem).unwrap();
        }
    }

    #[test]
    fn without_a_journal_stopped_handles_go_to_the_checkpoint_set() {
        let (jbd, mem) = (Jbd::unjournaled(), Mem::new());
        assert!(!jbd.is_journaled() && jbd.running_tid().is_none());
        change(&jbd, &mem, 3..6, 4);
        assert_eq!(jbd.checkpoint_len(), 3);
        jbd.commit_running(&mem).unwrap(); // nothing to commit
        assert_eq!(mem.home(3)[0], 0, "nothing home before a checkpoint");
        // A newer version made after the stop is what goes home: without a
        // log, the current version is the one to write.
        mem.change(4, 5);
        jbd.checkpoint(&mem).unwrap();
        assert_eq!((mem.home(3)[0], mem.home(4)[0], mem.home(5)[0]), (4, 5, 4));
        assert_eq!(jbd.checkpoint_len(), 0);
    }

    /// Without a journal a handle that stops past the checkpoint budget
    /// kicks the worker; when the worker falls behind (half as much again)
    /// or its last pass failed, the stopping handle checkpoints itself.
    #[test]
    fn handles_checkpoint_themselves_when_the_worker_is_behind() {
        let (jbd, mem) = (Jbd::unjournaled(), Mem::new());
        mem.set_limit(16);
        // A worker that never runs: every kick is left unanswered.
        let kicks = Arc::new(AtomicU64::new(0));
        let k = kicks.clone();
        jbd.set_worker(Box::new(move || {
            k.fetch_add(1, Ordering::Relaxed);
        }));
        change(&jbd, &mem, 1..18, 1);
        assert_eq!(jbd.checkpoint_len(), 17, "over the limit: the worker was asked");
        assert_eq!(kicks.load(Ordering::Relaxed), 1);
        change(&jbd, &mem, 18..32, 1);
        assert!(
            jbd.checkpoint_len() <= 16 + 8 + 1,
            "{} blocks dirty for a limit of 16: handles must checkpoint when the worker falls behind",
            jbd.checkpoint_len()
        );
        // A failed background pass hands the next handle the checkpoint.
        jbd.checkpoint(&mem).unwrap();
        change(&jbd, &mem, 1..18, 2);
        mem.fail_home_writes(true);
        jbd.checkpoint_if_over(&mem);
        assert!(jbd.checkpoint.failed());
        mem.fail_home_writes(false);
        change(&jbd, &mem, 18..19, 2);
        assert!(!jbd.checkpoint.failed());
        assert_eq!(jbd.checkpoint_len(), 0, "the handle past the limit checkpointed");
    }

    /// A handle dropped without `stop` still hands its blocks over; an
    /// aborted one (with a journal) does not.
    #[test]
    fn a_dropped_handle_still_hands_its_blocks_over() {
        let (jbd, mem) = (Jbd::unjournaled(), Mem::new());
        {
            let mut h = jbd.begin();
            mem.change(9, 1);
            h.note(9);
            h.note(9);
            assert_eq!(h.blocks().collect::<Vec<_>>(), vec![9], "each block once");
            // An operation failing here returns without stop.
        }
        assert_eq!(jbd.checkpoint_len(), 1, "the dropped handle's block is queued");
        let mut h = jbd.begin();
        h.note(10);
        assert!(!h.abort(), "nothing to abort without a journal");
        drop(h);
        assert_eq!(jbd.checkpoint_len(), 2, "written as ext2 would");
        jbd.checkpoint(&mem).unwrap();
        assert_eq!(mem.home(9)[0], 1);
    }

    /// A handle begun inside another on the same thread joins without the
    /// barrier: a commit waiting for the outer one would otherwise wait
    /// for itself.
    #[test]
    fn a_nested_handle_does_not_wait_for_a_waiting_commit() {
        let mem = Mem::new();
        crate::testing::format_journal(&**mem.device());
        let log = Log::start(crate::testing::load_journal(mem.device().clone()), crate::testing::WANT).unwrap();
        let jbd = Jbd::journaled(log, None, Clock::System);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let (jbd, mem) = (&jbd, &mem);
            let mut outer = jbd.begin();
            mem.change(5, 1);
            outer.note(5);
            s.spawn(move || {
                tx.send(()).unwrap();
                jbd.commit_running(mem).unwrap();
            });
            rx.recv().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            let mut inner = jbd.begin();
            mem.change(6, 1);
            inner.note(6);
            jbd.stop(&mut inner, mem).unwrap();
            jbd.stop(&mut outer, mem).unwrap();
        });
        jbd.commit_running(&mem).unwrap();
        jbd.checkpoint(&mem).unwrap();
        assert_eq!((mem.home(5)[0], mem.home(6)[0]), (1, 1));
    }
}
