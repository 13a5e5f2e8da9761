//! Read workloads through three mounts of the same image, side by side:
//! the ext4kit FUSE server, fuse2fs (e2fsprogs' FUSE server, the tool
//! people use today) and the kernel's ext4 on a loop device (the physical
//! limit). Each workload runs on a fresh mount after the kernel's caches are
//! dropped (cold), then again on the same mount (warm).
//!
//! - walk: every entry of the tree listed and stat'ed (`find` + stat);
//! - cat: every regular file read whole;
//! - seq: one large file read sequentially in 1 MiB requests;
//! - storm: N threads open/read 4 KiB/close a few small files in a loop
//!   (the open/read/close storm, through a mount).
//!
//! Run as root:  target/release/fuse-read [--big-mib 1024] [--threads 2]

/// The benchmark programs run the library in-process, so they use the
/// allocator the `ext4kit` binary ships with (see its `main.rs`): numbers
/// then describe what users of our binaries get.
#[global_allocator]
static ALLOC: ext4kit_alloc::Allocator = ext4kit_alloc::Allocator;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use ext4kit_bench::{drop_kernel_caches, mount, need_kernel, run};

#[derive(Parser)]
#[command(about = "Read workloads on the ext4kit FUSE mount, fuse2fs and the kernel, side by side")]
struct Args {
    /// Size of the sequentially read file, MiB.
    #[arg(long, default_value_t = 1024)]
    big_mib: u64,
    /// Directories in the tree (each holds --files-per-dir small files).
    #[arg(long, default_value_t = 20)]
    dirs: usize,
    /// Small files per directory (1..16 KiB each).
    #[arg(long, default_value_t = 500)]
    files_per_dir: usize,
    /// Threads of the open/read/close storm (and FUSE server threads).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// open/read/close operations per storm thread.
    #[arg(long, default_value_t = 20_000)]
    storm_ops: usize,
    /// Work directory (the image is kept there between runs).
    #[arg(long, default_value = "target/bench-fuse-read")]
    work: PathBuf,
    /// Also write the table as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
}

fn make_image(a: &Args) -> Result<PathBuf, String> {
    let img = a
        .work
        .join(format!("fuse-read-{}d-{}f-{}m.img", a.dirs, a.files_per_dir, a.big_mib));
    if img.exists() {
        return Ok(img);
    }
    let src = a.work.join("src");
    let _ = std::fs::remove_dir_all(&src);
    let mut rng = ext4kit_testkit::TestRng::new(42);
    for d in 0..a.dirs {
        let dir = src.join(format!("dir{d:03}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        for f in 0..a.files_per_dir {
            let mut data = vec![0u8; 1024 + rng.below(15 * 1024) as usize];
            rng.fill(&mut data);
            std::fs::write(dir.join(format!("file{f:05}")), &data).map_err(|e| e.to_string())?;
        }
    }
    let mut chunk = vec![0u8; 1 << 20];
    let mut big = std::fs::File::create(src.join("big")).map_err(|e| e.to_string())?;
    for _ in 0..a.big_mib {
        rng.fill(&mut chunk);
        std::io::Write::write_all(&mut big, &chunk).map_err(|e| e.to_string())?;
    }
    drop(big);
    let size_mib = a.big_mib + (a.dirs * a.files_per_dir * 20 / 1024) as u64 + 256;
    let tmp = img.with_extension("tmp");
    run(Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-d"])
        .arg(&src)
        .arg(&tmp)
        .arg(format!("{size_mib}M")))?;
    std::fs::rename(&tmp, &img).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&src);
    Ok(img)
}

/// The three peers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Peer {
    Ext4kit,
    Fuse2fs,
    Kernel,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Ext4kit => "ext4kit",
            Peer::Fuse2fs => "fuse2fs",
            Peer::Kernel => "kernel",
        }
    }
}

/// A mount of one peer; unmounted (and its server waited for) on drop.
enum Mounted {
    Ext4kit(PathBuf, Option<std::thread::JoinHandle<Result<(), String>>>),
    Fuse2fs(PathBuf),
    Kernel(Option<ext4kit_testkit::LoopMount>),
}

impl Drop for Mounted {
    fn drop(&mut self) {
        match self {
            Mounted::Ext4kit(dir, t) => {
                let _ = ext4kit_fuse::unmount(dir, Duration::from_secs(60));
                if let Some(t) = t.take() {
                    let _ = t.join();
                }
            }
            Mounted::Fuse2fs(dir) => {
                let _ = Command::new("umount").arg(&*dir).status();
                // fuse2fs exits after the unmount; wait for it to let go.
                std::thread::sleep(Duration::from_millis(300));
            }
            Mounted::Kernel(m) => {
                if let Some(m) = m.take() {
                    let _ = m.unmount();
                }
            }
        }
    }
}

