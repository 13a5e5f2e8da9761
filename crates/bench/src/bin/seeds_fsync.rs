//! The O(dirty) fsync experiment (fsync / fdatasync on large cached files),
//! on ext4kit (library) and on the kernel (loop-mounted ext4 with 2 KiB
//! blocks), side by side:
//!
//! For files of 5,000 and 50,000 cached 2 KiB blocks (written, synced, then
//! read once so every block is cached), 1,000 × (2 KiB block write at a
//! pseudo-random offset + fsync), and the same with fdatasync. Reported:
//! median per-op time, total, the 50k/5k ratio, and for ext4kit the inode
//! records each variant wrote, plus the write+writeback time without the
//! device flush (the CPU part O(dirty) fsync is about: it must not grow
//! with the number of cached pages).
//!
//! Acceptance: ext4kit's fsync at 50,000 blocks within 1.5× of 5,000, and
//! fdatasync writes no inode (the size never changes).
//!
//! Run as root (loop mount):  target/release/seeds-fsync [--ops 1000]

/// The benchmark programs run the library in-process, so they use the
/// allocator the `ext4kit` binary ships with (see its `main.rs`): numbers
/// then describe what users of our binaries get.
#[global_allocator]
static ALLOC: ext4kit_alloc::Allocator = ext4kit_alloc::Allocator;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use ext4kit::vfs::SyncLevel;
use ext4kit::{File, Fs, OpenFlags, OpenOptions};
use ext4kit_bench::{median, mount, need_kernel, run};

#[derive(Parser)]
#[command(about = "O(dirty) fsync: fsync/fdatasync into large cached files, ext4kit vs kernel")]
struct Args {
    /// File sizes in 2 KiB blocks.
    #[arg(long, value_delimiter = ',', default_value = "5000,50000")]
    blocks: Vec<u64>,
    /// Write+sync operations per measurement.
    #[arg(long, default_value_t = 1000)]
    ops: usize,
    /// Work directory.
    #[arg(long, default_value = "target/bench-fsync")]
    work: PathBuf,
    /// Skip the kernel peer (no root needed).
    #[arg(long)]
    no_kernel: bool,
}

const BS: u64 = 2048;

