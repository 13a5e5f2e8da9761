//! The read-side experiments of seeds 000, 001 and 002, on ext4kit (library)
//! and on the kernel (loop mount of the same image), side by side:
//!
//! - seed 000: N threads, each with its own open file of one 128 MiB file,
//!   random SEEK_SET in a loop. ext4kit is also run against a baseline whose
//!   lseek takes a per-inode lock (what the seed removed), so the table shows
//!   what the lock-free position buys.
//! - seed 001: N threads open/read/close the same few small files by path
//!   (AIM7 "misc_rtns_1"-style): path walk + dentry references.
//! - seed 002: 1,048,576 one-byte reads through the descriptor API
//!   (`dd bs=1 count=1M`), unshared table vs shared table.
//!
//! Run as root (loop mount):  sudo target/release/seeds-read [--threads 1,2,4]

/// The benchmark programs run the library in-process, so they use the
/// allocator the `ext4kit` binary ships with (see its `main.rs`): numbers
/// then describe what users of our binaries get.
#[global_allocator]
static ALLOC: ext4kit_alloc::Allocator = ext4kit_alloc::Allocator;

// Xoshiro256++: about a nanosecond per draw, small beside a 6 ns seek;
// the figures need no reproducible stream.
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use ext4kit::{Fs, OpenFlags, OpenOptions, Process, Whence};
use ext4kit_bench::{median, mount, need_kernel, run};

#[derive(Parser)]
#[command(about = "Seeds 000/001/002 read-side experiments: ext4kit vs kernel")]
struct Args {
    /// Thread counts to try.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    threads: Vec<usize>,
    /// Operations per thread per run.
    #[arg(long, default_value_t = 1_000_000)]
    ops: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Work directory.
    #[arg(long, default_value = "target/bench-seeds")]
    work: PathBuf,
}

fn make_image(work: &Path) -> Result<PathBuf, String> {
    let img = work.join("seeds.img");
    if img.exists() {
        return Ok(img);
    }
    let src = work.join("src");
    std::fs::create_dir_all(src.join("etc")).map_err(|e| e.to_string())?;
    let big = std::fs::File::create(src.join("big")).map_err(|e| e.to_string())?;
    big.set_len(128 << 20).map_err(|e| e.to_string())?;
    for i in 0..4 {
        std::fs::write(src.join("etc").join(format!("small{i}")), vec![b'x'; 600]).map_err(|e| e.to_string())?;
    }
    std::fs::write(src.join("onemeg"), vec![7u8; 1 << 20]).map_err(|e| e.to_string())?;
    run(Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-d"])
        .arg(&src)
        .arg(&img)
        .arg("64M"))?;
    Ok(img)
}

/// Run `f(thread_index)` on `n` threads at once; wall time.
fn par(n: usize, f: impl Fn(usize) + Sync) -> Duration {
    let t = Instant::now();
    std::thread::scope(|s| {
        for i in 0..n {
            let f = &f;
            s.spawn(move || f(i));
        }
    });
    t.elapsed()
}

fn best(reps: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut v: Vec<Duration> = (0..reps).map(|_| f()).collect();
    median(&mut v)
}

fn mops(ops: usize, d: Duration) -> f64 {
    ops as f64 / d.as_secs_f64() / 1e6
}

