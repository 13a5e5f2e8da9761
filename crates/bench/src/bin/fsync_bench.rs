//! `fsync-bench`: small files each created, written and fsync'd (fs_mark
//! -S1 style) by 1, 2, 4 and 8 threads at once, each in a directory of its
//! own, on ext4kit in-process (the library), the ext4kit mount, fuse2fs and
//! the kernel's ext4 on a loop device, side by side in one run, interleaved
//! by round so that the VM's drift hits every peer alike.
//!
//! It prints files/s, the median fsync latency and, for the library, how
//! many journal commits each fsync cost: concurrent fsyncs share commits
//! (group commit, `ext4::commit`), so with several threads commits per
//! fsync fall below one. Every image is `e2fsck -fn`-clean afterwards.
//!
//! Run as root (loop mounts, FUSE): `sudo target/release/fsync-bench`.

/// The benchmark programs run the library in-process, so they use the
/// allocator the `ext4kit` binary ships with (see its `main.rs`): numbers
/// then describe what users of our binaries get.
#[global_allocator]
static ALLOC: ext4kit_alloc::Allocator = ext4kit_alloc::Allocator;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use clap::Parser;
use ext4kit::{Access, Cred, Fs, OpenFlags, OpenOptions, Process};
use ext4kit_bench::peers::{Peer, PeerConfig, PeerMount};

#[derive(Parser, Debug)]
#[command(about = "fs_mark -S1 style: create + write + fsync small files from 1..N threads, ext4kit beside its peers")]
struct Args {
    /// Thread counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    threads: Vec<usize>,
    /// Files each thread creates per measurement.
    #[arg(long, default_value_t = 200)]
    files: usize,
    /// Bytes written to each file.
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Rounds (each peer and thread count once per round); medians over them.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Peers: lib, ext4kit, fuse2fs, kernel.
    #[arg(long, value_delimiter = ',', default_value = "lib,ext4kit,fuse2fs,kernel")]
    peers: Vec<String>,
    /// Work directory (images and mount points).
    #[arg(long, default_value = "target/bench-fsync-mt")]
    work: PathBuf,
    /// The ext4kit binary for the mount peer.
    #[arg(long, default_value = "target/release/ext4kit")]
    ext4kit: PathBuf,
}

/// One measurement.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    files_per_s: f64,
    fsync_p50_us: f64,
    commits_per_fsync: Option<f64>,
}

