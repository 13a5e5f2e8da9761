//! `ext4kit-treecmp EXPECTED ACTUAL`: compare two directory trees the way
//! ext4kit's tests do, print every difference, exit 1 if there is any.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use ext4kit_testkit::{compare_trees, CompareOpts, TimeFidelity};

/// Compare two directory trees: names (bytes), types, permission bits,
/// owners, sizes, contents, symlink targets, device numbers, hard-link
/// groups and link counts, xattrs and mtimes (nanoseconds).
#[derive(Parser, Debug)]
#[command(name = "ext4kit-treecmp", version)]
struct Args {
    /// The reference tree (e.g. the fixture source tree).
    expected: PathBuf,
    /// The tree to judge (e.g. what was extracted from an image).
    actual: PathBuf,
    /// Do not compare uid/gid (an extractor not running as root cannot chown).
    #[arg(long)]
    no_owners: bool,
    /// Ignore `lost+found` directly below the roots.
    #[arg(long)]
    ignore_lost_found: bool,
    /// Ignore the root directory's own mode, owner, times and xattrs.
    #[arg(long)]
    ignore_root_attrs: bool,
    /// Do not compare extended attributes.
    #[arg(long)]
    no_xattrs: bool,
    /// Do not compare hard-link groups and link counts.
    #[arg(long)]
    no_hard_links: bool,
    /// Do not compare symlink mtimes.
    #[arg(long)]
    no_symlink_times: bool,
    /// Do not compare directory mtimes.
    #[arg(long)]
    no_dir_times: bool,
    /// Precision of mtime comparison.
    #[arg(long, value_enum, default_value_t = Times::Ns)]
    times: Times,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Times {
    /// Seconds and nanoseconds.
    Ns,
    /// Seconds only.
    Seconds,
    /// Seconds truncated to signed 32 bits, no nanoseconds (128-byte inodes).
    Seconds32,
    /// Do not compare times.
    Ignore,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let opts = CompareOpts {
        owners: !a.no_owners,
        ignore_lost_found: a.ignore_lost_found,
        ignore_root_attrs: a.ignore_root_attrs,
        xattrs: !a.no_xattrs,
        hard_links: !a.no_hard_links,
        times: match a.times {
            Times::Ns => TimeFidelity::Nanoseconds,
            Times::Seconds => TimeFidelity::Seconds,
            Times::Seconds32 => TimeFidelity::Seconds32,
            Times::Ignore => TimeFidelity::Ignore,
        },
        symlink_times: !a.no_symlink_times,
        dir_times: !a.no_dir_times,
    };
    match compare_trees(&a.expected, &a.actual, &opts) {
        Ok(diffs) if diffs.is_empty() => {
            match count_entries(&a.expected, &opts) {
                Some(n) => println!("trees identical: {n} entries compared"),
                None => println!("trees identical"),
            }
            ExitCode::SUCCESS
        }
        Ok(diffs) => {
            for d in &diffs {
                println!("{d}");
            }
            println!("{} differences", diffs.len());
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("ext4kit-treecmp: {e}");
            ExitCode::from(2)
        }
    }
}

fn count_entries(root: &std::path::Path, opts: &CompareOpts) -> Option<u64> {
    fn walk(p: &std::path::Path, top: bool, opts: &CompareOpts) -> Option<u64> {
        let mut n = 0;
        for e in std::fs::read_dir(p).ok()? {
            let e = e.ok()?;
            if top && opts.ignore_lost_found && e.file_name() == "lost+found" {
                continue;
            }
            n += 1;
            if e.file_type().ok()?.is_dir() {
                n += walk(&e.path(), false, opts)?;
            }
        }
        Some(n)
    }
    walk(root, true, opts).map(|n| n + 1)
}
