//! One case — a damaged image, one operation, one frontend — and its
//! verdict; and a campaign over many.
//!
//! The rule (the compatibility contract: "nothing already on disk is made
//! worse"): the operation succeeds and `e2fsck -fn` finds no problem it
//! did not find before, or it refuses and the image is byte-identical —
//! except for the superblock's error record (`s_state`'s error bit,
//! `s_error_count`, first/last error), which is what the kernel's
//! `ext4_error` writes when it meets damage. A refusal that blames damage
//! must say "run e2fsck".

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use super::corpus::{damage_bases, scratch_dir, Damage, DamageBase, Kind};
use super::fsck::Fsck;
use super::ops::Op;

/// Which frontend runs the operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frontend {
    /// In-process library calls.
    Library,
    /// The `ext4kit` binary at this path.
    Cli(PathBuf),
}

impl Frontend {
    /// "lib" or "cli".
    pub fn name(&self) -> &'static str {
        match self {
            Frontend::Library => "lib",
            Frontend::Cli(_) => "cli",
        }
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Succeeded; e2fsck no worse.
    Succeeded,
    /// Refused; image byte-identical (`recorded`: apart from the error record).
    Refused {
        /// The message.
        msg: String,
        /// The superblock's error record was written.
        recorded: bool,
    },
    /// Succeeded but e2fsck found new problems.
    Worse(String),
    /// Refused but changed the image.
    RefusedChanged {
        /// The message.
        msg: String,
        /// What e2fsck now says beyond before (empty: no worse, but changed).
        worse: String,
    },
    /// A refusal that blames damage without saying "run e2fsck".
    Unclear(String),
    /// The engine panicked.
    Panic(String),
    /// The operation did not finish in time.
    Hang,
    /// The case could not be run (scratch file, missing tool).
    Broken(String),
}

impl Outcome {
    /// Whether this breaks the rule.
    pub fn is_failure(&self) -> bool {
        !matches!(self, Outcome::Succeeded | Outcome::Refused { .. })
    }

    /// Short class name for tables.
    pub fn class(&self) -> &'static str {
        match self {
            Outcome::Succeeded => "ok",
            Outcome::Refused { recorded: false, .. } => "refused",
            Outcome::Refused { recorded: true, .. } => "refused+recorded",
            Outcome::Worse(_) => "WORSE",
            Outcome::RefusedChanged { .. } => "REFUSED-CHANGED",
            Outcome::Unclear(_) => "UNCLEAR",
            Outcome::Panic(_) => "PANIC",
            Outcome::Hang => "HANG",
            Outcome::Broken(_) => "BROKEN",
        }
    }
}

/// Superblock byte ranges (relative to its start) the kernel's error
/// record writes: `s_state`, `s_error_count` .. `s_last_error_func`,
/// the error times' high bytes and errcodes, `s_checksum`.
const ERROR_RECORD: &[(usize, usize)] = &[(0x3A, 0x3C), (0x194, 0x200), (0x278, 0x27C), (0x3FC, 0x400)];

/// Compare `before` and `after`: `Some(false)` identical, `Some(true)`
/// identical apart from the superblock's error record, `None` different.
pub fn compare_images(before: &[u8], after: &[u8]) -> Option<bool> {
    if before == after {
        return Some(false);
    }
    if before.len() != after.len() || before.len() < 2048 {
        return None;
    }
    let masked = |img: &[u8]| {
        let mut v = img[1024..2048].to_vec();
        for &(a, b) in ERROR_RECORD {
            v[a..b].fill(0);
        }
        v
    };
    let same_rest = before[..1024] == after[..1024] && before[2048..] == after[2048..];
    let state = u16::from_le_bytes([after[1024 + 0x3A], after[1024 + 0x3B]]);
    (same_rest && masked(before) == masked(after) && state & 2 != 0).then_some(true)
}

/// Whether a refusal's message blames damage (it must then say "run
/// e2fsck").
pub fn blames_damage(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    m.contains("corrupt") || m.contains("structure needs cleaning")
}

/// Run `op` on a copy of `img` (written to `path`) through `fe`.
pub fn run_case(img: &[u8], before: &Fsck, op: Op, fe: &Frontend, path: &Path, limit: Duration) -> Outcome {
    if let Err(e) = std::fs::write(path, img) {
        return Outcome::Broken(format!("writing {}: {e}", path.display()));
    }
    let result: Result<Result<(), String>, Outcome> = match fe {
        Frontend::Library => run_library(op, path, limit),
        Frontend::Cli(bin) => run_cli(op, path, bin, limit),
    };
    let after = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => return Outcome::Broken(format!("reading {} back: {e}", path.display())),
    };
    let out = match result {
        Err(o) => o,
        Ok(Ok(())) => {
            if after == img {
                Outcome::Succeeded
            } else {
                match Fsck::run(path) {
                    Ok(f) => match before.worse(&f) {
                        None => Outcome::Succeeded,
                        Some(w) => Outcome::Worse(w),
                    },
                    Err(e) => Outcome::Broken(e),
                }
            }
        }
        Ok(Err(msg)) => match compare_images(img, &after) {
            Some(_) if blames_damage(&msg) && !msg.contains("e2fsck") => Outcome::Unclear(msg),
            Some(recorded) => Outcome::Refused { msg, recorded },
            None => {
                let worse = match Fsck::run(path) {
                    Ok(f) => before.worse(&f).unwrap_or_default(),
                    Err(e) => e,
                };
                Outcome::RefusedChanged { msg, worse }
            }
        },
    };
    let _ = std::fs::remove_file(path);
    out
}

