//! The mount benchmark: the same workloads on the ext4kit FUSE mount
//! (`ext4kit mount`), on fuse2fs (e2fsprogs' FUSE server, what people use
//! today) and on the kernel's ext4 (loop mount), side by side in one run,
//! each on a fresh copy of one mke2fs image (ext4, 4 KiB blocks).
//!
//! Workloads (`--only NAME,...`):
//! - create: N empty files in one directory (htree inserts), files/s overall
//!   and in the last 10,000;
//! - fsync: the O(dirty) fsync table through the mount: 1,000 × (4 KiB write
//!   at a random block + fsync), and + fdatasync, into files of 5,000 and
//!   50,000 cached 4 KiB blocks (4 KiB, not the library table's 2 KiB: the
//!   image has 4 KiB blocks), median µs per write+sync;
//! - dd: `dd if=/dev/zero of=F bs=1 count=1M` (the per-syscall cost),
//!   seconds;
//! - storm: open/read 4 KiB/close of 4 small files from several threads
//!   (path walk and references), ops/s, cold mount;
//! - seq: 1 GiB written in 1 MiB writes + fsync (counted), then, on a
//!   fresh mount with the kernel's caches dropped, read back, MiB/s;
//! - fio: random 4 KiB reads then writes, buffered (direct=0), psync,
//!   iodepth 1, 2 jobs on one 1 GiB file just written, fixed runtime, IOPS
//!   (fio drops the file's cached pages first; the image file stays in the
//!   host's page cache: this measures the mount, not the disk);
//! - tree: untar of a generated source-like tree (30,000 files, 2,000
//!   directories), then the untar plus making it durable (`syncfs` on the
//!   kernel; unmounting a FUSE server, which `sync` does not reach), `find`
//!   over it on a fresh mount, `rm -rf` of it; seconds of wall time.
//!
//! Each figure is the median of `--runs` runs; peers are interleaved within
//! a run. A peer whose run took a minute or more is not repeated for that
//! workload (`--long-run-secs`): fuse2fs needs ~5 minutes for the 50,000
//! creates (its directory inserts are linear scans) and a minute for the
//! bs=1 dd. With the default sizes the whole run takes ~20 minutes on the
//! 2-CPU machine; `--creates 20000 --dd-count 262144` brings it near 10.
//! After every run each image gets `e2fsck -fn`.
//!
//! While ext4kit's mount is read-only (before the write engine lands in the
//! FUSE server), its writing phases are n/a and its read phases run on a
//! read-only mount of the image the kernel wrote (see `session`).
//!
//! Run as root:  target/release/mount-bench [--runs 3] [--only create,tree]

/// The benchmark programs run the library in-process, so they use the
/// allocator the `ext4kit` binary ships with (see its `main.rs`): numbers
/// then describe what users of our binaries get.
#[global_allocator]
static ALLOC: ext4kit_alloc::Allocator = ext4kit_alloc::Allocator;

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use ext4kit_bench::peers::{fsck_verdict, mount_options, Peer, PeerConfig, PeerMount};
use ext4kit_bench::session::Session;
use ext4kit_bench::srctree::{tarball, TreeCounts, TreeShape};
use ext4kit_bench::{median, need_kernel, run};

const WORKLOADS: [&str; 7] = ["create", "fsync", "dd", "storm", "seq", "fio", "tree"];
/// Workloads with a phase that only reads (measurable on a read-only mount).
const READS: [&str; 4] = ["storm", "seq", "fio", "tree"];

