//! Many workload runs × many crash points, checked on several threads,
//! summed up in a table.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ext4kit_blockdev::{CrashImages, CrashPoint, WriteLog};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::check::{save_image, Checker};
use crate::model::{FailKind, Failure};
use crate::workload::{run, Recorded, RunSpec};

/// What to run.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// The workload runs, in order.
    pub runs: Vec<RunSpec>,
    /// Crash images per run: up to half at flushes, the rest between.
    pub images_per_run: usize,
    /// Threads checking images.
    pub check_threads: usize,
    /// Where the first failing image of each kind is kept (`None`: not
    /// kept).
    pub keep: Option<PathBuf>,
    /// How to rerun a case: `{}` is replaced by the run's arguments and
    /// `--cut CUT` (e.g. `cargo run --profile ci -p ext4kit-crash -- check {}`).
    pub repro: String,
}

/// The first failure of one kind.
#[derive(Debug, Clone)]
pub struct FirstFailure {
    /// Which run.
    pub run: String,
    /// Which crash point.
    pub cut: String,
    /// What was wrong.
    pub detail: String,
    /// The one-line command that checks the same crash point again.
    pub repro: String,
    /// Where the crash image was kept.
    pub image: Option<PathBuf>,
}

/// Counts for one kind of failure.
#[derive(Debug, Clone, Default)]
pub struct KindStats {
    /// Images with at least one failure of this kind.
    pub images: usize,
    /// Of them, cuts at a flush.
    pub at_flush: usize,
    /// The first one seen.
    pub first: Option<FirstFailure>,
}

/// Counts for one workload × filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub struct CellStats {
    /// Runs.
    pub runs: usize,
    /// Operations.
    pub ops: usize,
    /// Crash images checked.
    pub images: usize,
    /// Of them, failing.
    pub failed: usize,
    /// Of the failing, cuts at a flush.
    pub failed_at_flush: usize,
}

/// What a campaign found.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Workload runs recorded.
    pub runs: usize,
    /// Crash images checked.
    pub images: usize,
    /// Of them, cuts at a flush.
    pub flush_images: usize,
    /// Images with at least one failure.
    pub failed_images: usize,
    /// By kind.
    pub kinds: BTreeMap<FailKind, KindStats>,
    /// By workload × filesystem (`mix/ext4-4k`).
    pub cells: BTreeMap<String, CellStats>,
    /// fsync'd bytes found lost or changed.
    pub lost_bytes: u64,
    /// Container crash images with leaked clusters (`qemu-img check` exit
    /// 3: accepted, not a failure).
    pub leaked_images: usize,
    /// Runs that failed before any image could be checked.
    pub run_errors: Vec<String>,
    /// Wall time.
    pub elapsed: Duration,
}

impl Summary {
    /// Images with a failure of `k`.
    pub fn count(&self, k: FailKind) -> usize {
        self.kinds.get(&k).map_or(0, |s| s.images)
    }

    /// Images failing a consistency check (e2fsck, replay, reading).
    pub fn consistency_failures(&self) -> usize {
        self.kinds
            .iter()
            .filter(|(k, _)| k.is_consistency())
            .map(|(_, s)| s.images)
            .sum()
    }

    /// Whether nothing failed.
    pub fn clean(&self) -> bool {
        self.failed_images == 0 && self.run_errors.is_empty()
    }

    /// Add `other`'s counts (first failures: ours stay first).
    pub fn add(&mut self, other: &Summary) {
        self.runs += other.runs;
        self.images += other.images;
        self.flush_images += other.flush_images;
        self.failed_images += other.failed_images;
        self.lost_bytes += other.lost_bytes;
        self.leaked_images += other.leaked_images;
        self.run_errors.extend(other.run_errors.iter().cloned());
        for (k, s) in &other.kinds {
            let e = self.kinds.entry(*k).or_default();
            e.images += s.images;
            e.at_flush += s.at_flush;
            if e.first.is_none() {
                e.first = s.first.clone();
            }
        }
        for (c, s) in &other.cells {
            let e = self.cells.entry(c.clone()).or_default();
            e.runs += s.runs;
            e.ops += s.ops;
            e.images += s.images;
            e.failed += s.failed;
            e.failed_at_flush += s.failed_at_flush;
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} runs, {} crash images ({} at a flush, {} between flushes), {} failing, {:.0} s",
            self.runs,
            self.images,
            self.flush_images,
            self.images - self.flush_images,
            self.failed_images,
            self.elapsed.as_secs_f64()
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "| workload / fs | runs | ops | images | failing | failing at a flush |"
        )?;
        writeln!(f, "|---|---:|---:|---:|---:|---:|")?;
        for (c, s) in &self.cells {
            writeln!(
                f,
                "| {c} | {} | {} | {} | {} | {} |",
                s.runs, s.ops, s.images, s.failed, s.failed_at_flush
            )?;
        }
        writeln!(f)?;
        writeln!(f, "| failure | images | at a flush | meaning |")?;
        writeln!(f, "|---|---:|---:|---|")?;
        for k in FailKind::ALL {
            let s = self.kinds.get(&k).cloned().unwrap_or_default();
            writeln!(f, "| {} | {} | {} | {} |", k.name(), s.images, s.at_flush, k.meaning())?;
        }
        writeln!(f, "\nfsync'd bytes lost: {}", self.lost_bytes)?;
        if self.leaked_images > 0 {
            writeln!(
                f,
                "container images with leaked clusters (qemu-img check exit 3, accepted): {}",
                self.leaked_images
            )?;
        }
        for e in &self.run_errors {
            writeln!(f, "run failed: {e}")?;
        }
        for k in FailKind::ALL {
            let Some(first) = self.kinds.get(&k).and_then(|s| s.first.as_ref()) else {
                continue;
            };
            writeln!(f, "\nfirst {} ({} at {}):", k.name(), first.run, first.cut)?;
            for l in first.detail.lines().take(10) {
                writeln!(f, "    {l}")?;
            }
            if let Some(p) = &first.image {
                writeln!(f, "  image kept: {}", p.display())?;
            }
            writeln!(f, "  reproduce: {}", first.repro)?;
        }
        Ok(())
    }
}

