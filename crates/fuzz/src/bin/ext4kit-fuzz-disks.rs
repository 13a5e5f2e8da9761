//! `ext4kit-fuzz-disks`: long hostile-disk campaigns over the container
//! formats, and replay of one case.
//!
//! Campaign: `ext4kit-fuzz-disks --format qcow2,vhdx --seed 0 --cases 5000`
//! (every format when `--format` is omitted); each case runs in a worker
//! process (this binary with `--worker`) under a time and address-space
//! limit. Replay: `--format F --replay N` prints the mutation step by step
//! and runs the case in this process with every phase shown (a panic's
//! backtrace included); `--save DIR` keeps the mutated files; `--minimize`
//! drops the steps the failure does not need (prints the `--skip` mask).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ext4kit_fuzz::disks::worker::{install_panic_printer, limit_memory, run_worker};
use ext4kit_fuzz::disks::{
    exercise, generate, merge, run_family, seeds, seeds_dir, still_fails, DiskCampaign, DiskReport, ExerciseLimits,
    Family,
};

/// Hostile-disk fuzzing of ext4kit's container formats.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Formats, comma-separated: qcow2, vhd, vhdx, vmdk, android-sparse, lvm (default: all).
    #[arg(long, value_delimiter = ',')]
    format: Vec<String>,
    /// First case seed of the campaign.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Cases per format.
    #[arg(long, default_value_t = 5000)]
    cases: u64,
    /// Parallel worker processes (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Seconds a case may take before it is a hang.
    #[arg(long, default_value_t = 10.0)]
    time_limit: f64,
    /// Address-space limit of a worker, MiB.
    #[arg(long, default_value_t = 1024)]
    memory_limit_mib: u64,
    /// Bytes read through each opened disk, MiB.
    #[arg(long, default_value_t = 256)]
    read_budget_mib: u64,
    /// Do not open the filesystem inside.
    #[arg(long)]
    no_engine: bool,
    /// Run one case (with --format) instead of a campaign.
    #[arg(long, value_name = "SEED")]
    replay: Option<u64>,
    /// With --replay: skip the steps whose bits are set.
    #[arg(long, default_value_t = 0)]
    skip: u64,
    /// With --replay: write the mutated files into DIR and keep them.
    #[arg(long, value_name = "DIR")]
    save: Option<PathBuf>,
    /// With --replay: find the fewest steps that still fail the same way.
    #[arg(long)]
    minimize: bool,
    /// Internal: run one case as a supervised worker.
    #[arg(long, hide = true)]
    worker: bool,
    /// Internal: the worker's case directory.
    #[arg(long, hide = true)]
    dir: Option<PathBuf>,
    /// Where the seeds are (default: the cache, built on first use).
    #[arg(long)]
    seeds_dir: Option<PathBuf>,
}

fn families(args: &Args) -> Result<Vec<Family>, String> {
    if args.format.is_empty() {
        return Ok(Family::ALL.to_vec());
    }
    args.format.iter().map(|f| Family::parse(f).ok_or_else(|| format!("unknown format {f:?}"))).collect()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let fams = match families(&args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let limits = ExerciseLimits { read_budget: args.read_budget_mib << 20, engine: !args.no_engine };
    let memory = args.memory_limit_mib << 20;
    if args.worker {
        let (Some(dir), Some(seed), Some(sd)) = (&args.dir, args.replay, &args.seeds_dir) else {
            eprintln!("--worker needs --dir, --replay and --seeds-dir");
            return ExitCode::from(2);
        };
        let code = run_worker(fams[0], seed, args.skip, dir, sd, memory, &limits);
        return ExitCode::from(code as u8);
    }
    let all = match seeds(&fams) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot build the seed images: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = DiskCampaign {
        worker: std::env::current_exe().expect("own path"),
        seeds_dir: args.seeds_dir.clone().unwrap_or_else(seeds_dir),
        threads: args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
        time_limit: Duration::from_secs_f64(args.time_limit),
        memory_limit: memory,
        limits,
        progress: Some(Duration::from_secs(10)),
    };
    if let Some(seed) = args.replay {
        let fam = fams[0];
        let fs: Vec<_> = all.into_iter().filter(|s| s.family == fam).collect();
        if args.minimize {
            return minimize(&cfg, fam, &fs, seed);
        }
        return replay(&args, fam, &fs, seed, memory, &limits);
    }
    let mut total = DiskReport::default();
    for fam in fams {
        let fs: Vec<_> = all.iter().filter(|s| s.family == fam).cloned().collect();
        eprintln!("{}: {} cases from seed {} over {} seed images", fam.name(), args.cases, args.seed, fs.len());
        let r = run_family(&cfg, fam, &fs, args.seed, args.cases);
        merge(&mut total, r);
    }
    println!("{}", total.summary());
    if total.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn replay(
    args: &Args,
    fam: Family,
    fs: &[ext4kit_fuzz::disks::Seed],
    seed: u64,
    memory: u64,
    limits: &ExerciseLimits,
) -> ExitCode {
    let case = generate(fs, seed, args.skip);
    println!("{}", case.describe());
    let dir = args.save.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("ext4kit-replay-{seed}")));
    let _ = std::fs::create_dir_all(&dir);
    for (name, bytes) in &case.files {
        std::fs::write(dir.join(name), bytes).expect("write the case's files");
    }
    let main = dir.join(&case.files[0].0);
    println!("files in {}", dir.display());
    install_panic_printer();
    if let Err(e) = limit_memory(memory) {
        eprintln!("setrlimit: {e}");
    }
    let mut phase = |p: &str| eprintln!("phase: {p}");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exercise(fam, &main, limits, &mut phase)));
    if args.save.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    match r {
        Ok(out) => {
            println!("{}", out.line());
            ExitCode::SUCCESS
        }
        Err(_) => ExitCode::FAILURE,
    }
}

/// Drop steps one at a time, keeping each drop the failure survives.
fn minimize(cfg: &DiskCampaign, fam: Family, fs: &[ext4kit_fuzz::disks::Seed], seed: u64) -> ExitCode {
    let case = generate(fs, seed, 0);
    let steps = case.steps.iter().filter(|s| !s.starts_with("checksums")).count();
    let r = run_family(cfg, fam, fs, seed, 1);
    let Some(f) = r.failures.first() else {
        println!("{} seed {seed} does not fail", fam.name());
        return ExitCode::SUCCESS;
    };
    let mut skip = 0u64;
    for i in 0..steps {
        if still_fails(cfg, fam, seed, skip | (1 << i), f.kind) {
            skip |= 1 << i;
        }
    }
    println!("{}\n--skip {skip}", generate(fs, seed, skip).describe());
    ExitCode::FAILURE
}
