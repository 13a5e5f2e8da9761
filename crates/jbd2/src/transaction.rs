//! Handles and the running transaction (fs/jbd2/transaction.c), and the
//! running transaction's revoke records (revoke.c, commit side).
//!
//! A [`Handle`] gathers the metadata blocks one operation changes
//! ([`Handle::note`]); stopping it hands them to the *running
//! transaction*, which a commit closes and writes to the log
//! (`commit.rs`). Without a journal (ext2, `^has_journal`) a stopped
//! handle's blocks go straight to the checkpoint set instead: no caller
//! sees the difference.
//!
//! **Closing a transaction** (the kernel's `T_LOCKED`): a handle holds the
//! read side of the barrier from `begin` to `stop`; a commit takes the
//! write side, so it waits for the handles in flight to finish and holds
//! new ones back for as long as it takes to capture the closed
//! transaction's blocks and open the next transaction. Writing the log
//! then runs beside the next transaction's handles. A handle begun inside
//! another on the same thread (a nested handle) joins without taking the
//! barrier again, which would deadlock against a waiting commit.
//!
//! **Revokes**: a freed metadata block whose copy sits in a live
//! transaction of the log gets a revoke record in the running
//! transaction, so that replay never writes the old metadata over what
//! the block holds next (file data is not journaled). Its committed
//! version stays the checkpoint's to write until the free commits — the
//! committed filesystem still owns the block — and is dropped then (the
//! freed runs are the transaction's forget list, the kernel's `t_forget`).
//!
//! **Size and age** (the triggers of a commit that nobody asked for): a
//! running transaction grown past a quarter of the log (the kernel's
//! `j_max_transaction_buffers`), or older than the commit interval (5 s
//! by default, the kernel's `commit=`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;

use crate::buffers::Buffer;
use crate::checkpoint::Checkpoint;

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
    /// Runs it freed (`t_forget`).
    forgotten: Vec<(u64, u64)>,
    /// When its first handle stopped.
    since: Option<Instant>,
}

/// A transaction as a commit closed it: what its handles changed, revoked
/// and freed.
#[derive(Debug)]
pub(crate) struct Closed {
    /// Its id.
    pub(crate) tid: u32,
    /// Blocks changed, in the order first changed.
    pub(crate) blocks: Vec<u64>,
    /// Blocks whose logged copies must not be replayed.
    pub(crate) revokes: HashSet<u64>,
    /// Runs freed.
    pub(crate) forgotten: Vec<(u64, u64)>,
}

/// The running transaction, the barrier that closes it, and when it is
/// due for a commit (see the module doc).
#[derive(Debug)]
pub(crate) struct Transactions {
    /// Handles hold the read side from `begin` to `stop`; a commit takes
    /// the write side to close the running transaction.
    barrier: RwLock<()>,
    running: Mutex<Running>,
    /// The running transaction's id, readable without its lock (the
    /// allocator asks on every allocation).
    running_tid: AtomicU32,
    /// Blocks past which the running transaction is committed: a quarter
    /// of the log, and at most half of what the checkpoint may hold, so
    /// that the blocks a cache keeps dirty stay within the memory budget.
    max_blocks: AtomicU64,
    /// A quarter of the log.
    log_quarter: usize,
    /// The commit interval; none under a fixed clock (see `commit.rs`).
    interval: Option<Duration>,
    /// The journal was aborted: the running transaction never commits.
    aborted: AtomicBool,
}

/// How full the running transaction is after a handle stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fullness {
    /// Under its limit.
    Room,
    /// Past it: the background worker should commit it.
    Full,
    /// Past twice the limit (the worker is behind): the stopping caller
    /// commits.
    Overfull,
}

thread_local! {
    /// Handles open on this thread (a nested handle joins the outer one's
    /// transaction without taking the barrier again).
    static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The barrier share a handle holds (none for a nested handle).
struct Membership<'j> {
    _guard: Option<RwLockReadGuard<'j, ()>>,
}

impl Drop for Membership<'_> {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

