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
    /// Unordered: most commits re-add blocks already waiting (the same
    /// directory leaf, descriptor, bitmap), and a hash set answers that in
    /// O(1) where a tree of 24,000 blocks walked cold nodes; the
    /// checkpoint sorts what it takes.
    blocks: parking_lot::Mutex<foldhash::HashSet<u64>>,
    len: AtomicUsize,
    /// Past half of the buffer cache's current limit, a commit checkpoints.
    budget: Arc<MemoryBudget>,
    block_size: usize,
    /// Held for a whole checkpoint, and by `forget_freed` (balloc.rs): a block
    /// freed (and perhaps reused for file data) while a checkpoint is
    /// writing its old metadata contents would otherwise be overwritten
    /// after the new data lands.
    pub(crate) io: parking_lot::Mutex<()>,
}

impl DirtyMeta {
    /// A set that asks for a checkpoint past half the buffers' limit.
    pub fn new(budget: Arc<MemoryBudget>, block_size: usize) -> Self {
        DirtyMeta {
            blocks: parking_lot::Mutex::default(),
            len: AtomicUsize::new(0),
            budget,
            block_size,
            io: parking_lot::Mutex::new(()),
        }
    }

    /// Blocks past which a commit checkpoints.
    pub fn limit(&self) -> usize {
        (self.budget.buffer_limit() / 2 / self.block_size).max(16)
    }

    /// Record committed blocks; true when the set is over its limit.
    pub fn add(&self, blocks: impl IntoIterator<Item = u64>) -> bool {
        let mut set = self.blocks.lock();
        set.extend(blocks);
        self.len.store(set.len(), Ordering::Relaxed);
        set.len() > self.limit()
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
        let set = {
            let mut set = self.blocks.lock();
            self.len.store(0, Ordering::Relaxed);
            std::mem::take(&mut *set)
        };
        let mut v: Vec<u64> = set.into_iter().collect();
        v.sort_unstable();
        v
    }

    /// Put back blocks a failed checkpoint did not write.
    fn restore(&self, blocks: impl IntoIterator<Item = u64>) {
        let mut set = self.blocks.lock();
        set.extend(blocks);
        self.len.store(set.len(), Ordering::Relaxed);
    }
}

impl Volume {
    /// Write every committed metadata block home, in block order, adjacent
    /// blocks together. What is written is each block's current version
    /// (see `Handle::commit`); a version replaced while its write was in
    /// flight stays dirty for the next checkpoint. On a device error the
    /// unwritten blocks stay in the set and stay dirty, so nothing is lost
    /// and the next sync tries again.
    pub fn checkpoint(&self) -> Result<()> {
        if self.dirty_meta.is_empty() || self.read_only {
            return Ok(());
        }
        let _io = self.dirty_meta.io.lock();
        let todo = self.dirty_meta.take();
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
                let cur = {
                    // A draft is published here: what is written is an
                    // immutable version, and the next change starts a new
                    // draft (once per block per checkpoint).
                    let mut g = self.bcache.lock(blk);
                    self.bcache.peek_locked(&mut g, blk).filter(|b| b.is_dirty())
                };
                match cur {
                    Some(b) => run.push((blk, b)),
                    // Clean (written since) or forgotten (freed): the run
                    // ends here, the next block starts a new one.
                    None => break,
                }
            }
            if let Some(&(first, _)) = run.first() {
                let mut data = Vec::with_capacity(run.len() * self.block_size);
                for (_, b) in &run {
                    data.extend_from_slice(&b.data);
                }
                if let Err(e) = self.write_raw(first, &data) {
                    self.dirty_meta.restore(todo[i..].iter().copied());
                    return Err(e);
                }
                for (blk, b) in &run {
                    let _g = self.bcache.lock(*blk);
                    // Only the version we wrote becomes clean; a newer one
                    // (or a draft started since) was made by a handle whose
                    // commit records it.
                    if self.bcache.is_current(*blk, b) {
                        b.mark_clean();
                    }
                }
            }
            i = j;
        }
        Ok(())
    }

    /// Record the blocks of a committed handle; checkpoint when over budget.
    pub(crate) fn commit_blocks(&self, blocks: impl IntoIterator<Item = u64>) -> Result<()> {
        if self.dirty_meta.add(blocks) {
            self.checkpoint()?;
        }
        Ok(())
    }
}
