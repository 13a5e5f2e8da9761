//! List a journal: what the log of an ext4 image holds, transaction by
//! transaction — the walk of `debugfs logdump` (and of `ext4kit journal`).
//!
//! With no argument the example shows the journal at work: each fsync
//! commits a transaction to the log (metadata copies, then a commit
//! block), which the listing shows while the filesystem is still open;
//! closing checkpoints the blocks home and empties the log.
//!
//! ```sh
//! cargo run -p ext4kit --example list_journal -- disk.img   # list an image's journal
//! cargo run -p ext4kit --example list_journal               # the demo above
//! ```

mod common;

use std::error::Error;
use std::path::Path;
use std::sync::Arc;

use ext4kit::device::{BlockDevice, FileDevice};
use ext4kit::journal::End;
use ext4kit::{Access, OpenFlags};

fn main() -> Result<(), Box<dyn Error>> {
    if let Some(path) = std::env::args_os().nth(1) {
        return print_journal(Path::new(&path));
    }

    let dir = common::scratch_dir("list_journal")?;
    let image = dir.join("demo.img");
    common::make_empty_image(&image, 32 << 20)?;
    // `Fs::open_image` with `OpenOptions { read_only: false, .. }`.
    let fs = common::open_writable(&image)?;
    let flags = OpenFlags {
        access: Access::WriteOnly,
        create: true,
        ..Default::default()
    };
    for name in [&b"/one"[..], b"/two", b"/three"] {
        let f = fs.open(name, flags)?;
        f.write(&fs, b"hello, journal\n")?;
        f.fsync(&fs)?; // one committed transaction each
        fs.close_file(f)?;
    }
    println!("== with the filesystem open, after three fsyncs");
    print_journal(&image)?;

    drop(fs); // clean close: checkpoint, then the log is emptied
    println!("== after closing");
    print_journal(&image)?;

    std::fs::remove_dir_all(dir)?;
    Ok(())
}

/// Print the journal of the image at `path` (read without writing).
fn print_journal(path: &Path) -> Result<(), Box<dyn Error>> {
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(path, false)?);
    // Finds the journal inode, loads the journal superblock with the same
    // checks recovery makes, and walks the log.
    let report = ext4kit::journal::inspect(&dev)?;
    let journal = &report.journal;
    println!(
        "journal: {} blocks of {} bytes, log starts at block {}, sequence {}",
        journal.total_len, journal.block_size, journal.sb.start, journal.sb.sequence
    );
    let listing = &report.listing;
    for t in &listing.transactions {
        let blocks: Vec<String> = t.blocks.iter().map(|b| b.fs_block.to_string()).collect();
        let commit = match t.commit {
            Some((_, true, ..)) => "committed",
            Some((_, false, ..)) => "commit block with a bad checksum",
            None => "no commit block (incomplete)",
        };
        println!(
            "transaction {}: {} metadata blocks [{}], {} revoke blocks, {commit}",
            t.sequence,
            t.blocks.len(),
            blocks.join(" "),
            t.revokes.len()
        );
    }
    match &listing.end {
        End::Empty => println!("log empty (cleanly closed)"),
        // The usual end of a log in use: the block after the last commit
        // has not been written yet.
        End::NoMagic(block) => println!("log ends before journal block {block}"),
        end => println!("log ends: {end:?}"),
    }
    Ok(())
}
