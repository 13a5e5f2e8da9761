//! What the journal needs of the filesystem under it: the contract
//! between jbd2 and ext4's buffer cache (the kernel hands jbd2
//! `buffer_head`s; we hand it a [`Buffers`] implementation).
//!
//! The journal never reads or changes a metadata block's bytes itself. It
//! is told which blocks a handle changed ([`crate::Handle::note`]), and
//! at a commit it asks the cache for each block's current version
//! ([`Buffers::capture`]) — an immutable snapshot it keeps, logs, and
//! later writes home. Everything else it asks of the filesystem is I/O at
//! home and the one superblock flag that makes a log worth reading.
//!
//! Ordering promises, on which atomicity rests:
//!
//! - a version returned by `capture` never changes afterwards: a writer
//!   changing the block makes a new version (ext4's drafts, published as
//!   new buffers);
//! - `write_home` returns once the device accepted the write, which may
//!   still sit in a volatile cache: only a later [`Buffers::flush`] that
//!   returns `Ok` makes it durable — and the journal counts on exactly
//!   that, flushing home writes before it empties the log;
//! - `set_needs_recovery(true)` writes the flag home without flushing: the
//!   journal issues the flush that makes it durable (the log's own flush,
//!   before any commit block of an empty log is written);
//! - none of these calls may begin a handle or wait for one: commits call
//!   them with the running transaction closed to new handles.

use std::io;
use std::sync::Arc;

/// One version of a metadata block as the filesystem's cache holds it:
/// immutable bytes and whether they still have to reach home.
pub trait Buffer: Send + Sync {
    /// The block's bytes (a whole block).
    fn data(&self) -> &[u8];

    /// Whether this version still has to be written home. A version the
    /// filesystem wrote home by other means (or forgot) is skipped by a
    /// checkpoint.
    fn is_dirty(&self) -> bool;
}

/// The filesystem's side of the journal (see the module doc for the
/// ordering it must keep). ext4 implements it over its buffer cache, its
/// device and its superblock; the tests of this crate over memory.
pub trait Buffers {
    /// A block version.
    type Buffer: Buffer;
    /// The filesystem's error, which the journal's own failures convert
    /// into.
    type Error: From<Error>;

    /// The current version of `block`, any unpublished change published
    /// first; `None` when the block is no longer cached (it was freed and
    /// forgotten since a handle changed it). A commit calls it with no
    /// handle in flight; a checkpoint without a journal at any time.
    fn capture(&self, block: u64) -> Option<Arc<Self::Buffer>>;

    /// `version` of `block` is now at home (written and flushed, or to be
    /// flushed by the caller before anything relies on it): mark it clean,
    /// so that the cache may evict it. A newer version of the block stays
    /// dirty.
    fn written_home(&self, block: u64, version: &Arc<Self::Buffer>);

    /// Write whole blocks `data` at `block` and following, at home.
    fn write_home(&self, block: u64, data: &[u8]) -> Result<(), Self::Error>;

    /// Make every write that returned before this call durable.
    fn flush(&self) -> Result<(), Self::Error>;

    /// Set or clear the filesystem's "the log holds transactions" flag at
    /// home (ext4's `needs_recovery`), changing nothing else there: neither
    /// the kernel nor e2fsck reads a log without it. Not flushed here.
    fn set_needs_recovery(&self, on: bool) -> Result<(), Self::Error>;

    /// How many blocks the checkpoint set may hold before it is written
    /// home (the filesystem's memory budget for dirty metadata).
    fn checkpoint_limit(&self) -> usize;

    /// Whether the log may be written at all: a filesystem that found one
    /// of the journal's blocks named by a file too (cross-linked) refuses,
    /// since every log write could change what that file holds. Asked
    /// before a commit writes anything; a refused commit leaves its
    /// transaction running. Yes unless the filesystem says otherwise.
    fn check_log_writable(&self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// What the journal's own machinery can fail with.
#[derive(Debug)]
pub enum Error {
    /// The journal was aborted (`jbd2_journal_abort`): nothing more is
    /// committed or checkpointed, so the disk keeps the last committed
    /// state.
    Aborted,
    /// Writing the log failed.
    Log {
        /// What was being written.
        what: String,
        /// The device's error.
        source: io::Error,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Aborted => write!(f, "the journal was aborted: nothing more is committed"),
            Error::Log { what, source } => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Aborted => None,
            Error::Log { source, .. } => Some(source),
        }
    }
}
