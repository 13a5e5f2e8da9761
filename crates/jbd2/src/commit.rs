//! Committing the running transaction to the log (fs/jbd2/commit.c) and
//! emptying the log once its transactions are home (checkpoint.c's
//! `jbd2_cleanup_journal_tail`).
//!
//! A commit closes the running transaction (`transaction.rs`) and writes
//! it to the log ([`Log::commit`]): the blocks' contents as of the close,
//! then a commit block, with the flushes that make it atomic. Only then do
//! the blocks join the checkpoint set (`checkpoint.rs`), which writes them
//! home — the *committed* version of each, never a newer one a running
//! handle may have half made — and after which the log is emptied. So at
//! every moment the disk holds, for every metadata block, either its home
//! version or a committed copy in the log that replay puts home.
//!
//! The phases of [`Committer::commit_locked`], as
//! `jbd2_journal_commit_transaction` reads:
//!
//! 1. **lock the transaction** ([`Committer::lock_transaction`]): close it
//!    to new handles, wait for those in flight, capture each block's
//!    current version (its draft published: an `Arc` clone, no copy) and
//!    decide its revokes;
//! 2. **make room**: a checkpoint when the log or the memory budget is
//!    short, and `needs_recovery` home before an empty log takes anything;
//! 3. **write** revoke records, descriptors with the copies their tags
//!    name, flush, the commit block, flush ([`Log::commit`]);
//! 4. **release** ([`Committer::release`]): the blocks are in the log —
//!    revoke them when freed, theirs to checkpoint — and the frees the
//!    transaction made drop the old versions they orphaned.
//!
//! **When**: `fsync`, `fdatasync` and `sync` commit the running
//! transaction (concurrent callers share one commit: group commit — each
//! waits for the id it needs, and a commit covers every handle stopped
//! before it); the background worker commits one older than the commit
//! interval or past its size limit; a stopping handle commits one past
//! twice its limit (the worker is behind).
//!
//! **needs_recovery**: set in the filesystem's superblock, written home,
//! before the first commit of an empty log can be durable (neither the
//! kernel nor e2fsck looks at a journal without it); cleared at a clean
//! close, after everything is home and the log is empty.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ext4kit_format::time::Clock;
use parking_lot::Mutex;

use crate::buffers::{Buffer, Buffers, Error};
use crate::checkpoint::{Checkpoint, Versions};
use crate::log::{Committed, Log};
use crate::revoke::tid_geq;
use crate::transaction::Transactions;

/// The default commit interval (the kernel's `JBD2_DEFAULT_MAX_COMMIT_AGE`).
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_secs(5);

/// Counters for tests and benchmarks. Relaxed atomics: a counter orders
/// nothing.
#[derive(Debug, Default)]
pub struct JournalStats {
    commits: AtomicU64,
    requests: AtomicU64,
    log_blocks: AtomicU64,
    log_resets: AtomicU64,
}

impl JournalStats {
    /// Transactions written to the log.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Commit requests (fsync, fdatasync, sync, interval, size).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Log blocks written.
    pub fn log_blocks(&self) -> u64 {
        self.log_blocks.load(Ordering::Relaxed)
    }

    /// Checkpoints that emptied the log.
    pub fn log_resets(&self) -> u64 {
        self.log_resets.load(Ordering::Relaxed)
    }
}

/// A closed transaction as its commit captured it.
struct Captured<B> {
    tid: u32,
    /// Each block still alive at the close, with its version then.
    versions: Vec<(u64, Arc<B>)>,
    revokes: Vec<u64>,
    forgotten: Vec<(u64, u64)>,
}

/// The log and the transactions on their way to it.
#[derive(Debug)]
pub(crate) struct Committer {
    txns: Transactions,
    /// The log; holding it serialises commits and log resets.
    log: Mutex<Log>,
    /// Id of the last committed transaction, plus `1 << 32` (0: none
    /// yet), readable without the log lock.
    committed: AtomicU64,
    /// Blocks with a copy in a live transaction of the log.
    logged: Mutex<HashSet<u64>>,
    /// The blocks of the transaction being committed (captured, not yet
    /// in the log): a free of one of them must revoke it too. Kept apart
    /// from `logged` and the checkpoint's committed versions because a
    /// commit may have to checkpoint (and so empty the log) after its
    /// capture: that checkpoint must neither forget these copies nor write
    /// these not-yet-committed versions home.
    committing: Mutex<HashSet<u64>>,
    /// `needs_recovery` is set at home (cleared at a clean close).
    needs_recovery_on_disk: AtomicBool,
    /// Where commit blocks' times come from.
    clock: Clock,
    stats: JournalStats,
}

