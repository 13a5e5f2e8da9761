//! Transaction handles: every metadata change goes through one.
//!
//! A [`Handle`] gathers the metadata blocks an operation modifies. Each
//! block is changed under its block lock in the block's draft (a private
//! copy, see `buffer.rs`), published as a new immutable version when a
//! reader asks for it — so readers never see a half-made change to one
//! block, and wait for a writer only to publish its draft. A writer reads
//! an uncached block under the stripe lock, so no other writer's change to
//! it can land between the read and the draft.
//!
//! The handle wraps jbd2's ([`ext4kit_jbd2::Handle`]), which notes the
//! blocks and holds the handle's membership of the running transaction:
//! `commit` stops it, and the blocks join the running transaction, which
//! is written to the log before anything of it goes home (see jbd2's
//! commit.rs); without a journal (ext2, `^has_journal`) they go straight
//! to the checkpoint set. No caller sees the difference — which is why
//! nothing in the engine writes metadata except through a handle. What
//! this wrapper adds is ext4's: the delayed-allocation reservations a
//! handle may draw from, and the damage rule of its drop.

use std::sync::atomic::{AtomicBool, Ordering};

use super::error::annotate;
use crate::error::{Errno, Error, Result};
use crate::fs_errors::FsErrors;
use crate::journal_io::{Journal, MetaIo};

/// An open transaction.
pub struct Handle<'v> {
    io: MetaIo<'v>,
    jbd: &'v Journal,
    /// jbd2's handle: the blocks changed, and the membership of the
    /// running transaction.
    jh: ext4kit_jbd2::Handle<'v, crate::buffer::Buffer>,
    errors: &'v FsErrors,
    /// The volume's "some handle changed metadata" flag.
    changed: &'v AtomicBool,
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
        f.debug_struct("Handle").field("jh", &self.jh).finish()
    }
}

impl<'v> Handle<'v> {
    /// Start a transaction over the volume's parts: `io` to change blocks
    /// through, the journal `jbd`, its error state and "metadata changed"
    /// flag. The caller (`Volume::begin`) has checked that writes are
    /// allowed.
    pub(crate) fn begin(io: MetaIo<'v>, jbd: &'v Journal, errors: &'v FsErrors, changed: &'v AtomicBool) -> Self {
        Handle {
            io,
            jbd,
            jh: jbd.begin(),
            errors,
            changed,
            reserved: 0,
            delalloc: false,
            damage_at_begin: crate::error::damage_seen(),
        }
    }

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

    /// Change metadata block `block` through `f`, under the block's lock.
    /// `f` sees the current bytes and edits them in place — in the block's
    /// draft, so it must return its error before changing anything.
    pub fn modify<R>(&mut self, block: u64, f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
        let io = self.io;
        let mut g = io.bcache().lock(block);
        let r = io.bcache().modify(
            &mut g,
            block,
            |g| io.buffer_locked(g, block).map_err(|e| annotate(e, "metadata update")),
            f,
        )?;
        self.jh.note(block);
        Ok(r)
    }

    /// Change the block holding the primary superblock (bytes 1024..2048:
    /// block 0, or block 1 with 1 KiB blocks) through `f`. Metadata
    /// pointers never name block 0, so [`Self::modify`] refuses it; this is
    /// the one way to it.
    pub(crate) fn modify_superblock_block<R>(&mut self, f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
        let io = self.io;
        let blk = ext4kit_format::superblock::SUPERBLOCK_OFFSET / io.block_size() as u64;
        let mut g = io.bcache().lock(blk);
        let r = io.bcache().modify(
            &mut g,
            blk,
            |g| io.bcache().get_locked(g, blk, |d| io.disk().read_raw(blk, d)),
            f,
        )?;
        self.jh.note(blk);
        Ok(r)
    }

    /// Replace a whole block without reading it first (a freshly allocated
    /// metadata block: directory block, extent node, bitmap being initialised).
    pub fn overwrite(&mut self, block: u64, data: Box<[u8]>) -> Result<()> {
        if data.len() != self.io.block_size() {
            return Err(Error::posix(Errno::EINVAL, "overwrite with a partial block"));
        }
        let mut g = self.io.bcache().lock(block);
        self.io.bcache().install_draft(&mut g, block, data);
        self.jh.note(block);
        Ok(())
    }

    /// Blocks this handle has changed.
    pub fn dirty_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.jh.blocks()
    }

    /// Commit: the handle's changes are complete and consistent. Its blocks
    /// join the running transaction (see [`ext4kit_jbd2::Jbd::stop`]), or
    /// without a journal the checkpoint set, and reach home at a later
    /// checkpoint (over budget, sync, fsync).
    pub fn commit(mut self) -> Result<()> {
        if !self.jh.is_empty() {
            self.changed.store(true, Ordering::Relaxed);
        }
        self.jbd.stop(&mut self.jh, &self.io)
    }
}

/// A handle dropped without `commit` (an operation that failed part-way,
/// past what its undo could reach: a device error, say) still hands its
/// blocks over (jbd2's handle does, see there).
///
/// Except when the handle failed because of damage (a corruption error was
/// raised on this thread since `begin`): its half-made change must not be
/// committed. The volume enters the error state (`fs_errors.rs`): with a
/// journal the running transaction is abandoned (the journal is aborted),
/// without one the blocks are written as the kernel's ext2 would, and
/// every later write is refused until e2fsck.
impl Drop for Handle<'_> {
    fn drop(&mut self) {
        if self.jh.is_empty() {
            return;
        }
        if crate::error::damage_seen() != self.damage_at_begin {
            // The journal first: nothing of the half-made change may commit
            // while the error is being recorded.
            let journaled = self.jh.abort();
            self.errors.record(
                "an operation met damage after it had begun changing the filesystem",
                self.io.sup(),
                self.io.disk(),
            );
            if journaled {
                return;
            }
        }
        self.changed.store(true, Ordering::Relaxed);
        // jbd2's handle hands the blocks over as it drops.
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
        assert_eq!(v.jbd().checkpoint_len(), 1, "the dropped handle's block is queued");
        v.checkpoint().unwrap();
        assert_eq!(v.jbd().checkpoint_len(), 0);
        let mut raw = vec![0u8; v.block_size()];
        v.disk().read_raw(blk, &mut raw).unwrap();
        assert_eq!(raw[7], before ^ 0xa5, "the change reached the device");
    }
}
