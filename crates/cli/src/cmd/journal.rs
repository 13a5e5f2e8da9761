//! `ext4kit journal IMAGE [--json]`: what the journal holds and what
//! replaying it would do, without e2fsprogs. The walk is debugfs
//! `logdump`'s (every transaction from the log start, each logged block
//! with the filesystem block it belongs to, revoke records, commit blocks,
//! the fast-commit area); the verdict is recovery's (which transactions
//! replay, which blocks are written, what fails and why). Never writes.

use std::path::Path;
use std::sync::Arc;

use ext4kit::device::{open_location, BlockDevice, FileDevice};
use ext4kit::journal::{end_text, record_text, JournalReport};
use ext4kit::Location;

use crate::fmt::time_full;

/// Print the journal of the filesystem at `loc` of `image`.
pub fn run(image: &Path, loc: Location, json_out: bool) -> Result<(), String> {
    let name = image.display();
    let file = FileDevice::open(image, false).map_err(|e| format!("{name}: opening the image: {e}"))?;
    let dev: Arc<dyn BlockDevice> =
        open_location(Arc::new(file), loc).map_err(|e| format!("{name}: finding the filesystem: {e}"))?;
    let r = ext4kit::journal::inspect(&dev).map_err(|e| format!("{name}: {e}"))?;
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&r.to_json()).map_err(|e| format!("encoding JSON: {e}"))?
        );
    } else {
        print_text(&r);
    }
    Ok(())
}

fn print_text(r: &JournalReport) {
    let (j, inum, needs_recovery, l) = (&r.journal, r.journal_inum, r.needs_recovery, &r.listing);
    let sb = &j.sb;
    println!(
        "Journal:          inode {inum}, {} blocks of {} bytes, version {}",
        j.total_len,
        j.block_size,
        if sb.h_blocktype == 4 { 2 } else { 1 }
    );
    println!("Features:         {}", r.feature_names().join(" "));
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
    for line in r.verdict() {
        println!("{line}");
    }
}
