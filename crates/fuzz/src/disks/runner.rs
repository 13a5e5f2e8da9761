//! The supervisor: runs each case in its own worker process (the
//! `ext4kit-fuzz-disks` binary with `--worker`), kills it at the time
//! limit, and classifies how it ended.
//!
//! A process, not a thread, because a hang must be stopped (a thread
//! cannot be killed) and a memory limit must not take the campaign down
//! with it (`RLIMIT_AS` is per process). Exit 0 is a survived case; a
//! `PANIC:` line is a panic; "memory allocation of" is an allocation the
//! limit refused; a stack overflow or any other death is a crash; being
//! killed at the limit is a hang, reported with the worker's last `PHASE`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::exercise::ExerciseLimits;
use super::mutate::generate;
use super::seeds::{Family, Seed};

/// Settings of a campaign.
#[derive(Debug, Clone)]
pub struct DiskCampaign {
    /// The worker executable (`ext4kit-fuzz-disks`).
    pub worker: PathBuf,
    /// Where the seeds are cached.
    pub seeds_dir: PathBuf,
    /// Parallel workers.
    pub threads: usize,
    /// Longest a case may take.
    pub time_limit: Duration,
    /// Address-space limit of a worker.
    pub memory_limit: u64,
    /// What each case does.
    pub limits: ExerciseLimits,
    /// Print progress to stderr this often.
    pub progress: Option<Duration>,
}

/// How a case failed.
#[derive(Debug, Clone)]
pub struct DiskFailure {
    /// Family.
    pub family: Family,
    /// Case seed.
    pub seed: u64,
    /// "panic", "hang", "memory", "crash".
    pub kind: &'static str,
    /// Panic message, hang phase, allocation message, exit status.
    pub message: String,
    /// Backtrace frames of our crates and imago (panics).
    pub backtrace: String,
    /// The mutation, step by step.
    pub mutation: String,
}

/// Per-family counters.
#[derive(Debug, Clone, Default)]
pub struct FamilyStats {
    /// Cases run.
    pub cases: u64,
    /// Cases whose container opened.
    pub opened: u64,
    /// Cases whose filesystem opened.
    pub fs_opened: u64,
    /// Cases that opened writable.
    pub writable: u64,
    /// Open errors by shape (digits folded).
    pub open_errors: BTreeMap<String, u64>,
    /// Wall time of the cases, summed.
    pub case_time: Duration,
}

/// The outcome of a campaign.
#[derive(Debug, Clone, Default)]
pub struct DiskReport {
    /// Per family.
    pub families: BTreeMap<Family, FamilyStats>,
    /// Failures.
    pub failures: Vec<DiskFailure>,
    /// Largest worker peak RSS (KiB) and its case.
    pub peak_rss: (u64, String),
    /// Slowest case.
    pub slowest: (Duration, String),
    /// Wall time.
    pub elapsed: Duration,
}

impl DiskReport {
    /// Cases run in total.
    pub fn cases(&self) -> u64 {
        self.families.values().map(|f| f.cases).sum()
    }

    /// A multi-line account, failures first.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        for f in &self.failures {
            let _ = writeln!(
                s,
                "=== {} ({} seed {}) ===\n{}\nmutation: {}\nreproduce: cargo run --profile ci -p ext4kit-fuzz --bin \
                 ext4kit-fuzz-disks -- --format {} --replay {}",
                f.kind.to_uppercase(),
                f.family.name(),
                f.seed,
                f.message,
                f.mutation,
                f.family.name(),
                f.seed
            );
            if !f.backtrace.is_empty() {
                let _ = writeln!(s, "backtrace:\n{}", f.backtrace);
            }
        }
        for (fam, st) in &self.families {
            let _ = writeln!(
                s,
                "{}: {} cases, {} opened, {} fs opened, {} writable, {:.1?} of case time",
                fam.name(),
                st.cases,
                st.opened,
                st.fs_opened,
                st.writable,
                st.case_time
            );
            let mut errs: Vec<_> = st.open_errors.iter().collect();
            errs.sort_by(|a, b| b.1.cmp(a.1));
            for (e, n) in errs.into_iter().take(12) {
                let _ = writeln!(s, "    {n:>6}  {e}");
            }
        }
        let _ = writeln!(
            s,
            "total {} cases in {:.1?}: {} failures; peak worker RSS {} MiB ({}); slowest {:.1?} ({})",
            self.cases(),
            self.elapsed,
            self.failures.len(),
            self.peak_rss.0 >> 10,
            self.peak_rss.1,
            self.slowest.0,
            self.slowest.1
        );
        s
    }
}