fn run_library(op: Op, path: &Path, limit: Duration) -> Result<Result<(), String>, Outcome> {
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    let spawned = std::thread::Builder::new().name("damaged-op".into()).spawn(move || {
        let r = catch_unwind(AssertUnwindSafe(|| {
            let fs = ext4kit::Fs::open_image(&p, &ext4kit::OpenOptions { read_only: false, ..Default::default() })
                .map_err(|e| e.to_string())?;
            let r = op.run_library(&fs).map_err(|e| e.to_string());
            drop(fs);
            r
        }));
        let _ = tx.send(r);
    });
    if let Err(e) = spawned {
        return Err(Outcome::Broken(format!("spawning a thread: {e}")));
    }
    match rx.recv_timeout(limit) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(p)) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            Err(Outcome::Panic(msg))
        }
        Err(_) => Err(Outcome::Hang),
    }
}

fn run_cli(op: Op, path: &Path, bin: &Path, limit: Duration) -> Result<Result<(), String>, Outcome> {
    let host = path.parent().unwrap_or(Path::new("/tmp"));
    let args = op.cli_args(path, host).map_err(|e| Outcome::Broken(format!("put source: {e}")))?;
    run_binary(bin, &args, limit)
}

/// Run `bin ARGS` under `timeout`: `Ok(Ok(()))` on success, `Ok(Err(msg))`
/// on a refusal (its stderr), `Err` on a panic or a hang.
pub fn run_binary(bin: &Path, args: &[String], limit: Duration) -> Result<Result<(), String>, Outcome> {
    let out = Command::new("timeout")
        .arg(limit.as_secs().max(1).to_string())
        .arg(bin)
        .args(args)
        .output()
        .map_err(|e| Outcome::Broken(format!("running {}: {e}", bin.display())))?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    match out.status.code() {
        Some(0) => Ok(Ok(())),
        Some(124) => Err(Outcome::Hang),
        None => Err(Outcome::Panic(format!("killed by a signal ({}): {stderr}", out.status))),
        _ if stderr.contains("panicked") => Err(Outcome::Panic(stderr)),
        _ => Ok(Err(stderr.trim().to_string())),
    }
}

/// The `ext4kit` binary: `$EXT4KIT_BIN`, else beside the running test's
/// profile directory, else built there with cargo (the same profile and
/// target directory as the running test).
pub fn find_cli() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("EXT4KIT_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    let mut dir = exe.parent().ok_or("no parent")?.to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("ext4kit");
    let profile = dir.file_name().and_then(|s| s.to_str()).unwrap_or("debug").to_string();
    let profile = if profile == "debug" { "dev".to_string() } else { profile };
    let target = dir.parent().ok_or("no target dir")?.to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Always ask cargo: a stale binary would test old code.
    let st = Command::new(&cargo)
        .args(["build", "--quiet", "-p", "ext4kit-cli", "--bin", "ext4kit", "--profile", &profile])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status();
    match st {
        Ok(s) if s.success() && bin.exists() => Ok(bin),
        Ok(s) => Err(format!(
            "building the ext4kit binary ({cargo} build -p ext4kit-cli --profile {profile}) failed ({s}); set EXT4KIT_BIN to a built one"
        )),
        Err(e) => Err(format!("running {cargo} to build the ext4kit binary: {e}; set EXT4KIT_BIN to a built one")),
    }
}

/// One case's record.
#[derive(Debug, Clone)]
pub struct CaseRecord {
    /// The damage.
    pub damage: String,
    /// Its kind.
    pub kind: Kind,
    /// The base's name.
    pub base: &'static str,
    /// The seed.
    pub seed: u64,
    /// The operation.
    pub op: Op,
    /// "lib" or "cli".
    pub frontend: &'static str,
    /// The verdict.
    pub outcome: Outcome,
}

/// A campaign's results.
#[derive(Debug, Default)]
pub struct CorpusReport {
    /// Every case.
    pub cases: Vec<CaseRecord>,
    /// Images e2fsck could not check in time (skipped).
    pub uncheckable: usize,
    /// Images.
    pub images: usize,
}

impl CorpusReport {
    /// The failing cases.
    pub fn failures(&self) -> Vec<&CaseRecord> {
        self.cases.iter().filter(|c| c.outcome.is_failure()).collect()
    }

