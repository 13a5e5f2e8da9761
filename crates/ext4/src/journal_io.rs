//! The ext4 side of the journal: what jbd2 sees of the filesystem
//! ([`ext4kit_jbd2::Buffers`]) — the buffer cache's block versions, the
//! bounded device, and the superblock's `needs_recovery` flag — as the
//! kernel's ext4 hands jbd2 its `buffer_head`s.
//!
//! [`MetaIo`] is a bundle of references to the volume's parts, built per
//! call (no state of its own), so the journal and the cache never hold
//! each other.

use std::sync::Arc;

use ext4kit_format::features::incompat;
use ext4kit_format::superblock::{Superblock, SUPERBLOCK_OFFSET};
use ext4kit_jbd2::Buffers;

use crate::buffer::{Buffer, BufferCache, StripeGuard};
use crate::disk::Disk;
use crate::error::{Error, Result};
use crate::owners::OwnerMap;
use crate::superblock::SuperState;
use ext4kit_cache::MemoryBudget;

/// The journal of a volume: jbd2's, over the buffer cache's versions.
pub type Journal = ext4kit_jbd2::Jbd<Buffer>;

/// The volume's parts a metadata change and its journal go through.
#[derive(Clone, Copy)]
pub(crate) struct MetaIo<'v> {
    parts: MetaParts<'v>,
}

/// The volume's parts a [`MetaIo`] is built over.
#[derive(Clone, Copy)]
pub(crate) struct MetaParts<'v> {
    pub(crate) bcache: &'v BufferCache,
    pub(crate) disk: &'v Disk,
    pub(crate) sup: &'v SuperState,
    pub(crate) budget: &'v MemoryBudget,
    /// Whether the journal's blocks are shared with a file (the log then
    /// refuses every write).
    pub(crate) owners: &'v OwnerMap,
    pub(crate) block_size: usize,
}

impl std::fmt::Debug for MetaIo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaIo")
            .field("block_size", &self.parts.block_size)
            .finish()
    }
}

impl<'v> MetaIo<'v> {
    /// The bundle over a volume's parts.
    pub(crate) fn new(parts: MetaParts<'v>) -> Self {
        MetaIo { parts }
    }

    /// The metadata buffer cache.
    #[inline]
    pub(crate) fn bcache(&self) -> &'v BufferCache {
        self.parts.bcache
    }

    /// The device and bounded raw block I/O.
    #[inline]
    pub(crate) fn disk(&self) -> &'v Disk {
        self.parts.disk
    }

    /// The in-memory superblock.
    #[inline]
    pub(crate) fn sup(&self) -> &'v SuperState {
        self.parts.sup
    }

    /// Bytes per block.
    #[inline]
    pub(crate) fn block_size(&self) -> usize {
        self.parts.block_size
    }

    /// A metadata block through the cache, for a caller holding its
    /// stripe lock (a pointer outside the filesystem is refused).
    pub(crate) fn buffer_locked(&self, g: &mut StripeGuard<'_>, block: u64) -> Result<Arc<Buffer>> {
        self.parts.disk.check_meta_block(block)?;
        self.parts
            .bcache
            .get_locked(g, block, |d| self.parts.disk.read_raw(block, d))
    }
}

impl ext4kit_jbd2::Buffer for Buffer {
    fn data(&self) -> &[u8] {
        &self.data
    }

    fn is_dirty(&self) -> bool {
        Buffer::is_dirty(self)
    }
}

