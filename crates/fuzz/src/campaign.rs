//! Campaigns: many mutated images, each opened and walked on a worker
//! thread under `catch_unwind`, with a per-image time bound and a memory
//! watch.
//!
//! A panic is caught with its message and backtrace (a process-wide panic
//! hook captures them for fuzz cases only, so other tests in the same
//! binary still report panics normally). A hang cannot be interrupted — a
//! thread cannot be killed — so when an image exceeds its time bound the
//! campaign records the case, stops handing out work and returns, leaving
//! the stuck thread detached. Memory is watched through `/proc/self/status`
//! (and, where [`GuardedAlloc`](crate::alloc::GuardedAlloc) is installed,
//! live heap bytes). Every failure carries the exact command that replays
//! it.

use std::any::Any;
use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, Once};
use std::time::{Duration, Instant};

use ext4kit::{Fs, OpenOptions};
use ext4kit_blockdev::MemDevice;

use crate::base::{bases, BaseError, BaseImage};
use crate::mutate::Mutation;
use crate::walk::{error_kind, walk_with, WalkLimits, WalkReport};

/// Cache budget of the Fs opened for each image: generous enough that
/// eviction is not what is being measured, small enough for many workers.
pub const CASE_CACHE_BUDGET: usize = 32 << 20;

/// What happened to one image.
#[derive(Debug, Clone, Default)]
pub struct CaseResult {
    /// The open error's kind, if opening failed.
    pub open_error: Option<String>,
    /// The open error's message.
    pub open_message: Option<String>,
    /// The walk, if the image opened.
    pub walk: Option<WalkReport>,
    /// The panic, if the engine panicked.
    pub panic: Option<PanicReport>,
    /// Wall time of open + walk.
    pub elapsed: Duration,
}

impl CaseResult {
    /// Whether this case broke the no-panic / API contract.
    pub fn failed(&self) -> bool {
        self.panic.is_some() || self.walk.as_ref().is_some_and(|w| !w.violations.is_empty())
    }
}

/// A caught panic. The backtrace is captured in the panic hook but only
/// symbolised when displayed, which can take a second on a large binary:
/// doing it in the hook would make a panicking case look like a hang.
#[derive(Debug, Clone)]
pub struct PanicReport {
    /// Payload text and source location.
    pub message: String,
    /// Where it happened.
    pub backtrace: Arc<Backtrace>,
}

thread_local! {
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    static CAPTURED: RefCell<Option<PanicReport>> = const { RefCell::new(None) };
}

/// Install (once) the panic hook that captures message and backtrace of
/// panics inside fuzz cases and defers to the previous hook elsewhere.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CAPTURING.with(|c| c.get()) {
                let msg = payload_text(info.payload());
                let loc = info
                    .location()
                    .map(|l| format!(" at {}:{}:{}", l.file(), l.line(), l.column()))
                    .unwrap_or_default();
                let backtrace = Arc::new(Backtrace::force_capture());
                CAPTURED.with(|c| *c.borrow_mut() = Some(PanicReport { message: format!("{msg}{loc}"), backtrace }));
            } else {
                prev(info);
            }
        }));
    });
}

