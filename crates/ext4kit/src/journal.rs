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

impl JournalReport {
    /// The journal's feature names as e2fsprogs spells them
    /// (`checksum_v3`, `fast_commit`, ...): the journal superblock's
    /// compat and incompat bits.
    pub fn feature_names(&self) -> Vec<&'static str> {
        let sb = &self.journal.sb;
        let mut v = Vec::new();
        if sb.feature_compat & features::COMPAT_CHECKSUM != 0 {
            v.push("checksum_v1");
        }
        for (bit, n) in [
            (features::INCOMPAT_REVOKE, "revoke"),
            (features::INCOMPAT_64BIT, "64bit"),
            (features::INCOMPAT_ASYNC_COMMIT, "async_commit"),
            (features::INCOMPAT_CSUM_V2, "checksum_v2"),
            (features::INCOMPAT_CSUM_V3, "checksum_v3"),
            (features::INCOMPAT_FAST_COMMIT, "fast_commit"),
        ] {
            if sb.feature_incompat & bit != 0 {
                v.push(n);
            }
        }
        v
    }

    /// The verdict in sentences: whether the open replays anything, how
    /// many transactions and blocks replay would write, and what fails.
    pub fn verdict(&self) -> Vec<String> {
        let rec = &self.recovery;
        let mut v = Vec::new();
        if !self.needs_recovery {
            v.push("the filesystem does not need recovery (needs_recovery is off): nothing is replayed at open".into());
            if rec.replay.is_empty() {
                return v;
            }
            v.push("(what follows is what a forced replay would do)".into());
        }
        let n = rec.end_transaction.wrapping_sub(rec.start_transaction);
        v.push(format!(
            "replay would apply {n} transaction(s) ({}..{}): {} block(s) written home ({} logged copies, {} skipped as revoked, {} revoke records)",
            rec.start_transaction,
            rec.end_transaction,
            rec.replay.len(),
            rec.nr_replays,
            rec.nr_revoke_hits,
            rec.nr_revokes
        ));
        if !rec.fast_commits.is_empty() {
            v.push(format!(
                "then {} fast-commit record(s) of transaction {}",
                rec.fast_commits.len(),
                rec.end_transaction
            ));
        }
        if let Some(t) = rec.failed_commit {
            v.push(format!(
                "transaction {t} has a bad commit checksum: the log ends before it and the filesystem is marked as having errors"
            ));
        }
        if let Some(f) = &rec.failure {
            v.push(format!("recovery fails: {f}"));
        }
        for p in &rec.problems {
            v.push(format!("  {p}"));
        }
        v
    }

    /// The whole report as one JSON document (`ext4kit journal --json`,
    /// and the Python package's `journal()`): one shape for every
    /// frontend, so scripts read the same keys from each.
    #[cfg(feature = "json")]
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let (j, l, rec) = (&self.journal, &self.listing, &self.recovery);
        let sb = &j.sb;
        let txns: Vec<serde_json::Value> = l
            .transactions
            .iter()
            .map(|t| {
                json!({
                    "sequence": t.sequence,
                    "descriptors": t.descriptors.iter().map(|&(b, ok)| json!({"block": b, "checksum_ok": ok})).collect::<Vec<_>>(),
                    "blocks": t.blocks.iter().map(|b| json!({
                        "fs_block": b.fs_block,
                        "journal_block": b.log_block,
                        "flags": b.flags,
                        "escaped": escaped(b.flags),
                        "checksum_ok": b.checksum_ok,
                    })).collect::<Vec<_>>(),
                    "revokes": t.revokes.iter().map(|(b, ok, r)| json!({"block": b, "checksum_ok": ok, "fs_blocks": r})).collect::<Vec<_>>(),
                    // `sec`/`nsec` as first released; `time` as every --json time is.
                    "commit": t.commit.map(|(b, ok, s, ns)| json!({
                        "block": b, "checksum_ok": ok, "sec": s, "nsec": ns, "time": {"sec": s, "nsec": ns},
                    })),
                })
            })
            .collect();
        let end = match &l.end {
            End::Empty => json!({"kind": "empty"}),
            End::NoMagic(b) => json!({"kind": "no_magic", "block": b}),
            End::OtherSequence { block, found, expected } => {
                json!({"kind": "other_sequence", "block": block, "found": found, "expected": expected})
            }
            End::UnexpectedType { block, blocktype } => {
                json!({"kind": "unexpected_type", "block": block, "blocktype": blocktype})
            }
            End::Unreadable { block, error } => json!({"kind": "unreadable", "block": block, "error": error}),
            End::Loops => json!({"kind": "loops"}),
        };
        let fc: Vec<serde_json::Value> = l
            .fast_commits
            .iter()
            .map(|(b, recs)| json!({"block": b, "records": recs.iter().map(record_text).collect::<Vec<_>>()}))
            .collect();
        json!({
            "journal_inode": self.journal_inum,
            "blocks": j.total_len,
            "block_size": j.block_size,
            "version": if sb.h_blocktype == 4 { 2 } else { 1 },
            "features": self.feature_names(),
            "first": j.first,
            "last": j.last,
            "fast_commit_blocks": if j.fast_commit() { Some((j.fc_first, j.fc_last)) } else { None },
            "start_block": sb.start,
            "start_sequence": sb.sequence,
            "errno": sb.errno as i32,
            "needs_recovery": self.needs_recovery,
            "transactions": txns,
            "end": end,
            "fast_commits": fc,
            "replay": {
                "start_transaction": rec.start_transaction,
                "end_transaction": rec.end_transaction,
                "blocks": rec.replay.iter().map(|(fs, l)| json!({"fs_block": fs, "journal_block": l.log_block, "sequence": l.sequence})).collect::<Vec<_>>(),
                "logged_copies_written": rec.nr_replays,
                "revoke_records": rec.nr_revokes,
                "revoked_copies_skipped": rec.nr_revoke_hits,
                "fast_commit_records": rec.fast_commits.len(),
                "failed_commit": rec.failed_commit,
                "failure": rec.failure.as_ref().map(|f| f.to_string()),
                "problems": rec.problems,
            },
            "verdict": self.verdict(),
        })
    }
}

