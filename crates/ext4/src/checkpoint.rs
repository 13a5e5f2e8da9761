//! Checkpoint: writing committed metadata blocks to their home location.
//!
//! A committed handle does not write its blocks; it adds them to the
//! volume's dirty-metadata set and leaves them dirty in the buffer cache
//! (where dirty buffers are never evicted). The set is written back in
//! block order — adjacent blocks in one device write — when it passes its
//! budget, and by every sync and fsync before the device is flushed. This
//! is jbd2's split between commit and checkpoint, with the log step still
//! to come: a create touches the same inode-table, bitmap, descriptor and
//! directory blocks as the creates before it, so writing at commit cost
//! five device writes per create and made seed 004's experiment measure
//! the host's write path instead of our htree.
//!
//! Durability is unchanged where it is promised: sync(2), fsync and
//! fdatasync write every dirty metadata block before the device flush
//! (with a journal, fsync commits the whole running transaction too).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::buffer::Buffer;
use super::volume::Volume;
use crate::budget::MemoryBudget;
use crate::error::Result;

/// Longest run of adjacent blocks written with one device write.
const MAX_RUN: usize = 256;

/// Metadata blocks committed but not yet written home.
#[derive(Debug)]
pub struct DirtyMeta {
    /// Most commits re-add blocks already waiting (the same directory
    /// leaf, descriptor, bitmap): see [`Pending`].
    blocks: parking_lot::Mutex<Pending>,
    len: AtomicUsize,
    /// Past half of the buffer cache's current limit, a commit checkpoints.
    budget: Arc<MemoryBudget>,
    block_size: usize,
    /// Held for a whole checkpoint, and by `forget_freed` (balloc.rs): a block
    /// freed (and perhaps reused for file data) while a checkpoint is
    /// writing its old metadata contents would otherwise be overwritten
    /// after the new data lands.
    pub(crate) io: parking_lot::Mutex<()>,
    /// The background worker that checkpoints for us (`crate::flusher`).
    pub flusher: crate::flusher::Slot,
    /// The last background checkpoint failed: the next commit checkpoints
    /// itself, so that the error reaches a caller.
    failed: std::sync::atomic::AtomicBool,
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

impl DirtyMeta {
    /// A set that asks for a checkpoint past half the buffers' limit.
    pub fn new(budget: Arc<MemoryBudget>, block_size: usize) -> Self {
        DirtyMeta {
            blocks: parking_lot::Mutex::new(Pending::default()),
            len: AtomicUsize::new(0),
            budget,
            block_size,
            io: parking_lot::Mutex::new(()),
            flusher: Default::default(),
            failed: Default::default(),
        }
    }

    /// Blocks past which a commit checkpoints.
    pub fn limit(&self) -> usize {
        (self.budget.buffer_limit() / 2 / self.block_size).max(16)
    }

    /// Record committed blocks; true when the set is over its limit.
    pub fn add(&self, blocks: impl IntoIterator<Item = u64>) -> bool {
        let mut p = self.blocks.lock();
        for b in blocks {
            p.insert(b);
        }
        self.len.store(p.len, Ordering::Relaxed);
        p.len > self.limit()
    }

    /// Blocks waiting to be written.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Everything waiting, in block order.
    fn take(&self) -> Vec<u64> {
        let mut p = self.blocks.lock();
        self.len.store(0, Ordering::Relaxed);
        p.drain_sorted()
    }

    /// Put back blocks a failed checkpoint did not write.
    fn restore(&self, blocks: impl IntoIterator<Item = u64>) {
        // Whether it is over the limit again is the next commit's question.
        let _ = self.add(blocks);
    }
}

impl Volume {
    /// Write every committed metadata block home, in block order, adjacent
    /// blocks together. What is written is each block's current version
    /// (see `Handle::commit`); a version replaced while its write was in
    /// flight stays dirty for the next checkpoint. On a device error the
    /// unwritten blocks stay in the set and stay dirty, so nothing is lost
    /// and the next sync tries again.
    ///
    /// With a journal it also empties the log afterwards (see `commit.rs`):
    /// the blocks written are the committed versions, after a flush the
    /// log no longer needs them.
    pub fn checkpoint(&self) -> Result<()> {
        if self.read_only() {
            return Ok(());
        }
        match self.jbd() {
            Some(j) => self.checkpoint_journaled(j),
            None => self.checkpoint_home(),
        }
    }