fn mount_peer(p: Peer, img: &Path, dir: &Path, threads: usize) -> Result<Mounted, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    drop_kernel_caches();
    Ok(match p {
        Peer::Ext4kit => {
            let opts = ext4kit_fuse::MountOptions {
                threads,
                // A read benchmark, against fuse2fs -o ro: mount read-only
                // too (mounts are read-write by default).
                read_only: true,
                ..Default::default()
            };
            let m = ext4kit_fuse::mount(img, dir, &opts)?;
            let t = std::thread::spawn(move || m.run());
            Mounted::Ext4kit(dir.to_path_buf(), Some(t))
        }
        Peer::Fuse2fs => {
            run(Command::new("fuse2fs").arg(img).arg(dir).args(["-o", "ro,fakeroot"]))
                .map_err(|e| format!("{e} (apt-get install fuse2fs)"))?;
            Mounted::Fuse2fs(dir.to_path_buf())
        }
        Peer::Kernel => Mounted::Kernel(Some(mount(img, dir, "ro")?)),
    })
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let md = std::fs::symlink_metadata(e.path())?;
        n += 1;
        if md.is_dir() {
            n += walk(&e.path(), files)?;
        } else if md.is_file() {
            files.push(e.path());
        }
    }
    Ok(n)
}

fn read_all(p: &Path, buf: &mut [u8]) -> std::io::Result<u64> {
    let mut f = std::fs::File::open(p)?;
    let mut total = 0;
    loop {
        let n = f.read(buf)?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

/// One workload on one mounted peer: (seconds, what to divide by, unit).
fn workload(name: &str, dir: &Path, a: &Args) -> Result<(f64, f64), String> {
    let io = |e: std::io::Error| format!("{name}: {e}");
    let t = Instant::now();
    let amount = match name {
        "walk" => walk(dir, &mut Vec::new()).map_err(io)? as f64,
        "cat" => {
            let mut files = Vec::new();
            walk(dir, &mut files).map_err(io)?;
            files.retain(|f| !f.ends_with("big"));
            let mut buf = vec![0u8; 1 << 20];
            let mut bytes = 0;
            for f in &files {
                bytes += read_all(f, &mut buf).map_err(io)?;
            }
            bytes as f64 / 1048576.0
        }
        "seq" => read_all(&dir.join("big"), &mut vec![0u8; 1 << 20]).map_err(io)? as f64 / 1048576.0,
        "storm" => {
            let paths: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("dir000/file{i:05}"))).collect();
            let ops = a.storm_ops;
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..a.threads)
                    .map(|k| {
                        let paths = &paths;
                        s.spawn(move || -> std::io::Result<()> {
                            let mut buf = [0u8; 4096];
                            for i in 0..ops {
                                let mut f = std::fs::File::open(&paths[(i + k) % paths.len()])?;
                                f.read_exact(&mut buf[..1024])?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                hs.into_iter()
                    .try_for_each(|h| h.join().unwrap_or(Err(std::io::Error::other("panic"))))
            })
            .map_err(io)?;
            (ops * a.threads) as f64
        }
        _ => unreachable!(),
    };
    Ok((t.elapsed().as_secs_f64(), amount))
}

fn unit(name: &str) -> &'static str {
    match name {
        "walk" => "entries/s",
        "cat" | "seq" => "MiB/s",
        _ => "ops/s",
    }
}

fn main() -> Result<(), String> {
    ext4kit_alloc::tune();
    let a = Args::parse();
    need_kernel("fuse-read")?;
    std::fs::create_dir_all(&a.work).map_err(|e| e.to_string())?;
    let img = make_image(&a)?;
    let mnt = a.work.join("mnt");
    let peers = [Peer::Ext4kit, Peer::Fuse2fs, Peer::Kernel];
    let mut rows = Vec::new();
    for w in ["walk", "cat", "seq", "storm"] {
        for temp in ["cold", "warm"] {
            let mut rates = Vec::new();
            for p in peers {
                let m = mount_peer(p, &img, &mnt, a.threads)?;
                let mut r = workload(w, &mnt, &a)?;
                if temp == "warm" {
                    r = workload(w, &mnt, &a)?;
                }
                drop(m);
                let rate = r.1 / r.0;
                eprintln!("{w:<6} {temp:<5} {:<8} {rate:>12.1} {}", p.name(), unit(w));
                rates.push(rate);
            }
            rows.push((w, temp, rates));
        }
    }
    println!(
        "\nimage: {} ({} dirs x {} files, {} MiB sequential file), {} threads, 2 cores",
        img.display(),
        a.dirs,
        a.files_per_dir,
        a.big_mib,
        a.threads
    );
    println!(
        "{:<7}{:<6}{:>14}{:>14}{:>14}  {:<10}{:>16}{:>16}",
        "work", "cache", "ext4kit", "fuse2fs", "kernel", "unit", "ext4kit/fuse2fs", "ext4kit/kernel"
    );
    let mut csv = String::from("workload,cache,unit,ext4kit,fuse2fs,kernel\n");
    for (w, temp, r) in &rows {
        println!(
            "{:<7}{:<6}{:>14.1}{:>14.1}{:>14.1}  {:<10}{:>15.2}x{:>15.2}x",
            w,
            temp,
            r[0],
            r[1],
            r[2],
            unit(w),
            r[0] / r[1],
            r[0] / r[2]
        );
        csv.push_str(&format!("{w},{temp},{},{:.1},{:.1},{:.1}\n", unit(w), r[0], r[1], r[2]));
    }
    if let Some(p) = &a.csv {
        std::fs::write(p, csv).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}