fn payload_text(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

/// Run `f`, catching a panic with its message, location and backtrace.
pub fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, PanicReport> {
    install_panic_hook();
    CAPTURING.with(|c| c.set(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    CAPTURING.with(|c| c.set(false));
    r.map_err(|payload| {
        let cap = CAPTURED.with(|c| c.borrow_mut().take());
        cap.unwrap_or_else(|| PanicReport {
            message: payload_text(payload.as_ref()),
            backtrace: Arc::new(Backtrace::disabled()),
        })
    })
}

/// Open and walk one image in memory, catching panics.
pub fn run_image(img: Vec<u8>, limits: &WalkLimits) -> CaseResult {
    let start = Instant::now();
    let r = guarded(|| {
        let dev = Arc::new(MemDevice::from_vec_read_only(img));
        match Fs::open_device(
            dev,
            &OpenOptions { read_only: true, cache_budget: CASE_CACHE_BUDGET, ..Default::default() },
        ) {
            Ok(fs) => {
                // The summary `ext4kit info` prints: formats every
                // superblock field a user sees (label, UUID, features).
                let _ = fs.info();
                (None, Some(walk_with(&fs, limits, None)))
            }
            Err(e) => (Some((error_kind("open", &e), e.to_string())), None),
        }
    });
    let mut out = CaseResult { elapsed: start.elapsed(), ..Default::default() };
    match r {
        Ok((open, walk)) => {
            if let Some((k, m)) = open {
                out.open_error = Some(k);
                out.open_message = Some(m);
            }
            out.walk = walk;
        }
        Err(p) => out.panic = Some(p),
    }
    out
}

/// Apply a mutation and run the image (the unit of a campaign).
pub fn run_case(bases: &[BaseImage], m: &Mutation, limits: &WalkLimits) -> CaseResult {
    crate::alloc::set_current_case(Some(m.seed));
    let r = run_image(m.apply(&bases[m.base]), limits);
    crate::alloc::set_current_case(None);
    r
}

/// The command that replays a mutation.
pub fn reproduce_command(m: &Mutation) -> String {
    let bin = "cargo run --release -p ext4kit-fuzz --bin ext4kit-fuzz-images --";
    if m.seed == u64::MAX {
        format!("{bin} --base {} --truncate {}", m.base_name, m.truncate_to.unwrap_or(0))
    } else {
        format!("{bin} --seed {}", m.seed)
    }
}

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The engine panicked.
    Panic,
    /// The image took longer than the time bound.
    Hang,
    /// Memory grew past the bound while these images were in flight.
    Memory,
    /// An API contract was broken (see [`WalkReport::violations`]).
    Violation,
}

/// One failure, with everything needed to replay and fix it.
#[derive(Debug, Clone)]
pub struct Failure {
    /// What kind.
    pub kind: FailureKind,
    /// The mutation's seed (`u64::MAX` for a pure truncation case).
    pub seed: u64,
    /// Panic message, hang duration, memory figure or violations.
    pub message: String,
    /// Backtrace of a panic (empty otherwise).
    pub backtrace: String,
    /// The mutation, field by field.
    pub mutation: String,
    /// Command that replays it.
    pub reproduce: String,
}

impl Failure {
    /// Backtrace frames inside ext4kit crates only (the useful part).
    pub fn short_backtrace(&self) -> String {
        let mut out = String::new();
        let mut keep_next = false;
        for line in self.backtrace.lines() {
            let t = line.trim_start();
            if t.starts_with("at ") {
                if keep_next {
                    let _ = writeln!(out, "      {t}");
                }
                continue;
            }
            keep_next = t.contains("ext4kit") && !t.contains("ext4kit_fuzz") && !t.contains("catch_unwind");
            if keep_next {
                let _ = writeln!(out, "  {t}");
            }
        }
        out
    }
}

/// Settings of a campaign.
#[derive(Debug, Clone)]
pub struct CampaignConfig {
    /// Worker threads.
    pub threads: usize,
    /// Longest one image may take before it counts as a hang.
    pub time_limit: Duration,
    /// Largest allowed growth of the process's resident memory (bytes).
    pub memory_limit: u64,
    /// Print a progress line to stderr this often.
    pub progress: Option<Duration>,
    /// Caps of each walk.
    pub limits: WalkLimits,
}

impl Default for CampaignConfig {
    fn default() -> Self {
        CampaignConfig {
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            time_limit: Duration::from_secs(5),
            memory_limit: 1 << 30,
            progress: None,
            limits: WalkLimits::default(),
        }
    }
}

/// The outcome of a campaign.
#[derive(Debug, Clone, Default)]
pub struct CampaignReport {
    /// Images tried (completed).
    pub images: u64,
    /// Images that opened.
    pub opened: u64,
    /// Open failures by kind.
    pub open_errors: BTreeMap<String, u64>,
    /// Errors during walks, by kind.
    pub walk_errors: BTreeMap<String, u64>,
    /// Names walked, bytes read, in total (coverage indicators).
    pub entries_walked: u64,
    /// Bytes read through pread.
    pub bytes_read: u64,
    /// Panics, hangs, memory blow-ups, contract violations.
    pub failures: Vec<Failure>,
    /// The slowest image: (case label, time).
    pub slowest: Option<(String, Duration)>,
    /// Peak growth of VmRSS over the campaign (bytes).
    pub peak_rss_growth: u64,
    /// Peak live heap (bytes), when the guarded allocator is installed.
    pub peak_heap: Option<u64>,
    /// Wall time.
    pub elapsed: Duration,
    /// The campaign stopped before all cases ran (hang or memory).
    pub stopped_early: bool,
}

impl CampaignReport {
    /// Failures of one kind.
    pub fn failures_of(&self, kind: FailureKind) -> impl Iterator<Item = &Failure> {
        self.failures.iter().filter(move |f| f.kind == kind)
    }

    /// No panic, hang, memory blow-up or violation.
    pub fn is_clean(&self) -> bool {
        self.failures.is_empty() && !self.stopped_early
    }

    /// A multi-line account of the campaign, failures first in full.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        for f in &self.failures {
            let _ = writeln!(
                s,
                "=== {:?} (seed {}) ===\n{}\nmutation: {}\nreproduce: {}",
                f.kind, f.seed, f.message, f.mutation, f.reproduce
            );
            if !f.backtrace.is_empty() {
                let _ = writeln!(s, "backtrace (ext4kit frames):\n{}", f.short_backtrace());
            }
        }
        let _ = writeln!(
            s,
            "images: {}, opened: {} ({:.1}%), panics: {}, hangs: {}, memory: {}, violations: {}{}",
            self.images,
            self.opened,
            100.0 * self.opened as f64 / self.images.max(1) as f64,
            self.failures_of(FailureKind::Panic).count(),
            self.failures_of(FailureKind::Hang).count(),
            self.failures_of(FailureKind::Memory).count(),
            self.failures_of(FailureKind::Violation).count(),
            if self.stopped_early { " (STOPPED EARLY)" } else { "" }
        );
        let _ = writeln!(
            s,
            "elapsed: {:.1?}, slowest: {}, peak RSS growth: {} MiB{}, names walked: {}, bytes read: {} MiB",
            self.elapsed,
            self.slowest.as_ref().map(|(l, d)| format!("{l} in {d:.1?}")).unwrap_or_else(|| "-".into()),
            self.peak_rss_growth >> 20,
            self.peak_heap.map(|h| format!(", peak heap: {} MiB", h >> 20)).unwrap_or_default(),
            self.entries_walked,
            self.bytes_read >> 20
        );
        let _ = writeln!(s, "open errors by kind:");
        for (k, n) in &self.open_errors {
            let _ = writeln!(s, "  {n:>6}  {k}");
        }
        let _ = writeln!(s, "walk errors by kind:");
        for (k, n) in &self.walk_errors {
            let _ = writeln!(s, "  {n:>6}  {k}");
        }
        s
    }

    fn absorb(&mut self, m: &Mutation, r: CaseResult) {
        self.images += 1;
        if self.slowest.as_ref().is_none_or(|(_, d)| r.elapsed > *d) {
            self.slowest = Some((m.label(), r.elapsed));
        }
        if let Some(k) = r.open_error {
            *self.open_errors.entry(k).or_default() += 1;
        }
        if let Some(w) = &r.walk {
            self.opened += 1;
            self.entries_walked += w.entries;
            self.bytes_read += w.bytes_read;
            for (k, n) in &w.errors {
                *self.walk_errors.entry(k.clone()).or_default() += n;
            }
            if !w.violations.is_empty() {
                self.failures.push(Failure {
                    kind: FailureKind::Violation,
                    seed: m.seed,
                    message: w.violations.join("\n"),
                    backtrace: String::new(),
                    mutation: m.describe(),
                    reproduce: reproduce_command(m),
                });
            }
        }
        if let Some(p) = r.panic {
            self.failures.push(Failure {
                kind: FailureKind::Panic,
                seed: m.seed,
                message: p.message,
                backtrace: p.backtrace.to_string(),
                mutation: m.describe(),
                reproduce: reproduce_command(m),
            });
        }
    }
}