    /// Count of each outcome class per damage kind, as a text table.
    pub fn table(&self) -> String {
        let classes =
            ["ok", "refused", "refused+recorded", "WORSE", "REFUSED-CHANGED", "UNCLEAR", "PANIC", "HANG", "BROKEN"];
        let mut rows: BTreeMap<String, BTreeMap<&str, usize>> = BTreeMap::new();
        for c in &self.cases {
            *rows.entry(format!("{:?}", c.kind)).or_default().entry(c.outcome.class()).or_default() += 1;
            *rows.entry("~ all".into()).or_default().entry(c.outcome.class()).or_default() += 1;
        }
        let mut s = format!("{:<20}", "damage");
        for c in classes {
            s += &format!(" {c:>16}");
        }
        s.push('\n');
        for (k, v) in rows {
            s += &format!("{k:<20}");
            for c in classes {
                s += &format!(" {:>16}", v.get(c).copied().unwrap_or(0));
            }
            s.push('\n');
        }
        s
    }

    /// One line per failure.
    pub fn failure_lines(&self) -> String {
        let mut s = String::new();
        for c in self.failures() {
            let detail = match &c.outcome {
                Outcome::Worse(w) => w.clone(),
                Outcome::RefusedChanged { msg, worse } => {
                    format!("refused ({msg}) but changed the image; new: {worse}")
                }
                Outcome::Unclear(m) | Outcome::Panic(m) | Outcome::Broken(m) => m.clone(),
                Outcome::Hang => "hang".into(),
                _ => String::new(),
            };
            s += &format!(
                "[{}] seed {} {}: {} :: {}\n    -> {}: {}\n",
                c.frontend,
                c.seed,
                c.base,
                c.damage,
                c.op.label(),
                c.outcome.class(),
                detail
            );
        }
        s
    }
}

/// Campaign settings.
#[derive(Debug, Clone)]
pub struct CorpusConfig {
    /// Seeds (one damaged image each).
    pub seeds: Vec<u64>,
    /// Operations to run on every image.
    pub ops: Vec<Op>,
    /// Frontends; the CLI runs only every `cli_every`-th operation of an
    /// image (the binary costs a process per case).
    pub frontends: Vec<Frontend>,
    /// See `frontends`.
    pub cli_every: usize,
    /// Worker threads.
    pub threads: usize,
    /// Time bound per operation.
    pub limit: Duration,
    /// Print each failure as it happens.
    pub verbose: bool,
}

/// Run the campaign: each seed's damaged image, e2fsck before, then
/// every operation on a fresh copy through every frontend.
pub fn run_corpus(cfg: &CorpusConfig) -> Result<CorpusReport, String> {
    let bases = damage_bases().map_err(|e| e.0)?;
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let next = AtomicUsize::new(0);
    let seeds = &cfg.seeds;
    let report = Mutex::new(CorpusReport::default());
    std::thread::scope(|s| {
        for w in 0..cfg.threads.max(1) {
            let (next, report, dir) = (&next, &report, &dir);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&seed) = seeds.get(i) else { break };
                let recs = run_image(bases, seed, cfg, &dir.join(format!("w{w}.img")));
                let mut r = report.lock().unwrap_or_else(|p| p.into_inner());
                r.images += 1;
                match recs {
                    None => r.uncheckable += 1,
                    Some(recs) => {
                        if cfg.verbose {
                            let loud =
                                |o: &Outcome| o.is_failure() || matches!(o, Outcome::Refused { recorded: true, .. });
                            for c in recs.iter().filter(|c| loud(&c.outcome)) {
                                eprintln!(
                                    "[{}] seed {} {:?} {}: {}",
                                    c.frontend,
                                    c.seed,
                                    c.outcome,
                                    c.damage,
                                    c.op.label()
                                );
                            }
                        }
                        r.cases.extend(recs)
                    }
                }
            });
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report.into_inner().unwrap_or_else(|p| p.into_inner()))
}

/// All cases of one seed's image; `None` when e2fsck cannot check it.
fn run_image(bases: &[DamageBase], seed: u64, cfg: &CorpusConfig, path: &Path) -> Option<Vec<CaseRecord>> {
    let d = Damage::generate(seed, bases);
    let img = d.apply(bases);
    std::fs::write(path, &img).ok()?;
    let before = Fsck::run(path).ok()?;
    if !before.finished() {
        return None;
    }
    let mut out = Vec::new();
    for (k, &op) in cfg.ops.iter().enumerate() {
        for fe in &cfg.frontends {
            if matches!(fe, Frontend::Cli(_)) && !(k + seed as usize).is_multiple_of(cfg.cli_every.max(1)) {
                continue;
            }
            let outcome = run_case(&img, &before, op, fe, path, cfg.limit);
            out.push(CaseRecord {
                damage: d.describe(bases),
                kind: d.kind,
                base: bases[d.base].name,
                seed,
                op,
                frontend: fe.name(),
                outcome,
            });
        }
    }
    Some(out)
}
