//! e2fsprogs' own corrupt test images as hostile input for the write
//! paths: `ext4kit-damaged --e2fsprogs DIR`.
//!
//! e2fsprogs keeps about two hundred damaged filesystems as regression
//! tests for e2fsck (`tests/f_*/image.gz`, a few `image.bz2` or plain
//! `image`): duplicate and cross-linked blocks, bad-block inodes listing
//! metadata, lying bitmaps and group counts, htree and extent damage,
//! orphan chains, duplicate names. They were made by hand, by other tools
//! and by real crashes, so they reach shapes our own seeded corpus
//! ([`super::corpus`]) does not. This is a campaign, not a CI test: CI
//! must not depend on anything fetched from outside the repository.
//!
//! For every image (a decompressed copy in a scratch directory):
//!
//! 1. `e2fsck -fn` — the problems before (of a copy replayed by
//!    `e2fsck -E journal_only` when the journal needs recovery: the first
//!    write replays it, as a mount would);
//! 2. `ext4kit mkdir IMG /ext4kit-probe`;
//! 3. `ext4kit put TREE IMG:/ext4kit-probe` — a small host tree: a 24 KiB
//!    file `big.bin` (several blocks on every block size), a 112-byte file,
//!    a file in a subdirectory and a symlink (put copies in name order, so
//!    `big.bin` is made first: many test images have only a few free
//!    inodes);
//! 4. `ext4kit rm IMG /ext4kit-probe/tree/big.bin` — the 24 KiB file;
//! 5. `e2fsck -fn` — the problems after.
//!
//! The image is made worse when a normalised problem line appears more
//! often after than before ([`Fsck::worse`], the seeded corpus' rule). A
//! step may refuse: it must then leave the image as the step found it
//! (apart from the superblock's error record, which the kernel's
//! `ext4_error` writes too) and, if it blames damage, say "run e2fsck";
//! the later steps are then not run, and what the earlier ones did is
//! still compared.
//!
//! ```text
//! # a checkout (or a copy of its tests/ directory), e.g. from
//! # git clone https://github.com/tytso/e2fsprogs
//! cargo run --profile ci -p ext4kit-fuzz --bin ext4kit-damaged -- --e2fsprogs ~/e2fsprogs
//! ... --e2fsprogs ~/e2fsprogs --only f_dup,f_bbinode --keep /tmp/kept
//! ```
//!
//! It prints one row per image and exits 1 when any image was made worse
//! (or a step changed an image it refused, hung or panicked); `--keep`
//! saves each such image before and after.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::check::{blames_damage, compare_images, run_binary, Outcome};

use super::fsck::Fsck;

/// The directory every image gets, and the host tree put into it.
pub const PROBE_DIR: &str = "/ext4kit-probe";
/// The file `rm` removes (the several-block one).
pub const RM_PATH: &str = "/ext4kit-probe/tree/big.bin";

/// One of e2fsprogs' test images.
#[derive(Debug, Clone)]
pub struct TestImage {
    /// The test's directory name (`f_dup`).
    pub name: String,
    /// `image.gz`, `image.bz2` or `image` in it.
    pub source: PathBuf,
}