impl Buffers for MetaIo<'_> {
    type Buffer = Buffer;
    type Error = Error;

    /// Under the block's stripe lock, so no writer is half-way through it
    /// (and none can be: a commit captures with no handle in flight).
    fn capture(&self, block: u64) -> Option<Arc<Buffer>> {
        let mut g = self.parts.bcache.lock(block);
        self.parts.bcache.peek_locked(&mut g, block)
    }

    fn written_home(&self, block: u64, version: &Arc<Buffer>) {
        let _g = self.parts.bcache.lock(block);
        version.mark_clean();
    }

    fn write_home(&self, block: u64, data: &[u8]) -> Result<()> {
        self.parts.disk.write_meta_raw(block, data)
    }

    fn flush(&self) -> Result<()> {
        self.parts
            .disk
            .device()
            .flush()
            .map_err(|e| Error::io("flushing the device", e))
    }

    /// Set or clear `needs_recovery` in the superblock at home, changing
    /// nothing else of it: the home copy is the last checkpointed one, and
    /// the in-memory superblock may hold changes no transaction has
    /// committed yet, which must not reach the disk outside the log.
    fn set_needs_recovery(&self, on: bool) -> Result<()> {
        let _g = self.parts.sup.update_lock();
        let mut raw = vec![0u8; Superblock::SIZE];
        self.parts
            .disk
            .device()
            .read_at(SUPERBLOCK_OFFSET, &mut raw)
            .map_err(|e| Error::io("reading the superblock", e))?;
        let mut sb = Superblock::parse(&raw).map_err(|e| Error::corrupt("superblock at byte 1024", e))?;
        if on {
            sb.feature_incompat |= incompat::RECOVER;
        } else {
            sb.feature_incompat &= !incompat::RECOVER;
        }
        self.parts
            .disk
            .device()
            .write_at(SUPERBLOCK_OFFSET, &sb.to_bytes_with_checksum())
            .map_err(|e| Error::io("writing the superblock", e))
    }

    /// Half the buffer cache's current limit may wait for a checkpoint.
    /// The more blocks wait, the more changes each write carries: a create
    /// storm in a directory larger than this (1,000,000 names is ~8,700
    /// leaf blocks, dirtied in hash order) writes about one leaf per
    /// create at any threshold below the directory's size, and the
    /// threshold sets how many creates share one. More than half would
    /// leave too little room for clean blocks (dirty ones are never
    /// evicted). With file pages idle, that is 96 MiB of a 256 MiB budget,
    /// which holds such a directory.
    fn checkpoint_limit(&self) -> usize {
        (self.parts.budget.buffer_limit() / 2 / self.parts.block_size).max(16)
    }

    /// Refused when the owner scan found a journal block named by another
    /// inode too (`owner_scan.rs`).
    fn check_log_writable(&self) -> Result<()> {
        self.parts.owners.check_journal()
    }
}

impl From<ext4kit_jbd2::Error> for Error {
    fn from(e: ext4kit_jbd2::Error) -> Self {
        match e {
            ext4kit_jbd2::Error::Aborted => Error::corrupt_msg(
                "filesystem",
                "error state",
                "the journal was aborted when damage was found part-way through a change: nothing more is committed",
            ),
            ext4kit_jbd2::Error::Log { what, source } => Error::io(what, source),
        }
    }
}

#[cfg(test)]
mod tests {
    use ext4kit_format::features::incompat;

    use crate::volume::{scratch_volume, Volume};

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

    /// Through the buffer cache's drafts and ext4's superblock: a commit
    /// logs the block (needs_recovery at home first), a checkpoint puts it
    /// home and empties the log, a close clears the flag.
    #[test]
    fn a_commit_puts_the_blocks_in_the_log_and_only_a_checkpoint_puts_them_home() {
        let v = scratch_volume();
        assert!(v.jbd().is_journaled(), "the scratch volume has a journal");
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

    /// A commit captures each block's draft published: what the log holds
    /// is the bytes the handles made, and a later change (a new draft) is
    /// not in it.
    #[test]
    fn a_commit_logs_the_drafts_as_of_its_close() {
        let v = scratch_volume();
        let blk = spare_block(&v, 1);
        change(&v, blk, 1);
        change(&v, blk, 2);
        v.commit_running().unwrap();
        change(&v, blk, 3);
        let plan = replay_plan(&v);
        let j = crate::journal::open_journal(v.disk().device()).unwrap();
        let mut logged = vec![0u8; v.block_size()];
        j.read_block(plan.replay[&blk].log_block, &mut logged).unwrap();
        assert_eq!(logged[9], 2, "the version as of the commit");
        assert_eq!(v.buffer(blk).unwrap().data[9], 3);
    }
}