/// How the log walk ended, in a sentence.
pub fn end_text(e: &End) -> String {
    match e {
        End::Empty => "the log is empty (cleanly unmounted)".into(),
        End::NoMagic(b) => format!("block {b} has no journal magic: end of the log"),
        End::OtherSequence { block, found, expected } => {
            format!("block {block} belongs to transaction {found}, not {expected}: end of the log")
        }
        End::UnexpectedType { block, blocktype } => {
            format!("block {block} has the unexpected block type {blocktype}: end of the log")
        }
        End::Unreadable { block, error } => format!("block {block} cannot be read ({error})"),
        End::Loops => "the log does not end (it runs round the whole journal)".into(),
    }
}

/// A fast-commit record in one line, with the kernel's tag names.
pub fn record_text(r: &Record) -> String {
    match r {
        Record::Head { features, tid } => format!("HEAD features {features:#x}, tid {tid}"),
        Record::AddRange { ino, extent } => format!(
            "ADD_RANGE inode {ino}, lblk {}, pblk {}, len {}{}",
            extent.block,
            extent.start(),
            extent.length(),
            if extent.is_uninit() { " (unwritten)" } else { "" }
        ),
        Record::DelRange { ino, lblk, len } => format!("DEL_RANGE inode {ino}, lblk {lblk}, len {len}"),
        Record::Dentry { tag, parent, ino, name } => format!(
            "{} parent {parent}, inode {ino}, name {:?}",
            tag_name(*tag),
            String::from_utf8_lossy(name)
        ),
        Record::Inode { ino, raw } => format!("INODE inode {ino} ({} bytes)", raw.len()),
        Record::Pad => "PAD".into(),
        Record::Tail { tid, crc } => format!("TAIL tid {tid}, crc {crc:#010x}"),
        Record::Unknown(t) => format!("unknown tag {t:#x}"),
    }
}