/// The test images under `root` (an e2fsprogs checkout, or its `tests`
/// directory) whose test name starts with `prefix`, sorted by name.
pub fn find_images(root: &Path, prefix: &str) -> Result<Vec<TestImage>, String> {
    let tests = if root.join("tests").is_dir() { root.join("tests") } else { root.to_path_buf() };
    let rd = std::fs::read_dir(&tests).map_err(|e| format!("reading {}: {e}", tests.display()))?;
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        if !name.starts_with(prefix) {
            continue;
        }
        if let Some(source) =
            ["image.gz", "image.bz2", "image"].iter().map(|f| ent.path().join(f)).find(|p| p.is_file())
        {
            out.push(TestImage { name, source });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if out.is_empty() {
        return Err(format!(
            "no {prefix}*/image.gz, image.bz2 or image under {} (give an e2fsprogs checkout or its tests directory)",
            tests.display()
        ));
    }
    Ok(out)
}

impl TestImage {
    /// The image's bytes, decompressed with `gzip -dc` / `bzip2 -dc`.
    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        let tool = match self.source.extension().and_then(|e| e.to_str()) {
            Some("gz") => "gzip",
            Some("bz2") => "bzip2",
            _ => return std::fs::read(&self.source).map_err(|e| format!("reading {}: {e}", self.source.display())),
        };
        let out =
            Command::new(tool).arg("-dc").arg(&self.source).output().map_err(|e| format!("running {tool}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{tool} -dc {}: {}",
                self.source.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(out.stdout)
    }
}

/// The three write steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `ext4kit mkdir IMG /ext4kit-probe`.
    Mkdir,
    /// `ext4kit put TREE IMG:/ext4kit-probe`.
    Put,
    /// `ext4kit rm IMG /ext4kit-probe/tree/big.bin`.
    Rm,
}

/// Every step, in order.
pub const STEPS: [Step; 3] = [Step::Mkdir, Step::Put, Step::Rm];

impl Step {
    /// Column name.
    pub fn name(self) -> &'static str {
        match self {
            Step::Mkdir => "mkdir",
            Step::Put => "put",
            Step::Rm => "rm",
        }
    }

    fn args(self, img: &Path, tree: &Path) -> Vec<String> {
        let i = img.display().to_string();
        match self {
            Step::Mkdir => vec!["mkdir".into(), i, PROBE_DIR.into()],
            Step::Put => vec!["put".into(), tree.display().to_string(), format!("{i}:{PROBE_DIR}")],
            Step::Rm => vec!["rm".into(), i, RM_PATH.into()],
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// It succeeded.
    Done,
    /// `put` copied some entries and could not copy others (each entry is
    /// its own operation, like `cp -a`'s): every failure must be a clean
    /// refusal of its own, which the final e2fsck judges (an unattached
    /// inode, a leaked block). The message is the tool's stderr.
    Partial(String),
    /// Refused, the image as the step found it (`recorded`: apart from the
    /// superblock's error record).
    Refused {
        /// The message.
        msg: String,
        /// The error record was written.
        recorded: bool,
    },
    /// Broke the rule: refused but changed the image, blamed damage
    /// without "run e2fsck", panicked, hung ([`Outcome`]'s failures).
    Failed(Outcome),
}

impl StepOutcome {
    /// Whether the step broke the rule.
    pub fn is_failure(&self) -> bool {
        matches!(self, StepOutcome::Failed(_))
    }

    /// Table cell.
    pub fn class(&self) -> &'static str {
        match self {
            StepOutcome::Done => "ok",
            StepOutcome::Partial(_) => "partial",
            StepOutcome::Refused { recorded: false, .. } => "refused",
            StepOutcome::Refused { recorded: true, .. } => "ref+rec",
            StepOutcome::Failed(o) => o.class(),
        }
    }

    fn message(&self) -> Option<String> {
        Some(match self {
            StepOutcome::Done => return None,
            StepOutcome::Partial(m) | StepOutcome::Refused { msg: m, .. } => m.clone(),
            StepOutcome::Failed(Outcome::RefusedChanged { msg, .. }) => msg.clone(),
            StepOutcome::Failed(Outcome::Unclear(m) | Outcome::Panic(m) | Outcome::Broken(m)) => m.clone(),
            StepOutcome::Failed(Outcome::Hang) => "hang".into(),
            StepOutcome::Failed(_) => return None,
        })
    }
}

/// One image's run.
#[derive(Debug, Clone)]
pub struct ImageResult {
    /// The test's name.
    pub name: String,
    /// e2fsck before (`None`: the image could not be prepared).
    pub before: Option<Fsck>,
    /// Each step run, in order (a refusal ends the list).
    pub steps: Vec<(Step, StepOutcome)>,
    /// e2fsck after, when some step changed the image.
    pub after: Option<Fsck>,
    /// What after has beyond before.
    pub worse: Option<String>,
    /// Why the image could not be run.
    pub broken: Option<String>,
    /// Its journal needed recovery: `before` is e2fsck's view after
    /// e2fsprogs' own replay (`e2fsck -E journal_only`).
    pub replayed: bool,
}

impl ImageResult {
    /// "ok", "refused", "unchecked" (e2fsck timed out before), or the
    /// failure class in capitals.
    pub fn verdict(&self) -> &'static str {
        if self.broken.is_some() {
            return "BROKEN";
        }
        if self.before.as_ref().is_some_and(|f| !f.finished()) {
            return "unchecked";
        }
        if let Some((_, o)) = self.steps.iter().find(|(_, o)| o.is_failure()) {
            return o.class();
        }
        if self.worse.is_some() {
            return "WORSE";
        }
        if self.steps.iter().any(|(_, o)| matches!(o, StepOutcome::Refused { .. })) {
            "refused"
        } else if self.steps.iter().any(|(_, o)| matches!(o, StepOutcome::Partial(_))) {
            "partial"
        } else {
            "ok"
        }
    }

    /// Whether the image broke the rule.
    pub fn is_failure(&self) -> bool {
        self.verdict().chars().any(|c| c.is_ascii_uppercase())
    }

    /// The detail lines: new problems, the failing step's message, a
    /// refusal's message.
    pub fn detail(&self) -> String {
        let mut s = Vec::new();
        if let Some(b) = &self.broken {
            s.push(b.clone());
        }
        if let Some(w) = &self.worse {
            let items: Vec<&str> = w.split("; ").collect();
            let more = items.len().saturating_sub(12);
            let shown = items[..items.len() - more].join("; ");
            s.push(if more > 0 { format!("new: {shown}; ... and {more} more") } else { format!("new: {shown}") });
        }
        for (step, o) in &self.steps {
            if let Some(msg) = o.message() {
                for l in msg.lines().map(str::trim).filter(|l| !l.is_empty()).take(6) {
                    s.push(format!("{} {}: {l}", step.name(), o.class()));
                }
            }
        }
        s.join("\n")
    }
}