/// An error message with numbers folded, so errors group by shape.
fn shape(msg: &str) -> String {
    let mut out = String::new();
    let mut last_digit = false;
    for c in msg.chars().take(90) {
        let d = c.is_ascii_hexdigit() && (c.is_ascii_digit() || last_digit);
        if d {
            if !last_digit {
                out.push('#');
            }
        } else {
            out.push(c);
        }
        last_digit = d;
    }
    out
}

/// Frames of ext4kit crates and imago from a printed backtrace.
fn our_frames(bt: &str) -> String {
    let mut out = String::new();
    let mut keep = false;
    for line in bt.lines() {
        let t = line.trim_start();
        if t.starts_with("at ") {
            if keep {
                let _ = writeln!(out, "      {t}");
            }
            continue;
        }
        keep = (t.contains("ext4kit") || t.contains("imago")) && !t.contains("ext4kit_fuzz::disks::worker");
        if keep {
            let _ = writeln!(out, "  {t}");
        }
    }
    out
}

/// What one worker run came to.
enum Ended {
    Ok { opened: bool, fs: bool, writable: bool, open_error: Option<String>, hwm: u64 },
    Failed(&'static str, String, String),
}

fn run_one(cfg: &DiskCampaign, family: Family, seed: u64, skip: u64) -> Ended {
    let dir = super::worker::scratch_dir().join(format!(
        "ext4kit-fuzz-disks-{}-{}-{seed}",
        std::process::id(),
        family.name()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return Ended::Failed("crash", format!("cannot make {}: {e}", dir.display()), String::new());
    }
    let r = supervise(cfg, family, seed, skip, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn supervise(cfg: &DiskCampaign, family: Family, seed: u64, skip: u64, dir: &Path) -> Ended {
    let (out_p, err_p) = (dir.join(".stdout"), dir.join(".stderr"));
    let (Ok(out_f), Ok(err_f)) = (std::fs::File::create(&out_p), std::fs::File::create(&err_p)) else {
        return Ended::Failed("crash", "cannot create the worker's output files".into(), String::new());
    };
    let mut cmd = Command::new(&cfg.worker);
    cmd.args(["--worker", "--format", family.name()])
        .args(["--replay", &seed.to_string(), "--skip", &skip.to_string()])
        .arg("--dir")
        .arg(dir)
        .arg("--seeds-dir")
        .arg(&cfg.seeds_dir)
        .args(["--memory-limit-mib", &(cfg.memory_limit >> 20).to_string()])
        .args(["--read-budget-mib", &(cfg.limits.read_budget >> 20).to_string()])
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(out_f)
        .stderr(err_f);
    if !cfg.limits.engine {
        cmd.arg("--no-engine");
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ended::Failed("crash", format!("cannot start {}: {e}", cfg.worker.display()), String::new()),
    };
    let start = Instant::now();
    let mut nap = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if start.elapsed() > cfg.time_limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(20));
            }
            Err(e) => return Ended::Failed("crash", format!("waiting for the worker: {e}"), String::new()),
        }
    };
    let out = std::fs::read_to_string(&out_p).unwrap_or_default();
    let err = String::from_utf8_lossy(&std::fs::read(&err_p).unwrap_or_default()).into_owned();
    let last_phase = err.lines().rev().find_map(|l| l.strip_prefix("PHASE ")).unwrap_or("(before the first phase)");
    let Some(status) = status else {
        return Ended::Failed(
            "hang",
            format!("still running after {:.1?}; last phase: {last_phase}", cfg.time_limit),
            String::new(),
        );
    };
    if let Some(p) = err.find("PANIC: ") {
        let rest = &err[p + 7..];
        let msg = rest.lines().next().unwrap_or("").to_string();
        return Ended::Failed("panic", format!("{msg}\nphase: {last_phase}"), our_frames(rest));
    }
    if let Some(l) = err.lines().find(|l| l.contains("memory allocation of")) {
        return Ended::Failed("memory", format!("{l}\nphase: {last_phase}"), String::new());
    }
    if let Some(l) = err.lines().find(|l| l.contains("overflowed its stack")) {
        return Ended::Failed("crash", format!("{l}\nphase: {last_phase}"), String::new());
    }
    if !status.success() {
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Ended::Failed(
            "crash",
            format!("worker {status}; last phase: {last_phase}; stderr: {tail:?}"),
            String::new(),
        );
    }
    let result = out.lines().find_map(|l| l.strip_prefix("RESULT ")).unwrap_or("");
    let hwm = out.lines().find_map(|l| l.strip_prefix("HWM ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    let open_error = result
        .split_once("open_error=Some(\"")
        .map(|(_, r)| r.rsplit_once("\") read=").map_or(r, |x| x.0).replace("\\\"", "\""));
    Ended::Ok {
        opened: !result.starts_with("opened=0"),
        fs: result.contains(" fs=true"),
        writable: result.contains("writable=true"),
        open_error,
        hwm,
    }
}

/// Run `cases` cases of `family` from `start`, over `seeds` (of that
/// family, for describing failures).
pub fn run_family(cfg: &DiskCampaign, family: Family, seeds: &[Seed], start: u64, cases: u64) -> DiskReport {
    let t0 = Instant::now();
    let next = AtomicU64::new(0);
    let report = Mutex::new(DiskReport::default());
    let last_progress = Mutex::new(Instant::now());
    std::thread::scope(|s| {
        for _ in 0..cfg.threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= cases {
                    break;
                }
                let seed = start + i;
                let c0 = Instant::now();
                let ended = run_one(cfg, family, seed, 0);
                let took = c0.elapsed();
                let mut r = report.lock().unwrap();
                let st = r.families.entry(family).or_default();
                st.cases += 1;
                st.case_time += took;
                let label = format!("{} seed {seed}", family.name());
                match ended {
                    Ended::Ok { opened, fs, writable, open_error, hwm } => {
                        st.opened += opened as u64;
                        st.fs_opened += fs as u64;
                        st.writable += writable as u64;
                        if let Some(e) = open_error {
                            *st.open_errors.entry(shape(&e)).or_default() += 1;
                        }
                        if hwm > r.peak_rss.0 {
                            r.peak_rss = (hwm, label.clone());
                        }
                    }
                    Ended::Failed(kind, message, backtrace) => {
                        let mutation = generate(seeds, seed, 0).describe();
                        eprintln!("FAILURE {kind} {label}: {message}");
                        r.failures.push(DiskFailure { family, seed, kind, message, backtrace, mutation });
                    }
                }
                if took > r.slowest.0 {
                    r.slowest = (took, label);
                }
                if let Some(every) = cfg.progress {
                    let mut lp = last_progress.lock().unwrap();
                    if lp.elapsed() >= every {
                        *lp = Instant::now();
                        let st = &r.families[&family];
                        eprintln!(
                            "{}: {}/{cases} cases, {} opened, {} failures, {:.0?}",
                            family.name(),
                            st.cases,
                            st.opened,
                            r.failures.len(),
                            t0.elapsed()
                        );
                    }
                }
            });
        }
    });
    let mut r = report.into_inner().unwrap();
    r.failures.sort_by_key(|f| f.seed);
    r.elapsed = t0.elapsed();
    r
}

/// Replay one case under the supervisor with some steps skipped: true
/// when it still fails the same way (used to minimize).
pub fn still_fails(cfg: &DiskCampaign, family: Family, seed: u64, skip: u64, kind: &str) -> bool {
    matches!(run_one(cfg, family, seed, skip), Ended::Failed(k, ..) if k == kind)
}

/// Merge `b` into `a`.
pub fn merge(a: &mut DiskReport, b: DiskReport) {
    for (f, st) in b.families {
        a.families.insert(f, st);
    }
    a.failures.extend(b.failures);
    if b.peak_rss.0 > a.peak_rss.0 {
        a.peak_rss = b.peak_rss;
    }
    if b.slowest.0 > a.slowest.0 {
        a.slowest = b.slowest;
    }
    a.elapsed += b.elapsed;
}
