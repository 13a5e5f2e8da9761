//! `ext4kit-crash`: the long crash-state campaign, and the rerun of one
//! crash point.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ext4kit_blockdev::CrashPoint;
use ext4kit_crash::campaign::{run_campaign, Campaign};
use ext4kit_crash::check::{save_image, Checker};
use ext4kit_crash::{run, Container, FsVariant, RunSpec, Workload};

const REPRO: &str = "cargo run --profile ci -p ext4kit-crash -- check {}";

#[derive(Parser)]
#[command(
    name = "ext4kit-crash",
    about = "Crash-state testing of ext4kit: run workloads over a recording device, rebuild the images a power \
             cut could leave (at every flush, and between flushes with unflushed writes lost) and check each: \
             e2fsck after ext4kit's journal replay, e2fsck's own replay reaching the same tree, every fsync'd \
             file, directory and rename.",
    after_help = "Examples:\n  ext4kit-crash campaign --runs 100 --images-per-run 500\n  ext4kit-crash campaign \
                  --workloads mix,g455 --fs ext4-1k --seed 7\n  ext4kit-crash campaign --format qcow2,vhdx,vhd,vmdk --runs 20 \
                  --images-per-run 200\n  ext4kit-crash check --workload mix --fs ext4-4k \
                  --seed 3 --ops 400 --threads 1 --cut cut@1234/0x5eed --save crash.img\n  ext4kit-crash record \
                  --workload g482 --fs ext4-4k --seed 1 --log g482.dmlog --base g482-base.img"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    /// Workload: mix, mix-mt, g455, g457, g482, readonly, overwrite.
    #[arg(long, default_value = "mix")]
    workload: String,
    /// Filesystem: ext4-4k (32 MiB), ext4-1k (16 MiB), ext3-1k (16 MiB).
    #[arg(long, default_value = "ext4-4k")]
    fs: String,
    /// Seed of the workload's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Operations per thread (default: the workload's).
    #[arg(long)]
    ops: Option<usize>,
    /// Threads (default: the workload's).
    #[arg(long)]
    threads: Option<usize>,
    /// Fault injection: every Nth flush is unhonoured (the harness must then find lost data).
    #[arg(long, default_value_t = 0)]
    drop_flushes: u64,
    /// Keep the log's written data in a scratch file instead of memory.
    #[arg(long)]
    spill: bool,
    /// The image's container: raw, qcow2 or vhdx (the recording device then holds the container file, and
    /// qemu-img check judges each crash image's container).
    #[arg(long, default_value = "raw")]
    format: String,
}