#[derive(Parser, Debug)]
#[command(about = "Workloads on the ext4kit mount, fuse2fs and the kernel's ext4, side by side")]
struct Args {
    /// Workloads to run, comma-separated (create, fsync, dd, storm, seq, fio, tree).
    #[arg(long, value_delimiter = ',', default_value = "create,fsync,dd,storm,seq,fio,tree")]
    only: Vec<String>,
    /// Peers to run, comma-separated (ext4kit, fuse2fs, kernel).
    #[arg(long, value_delimiter = ',', default_value = "ext4kit,fuse2fs,kernel")]
    peers: Vec<String>,
    /// Runs per workload and peer; the tables show medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// A peer whose run of a workload took at least this many seconds is
    /// not run again for that workload (a long run averages itself; fuse2fs
    /// needs minutes for some workloads). The table marks such figures.
    #[arg(long, default_value_t = 60)]
    long_run_secs: u64,
    /// create: files made in one directory.
    #[arg(long, default_value_t = 50_000)]
    creates: usize,
    /// fsync: file sizes in 4 KiB blocks.
    #[arg(long, value_delimiter = ',', default_value = "5000,50000")]
    fsync_blocks: Vec<u64>,
    /// fsync: write+sync operations per file size and sync kind.
    #[arg(long, default_value_t = 1000)]
    fsync_ops: usize,
    /// dd: one-byte writes (`count=`).
    #[arg(long, default_value_t = 1 << 20)]
    dd_count: u64,
    /// storm: threads.
    #[arg(long, default_value_t = 4)]
    storm_threads: usize,
    /// storm: open/read/close operations per thread.
    #[arg(long, default_value_t = 20_000)]
    storm_ops: usize,
    /// seq: MiB written then read.
    #[arg(long, default_value_t = 1024)]
    seq_mib: u64,
    /// fio: size of the file, MiB.
    #[arg(long, default_value_t = 1024)]
    fio_mib: u64,
    /// fio: seconds of each of randread and randwrite.
    #[arg(long, default_value_t = 5)]
    fio_secs: u64,
    /// tree: directories of the generated tree.
    #[arg(long, default_value_t = 2000)]
    tree_dirs: usize,
    /// tree: files of the generated tree.
    #[arg(long, default_value_t = 30_000)]
    tree_files: usize,
    /// The ext4kit binary.
    #[arg(long, default_value = "target/release/ext4kit")]
    ext4kit: PathBuf,
    /// ext4kit server threads (`ext4kit mount --threads`).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Extra fuse2fs -o options (we run as root, so none are needed;
    /// fuse2fs adds its own defaults, printed with the table).
    #[arg(long, default_value = "")]
    fuse2fs_opts: String,
    /// Treat ext4kit's mount as read-only even if it accepts -o rw.
    #[arg(long)]
    ext4kit_ro: bool,
    /// Work directory (template image, tarball, per-run images).
    #[arg(long, default_value = "target/bench-mount")]
    work: PathBuf,
    /// Also write the table as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
}

/// One reported figure of a workload.
struct Metric {
    label: String,
    unit: &'static str,
    /// Rates (files/s, MiB/s, IOPS) vs times (s, µs/op).
    higher_better: bool,
}

fn metric(label: impl Into<String>, unit: &'static str, higher_better: bool) -> Metric {
    Metric {
        label: label.into(),
        unit,
        higher_better,
    }
}

fn metrics(w: &str, a: &Args) -> Vec<Metric> {
    match w {
        "create" => {
            let step = a.creates.min(10_000);
            vec![
                metric(format!("create {} files, one dir", a.creates), "files/s", true),
                metric(
                    format!("create, files {}k-{}k", (a.creates - step) / 1000, a.creates / 1000),
                    "files/s",
                    true,
                ),
            ]
        }
        "fsync" => a
            .fsync_blocks
            .iter()
            .flat_map(|n| {
                [
                    metric(format!("write+fsync, {n}-block file"), "µs/op", false),
                    metric(format!("write+fdatasync, {n}-block file"), "µs/op", false),
                ]
            })
            .collect(),
        "dd" => vec![metric(format!("dd bs=1 count={}", a.dd_count), "s", false)],
        "storm" => vec![metric(
            format!("open/read/close storm, {} threads", a.storm_threads),
            "ops/s",
            true,
        )],
        "seq" => vec![
            metric(format!("seq write {} MiB + fsync", a.seq_mib), "MiB/s", true),
            metric(format!("seq read {} MiB, cold", a.seq_mib), "MiB/s", true),
        ],
        "fio" => vec![
            metric(format!("fio randread 4k, 2 jobs, {} s", a.fio_secs), "IOPS", true),
            metric(format!("fio randwrite 4k, 2 jobs, {} s", a.fio_secs), "IOPS", true),
        ],
        "tree" => vec![
            metric(format!("untar {} files", a.tree_files), "s", false),
            metric(format!("untar {} files + sync", a.tree_files), "s", false),
            metric("find, cold", "s", false),
            metric("rm -rf", "s", false),
        ],
        _ => Vec::new(),
    }
}