/// Choose up to `n` crash points of `log`: at most half at flushes (all of
/// them when there are few; a flush with no write since the previous one
/// gives the previous one's image and is skipped in favour of the later
/// one, whose promises are a superset), the rest random cuts. Sorted so
/// [`CrashImages`] moves forward.
pub fn choose_cuts(log: &WriteLog, n: usize, seed: u64) -> Vec<CrashPoint> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x00c0_ffee_d00d);
    let all = log.flush_cuts();
    let mut flush: Vec<CrashPoint> = Vec::new();
    for (i, c) in all.iter().enumerate() {
        let next_has_no_write = all
            .get(i + 1)
            .is_some_and(|nx| !log.entries()[c.end..nx.end].iter().any(|e| e.is_write()));
        if !next_has_no_write {
            flush.push(*c);
        }
    }
    let mut random_possible = log.entries().iter().any(|e| e.is_write());
    let nflush = if random_possible { n.div_ceil(2) } else { n };
    if flush.len() > nflush {
        let last = flush.pop().expect("not empty");
        flush.shuffle(&mut rng);
        flush.truncate(nflush.saturating_sub(1));
        flush.push(last);
    }
    let mut out = flush;
    // The image before anything was written: every run's baseline.
    if let Ok(c) = log.random_cut_at(0, 0) {
        out.push(c);
    }
    let mut seen: BTreeSet<(usize, u64)> = BTreeSet::new();
    let mut tries = 0;
    while out.len() < n && random_possible {
        match log.random_cut(&mut rng) {
            Some(c) => {
                if seen.insert((c.end, c.drop_seed.unwrap_or(0))) {
                    out.push(c);
                }
            }
            None => random_possible = false,
        }
        tries += 1;
        if tries > 20 * n {
            break;
        }
    }
    out.sort_by_key(|c| (c.durable, c.end));
    out
}

