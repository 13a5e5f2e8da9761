//! The running transaction and its commit to the journal: jbd2's
//! transaction.c (handles joining the running transaction) and commit.c
//! (committing it), for a volume opened read-write with a journal.
//!
//! Every committed [`Handle`](crate::transaction::Handle) adds its blocks
//! to the *running transaction*. A commit closes it and writes it to the
//! log ([`ext4kit_jbd2::Log`]): the blocks' contents as of the close,
//! then a commit block, with the flushes that make it atomic. Only then do
//! the blocks join the checkpoint set (`checkpoint.rs`), which writes them
//! home — the *committed* version of each, never a newer one a running
//! handle may have half made — and after which the log is emptied. So at
//! every moment the disk holds, for every metadata block, either its home
//! version or a committed copy in the log that replay puts home.
//!
//! **Closing a transaction** (the kernel's `T_LOCKED`): handles hold the
//! read side of [`Jbd::barrier`] from `begin` to `commit`; a commit takes
//! the write side, so it waits for the handles in flight to finish and
//! holds new ones back for as long as it takes to capture the closed
//! transaction's blocks — each block's current version, its draft
//! published (an `Arc` clone, no copy) — and to open the next transaction.
//! Writing the log then runs beside the next transaction's handles: a
//! block they change gets a new draft, and the captured version stays as
//! it was. A handle begun inside another on the same thread (a nested
//! handle) joins without taking the barrier again, which would deadlock
//! against a waiting commit.
//!
//! **When**: `fsync`, `fdatasync` and `sync` commit the running
//! transaction (concurrent callers share one commit: group commit — each
//! waits for the id it needs, and a commit covers every handle committed
//! before it); the background worker commits one older than the commit
//! interval (5 s by default, the kernel's `commit=`); a running
//! transaction grown past a quarter of the log is committed by the next
//! handle's commit (the kernel's `j_max_transaction_buffers`).
//!
//! **Revokes and busy blocks** (jbd2's revoke.c, ext4's
//! `ext4_free_data`): a freed metadata block whose copy sits in a live
//! transaction of the log gets a revoke record in the running
//! transaction, so that replay never writes the old metadata over what
//! the block holds next (file data is not journaled). And a freed block
//! is not handed out again until the transaction that freed it has
//! committed: otherwise a crash before that commit would leave the block
//! with its old owner *and* the new owner's data.
//!
//! **needs_recovery**: set in the superblock, written home, before the
//! first commit of an empty log can be durable (neither the kernel nor
//! e2fsck looks at a journal without it); cleared at a clean close, after
//! everything is home and the log is empty.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ext4kit_format::features::incompat;
use ext4kit_jbd2::Log;
use parking_lot::{Mutex, RwLock};

use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::volume::Volume;

/// The default commit interval (the kernel's `JBD2_DEFAULT_MAX_COMMIT_AGE`).
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_secs(5);

/// The running transaction.
#[derive(Debug, Default)]
struct Running {
    /// Its id.
    tid: u32,
    /// Blocks its handles changed, each once.
    blocks: Vec<u64>,
    seen: HashSet<u64>,
    /// Blocks it revokes.
    revokes: HashSet<u64>,
    /// When its first handle committed.
    since: Option<Instant>,
}

/// Counters for tests and benchmarks.
#[derive(Debug, Default)]
pub struct JournalStats {
    /// Transactions written to the log.
    pub commits: AtomicU64,
    /// Commit requests (fsync, fdatasync, sync, interval, size).
    pub requests: AtomicU64,
    /// Log blocks written.
    pub log_blocks: AtomicU64,
    /// Checkpoints that emptied the log.
    pub log_resets: AtomicU64,
}

