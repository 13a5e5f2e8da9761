//! Checkpoint: writing committed metadata blocks to their home location
//! (fs/jbd2/checkpoint.c).
//!
//! A committed block is not written home at once: it joins the
//! checkpoint set and stays dirty in the filesystem's cache (where dirty
//! buffers are never evicted). The set is written back in block order —
//! adjacent blocks in one device write — when it passes its budget, when
//! the log needs room, and by every sync before the device is flushed. A
//! create touches the same inode-table, bitmap, descriptor and directory
//! blocks as the creates before it: writing at commit cost five device
//! writes per create, and made a create storm measure the host's write
//! path instead of the htree.
//!
//! What is written is, per block:
//!
//! - with a journal, the version the log holds ([`Versions::Committed`]):
//!   a newer one may carry changes of a transaction not yet committed,
//!   which must not reach home before its commit block does. Once they are
//!   home and flushed the log no longer needs them and is emptied
//!   (`commit.rs`);
//! - without one (ext2, `^has_journal`), the block's current version
//!   ([`Versions::Current`]), captured at the checkpoint: nothing orders
//!   home writes but this set. A version replaced while its write was in
//!   flight stays dirty for the next checkpoint.
//!
//! On a device error the unwritten blocks go back into the set and stay
//! dirty, so nothing is lost and the next sync tries again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, MutexGuard};

use crate::buffers::{Buffer, Buffers};
use crate::revoke::tid_gt;

/// Longest run of adjacent blocks written with one device write.
const MAX_RUN: usize = 256;

/// Which version of each block a checkpoint writes (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Versions {
    /// The version the log holds (a journaled filesystem).
    Committed,
    /// The block's current version (no journal).
    Current,
}

/// Metadata blocks committed but not yet written home.
pub(crate) struct Checkpoint<B> {
    /// Most commits re-add blocks already waiting (the same directory
    /// leaf, descriptor, bitmap): see [`Pending`].
    pending: Mutex<Pending>,
    len: AtomicUsize,
    /// With a journal: the latest committed version of each block not yet
    /// home, with the transaction that committed it.
    committed: Mutex<HashMap<u64, (Arc<B>, u32)>>,
    /// Held for a whole checkpoint, and by [`Checkpoint::hold`]: a block
    /// freed (and perhaps reused for file data) while a checkpoint is
    /// writing its old metadata contents would otherwise be overwritten
    /// after the new data lands.
    io: Mutex<()>,
    /// The last background checkpoint failed: the next commit checkpoints
    /// itself, so that the error reaches a caller.
    failed: AtomicBool,
    /// How to wake the background worker that commits and checkpoints
    /// (kjournald2 and the checkpoint thread, in one); none in tools and
    /// unit tests, where callers do it all inline.
    worker: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl<B> std::fmt::Debug for Checkpoint<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("len", &self.len.load(Ordering::Relaxed))
            .finish()
    }
}

impl<B> Default for Checkpoint<B> {
    fn default() -> Self {
        Checkpoint {
            pending: Mutex::new(Pending::default()),
            len: AtomicUsize::new(0),
            committed: Mutex::new(HashMap::new()),
            io: Mutex::new(()),
            failed: AtomicBool::new(false),
            worker: OnceLock::new(),
        }
    }
}

/// The blocks waiting, as a sparse bitset: one bit per block, in chunks
/// of [`CHUNK`] blocks (one cache line of bits) made when first touched.
///
/// A create commits five blocks, four of them the same as the create
/// before's (bitmap, descriptor, the directory's inode block, the
/// inode-table block being filled) and one a directory leaf anywhere in
/// the directory. A hash set of blocks — 24,000 of them by a million
/// files, far out of the CPU caches — cost a cold probe per block; the
/// chunks of a create storm are a few hundred cache lines, and a block
/// is a probe of that small map and a bit. Iterating the chunks in key
/// order yields the blocks sorted, as the checkpoint writes them. At
/// worst (every block in its own chunk) the map is ~80 bytes per block.
#[derive(Debug, Default)]
struct Pending {
    chunks: foldhash::HashMap<u64, [u64; CHUNK_WORDS]>,
    len: usize,
}