fn cell(o: Option<&StepOutcome>) -> &'static str {
    o.map_or("-", StepOutcome::class)
}

fn fsck_cell(f: Option<&Fsck>) -> String {
    match f {
        None => "-".into(),
        Some(f) if !f.finished() => "timeout".into(),
        Some(f) => format!("{}:{}", f.code, f.count()),
    }
}

/// A campaign's results.
#[derive(Debug, Default)]
pub struct SuiteReport {
    /// One per image, sorted by name.
    pub images: Vec<ImageResult>,
}

impl SuiteReport {
    /// The images that broke the rule.
    pub fn failures(&self) -> Vec<&ImageResult> {
        self.images.iter().filter(|r| r.is_failure()).collect()
    }

    /// One row per image (e2fsck columns are `exit:problem lines`; `r`:
    /// counted after e2fsprogs' own journal replay), the
    /// detail of every image not "ok" indented under it (all of them with
    /// `all_details`, else only failures), then the count of each verdict.
    pub fn table(&self, all_details: bool) -> String {
        let mut s = format!(
            "{:<36} {:>8} {:>8} {:>8} {:>8} {:>8}  {}\n",
            "test", "before", "mkdir", "put", "rm", "after", "verdict"
        );
        let mut counts = std::collections::BTreeMap::<&str, usize>::new();
        for r in &self.images {
            let step = |k: Step| cell(r.steps.iter().find(|(s, _)| *s == k).map(|(_, o)| o));
            s += &format!(
                "{:<36} {:>8} {:>8} {:>8} {:>8} {:>8}  {}\n",
                r.name,
                fsck_cell(r.before.as_ref()) + if r.replayed { "r" } else { "" },
                step(Step::Mkdir),
                step(Step::Put),
                step(Step::Rm),
                fsck_cell(r.after.as_ref()),
                r.verdict()
            );
            *counts.entry(r.verdict()).or_default() += 1;
            if r.is_failure() || (all_details && r.verdict() != "ok") {
                for l in r.detail().lines() {
                    s += &format!("    {l}\n");
                }
            }
        }
        let summary: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
        s += &format!("{} images: {}\n", self.images.len(), summary.join(", "));
        s
    }
}

/// Campaign settings.
#[derive(Debug, Clone)]
pub struct SuiteConfig {
    /// The `ext4kit` binary.
    pub cli: PathBuf,
    /// Scratch directory (images, the host tree).
    pub scratch: PathBuf,
    /// Worker threads.
    pub threads: usize,
    /// Time bound per step.
    pub limit: Duration,
    /// Save failing images here (`NAME.img` before, `NAME.after.img`).
    pub keep: Option<PathBuf>,
    /// Print each image's row as it finishes.
    pub verbose: bool,
}

/// Make the host tree `put` copies: `DIR/tree/{big.bin, small.txt,
/// sub/leaf.txt, link -> small.txt}`.
pub fn make_host_tree(dir: &Path) -> std::io::Result<PathBuf> {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("sub"))?;
    std::fs::write(tree.join("small.txt"), b"ext4kit probe: a small file\n".repeat(4))?;
    let big: Vec<u8> = (0..24 * 1024u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(tree.join("big.bin"), big)?;
    std::fs::write(tree.join("sub/leaf.txt"), b"x")?;
    let link = tree.join("link");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("small.txt", link)?;
    }
    Ok(tree)
}