/// Check `cuts` of `rec` on `threads` threads; `keep`: where to save the
/// first image of each kind not in `saved` yet.
pub fn check_run(
    rec: &Recorded,
    cuts: &[CrashPoint],
    threads: usize,
    keep: Option<&PathBuf>,
    saved: &Mutex<BTreeSet<FailKind>>,
    repro: &str,
) -> Summary {
    let cell = rec.spec.cell();
    let sum = Mutex::new(Summary {
        runs: 1,
        cells: [(
            cell.clone(),
            CellStats {
                runs: 1,
                ops: rec.ops,
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    });
    let threads = threads.max(1);
    let tally = &Tally {
        rec,
        cell: &cell,
        sum: &sum,
        keep,
        saved,
        repro,
    };
    std::thread::scope(|s| {
        for k in 0..threads {
            let sum = &sum;
            s.spawn(move || {
                let checker = match Checker::new(&format!("check{k}")) {
                    Ok(c) => c,
                    Err(e) => {
                        sum.lock()
                            .expect("summary")
                            .run_errors
                            .push(format!("scratch directory: {e}"));
                        return;
                    }
                };
                let mut images = CrashImages::new(&rec.log, rec.base.to_vec());
                let mut img = Vec::new();
                for cut in cuts.iter().skip(k).step_by(threads) {
                    match images.image_into(cut, &mut img) {
                        Ok(()) => {}
                        Err(e) => {
                            sum.lock()
                                .expect("summary")
                                .run_errors
                                .push(format!("{}: building {cut}: {e}", rec.spec.label()));
                            return;
                        }
                    };
                    let checked = checker.check_full(rec, cut, &img);
                    if checked.leaked {
                        sum.lock().expect("summary").leaked_images += 1;
                    }
                    tally.record(cut, &img, &checked.failures);
                }
            });
        }
    });
    sum.into_inner().expect("summary")
}

/// What every checked image of one recorded run is counted into, shared
/// by the checking threads.
struct Tally<'a> {
    rec: &'a Recorded,
    /// The summary's cell of this run (workload/filesystem).
    cell: &'a str,
    sum: &'a Mutex<Summary>,
    /// Where to save the first image of each failure kind.
    keep: Option<&'a PathBuf>,
    /// The kinds an image was saved for already (across runs).
    saved: &'a Mutex<BTreeSet<FailKind>>,
    /// The command that reproduces a run, `{}` for its arguments.
    repro: &'a str,
}

impl Tally<'_> {
    /// Count the image of `cut` and its failures; save it if it is the
    /// first of a failure kind.
    fn record(&self, cut: &CrashPoint, img: &[u8], fails: &[Failure]) {
        let Tally {
            rec,
            cell,
            sum,
            keep,
            saved,
            repro,
        } = *self;
        let kinds: BTreeSet<FailKind> = fails.iter().map(|f| f.kind).collect();
        let repro_cmd = repro.replace("{}", &format!("{} --cut {cut}", rec.spec.args()));
        let mut image_path = None;
        // Held to the end: the image kept for a kind and the first failure the
        // summary reports for it must be the same one.
        let mut saved = saved.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dir) = keep {
            let new: Vec<FailKind> = kinds.iter().copied().filter(|k| !saved.contains(k)).collect();
            saved.extend(new.iter().copied());
            if let Some(k) = new.first() {
                let name = format!(
                    "{}-{}-s{}-{}",
                    k.name(),
                    rec.spec.cell().replace('/', "-"),
                    rec.spec.seed,
                    cut.to_string().replace(['@', '/'], "_")
                );
                let report = format!(
                    "run: {}\ncut: {cut} (flushes {}, {} writes dropped)\nreproduce: {repro_cmd}{}\n\n{}\n\n{}",
                    rec.spec.label(),
                    cut.flushes,
                    cut.dropped(&rec.log),
                    if rec.spec.threads > 1 {
                        " (several threads: a rerun records another interleaving; this image and the log below are \
                         the evidence)"
                    } else {
                        ""
                    },
                    fails
                        .iter()
                        .map(|f| format!("[{}] {}", f.kind, f.detail))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    crate::check::explain(rec, cut, 60)
                );
                image_path = save_image(dir, &name, img, &report).ok();
            }
        }
        let mut s = sum.lock().expect("summary");
        s.images += 1;
        if cut.is_flush_cut() {
            s.flush_images += 1;
        }
        let c = s.cells.get_mut(cell).expect("the run's cell");
        c.images += 1;
        if !kinds.is_empty() {
            c.failed += 1;
            if cut.is_flush_cut() {
                c.failed_at_flush += 1;
            }
            s.failed_images += 1;
        }
        s.lost_bytes += fails.iter().map(|f| f.lost_bytes).sum::<u64>();
        for k in kinds {
            let e = s.kinds.entry(k).or_default();
            e.images += 1;
            if cut.is_flush_cut() {
                e.at_flush += 1;
            }
            if e.first.is_none() {
                e.first = Some(FirstFailure {
                    run: rec.spec.label(),
                    cut: cut.to_string(),
                    detail: fails
                        .iter()
                        .filter(|f| f.kind == k)
                        .map(|f| f.detail.clone())
                        .collect::<Vec<_>>()
                        .join("\n"),
                    repro: repro_cmd.clone(),
                    image: image_path.clone(),
                });
            }
        }
    }
}

/// Run the campaign, calling `progress` with a line after each run.
pub fn run_campaign(c: &Campaign, mut progress: impl FnMut(&str)) -> Summary {
    let t0 = Instant::now();
    let mut total = Summary::default();
    let saved = Mutex::new(BTreeSet::new());
    for (i, spec) in c.runs.iter().enumerate() {
        let t = Instant::now();
        let rec = match run(spec) {
            Ok(r) => r,
            Err(e) => {
                let msg = format!(
                    "{}: {e}\n  reproduce: {}",
                    spec.label(),
                    c.repro.replace("{}", &spec.args())
                );
                progress(&format!("[{}/{}] {msg}", i + 1, c.runs.len()));
                total.run_errors.push(msg);
                total.runs += 1;
                continue;
            }
        };
        let cuts = choose_cuts(&rec.log, c.images_per_run, spec.seed);
        let s = check_run(&rec, &cuts, c.check_threads, c.keep.as_ref(), &saved, &c.repro);
        let kinds: Vec<String> = s
            .kinds
            .iter()
            .map(|(k, v)| format!("{} {}", k.name(), v.images))
            .collect();
        progress(&format!(
            "[{}/{}] {}: {} ops, {} log entries ({} flushes, {} KiB written), {} images, {} failing{}{} ({:.1} s)",
            i + 1,
            c.runs.len(),
            spec.label(),
            rec.ops,
            rec.log.len(),
            rec.log.flushes(),
            rec.log.data_bytes() >> 10,
            s.images,
            s.failed_images,
            if kinds.is_empty() { "" } else { ": " },
            kinds.join(", "),
            t.elapsed().as_secs_f64()
        ));
        total.add(&s);
    }
    total.elapsed = t0.elapsed();
    total
}
