//! Transaction handles: every metadata change goes through one.
//!
//! A [`Handle`] gathers the metadata blocks an operation modifies. Each
//! block is changed copy-on-write under its block lock — read the current
//! version, modify a private copy, install it in the buffer cache — so
//! readers never block and never see a half-made change to one block.
//! `commit` hands the handle's blocks to the checkpoint (`checkpoint.rs`),
//! which writes them home in block order at sync, fsync or over budget.
//!
//! Today there is no log step (no journal: an operation's blocks reach the
//! disk at a checkpoint, not atomically). The journal issue turns commit
//! into "log to jbd2" without changing any caller — that is why nothing in
//! the engine writes metadata except through a handle.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::buffer::Buffer;
use super::volume::{annotate, Volume};
use crate::error::{Errno, Error, Result};

/// An open transaction.
pub struct Handle<'v> {
    vol: &'v Volume,
    dirty: BTreeMap<u64, Arc<Buffer>>,
}

impl std::fmt::Debug for Handle<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("dirty", &self.dirty.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Volume {
    /// Start a transaction; EROFS on a read-only volume.
    pub fn begin(&self) -> Result<Handle<'_>> {
        if self.read_only {
            return Err(Error::posix(Errno::EROFS, "filesystem is read-only"));
        }
        Ok(Handle {
            vol: self,
            dirty: BTreeMap::new(),
        })
    }
}

impl<'v> Handle<'v> {
    /// The volume this handle changes.
    pub fn volume(&self) -> &'v Volume {
        self.vol
    }

    /// Change metadata block `block` through `f` (copy-on-write under the
    /// block's lock). `f` sees the current bytes and edits them in place.
    pub fn modify<R>(&mut self, block: u64, f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
        let _g = self.vol.block_locks.lock(block);
        let cur = self.vol.buffer(block).map_err(|e| annotate(e, "metadata update"))?;
        let mut copy: Box<[u8]> = cur.data.clone();
        let r = f(&mut copy)?;
        let b = self.vol.bcache.replace(block, copy);
        self.dirty.insert(block, b);
        Ok(r)
    }

    /// Replace a whole block without reading it first (a freshly allocated
    /// metadata block: directory block, extent node, bitmap being initialised).
    pub fn overwrite(&mut self, block: u64, data: Box<[u8]>) -> Result<()> {
        if data.len() != self.vol.block_size {
            return Err(Error::posix(Errno::EINVAL, "overwrite with a partial block"));
        }
        let _g = self.vol.block_locks.lock(block);
        let b = self.vol.bcache.replace(block, data);
        self.dirty.insert(block, b);
        Ok(())
    }

    /// Blocks this handle has changed.
    pub fn dirty_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.dirty.keys().copied()
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
    pub fn commit(self) -> Result<()> {
        self.vol.commit_blocks(self.dirty.keys().copied())
    }
}
