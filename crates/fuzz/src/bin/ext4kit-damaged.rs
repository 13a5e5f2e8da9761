//! The damaged-image write campaign (see `ext4kit_fuzz::damaged`): every
//! write operation on many damaged images, through the library and the
//! `ext4kit` binary, each checked against `e2fsck -fn`.
//!
//! ```text
//! cargo run --profile ci -p ext4kit-fuzz --bin ext4kit-damaged -- --count 2000
//! cargo run --profile ci -p ext4kit-fuzz --bin ext4kit-damaged -- --seed 17 --save /tmp/d.img
//! ```
//!
//! With `--e2fsprogs DIR` it runs e2fsprogs' own corrupt test images
//! instead (see `ext4kit_fuzz::damaged::e2fsprogs`): for each
//! `DIR/tests/f_*/image.gz` (or `image.bz2`, `image`; DIR may also be the
//! tests directory itself) `e2fsck -fn`, then `ext4kit mkdir`, `put` of a
//! small tree and `rm` of its several-block file, then `e2fsck -fn` again;
//! one row per image, exit status 1 when any image was made worse.
//!
//! ```text
//! git clone https://github.com/tytso/e2fsprogs /tmp/e2fsprogs
//! cargo run --profile ci -p ext4kit-fuzz --bin ext4kit-damaged -- --e2fsprogs /tmp/e2fsprogs
//! ... -- --e2fsprogs /tmp/e2fsprogs --only f_dup,f_dup2 --keep /tmp/kept --details
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use ext4kit_fuzz::damaged::check::{find_cli, run_corpus, CorpusConfig, Frontend};
use ext4kit_fuzz::damaged::corpus::{damage_bases, scratch_dir, Damage};
use ext4kit_fuzz::damaged::e2fsprogs::{find_images, run_suite, SuiteConfig, PROBE_DIR, RM_PATH};
use ext4kit_fuzz::damaged::ops::OPS;