/// The journal of a volume open for writing.
pub struct Jbd {
    /// Handles hold the read side from `begin` to `commit`; a commit takes
    /// the write side to close the running transaction.
    pub(crate) barrier: RwLock<()>,
    running: Mutex<Running>,
    /// The log; holding it serialises commits and log resets.
    log: Mutex<Log>,
    /// Id of the last committed transaction (`None` until the first).
    committed: Mutex<Option<u32>>,
    /// Latest committed version of each block not yet written home.
    pub(crate) committed_versions: Mutex<HashMap<u64, Arc<Buffer>>>,
    /// Blocks with a copy in a live transaction of the log.
    logged: Mutex<HashSet<u64>>,
    /// The blocks of the transaction being committed (captured, not yet
    /// in the log): a free of one of them must revoke it too. Kept apart
    /// from `logged` and `committed_versions` because a commit may have to
    /// checkpoint (and so empty the log) after its capture: that
    /// checkpoint must neither forget these copies nor write these
    /// not-yet-committed versions home.
    committing: Mutex<HashSet<u64>>,
    /// Freed runs `(start, len, tid)` not to allocate until transaction
    /// `tid` commits.
    busy: Mutex<Vec<(u64, u64, u32)>>,
    /// Runs allocated by the running transaction (start → length): freed
    /// again before it commits, no committed metadata ever owned them, so
    /// they are free for reuse at once (an allocation undone after
    /// ENOSPC gives its blocks straight back).
    allocated: Mutex<std::collections::BTreeMap<u64, u64>>,
    /// `needs_recovery` is set on disk (cleared at a clean close).
    recover_flag_on_disk: AtomicBool,
    /// The commit interval; none under `SOURCE_DATE_EPOCH`, where a
    /// reproducible build must not let the clock decide where one
    /// transaction ends (commits then come from fsync, sync, size and
    /// close only).
    pub interval: Option<Duration>,
    /// Blocks past which the running transaction is committed: a quarter
    /// of the log (jbd2's `j_max_transaction_buffers`), and at most half of
    /// what the checkpoint may hold (`DirtyMeta::limit`), so that the blocks
    /// a cache keeps dirty stay within the memory budget.
    max_blocks: AtomicU64,
    /// A quarter of the log.
    log_quarter: usize,
    /// Counters.
    pub stats: JournalStats,
    /// The next transaction id, readable without the log lock.
    next_tid: AtomicU32,
}

impl std::fmt::Debug for Jbd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jbd")
            .field("log", &*self.log.lock())
            .field("committed", &*self.committed.lock())
            .finish()
    }
}

thread_local! {
    /// Handles open on this thread (a nested handle joins the outer one's
    /// transaction without taking the barrier again).
    static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The barrier share a handle holds (none for a nested handle).
pub(crate) struct Membership<'v> {
    _guard: Option<parking_lot::RwLockReadGuard<'v, ()>>,
}

impl Drop for Membership<'_> {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

impl Jbd {
    /// A journal state over `log`, whose next transaction is its
    /// `next_tid`.
    pub fn new(log: Log) -> Jbd {
        let tid = log.next_tid();
        let log_quarter = (log.capacity() as usize / 4).max(16);
        Jbd {
            barrier: RwLock::new(()),
            running: Mutex::new(Running {
                tid,
                ..Default::default()
            }),
            next_tid: AtomicU32::new(tid),
            log: Mutex::new(log),
            committed: Mutex::new(None),
            committed_versions: Mutex::new(HashMap::new()),
            logged: Mutex::new(HashSet::new()),
            committing: Mutex::new(HashSet::new()),
            busy: Mutex::new(Vec::new()),
            allocated: Mutex::new(std::collections::BTreeMap::new()),
            recover_flag_on_disk: AtomicBool::new(false),
            interval: source_date_epoch().is_none().then_some(DEFAULT_COMMIT_INTERVAL),
            max_blocks: AtomicU64::new(log_quarter as u64),
            log_quarter,
            stats: JournalStats::default(),
        }
    }