/// Resident set size and its high-water mark, in bytes.
pub fn rss() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Run the mutations of `seeds` over the shared fuzzing bases.
pub fn run_campaign(seeds: Range<u64>, time_limit_per_image: Duration) -> Result<CampaignReport, BaseError> {
    let cfg = CampaignConfig { time_limit: time_limit_per_image, ..Default::default() };
    run_seeds(seeds, &cfg)
}

/// [`run_campaign`] with full settings.
pub fn run_seeds(seeds: Range<u64>, cfg: &CampaignConfig) -> Result<CampaignReport, BaseError> {
    let b = bases()?;
    let start = seeds.start;
    let n = seeds.end.saturating_sub(seeds.start);
    Ok(run_cases(b, n, Arc::new(move |i| Mutation::generate(start + i, b)), cfg))
}

/// What a worker is doing: (case index, start time), or idle.
type Slot = Mutex<Option<(u64, Instant)>>;

/// Case generator: case index → mutation.
pub type CaseFn = Arc<dyn Fn(u64) -> Mutation + Send + Sync>;

/// Run `n` cases made by `make` on `cfg.threads` workers.
pub fn run_cases(bases: &'static [BaseImage], n: u64, make: CaseFn, cfg: &CampaignConfig) -> CampaignReport {
    run_cases_with(n, make, cfg, Arc::new(move |m, limits| run_case(bases, m, limits)))
}

