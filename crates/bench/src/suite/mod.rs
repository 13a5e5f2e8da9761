//! `ext4kit bench`: every benchmark workload on every peer in one run.
//!
//! The separate programs in `src/bin` each answer one question with their
//! own table; this module runs all their workloads the same way so a user
//! gets one report: fresh images from one template per workload, each
//! workload on the library in-process, the ext4kit mount, fuse2fs and the
//! kernel's ext4 on a loop device (and the kernel's ext2 without dir_index
//! for the create workload), peers interleaved within each round so the
//! drift of a shared machine hits all of them alike, several rounds, medians
//! with min–max and speed ratios to the kernel. A peer that cannot run on
//! this machine is named in the report with the reason instead of failing
//! the run. [`report`] writes the table, JSON and CSV; [`charts`] the SVGs.

pub mod bounds;
pub mod charts;
pub mod figure;
pub mod formats;
pub mod fusetrace;
pub mod live;
pub mod notes;
pub mod report;
pub mod sizes;
pub mod tree_image;
pub mod work;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::peers::{fsck_verdict, PeerConfig};
pub use live::{Live, Target};
pub use report::Report;
pub use sizes::Sizes;
pub use work::Figure;
pub use work::{Workload, WORKLOADS};

/// The metric of the FUSE servers' peak resident memory, recorded for
/// every workload on the mount peers.
pub const SERVER_RSS: &str = "server peak RSS (VmHWM)";

/// The systems a workload runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerId {
    /// The ext4kit library called in-process (no kernel in the path).
    Lib,
    /// `ext4kit mount`: our FUSE server, through the kernel's FUSE client.
    Mount,
    /// e2fsprogs' `fuse2fs`: what people use to mount an image today.
    Fuse2fs,
    /// The kernel's ext4 driver on a loop device: the physical limit.
    Kernel,
    /// The kernel's ext2 driver on an image without dir_index: the linear
    /// directory search htree replaces (create workload only).
    Ext2,
}

impl PeerId {
    /// Every peer, in table order.
    pub const ALL: [PeerId; 5] = [
        PeerId::Lib,
        PeerId::Mount,
        PeerId::Fuse2fs,
        PeerId::Kernel,
        PeerId::Ext2,
    ];

    /// The name used in tables, `--peers` and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            PeerId::Lib => "lib",
            PeerId::Mount => "ext4kit-mount",
            PeerId::Fuse2fs => "fuse2fs",
            PeerId::Kernel => "kernel-ext4",
            PeerId::Ext2 => "kernel-ext2",
        }
    }

    /// Parse a `--peers` name.
    pub fn parse(s: &str) -> Option<PeerId> {
        PeerId::ALL
            .into_iter()
            .find(|p| p.name() == s || (s == "mount" && *p == PeerId::Mount))
    }

    /// One line for `--help` and the report.
    pub fn about(self) -> &'static str {
        match self {
            PeerId::Lib => "the ext4kit library called in-process: no kernel, no FUSE, no root needed",
            PeerId::Mount => "`ext4kit mount` (our FUSE server) driven through the kernel like any mount",
            PeerId::Fuse2fs => "e2fsprogs' fuse2fs, what people use to mount an image without root today",
            PeerId::Kernel => "the kernel's ext4 on a loop device: the physical limit, and the ratios' base",
            PeerId::Ext2 => "the kernel's ext2 on an image without dir_index (linear directory search)",
        }
    }
}

/// What the user asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// Small sizes: every workload and peer in a few minutes (CI).
    pub quick: bool,
    /// Where the report, JSON, CSV and charts go.
    pub out: PathBuf,
    /// Images and mount points (removed as the run goes).
    pub work: PathBuf,
    /// Workload names (empty: all).
    pub only: Vec<String>,
    /// Peers to run (empty: all that can run here).
    pub peers: Vec<PeerId>,
    /// Rounds (None: the preset's).
    pub runs: Option<usize>,
    /// Thread counts of the scaling workloads (None: the preset's).
    pub threads: Option<Vec<usize>>,
    /// The `ext4kit` binary the mount peer runs (normally this one).
    pub ext4kit_bin: PathBuf,
    /// `--threads` of the ext4kit FUSE server.
    pub server_threads: usize,
    /// Cache budget of the library and the ext4kit mount, bytes (the
    /// global `--cache-mib`).
    pub cache_budget: usize,
    /// Show a progress bar (off when stderr is not a terminal is
    /// indicatif's own decision; this turns it off entirely).
    pub progress: bool,
    /// The command line, for the record.
    pub command: String,
}