impl RunArgs {
    fn spec(&self) -> Result<RunSpec, String> {
        let w = Workload::parse(&self.workload).ok_or_else(|| format!("unknown workload {:?}", self.workload))?;
        let fs = FsVariant::parse(&self.fs).ok_or_else(|| format!("unknown filesystem {:?}", self.fs))?;
        let mut s = RunSpec::new(w, fs, self.seed);
        if let Some(o) = self.ops {
            s.ops = o;
        }
        if let Some(t) = self.threads {
            s.threads = t;
        }
        s.drop_flushes = self.drop_flushes;
        s.spill = self.spill;
        s.container = Container::parse(&self.format)?;
        Ok(s)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Run many workloads × many crash points and print a summary table.
    Campaign {
        /// Workload runs (cycling through workloads × filesystems, seed increasing).
        #[arg(long, default_value_t = 40)]
        runs: usize,
        /// Crash images per run (half at flushes at most).
        #[arg(long, default_value_t = 400)]
        images_per_run: usize,
        /// Workloads to cycle through (comma-separated).
        #[arg(long, default_value = "mix,mix-mt,g455,g457,g482,overwrite,readonly")]
        workloads: String,
        /// Filesystems to cycle through (comma-separated).
        #[arg(long, default_value = "ext4-4k,ext4-1k")]
        fs: String,
        /// First seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Operations per thread (default: each workload's).
        #[arg(long)]
        ops: Option<usize>,
        /// Threads checking images.
        #[arg(long, default_value_t = 2)]
        check_threads: usize,
        /// Where to keep the first failing image of each kind (default: $TMPDIR/ext4kit-crash-failures).
        #[arg(long)]
        keep: Option<PathBuf>,
        /// Fault injection for every run: every Nth flush unhonoured.
        #[arg(long, default_value_t = 0)]
        drop_flushes: u64,
        /// Keep the logs' written data in scratch files instead of memory.
        #[arg(long)]
        spill: bool,
        /// Containers to cycle through (comma-separated: raw, qcow2, vhdx, vhd, vmdk): with a container the
        /// recording device holds the container file, so cuts fall among the format's own writes (tables,
        /// refcounts, BAT entries, grain tables), and qemu-img check must pass every crash image (leaked
        /// clusters allowed; qemu cannot check VHD, whose oracle is what qemu-img convert reads).
        #[arg(long, default_value = "raw")]
        format: String,
    },
    /// Rerun one workload and check one crash point (or all flushes).
    Check {
        #[command(flatten)]
        run: RunArgs,
        /// The crash point: flush@N or cut@N/SEED (as a failure report prints it).
        #[arg(long)]
        cut: String,
        /// Save the crash image here.
        #[arg(long)]
        save: Option<PathBuf>,
        /// Also list the log entries and every thread's operations within N entries of the cut.
        #[arg(long)]
        explain: Option<u64>,
    },
    /// Run one workload and save its log (dm-log-writes format) and the base image.
    Record {
        #[command(flatten)]
        run: RunArgs,
        /// The log, in the dm-log-writes format.
        #[arg(long)]
        log: PathBuf,
        /// The image the log starts from.
        #[arg(long)]
        base: PathBuf,
    },
}

fn main() -> ExitCode {
    match real_main() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ext4kit-crash: {e}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> Result<bool, String> {
    match Cli::parse().cmd {
        Cmd::Campaign {
            runs,
            images_per_run,
            workloads,
            fs,
            seed,
            ops,
            check_threads,
            keep,
            drop_flushes,
            spill,
            format,
        } => {
            let ws: Vec<Workload> = workloads
                .split(',')
                .map(|w| Workload::parse(w.trim()).ok_or_else(|| format!("unknown workload {w:?}")))
                .collect::<Result<_, _>>()?;
            let fss: Vec<FsVariant> = fs
                .split(',')
                .map(|f| FsVariant::parse(f.trim()).ok_or_else(|| format!("unknown filesystem {f:?}")))
                .collect::<Result<_, _>>()?;
            let containers: Vec<Option<Container>> = format
                .split(',')
                .map(|c| Container::parse(c.trim()))
                .collect::<Result<_, _>>()?;
            if containers.iter().any(Option::is_some) {
                ext4kit_crash::container::require_qemu_img()?;
            }
            let mut cells: Vec<(Workload, FsVariant, Option<Container>)> = Vec::new();
            for &c in &containers {
                for &f in &fss {
                    cells.extend(ws.iter().map(|&w| (w, f, c)));
                }
            }
            let specs = (0..runs)
                .map(|i| {
                    let (w, f, c) = cells[i % cells.len()];
                    let mut s = RunSpec::new(w, f, seed + i as u64).in_container(c);
                    if let Some(o) = ops {
                        s.ops = o;
                    }
                    s.drop_flushes = drop_flushes;
                    s.spill = spill;
                    s
                })
                .collect();
            let c = Campaign {
                runs: specs,
                images_per_run,
                check_threads,
                keep: Some(keep.unwrap_or_else(|| std::env::temp_dir().join("ext4kit-crash-failures"))),
                repro: REPRO.into(),
            };
            let sum = run_campaign(&c, |l| eprintln!("{l}"));
            println!("{sum}");
            Ok(sum.clean())
        }
        Cmd::Check {
            run: r,
            cut,
            save,
            explain,
        } => {
            let spec = r.spec()?;
            let rec = run(&spec)?;
            let cut = CrashPoint::parse(&cut, &rec.log).map_err(|e| e.to_string())?;
            println!(
                "{}: {} log entries, {} flushes; {cut}: {} writes before the last honoured flush kept, {} of the {} \
                 entries after dropped",
                spec.label(),
                rec.log.len(),
                rec.log.flushes(),
                cut.durable,
                cut.dropped(&rec.log),
                cut.end - cut.durable
            );
            let img = rec.log.image(&rec.base, &cut).map_err(|e| e.to_string())?;
            let fails = Checker::new("cli").map_err(|e| e.to_string())?.check(&rec, &cut, &img);
            if let Some(p) = save {
                let report: String = fails.iter().map(|f| format!("[{}] {}\n", f.kind, f.detail)).collect();
                let dir = p.parent().map_or_else(|| PathBuf::from("."), PathBuf::from);
                let name = p
                    .file_stem()
                    .map_or("crash".into(), |s| s.to_string_lossy().into_owned());
                let saved = save_image(&dir, &name, &img, &report).map_err(|e| e.to_string())?;
                println!("image saved: {}", saved.display());
            }
            if let Some(w) = explain {
                print!("{}", ext4kit_crash::check::explain(&rec, &cut, w));
            }
            for f in &fails {
                println!("[{}] {}", f.kind, f.detail);
            }
            println!("{} failure(s)", fails.len());
            Ok(fails.is_empty())
        }
        Cmd::Record { run: r, log, base } => {
            let spec = r.spec()?;
            let rec = run(&spec)?;
            let f = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
            rec.log
                .write_dm_log(std::io::BufWriter::new(f))
                .map_err(|e| format!("{}: {e}", log.display()))?;
            std::fs::write(&base, &*rec.base).map_err(|e| format!("{}: {e}", base.display()))?;
            println!(
                "{}: {} entries ({} flushes, {} KiB written) in {}; base image {}",
                spec.label(),
                rec.log.len(),
                rec.log.flushes(),
                rec.log.data_bytes() >> 10,
                log.display(),
                base.display()
            );
            Ok(true)
        }
    }
}