    /// Write the checkpoint set home (no flush, no log change): the
    /// current version of each block without a journal, its committed
    /// version with one.
    pub(crate) fn checkpoint_home(&self) -> Result<()> {
        // The lock before the emptiness test: a checkpoint in flight (the
        // background worker's, or another caller's) has emptied the set
        // but not yet written what it took, and a sync that returned now
        // would flush the device before those writes.
        let _io = self.dirty_meta().io.lock();
        if self.dirty_meta().is_empty() {
            return Ok(());
        }
        let todo = self.dirty_meta().take();
        let mut i = 0;
        while i < todo.len() {
            // One run: adjacent blocks whose current version is dirty.
            let mut run: Vec<(u64, Arc<Buffer>)> = Vec::new();
            let mut j = i;
            while j < todo.len() && run.len() < MAX_RUN {
                let blk = todo[j];
                if let Some((last, _)) = run.last() {
                    if blk != last + 1 {
                        break;
                    }
                }
                j += 1;
                let cur = match self.jbd() {
                    // The version the log holds: a newer one may carry
                    // changes of a transaction not yet committed. None
                    // when the block was freed since (never write it).
                    Some(j) => j.committed_versions.lock().get(&blk).cloned().filter(|b| b.is_dirty()),
                    None => {
                        // A draft is published here: what is written is an
                        // immutable version, and the next change starts a
                        // new draft (once per block per checkpoint).
                        let mut g = self.bcache().lock(blk);
                        self.bcache().peek_locked(&mut g, blk).filter(|b| b.is_dirty())
                    }
                };
                match cur {
                    Some(b) => run.push((blk, b)),
                    // Clean (written since) or forgotten (freed): the run
                    // ends here, the next block starts a new one.
                    None => break,
                }
            }
            if let Some(&(first, _)) = run.first() {
                let mut data = Vec::with_capacity(run.len() * self.block_size());
                for (_, b) in &run {
                    data.extend_from_slice(&b.data);
                }
                if let Err(e) = self.disk().write_meta_raw(first, &data) {
                    self.dirty_meta().restore(todo[i..].iter().copied());
                    return Err(e);
                }
                for (blk, b) in &run {
                    let _g = self.bcache().lock(*blk);
                    // Only the version we wrote becomes clean; a newer one
                    // (or a draft started since) was made by a handle whose
                    // commit records it.
                    if let Some(j) = self.jbd() {
                        // The committed version is home: clean, and no
                        // longer the checkpoint's to keep.
                        b.mark_clean();
                        let mut cv = j.committed_versions.lock();
                        if cv.get(blk).is_some_and(|c| Arc::ptr_eq(c, b)) {
                            cv.remove(blk);
                        }
                    } else if self.bcache().is_current(*blk, b) {
                        b.mark_clean();
                    }
                }
            }
            i = j;
        }
        Ok(())
    }

    /// Record the blocks of a committed handle. Over budget, the
    /// background worker checkpoints (see `crate::flusher`); past half as
    /// much again — the worker is behind — or after the worker failed, the
    /// commit does it and returns what it meets.
    pub(crate) fn commit_blocks(&self, blocks: impl IntoIterator<Item = u64>) -> Result<()> {
        let dm = self.dirty_meta();
        if dm.add(blocks) {
            let limit = dm.limit();
            if dm.len() > limit + limit / 2 || dm.failed.load(Ordering::Relaxed) || !crate::flusher::kick(&dm.flusher) {
                let r = self.checkpoint();
                dm.failed.store(r.is_err(), Ordering::Relaxed);
                r?;
            }
        }
        Ok(())
    }