/// How a worker runs one case (the engine, or a stand-in in self-tests).
pub type ExecFn = Arc<dyn Fn(&Mutation, &WalkLimits) -> CaseResult + Send + Sync>;

/// [`run_cases`] with the per-case work supplied by the caller, so the
/// harness itself (panic capture, hang and memory detection) can be tested
/// against cases that are known to fail.
pub fn run_cases_with(n: u64, make: CaseFn, cfg: &CampaignConfig, exec: ExecFn) -> CampaignReport {
    install_panic_hook();
    let t0 = Instant::now();
    let (rss0, _) = rss();
    crate::alloc::reset_peak_heap();
    let threads = cfg.threads.max(1);
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let slots: Arc<Vec<Slot>> = Arc::new((0..threads).map(|_| Mutex::new(None)).collect());
    let (tx, rx) = mpsc::channel::<(Mutation, CaseResult)>();
    let mut handles = Vec::new();
    for t in 0..threads {
        let (next, stop, slots, tx, make, exec, limits) =
            (next.clone(), stop.clone(), slots.clone(), tx.clone(), make.clone(), exec.clone(), cfg.limits.clone());
        let h = std::thread::Builder::new()
            .name(format!("fuzz-worker-{t}"))
            .spawn(move || loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let m = make(i);
                *slots[t].lock().unwrap_or_else(|e| e.into_inner()) = Some((i, Instant::now()));
                let r = exec(&m, &limits);
                *slots[t].lock().unwrap_or_else(|e| e.into_inner()) = None;
                if tx.send((m, r)).is_err() {
                    break;
                }
            })
            .expect("spawning a fuzz worker");
        handles.push(h);
    }
    drop(tx);
    let mut rep = CampaignReport::default();
    let mut last_progress = Instant::now();
    let mut hung: Vec<usize> = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok((m, r)) => rep.absorb(&m, r),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        let (now_rss, _) = rss();
        rep.peak_rss_growth = rep.peak_rss_growth.max(now_rss.saturating_sub(rss0));
        if !stop.load(Ordering::Relaxed) {
            for (t, slot) in slots.iter().enumerate() {
                let cur = *slot.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((i, since)) = cur {
                    if since.elapsed() > cfg.time_limit {
                        let m = make(i);
                        rep.failures.push(Failure {
                            kind: FailureKind::Hang,
                            seed: m.seed,
                            message: format!(
                                "image still running after {:.1?} (limit {:.1?})",
                                since.elapsed(),
                                cfg.time_limit
                            ),
                            backtrace: String::new(),
                            mutation: m.describe(),
                            reproduce: reproduce_command(&m),
                        });
                        hung.push(t);
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
            if rep.peak_rss_growth > cfg.memory_limit {
                let inflight: Vec<String> = slots
                    .iter()
                    .filter_map(|s| *s.lock().unwrap_or_else(|e| e.into_inner()))
                    .map(|(i, _)| {
                        let m = make(i);
                        format!("seed {} ({})", m.seed, reproduce_command(&m))
                    })
                    .collect();
                let first =
                    slots.iter().find_map(|s| *s.lock().unwrap_or_else(|e| e.into_inner())).map(|(i, _)| make(i));
                rep.failures.push(Failure {
                    kind: FailureKind::Memory,
                    seed: first.as_ref().map_or(u64::MAX, |m| m.seed),
                    message: format!(
                        "resident memory grew by {} MiB (limit {} MiB); in flight: {}",
                        rep.peak_rss_growth >> 20,
                        cfg.memory_limit >> 20,
                        inflight.join(", ")
                    ),
                    backtrace: String::new(),
                    mutation: first.as_ref().map(|m| m.describe()).unwrap_or_default(),
                    reproduce: first.as_ref().map(reproduce_command).unwrap_or_default(),
                });
                stop.store(true, Ordering::Relaxed);
            }
        }
        if stop.load(Ordering::Relaxed) {
            // Let the healthy workers finish their current image (bounded),
            // then give up on the stuck ones.
            let deadline = Instant::now() + cfg.time_limit;
            while Instant::now() < deadline {
                let busy = slots
                    .iter()
                    .enumerate()
                    .any(|(t, s)| !hung.contains(&t) && s.lock().unwrap_or_else(|e| e.into_inner()).is_some());
                while let Ok((m, r)) = rx.try_recv() {
                    rep.absorb(&m, r);
                }
                if !busy {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            rep.stopped_early = true;
            break;
        }
        if let Some(every) = cfg.progress {
            if last_progress.elapsed() >= every {
                last_progress = Instant::now();
                eprintln!(
                    "[{:>6.1?}] {} / {n} images, {} opened, {} failures, RSS +{} MiB",
                    t0.elapsed(),
                    rep.images,
                    rep.opened,
                    rep.failures.len(),
                    rep.peak_rss_growth >> 20
                );
            }
        }
    }
    for (t, h) in handles.into_iter().enumerate() {
        if !hung.contains(&t) && (h.is_finished() || !rep.stopped_early) {
            let _ = h.join();
        }
    }
    rep.peak_heap = crate::alloc::peak_heap_bytes().map(|h| h as u64);
    rep.elapsed = t0.elapsed();
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(seed: u64) -> Mutation {
        Mutation {
            seed,
            base: 0,
            base_name: "none".into(),
            edits: Vec::new(),
            touched: Vec::new(),
            fix_checksums: false,
            truncate_to: None,
        }
    }

    /// The harness must see the failures it exists to find: a panic (with
    /// message, location and backtrace), a hang, and a contract violation.
    #[test]
    fn harness_catches_panics_hangs_and_violations() {
        // Generous bound: the test must not mistake a starved thread on a
        // loaded 2-core machine for a hang.
        let cfg = CampaignConfig { threads: 2, time_limit: Duration::from_secs(2), ..Default::default() };
        let exec: ExecFn = Arc::new(|m, _| {
            let start = Instant::now();
            let r = guarded(|| match m.seed {
                3 => panic!("injected panic"),
                4 => Some(WalkReport { violations: vec!["injected violation".into()], ..Default::default() }),
                _ => Some(WalkReport::default()),
            });
            let mut out = CaseResult { elapsed: start.elapsed(), ..Default::default() };
            match r {
                Ok(w) => out.walk = w,
                Err(p) => out.panic = Some(p),
            }
            if m.seed == 40 {
                std::thread::sleep(Duration::from_secs(20));
            }
            out
        });
        let rep = run_cases_with(1000, Arc::new(case), &cfg, exec);
        let panics: Vec<_> = rep.failures_of(FailureKind::Panic).collect();
        assert_eq!(panics.len(), 1, "{}", rep.summary());
        assert_eq!(panics[0].seed, 3);
        assert!(panics[0].message.starts_with("injected panic at "), "{}", panics[0].message);
        assert!(panics[0].backtrace.contains("harness_catches"), "no backtrace: {:?}", panics[0].backtrace);
        assert!(panics[0].reproduce.ends_with("--seed 3"));
        assert_eq!(rep.failures_of(FailureKind::Violation).map(|f| f.seed).collect::<Vec<_>>(), [4]);
        let hangs: Vec<_> = rep.failures_of(FailureKind::Hang).collect();
        assert_eq!(hangs.len(), 1, "{}", rep.summary());
        assert_eq!(hangs[0].seed, 40);
        assert!(rep.stopped_early && !rep.is_clean());
        assert!(rep.images < 1000, "the campaign must stop at a hang");
    }

    /// Panics outside fuzz cases still reach the previous hook (and the
    /// capture slot stays empty), so other tests are not silenced.
    #[test]
    fn capture_is_scoped_to_cases() {
        install_panic_hook();
        let r = std::panic::catch_unwind(|| panic!("outside"));
        assert!(r.is_err());
        assert!(CAPTURED.with(|c| c.borrow().is_none()));
    }
}
