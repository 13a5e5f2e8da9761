//! Looking at a filesystem's journal without replaying it: what the log
//! holds (debugfs `logdump`'s walk: every transaction from the log start,
//! each logged block with the filesystem block it belongs to, revoke
//! records, commit blocks, the fast-commit area) and what recovery would
//! do (which transactions replay, which blocks are written, what fails and
//! why). [`inspect`] reads only; `ext4kit journal` prints its report.
//!
//! The types are the `ext4kit-jbd2` and `ext4kit-format` crates',
//! re-exported so that a program needs the library alone.

use std::sync::Arc;

use ext4kit_format::features::incompat;

pub use ext4kit_format::fast_commit::{tag_name, Record};
pub use ext4kit_format::jbd2::features;
pub use ext4kit_jbd2::listing::{escaped, End, Listing, LoggedBlock, Transaction};
pub use ext4kit_jbd2::{Journal, Recovery};

use crate::device::BlockDevice;
use crate::error::Result;

/// A filesystem's journal as [`inspect`] found it.
#[derive(Debug)]
pub struct JournalReport {
    /// The journal, loaded with e2fsck's rules (its superblock in `sb`).
    pub journal: Journal,
    /// The journal's inode (`s_journal_inum`; 0 for an external journal).
    pub journal_inum: u32,
    /// The filesystem says its journal needs recovery (`needs_recovery`).
    pub needs_recovery: bool,
    /// The log, transaction by transaction.
    pub listing: Listing,
    /// What replaying it would do.
    pub recovery: Recovery,
}

/// Load and walk the journal of the filesystem on `dev`, writing nothing.
/// Fails when the filesystem has no journal, or it cannot be loaded (the
/// reason says why).
pub fn inspect(dev: &Arc<dyn BlockDevice>) -> Result<JournalReport> {
    let sb = crate::ext4::journal::read_superblock(&**dev)?;
    let journal = crate::ext4::journal::open_journal(dev)?;
    let listing = ext4kit_jbd2::list(&journal);
    let recovery = ext4kit_jbd2::recover(&journal);
    Ok(JournalReport {
        journal,
        journal_inum: sb.journal_inum,
        needs_recovery: sb.feature_incompat & incompat::RECOVER != 0,
        listing,
        recovery,
    })
}
