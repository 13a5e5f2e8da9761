//! The jbd2 journal of ext4kit (the kernel's fs/jbd2): a whole journal —
//! handles and the running transaction, commit, checkpoint and revoke
//! records for a filesystem open for writing; loading a journal with
//! e2fsck's rules, recovery with the kernel's three passes, the scan of
//! the fast-commit area, and a listing of what the log holds.
//!
//! This crate knows the journal, not the filesystem. Writing, it is handed
//! the filesystem's metadata blocks through a [`Buffers`] implementation
//! (ext4's buffer cache, as the kernel's ext4 hands jbd2 `buffer_head`s):
//! a [`Jbd`] tells which blocks each [`Handle`] changed, captures their
//! versions at a commit, logs them, and writes them home at a checkpoint.
//! Recovering, it reads journal blocks through a [`JournalMap`] on a block
//! device and says which filesystem blocks replay would write from where
//! ([`Recovery`]). What to do with that — write home, or redirect in an
//! overlay so that a read-only open never touches the image — and what the
//! fast-commit records mean are the ext4 layer's business.
//!
//! Modules as the kernel's files: `transaction` (transaction.c), `commit`
//! (commit.c), `checkpoint` (checkpoint.c), `revoke` (revoke.c, recovery
//! side), `recovery` (recovery.c), `log` (the on-disk layout commit.c and
//! journal.c write), `journal` (journal.c's loading), `jbd` (`journal_t`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod buffers;
mod checkpoint;
pub mod commit;
pub mod jbd;
pub mod journal;
pub mod listing;
pub mod log;
pub mod recovery;
pub mod revoke;
pub mod transaction;

#[cfg(test)]
mod testing;

pub use buffers::{Buffer, Buffers, Error};
pub use commit::{JournalStats, DEFAULT_COMMIT_INTERVAL};
pub use jbd::Jbd;
pub use journal::{Journal, JournalMap, LoadError};
pub use listing::{list, Listing};
pub use log::{Committed, Log};
pub use recovery::{recover, Failure, Logged, Recovery};
pub use transaction::Handle;