fn mkfs(img: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(img);
    let o = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4"])
        .arg(img)
        .arg("512M")
        .output()
        .map_err(|e| format!("mke2fs: {e}"))?;
    if !o.status.success() {
        return Err(format!("mke2fs: {}", String::from_utf8_lossy(&o.stderr)));
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// The workload through the library: `threads` threads, each its own
/// descriptor table (Process), each its own directory.
fn run_lib(img: &Path, threads: usize, files: usize, size: usize) -> Result<Sample, String> {
    let fs = Fs::open_image(
        img,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let root = Cred::root();
    for t in 0..threads {
        fs.mkdir(format!("/t{t}").as_bytes(), 0o755, &root)
            .map_err(|e| e.to_string())?;
    }
    let jbd = fs.volume().jbd().stats().ok_or("the library volume has no journal")?;
    let before = jbd.commits();
    let data = vec![0xa5u8; size];
    let start = Instant::now();
    let lat: Vec<Vec<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let fs = fs.clone();
                let data = &data;
                let root = &root;
                s.spawn(move || -> Result<Vec<f64>, String> {
                    let mut p = Process::new(fs);
                    let mut lat = Vec::with_capacity(files);
                    for i in 0..files {
                        let flags = OpenFlags {
                            access: Access::WriteOnly,
                            create: true,
                            trunc: true,
                            ..Default::default()
                        };
                        let path = format!("/t{t}/f{i}");
                        let fd = p.open_as(&path, flags, 0o644, root).map_err(|e| e.to_string())?;
                        p.write(fd, data).map_err(|e| e.to_string())?;
                        let t0 = Instant::now();
                        p.fsync(fd).map_err(|e| e.to_string())?;
                        lat.push(t0.elapsed().as_secs_f64() * 1e6);
                        p.close(fd).map_err(|e| e.to_string())?;
                    }
                    Ok(lat)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect::<Result<Vec<_>, String>>()
    })?;
    let el = start.elapsed();
    let commits = jbd.commits() - before;
    drop(fs);
    let mut all: Vec<f64> = lat.into_iter().flatten().collect();
    let n = all.len();
    Ok(Sample {
        files_per_s: n as f64 / el.as_secs_f64(),
        fsync_p50_us: median(&mut all),
        commits_per_fsync: Some(commits as f64 / n as f64),
    })
}

/// The workload through a mount point.
fn run_mounted(dir: &Path, threads: usize, files: usize, size: usize) -> Result<Sample, String> {
    for t in 0..threads {
        std::fs::create_dir_all(dir.join(format!("t{t}"))).map_err(|e| e.to_string())?;
    }
    let data = vec![0xa5u8; size];
    let start = Instant::now();
    let lat: Vec<Vec<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let data = &data;
                s.spawn(move || -> Result<Vec<f64>, String> {
                    use std::io::Write;
                    let mut lat = Vec::with_capacity(files);
                    for i in 0..files {
                        let p = dir.join(format!("t{t}/f{i}"));
                        let mut f = std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                        f.write_all(data).map_err(|e| e.to_string())?;
                        let t0 = Instant::now();
                        f.sync_all().map_err(|e| e.to_string())?;
                        lat.push(t0.elapsed().as_secs_f64() * 1e6);
                    }
                    Ok(lat)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect::<Result<Vec<_>, String>>()
    })?;
    let el = start.elapsed();
    let mut all: Vec<f64> = lat.into_iter().flatten().collect();
    let n = all.len();
    Ok(Sample {
        files_per_s: n as f64 / el.as_secs_f64(),
        fsync_p50_us: median(&mut all),
        commits_per_fsync: None,
    })
}

fn fsck(img: &Path) -> Result<(), String> {
    let o = Command::new("e2fsck")
        .arg("-fn")
        .arg(img)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "e2fsck -fn {}: {}",
            img.display(),
            String::from_utf8_lossy(&o.stdout)
        ));
    }
    Ok(())
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("fsync-bench: {e}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<(), String> {
    let a = Args::parse();
    std::fs::create_dir_all(&a.work).map_err(|e| e.to_string())?;
    let cfg = PeerConfig {
        ext4kit_bin: a.ext4kit.clone(),
        threads: 2,
        cache_budget: ext4kit::OpenOptions::default().cache_budget,
        fuse2fs_opts: String::new(),
    };
    let peers: Vec<&str> = a.peers.iter().map(|s| s.as_str()).collect();
    let mut results: Vec<(String, usize, Vec<Sample>)> = Vec::new();
    for p in &peers {
        for &t in &a.threads {
            results.push((p.to_string(), t, Vec::new()));
        }
    }
    let img = a.work.join("fs.img");
    let mnt = a.work.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
    for round in 0..a.rounds {
        for r in results.iter_mut() {
            eprintln!("round {}/{}: {} with {} thread(s)", round + 1, a.rounds, r.0, r.1);
            mkfs(&img)?;
            let s = match r.0.as_str() {
                "lib" => run_lib(&img, r.1, a.files, a.size)?,
                name => {
                    let peer = match name {
                        "ext4kit" => Peer::Ext4kit,
                        "fuse2fs" => Peer::Fuse2fs,
                        "kernel" => Peer::Kernel,
                        other => return Err(format!("unknown peer {other:?} (lib, ext4kit, fuse2fs, kernel)")),
                    };
                    let m = match PeerMount::mount(peer, &cfg, &img, &mnt, false) {
                        Ok(m) => m,
                        Err(e) => {
                            eprintln!("  {name} skipped: {e}");
                            continue;
                        }
                    };
                    let s = run_mounted(m.path(), r.1, a.files, a.size);
                    m.unmount()?;
                    s?
                }
            };
            fsck(&img)?;
            r.2.push(s);
        }
    }
    println!(
        "{} files of {} bytes per thread, create + write + fsync + close each; median of {} rounds (2-core VM)",
        a.files, a.size, a.rounds
    );
    println!(
        "{:>8} | {:>7} | {:>10} | {:>14} | {:>16}",
        "peer", "threads", "files/s", "fsync p50 µs", "commits / fsync"
    );
    for (p, t, samples) in &results {
        if samples.is_empty() {
            println!("{p:>8} | {t:>7} | {:>10} | {:>14} | {:>16}", "skipped", "-", "-");
            continue;
        }
        let mut f: Vec<f64> = samples.iter().map(|s| s.files_per_s).collect();
        let mut l: Vec<f64> = samples.iter().map(|s| s.fsync_p50_us).collect();
        let mut c: Vec<f64> = samples.iter().filter_map(|s| s.commits_per_fsync).collect();
        let cpf = if c.is_empty() {
            "-".to_string()
        } else {
            format!("{:.2}", median(&mut c))
        };
        println!(
            "{p:>8} | {t:>7} | {:>10.0} | {:>14.0} | {:>16}",
            median(&mut f),
            median(&mut l),
            cpf
        );
    }
    Ok(())
}