impl Committer {
    /// A committer over `log`, whose next transaction is the first to
    /// run, committed every `interval` at the latest (none: only when
    /// asked or full), stamping commit blocks with `clock`'s time.
    pub(crate) fn new(log: Log, interval: Option<Duration>, clock: Clock) -> Self {
        Committer {
            txns: Transactions::new(log.next_tid(), log.capacity(), interval),
            log: Mutex::new(log),
            committed: AtomicU64::new(0),
            logged: Mutex::new(HashSet::new()),
            committing: Mutex::new(HashSet::new()),
            needs_recovery_on_disk: AtomicBool::new(false),
            clock,
            stats: JournalStats::default(),
        }
    }

    /// The running transaction.
    pub(crate) fn txns(&self) -> &Transactions {
        &self.txns
    }

    /// Counters.
    pub(crate) fn stats(&self) -> &JournalStats {
        &self.stats
    }

    /// Id of the last committed transaction.
    pub(crate) fn committed_tid(&self) -> Option<u32> {
        let c = self.committed.load(Ordering::Acquire);
        (c != 0).then_some(c as u32)
    }

    fn set_committed(&self, tid: u32) {
        self.committed.store(1 << 32 | u64::from(tid), Ordering::Release);
    }

    /// Whether `needs_recovery` was written home by us.
    pub(crate) fn needs_recovery_on_disk(&self) -> bool {
        self.needs_recovery_on_disk.load(Ordering::Acquire)
    }

    /// Blocks of `runs` were freed by the running transaction: revoke the
    /// ones whose copies are in the log or about to be.
    pub(crate) fn forget(&self, runs: &[(u64, u64)]) {
        let logged = self.logged.lock();
        let committing = self.committing.lock();
        self.txns
            .revoke(runs, |b| logged.contains(&b) || committing.contains(&b));
    }

    /// Commit the running transaction if transaction `tid` (or an earlier
    /// one) has not been committed yet: the group commit behind fsync.
    /// Returns once `tid`'s changes are durable in the log.
    pub(crate) fn commit_upto<B: Buffer, IO: Buffers<Buffer = B>>(
        &self,
        tid: u32,
        cp: &Checkpoint<B>,
        io: &IO,
    ) -> Result<(), IO::Error> {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let mut log = self.log.lock();
        if self.committed_tid().is_some_and(|c| tid_geq(c, tid)) {
            return Ok(());
        }
        self.commit_locked(&mut log, cp, io)
    }

    /// A checkpoint of a journaled filesystem: committed blocks home, then
    /// the log emptied.
    pub(crate) fn checkpoint<B: Buffer, IO: Buffers<Buffer = B>>(
        &self,
        cp: &Checkpoint<B>,
        io: &IO,
    ) -> Result<(), IO::Error> {
        let mut log = self.log.lock();
        self.checkpoint_with_log(&mut log, cp, io)
    }

