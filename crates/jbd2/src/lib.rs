//! The jbd2 journal of ext4kit (the kernel's fs/jbd2): loading a journal
//! with e2fsck's rules, recovery with the kernel's three passes, the scan
//! of the fast-commit area, and a listing of what the log holds.
//!
//! This crate knows the journal, not the filesystem: it reads journal
//! blocks through a [`JournalMap`] on a block device and says which
//! filesystem blocks replay would write from where ([`Recovery`]). What to
//! do with that — write home, or redirect in an overlay so that a
//! read-only open never touches the image — and what the fast-commit
//! records mean are the ext4 layer's business.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod journal;
pub mod listing;
pub mod log;
pub mod recovery;
pub mod revoke;

pub use journal::{Journal, JournalMap, LoadError};
pub use listing::{list, Listing};
pub use log::{Committed, Log};
pub use recovery::{recover, Failure, Logged, Recovery};