#[derive(Parser, Debug)]
#[command(
    about = "Write operations on damaged images, checked with e2fsck -fn",
    long_about = "Write operations on damaged images, checked with e2fsck -fn.\n\n\
        Default: our own corpus, one damaged image per seed (a mke2fs-made base and one kind of damage), \
        17 operations on each through the library and the ext4kit binary. A case fails when the operation \
        succeeds and e2fsck -fn reports a problem it did not report before, or refuses and changes the image \
        (beyond the superblock's error record), or refuses blaming damage without saying \"run e2fsck\", \
        or panics or hangs.\n\n\
        With --e2fsprogs DIR: e2fsprogs' own corrupt test images (DIR is an e2fsprogs checkout or its tests \
        directory; every tests/f_*/image.gz, image.bz2 or image). For each: e2fsck -fn, then with the ext4kit \
        binary `mkdir /ext4kit-probe`, `put` of a small tree (a 24 KiB file, a 112-byte file, a file in a \
        subdirectory, a symlink) into it, `rm /ext4kit-probe/tree/big.bin`, then e2fsck -fn again. An image \
        is made worse when a problem line (numbers normalised) appears more often after than before. A step \
        may refuse: the image must then be as the step found it (apart from the error record), and the later \
        steps are skipped. `put` copies entry by entry, like cp -a: when some entries cannot be copied \
        (no space on the small test images) the step is \"partial\", and the final e2fsck judges what it left. \
        Prints one row per image (e2fsck columns are EXIT:PROBLEM-LINES) and exits 1 when \
        any image was made worse or a step broke the rule.",
    after_help = "EXAMPLES:\n  \
        ext4kit-damaged --count 1000\n  \
        ext4kit-damaged --seed 17 --save /tmp/d.img\n  \
        git clone https://github.com/tytso/e2fsprogs /tmp/e2fsprogs\n  \
        ext4kit-damaged --e2fsprogs /tmp/e2fsprogs\n  \
        ext4kit-damaged --e2fsprogs /tmp/e2fsprogs --only f_dup,f_bbinode --keep /tmp/kept --details"
)]
struct Args {
    /// Run e2fsprogs' corrupt test images from this checkout (or its tests
    /// directory) instead of the seeded corpus.
    #[arg(long, value_name = "DIR")]
    e2fsprogs: Option<PathBuf>,
    /// With --e2fsprogs: only these tests (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// With --e2fsprogs: test-name prefix to take.
    #[arg(long, default_value = "f_")]
    tests: String,
    /// With --e2fsprogs: save each failing image here (NAME.img as it came,
    /// NAME.after.img after the steps).
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// With --e2fsprogs: also print the refusal message of images that
    /// refused.
    #[arg(long)]
    details: bool,
    /// Damaged images to make (seeds START..START+COUNT).
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Only this seed (prints the damage; with --save, writes the image).
    #[arg(long)]
    seed: Option<u64>,
    /// Write the damaged image of --seed here.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Library only (skip the ext4kit binary).
    #[arg(long)]
    no_cli: bool,
    /// Run the binary on every n-th operation of an image.
    #[arg(long, default_value_t = 3)]
    cli_every: usize,
    /// Worker threads (default: cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print each failure as it is found (and, for the seeded corpus, every
    /// refusal that met damage half-way: refused+recorded).
    #[arg(short, long)]
    verbose: bool,
    /// Only the seeds of START..START+COUNT whose damage is of this kind
    /// (the table's names: CrossLinked, FlipIndirect, ...).
    #[arg(long)]
    kind: Option<String>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    if let Some(dir) = &a.e2fsprogs {
        return e2fsprogs_suite(&a, dir);
    }
    let bases = match damage_bases() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("ext4kit-damaged: {e}");
            return ExitCode::from(2);
        }
    };
    let seeds = match a.seed {
        Some(s) => {
            let d = Damage::generate(s, bases);
            println!("{}", d.describe(bases));
            if let Some(p) = &a.save {
                if let Err(e) = std::fs::write(p, d.apply(bases)) {
                    eprintln!("ext4kit-damaged: writing {}: {e}", p.display());
                    return ExitCode::from(2);
                }
                println!("saved to {}", p.display());
            }
            s..s + 1
        }
        None => a.start..a.start + a.count,
    };
    let seeds: Vec<u64> = match &a.kind {
        None => seeds.collect(),
        Some(k) => seeds.filter(|&s| format!("{:?}", Damage::generate(s, bases).kind) == *k).collect(),
    };
    let mut frontends = vec![Frontend::Library];
    if !a.no_cli {
        match find_cli() {
            Ok(b) => frontends.push(Frontend::Cli(b)),
            Err(e) => {
                eprintln!("ext4kit-damaged: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2));
    let cfg = CorpusConfig {
        seeds,
        ops: OPS.to_vec(),
        frontends,
        cli_every: a.cli_every,
        threads,
        limit: Duration::from_secs(60),
        verbose: a.verbose,
    };
    let t = Instant::now();
    let r = match run_corpus(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ext4kit-damaged: {e}");
            return ExitCode::from(2);
        }
    };
    print!("{}", r.failure_lines());
    println!(
        "{} images ({} e2fsck could not check in time), {} cases, {} failing, {:.0} s",
        r.images,
        r.uncheckable,
        r.cases.len(),
        r.failures().len(),
        t.elapsed().as_secs_f64()
    );
    print!("{}", r.table());
    if r.failures().is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--e2fsprogs DIR`: e2fsprogs' test images, mkdir + put + rm on each.
fn e2fsprogs_suite(a: &Args, dir: &std::path::Path) -> ExitCode {
    let mut images = match find_images(dir, &a.tests) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("ext4kit-damaged: {e}");
            return ExitCode::from(2);
        }
    };
    if !a.only.is_empty() {
        images.retain(|t| a.only.contains(&t.name));
    }
    let cli = match find_cli() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("ext4kit-damaged: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = SuiteConfig {
        cli,
        scratch: scratch_dir(),
        threads: a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)),
        limit: Duration::from_secs(60),
        keep: a.keep.clone(),
        verbose: a.verbose,
    };
    let t = Instant::now();
    let r = run_suite(&images, &cfg);
    let _ = std::fs::remove_dir_all(&cfg.scratch);
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ext4kit-damaged: {e}");
            return ExitCode::from(2);
        }
    };
    println!("mkdir {PROBE_DIR}; put a small tree into it; rm {RM_PATH}; e2fsck -fn before and after");
    print!("{}", r.table(a.details));
    let failures = r.failures();
    println!("{} made worse or broke the rule, {:.0} s", failures.len(), t.elapsed().as_secs_f64());
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