impl Transactions {
    /// The transactions of a log of `capacity` blocks whose first
    /// transaction is `tid`.
    pub(crate) fn new(tid: u32, capacity: u32, interval: Option<Duration>) -> Self {
        let log_quarter = (capacity as usize / 4).max(16);
        Transactions {
            barrier: RwLock::new(()),
            running: Mutex::new(Running {
                tid,
                ..Default::default()
            }),
            running_tid: AtomicU32::new(tid),
            max_blocks: AtomicU64::new(log_quarter as u64),
            log_quarter,
            interval,
            aborted: AtomicBool::new(false),
        }
    }

    /// Join the running transaction (a handle's `begin`).
    fn join(&self) -> Membership<'_> {
        let nested = DEPTH.with(|d| {
            let n = d.get();
            d.set(n + 1);
            n > 0
        });
        Membership {
            _guard: (!nested).then(|| self.barrier.read()),
        }
    }

    /// Add a stopped handle's blocks to the running transaction; how full
    /// it is then. `dirty_limit` is the checkpoint set's current limit
    /// (the running transaction's own follows it), when known.
    fn add(&self, blocks: impl IntoIterator<Item = u64>, dirty_limit: Option<usize>) -> Fullness {
        let max = match dirty_limit {
            Some(l) => {
                let max = self.log_quarter.min(l / 2).max(16);
                self.max_blocks.store(max as u64, Ordering::Relaxed);
                max
            }
            None => self.max_blocks.load(Ordering::Relaxed) as usize,
        };
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
        if n > 2 * max {
            Fullness::Overfull
        } else if n > max {
            Fullness::Full
        } else {
            Fullness::Room
        }
    }

    /// Id of the running transaction.
    pub(crate) fn running_tid(&self) -> u32 {
        self.running_tid.load(Ordering::Acquire)
    }

    /// Whether the running transaction has anything to commit.
    pub(crate) fn running_is_empty(&self) -> bool {
        let r = self.running.lock();
        r.blocks.is_empty() && r.revokes.is_empty()
    }

    /// Whether the running transaction is older than the commit interval
    /// or past its size limit.
    pub(crate) fn commit_due(&self) -> bool {
        let r = self.running.lock();
        r.blocks.len() > self.max_blocks.load(Ordering::Relaxed) as usize
            || self.interval.is_some_and(|i| r.since.is_some_and(|t| t.elapsed() >= i))
    }

    /// The commit interval.
    pub(crate) fn interval(&self) -> Option<Duration> {
        self.interval
    }

    /// Abort (`jbd2_journal_abort`): no later commit or checkpoint runs.
    pub(crate) fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
    }

    /// Whether the journal was aborted.
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Blocks of `runs` were freed by the running transaction: each one
    /// with a live copy — in the log or about to be (`live`), or changed
    /// by this very transaction — is revoked, and the runs join its forget
    /// list.
    pub(crate) fn revoke(&self, runs: &[(u64, u64)], live: impl Fn(u64) -> bool) {
        let mut r = self.running.lock();
        for &(p, n) in runs {
            for b in p..p + n {
                if live(b) || r.seen.contains(&b) {
                    r.revokes.insert(b);
                }
            }
        }
        r.forgotten.extend_from_slice(runs);
    }

    /// Close the running transaction: wait for the handles in flight, hold
    /// new ones back, open the next transaction, and run `f` on the closed
    /// one before any new handle starts (the capture of its blocks).
    pub(crate) fn close<R>(&self, f: impl FnOnce(Closed) -> R) -> R {
        let _closed: RwLockWriteGuard<'_, ()> = self.barrier.write();
        let closed = {
            let mut r = self.running.lock();
            let tid = r.tid;
            r.seen.clear();
            r.since = None;
            r.tid = tid.wrapping_add(1);
            self.running_tid.store(r.tid, Ordering::Release);
            Closed {
                tid,
                blocks: std::mem::take(&mut r.blocks),
                revokes: std::mem::take(&mut r.revokes),
                forgotten: std::mem::take(&mut r.forgotten),
            }
        };
        f(closed)
    }

    /// A closed transaction failed to commit: its frees join the running
    /// transaction's forget list, so that the next commit drops their old
    /// versions as this one would have.
    pub(crate) fn refile_forgotten(&self, forgotten: Vec<(u64, u64)>) {
        self.running.lock().forgotten.extend(forgotten);
    }
}