/// Run every image; results sorted by name.
pub fn run_suite(images: &[TestImage], cfg: &SuiteConfig) -> Result<SuiteReport, String> {
    std::fs::create_dir_all(&cfg.scratch).map_err(|e| format!("creating {}: {e}", cfg.scratch.display()))?;
    let tree = make_host_tree(&cfg.scratch).map_err(|e| format!("making the host tree: {e}"))?;
    if let Some(k) = &cfg.keep {
        std::fs::create_dir_all(k).map_err(|e| format!("creating {}: {e}", k.display()))?;
    }
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for w in 0..cfg.threads.max(1) {
            let (next, results, tree) = (&next, &results, &tree);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(t) = images.get(i) else { break };
                let r = run_image(t, cfg, tree, &cfg.scratch.join(format!("w{w}.img")));
                if cfg.verbose {
                    eprintln!("{} {} {}", r.name, r.verdict(), r.detail().replace('\n', " | "));
                }
                results.lock().unwrap_or_else(|p| p.into_inner()).push(r);
            });
        }
    });
    let mut images = results.into_inner().unwrap_or_else(|p| p.into_inner());
    images.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(SuiteReport { images })
}

/// One image: e2fsck before, the steps, e2fsck after.
pub fn run_image(t: &TestImage, cfg: &SuiteConfig, tree: &Path, path: &Path) -> ImageResult {
    let mut r = ImageResult {
        name: t.name.clone(),
        before: None,
        steps: Vec::new(),
        after: None,
        worse: None,
        broken: None,
        replayed: false,
    };
    let orig = match t.bytes() {
        Ok(b) => b,
        Err(e) => {
            r.broken = Some(e);
            return r;
        }
    };
    let outcome = run_steps(&orig, cfg, tree, path, &mut r);
    if let Err(e) = outcome {
        r.broken = Some(e);
    }
    if r.is_failure() {
        if let Some(k) = &cfg.keep {
            let _ = std::fs::write(k.join(format!("{}.img", t.name)), &orig);
            let _ = std::fs::copy(path, k.join(format!("{}.after.img", t.name)));
        }
    }
    let _ = std::fs::remove_file(path);
    r
}

/// `has_journal` and `needs_recovery` in the superblock.
fn needs_recovery(img: &[u8]) -> bool {
    let word =
        |off: usize| img.get(1024 + off..1024 + off + 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    word(0x5C) & 0x4 != 0 && word(0x60) & 0x4 != 0
}

fn run_steps(orig: &[u8], cfg: &SuiteConfig, tree: &Path, path: &Path, r: &mut ImageResult) -> Result<(), String> {
    let write = |b: &[u8]| std::fs::write(path, b).map_err(|e| format!("writing {}: {e}", path.display()));
    let read = || std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()));
    write(orig)?;
    // A journal that needs recovery is replayed by the first write (as the
    // kernel's mount and e2fsck replay it), and `e2fsck -fn` skips it: the
    // problems before are those of the image as e2fsprogs' own replay
    // leaves it (e2fsprogs' j_recover_* images replay blocks that e2fsck
    // then finds wrong).
    let before = if needs_recovery(orig) {
        r.replayed = true;
        let copy = path.with_extension("replayed.img");
        std::fs::write(&copy, orig).map_err(|e| format!("writing {}: {e}", copy.display()))?;
        let replay = Command::new("timeout")
            .args(["60", "e2fsck", "-E", "journal_only", "-y"])
            .arg(&copy)
            .output()
            .map_err(|e| format!("running e2fsck -E journal_only: {e}"));
        let f = replay.and_then(|_| Fsck::run(&copy));
        let _ = std::fs::remove_file(&copy);
        f?
    } else {
        Fsck::run(path)?
    };
    let finished = before.finished();
    r.before = Some(before);
    if !finished {
        return Ok(());
    }
    let mut cur = orig.to_vec();
    for step in STEPS {
        let o = match run_binary(&cfg.cli, &step.args(path, tree), cfg.limit) {
            Err(o) => StepOutcome::Failed(o),
            Ok(Ok(())) => StepOutcome::Done,
            Ok(Err(msg)) => {
                let now = read()?;
                let unclear = msg.lines().any(|l| blames_damage(l) && !l.contains("e2fsck"));
                match compare_images(&cur, &now) {
                    _ if unclear => StepOutcome::Failed(Outcome::Unclear(msg)),
                    Some(recorded) => StepOutcome::Refused { msg, recorded },
                    // `put` reports "N entries copied, M could not be".
                    None if step == Step::Put && msg.contains("entries copied") => StepOutcome::Partial(msg),
                    None => StepOutcome::Failed(Outcome::RefusedChanged { msg, worse: String::new() }),
                }
            }
        };
        let go_on = matches!(o, StepOutcome::Done | StepOutcome::Partial(_));
        r.steps.push((step, o));
        cur = read()?;
        if !go_on {
            break;
        }
    }
    if cur != orig {
        let after = Fsck::run(path)?;
        r.worse = r.before.as_ref().and_then(|b| b.worse(&after));
        r.after = Some(after);
    }
    Ok(())
}
