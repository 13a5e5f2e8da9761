//! `ext4kit bench`: the whole benchmark suite in one command (the
//! workloads, peers and report live in `ext4kit_bench::suite`; this is
//! only the command line).

use std::path::PathBuf;

use ext4kit_bench::suite::{self, PeerId, WORKLOADS};

/// Arguments of `ext4kit bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Small sizes: every workload on every peer in a few minutes (what CI
    /// runs; the numbers are only indicative).
    #[arg(long)]
    pub quick: bool,
    /// Where the report goes: report.md (the tables and scaling notes),
    /// results.json, results.csv and the SVG charts.
    #[arg(long, value_name = "DIR", default_value = "target/bench-report")]
    pub out: PathBuf,
    /// Only these workloads (names below, or the groups "seeds" and
    /// "standard"), comma-separated or repeated.
    #[arg(long, value_name = "NAME", value_delimiter = ',', num_args = 1..)]
    pub only: Vec<String>,
    /// Only these peers (lib, ext4kit-mount, fuse2fs, kernel-ext4,
    /// kernel-ext2); the others are listed as skipped.
    #[arg(long, value_name = "PEER", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// Rounds per workload and peer (default 3; --quick 2). Peers are
    /// interleaved within a round; tables show medians and min–max.
    #[arg(long, value_name = "N")]
    pub runs: Option<usize>,
    /// Thread counts of the lseek and open/read/close storm curves
    /// (default 1, 2, 4, … up to the CPU count).
    #[arg(long, value_name = "N,N,…", value_delimiter = ',')]
    pub threads: Option<Vec<usize>>,
    /// Images and mount points (the full run needs a few GiB of sparse
    /// space; each image is removed after its round unless e2fsck
    /// complains).
    #[arg(long, value_name = "DIR", default_value = "target/bench-work")]
    pub work: PathBuf,
    /// FUSE server threads of the ext4kit mount (`ext4kit mount --threads`).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub server_threads: usize,
    /// No progress bar (per-round lines still go to standard error).
    #[arg(long)]
    pub no_progress: bool,
}

/// The long help's list of workloads and peers, from the suite itself so
/// it cannot drift from what runs.
pub fn with_help(c: clap::Command) -> clap::Command {
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
        "\nEXAMPLES:\n  sudo ext4kit bench                        the full report (over an hour on 2 cores)\n  \
         sudo ext4kit bench --quick                every workload and peer, small (a few minutes)\n  \
         sudo ext4kit bench --only seeds --runs 5  the five design principles' experiments\n  \
         ext4kit bench --only lseek,storm          without root: the library only\n",
    );
    c.after_long_help(s)
}

/// Run the suite; an error if a round failed or an image was not clean
/// (the report is written either way).
pub fn run(a: &Args, budget: usize) -> Result<(), String> {
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
        ext4kit_bin: std::env::current_exe().map_err(|e| format!("where is this ext4kit binary: {e}"))?,
        server_threads: a.server_threads.max(1),
        cache_budget: budget,
        progress: !a.no_progress,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let report = suite::run(&opts)?;
    if report.ok() {
        Ok(())
    } else {
        Err(format!(
            "some rounds failed or left an image e2fsck does not accept (see {})",
            a.out.join("report.md").display()
        ))
    }
}
