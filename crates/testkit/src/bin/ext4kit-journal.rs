//! `ext4kit-journal`: images whose journal needs recovery, by hand.
//!
//! - `ext4kit-journal make OUTDIR [--only NAME]... [-j N]`: builds the
//!   journal fixture set (the one `crates/cli/tests/journal_replay.rs`
//!   checks) into OUTDIR/NAME/{image.img, oracle/, unreplayed/, notes.txt,
//!   logdump.txt}. Needs root (loop mounts).
//! - `ext4kit-journal list`: the fixtures and what each covers.
//! - `ext4kit-journal check [--ext4kit BIN] IMAGE...`: the journal checks
//!   against e2fsck's recovery for any images (e.g. e2fsprogs' own
//!   tests/j_*/image.gz, decompressed): does `ext4kit get` read the tree
//!   e2fsck's replay gives (or refuse where e2fsck gives up), is the image
//!   unchanged by the read, does a read-write open leave it e2fsck-clean.
//!   Prints a table; exits 1 if any check failed. `scripts/check-journal-images`
//!   wraps it.

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use clap::{Parser, Subcommand};
use ext4kit_testkit::journal::{check_image, journal_specs, make_journal_fixture, JournalFixture};

/// Journal fixtures and checks for ext4kit.
#[derive(Parser, Debug)]
#[command(name = "ext4kit-journal", version)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Build the journal fixtures into OUTDIR (as root).
    Make {
        /// Output directory (created if missing; fixtures of the same name
        /// are replaced).
        outdir: PathBuf,
        /// Build only these fixtures (repeatable).
        #[arg(long = "only")]
        only: Vec<String>,
        /// Fixtures built in parallel.
        #[arg(short = 'j', long, default_value_t = 2)]
        jobs: usize,
    },
    /// List the fixtures.
    List,
    /// Check images against e2fsck's recovery.
    Check {
        /// The ext4kit binary to judge.
        #[arg(long, default_value = "ext4kit")]
        ext4kit: PathBuf,
        /// Scratch directory (default: $TMPDIR/ext4kit-journal-check-PID).
        #[arg(long)]
        work: Option<PathBuf>,
        /// Print every difference and command output after the table.
        #[arg(short, long)]
        verbose: bool,
        /// Image files.
        #[arg(required = true)]
        images: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let r = match args.cmd {
        Cmd::Make { outdir, only, jobs } => make(&outdir, &only, jobs),
        Cmd::List => {
            for s in journal_specs() {
                println!("{:<28} {}", s.name, s.description);
            }
            Ok(true)
        }
        Cmd::Check {
            ext4kit,
            work,
            verbose,
            images,
        } => check(&ext4kit, work, verbose, &images),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ext4kit-journal: {e}");
            ExitCode::from(2)
        }
    }
}

fn make(out: &std::path::Path, only: &[String], jobs: usize) -> io::Result<bool> {
    std::fs::create_dir_all(out)?;
    let specs: Vec<_> = journal_specs()
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s.name))
        .collect();
    if specs.is_empty() {
        return Err(io::Error::other("no fixture matches --only"));
    }
    let next = AtomicUsize::new(0);
    let failed = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(spec) = specs.get(i) else { return };
                let t = Instant::now();
                match make_journal_fixture(spec, out) {
                    Ok(f) => print_fixture(&f, t.elapsed().as_secs_f64()),
                    Err(e) => {
                        println!("{:<28} FAILED: {e}", spec.name);
                        failed.lock().unwrap_or_else(|p| p.into_inner()).push(spec.name);
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap_or_else(|p| p.into_inner());
    println!(
        "{} of {} fixtures built in {}",
        specs.len() - failed.len(),
        specs.len(),
        out.display()
    );
    Ok(failed.is_empty())
}

fn print_fixture(f: &JournalFixture, secs: f64) {
    let mut s = format!("{:<28} ok {secs:5.1}s  {}\n", f.name, f.description);
    for e in &f.evidence {
        s.push_str(&format!("{:<28}   - {e}\n", ""));
    }
    print!("{s}");
}

fn check(bin: &std::path::Path, work: Option<PathBuf>, verbose: bool, images: &[PathBuf]) -> io::Result<bool> {
    let work =
        work.unwrap_or_else(|| std::env::temp_dir().join(format!("ext4kit-journal-check-{}", std::process::id())));
    let mut all_ok = true;
    let mut details = Vec::new();
    println!(
        "{:<32} {:<24} {:<9} {:<26} {:<11} rw clean?",
        "image", "e2fsck -E journal_only", "changes?", "replayed tree matches?", "unchanged?"
    );
    for (i, img) in images.iter().enumerate() {
        let name = img
            .file_name()
            .map_or_else(|| img.display().to_string(), |n| n.to_string_lossy().into_owned());
        // "image", "image.img": name the directory too.
        let shown = match img.parent().and_then(|p| p.file_name()) {
            Some(p) if name.starts_with("image") => format!("{}/{name}", p.to_string_lossy()),
            _ => name.clone(),
        };
        match check_image(bin, img, &work.join(i.to_string())) {
            Ok(c) => {
                let ok = c.replayed.ok && c.unchanged.ok && c.rw.ok;
                all_ok &= ok;
                let mark = |v: &ext4kit_testkit::journal::Verdict| {
                    if v.ok {
                        v.text.clone()
                    } else {
                        format!("FAIL: {}", v.text)
                    }
                };
                let changes = match c.recovery_changes_tree {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "?",
                };
                println!(
                    "{shown:<32} {:<24} {changes:<9} {:<26} {:<11} {}",
                    c.e2fsck,
                    mark(&c.replayed),
                    mark(&c.unchanged),
                    mark(&c.rw)
                );
                for (what, v) in [("replayed", &c.replayed), ("unchanged", &c.unchanged), ("rw", &c.rw)] {
                    if !v.ok || verbose {
                        for d in &v.details {
                            details.push(format!("{shown}: {what}: {d}"));
                        }
                    }
                }
            }
            Err(e) => {
                all_ok = false;
                println!("{shown:<32} error: {e}");
            }
        }
    }
    if !details.is_empty() {
        println!();
        for d in details {
            println!("{d}");
        }
    }
    if all_ok {
        let _ = std::fs::remove_dir_all(&work);
    }
    Ok(all_ok)
}