/// Blocks per chunk of [`Pending`].
const CHUNK: u64 = 512;
const CHUNK_WORDS: usize = (CHUNK / 64) as usize;

impl Pending {
    fn insert(&mut self, b: u64) {
        let words = self.chunks.entry(b / CHUNK).or_insert([0; CHUNK_WORDS]);
        let (w, bit) = (((b % CHUNK) / 64) as usize, b % 64);
        if words[w] & (1 << bit) == 0 {
            words[w] |= 1 << bit;
            self.len += 1;
        }
    }

    /// Every block, in order; the set is left empty.
    fn drain_sorted(&mut self) -> Vec<u64> {
        let mut keys: Vec<u64> = self.chunks.keys().copied().collect();
        keys.sort_unstable();
        let mut out = Vec::with_capacity(self.len);
        for k in keys {
            let words = self.chunks[&k];
            for (w, &word) in words.iter().enumerate() {
                let mut bits = word;
                while bits != 0 {
                    let bit = bits.trailing_zeros() as u64;
                    out.push(k * CHUNK + w as u64 * 64 + bit);
                    bits &= bits - 1;
                }
            }
        }
        self.chunks.clear();
        self.len = 0;
        out
    }
}

impl<B: Buffer> Checkpoint<B> {
    /// Record blocks committed without a journal (their current version is
    /// what goes home).
    pub(crate) fn add(&self, blocks: impl IntoIterator<Item = u64>) {
        let mut p = self.pending.lock();
        for b in blocks {
            p.insert(b);
        }
        self.len.store(p.len, Ordering::Relaxed);
    }

    /// Record the versions transaction `tid` committed to the log: theirs
    /// to write home from now on.
    pub(crate) fn add_committed(&self, tid: u32, versions: &[(u64, Arc<B>)]) {
        {
            let mut c = self.committed.lock();
            for (b, v) in versions {
                c.insert(*b, (v.clone(), tid));
            }
        }
        self.add(versions.iter().map(|(b, _)| *b));
    }

    /// Blocks of `runs` were freed by transaction `tid`, which has now
    /// committed: their versions committed before it are dropped, so that
    /// no checkpoint writes them over the blocks' next owners (the
    /// kernel's `t_forget` list, processed at commit). A version `tid`
    /// itself committed (the block was used again as metadata in the same
    /// transaction) stays.
    pub(crate) fn forget_committed(&self, runs: &[(u64, u64)], tid: u32) {
        let mut c = self.committed.lock();
        for &(p, n) in runs {
            // A truncate frees millions of blocks; the map holds a few
            // thousand: walk the smaller side.
            if n as usize > c.len() {
                c.retain(|b, (_, t)| !((p..p + n).contains(b) && tid_gt(tid, *t)));
            } else {
                for b in p..p + n {
                    if c.get(&b).is_some_and(|(_, t)| tid_gt(tid, *t)) {
                        c.remove(&b);
                    }
                }
            }
        }
    }