    /// Quiesce: commit, write everything home, empty the log, clear
    /// `needs_recovery` at home and flush (`jbd2_journal_destroy` +
    /// `ext4_put_super`, or a freeze). After this the filesystem needs no
    /// recovery and its home locations are complete on their own.
    pub(crate) fn close<B: Buffer, IO: Buffers<Buffer = B>>(
        &self,
        cp: &Checkpoint<B>,
        io: &IO,
    ) -> Result<(), IO::Error> {
        // All under the log: a commit slipping in between the checkpoint
        // and the flag's clearing would find the flag still "on disk",
        // skip setting it, and then lose it — a log with transactions
        // and no needs_recovery, which the kernel wipes unread.
        let mut log = self.log.lock();
        self.commit_locked(&mut log, cp, io)?;
        self.checkpoint_with_log(&mut log, cp, io)?;
        if self.needs_recovery_on_disk() {
            io.set_needs_recovery(false)?;
            io.flush()?;
            self.needs_recovery_on_disk.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// The commit itself, with the log held (see the module doc's phases).
    fn commit_locked<B: Buffer, IO: Buffers<Buffer = B>>(
        &self,
        log: &mut Log,
        cp: &Checkpoint<B>,
        io: &IO,
    ) -> Result<(), IO::Error> {
        if self.txns.is_aborted() {
            // jbd2_journal_abort: the running transaction holds a change
            // an operation could not finish.
            return Err(Error::Aborted.into());
        }
        if !self.txns.running_is_empty() {
            // Before anything is taken or written: a refusal leaves the
            // transaction as it was.
            io.check_log_writable()?;
        }
        let t = self.lock_transaction(io);
        if t.versions.is_empty() && t.revokes.is_empty() {
            return self.commit_nothing(t, cp, io);
        }
        let need = log.space_needed(t.versions.len(), t.revokes.len());
        if need > log.capacity() {
            return self.commit_unjournaled(log, t, cp, io);
        }
        self.make_room(log, need, t.versions.len(), cp, io)?;
        let done = match write_transaction(log, &t, &self.clock) {
            Ok(d) => d,
            Err(e) => {
                // Not committed: nothing of it joins the log's books (its
                // blocks stay dirty in the cache for a later commit).
                self.committing.lock().clear();
                self.txns.refile_forgotten(t.forgotten);
                return Err(e.into());
            }
        };
        self.release(log, t, done, cp, io)
    }

    /// Phase 1: close the running transaction and capture it. The closed
    /// transaction's blocks are captured before any handle of the next
    /// one starts: each block's current version, its draft published.
    fn lock_transaction<B: Buffer, IO: Buffers<Buffer = B>>(&self, io: &IO) -> Captured<B> {
        self.txns.close(|closed| {
            let mut versions: Vec<(u64, Arc<B>)> = Vec::with_capacity(closed.blocks.len());
            for &b in &closed.blocks {
                // Forgotten since (freed): nothing to log; its revoke, if
                // it needs one, is in `revokes`.
                if let Some(v) = io.capture(b) {
                    versions.push((b, v));
                }
            }
            // A block freed and then used again as metadata within this
            // transaction is logged by it: its revoke would hide this very
            // copy (a revoke covers its own transaction), so it goes
            // (jbd2_journal_cancel_revoke). Decided here, at the close,
            // not when a handle touches the block: a handle may change a
            // node and then free it (a tree collapsing), and only what is
            // still alive now is logged.
            let alive: HashSet<u64> = versions.iter().map(|(b, _)| *b).collect();
            let revokes: Vec<u64> = closed.revokes.into_iter().filter(|b| !alive.contains(b)).collect();
            // Before any handle of the next transaction can free one of
            // these blocks: such a free must see that the log is about to
            // hold a copy, and revoke it.
            self.committing.lock().extend(alive);
            Captured {
                tid: closed.tid,
                versions,
                revokes,
                forgotten: closed.forgotten,
            }
        })
    }

    /// A transaction with nothing to log: committed at once.
    fn commit_nothing<B: Buffer, IO: Buffers<Buffer = B>>(
        &self,
        t: Captured<B>,
        cp: &Checkpoint<B>,
        io: &IO,
    ) -> Result<(), IO::Error> {
        self.committing.lock().clear();
        self.set_committed(t.tid);
        cp.forget_committed(&t.forgotten, t.tid);
        // Nothing to log, but a commit request promises what was written
        // before it is durable (fsync counts on it).
        io.flush()
    }

    /// A transaction larger than the whole log: written home directly,
    /// in block order, after everything before it, with flushes around it
    /// — ordered, but not atomic (the kernel refuses handles this big;
    /// we would rather store the change than fail it).
    fn commit_unjournaled<B: Buffer, IO: Buffers<Buffer = B>>(
        &self,
        log: &mut Log,
        t: Captured<B>,
        cp: &Checkpoint<B>,
        io: &IO,
    ) -> Result<(), IO::Error> {
        self.checkpoint_with_log(log, cp, io)?;
        cp.add_committed(t.tid, &t.versions);
        self.committing.lock().clear();
        self.set_committed(t.tid);
        cp.forget_committed(&t.forgotten, t.tid);
        self.checkpoint_with_log(log, cp, io)
    }

    /// Phase 2: room in the log, and in the memory budget — the checkpoint
    /// set may hold half as much again as its limit, no more (checkpointing
    /// after this commit would be too late: its blocks are in the log only
    /// once it is written, and only then may they go home). Then
    /// `needs_recovery` home before the log can hold anything (the log's
    /// first flush makes both durable together).
    fn make_room<B: Buffer, IO: Buffers<Buffer = B>>(
        &self,
        log: &mut Log,
        need: u32,
        blocks: usize,
        cp: &Checkpoint<B>,
        io: &IO,
    ) -> Result<(), IO::Error> {
        let limit = io.checkpoint_limit();
        if need > log.free() || cp.len() + blocks > limit + limit / 2 {
            self.checkpoint_with_log(log, cp, io)?;
        }
        if log.is_empty() && !self.needs_recovery_on_disk() {
            io.set_needs_recovery(true)?;
            self.needs_recovery_on_disk.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Phase 4: the transaction is durable in the log.
    fn release<B: Buffer, IO: Buffers<Buffer = B>>(
        &self,
        log: &mut Log,
        t: Captured<B>,
        done: Committed,
        cp: &Checkpoint<B>,
        io: &IO,
    ) -> Result<(), IO::Error> {
        {
            // In the log now: revoked when freed. Moved under both locks,
            // so that a free in between sees the block in one of them.
            let mut logged = self.logged.lock();
            let mut committing = self.committing.lock();
            logged.extend(t.versions.iter().map(|(b, _)| *b));
            committing.clear();
        }
        // And theirs to checkpoint.
        cp.add_committed(t.tid, &t.versions);
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.stats
            .log_blocks
            .fetch_add(u64::from(done.blocks), Ordering::Relaxed);
        self.set_committed(t.tid);
        cp.forget_committed(&t.forgotten, t.tid);
        // Committed: the blocks may now be written home. Over the
        // checkpoint budget the background worker does it; without one
        // (or far over) this commit does, its log already in hand.
        let limit = io.checkpoint_limit();
        if cp.len() > limit && (cp.len() > limit + limit / 2 || !cp.kick_worker()) {
            self.checkpoint_with_log(log, cp, io)?;
        }
        Ok(())
    }

    /// Write every committed block home, flush, and empty the log. The
    /// caller holds the log.
    fn checkpoint_with_log<B: Buffer, IO: Buffers<Buffer = B>>(
        &self,
        log: &mut Log,
        cp: &Checkpoint<B>,
        io: &IO,
    ) -> Result<(), IO::Error> {
        if self.txns.is_aborted() {
            return Err(Error::Aborted.into());
        }
        cp.write_home(io, Versions::Committed)?;
        io.flush()?;
        log.checkpointed().map_err(|source| Error::Log {
            what: "emptying the journal after a checkpoint".into(),
            source,
        })?;
        self.logged.lock().clear();
        self.stats.log_resets.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Phase 3: revoke records, descriptors and copies, flush, commit block,
/// flush (the log's own ordering, see `log.rs`).
fn write_transaction<B: Buffer>(log: &mut Log, t: &Captured<B>, clock: &Clock) -> Result<Committed, Error> {
    let data: Vec<(u64, &[u8])> = t.versions.iter().map(|(b, v)| (*b, v.data())).collect();
    log.commit(&data, &t.revokes, commit_time(clock))
        .map_err(|source| Error::Log {
            what: format!("committing transaction {} to the journal", t.tid),
            source,
        })
}

/// The commit interval to use for an asked-for one (`None` or zero: the
/// default). None under a fixed clock (a reproducible build), which must
/// not let the time decide where one transaction ends: commits then come
/// from fsync, sync, size and close only.
pub(crate) fn commit_interval(asked: Option<Duration>, clock: &Clock) -> Option<Duration> {
    if clock.is_fixed() {
        return None;
    }
    Some(asked.filter(|d| !d.is_zero()).unwrap_or(DEFAULT_COMMIT_INTERVAL))
}

/// The commit block's time (`h_commit_sec`/`h_commit_nsec`) from `clock`:
/// under a fixed clock two builds of one tree write the same log, byte for
/// byte.
fn commit_time(clock: &Clock) -> (u64, u32) {
    let t = clock.now();
    (t.sec.max(0) as u64, t.nsec)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use ext4kit_blockdev::{BlockDevice, CrashImages, MemDevice, RecordingDevice, WriteLog};

    use crate::testing::{format_journal, load_journal, recovered, Mem, MemBuffer, BS, DEV_BYTES, FS_BLOCKS, WANT};
    use crate::{Error, Jbd, Log};
    use ext4kit_format::time::Clock;

    /// A journaled filesystem in memory over a recording device.
    struct Rig {
        rec: Arc<RecordingDevice>,
        /// The device's bytes when recording began.
        base: Vec<u8>,
        mem: Mem,
        jbd: Jbd<MemBuffer>,
    }

    fn rig() -> Rig {
        let inner = Arc::new(MemDevice::new(DEV_BYTES));
        format_journal(&*inner);
        let base = inner.to_vec();
        let rec = Arc::new(RecordingDevice::new(inner));
        let dev: Arc<dyn BlockDevice> = rec.clone();
        let log = Log::start(load_journal(dev.clone()), WANT).unwrap();
        Rig {
            rec,
            base,
            mem: Mem::over(dev),
            jbd: Jbd::journaled(log, None, Clock::System),
        }
    }

    impl Rig {
        /// One handle changing `blocks` to `v`.
        fn change(&self, blocks: &[u64], v: u8) {
            let mut h = self.jbd.begin();
            for &b in blocks {
                self.mem.change(b, v);
                h.note(b);
            }
            self.jbd.stop(&mut h, &self.mem).unwrap();
        }

        /// What a mount would see if the power failed now.
        fn now(&self) -> Vec<u8> {
            let img = self.rec.inner().size() as usize;
            let mut bytes = vec![0u8; img];
            self.rec.read_at(0, &mut bytes).unwrap();
            recovered(bytes)
        }
    }

    /// What the test knows of the committed states: `states[k]` is what
    /// transaction k committed (0: the initial state; `None`: a freed
    /// block, anything goes), `acked[k]` the flush count when its commit
    /// returned, `started[k]` the log position when it began; `data` are
    /// writes straight to freed blocks (block, value, flush count when
    /// durable).
    #[derive(Default)]
    struct Model {
        states: Vec<Vec<Option<u8>>>,
        acked: Vec<u64>,
        started: Vec<u64>,
        data: Vec<(u64, u8, u64)>,
    }

    /// Every power cut the recording allows — at each flush, and between
    /// flushes with unflushed writes dropped at random — leaves, after
    /// recovery, exactly one committed state: one at least as new as the
    /// last acknowledged commit and no newer than the last begun, never a
    /// mix; and every durable data write to a freed block survives replay.
    fn check_every_cut(log: &WriteLog, base: &[u8], model: &Model) -> usize {
        let mut cuts = log.flush_cuts();
        cuts.extend((0..300u64).map(|s| {
            let end = (s as usize * 7919) % (log.len() + 1);
            log.random_cut_at(end, s).unwrap()
        }));
        let mut images = CrashImages::new(log, base.to_vec());
        for cut in &cuts {
            let got = recovered(images.image(cut).unwrap());
            let lo = model.acked.iter().rposition(|&f| f <= cut.flushes).unwrap();
            // A commit begun at the cut wrote nothing before it; it may
            // still count (one with nothing to log is only a flush).
            let hi = model
                .started
                .iter()
                .skip(1)
                .filter(|&&p| (p as usize) <= cut.end)
                .count();
            let matches = |j: usize| {
                model.states[j]
                    .iter()
                    .enumerate()
                    .all(|(b, want)| want.is_none_or(|w| got[b] == w))
            };
            assert!(
                (lo..=hi).any(matches),
                "{cut}: the recovered blocks {got:?} are no committed state of {lo}..={hi}"
            );
            for &(b, v, f) in &model.data {
                if f <= cut.flushes {
                    assert_eq!(
                        got[b as usize], v,
                        "{cut}: a durable data write to freed block {b} was undone"
                    );
                }
            }
        }
        cuts.len()
    }

    /// A random workload of handles, commits, frees with data written to
    /// the freed blocks afterwards, and checkpoints; `limit` is the
    /// checkpoint set's budget.
    fn run_workload(limit: usize, rounds: usize, seed: u64) -> (Rig, Model) {
        let r = rig();
        r.mem.set_limit(limit);
        let mut x = seed;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut state: Vec<Option<u8>> = vec![Some(0); FS_BLOCKS as usize];
        state[0] = None; // the flag block: not metadata
        let mut model = Model {
            states: vec![state.clone()],
            acked: vec![0],
            started: vec![0],
            ..Default::default()
        };
        let mut gen = 0u8;
        let mut next = || {
            gen = gen.wrapping_add(1).max(1);
            gen
        };
        // Block 1 plays the bitmap every free changes; freed blocks stay
        // data from then on.
        let mut freed: HashSet<u64> = HashSet::new();
        for round in 0..rounds {
            let mut to_write = Vec::new();
            // At most 16 blocks a round: no commit but the round's own.
            for _ in 0..1 + rnd(3) {
                let mut h = r.jbd.begin();
                for _ in 0..1 + rnd(5) {
                    let b = 2 + rnd(FS_BLOCKS - 2);
                    if freed.contains(&b) {
                        continue;
                    }
                    let v = next();
                    r.mem.change(b, v);
                    h.note(b);
                    state[b as usize] = Some(v);
                }
                if rnd(5) == 0 && freed.len() < 30 {
                    let b = 2 + rnd(FS_BLOCKS - 2);
                    if freed.insert(b) {
                        r.jbd.forget(&[(b, 1)]);
                        r.mem.forget(b);
                        let v = next();
                        r.mem.change(1, v);
                        h.note(1);
                        state[1] = Some(v);
                        state[b as usize] = None;
                        to_write.push(b);
                    }
                }
                r.jbd.stop(&mut h, &r.mem).unwrap();
            }
            model.started.push(r.rec.position());
            r.jbd.commit_running(&r.mem).unwrap();
            model.states.push(state.clone());
            model.acked.push(r.rec.flushes());
            // The freeing transaction committed: the blocks may hold file
            // data now, written straight home (never journaled).
            for b in to_write {
                let v = next();
                r.rec.write_at(b * BS as u64, &[v; BS]).unwrap();
                r.rec.flush().unwrap();
                model.data.push((b, v, r.rec.flushes()));
            }
            if round % 11 == 10 {
                r.jbd.checkpoint(&r.mem).unwrap();
            }
        }
        (r, model)
    }

    #[test]
    fn every_power_cut_leaves_one_committed_state_and_acknowledged_commits_survive() {
        // A small checkpoint budget (checkpoints after most commits), and
        // a large one (the log fills and a commit checkpoints for room).
        for (limit, seed) in [(24, 0x9e37_79b9_7f4a_7c15u64), (1 << 20, 0x2545_f491_4f6c_dd1d)] {
            let (r, model) = run_workload(limit, 160, seed);
            let stats = r.jbd.stats().unwrap();
            assert_eq!(stats.requests(), 160);
            assert!(stats.log_resets() > 2, "checkpoints emptied the log: {stats:?}");
            let log = r.rec.take_log();
            let cuts = check_every_cut(&log, &r.base, &model);
            assert!(cuts > 400, "{cuts} cut points");
        }
    }

    #[test]
    fn needs_recovery_is_durable_before_the_first_commit_and_cleared_by_close() {
        let r = rig();
        r.change(&[5], 1);
        assert!(!r.mem.needs_recovery_at_home(), "nothing logged yet");
        let before = r.rec.flushes();
        r.jbd.commit_running(&r.mem).unwrap();
        assert!(r.mem.needs_recovery_at_home() && r.jbd.needs_recovery_on_disk());
        // The flag's write precedes the log's first flush.
        let log = r.rec.take_log();
        let flag = log
            .entries()
            .iter()
            .position(|e| e.is_write() && e.offset == 0)
            .unwrap();
        let flush = log
            .entries()
            .iter()
            .enumerate()
            .filter(|(_, e)| e.is_flush())
            .nth(before as usize)
            .unwrap()
            .0;
        assert!(flag < flush, "needs_recovery written after the log's first flush");
        r.jbd.close(&r.mem).unwrap();
        assert!(!r.mem.needs_recovery_at_home() && !r.jbd.needs_recovery_on_disk());
        assert_eq!(r.mem.home(5)[0], 1, "closed: everything is home");
        // Used again after a close, the journal sets the flag again.
        r.change(&[6], 2);
        r.jbd.commit_running(&r.mem).unwrap();
        assert!(r.mem.needs_recovery_at_home());
    }

    #[test]
    fn a_commit_puts_the_blocks_in_the_log_and_only_a_checkpoint_puts_them_home() {
        let r = rig();
        r.change(&[7, 8], 0x42);
        assert_eq!(r.now()[7], 0, "nothing is in the log before a commit");
        r.jbd.commit_running(&r.mem).unwrap();
        assert_eq!(r.mem.home(7)[0], 0, "committed, not yet home");
        assert_eq!(
            (r.now()[7], r.now()[8]),
            (0x42, 0x42),
            "replay puts the committed copies home"
        );
        r.jbd.checkpoint(&r.mem).unwrap();
        assert_eq!(r.mem.home(7)[0], 0x42, "the checkpoint wrote it home");
        let j = load_journal(r.rec.clone());
        assert_eq!(j.sb.start, 0, "and emptied the log");
        assert!(crate::recover(&j).replay.is_empty());
        assert_eq!(r.jbd.stats().unwrap().log_resets(), 1);
    }

    #[test]
    fn the_committed_version_goes_home_not_a_newer_running_one() {
        let r = rig();
        r.change(&[9], 1);
        r.jbd.commit_running(&r.mem).unwrap();
        // A change of the running transaction, not committed.
        let mut h = r.jbd.begin();
        r.mem.change(9, 2);
        h.note(9);
        r.jbd.checkpoint(&r.mem).unwrap();
        assert_eq!(r.mem.home(9)[0], 1, "home holds only what the log committed");
        r.jbd.stop(&mut h, &r.mem).unwrap();
        r.jbd.commit_running(&r.mem).unwrap();
        r.jbd.checkpoint(&r.mem).unwrap();
        assert_eq!(r.mem.home(9)[0], 2);
    }

    #[test]
    fn a_commit_waits_for_the_handles_in_flight_and_takes_them_whole() {
        let r = rig();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let r = &r;
            s.spawn(move || {
                let mut h = r.jbd.begin();
                r.mem.change(10, 1);
                h.note(10);
                tx.send(()).unwrap();
                // The commit below must wait for this handle's second block.
                std::thread::sleep(std::time::Duration::from_millis(50));
                r.mem.change(11, 1);
                h.note(11);
                r.jbd.stop(&mut h, &r.mem).unwrap();
            });
            rx.recv().unwrap();
            r.jbd.commit_running(&r.mem).unwrap();
        });
        let got = r.now();
        assert_eq!((got[10], got[11]), (1, 1), "a commit took half a handle, or none of it");
    }

    /// Concurrent handles each commit and wait (fsync): commits are shared
    /// (group commit), every handle is taken whole, and each commit that
    /// returned is durable at every later power cut.
    #[test]
    fn concurrent_commits_are_shared_whole_and_durable() {
        let r = rig();
        let acks = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (r, acks) = (&r, &acks);
                s.spawn(move || {
                    let pair = [2 + 2 * t, 3 + 2 * t];
                    for v in 1..=25u8 {
                        r.change(&pair, v);
                        r.jbd.commit_running(&r.mem).unwrap();
                        acks.lock().unwrap().push((t, v, r.rec.flushes()));
                    }
                });
            }
        });
        let stats = r.jbd.stats().unwrap();
        assert_eq!(stats.requests(), 100);
        assert!(stats.commits() <= stats.requests());
        let log = r.rec.take_log();
        let acks = acks.into_inner().unwrap();
        let mut images = CrashImages::new(&log, r.base.clone());
        for cut in log.flush_cuts() {
            let got = recovered(images.image(&cut).unwrap());
            for t in 0..4u64 {
                let (a, b) = (got[2 + 2 * t as usize], got[3 + 2 * t as usize]);
                assert_eq!(a, b, "{cut}: thread {t}'s handle was taken in part");
                let want = acks
                    .iter()
                    .filter(|&&(tt, _, f)| tt == t && f <= cut.flushes)
                    .map(|&(_, v, _)| v)
                    .max()
                    .unwrap_or(0);
                assert!(
                    a >= want,
                    "{cut}: thread {t} saw commit of {want} return, recovered {a}"
                );
            }
        }
    }

    #[test]
    fn a_freed_blocks_logged_copy_is_revoked_unless_used_again_in_the_same_transaction() {
        let r = rig();
        r.change(&[20, 21], 5);
        r.jbd.commit_running(&r.mem).unwrap();
        // 20 freed; 21 freed and used again as metadata, in one transaction.
        let mut h = r.jbd.begin();
        r.jbd.forget(&[(20, 2)]);
        r.mem.forget(20);
        r.mem.forget(21);
        r.mem.change(21, 6);
        h.note(21);
        r.mem.change(1, 1);
        h.note(1);
        r.jbd.stop(&mut h, &r.mem).unwrap();
        r.jbd.commit_running(&r.mem).unwrap();
        let plan = crate::recover(&load_journal(r.rec.clone()));
        assert!(
            !plan.replay.contains_key(&20),
            "the freed block's copy is revoked: {plan:?}"
        );
        assert!(plan.nr_revoke_hits >= 1);
        assert!(plan.replay.contains_key(&21), "a revoke cancelled by reuse");
        // And its old version never goes home.
        r.rec.write_at(20 * BS as u64, &[9; BS]).unwrap();
        r.jbd.checkpoint(&r.mem).unwrap();
        assert_eq!((r.mem.home(20)[0], r.mem.home(21)[0]), (9, 6));
    }

    /// A filesystem that refuses the log (its journal shares a block with
    /// a file): a commit writes nothing at all and leaves its transaction
    /// running, to be committed once the log may be written again.
    #[test]
    fn a_commit_the_filesystem_refuses_writes_nothing_and_keeps_its_transaction() {
        let r = rig();
        r.change(&[40], 1);
        r.mem.refuse_log(true);
        let before = r.rec.position();
        assert!(r.jbd.commit_running(&r.mem).is_err());
        assert!(r.jbd.close(&r.mem).is_err());
        assert_eq!(r.rec.position(), before, "a refused commit wrote");
        assert!(!r.jbd.running_is_empty() && !r.mem.needs_recovery_at_home());
        r.mem.refuse_log(false);
        r.jbd.commit_running(&r.mem).unwrap();
        assert_eq!(r.now()[40], 1, "committed once allowed");
    }

    #[test]
    fn an_aborted_journal_commits_and_checkpoints_nothing() {
        let r = rig();
        r.change(&[30], 1);
        r.jbd.commit_running(&r.mem).unwrap();
        let mut h = r.jbd.begin();
        r.mem.change(31, 2);
        h.note(31);
        assert!(h.abort(), "a journal to abort");
        drop(h);
        assert!(r.jbd.is_aborted());
        assert!(matches!(r.jbd.commit_running(&r.mem), Err(Error::Aborted)));
        assert!(matches!(r.jbd.checkpoint(&r.mem), Err(Error::Aborted)));
        let got = r.now();
        assert_eq!((got[30], got[31]), (1, 0), "the last committed state, replayable");
    }

    #[test]
    fn a_running_transaction_past_its_limit_is_committed_by_the_worker_or_past_twice_by_the_stopping_handle() {
        // Its limit: half the checkpoint budget, at least 16 blocks.
        let r = rig();
        r.mem.set_limit(32);
        let kicks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let k = kicks.clone();
        // A worker that never runs: every kick is left unanswered.
        r.jbd.set_worker(Box::new(move || {
            k.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }));
        for b in 2..2 + 32 {
            r.change(&[b], 3);
        }
        assert_eq!(r.jbd.stats().unwrap().commits(), 0, "left to the worker");
        assert_eq!(
            kicks.load(std::sync::atomic::Ordering::Relaxed),
            16,
            "asked once per handle past 16 blocks"
        );
        r.change(&[40], 3);
        assert_eq!(
            r.jbd.stats().unwrap().commits(),
            1,
            "past twice the limit: the worker is behind"
        );
        assert!(r.jbd.running_is_empty());
        // With no worker at all, past the limit is enough.
        let r = rig();
        r.mem.set_limit(32);
        for b in 2..2 + 17 {
            r.change(&[b], 3);
        }
        assert_eq!(r.jbd.stats().unwrap().commits(), 1);
    }
}
