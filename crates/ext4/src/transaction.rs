//! Transaction handles: every metadata change goes through one.
//!
//! A [`Handle`] gathers the metadata blocks an operation modifies. Each
//! block is changed under its block lock in the block's draft (a private
//! copy, see `buffer.rs`), published as a new immutable version when a
//! reader asks for it — so readers never see a half-made change to one
//! block, and wait for a writer only to publish its draft. A writer reads
//! an uncached block under the stripe lock, so no other writer's change to
//! it can land between the read and the draft.
//! `commit` hands the handle's blocks to the checkpoint (`checkpoint.rs`),
//! which writes them home in block order at sync, fsync or over budget.
//!
//! With a journal (a read-write volume with `has_journal`), a committed
//! handle's blocks join the running transaction instead (`commit.rs`),
//! which is written to the log before anything of it goes home; a handle
//! is a member of that transaction from `begin` to `commit`. Without one
//! (ext2, `^has_journal`) they go straight to the checkpoint set. No
//! caller sees the difference — which is why nothing in the engine writes
//! metadata except through a handle.

use super::error::annotate;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// An open transaction.
pub struct Handle<'v> {
    vol: &'v Volume,
    /// Blocks changed, each once (a handle changes a handful: a small
    /// vector beats a tree, which allocated a node per handle, and eight
    /// inline cover a create — bitmap, descriptor, inode-table block,
    /// leaf, the directory's own inode — without allocating at all).
    dirty: smallvec::SmallVec<[u64; 8]>,
    /// Membership of the running transaction (journaled volumes only):
    /// a commit cannot close the transaction while this handle is open.
    member: Option<super::commit::Membership<'v>>,
    /// Blocks this handle's allocations may draw from reservations made
    /// earlier (delayed allocation: writeback allocates what buffered
    /// writes reserved; see `reservation.rs`). Allocations up to it skip
    /// the free-space check; each block drawn leaves the volume's
    /// reservation count.
    reserved: u64,
    /// Whether this handle writes back delayed data (it was handed
    /// claims): an allocation beyond them — the map grew past its
    /// worst-case estimate — may use the root reserve, like the kernel's
    /// `EXT4_MB_USE_RESERVED`, rather than fail data already accepted.
    delalloc: bool,
    /// This thread's corruption count at `begin` (see `Drop`).
    damage_at_begin: u64,
}

impl std::fmt::Debug for Handle<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").field("dirty", &self.dirty).finish()
    }
}

impl Volume {
    /// Start a transaction; EROFS on a read-only volume.
    pub fn begin(&self) -> Result<Handle<'_>> {
        if self.read_only() {
            return Err(Error::posix(Errno::EROFS, "filesystem is read-only"));
        }
        if self.errors().failed() {
            return Err(self.errors().refused_after_error());
        }
        Ok(Handle {
            vol: self,
            dirty: smallvec::SmallVec::new(),
            member: self.jbd().map(|j| j.join()),
            reserved: 0,
            delalloc: false,
            damage_at_begin: crate::error::damage_seen(),
        })
    }
}

impl<'v> Handle<'v> {
    /// Let this handle's allocations draw `n` more blocks from the
    /// volume's claims (the caller holds that many claimed blocks and hands
    /// them over; what is left afterwards is [`Self::reserved_left`]).
    pub fn add_reserved(&mut self, n: u64) {
        self.reserved += n;
        self.delalloc = true;
    }

    /// Give back to the handle blocks drawn and not used.
    pub(crate) fn return_reserved(&mut self, n: u64) {
        self.reserved += n;
    }

    /// Whether claims were ever handed to this handle (writeback).
    pub(crate) fn writes_back_delayed(&self) -> bool {
        self.delalloc
    }

    /// Claimed blocks handed to this handle and not drawn by an allocation.
    pub fn reserved_left(&self) -> u64 {
        self.reserved
    }

    /// Draw up to `n` blocks from the handed-over claims; returns how many.
    pub(crate) fn draw_reserved(&mut self, n: u64) -> u64 {
        let k = n.min(self.reserved);
        self.reserved -= k;
        k
    }