/// Whether each peer can run here, and why not.
#[derive(Debug, Clone)]
pub struct Availability {
    /// (peer, None if it can run, Some(reason) if skipped).
    pub peers: Vec<(PeerId, Option<String>)>,
    /// fio is installed (the fio workload's mount peers need it).
    pub fio: Option<String>,
}

impl Availability {
    /// Why `p` is skipped, if it is.
    pub fn skipped(&self, p: PeerId) -> Option<&str> {
        self.peers.iter().find(|(q, _)| *q == p).and_then(|(_, r)| r.as_deref())
    }
}

fn has_program(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(name).is_file()))
}

/// Find out which peers can run on this machine: root and a loop device
/// for the kernel; root, /dev/fuse and a mount that really comes up for
/// the FUSE servers (probed on a small image, so a broken setup is named
/// here rather than as a failure in every workload).
pub fn probe(opts: &Options) -> Availability {
    let kernel = ext4kit_testkit::kernel_available().err().map(|e| e.to_string());
    let root = rustix::process::geteuid().is_root();
    let fuse_dev = Path::new("/dev/fuse").exists();
    let cfg = peer_config(opts);
    let probe_mount = |peer: crate::peers::Peer| -> Option<String> {
        let dir = opts.work.join(format!("probe-{}", peer.name()));
        let img = dir.join("probe.img");
        let r = (|| {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            crate::run(
                Command::new("mke2fs")
                    .args(["-q", "-F", "-t", "ext4"])
                    .arg(&img)
                    .arg("16M"),
            )?;
            let m = crate::peers::PeerMount::mount(peer, &cfg, &img, &dir.join("mnt"), false)?;
            m.unmount()
        })();
        let _ = std::fs::remove_dir_all(&dir);
        r.err().map(|e| format!("mount probe failed: {e}"))
    };
    let mut peers = Vec::new();
    for p in PeerId::ALL {
        let why = if !opts.peers.is_empty() && !opts.peers.contains(&p) {
            Some("not in --peers".to_string())
        } else {
            match p {
                PeerId::Lib => None,
                PeerId::Kernel | PeerId::Ext2 => kernel.clone(),
                PeerId::Mount | PeerId::Fuse2fs => {
                    if !root {
                        Some("not running as root (the benchmark mounts with mount(2) directly)".into())
                    } else if !fuse_dev {
                        Some("/dev/fuse does not exist (no FUSE in this kernel or container)".into())
                    } else if p == PeerId::Fuse2fs && !has_program("fuse2fs") {
                        Some("no fuse2fs binary (apt-get install fuse2fs)".into())
                    } else if p == PeerId::Mount && !opts.ext4kit_bin.is_file() {
                        Some(format!("{} does not exist", opts.ext4kit_bin.display()))
                    } else {
                        probe_mount(if p == PeerId::Mount {
                            crate::peers::Peer::Ext4kit
                        } else {
                            crate::peers::Peer::Fuse2fs
                        })
                    }
                }
            }
        };
        peers.push((p, why));
    }
    let fio = (!has_program("fio")).then(|| "no fio binary (apt-get install fio)".to_string());
    Availability { peers, fio }
}

fn peer_config(opts: &Options) -> PeerConfig {
    PeerConfig {
        ext4kit_bin: opts.ext4kit_bin.clone(),
        threads: opts.server_threads,
        cache_budget: opts.cache_budget,
        fuse2fs_opts: String::new(),
    }
}

/// The workloads `--only` selects (names or the groups `seeds`,
/// `standard`), in suite order; an unknown name is an error that lists the
/// known ones.
pub fn select(only: &[String]) -> Result<Vec<&'static Workload>, String> {
    if only.is_empty() {
        return Ok(WORKLOADS.iter().collect());
    }
    for o in only {
        let known = o == "seeds" || o == "standard" || WORKLOADS.iter().any(|w| w.name == o);
        if !known {
            let names: Vec<&str> = WORKLOADS.iter().map(|w| w.name).collect();
            return Err(format!(
                "unknown workload {o:?}; known: {} (or the groups seeds, standard)",
                names.join(", ")
            ));
        }
    }
    Ok(WORKLOADS
        .iter()
        .filter(|w| {
            only.iter()
                .any(|o| o == w.name || (o == "seeds" && w.seed.is_some()) || (o == "standard" && w.seed.is_none()))
        })
        .collect())
}

/// A line above the progress bar (or on standard error without one:
/// indicatif drops lines printed on a hidden bar).
fn say(pb: &ProgressBar, line: String) {
    if pb.is_hidden() {
        eprintln!("{line}");
    } else {
        pb.println(line);
    }
}