type Values = Vec<Option<f64>>;

/// Samples of one workload: `[peer][metric][run]`.
type Samples = Vec<Vec<Vec<f64>>>;

fn io<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// 1 MiB of pseudo-random bytes (incompressible, never all zero).
fn random_mib(seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; 1 << 20];
    ext4kit_testkit::TestRng::new(seed).fill(&mut v);
    v
}

/// Write `mib` MiB to `path` in 1 MiB writes, each chunk tagged with its
/// index, then fsync. Returns the elapsed time (writes + fsync).
fn write_file(path: &Path, mib: u64) -> Result<Duration, String> {
    use std::io::Write;
    let mut chunk = random_mib(7);
    let t = Instant::now();
    let mut f = std::fs::File::create(path).map_err(io("create"))?;
    for i in 0..mib {
        chunk[..8].copy_from_slice(&i.to_le_bytes());
        f.write_all(&chunk).map_err(io("write"))?;
    }
    f.sync_all().map_err(io("fsync"))?;
    Ok(t.elapsed())
}

fn w_create(s: &mut Session, a: &Args) -> Result<Values, String> {
    let n = a.creates;
    let step = n.min(10_000);
    let r = s.write(|dir| {
        let d = dir.join("create");
        std::fs::create_dir(&d).map_err(io("mkdir"))?;
        let t0 = Instant::now();
        let mut mark = t0;
        for i in 0..n {
            if i == n - step {
                mark = Instant::now();
            }
            std::fs::File::create(d.join(format!("file-{i:08}"))).map_err(io("create"))?;
        }
        let (total, last) = (t0.elapsed(), mark.elapsed());
        let listed = std::fs::read_dir(&d).map_err(io("readdir"))?.count();
        if listed != n {
            return Err(format!("create: made {n} files, the directory lists {listed}"));
        }
        Ok(vec![n as f64 / total.as_secs_f64(), step as f64 / last.as_secs_f64()])
    })?;
    Ok(unpack(r, 2))
}

fn unpack(r: Option<Vec<f64>>, n: usize) -> Values {
    match r {
        Some(v) => v.into_iter().map(Some).collect(),
        None => vec![None; n],
    }
}

/// Interleaved rounds, as seeds-fsync: each round runs a slice of the
/// operations on every file size and sync kind in turn.
const FSYNC_ROUNDS: usize = 10;
const FSYNC_BS: u64 = 4096;

fn w_fsync(s: &mut Session, a: &Args) -> Result<Values, String> {
    let r = s.write(|dir| {
        let mut files = Vec::new();
        for &n in &a.fsync_blocks {
            let p = dir.join(format!("fsync-{n}"));
            let mib = (n * FSYNC_BS).div_ceil(1 << 20);
            write_file(&p, mib)?;
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .map_err(io("open"))?;
            f.set_len(n * FSYNC_BS).map_err(io("truncate"))?;
            f.sync_all().map_err(io("fsync"))?;
            // Read once: every block cached (in the kernel's page cache of
            // the mount and in the server's own cache, if it has one).
            let mut sink = vec![0u8; 1 << 20];
            let mut got = 0u64;
            loop {
                let k = f.read_at(&mut sink, got).map_err(io("read"))?;
                if k == 0 {
                    break;
                }
                got += k as u64;
            }
            if got != n * FSYNC_BS {
                return Err(format!("fsync: read back {got} bytes of {}", n * FSYNC_BS));
            }
            files.push(f);
        }
        let block = vec![0x5Au8; FSYNC_BS as usize];
        let per_round = a.fsync_ops.div_ceil(FSYNC_ROUNDS);
        // per_op[size * 2 + kind], kind 0 fsync, 1 fdatasync; each round
        // runs a slice of both kinds on every size, so a burst of other I/O
        // on the host (flush latency) hits all four series alike.
        let mut per_op: Vec<Vec<Duration>> = vec![Vec::new(); a.fsync_blocks.len() * 2];
        let mut rng = ext4kit_testkit::TestRng::new(0x2545_F491_4F6C_DD1D);
        for _ in 0..FSYNC_ROUNDS {
            for (i, &n) in a.fsync_blocks.iter().enumerate() {
                for data_only in [false, true] {
                    for _ in 0..per_round {
                        let off = rng.below(n) * FSYNC_BS;
                        let t = Instant::now();
                        files[i].write_all_at(&block, off).map_err(io("pwrite"))?;
                        if data_only {
                            files[i].sync_data().map_err(io("fdatasync"))?;
                        } else {
                            files[i].sync_all().map_err(io("fsync"))?;
                        }
                        per_op[i * 2 + usize::from(data_only)].push(t.elapsed());
                    }
                }
            }
        }
        let out: Vec<f64> = per_op.iter_mut().map(|v| median(v).as_secs_f64() * 1e6).collect();
        Ok(out)
    })?;
    Ok(unpack(r, a.fsync_blocks.len() * 2))
}

