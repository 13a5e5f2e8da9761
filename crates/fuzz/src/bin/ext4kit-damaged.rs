//! The damaged-image write campaign (see `ext4kit_fuzz::damaged`): every
//! write operation on many damaged images, through the library and the
//! `ext4kit` binary, each checked against `e2fsck -fn`.
//!
//! ```text
//! cargo run --profile ci -p ext4kit-fuzz --bin ext4kit-damaged -- --count 2000
//! cargo run --profile ci -p ext4kit-fuzz --bin ext4kit-damaged -- --seed 17 --save /tmp/d.img
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use ext4kit_fuzz::damaged::check::{find_cli, run_corpus, CorpusConfig, Frontend};
use ext4kit_fuzz::damaged::corpus::{damage_bases, Damage};
use ext4kit_fuzz::damaged::ops::OPS;

#[derive(Parser, Debug)]
#[command(about = "Write operations on damaged images, checked with e2fsck -fn")]
struct Args {
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
    /// Print each failure as it is found.
    #[arg(short, long)]
    verbose: bool,
}

fn main() -> ExitCode {
    let a = Args::parse();
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
