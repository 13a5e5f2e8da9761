//! `ext4kit-bench`: the whole benchmark suite in one command (the
//! workloads, peers and report live in `ext4kit_bench::suite`; this is
//! only the command line). `ext4kit bench` runs this program.
//!
//! It is a program of its own, not a part of the `ext4kit` binary, so
//! that what users run carries no benchmark instrumentation: this crate
//! builds the library with `count-shared` (the storm's counted
//! shared-line writes per open) and links the test kit (loop mounts, the
//! fixtures' random source). Cargo unifies the features of the packages
//! one command builds, so it must be built by a cargo command of its own
//! (`cargo build --release -p ext4kit-bench`), not together with
//! ext4kit-cli: built together, the `ext4kit` binary would count too.

/// The benchmark programs run the library in-process, so they use the
/// allocator the `ext4kit` binary ships with (see its `main.rs`): numbers
/// then describe what users of our binaries get.
#[global_allocator]
static ALLOC: ext4kit_alloc::Allocator = ext4kit_alloc::Allocator;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser};
use ext4kit_bench::suite::{self, PeerId, WORKLOADS};

/// Benchmark: every workload (the experiments behind the five design principles, and the
/// standard ones) on the library, the ext4kit mount, fuse2fs and the
/// kernel's ext4, with a report, JSON, CSV and SVG charts. Run as root for
/// the mounts.
#[derive(Parser, Debug)]
#[command(name = "ext4kit-bench", version)]
struct Args {
    /// Small sizes: every workload on every peer in a few minutes (what CI
    /// runs; the numbers are only indicative).
    #[arg(long)]
    quick: bool,
    /// Where the report goes: report.md (the tables and scaling notes),
    /// results.json, results.csv and the SVG charts.
    #[arg(long, value_name = "DIR", default_value = "target/bench-report")]
    out: PathBuf,
    /// Only these workloads (names below, or the groups "seeds" and
    /// "standard"), comma-separated or repeated.
    #[arg(long, value_name = "NAME", value_delimiter = ',', num_args = 1..)]
    only: Vec<String>,
    /// Only these peers (lib, ext4kit-mount, fuse2fs, kernel-ext4,
    /// kernel-ext2); the others are listed as skipped.
    #[arg(long, value_name = "PEER", value_delimiter = ',')]
    peers: Vec<String>,
    /// Rounds per workload and peer (default 3; --quick 2). Peers are
    /// interleaved within a round; tables show medians and min–max.
    #[arg(long, value_name = "N")]
    runs: Option<usize>,
    /// Thread counts of the lseek and storm curves (default 1, 2, 4, … up
    /// to the CPU count).
    #[arg(long, value_name = "N,N,…", value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Images and mount points (the full run needs a few GiB of sparse
    /// space; each image is removed after its round unless e2fsck
    /// complains).
    #[arg(long, value_name = "DIR", default_value = "target/bench-work")]
    work: PathBuf,
    /// FUSE server threads of the ext4kit mount (`ext4kit mount --threads`).
    #[arg(long, value_name = "N", default_value_t = 2)]
    server_threads: usize,
    /// Cache memory budget in MiB of the library and the ext4kit mount
    /// (`ext4kit --cache-mib`).
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    cache_mib: usize,
    /// The `ext4kit` binary whose mount is measured (`ext4kit bench` passes
    /// itself; default: the `ext4kit` beside this program, else on PATH).
    #[arg(long, value_name = "BIN")]
    ext4kit: Option<PathBuf>,
    /// No progress bar (per-round lines still go to standard error).
    #[arg(long)]
    no_progress: bool,
}

/// The long help's list of workloads and peers, from the suite itself so
/// it cannot drift from what runs.
fn with_help(c: clap::Command) -> clap::Command {
    let mut s = String::from(
        "Makes fresh images, runs each workload on every peer that can run here, interleaved \
         round by round so machine drift hits all alike, and reports medians, min–max and \
         speed ratios to the kernel's ext4. A peer that cannot run (no root, no FUSE, no \
         fuse2fs) is named as skipped with the reason. Every image is checked with e2fsck -fn \
         after its round.\n\nWORKLOADS (--only):\n",
    );
    for w in WORKLOADS.iter() {
        let seed = w.seed.map_or(String::new(), |_| " [group: seeds]".to_string());
        s.push_str(&format!("  {}{seed}\n      {}\n", w.name, w.about));
    }
    s.push_str("\nPEERS (--peers):\n");
    for p in PeerId::ALL {
        s.push_str(&format!("  {}\n      {}\n", p.name(), p.about()));
    }
    s.push_str(
        "\nBUILD:\n  This program is built on its own, so the ext4kit binary it measures carries no\n  \
         benchmark instrumentation (this one counts the library's shared-line writes):\n    \
         cargo build --release -p ext4kit-cli\n    \
         cargo build --release -p ext4kit-bench    (a cargo command of its own)\n\
         \nEXAMPLES:\n  sudo ext4kit bench                        the full report (over an hour on 2 cores)\n  \
         sudo ext4kit bench --quick                every workload and peer, small (a few minutes)\n  \
         sudo ext4kit bench --only seeds --runs 5  the five design principles' experiments\n  \
         ext4kit bench --only lseek,storm          without root: the library only\n",
    );
    c.after_long_help(s)
}

/// The `ext4kit` binary the mount peer runs when `--ext4kit` is not given:
/// the one installed or built beside this program, else the first on PATH.
fn default_ext4kit() -> PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("ext4kit")))
        .filter(|p| p.is_file());
    let on_path = || {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("ext4kit"))
                .find(|p| p.is_file())
        })
    };
    beside.or_else(on_path).unwrap_or_else(|| PathBuf::from("ext4kit"))
}

/// Run the suite; an error if a round failed or an image was not clean
/// (the report is written either way).
fn run(a: &Args) -> Result<(), String> {
    let mut peers = Vec::new();
    for p in &a.peers {
        peers.push(PeerId::parse(p).ok_or_else(|| {
            let names: Vec<&str> = PeerId::ALL.iter().map(|p| p.name()).collect();
            format!("unknown peer {p:?}; known: {}", names.join(", "))
        })?);
    }
    if a.threads.as_ref().is_some_and(|t| t.is_empty() || t.contains(&0)) {
        return Err("--threads: give thread counts of at least 1".into());
    }
    let opts = suite::Options {
        quick: a.quick,
        out: a.out.clone(),
        work: a.work.clone(),
        only: a.only.clone(),
        peers,
        runs: a.runs,
        threads: a.threads.clone(),
        ext4kit_bin: a.ext4kit.clone().unwrap_or_else(default_ext4kit),
        server_threads: a.server_threads.max(1),
        cache_budget: a.cache_mib.max(8) << 20,
        progress: !a.no_progress,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let report = suite::run(&opts)?;
    if report.ok() {
        Ok(())
    } else {
        Err(format!(
            "some rounds failed or left an image e2fsck does not accept (see {})",
            Path::new(&a.out).join("report.md").display()
        ))
    }
}

fn main() -> ExitCode {
    ext4kit_alloc::tune();
    let matches = with_help(Args::command()).get_matches();
    let a = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ext4kit-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
