//! `ext4kit-fuzz-images`: long hostile-image campaigns, and replay of one
//! failing case.
//!
//! Campaign: `ext4kit-fuzz-images --count 100000 --start 0 --threads 2`.
//! Replay: `ext4kit-fuzz-images --seed 1234` prints the mutation and what
//! the engine did with it (panic message and backtrace included);
//! `--save FILE` writes the mutated image for other tools (e2fsck,
//! debugfs, the `ext4kit` CLI); `--minimize` drops edits that are not
//! needed for the failure.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ext4kit_fuzz::alloc::GuardedAlloc;
use ext4kit_fuzz::{base_named, bases, run_case, run_cases, CampaignConfig, CaseResult, Mutation, WalkLimits};

#[global_allocator]
static ALLOC: GuardedAlloc = GuardedAlloc;

/// Hostile-image fuzzing of the ext4kit read path.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Number of mutated images in the campaign.
    #[arg(long, default_value_t = 10_000)]
    count: u64,
    /// First seed of the campaign.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Seconds one image may take before it is reported as a hang.
    #[arg(long, default_value_t = 5.0)]
    time_limit: f64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Allowed growth of resident memory, in MiB.
    #[arg(long, default_value_t = 1024)]
    memory_limit_mib: u64,
    /// Replay one seed instead of running a campaign.
    #[arg(long)]
    seed: Option<u64>,
    /// With --seed (or --truncate): write the mutated image to FILE.
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,
    /// With --seed: find a smaller set of edits that still fails.
    #[arg(long)]
    minimize: bool,
    /// Replay a truncation case: the base to cut (see --list-bases).
    #[arg(long, requires = "truncate")]
    base: Option<String>,
    /// Replay a truncation case: length in bytes.
    #[arg(long, requires = "base")]
    truncate: Option<usize>,
    /// List the base images and where they are cached.
    #[arg(long)]
    list_bases: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match real_main(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ext4kit-fuzz-images: {e}");
            ExitCode::from(2)
        }
    }
}

fn real_main(args: Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let b = bases()?;
    if args.list_bases {
        for (i, x) in b.iter().enumerate() {
            let m = &x.map;
            println!(
                "{i}: {:<18} {} ({} bytes, {} B blocks, {} inodes mapped, {} dir blocks, {} htree roots, {} htree nodes, {} extent nodes, {} indirect, {} xattr blocks)",
                x.spec.name,
                x.path.display(),
                x.bytes.len(),
                m.block_size,
                m.inodes.len(),
                m.dir_leaves.len(),
                m.htree_roots.len(),
                m.htree_nodes.len(),
                m.extent_nodes.len(),
                m.indirect_blocks.len(),
                m.xattr_blocks.len()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let limits = WalkLimits::default();
    let single = match (args.seed, &args.base, args.truncate) {
        (Some(seed), _, _) => Some(Mutation::generate(seed, b)),
        (None, Some(name), Some(len)) => {
            let base = base_named(name)?;
            let idx = b.iter().position(|x| std::ptr::eq(x, base)).unwrap_or(0);
            Some(Mutation::truncation(b, idx, len))
        }
        _ => None,
    };
    if let Some(m) = single {
        println!("{}", m.describe());
        if let Some(path) = &args.save {
            std::fs::write(path, m.apply(&b[m.base]))?;
            println!("wrote {}", path.display());
        }
        let r = run_case(b, &m, &limits);
        print_case(&r);
        if args.minimize && r.failed() {
            let mut cur = m.clone();
            let mut i = 0;
            while i < cur.edits.len() {
                let cand = cur.without_edit(i);
                if run_case(b, &cand, &limits).failed() {
                    cur = cand;
                } else {
                    i += 1;
                }
            }
            if cur.fix_checksums {
                let mut cand = cur.clone();
                cand.fix_checksums = false;
                if run_case(b, &cand, &limits).failed() {
                    cur = cand;
                }
            }
            println!("minimized:\n{}", cur.describe());
        }
        return Ok(if r.failed() { ExitCode::FAILURE } else { ExitCode::SUCCESS });
    }
    let cfg = CampaignConfig {
        threads: args.threads.unwrap_or(CampaignConfig::default().threads),
        time_limit: Duration::from_secs_f64(args.time_limit),
        memory_limit: args.memory_limit_mib << 20,
        progress: Some(Duration::from_secs(5)),
        limits,
    };
    let start = args.start;
    eprintln!("campaign: seeds {start}..{} on {} threads over {} bases", start + args.count, cfg.threads, b.len());
    let rep = run_cases(b, args.count, Arc::new(move |i| Mutation::generate(start + i, b)), &cfg);
    println!("{}", rep.summary());
    if rep.is_clean() {
        Ok(ExitCode::SUCCESS)
    } else {
        // A hung worker may still be running: exit without waiting for it.
        std::process::exit(1);
    }
}

fn print_case(r: &CaseResult) {
    if let (Some(k), Some(m)) = (&r.open_error, &r.open_message) {
        println!("open failed ({k}): {m}");
    }
    if let Some(w) = &r.walk {
        println!(
            "opened; walked {} dirs, {} names, {} inodes, {} files ({} bytes), {} symlinks, {} xattrs, {} lookups; {} errors",
            w.dirs,
            w.entries,
            w.inodes,
            w.files_read,
            w.bytes_read,
            w.symlinks,
            w.xattrs,
            w.resolves,
            w.error_count()
        );
        for e in &w.error_samples {
            println!("  {e}");
        }
        for v in &w.violations {
            println!("CONTRACT VIOLATION: {v}");
        }
    }
    if let Some(p) = &r.panic {
        println!("PANIC: {}\n{}", p.message, p.backtrace);
    }
    println!("time: {:.1?}", r.elapsed);
}