    /// Join the running transaction (a handle's `begin`).
    pub(crate) fn join(&self) -> Membership<'_> {
        let nested = DEPTH.with(|d| {
            let n = d.get();
            d.set(n + 1);
            n > 0
        });
        Membership {
            _guard: (!nested).then(|| self.barrier.read()),
        }
    }

    /// Add a committed handle's blocks to the running transaction; how
    /// full it is: 0 under its limit, 1 past it (the background worker
    /// should commit it), 2 past twice the limit (the worker is behind:
    /// the caller commits).
    pub(crate) fn add(&self, blocks: impl IntoIterator<Item = u64>, dirty_limit: usize) -> u8 {
        let max = self.log_quarter.min(dirty_limit / 2).max(16);
        self.max_blocks.store(max as u64, Ordering::Relaxed);
        let mut r = self.running.lock();
        for b in blocks {
            if r.seen.insert(b) {
                r.blocks.push(b);
            }
        }
        if r.since.is_none() && !r.blocks.is_empty() {
            r.since = Some(Instant::now());
        }
        let n = r.blocks.len();
        u8::from(n > max) + u8::from(n > 2 * max)
    }

    /// Id of the running transaction.
    pub fn running_tid(&self) -> u32 {
        self.running.lock().tid
    }

    /// Whether the running transaction has anything to commit.
    pub fn running_is_empty(&self) -> bool {
        let r = self.running.lock();
        r.blocks.is_empty() && r.revokes.is_empty()
    }

    /// Whether the running transaction is older than the commit interval
    /// or past its size limit.
    pub fn commit_due(&self) -> bool {
        let r = self.running.lock();
        r.blocks.len() > self.max_blocks.load(Ordering::Relaxed) as usize
            || self.interval.is_some_and(|i| r.since.is_some_and(|t| t.elapsed() >= i))
    }

    /// Note blocks freed by the running transaction: each one with a copy
    /// in a live transaction is revoked, and the run stays busy until the
    /// running transaction commits. Until then the block's committed
    /// version stays the checkpoint's to write (the committed filesystem
    /// still owns the block; if the log is emptied before the free
    /// commits, that version must be home); once the free commits the
    /// version is dropped (`release_busy`), so that no checkpoint writes it
    /// over the block's next owner.
    pub(crate) fn freed(&self, runs: &[(u64, u64)]) {
        let tid = self.running_tid();
        {
            let logged = self.logged.lock();
            let committing = self.committing.lock();
            let mut r = self.running.lock();
            for &(p, n) in runs {
                for b in p..p + n {
                    if logged.contains(&b) || committing.contains(&b) || r.seen.contains(&b) {
                        r.revokes.insert(b);
                    }
                }
            }
        }
        // Blocks the running transaction allocated itself are not busy.
        let mut owned: Vec<(u64, u64)> = Vec::new();
        {
            let mut alloc = self.allocated.lock();
            for &(p, n) in runs {
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
                owned.extend(rest.into_iter().filter(|(a, b)| a < b).map(|(a, b)| (a, b - a)));
            }
        }
        let mut busy = self.busy.lock();
        busy.extend(owned.into_iter().map(|(p, n)| (p, n, tid)));
    }

    /// Note a run the running transaction allocated (see `allocated`).
    pub(crate) fn allocated(&self, start: u64, len: u64) {
        if len > 0 {
            self.allocated.lock().insert(start, len);
        }
    }

    /// Whether freed blocks wait for their transaction to commit.
    pub fn has_busy(&self) -> bool {
        !self.busy.lock().is_empty()
    }

    /// The busy blocks within `start..end`, as runs clipped to it.
    pub(crate) fn busy_in(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let busy = self.busy.lock();
        busy.iter()
            .filter_map(|&(p, n, _)| {
                let (s, e) = (p.max(start), (p + n).min(end));
                (s < e).then(|| (s, e - s))
            })
            .collect()
    }

    /// Whether `needs_recovery` was written home by us.
    pub fn recover_flag_on_disk(&self) -> bool {
        self.recover_flag_on_disk.load(Ordering::Acquire)
    }
}

/// `SOURCE_DATE_EPOCH`, when set: the seconds a reproducible build stamps
/// on everything, commit blocks included.
fn source_date_epoch() -> Option<u64> {
    std::env::var("SOURCE_DATE_EPOCH").ok().and_then(|v| v.parse().ok())
}