    /// Blocks waiting to be written.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hold off checkpoints: while the guard lives no checkpoint writes
    /// (one in flight is waited for). A filesystem freeing metadata blocks
    /// holds it while it forgets them (the kernel's `bforget`), so that a
    /// block's old contents are never written after the block is reused.
    pub(crate) fn hold(&self) -> MutexGuard<'_, ()> {
        self.io.lock()
    }

    /// Whether the last background checkpoint failed (see `failed`).
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Record how the last checkpoint that nobody waited for ended.
    pub(crate) fn set_failed(&self, failed: bool) {
        self.failed.store(failed, Ordering::Relaxed);
    }

    /// Attach the background worker: `kick` wakes it (cheaply when it is
    /// awake already). Only the first one counts.
    pub(crate) fn set_worker(&self, kick: Box<dyn Fn() + Send + Sync>) {
        let _ = self.worker.set(kick);
    }

    /// Wake the background worker; false when there is none and the
    /// caller must do the work itself.
    pub(crate) fn kick_worker(&self) -> bool {
        match self.worker.get() {
            Some(kick) => {
                kick();
                true
            }
            None => false,
        }
    }

    /// Everything waiting, in block order.
    fn take(&self) -> Vec<u64> {
        let mut p = self.pending.lock();
        self.len.store(0, Ordering::Relaxed);
        p.drain_sorted()
    }

    /// Put back blocks a failed checkpoint did not write.
    fn restore(&self, blocks: impl IntoIterator<Item = u64>) {
        self.add(blocks);
    }

    /// Write the set home, in block order, adjacent blocks together — the
    /// `which` version of each (see the module doc). No flush: the caller
    /// flushes before it relies on the blocks being home.
    pub(crate) fn write_home<IO: Buffers<Buffer = B>>(&self, io: &IO, which: Versions) -> Result<(), IO::Error> {
        // The lock before the emptiness test: a checkpoint in flight (the
        // background worker's, or another caller's) has emptied the set
        // but not yet written what it took, and a sync that returned now
        // would flush the device before those writes.
        let _io = self.io.lock();
        if self.is_empty() {
            return Ok(());
        }
        let todo = self.take();
        let mut i = 0;
        while i < todo.len() {
            let (run, next) = self.next_run(io, &todo[i..], which);
            if let Err(e) = self.write_run(io, &run, which) {
                self.restore(todo[i..].iter().copied());
                return Err(e);
            }
            i += next;
        }
        Ok(())
    }

    /// The longest run of adjacent blocks from the start of `todo` whose
    /// version to write is dirty, and how many blocks of `todo` it used.
    fn next_run<IO: Buffers<Buffer = B>>(&self, io: &IO, todo: &[u64], which: Versions) -> (Vec<(u64, Arc<B>)>, usize) {
        let mut run: Vec<(u64, Arc<B>)> = Vec::new();
        let mut used = 0;
        while used < todo.len() && run.len() < MAX_RUN {
            let blk = todo[used];
            if let Some((last, _)) = run.last() {
                if blk != last + 1 {
                    break;
                }
            }
            used += 1;
            let cur = match which {
                // None when the block was freed since (never write it).
                Versions::Committed => self.committed.lock().get(&blk).map(|(v, _)| v.clone()),
                // A draft is published here: what is written is an
                // immutable version, and the next change starts a new
                // draft (once per block per checkpoint).
                Versions::Current => io.capture(blk),
            };
            match cur.filter(|v| v.is_dirty()) {
                Some(v) => run.push((blk, v)),
                // Clean (written since) or forgotten (freed): the run
                // ends here, the next block starts a new one.
                None => break,
            }
        }
        (run, used)
    }

    /// Write one run home and mark what it wrote clean.
    fn write_run<IO: Buffers<Buffer = B>>(
        &self,
        io: &IO,
        run: &[(u64, Arc<B>)],
        which: Versions,
    ) -> Result<(), IO::Error> {
        let Some((first, v)) = run.first() else {
            return Ok(());
        };
        let mut data = Vec::with_capacity(run.len() * v.data().len());
        for (_, v) in run {
            data.extend_from_slice(v.data());
        }
        io.write_home(*first, &data)?;
        for (blk, v) in run {
            // Only the version written becomes clean; a newer one was made
            // by a handle whose commit records it.
            io.written_home(*blk, v);
            if which == Versions::Committed {
                // Home: no longer the checkpoint's to keep.
                let mut c = self.committed.lock();
                if c.get(blk).is_some_and(|(cv, _)| Arc::ptr_eq(cv, v)) {
                    c.remove(blk);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Mem, MemBuffer};

    #[test]
    fn every_block_added_since_a_take_is_in_the_next_one() {
        let cp: Checkpoint<MemBuffer> = Checkpoint::default();
        // Repeats, both sides of a chunk boundary (511 | 512), and blocks
        // far apart (their own chunks): counted once each, taken in order.
        cp.add([5, 512, 5, 511, 512, 5, 1 << 40, 8, 1023, 1024]);
        assert_eq!(cp.len(), 7);
        assert_eq!(cp.take(), vec![5, 8, 511, 512, 1023, 1024, 1 << 40]);
        assert!(cp.is_empty());
        // The same blocks again, changed after the checkpoint took them:
        // a set that outlived the take would drop them, and their new
        // contents would never be written.
        cp.add([5, 8]);
        cp.restore([16]);
        assert_eq!(cp.take(), vec![5, 8, 16]);
        let mut want = std::collections::BTreeSet::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x % 97;
            want.insert(b);
            cp.add([b]);
        }
        assert_eq!(cp.take(), want.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_checkpoint_writes_runs_in_block_order_and_marks_them_clean() {
        let mem = Mem::new();
        let cp: Checkpoint<MemBuffer> = Checkpoint::default();
        for b in [12, 10, 11, 20] {
            mem.change(b, b as u8);
        }
        cp.add([12, 10, 11, 20]);
        cp.write_home(&mem, Versions::Current).unwrap();
        assert!(cp.is_empty());
        assert_eq!(
            mem.home_writes(),
            vec![(10, 3), (20, 1)],
            "adjacent blocks in one write, in block order"
        );
        for b in [10, 11, 12, 20] {
            assert_eq!(mem.home(b)[0], b as u8);
            assert!(!mem.capture(b).unwrap().is_dirty());
        }
    }

    #[test]
    fn a_failed_write_keeps_the_blocks_for_the_next_checkpoint() {
        let mem = Mem::new();
        let cp: Checkpoint<MemBuffer> = Checkpoint::default();
        mem.change(3, 1);
        mem.change(9, 2);
        cp.add([3, 9]);
        mem.fail_home_writes(true);
        assert!(cp.write_home(&mem, Versions::Current).is_err());
        assert_eq!(cp.len(), 2, "nothing written, nothing lost");
        mem.fail_home_writes(false);
        cp.write_home(&mem, Versions::Current).unwrap();
        assert_eq!((mem.home(3)[0], mem.home(9)[0]), (1, 2));
    }

    /// A checkpoint in flight has taken the set and is still writing: a
    /// second one (a sync) must wait for those writes, not find the set
    /// empty and return before them.
    #[test]
    fn a_sync_waits_for_the_checkpoint_in_flight() {
        let mem = Mem::new();
        let cp: Checkpoint<MemBuffer> = Checkpoint::default();
        for b in 0..3 {
            mem.change(100 + b, 7);
        }
        cp.add(100..103);
        let done = AtomicBool::new(false);
        let (taken_tx, taken_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let io = cp.io.lock();
                let todo = cp.take();
                taken_tx.send(todo.len()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
                done.store(true, Ordering::SeqCst);
                drop(io);
            });
            assert_eq!(taken_rx.recv().unwrap(), 3);
            assert!(cp.is_empty(), "the set is empty while its blocks are in flight");
            cp.write_home(&mem, Versions::Current).unwrap();
            assert!(
                done.load(Ordering::SeqCst),
                "checkpoint (and so sync) returned before the writes in flight ended"
            );
        });
    }

    /// Committed versions: the one the log holds is written, not a newer
    /// one; a free that commits drops the versions committed before it,
    /// not one committed with it.
    #[test]
    fn committed_versions_are_what_goes_home_until_a_free_commits() {
        let mem = Mem::new();
        let cp: Checkpoint<MemBuffer> = Checkpoint::default();
        mem.change(40, 1);
        mem.change(41, 1);
        mem.change(42, 1);
        let v: Vec<_> = [40, 41, 42].iter().map(|&b| (b, mem.capture(b).unwrap())).collect();
        cp.add_committed(7, &v);
        mem.change(40, 2); // a running transaction's change: not home yet
        cp.forget_committed(&[(41, 1)], 8); // freed by transaction 8
        let again = vec![(42, mem.capture(42).unwrap())];
        cp.add_committed(8, &again); // 42 used again by 8 itself...
        cp.forget_committed(&[(42, 1)], 8); // ...after 8 freed it
        cp.write_home(&mem, Versions::Committed).unwrap();
        assert_eq!(mem.home(40)[0], 1, "the committed version, not the newer one");
        assert_eq!(mem.home(41)[0], 0, "a freed block's old version never goes home");
        assert_eq!(
            mem.home(42)[0],
            1,
            "the version its freeing transaction committed stays"
        );
        assert!(mem.capture(40).unwrap().is_dirty(), "the newer version stays dirty");
    }
}