/// Where a handle's blocks go.
enum Joined<'j, B> {
    /// The running transaction, of which the handle is a member until it
    /// stops (`None` then).
    Transaction(&'j Transactions, Option<Membership<'j>>),
    /// The checkpoint set (no journal).
    Checkpoint(&'j Checkpoint<B>),
}

/// An open handle (the kernel's `handle_t`): the blocks one operation
/// changes, each noted once, and its membership of the running
/// transaction. Begun by [`crate::Jbd::begin`], stopped by
/// [`crate::Jbd::stop`].
///
/// A handle dropped without `stop` (an operation that failed part-way,
/// past what its undo could reach) still hands its blocks over: their
/// new versions are already what readers see and what the next writer of
/// each block builds on; left out they would be written only if some
/// later handle happened to touch the same block. jbd2 likewise keeps a
/// failed handle's buffers in the running transaction. A handle whose
/// change must not commit is [`Handle::abort`]ed instead.
pub struct Handle<'j, B: Buffer> {
    /// Blocks changed, each once (a handle changes a handful: a small
    /// vector beats a tree, which allocated a node per handle, and eight
    /// inline cover a create — bitmap, descriptor, inode-table block,
    /// leaf, the directory's own inode — without allocating at all).
    blocks: SmallVec<[u64; 8]>,
    joined: Joined<'j, B>,
}

impl<B: Buffer> std::fmt::Debug for Handle<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").field("blocks", &self.blocks).finish()
    }
}

/// Where a stopped handle's blocks went.
pub(crate) enum Stopped {
    /// Into the running transaction, now this full.
    Transaction(Fullness),
    /// Into the checkpoint set.
    Checkpoint,
}

impl<'j, B: Buffer> Handle<'j, B> {
    /// A member of the running transaction of `txns`.
    pub(crate) fn joining(txns: &'j Transactions) -> Self {
        Handle {
            blocks: SmallVec::new(),
            joined: Joined::Transaction(txns, Some(txns.join())),
        }
    }

    /// A handle whose blocks go to `checkpoint` (no journal).
    pub(crate) fn unjournaled(checkpoint: &'j Checkpoint<B>) -> Self {
        Handle {
            blocks: SmallVec::new(),
            joined: Joined::Checkpoint(checkpoint),
        }
    }

    /// Metadata block `block` was changed through this handle (the
    /// kernel's `jbd2_journal_dirty_metadata`): its current version at
    /// the commit is logged.
    #[inline]
    pub fn note(&mut self, block: u64) {
        if !self.blocks.contains(&block) {
            self.blocks.push(block);
        }
    }

    /// Blocks this handle changed.
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.blocks.iter().copied()
    }

    /// Whether this handle changed nothing (yet).
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Hand the blocks over and leave the running transaction; the handle
    /// is left empty (dropping it does nothing more).
    pub(crate) fn hand_over(&mut self, dirty_limit: Option<usize>) -> Stopped {
        let blocks = std::mem::take(&mut self.blocks);
        match &mut self.joined {
            Joined::Transaction(txns, member) => {
                let full = txns.add(blocks, dirty_limit);
                // Out of the transaction before any commit it may trigger.
                *member = None;
                Stopped::Transaction(full)
            }
            Joined::Checkpoint(cp) => {
                cp.add(blocks);
                Stopped::Checkpoint
            }
        }
    }

    /// The operation met damage half-way: abort the journal
    /// (`jbd2_journal_abort`), so that the running transaction, which
    /// holds the half-made change, never commits and nothing more is
    /// checkpointed; this handle's blocks are dropped. Without a journal
    /// there is nothing to abort: the blocks go home as ext2 would write
    /// them. Returns whether there was a journal.
    pub fn abort(&mut self) -> bool {
        match &mut self.joined {
            Joined::Transaction(txns, member) => {
                txns.abort();
                self.blocks.clear();
                *member = None;
                true
            }
            Joined::Checkpoint(_) => false,
        }
    }
}

impl<B: Buffer> Drop for Handle<'_, B> {
    fn drop(&mut self) {
        if !self.blocks.is_empty() {
            self.hand_over(None);
        }
    }
}