/// Run the selected workloads and write the report under `opts.out`.
pub fn run(opts: &Options) -> Result<Report, String> {
    let workloads = select(&opts.only)?;
    let mut sizes = if opts.quick { Sizes::quick() } else { Sizes::full() };
    if let Some(r) = opts.runs {
        sizes.runs = r.max(1);
    }
    if let Some(t) = &opts.threads {
        sizes.threads = t.clone();
    }
    std::fs::create_dir_all(&opts.work).map_err(|e| format!("{}: {e}", opts.work.display()))?;
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let avail = probe(opts);
    let cfg = peer_config(opts);
    let mut report = Report::new(opts, &sizes, &avail, &workloads);

    // What runs: (workload, peers) with peers that can run here.
    let plan: Vec<(&Workload, Vec<PeerId>)> = workloads
        .iter()
        .map(|w| {
            let ps = w
                .peers
                .iter()
                .copied()
                .filter(|&p| avail.skipped(p).is_none() && w.skip_reason(p, &avail).is_none())
                .collect();
            (*w, ps)
        })
        .collect();
    let total: usize = plan.iter().map(|(_, ps)| ps.len() * sizes.runs).sum();
    let pb = if opts.progress {
        ProgressBar::new(total as u64)
    } else {
        ProgressBar::hidden()
    };
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    let started = Instant::now();
    let mnt = opts.work.join("mnt");
    for (w, peers) in &plan {
        let mut long_once: Vec<PeerId> = Vec::new();
        for r in 0..sizes.runs {
            for &p in peers {
                if long_once.contains(&p) {
                    pb.inc(1);
                    continue;
                }
                pb.set_message(format!("{} on {} (round {}/{})", w.name, p.name(), r + 1, sizes.runs));
                let t = Instant::now();
                let res = (|| -> Result<(Vec<Figure>, PathBuf), String> {
                    let img = w.image(p, &sizes, &opts.work)?;
                    let mut live = Live::start(p, &cfg, &img, &mnt)?;
                    let figs = (w.run)(&mut live, &sizes);
                    let fin = live.finish();
                    let mut figs = figs?;
                    if let Some(mib) = fin? {
                        figs.push(Figure {
                            metric: SERVER_RSS.into(),
                            unit: "MiB",
                            higher_better: false,
                            x: None,
                            variant: None,
                            value: mib,
                        });
                    }
                    Ok((figs, img))
                })();
                let secs = t.elapsed().as_secs_f64();
                match res {
                    Ok((figs, img)) => {
                        let (clean, verdict) = fsck_verdict(&img);
                        report.fsck(p, clean, &img, &verdict);
                        if clean {
                            let _ = std::fs::remove_file(&img);
                        } else {
                            say(&pb, format!("e2fsck -fn {}: {verdict} (image kept)", img.display()));
                        }
                        // A few figures: all of them; a curve: its ends.
                        let pick: Vec<&Figure> = if figs.len() <= 4 {
                            figs.iter().collect()
                        } else {
                            figs.first().into_iter().chain(figs.last()).collect()
                        };
                        let shown: Vec<String> = pick
                            .iter()
                            .map(|f| format!("{} {}", report::fmt_val(f.value), f.unit))
                            .collect();
                        say(
                            &pb,
                            format!(
                                "[{:>6.0}s] {:<10} {:<14} round {}: {} ({secs:.1} s)",
                                started.elapsed().as_secs_f64(),
                                w.name,
                                p.name(),
                                r + 1,
                                shown.join(", ")
                            ),
                        );
                        report.add(w.name, p, figs);
                    }
                    Err(e) => {
                        say(&pb, format!("{} on {} round {}: FAILED: {e}", w.name, p.name(), r + 1));
                        report.error(w.name, p, r, &e);
                    }
                }
                if secs >= sizes.long_run_secs as f64 && r + 1 < sizes.runs {
                    say(
                        &pb,
                        format!("{} on {}: one round took {secs:.0} s, not repeated", w.name, p.name()),
                    );
                    long_once.push(p);
                }
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    let _ = std::fs::remove_dir(&mnt);
    // What bounds the mount: an untimed pass after every timed round.
    let ran = |p: PeerId| avail.skipped(p).is_none();
    let bounds = match bounds::unavailable(ran(PeerId::Mount), ran(PeerId::Kernel)) {
        Some(why) => Err(format!("not measured: {why}")),
        None => {
            eprintln!("counting the FUSE requests of the mount targets (untimed) …");
            bounds::measure(&cfg, &opts.work, &sizes, &workloads).map_err(|e| format!("failed: {e}"))
        }
    };
    report.set_bounds(bounds);
    report.finish(started.elapsed().as_secs_f64());
    let mut written = report.write(&opts.out)?;
    written.extend(charts::draw(&report, &opts.out)?);
    println!("report, data and charts in {}:", opts.out.display());
    for p in &written {
        println!("  {}", p.display());
    }
    Ok(report)
}