fn main() -> Result<(), String> {
    ext4kit_alloc::tune();
    let a = Args::parse();
    need_kernel("seeds-read")?;
    std::fs::create_dir_all(&a.work).map_err(|e| e.to_string())?;
    let img = make_image(&a.work)?;
    let fs = Fs::open_image(&img, &OpenOptions::default()).map_err(|e| e.to_string())?;
    let m = mount(&img, &a.work.join("mnt"), "ro")?;
    let ops = a.ops;

    println!("seed 000 — random SEEK_SET, each thread its own open file of a 128 MiB file ({ops} seeks/thread, M seeks/s total)");
    println!(
        "{:>8} | {:>10} {:>16} {:>8} | {:>10} {:>8}",
        "threads", "ext4kit", "locked baseline", "ratio", "kernel", "ext/kern"
    );
    for &n in &a.threads {
        let files: Vec<_> = (0..n)
            .map(|_| fs.open(b"/big", OpenFlags::default()).unwrap())
            .collect();
        let t_ours = best(a.reps, || {
            par(n, |i| {
                let mut x = SmallRng::seed_from_u64(0x9E37_79B9_7F4A_7C15 ^ i as u64);
                for _ in 0..ops {
                    let off = x.random_range(0..128i64 << 20);
                    std::hint::black_box(files[i].lseek(&fs, off, Whence::Set).unwrap());
                }
            })
        });
        // Baseline: the same seek behind one lock per inode (i_mutex).
        let inode_lock = Mutex::new(());
        let t_locked = best(a.reps, || {
            par(n, |i| {
                let mut x = SmallRng::seed_from_u64(0x9E37_79B9_7F4A_7C15 ^ i as u64);
                for _ in 0..ops {
                    let off = x.random_range(0..128i64 << 20);
                    let _g = inode_lock.lock().unwrap();
                    std::hint::black_box(files[i].lseek(&fs, off, Whence::Set).unwrap());
                }
            })
        });
        let kfiles: Vec<_> = (0..n)
            .map(|_| std::fs::File::open(m.path().join("big")).unwrap())
            .collect();
        let t_kernel = best(a.reps, || {
            par(n, |i| {
                use std::io::Seek;
                let mut f = &kfiles[i];
                let mut x = SmallRng::seed_from_u64(0x9E37_79B9_7F4A_7C15 ^ i as u64);
                for _ in 0..ops {
                    let off = x.random_range(0..128u64 << 20);
                    std::hint::black_box(f.seek(std::io::SeekFrom::Start(off)).unwrap());
                }
            })
        });
        let total = ops * n;
        println!(
            "{:>8} | {:>10.1} {:>16.1} {:>7.1}x | {:>10.1} {:>7.1}x",
            n,
            mops(total, t_ours),
            mops(total, t_locked),
            t_locked.as_secs_f64() / t_ours.as_secs_f64(),
            mops(total, t_kernel),
            t_kernel.as_secs_f64() / t_ours.as_secs_f64()
        );
    }

    let storm = ops / 10;
    println!("\nseed 001 — open/read/close of the same 4 small files by path ({storm} per thread, k ops/s total)");
    println!(
        "{:>8} | {:>10} {:>10} | {:>10} {:>8}",
        "threads", "ext4kit", "scaling", "kernel", "ext/kern"
    );
    let mut base = 0.0;
    for &n in &a.threads {
        let t_ours = best(a.reps, || {
            par(n, |i| {
                let mut p = Process::new(fs.clone());
                let mut buf = [0u8; 1024];
                for k in 0..storm {
                    let path = format!("/etc/small{}", (k + i) % 4);
                    let fd = p.open(path.as_bytes(), OpenFlags::default()).unwrap();
                    std::hint::black_box(p.read(fd, &mut buf).unwrap());
                    p.close(fd).unwrap();
                }
            })
        });
        let t_kernel = best(a.reps, || {
            par(n, |i| {
                use std::io::Read;
                let mut buf = [0u8; 1024];
                for k in 0..storm {
                    let mut f = std::fs::File::open(m.path().join(format!("etc/small{}", (k + i) % 4))).unwrap();
                    std::hint::black_box(f.read(&mut buf).unwrap());
                }
            })
        });
        let rate = (storm * n) as f64 / t_ours.as_secs_f64() / 1e3;
        if base == 0.0 {
            base = rate;
        }
        println!(
            "{:>8} | {:>10.0} {:>9.2}x | {:>10.0} {:>7.1}x",
            n,
            rate,
            rate / base,
            (storm * n) as f64 / t_kernel.as_secs_f64() / 1e3,
            t_kernel.as_secs_f64() / t_ours.as_secs_f64()
        );
    }

    println!("\nseed 002 — 1,048,576 one-byte reads through descriptors (dd bs=1 count=1M), seconds");
    let count = 1 << 20;
    let t_unshared = best(a.reps, || {
        let mut p = Process::new(fs.clone());
        let fd = p.open("/onemeg", OpenFlags::default()).unwrap();
        let mut b = [0u8; 1];
        let t = Instant::now();
        for _ in 0..count {
            p.read(fd, &mut b).unwrap();
        }
        t.elapsed()
    });
    let t_shared = best(a.reps, || {
        let mut p = Process::new(fs.clone());
        let fd = p.open("/onemeg", OpenFlags::default()).unwrap();
        let _other = p.share();
        let mut b = [0u8; 1];
        let t = Instant::now();
        for _ in 0..count {
            p.read(fd, &mut b).unwrap();
        }
        t.elapsed()
    });
    let t_kernel = best(a.reps, || {
        use std::io::Read;
        let mut f = std::fs::File::open(m.path().join("onemeg")).unwrap();
        let mut b = [0u8; 1];
        let t = Instant::now();
        for _ in 0..count {
            f.read_exact(&mut b).unwrap();
        }
        t.elapsed()
    });
    println!("{:>24} | {:>8}", "", "seconds");
    println!("{:>24} | {:>8.3}", "ext4kit unshared table", t_unshared.as_secs_f64());
    println!(
        "{:>24} | {:>8.3}  ({:.2}x the unshared time)",
        "ext4kit shared table",
        t_shared.as_secs_f64(),
        t_shared.as_secs_f64() / t_unshared.as_secs_f64()
    );
    println!(
        "{:>24} | {:>8.3}  ({:.1}x the unshared time)",
        "kernel read(2)",
        t_kernel.as_secs_f64(),
        t_kernel.as_secs_f64() / t_unshared.as_secs_f64()
    );
    drop(m);
    let _ = Arc::strong_count(&fs);
    Ok(())
}