fn make_image(path: &Path, blocks: &[u64]) -> Result<(), String> {
    let total: u64 = blocks.iter().sum::<u64>() * BS;
    let size_mib = (total >> 20) * 2 + 128;
    run(Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-b", "2048"])
        .arg(path)
        .arg(format!("{size_mib}M")))
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// One measured series.
#[derive(Default)]
struct Series {
    per_op: Vec<Duration>,
    total: Duration,
    inode_writes: u64,
}

impl Series {
    fn median_us(&mut self) -> f64 {
        median(&mut self.per_op).as_secs_f64() * 1e6
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Sync {
    Fsync,
    Fdatasync,
    /// Write + writeback, no device flush (ext4kit only).
    WritebackOnly,
}

/// Measurements are interleaved: this many rounds, each running a slice of
/// the operations on every file size in turn, so the noise of a shared
/// machine (other I/O, flush latency) hits all sizes alike.
const ROUNDS: usize = 10;

/// `ops` writes at offsets drawn from the first `window` blocks, each
/// followed by the sync `how`, appended to `into`.
fn ours_ops(fs: &Fs, f: &File, window: u64, ops: usize, how: Sync, x: &mut u64, into: &mut Series) {
    let block = vec![0x5Au8; BS as usize];
    let w0 = fs.stats().inode_writes;
    let t0 = Instant::now();
    for _ in 0..ops {
        let off = (xorshift(x) % window) * BS;
        let t = Instant::now();
        fs.pwrite(f, off, &block).expect("pwrite");
        match how {
            Sync::Fsync => fs.fsync(f).expect("fsync"),
            Sync::Fdatasync => fs.fdatasync(f).expect("fdatasync"),
            Sync::WritebackOnly => {
                fs.writeback_inode(&f.inode, SyncLevel::Data).expect("writeback");
            }
        }
        into.per_op.push(t.elapsed());
    }
    into.total += t0.elapsed();
    into.inode_writes += fs.stats().inode_writes - w0;
}

fn kernel_ops(f: &std::fs::File, window: u64, ops: usize, data_only: bool, x: &mut u64, into: &mut Series) {
    use std::os::unix::fs::FileExt;
    let block = vec![0x5Au8; BS as usize];
    let t0 = Instant::now();
    for _ in 0..ops {
        let off = (xorshift(x) % window) * BS;
        let t = Instant::now();
        f.write_all_at(&block, off).expect("pwrite");
        if data_only {
            f.sync_data().expect("fdatasync");
        } else {
            f.sync_all().expect("fsync");
        }
        into.per_op.push(t.elapsed());
    }
    into.total += t0.elapsed();
}

fn fill(blocks: u64, salt: u8) -> Vec<u8> {
    (0..blocks * BS)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

fn main() -> Result<(), String> {
    ext4kit_alloc::tune();
    let a = Args::parse();
    if !a.no_kernel {
        need_kernel("seeds-fsync")?;
    }
    let _ = std::fs::remove_dir_all(&a.work);
    std::fs::create_dir_all(&a.work).map_err(|e| e.to_string())?;

    // ext4kit: its own image.
    let img = a.work.join("ext4kit.img");
    make_image(&img, &a.blocks)?;
    let fs = Fs::open_image(
        &img,
        &OpenOptions {
            read_only: false,
            cache_budget: 2 << 30,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let mut files = Vec::new();
    for &n in &a.blocks {
        let path = format!("/f{n}");
        let f = fs
            .open(path.as_bytes(), OpenFlags::from_bits(0o100 | 2))
            .map_err(|e| e.to_string())?;
        let data = fill(n, 1);
        for c in data.chunks(1 << 20) {
            fs.write(&f, c).map_err(|e| e.to_string())?;
        }
        fs.fsync(&f).map_err(|e| e.to_string())?;
        let mut back = vec![0u8; data.len()];
        fs.pread(&f, 0, &mut back).map_err(|e| e.to_string())?;
        if back != data {
            return Err(format!("{path}: read back differs"));
        }
        let runs = fs.data_layout(f.inode.ino).map_err(|e| e.to_string())?.runs.len();
        eprintln!("ext4kit {path}: {} pages cached, {runs} extent(s)", f.inode.pages.len());
        files.push(f);
    }
    let small = a.blocks.iter().copied().min().unwrap_or(1);
    let per_round = a.ops.div_ceil(ROUNDS);
    // ours[size][kind]: fsync, fdatasync, wb-only, wb-window.
    let mut ours: Vec<[Series; 4]> = a.blocks.iter().map(|_| Default::default()).collect();
    let kinds = [
        (Sync::Fsync, false),
        (Sync::Fdatasync, false),
        (Sync::WritebackOnly, false),
        (Sync::WritebackOnly, true),
    ];
    for (k, &(how, windowed)) in kinds.iter().enumerate() {
        let mut rng: Vec<u64> = a.blocks.iter().map(|_| 0x2545_F491_4F6C_DD1D).collect();
        for _ in 0..ROUNDS {
            for (i, &n) in a.blocks.iter().enumerate() {
                let w = if windowed { small } else { n };
                ours_ops(&fs, &files[i], w, per_round, how, &mut rng[i], &mut ours[i][k]);
            }
        }
    }
    drop(files);
    fs.sync().map_err(|e| e.to_string())?;
    drop(fs);
    let fsck = Command::new("e2fsck")
        .arg("-fn")
        .arg(&img)
        .output()
        .map_err(|e| e.to_string())?;
    let fsck_ok = fsck.status.success();

    // The kernel: the same workload on a loop-mounted image of its own.
    let mut kern: Vec<[Series; 2]> = Vec::new();
    if !a.no_kernel {
        let kimg = a.work.join("kernel.img");
        make_image(&kimg, &a.blocks)?;
        let m = mount(&kimg, &a.work.join("mnt"), "")?;
        let mut kfiles = Vec::new();
        for &n in &a.blocks {
            use std::io::Read;
            let p = m.path().join(format!("f{n}"));
            std::fs::write(&p, fill(n, 1)).map_err(|e| e.to_string())?;
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .map_err(|e| e.to_string())?;
            f.sync_all().map_err(|e| e.to_string())?;
            let mut sink = Vec::new();
            (&f).read_to_end(&mut sink).map_err(|e| e.to_string())?;
            kfiles.push(f);
            kern.push(Default::default());
        }
        for (k, data_only) in [false, true].into_iter().enumerate() {
            let mut rng: Vec<u64> = a.blocks.iter().map(|_| 0x2545_F491_4F6C_DD1D).collect();
            for _ in 0..ROUNDS {
                for (i, &n) in a.blocks.iter().enumerate() {
                    kernel_ops(&kfiles[i], n, per_round, data_only, &mut rng[i], &mut kern[i][k]);
                }
            }
        }
        drop(kfiles);
        m.unmount().map_err(|e| e.to_string())?;
    }
    // (blocks, fsync med, total, inodes, fdatasync med, total, inodes, wb, wbw)
    let ours: Vec<_> = ours
        .iter_mut()
        .zip(&a.blocks)
        .map(|(s, &n)| {
            (
                n,
                s[0].median_us(),
                s[0].total,
                s[0].inode_writes,
                s[1].median_us(),
                s[1].total,
                s[1].inode_writes,
                s[2].median_us(),
                s[3].median_us(),
            )
        })
        .collect();
    let kern: Vec<_> = kern
        .iter_mut()
        .zip(&a.blocks)
        .map(|(s, &n)| (n, s[0].median_us(), s[0].total, s[1].median_us(), s[1].total))
        .collect();

    println!(
        "fsync — {} × (2 KiB write at a random block + sync) into a file of N cached 2 KiB blocks ({ROUNDS} interleaved rounds)",
        per_round * ROUNDS
    );
    println!("median µs per op; total ms; inode = inode records ext4kit wrote; wb-only = write + writeback without the device flush;");
    println!("wb-window = wb-only with offsets drawn from the first {} blocks for every file (same locality, only the cached-page count differs)\n", a.blocks.iter().min().unwrap_or(&0));
    println!(
        "{:>7} | {:>9} {:>8} {:>6} | {:>9} {:>8} {:>6} | {:>8} {:>9} || {:>9} {:>8} | {:>9} {:>8}",
        "blocks",
        "fsync",
        "total",
        "inode",
        "fdatasync",
        "total",
        "inode",
        "wb-only",
        "wb-window",
        "k fsync",
        "total",
        "k fdsync",
        "total"
    );
    for (i, o) in ours.iter().enumerate() {
        let k = kern.get(i);
        println!(
            "{:>7} | {:>9.1} {:>8.0} {:>6} | {:>9.1} {:>8.0} {:>6} | {:>8.1} {:>9.1} || {:>9} {:>8} | {:>9} {:>8}",
            o.0,
            o.1,
            o.2.as_secs_f64() * 1e3,
            o.3,
            o.4,
            o.5.as_secs_f64() * 1e3,
            o.6,
            o.7,
            o.8,
            k.map_or("-".into(), |k| format!("{:.1}", k.1)),
            k.map_or("-".into(), |k| format!("{:.0}", k.2.as_secs_f64() * 1e3)),
            k.map_or("-".into(), |k| format!("{:.1}", k.3)),
            k.map_or("-".into(), |k| format!("{:.0}", k.4.as_secs_f64() * 1e3)),
        );
    }
    let mut ok = fsck_ok;
    if ours.len() >= 2 {
        let (s, l) = (&ours[0], &ours[ours.len() - 1]);
        let r = l.1 / s.1;
        let rd = l.4 / s.4;
        let rw = l.7 / s.7;
        let rww = l.8 / s.8;
        print!(
            "\nratio {}/{}: ext4kit fsync {r:.2}x, fdatasync {rd:.2}x, wb-only {rw:.2}x, wb-window {rww:.2}x",
            l.0, s.0
        );
        if kern.len() >= 2 {
            let (ks, kl) = (&kern[0], &kern[kern.len() - 1]);
            print!("; kernel fsync {:.2}x, fdatasync {:.2}x", kl.1 / ks.1, kl.3 / ks.3);
        }
        println!();
        let pass = r <= 1.5;
        ok &= pass;
        println!(
            "acceptance: fsync at {} blocks within 1.5x of {}: {}",
            l.0,
            s.0,
            if pass { "PASS" } else { "FAIL" }
        );
    }
    let no_inode = ours.iter().all(|o| o.6 == 0);
    ok &= no_inode;
    println!(
        "acceptance: fdatasync wrote no inode record: {}",
        if no_inode { "PASS" } else { "FAIL" }
    );
    println!(
        "e2fsck -fn of the ext4kit image: {}",
        if fsck_ok { "clean" } else { "NOT CLEAN" }
    );
    let csv = a.work.join("seeds_fsync.csv");
    let mut out = String::from("impl,blocks,fsync_median_us,fsync_total_ms,fsync_inode_writes,fdatasync_median_us,fdatasync_total_ms,fdatasync_inode_writes,wb_only_median_us,wb_window_median_us\n");
    for o in &ours {
        out += &format!(
            "ext4kit,{},{:.1},{:.1},{},{:.1},{:.1},{},{:.1},{:.1}\n",
            o.0,
            o.1,
            o.2.as_secs_f64() * 1e3,
            o.3,
            o.4,
            o.5.as_secs_f64() * 1e3,
            o.6,
            o.7,
            o.8
        );
    }
    for k in &kern {
        out += &format!(
            "kernel,{},{:.1},{:.1},,{:.1},{:.1},,,\n",
            k.0,
            k.1,
            k.2.as_secs_f64() * 1e3,
            k.3,
            k.4.as_secs_f64() * 1e3
        );
    }
    std::fs::write(&csv, out).map_err(|e| e.to_string())?;
    println!("results: {}", csv.display());
    if ok {
        Ok(())
    } else {
        Err("acceptance failed".into())
    }
}
