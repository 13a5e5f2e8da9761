//! `ext4kit journal IMAGE [--json]`: what the journal holds and what
//! replaying it would do, without e2fsprogs. The walk is debugfs
//! `logdump`'s (every transaction from the log start, each logged block
//! with the filesystem block it belongs to, revoke records, commit blocks,
//! the fast-commit area); the verdict is recovery's (which transactions
//! replay, which blocks are written, what fails and why). Never writes.

use std::path::Path;
use std::sync::Arc;

use ext4kit::device::{open_location, BlockDevice, FileDevice};
use ext4kit::journal::{features, tag_name, End, Journal, Listing, Record, Recovery};
use ext4kit::Location;
use serde_json::{json, Value};

use crate::fmt::time_full;

/// Print the journal of the filesystem at `loc` of `image`.
pub fn run(image: &Path, loc: Location, json_out: bool) -> Result<(), String> {
    let name = image.display();
    let file = FileDevice::open(image, false).map_err(|e| format!("{name}: opening the image: {e}"))?;
    let dev: Arc<dyn BlockDevice> =
        open_location(Arc::new(file), loc).map_err(|e| format!("{name}: finding the filesystem: {e}"))?;
    let r = ext4kit::journal::inspect(&dev).map_err(|e| format!("{name}: {e}"))?;
    if json_out {
        let v = to_json(&r.journal, r.journal_inum, r.needs_recovery, &r.listing, &r.recovery);
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| format!("encoding JSON: {e}"))?
        );
    } else {
        print_text(&r.journal, r.journal_inum, r.needs_recovery, &r.listing, &r.recovery);
    }
    Ok(())
}

fn feature_names(j: &Journal) -> Vec<&'static str> {
    let sb = &j.sb;
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

fn end_text(e: &End) -> String {
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

fn record_text(r: &Record) -> String {
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

fn verdict(needs_recovery: bool, rec: &Recovery) -> Vec<String> {
    let mut v = Vec::new();
    if !needs_recovery {
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

fn print_text(j: &Journal, inum: u32, needs_recovery: bool, l: &Listing, rec: &Recovery) {
    let sb = &j.sb;
    println!(
        "Journal:          inode {inum}, {} blocks of {} bytes, version {}",
        j.total_len,
        j.block_size,
        if sb.h_blocktype == 4 { 2 } else { 1 }
    );
    println!("Features:         {}", feature_names(j).join(" "));
    println!(
        "Log:              blocks {}..{}{}",
        j.first,
        j.last,
        if j.fast_commit() {
            format!(", fast commits in blocks {}..{}", j.fc_first, j.fc_last)
        } else {
            String::new()
        }
    );
    println!(
        "Start:            block {}, transaction {}{}",
        sb.start,
        sb.sequence,
        if sb.start == 0 { " (empty log)" } else { "" }
    );
    if sb.errno != 0 {
        println!("Errno:            {} (the journal recorded an error)", sb.errno as i32);
    }
    println!("Needs recovery:   {}", if needs_recovery { "yes" } else { "no" });
    for t in &l.transactions {
        println!();
        let commit = match t.commit {
            Some((b, ok, s, ns)) => format!(
                "commit at block {b}{}, {}",
                if ok { "" } else { " (BAD CHECKSUM)" },
                time_full(ext4kit::Timestamp {
                    sec: s as i64,
                    nsec: ns
                })
            ),
            None => "no commit block (not committed: never replayed)".into(),
        };
        println!(
            "Transaction {}: {} block(s), {} revoke record(s); {commit}",
            t.sequence,
            t.blocks.len(),
            t.revokes.iter().map(|r| r.2.len()).sum::<usize>()
        );
        for &(b, ok) in &t.descriptors {
            println!("  descriptor at block {b}{}", if ok { "" } else { " (BAD CHECKSUM)" });
        }
        for b in &t.blocks {
            println!(
                "  FS block {} logged at journal block {} (flags {:#x}){}",
                b.fs_block,
                b.log_block,
                b.flags,
                if b.checksum_ok { "" } else { " BAD CHECKSUM" }
            );
        }
        for (b, ok, blocks) in &t.revokes {
            println!(
                "  revoke block at block {b}{}",
                if *ok { "" } else { " (BAD CHECKSUM)" }
            );
            for r in blocks {
                println!("  Revoke FS block {r}");
            }
        }
    }
    println!();
    println!("End:              {}", end_text(&l.end));
    if !l.fast_commits.is_empty() {
        println!();
        println!("Fast-commit area:");
        for (b, recs) in &l.fast_commits {
            println!("  block {b}:");
            for r in recs {
                println!("    {}", record_text(r));
            }
        }
    }
    println!();
    for line in verdict(needs_recovery, rec) {
        println!("{line}");
    }
}

fn to_json(j: &Journal, inum: u32, needs_recovery: bool, l: &Listing, rec: &Recovery) -> Value {
    let sb = &j.sb;
    let txns: Vec<Value> = l
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
                    "escaped": ext4kit::journal::escaped(b.flags),
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
    let fc: Vec<Value> = l
        .fast_commits
        .iter()
        .map(|(b, recs)| json!({"block": b, "records": recs.iter().map(record_text).collect::<Vec<_>>()}))
        .collect();
    json!({
        "journal_inode": inum,
        "blocks": j.total_len,
        "block_size": j.block_size,
        "version": if sb.h_blocktype == 4 { 2 } else { 1 },
        "features": feature_names(j),
        "first": j.first,
        "last": j.last,
        "fast_commit_blocks": if j.fast_commit() { Some((j.fc_first, j.fc_last)) } else { None },
        "start_block": sb.start,
        "start_sequence": sb.sequence,
        "errno": sb.errno as i32,
        "needs_recovery": needs_recovery,
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
        "verdict": verdict(needs_recovery, rec),
    })
}