    /// The volume this handle changes.
    pub fn volume(&self) -> &'v Volume {
        self.vol
    }

    /// Change metadata block `block` through `f`, under the block's lock.
    /// `f` sees the current bytes and edits them in place — in the block's
    /// draft, so it must return its error before changing anything.
    pub fn modify<R>(&mut self, block: u64, f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
        let vol = self.vol;
        let mut g = vol.bcache().lock(block);
        let r = vol.bcache().modify(
            &mut g,
            block,
            |g| vol.buffer_locked(g, block).map_err(|e| annotate(e, "metadata update")),
            f,
        )?;
        self.note(block);
        Ok(r)
    }

    /// Change the block holding the primary superblock (bytes 1024..2048:
    /// block 0, or block 1 with 1 KiB blocks) through `f`. Metadata
    /// pointers never name block 0, so [`Self::modify`] refuses it; this is
    /// the one way to it.
    pub(crate) fn modify_superblock_block<R>(&mut self, f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
        let vol = self.vol;
        let blk = ext4kit_format::superblock::SUPERBLOCK_OFFSET / vol.block_size() as u64;
        let mut g = vol.bcache().lock(blk);
        let r = vol.bcache().modify(
            &mut g,
            blk,
            |g| vol.bcache().get_locked(g, blk, |d| vol.disk().read_raw(blk, d)),
            f,
        )?;
        self.note(blk);
        Ok(r)
    }

    /// Replace a whole block without reading it first (a freshly allocated
    /// metadata block: directory block, extent node, bitmap being initialised).
    pub fn overwrite(&mut self, block: u64, data: Box<[u8]>) -> Result<()> {
        if data.len() != self.vol.block_size() {
            return Err(Error::posix(Errno::EINVAL, "overwrite with a partial block"));
        }
        let mut g = self.vol.bcache().lock(block);
        self.vol.bcache().install_draft(&mut g, block, data);
        self.note(block);
        Ok(())
    }

    fn note(&mut self, block: u64) {
        if !self.dirty.contains(&block) {
            self.dirty.push(block);
        }
    }

    /// Blocks this handle has changed.
    pub fn dirty_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.dirty.iter().copied()
    }

    /// Commit: the handle's changes are complete and consistent. Its blocks
    /// join the volume's dirty-metadata set and reach the disk at the next
    /// checkpoint (over budget, sync, fsync: see `checkpoint`).
    ///
    /// What a checkpoint writes is each block's *current* version, not the
    /// version this handle installed: another handle may have changed the
    /// same block since (two allocations in one bitmap), and writing our
    /// older snapshot after its newer one would undo its change on disk.
    /// This is jbd2's rule too — a buffer belongs to the running
    /// transaction, not to one handle.
    pub fn commit(mut self) -> Result<()> {
        let dirty = std::mem::take(&mut self.dirty);
        if !dirty.is_empty() {
            self.vol
                .metadata_changed()
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        match self.vol.jbd() {
            Some(j) => {
                let full = j.add(dirty, self.vol.dirty_meta().limit());
                // Out of the transaction before any commit it may trigger.
                self.member = None;
                // Past its limit the background worker commits it (jbd2's
                // kjournald); past twice that, or with no worker, we do.
                if full == 2 || full == 1 && !crate::flusher::kick(&self.vol.dirty_meta().flusher) {
                    self.vol.commit_running()?;
                }
                Ok(())
            }
            None => self.vol.commit_blocks(dirty),
        }
    }
}

/// A handle dropped without `commit` (an operation that failed part-way,
/// past what its undo could reach: a device error, say) still hands its
/// blocks to the checkpoint. Its drafts are already what readers see and
/// what the next writer of each block builds on; left out of the dirty
/// set they would be written only if some later handle happened to touch
/// the same block, and until then stay pinned in the cache as dirty. jbd2
/// likewise keeps a failed handle's buffers in the running transaction.
///
/// Except when the handle failed because of damage (a corruption error was
/// raised on this thread since `begin`): its half-made change must not be
/// committed. The volume enters the error state (`fs_errors.rs`): with a
/// journal the running transaction is abandoned (the journal is aborted),
/// without one the blocks are written as the kernel's ext2 would, and
/// every later write is refused until e2fsck.
impl Drop for Handle<'_> {
    fn drop(&mut self) {
        if !self.dirty.is_empty() && crate::error::damage_seen() != self.damage_at_begin {
            self.vol
                .fs_error("an operation met damage after it had begun changing the filesystem");
            if self.vol.jbd().is_some() {
                self.dirty.clear();
                return;
            }
        }
        if !self.dirty.is_empty() {
            self.vol
                .metadata_changed()
                .store(true, std::sync::atomic::Ordering::Relaxed);
            match self.vol.jbd() {
                Some(j) => {
                    j.add(self.dirty.drain(..), self.vol.dirty_meta().limit());
                }
                None => {
                    self.vol.dirty_meta().add(self.dirty.drain(..));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_dropped_handle_still_gets_its_blocks_written() {
        let v = crate::volume::scratch_volume_unjournaled();
        let blk = v.groups()[0].inode_table() + 40; // in the inode table, unused
        let before = v.buffer(blk).unwrap().data[7];
        {
            let mut h = v.begin().unwrap();
            h.modify(blk, |b| {
                b[7] ^= 0xa5;
                Ok(())
            })
            .unwrap();
            // An operation failing here returns without commit.
        }
        assert_eq!(v.dirty_meta().len(), 1, "the dropped handle's block is queued");
        v.checkpoint().unwrap();
        assert!(v.dirty_meta().is_empty());
        let mut raw = vec![0u8; v.block_size()];
        v.disk().read_raw(blk, &mut raw).unwrap();
        assert_eq!(raw[7], before ^ 0xa5, "the change reached the device");
    }
}