/// The commit block's time: now, or `SOURCE_DATE_EPOCH` (then two builds
/// of one tree write the same log, byte for byte).
fn commit_time() -> (u64, u32) {
    if let Some(s) = source_date_epoch() {
        return (s, 0);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (now.as_secs(), now.subsec_nanos())
}

impl Volume {
    /// Commit the running transaction if transaction `tid` (or an earlier
    /// one) has not been committed yet: the group commit behind fsync.
    /// Returns once `tid`'s changes are durable in the log. A no-op
    /// without a journal.
    pub fn commit_upto(&self, tid: u32) -> Result<()> {
        let Some(j) = self.jbd() else { return Ok(()) };
        j.stats.requests.fetch_add(1, Ordering::Relaxed);
        let mut log = j.log.lock();
        if let Some(c) = *j.committed.lock() {
            if ext4kit_jbd2::revoke::tid_geq(c, tid) {
                return Ok(());
            }
        }
        self.commit_locked(j, &mut log)
    }

    /// Commit whatever the running transaction holds now.
    pub fn commit_running(&self) -> Result<()> {
        let Some(j) = self.jbd() else { return Ok(()) };
        let tid = j.running_tid();
        self.commit_upto(tid)
    }

    /// The commit itself, with the log held.
    fn commit_locked(&self, j: &Jbd, log: &mut Log) -> Result<()> {
        if self.errors().journal_aborted() {
            // jbd2_journal_abort: the running transaction holds a change
            // an operation could not finish (fs_errors.rs).
            return Err(self.errors().refused_after_error());
        }
        // Close the running transaction: no handle in flight, none starting.
        let (tid, blocks, revokes, captured) = {
            let _closed = j.barrier.write();
            let mut r = j.running.lock();
            let tid = r.tid;
            let blocks = std::mem::take(&mut r.blocks);
            r.seen.clear();
            let revokes: Vec<u64> = std::mem::take(&mut r.revokes).into_iter().collect();
            r.since = None;
            r.tid = tid.wrapping_add(1);
            // What the closed transaction allocated will be owned by
            // committed metadata: freed from now on, it is busy.
            j.allocated.lock().clear();
            j.next_tid.store(r.tid, Ordering::Release);
            drop(r);
            let mut captured: Vec<(u64, Arc<Buffer>)> = Vec::with_capacity(blocks.len());
            for &b in &blocks {
                let mut g = self.bcache().lock(b);
                // Forgotten since (freed): nothing to log; its revoke, if
                // it needs one, is in `revokes`.
                if let Some(v) = self.bcache().peek_locked(&mut g, b) {
                    captured.push((b, v));
                }
            }
            // A block freed and then used again as metadata within this
            // transaction is logged by it: its revoke would hide this very
            // copy (a revoke covers its own transaction), so it goes
            // (jbd2_journal_cancel_revoke). Decided here, at the close,
            // not when a handle touches the block: a handle may change a
            // node and then free it (a tree collapsing), and only what is
            // still alive now is logged.
            let alive: HashSet<u64> = captured.iter().map(|(b, _)| *b).collect();
            let revokes: Vec<u64> = revokes.into_iter().filter(|b| !alive.contains(b)).collect();
            // Before any handle of the next transaction can free one of
            // these blocks: such a free must see that the log is about to
            // hold a copy, and revoke it.
            j.committing.lock().extend(alive);
            (tid, blocks, revokes, captured)
        };
        let _ = blocks;
        if captured.is_empty() && revokes.is_empty() {
            j.committing.lock().clear();
            *j.committed.lock() = Some(tid);
            self.release_busy(j, tid);
            // Nothing to log, but a commit request promises what was
            // written before it is durable (fsync counts on it).
            return self
                .disk()
                .device()
                .flush()
                .map_err(|e| Error::io("flushing the device", e));
        }
        let need = log.space_needed(captured.len(), revokes.len());
        if need > log.capacity() {
            return self.commit_unjournaled(j, log, tid, captured);
        }
        // Room in the log, and in the memory budget: the checkpoint set
        // may hold half as much again as its limit, no more (checkpointing
        // after this commit would be too late — its blocks are in the log
        // only once it is written, and only then may they go home).
        let dm = self.dirty_meta();
        if need > log.free() || dm.len() + captured.len() > dm.limit() + dm.limit() / 2 {
            self.checkpoint_with_log(j, log)?;
        }
        if log.is_empty() && !j.recover_flag_on_disk.load(Ordering::Acquire) {
            // needs_recovery home before the log can hold anything (the
            // log's first flush makes both durable together).
            self.set_recover_home(true)?;
            j.recover_flag_on_disk.store(true, Ordering::Release);
        }
        let data: Vec<(u64, &[u8])> = captured.iter().map(|(b, v)| (*b, &v.data[..])).collect();
        let done = match log.commit(&data, &revokes, commit_time()) {
            Ok(d) => d,
            Err(e) => {
                // Not committed: nothing of it joins the log's books (its
                // blocks stay dirty in the cache for a later commit).
                j.committing.lock().clear();
                return Err(Error::io(format!("committing transaction {tid} to the journal"), e));
            }
        };
        {
            // In the log now: revoke on free, and theirs to checkpoint.
            let mut logged = j.logged.lock();
            let mut cv = j.committed_versions.lock();
            let mut committing = j.committing.lock();
            for (b, v) in &captured {
                logged.insert(*b);
                cv.insert(*b, v.clone());
            }
            committing.clear();
        }
        j.stats.commits.fetch_add(1, Ordering::Relaxed);
        j.stats.log_blocks.fetch_add(done.blocks as u64, Ordering::Relaxed);
        *j.committed.lock() = Some(tid);
        self.release_busy(j, tid);
        // Committed: the blocks may now be written home. Over the
        // checkpoint budget the background worker does it; without one
        // (or far over) this commit does, its log already in hand.
        if self.dirty_meta().add(captured.iter().map(|(b, _)| *b)) {
            let limit = self.dirty_meta().limit();
            if self.dirty_meta().len() > limit + limit / 2 || !crate::flusher::kick(&self.dirty_meta().flusher) {
                self.checkpoint_with_log(j, log)?;
            }
        }
        Ok(())
    }

    /// The background worker's commit: the running transaction, if it is
    /// older than the commit interval or past its size limit. A failure is kept for the next
    /// caller to meet (its commit fails the same way).
    pub fn commit_if_due(&self) {
        if let Some(j) = self.jbd() {
            if j.commit_due() {
                let _ = self.commit_running();
            }
        }
    }

    /// A transaction larger than the whole log: written home directly,
    /// in block order, after everything before it, with flushes around it
    /// — ordered, but not atomic (the kernel refuses handles this big;
    /// we would rather store the change than fail it).
    fn commit_unjournaled(&self, j: &Jbd, log: &mut Log, tid: u32, captured: Vec<(u64, Arc<Buffer>)>) -> Result<()> {
        self.checkpoint_with_log(j, log)?;
        {
            let mut cv = j.committed_versions.lock();
            for (b, v) in &captured {
                cv.insert(*b, v.clone());
            }
            j.committing.lock().clear();
        }
        self.dirty_meta().add(captured.iter().map(|(b, _)| *b));
        *j.committed.lock() = Some(tid);
        self.release_busy(j, tid);
        self.checkpoint_with_log(j, log)
    }

    fn release_busy(&self, j: &Jbd, tid: u32) {
        let mut busy = j.busy.lock();
        let mut cv = j.committed_versions.lock();
        busy.retain(|&(p, n, t)| {
            let done = ext4kit_jbd2::revoke::tid_geq(tid, t);
            if done {
                // A truncate frees millions of blocks; the map holds a few
                // thousand: walk the smaller side.
                if n as usize > cv.len() {
                    cv.retain(|b, _| !(p..p + n).contains(b));
                } else {
                    for b in p..p + n {
                        cv.remove(&b);
                    }
                }
            }
            !done
        });
    }

    /// Write every committed block home, flush, and empty the log. The
    /// caller holds the log.
    pub(crate) fn checkpoint_with_log(&self, j: &Jbd, log: &mut Log) -> Result<()> {
        if self.errors().journal_aborted() {
            return Err(self.errors().refused_after_error());
        }
        self.checkpoint_home()?;
        self.disk()
            .device()
            .flush()
            .map_err(|e| Error::io("flushing the checkpointed blocks", e))?;
        log.checkpointed()
            .map_err(|e| Error::io("emptying the journal after a checkpoint", e))?;
        j.logged.lock().clear();
        j.stats.log_resets.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A checkpoint of a journaled volume: committed blocks home, then the
    /// log emptied.
    pub(crate) fn checkpoint_journaled(&self, j: &Jbd) -> Result<()> {
        let mut log = j.log.lock();
        self.checkpoint_with_log(j, &mut log)
    }

    /// Quiesce the journal: commit, write everything home, empty the log,
    /// clear `needs_recovery` at home and flush (jbd2_journal_destroy +
    /// ext4_put_super, or a freeze). After this the image file needs no
    /// recovery and is complete on its own. With `last` (the volume is
    /// closing) the in-memory superblock loses the flag too; otherwise it
    /// keeps it, so that every superblock version a later transaction logs
    /// says so (the next commit sets it at home again first).
    pub fn close_journal(&self, last: bool) -> Result<()> {
        let Some(j) = self.jbd() else { return Ok(()) };
        // All under the log: a commit slipping in between the checkpoint
        // and the flag's clearing would find the flag still "on disk",
        // skip setting it, and then lose it — a log with transactions
        // and no needs_recovery, which the kernel wipes unread.
        let mut log = j.log.lock();
        self.commit_locked(j, &mut log)?;
        self.checkpoint_with_log(j, &mut log)?;
        if last {
            self.sb().write().feature_incompat &= !incompat::RECOVER;
        }
        if j.recover_flag_on_disk.load(Ordering::Acquire) {
            self.set_recover_home(false)?;
            self.disk()
                .device()
                .flush()
                .map_err(|e| Error::io("flushing the superblock at close", e))?;
            j.recover_flag_on_disk.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Set or clear `needs_recovery` in the superblock at home, changing
    /// nothing else of it: the home copy is the last checkpointed one, and
    /// the in-memory superblock may hold changes no transaction has
    /// committed yet, which must not reach the disk outside the log.
    fn set_recover_home(&self, on: bool) -> Result<()> {
        use ext4kit_format::superblock::{Superblock, SUPERBLOCK_OFFSET};
        let _g = self.sb().update_lock();
        let mut raw = vec![0u8; Superblock::SIZE];
        self.disk()
            .device()
            .read_at(SUPERBLOCK_OFFSET, &mut raw)
            .map_err(|e| Error::io("reading the superblock", e))?;
        let mut sb = Superblock::parse(&raw).map_err(|e| Error::corrupt("superblock at byte 1024", e))?;
        if on {
            sb.feature_incompat |= incompat::RECOVER;
        } else {
            sb.feature_incompat &= !incompat::RECOVER;
        }
        self.disk()
            .device()
            .write_at(SUPERBLOCK_OFFSET, &sb.to_bytes_with_checksum())
            .map_err(|e| Error::io("writing the superblock", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::scratch_volume;

    /// A block of the inode table past what mkfs used: free to scribble on.
    fn spare_block(v: &Volume, k: u64) -> u64 {
        v.groups()[0].inode_table() + 100 + k
    }

    fn change(v: &Volume, blk: u64, byte: u8) {
        let mut h = v.begin().unwrap();
        h.modify(blk, |d| {
            d[9] = byte;
            Ok(())
        })
        .unwrap();
        h.commit().unwrap();
    }

    fn replay_plan(v: &Volume) -> ext4kit_jbd2::Recovery {
        let j = crate::journal::open_journal(v.disk().device()).unwrap();
        ext4kit_jbd2::recover(&j)
    }

    fn home_byte(v: &Volume, blk: u64) -> u8 {
        let mut raw = vec![0u8; v.block_size()];
        v.disk().read_raw(blk, &mut raw).unwrap();
        raw[9]
    }

    #[test]
    fn a_commit_puts_the_blocks_in_the_log_and_only_a_checkpoint_puts_them_home() {
        let v = scratch_volume();
        assert!(v.jbd().is_some(), "the scratch volume has a journal");
        let blk = spare_block(&v, 0);
        let before = home_byte(&v, blk);
        change(&v, blk, 0x42);
        assert!(
            replay_plan(&v).replay.is_empty(),
            "nothing is in the log before a commit"
        );
        v.commit_running().unwrap();
        let plan = replay_plan(&v);
        assert!(
            plan.replay.contains_key(&blk),
            "the committed block is in the log: {plan:?}"
        );
        assert_eq!(home_byte(&v, blk), before, "committed, not yet home");
        let sb = crate::journal::read_superblock(&**v.disk().device()).unwrap();
        assert!(
            sb.has_incompat(incompat::RECOVER),
            "needs_recovery is at home while the log holds a transaction"
        );
        v.checkpoint().unwrap();
        assert_eq!(home_byte(&v, blk), 0x42, "the checkpoint wrote it home");
        assert!(replay_plan(&v).replay.is_empty(), "and emptied the log");
        v.close_journal(true).unwrap();
        let sb = crate::journal::read_superblock(&**v.disk().device()).unwrap();
        assert!(
            !sb.has_incompat(incompat::RECOVER),
            "a clean close clears needs_recovery"
        );
    }

    #[test]
    fn a_commit_waits_for_the_handles_in_flight_and_takes_them_whole() {
        let v = scratch_volume();
        let (a, b) = (spare_block(&v, 1), spare_block(&v, 2));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let v = &v;
            s.spawn(move || {
                let mut h = v.begin().unwrap();
                h.modify(a, |d| {
                    d[9] = 1;
                    Ok(())
                })
                .unwrap();
                tx.send(()).unwrap();
                // The commit below must wait for this handle's second block.
                std::thread::sleep(std::time::Duration::from_millis(50));
                h.modify(b, |d| {
                    d[9] = 2;
                    Ok(())
                })
                .unwrap();
                h.commit().unwrap();
            });
            rx.recv().unwrap();
            v.commit_running().unwrap();
        });
        let plan = replay_plan(&v);
        assert!(
            plan.replay.contains_key(&a) == plan.replay.contains_key(&b),
            "a commit took half a handle: {:?}",
            plan.replay.keys().collect::<Vec<_>>()
        );
    }

    #[test]
    fn concurrent_commit_requests_share_commits() {
        let v = scratch_volume();
        let j = v.jbd().unwrap();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let v = &v;
                s.spawn(move || {
                    for i in 0..25u64 {
                        change(v, spare_block(v, 10 + t * 30 + i), i as u8);
                        v.commit_running().unwrap();
                    }
                });
            }
        });
        let (commits, requests) = (
            j.stats.commits.load(Ordering::Relaxed),
            j.stats.requests.load(Ordering::Relaxed),
        );
        assert_eq!(requests, 100);
        assert!(commits <= requests, "{commits} commits for {requests} requests");
    }

    #[test]
    fn a_freed_block_is_busy_until_its_transaction_commits_and_its_log_copy_is_revoked() {
        let v = scratch_volume();
        let j = v.jbd().unwrap();
        // Allocate a block, log it as metadata, commit: it is live in the log.
        let mut h = v.begin().unwrap();
        let (blk, _) = v.alloc_blocks(&mut h, 0, 1).unwrap();
        h.overwrite(blk, vec![7u8; v.block_size()].into_boxed_slice()).unwrap();
        h.commit().unwrap();
        v.commit_running().unwrap();
        // Free it: busy now, revoked in the running transaction.
        let mut h = v.begin().unwrap();
        v.free_blocks(&mut h, blk, 1).unwrap();
        h.commit().unwrap();
        assert!(j.has_busy());
        let mut h = v.begin().unwrap();
        for _ in 0..64 {
            let (b, n) = v.alloc_blocks(&mut h, blk, 1).unwrap();
            assert!(!(b..b + n as u64).contains(&blk), "a busy block was handed out again");
        }
        drop(h);
        v.commit_running().unwrap();
        assert!(!j.has_busy(), "committed: nothing is busy any more");
        let plan = replay_plan(&v);
        assert!(
            !plan.replay.contains_key(&blk),
            "the freed block's copy is revoked: {plan:?}"
        );
        assert!(plan.nr_revoke_hits >= 1);
    }
}