    /// The background worker's pass: checkpoint if over budget. A failure
    /// leaves the blocks dirty (see `checkpoint`) and hands the retry,
    /// and the error, to the next commit.
    pub fn checkpoint_if_over(&self) {
        let dm = self.dirty_meta();
        if dm.len() > dm.limit() && self.checkpoint().is_err() {
            dm.failed.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_added_since_a_take_is_in_the_next_one() {
        let dm = DirtyMeta::new(Arc::new(MemoryBudget::fixed(1 << 30, 1 << 20)), 4096);
        // Repeats, both sides of a chunk boundary (511 | 512), and blocks
        // far apart (their own chunks): counted once each, taken in order.
        dm.add([5, 512, 5, 511, 512, 5, 1 << 40, 8, 1023, 1024]);
        assert_eq!(dm.len(), 7);
        assert_eq!(dm.take(), vec![5, 8, 511, 512, 1023, 1024, 1 << 40]);
        assert!(dm.is_empty());
        // The same blocks again, changed after the checkpoint took them:
        // a set that outlived the take would drop them, and their new
        // contents would never be written.
        dm.add([5, 8]);
        dm.restore([16]);
        assert_eq!(dm.take(), vec![5, 8, 16]);
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x2545_f491_4f6c_dd1d);
        let mut want = std::collections::BTreeSet::new();
        for _ in 0..5000 {
            let b = rng.random_range(0..97u64);
            want.insert(b);
            dm.add([b]);
        }
        assert_eq!(dm.take(), want.into_iter().collect::<Vec<_>>());
    }

    /// Change blocks `blocks` counted from past the used start of the
    /// inode table, in one committed handle each (the fixture's image is
    /// thrown away: what the blocks held does not matter).
    fn commit_changes(v: &Volume, blocks: std::ops::Range<u64>) {
        let first = v.groups()[0].inode_table() + 100;
        for b in blocks {
            let mut h = v.begin().unwrap();
            h.modify(first + b, |d| {
                d[3] ^= 0x5a;
                Ok(())
            })
            .unwrap();
            h.commit().unwrap();
        }
    }

    #[test]
    fn a_sync_waits_for_the_checkpoint_in_flight() {
        let v = crate::volume::scratch_volume_unjournaled();
        commit_changes(&v, 0..3);
        let done = std::sync::atomic::AtomicBool::new(false);
        let (taken_tx, taken_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                // A checkpoint that has taken the set and is still writing.
                let io = v.dirty_meta().io.lock();
                let todo = v.dirty_meta().take();
                taken_tx.send(todo.len()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
                done.store(true, Ordering::SeqCst);
                drop(io);
            });
            assert_eq!(taken_rx.recv().unwrap(), 3);
            assert!(
                v.dirty_meta().is_empty(),
                "the set is empty while its blocks are in flight"
            );
            v.checkpoint().unwrap();
            assert!(
                done.load(Ordering::SeqCst),
                "checkpoint (and so sync) returned before the writes in flight ended"
            );
        });
    }

    #[test]
    fn commits_checkpoint_themselves_when_the_worker_is_behind() {
        let v = crate::volume::scratch_volume_unjournaled();
        // A worker that never runs: every kick is left unanswered.
        let idle = Arc::new(crate::flusher::Signal::default());
        v.dirty_meta().flusher.set(idle).unwrap();
        let limit = v.dirty_meta().limit() as u64;
        commit_changes(&v, 0..limit + 1);
        assert_eq!(
            v.dirty_meta().len() as u64,
            limit + 1,
            "over the limit: the worker was asked"
        );
        commit_changes(&v, limit + 1..2 * limit);
        assert!(
            v.dirty_meta().len() as u64 <= limit + limit / 2 + 1,
            "{} blocks dirty for a limit of {limit}: commits must checkpoint when the worker falls behind",
            v.dirty_meta().len()
        );
        // A failed background pass hands the next commit the checkpoint.
        v.dirty_meta().failed.store(true, Ordering::Relaxed);
        commit_changes(&v, 0..limit + 2);
        assert!(!v.dirty_meta().failed.load(Ordering::Relaxed));
        assert!(
            (v.dirty_meta().len() as u64) < limit + 2,
            "the commit past the limit checkpointed"
        );
    }
}