fn w_dd(s: &mut Session, a: &Args) -> Result<Values, String> {
    let r = s.write(|dir| {
        let out = dir.join("dd.out");
        let t = Instant::now();
        run(Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", out.display()))
            .args(["bs=1", &format!("count={}", a.dd_count), "status=none"]))?;
        let secs = t.elapsed().as_secs_f64();
        let len = std::fs::metadata(&out).map_err(io("stat"))?.len();
        if len != a.dd_count {
            return Err(format!("dd: file has {len} bytes, wrote {}", a.dd_count));
        }
        Ok(vec![secs])
    })?;
    Ok(unpack(r, 1))
}

fn w_storm(s: &mut Session, a: &Args) -> Result<Values, String> {
    let files = 4;
    s.write(|dir| {
        let d = dir.join("storm");
        std::fs::create_dir(&d).map_err(io("mkdir"))?;
        let data = random_mib(1);
        for i in 0..files {
            std::fs::write(d.join(format!("f{i}")), &data[i * 4096..(i + 1) * 4096]).map_err(io("write"))?;
        }
        Ok(())
    })?;
    let r = s.read(true, |dir| {
        let paths: Vec<PathBuf> = (0..files).map(|i| dir.join(format!("storm/f{i}"))).collect();
        let ops = a.storm_ops;
        let t = Instant::now();
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..a.storm_threads)
                .map(|k| {
                    let paths = &paths;
                    sc.spawn(move || -> std::io::Result<()> {
                        let mut buf = [0u8; 4096];
                        for i in 0..ops {
                            let mut f = std::fs::File::open(&paths[(i + k) % paths.len()])?;
                            f.read_exact(&mut buf)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter()
                .try_for_each(|h| h.join().unwrap_or(Err(std::io::Error::other("storm thread panicked"))))
        })
        .map_err(io("storm"))?;
        Ok(vec![(ops * a.storm_threads) as f64 / t.elapsed().as_secs_f64()])
    })?;
    Ok(unpack(r, 1))
}

fn w_seq(s: &mut Session, a: &Args) -> Result<Values, String> {
    let mib = a.seq_mib;
    let w = s.write(|dir| Ok(mib as f64 / write_file(&dir.join("seq"), mib)?.as_secs_f64()))?;
    let r = s.read(true, |dir| {
        let mut f = std::fs::File::open(dir.join("seq")).map_err(io("open"))?;
        let mut buf = vec![0u8; 1 << 20];
        let t = Instant::now();
        let mut total = 0u64;
        let mut chunks = 0u64;
        loop {
            // Whole 1 MiB chunks (read may return less).
            let mut got = 0;
            while got < buf.len() {
                let k = f.read(&mut buf[got..]).map_err(io("read"))?;
                if k == 0 {
                    break;
                }
                got += k;
            }
            if got == 0 {
                break;
            }
            if got == buf.len() && buf[..8] != chunks.to_le_bytes() {
                return Err(format!("seq: chunk {chunks} read back wrong"));
            }
            chunks += 1;
            total += got as u64;
        }
        let secs = t.elapsed().as_secs_f64();
        if total != mib << 20 {
            return Err(format!("seq: read {total} bytes of {}", mib << 20));
        }
        Ok(mib as f64 / secs)
    })?;
    Ok(vec![w, r])
}

/// fio's terse (`--minimal`, version 3) output: field 8 is read IOPS,
/// field 49 write IOPS, field 5 the error code (1-based).
fn fio(file: &Path, rw: &str, a: &Args) -> Result<f64, String> {
    let o = Command::new("fio")
        .arg(format!("--name={rw}"))
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--rw={rw}"))
        .args([
            "--bs=4k",
            "--direct=0",
            "--ioengine=psync",
            "--iodepth=1",
            "--numjobs=2",
        ])
        .arg(format!("--size={}M", a.fio_mib))
        .arg(format!("--runtime={}", a.fio_secs))
        .args(["--time_based", "--group_reporting", "--minimal"])
        .args(if rw == "randread" { &["--readonly"][..] } else { &[][..] })
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("fio: {e} (apt-get install fio)"))?;
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().find(|l| l.starts_with("3;")).unwrap_or("");
    let f: Vec<&str> = line.split(';').collect();
    if !o.status.success() || f.len() < 49 || f[4] != "0" {
        return Err(format!(
            "fio {rw}: {} {}",
            String::from_utf8_lossy(&o.stderr).trim(),
            out.trim()
        ));
    }
    let idx = if rw == "randread" { 7 } else { 48 };
    f[idx]
        .parse::<f64>()
        .map_err(|e| format!("fio {rw}: iops field {:?}: {e}", f[idx]))
}

fn w_fio(s: &mut Session, a: &Args) -> Result<Values, String> {
    s.write(|dir| write_file(&dir.join("fio.dat"), a.fio_mib).map(|_| ()))?;
    // Not cold: fio drops the file's pages itself (invalidate=1), the
    // image stays in the host's page cache, so the figure is the mount's
    // per-request cost, not the disk's random-read rate.
    let r = s.read(false, |dir| fio(&dir.join("fio.dat"), "randread", a))?;
    let w = s.write(|dir| fio(&dir.join("fio.dat"), "randwrite", a))?;
    Ok(vec![r, w])
}

fn w_tree(s: &mut Session, tar: &Path, counts: &TreeCounts) -> Result<Values, String> {
    let untar = s.write(|dir| {
        let t = Instant::now();
        run(Command::new("tar").arg("-xf").arg(tar).arg("-C").arg(dir))?;
        Ok(t.elapsed().as_secs_f64())
    })?;
    // Then until all of it is on the image (syncfs; a FUSE server's
    // unmount — see `Session::settle`).
    let untar_sync = match (untar, s.settle()?) {
        (Some(u), Some(d)) => Some(u + d),
        _ => None,
    };
    let find = s.read(true, |dir| {
        let t = Instant::now();
        let o = Command::new("find")
            .arg(dir.join("tree"))
            .stdin(Stdio::null())
            .output()
            .map_err(io("find"))?;
        let secs = t.elapsed().as_secs_f64();
        let lines = o.stdout.iter().filter(|&&b| b == b'\n').count() as u64;
        if !o.status.success() || lines != counts.find_lines() {
            return Err(format!(
                "find listed {lines} entries, the tree has {} ({})",
                counts.find_lines(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(secs)
    })?;
    let rm = s.write(|dir| {
        let t = Instant::now();
        run(Command::new("rm").arg("-rf").arg(dir.join("tree")))?;
        let secs = t.elapsed().as_secs_f64();
        if dir.join("tree").exists() {
            return Err("rm -rf: the tree is still there".into());
        }
        Ok(secs)
    })?;
    Ok(vec![untar, untar_sync, find, rm])
}

/// The template every run copies: one mke2fs (ext4, 4 KiB blocks, fixed
/// UUID and hash seed, inode tables and journal written out so the
/// kernel's lazy-init thread does not run during measurements).
fn make_template(a: &Args) -> Result<PathBuf, String> {
    let size_mib = a.seq_mib.max(a.fio_mib) + 1024;
    let inodes = 131_072usize
        .max(a.creates + 20_000)
        .max(a.tree_files + a.tree_dirs + 20_000);
    let img = a.work.join(format!("template-{size_mib}m-{inodes}i.img"));
    if img.exists() {
        return Ok(img);
    }
    let tmp = img.with_extension("tmp");
    run(Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-b", "4096", "-N", &inodes.to_string()])
        .args(["-U", "e4b1e4b1-0000-4000-8000-000000000004"])
        .args([
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0,hash_seed=e4b1e4b1-0000-4000-8000-000000000005",
        ])
        .arg(&tmp)
        .arg(format!("{size_mib}M")))?;
    std::fs::rename(&tmp, &img).map_err(|e| e.to_string())?;
    Ok(img)
}

/// Whether `ext4kit mount -o rw` works (the FUSE server's write side may
/// not be merged yet).
fn ext4kit_can_write(cfg: &PeerConfig, template: &Path, work: &Path) -> Result<bool, String> {
    let img = work.join("probe.img");
    run(Command::new("cp").args(["--sparse=always"]).arg(template).arg(&img))?;
    let r = PeerMount::mount(Peer::Ext4kit, cfg, &img, &work.join("mnt"), false);
    let can = match r {
        Ok(m) => {
            m.unmount()?;
            true
        }
        Err(e) if e.contains("read-only") || e.contains("read-write") => {
            eprintln!("ext4kit mount -o rw refused ({e}): its writing phases are n/a");
            false
        }
        Err(e) => return Err(e),
    };
    let _ = std::fs::remove_file(&img);
    Ok(can)
}

/// Median of samples; for an even count the mean of the middle two (a
/// peer cut short after two runs is biased neither way).
fn median_f(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Speed ratio of ext4kit to `other` (>1: ext4kit faster).
fn ratio(m: &Metric, ours: Option<f64>, other: Option<f64>) -> Option<f64> {
    let (o, t) = (ours?, other?);
    Some(if m.higher_better { o / t } else { t / o })
}

fn fmt_val(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(x) if x >= 100.0 => format!("{x:.0}"),
        Some(x) if x >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
    }
}

fn fmt_ratio(v: Option<f64>) -> String {
    v.map_or("—".into(), |x| {
        if x >= 10.0 {
            format!("{x:.0}×")
        } else {
            format!("{x:.2}×")
        }
    })
}

fn main() -> Result<(), String> {
    ext4kit_alloc::tune();
    let a = Args::parse();
    need_kernel("mount-bench")?;
    for w in &a.only {
        if !WORKLOADS.contains(&w.as_str()) {
            return Err(format!("unknown workload {w:?}; known: {}", WORKLOADS.join(", ")));
        }
    }
    let peers: Vec<Peer> = Peer::ALL
        .into_iter()
        .filter(|p| a.peers.iter().any(|n| n == p.name()))
        .collect();
    std::fs::create_dir_all(&a.work).map_err(|e| e.to_string())?;
    let cfg = PeerConfig {
        ext4kit_bin: a.ext4kit.clone(),
        threads: a.threads,
        cache_budget: ext4kit::OpenOptions::default().cache_budget,
        fuse2fs_opts: a.fuse2fs_opts.clone(),
    };
    let template = make_template(&a)?;
    let writable = !a.ext4kit_ro && (!peers.contains(&Peer::Ext4kit) || ext4kit_can_write(&cfg, &template, &a.work)?);
    let tree = if a.only.iter().any(|w| w == "tree") {
        let shape = TreeShape {
            dirs: a.tree_dirs,
            files: a.tree_files,
            seed: 0x7472_6565,
        };
        Some(tarball(&a.work, &shape)?)
    } else {
        None
    };
    let mnt = a.work.join("mnt");
    let mut fuse2fs_seen = None;
    // fsck verdicts per peer: (clean, total, first failure).
    let mut fsck: Vec<(usize, usize, Option<String>)> = peers.iter().map(|_| (0, 0, None)).collect();
    let mut errors = Vec::new();
    let mut table: Vec<(&str, Vec<Metric>, Samples)> = Vec::new();
    let started = Instant::now();
    for w in WORKLOADS.iter().filter(|w| a.only.iter().any(|o| o == *w)) {
        let ms = metrics(w, &a);
        let mut vals: Samples = peers.iter().map(|_| ms.iter().map(|_| Vec::new()).collect()).collect();
        // Peers whose run took longer than --long-run-secs are not repeated.
        let mut done_once = vec![false; peers.len()];
        for r in 0..a.runs {
            for (pi, &p) in peers.iter().enumerate() {
                let can_write = p != Peer::Ext4kit || writable;
                if done_once[pi] || (!can_write && !READS.contains(w)) {
                    continue;
                }
                let img = a.work.join(format!("{w}-{}-{r}.img", p.name()));
                run(Command::new("cp").args(["--sparse=always"]).arg(&template).arg(&img))?;
                let t = Instant::now();
                let mut s = Session::new(p, &cfg, &img, &mnt, can_write);
                let res = match *w {
                    "create" => w_create(&mut s, &a),
                    "fsync" => w_fsync(&mut s, &a),
                    "dd" => w_dd(&mut s, &a),
                    "storm" => w_storm(&mut s, &a),
                    "seq" => w_seq(&mut s, &a),
                    "fio" => w_fio(&mut s, &a),
                    "tree" => {
                        let (tar, counts) = tree.as_ref().ok_or("no tarball")?;
                        w_tree(&mut s, tar, counts)
                    }
                    _ => unreachable!(),
                };
                if p == Peer::Fuse2fs && fuse2fs_seen.is_none() {
                    fuse2fs_seen = mount_options(&mnt);
                }
                let fin = s.finish();
                if t.elapsed().as_secs() >= a.long_run_secs && r + 1 < a.runs {
                    done_once[pi] = true;
                    eprintln!(
                        "{w} {}: one run took {:.0} s, not repeated",
                        p.name(),
                        t.elapsed().as_secs_f64()
                    );
                }
                let res = res.and_then(|v| fin.map(|_| v));
                match res {
                    Ok(v) => {
                        for (k, x) in v.iter().enumerate() {
                            if let Some(x) = x {
                                vals[pi][k].push(*x);
                            }
                        }
                        let shown: Vec<String> = v.iter().map(|x| fmt_val(*x)).collect();
                        eprintln!(
                            "[{:>5.0}s] {w:<6} run {r} {:<8} {}  ({:.1}s)",
                            started.elapsed().as_secs_f64(),
                            p.name(),
                            shown.join(" "),
                            t.elapsed().as_secs_f64()
                        );
                    }
                    Err(e) => {
                        eprintln!("{w} run {r} {}: FAILED: {e}", p.name());
                        errors.push(format!("{w} run {r} {}: {e}", p.name()));
                    }
                }
                let (ok, verdict) = fsck_verdict(&img);
                fsck[pi].1 += 1;
                if ok {
                    fsck[pi].0 += 1;
                    let _ = std::fs::remove_file(&img);
                } else {
                    eprintln!("e2fsck -fn {}: {verdict} (image kept)", img.display());
                    fsck[pi].2.get_or_insert(format!("{}: {verdict}", img.display()));
                }
            }
        }
        table.push((w, ms, vals));
    }

    // The report.
    let cmdline: Vec<String> = std::env::args().collect();
    let uname = Command::new("uname")
        .arg("-r")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    println!("\n## Mount benchmark: ext4kit vs fuse2fs vs kernel ext4\n");
    println!("command: `{}`", cmdline.join(" "));
    println!(
        "machine: {} CPUs, kernel {}; image: mke2fs -t ext4 -b 4096, {} (a fresh copy per run); medians of {} runs; total {:.0} s",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        uname.unwrap_or_default(),
        template.file_name().map_or(String::new(), |f| f.to_string_lossy().into_owned()),
        a.runs,
        started.elapsed().as_secs_f64()
    );
    for &p in &peers {
        println!("- {}: `{}`", p.name(), cfg.describe(p, p == Peer::Ext4kit && !writable));
    }
    if let Some(o) = &fuse2fs_seen {
        println!("- fuse2fs as mounted (fstype, options | super options): `{o}`");
    }
    if !writable && peers.contains(&Peer::Ext4kit) {
        println!("- ext4kit's mount is read-only here: its writing phases are n/a; its read phases ran on a read-only mount of the image the kernel wrote");
    }
    println!("\nRatios are speed ratios (ext4kit's rate / the peer's, or the peer's time / ext4kit's): above 1 means ext4kit is faster.\n");
    let col = |p: Peer| peers.iter().position(|&q| q == p);
    let (ie, if2, ik) = (col(Peer::Ext4kit), col(Peer::Fuse2fs), col(Peer::Kernel));
    println!("| workload | unit | ext4kit | fuse2fs | kernel | ext4kit / fuse2fs | ext4kit / kernel |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut csv = String::from("workload,metric,unit,ext4kit,fuse2fs,kernel\n");
    let mut not_run = Vec::new();
    let short = std::cell::Cell::new(false);
    for (w, ms, vals) in &table {
        for (k, m) in ms.iter().enumerate() {
            let med = |i: Option<usize>| median_f(&vals[i?][k]);
            let (e, f, kk) = (med(ie), med(if2), med(ik));
            if ie.is_some() && e.is_none() {
                not_run.push(m.label.clone());
            }
            // A figure from fewer runs than asked (long or failed runs) is marked.
            let cell = |i: Option<usize>, v: Option<f64>| {
                let n = i.map_or(0, |i| vals[i][k].len());
                if n > 0 && n < a.runs {
                    short.set(true);
                    format!("{}¹", fmt_val(v))
                } else {
                    fmt_val(v)
                }
            };
            println!(
                "| {} | {} | {} | {} | {} | {} | {} |",
                m.label,
                m.unit,
                cell(ie, e),
                cell(if2, f),
                cell(ik, kk),
                fmt_ratio(ratio(m, e, f)),
                fmt_ratio(ratio(m, e, kk))
            );
            let c = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
            csv.push_str(&format!("{w},{},{},{},{},{}\n", m.label, m.unit, c(e), c(f), c(kk)));
        }
    }
    if short.get() {
        println!(
            "\n¹ from fewer than {} runs: one run took at least {} s (not repeated), or a run failed (listed below).",
            a.runs, a.long_run_secs
        );
    }
    // O(dirty) fsync: does the per-op sync cost grow with the file?
    if let Some((_, ms, vals)) = table.iter().find(|t| t.0 == "fsync") {
        let n = a.fsync_blocks.len();
        if n >= 2 {
            let mut line = format!(
                "\nfsync growth ({}-block / {}-block file):",
                a.fsync_blocks[n - 1],
                a.fsync_blocks[0]
            );
            for (pi, p) in peers.iter().enumerate() {
                let med = |k: usize| median_f(&vals[pi][k]);
                let g = |k: usize| match (med(k), med((n - 1) * 2 + k)) {
                    (Some(s), Some(l)) => format!("{:.2}×", l / s),
                    _ => "n/a".into(),
                };
                line += &format!(" {} fsync {}, fdatasync {};", p.name(), g(0), g(1));
            }
            let _ = ms;
            println!("{}", line.trim_end_matches(';'));
        }
    }
    println!();
    for (pi, p) in peers.iter().enumerate() {
        let (ok, total, first) = &fsck[pi];
        println!(
            "e2fsck -fn after each run, {}: {ok}/{total} clean{}",
            p.name(),
            first
                .as_ref()
                .map_or(String::new(), |f| format!(" (first failure: {f})"))
        );
    }
    if !not_run.is_empty() {
        println!("\nnot measured on ext4kit: {}", not_run.join("; "));
    }
    if !errors.is_empty() {
        println!("\nerrors:");
        for e in &errors {
            println!("- {e}");
        }
    }
    if let Some(p) = &a.csv {
        std::fs::write(p, csv).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let _ = std::fs::remove_dir(&mnt);
    if errors.is_empty() && fsck.iter().all(|f| f.0 == f.1) {
        Ok(())
    } else {
        Err("some runs failed or left an image e2fsck does not accept (see above)".into())
    }
}
