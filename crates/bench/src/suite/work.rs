//! The workloads of `ext4kit bench`: the experiments of the five kernel
//! patches behind the design principles, as those patches ran them, and the
//! standard filesystem workloads, each written twice — against the library's
//! API and against a mount point with ordinary system calls (or the programs
//! a user runs: tar, find, rm, fio) — so that every peer does the same work.
//!
//! Each workload says which peers it applies to and what image it needs;
//! the runner (`suite::run`) makes a fresh copy of that image for every
//! (round, peer).

use ext4kit::{NewInode, OpenRequest};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ext4kit::{Access, Cred, Fs, OpenFlags, Process, RenameFlags, Whence};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::live::{Live, Target};
use super::tree_image::{tree_shape, unpacked_tree};
use super::{Availability, PeerId, Sizes};
use crate::srctree::{tarball, TreeCounts};

pub use super::figure::Figure;

// ---------------------------------------------------------------------
// Metric names the report and charts look up again: one definition.

/// The dd workload's figure (descriptor lookup per write): seconds for
/// `count` one-byte writes.
pub fn dd_metric(count: u64) -> String {
    format!("{count} one-byte writes + close")
}

/// The sequential write's figure (MiB/s).
pub fn seq_write_metric(mib: u64) -> String {
    format!("write {mib} MiB + fsync")
}

/// The cold sequential read's figure (MiB/s).
pub fn seq_read_metric(mib: u64) -> String {
    format!("read {mib} MiB, cold")
}

/// fio's figures (IOPS); `rw` is fio's "randread" or "randwrite".
pub fn fio_metric(rw: &str, secs: u64) -> String {
    format!("{rw} 4k, 2 jobs, {secs} s")
}

/// The untar figure (seconds for `files` files).
pub fn untar_metric(files: usize) -> String {
    format!("untar {files} files")
}

/// The tree's rm -rf figure (seconds).
pub const RM_METRIC: &str = "rm -rf";

/// The create curve (files/s per interval as one directory grows: flat
/// when inserts descend the htree instead of scanning).
pub const CREATE_METRIC: &str = "creates/s in the interval";
/// The FUSE server's resident memory at the end of each create interval:
/// the curve that shows whether it levels off at the cache budget plus a
/// fixed overhead as the directory grows (the mount's memory target).
pub const CREATE_RSS_METRIC: &str = "server RSS at this size (VmRSS)";

/// One workload of the suite.
pub struct Workload {
    /// The `--only` name.
    pub name: &'static str,
    /// Which of the five kernel patches behind the design principles this
    /// workload reproduces the experiment of ("000".."004", the `seeds`
    /// group of `--only`; docs/history.md lists them); `None`: a standard
    /// workload.
    pub seed: Option<&'static str>,
    /// Title line of its table.
    pub title: &'static str,
    /// What it does, for `--help` and the report.
    pub about: &'static str,
    /// What the x column means for curves (threads, directory size...).
    pub x_label: &'static str,
    /// The peers it runs on.
    pub peers: &'static [PeerId],
    /// The measurement: figures of one round on one peer.
    pub run: fn(&mut Live, &Sizes) -> Result<Vec<Figure>, String>,
    image: fn(&Sizes, PeerId) -> ImageSpec,
}

const ALL4: &[PeerId] = &[PeerId::Lib, PeerId::Mount, PeerId::Fuse2fs, PeerId::Kernel];

/// Every workload, in suite (and report) order.
pub static WORKLOADS: [Workload; 14] = [
    Workload {
        name: "lseek",
        seed: Some("000"),
        title: "lock-free lseek: random SEEK_SET, each thread its own open file of one 128 MiB file",
        about: "N threads, each with its own open file of one 128 MiB file, seek to random offsets \
                (lseek_test). The library also runs a baseline whose seek takes a per-inode lock \
                (the i_mutex that lock-free lseek removes): peer lib:i_mutex.",
        x_label: "threads",
        peers: ALL4,
        run: w_lseek,
        image: seeds_image,
    },
    Workload {
        name: "storm",
        seed: Some("001"),
        title: "lock-free path walk: open/read/close of the same 4 small files by path",
        about: "N threads open, read and close the same four small files by path (AIM7 misc_rtns_1): \
                the path walk and the references on shared dentries and inodes. On the library, \
                the lseek workload's shared-nothing seeks run right after it at each thread count \
                (peer lib:shared-nothing: the yardstick; the target is that the storm scale at \
                least 90% as well), and the writes to shared cache lines an open/read/close makes \
                are counted (ext4kit::vfs::shared).",
        x_label: "threads",
        peers: ALL4,
        run: w_storm,
        image: seeds_image,
    },
    Workload {
        name: "dpath",
        seed: Some("001"),
        title: "d_path under renames: the full path of an open file while another thread renames its grandparent",
        about: "N threads build the full path of an open file (the library's d_path; readlink of \
                /proc/self/fd on a mount) while one more thread renames a directory on that path \
                back and forth: path builders must not exclude each other.",
        x_label: "threads",
        peers: ALL4,
        run: w_dpath,
        image: seeds_image,
    },
    Workload {
        name: "dd",
        seed: Some("002"),
        title: "descriptor lookup without atomics: one-byte writes through a descriptor (dd bs=1)",
        about: "COUNT one-byte write(2)s to a new file (1,048,576 in the full run), then close. The \
                library runs it with an unshared descriptor table (lib) and a shared one \
                (lib:shared-fd-table).",
        x_label: "",
        peers: ALL4,
        run: w_dd,
        image: std_image,
    },
    Workload {
        name: "fsync",
        seed: Some("003"),
        title: "O(dirty) fsync: 2 KiB write + fsync / fdatasync into a file of N cached 2 KiB blocks",
        about: "On a 2 KiB-block image, files of 5,000 and 50,000 blocks written and read once (all \
                cached), then 1,000 x (2 KiB write at a random block + fsync), and + fdatasync, \
                interleaved over the file sizes: the sync must cost what is dirty, not what is cached.",
        x_label: "file blocks",
        peers: ALL4,
        run: w_fsync,
        image: fsync_image,
    },
    Workload {
        name: "create",
        seed: Some("004"),
        title: "htree inserts: creates in one directory as it grows, then stat and unlink of every name",
        about: "Empty files created in one directory, files/s per interval of its size (10k steps to \
                50k, then to 1,000,000), then every name stat'ed and unlinked. Linear directories \
                (kernel ext2 without dir_index, and fuse2fs, which never indexes a new directory) \
                stop at the linear maximum: their creates are O(n).",
        x_label: "files in the directory",
        peers: &[
            PeerId::Lib,
            PeerId::Mount,
            PeerId::Fuse2fs,
            PeerId::Kernel,
            PeerId::Ext2,
        ],
        run: w_create,
        image: create_image,
    },
    Workload {
        name: "lookup",
        seed: Some("004"),
        title: "htree lookups: one name looked up in a big directory, htree and linear",
        about: "Directories of 1,000 / 10,000 / 50,000 names, indexed (htree) and linear (made \
                before the image had dir_index): the median time of one lookup of a name not \
                looked up before (a dentry-cache miss; directory blocks cached by one readdir). \
                The library's directory blocks read per lookup are shown too (htree-lookup).",
        x_label: "names in the directory",
        peers: ALL4,
        run: w_lookup,
        image: lookup_image,
    },
    Workload {
        name: "seq",
        seed: None,
        title: "sequential write (1 MiB writes + fsync) and cold sequential read",
        about: "One file written in 1 MiB writes and fsync'd (1 GiB in the full run), then read back \
                in 1 MiB reads after every cache was dropped.",
        x_label: "",
        peers: ALL4,
        run: w_seq,
        image: std_image,
    },
    Workload {
        name: "fio",
        seed: None,
        title: "random 4 KiB reads, then writes, 2 jobs, on a file just written",
        about: "fio randread and randwrite, bs=4k, psync, buffered, 2 jobs on one file, time-based. \
                The library runs the same pattern in-process (2 threads of pread/pwrite).",
        x_label: "",
        peers: ALL4,
        run: w_fio,
        image: std_image,
    },
    Workload {
        name: "tree",
        seed: None,
        title: "untar of a source-like tree, find over it (cold, warm), read it all, rm -rf of it",
        about: "A generated source-like tree (2,000 directories, 30,000 files of 64 B-32 KiB, \
                symlinks) untarred (and made durable: syncfs, or unmount for a FUSE server), listed \
                with find on a cold mount and again warm, every file read, removed with rm -rf. \
                The library writes, walks, reads and removes the same tree through its API (no \
                tar: the same names, sizes and bytes).",
        x_label: "",
        peers: ALL4,
        run: w_tree,
        image: std_image,
    },
    Workload {
        name: "build",
        seed: None,
        title: "an image built from a source tree, and from a tar of it, against mke2fs -d",
        about: "The tree workload's source tree (unpacked on the host once) made into a fresh ext4 \
                image: `ext4kit mkfs -d TREE` (peer lib), `ext4kit mkfs -d TREE.tar` (lib:from tar) \
                and `mke2fs -d TREE` (lib:mke2fs -d), the three in turn each round, 4 KiB blocks, \
                same size. Seconds from start to exit: the whole build, written out.",
        x_label: "",
        peers: &[PeerId::Lib],
        run: w_build,
        image: std_image,
    },
    Workload {
        name: "formats",
        seed: None,
        title: "the tree image copied out through qcow2 against raw, and read remotely over HTTP",
        about: "The build workload's image (ext4kit mkfs -d of the tree) converted to an \
                uncompressed qcow2 by qemu-img: `ext4kit get` of the whole tree from the raw \
                file (peer lib) and from the qcow2 (lib:qcow2), page cache dropped before each. \
                Then the qcow2 served by nginx on 127.0.0.1 and opened by URL through the \
                library: for a walk of every name and inode (ls -lR) and for the largest file \
                read whole, the bytes fetched ÷ the bytes the filesystem read, and the requests. \
                Needs qemu-img and nginx.",
        x_label: "",
        peers: &[PeerId::Lib],
        run: super::formats::w_formats,
        image: std_image,
    },
    Workload {
        name: "pcreate",
        seed: None,
        title: "parallel creates, each thread in a directory of its own",
        about: "N threads each create empty files in a directory of their own: the shared \
                allocators, journal and caches, without the one-directory lock.",
        x_label: "threads",
        peers: ALL4,
        run: w_pcreate,
        image: std_image,
    },
    Workload {
        name: "fsmall",
        seed: None,
        title: "fsync-heavy small files (fs_mark -S1): create + 4 KiB write + fsync + close",
        about: "N threads each create, write 4 KiB, fsync and close small files in a directory of \
                their own: files/s, the median fsync, and for the library the journal commits per \
                fsync (group commit lets concurrent fsyncs share one).",
        x_label: "threads",
        peers: ALL4,
        run: w_fsmall,
        image: std_image,
    },
];

impl Workload {
    /// Why this workload does not run on `p` even though `p` can run here.
    pub fn skip_reason(&self, p: PeerId, avail: &Availability) -> Option<String> {
        if self.name == "fio" && p != PeerId::Lib {
            return avail.fio.clone();
        }
        None
    }

    /// A fresh image for one round on `p`: a copy of the workload's
    /// template (made once per work directory and sizes).
    pub fn image(&self, p: PeerId, s: &Sizes, work: &Path) -> Result<PathBuf, String> {
        let spec = (self.image)(s, p);
        let template = spec.template(work, s)?;
        let img = work.join(format!("run-{}-{}.img", self.name, p.name()));
        crate::run(Command::new("cp").arg("--sparse=always").arg(&template).arg(&img))?;
        Ok(img)
    }
}

/// A step in making a template: on the source directory (before mke2fs
/// -d) or on the made image.
type ImageStep = fn(&Path, &Sizes) -> Result<(), String>;

/// How to make a workload's template image.
struct ImageSpec {
    key: &'static str,
    fstype: &'static str,
    block: u32,
    size_mib: u64,
    inodes: u64,
    no_dir_index: bool,
    populate: Option<ImageStep>,
    /// Run on the made image (through the library) before it is a template.
    finish: Option<ImageStep>,
}

impl ImageSpec {
    fn template(&self, work: &Path, s: &Sizes) -> Result<PathBuf, String> {
        let img = work.join(format!(
            "template-{}-{}-{}b-{}m-{}i.img",
            self.key, self.fstype, self.block, self.size_mib, self.inodes
        ));
        if img.exists() {
            return Ok(img);
        }
        let tmp = img.with_extension("tmp");
        let mut cmd = Command::new("mke2fs");
        cmd.args(["-q", "-F", "-t", self.fstype, "-b", &self.block.to_string()])
            .args(["-N", &self.inodes.to_string(), "-m", "0"])
            .args(["-U", "e4b1e4b1-0000-4000-8000-000000000004"])
            .args([
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0,hash_seed=e4b1e4b1-0000-4000-8000-000000000005",
            ]);
        if self.no_dir_index {
            cmd.args(["-O", "^dir_index"]);
        }
        let src = work.join(format!("src-{}", self.key));
        if let Some(populate) = self.populate {
            let _ = std::fs::remove_dir_all(&src);
            std::fs::create_dir_all(&src).map_err(|e| format!("{}: {e}", src.display()))?;
            populate(&src, s)?;
            cmd.arg("-d").arg(&src);
        }
        cmd.arg(&tmp).arg(format!("{}M", self.size_mib));
        let r = crate::run(&mut cmd);
        let _ = std::fs::remove_dir_all(&src);
        r?;
        if let Some(finish) = self.finish {
            finish(&tmp, s)?;
        }
        std::fs::rename(&tmp, &img).map_err(|e| format!("{}: {e}", img.display()))?;
        Ok(img)
    }
}

/// The image of the lseek, storm and dpath workloads: a 128 MiB file
/// (sparse: seeks read no data), four small files, and a deep path for
/// d_path.
fn seeds_image(_: &Sizes, _: PeerId) -> ImageSpec {
    fn populate(src: &Path, _: &Sizes) -> Result<(), String> {
        let e = |e: std::io::Error| format!("{}: {e}", src.display());
        let big = std::fs::File::create(src.join("big")).map_err(e)?;
        big.set_len(128 << 20).map_err(e)?;
        std::fs::create_dir_all(src.join("etc")).map_err(e)?;
        for i in 0..4 {
            std::fs::write(src.join("etc").join(format!("small{i}")), vec![b'x'; 600]).map_err(e)?;
        }
        std::fs::create_dir_all(src.join("a/b/c/d")).map_err(e)?;
        std::fs::write(src.join("a/b/c/d/file"), b"d_path\n").map_err(e)?;
        Ok(())
    }
    ImageSpec {
        key: "seeds",
        fstype: "ext4",
        block: 4096,
        size_mib: 256,
        inodes: 16_384,
        no_dir_index: false,
        populate: Some(populate),
        finish: None,
    }
}

fn lookup_name(i: usize) -> String {
    format!("file-{i:07}-{}", i.wrapping_mul(2_654_435_761) % 100_000)
}

/// The lookup image: `/linear/dN` and `/htree/dN`, N names each, both made
/// by the library: the linear ones while the image has no dir_index (so
/// they are never indexed), the htree ones after `tune2fs -O dir_index`
/// (indexed as they grow). (mke2fs -d would make linear directories too,
/// but its inserts scan the directory: minutes for 50,000 names.)
fn lookup_image(s: &Sizes, _: PeerId) -> ImageSpec {
    fn fill_dirs(img: &Path, s: &Sizes, kind: &str) -> Result<(), String> {
        let fs = Fs::open_image(
            img,
            &ext4kit::OpenOptions {
                read_only: false,
                ..Default::default()
            },
        )
        .map_err(io("open the lookup image"))?;
        let cred = root();
        fs.create(&NewInode::dir(format!("/{kind}").as_bytes()).mode(0o755).cred(&cred))
            .map_err(io("mkdir"))?;
        for &n in &s.lookup_sizes {
            let d = format!("/{kind}/d{n}");
            fs.create(&NewInode::dir(d.as_bytes()).mode(0o755).cred(&cred))
                .map_err(io("mkdir"))?;
            for i in 0..n {
                fs.create(
                    &NewInode::file(format!("{d}/{}", lookup_name(i)).as_bytes())
                        .mode(0o644)
                        .owner(0, 0),
                )
                .map_err(io("create"))?;
            }
        }
        fs.sync().map_err(io("sync"))
    }
    fn finish(img: &Path, s: &Sizes) -> Result<(), String> {
        fill_dirs(img, s, "linear")?;
        crate::run(Command::new("tune2fs").args(["-O", "dir_index"]).arg(img))?;
        fill_dirs(img, s, "htree")
    }
    let names: usize = s.lookup_sizes.iter().sum();
    ImageSpec {
        key: "lookup-lib",
        fstype: "ext4",
        block: 4096,
        size_mib: 64 + ((names as u64 * 2 * 300) >> 20),
        inodes: (names * 2 + 1_000) as u64,
        no_dir_index: true,
        populate: None,
        finish: Some(finish),
    }
}

/// The standard workloads' image: ext4, 4 KiB blocks, room for the
/// sequential file, fio's file, the tree and the parallel creates.
fn std_image(s: &Sizes, _: PeerId) -> ImageSpec {
    let files = s.tree_files + s.tree_dirs + s.pcreate_files * s.pcreate_threads.iter().sum::<usize>();
    let fsmall = s.fsmall_files * s.fsmall_threads.iter().sum::<usize>();
    ImageSpec {
        key: "std",
        fstype: "ext4",
        block: 4096,
        size_mib: s.seq_mib.max(s.fio_mib) + (s.tree_files as u64 * 16 / 1024) + 1024,
        inodes: (files + fsmall + 20_000).max(65_536) as u64,
        no_dir_index: false,
        populate: None,
        finish: None,
    }
}

/// The fsync workload's image: 2 KiB blocks, as in the experiment of the
/// fsync patch it reproduces.
fn fsync_image(s: &Sizes, _: PeerId) -> ImageSpec {
    let total: u64 = s.fsync_blocks.iter().sum::<u64>() * FSYNC_BS;
    ImageSpec {
        key: "fsync",
        fstype: "ext4",
        block: FSYNC_BS as u32,
        size_mib: (total >> 20) * 2 + 128,
        inodes: 16_384,
        no_dir_index: false,
        populate: None,
        finish: None,
    }
}

/// The create workload's image: 4 KiB blocks (with 1 KiB blocks a two-level
/// htree is full near 250,000 names without large_dir, for the kernel too),
/// inodes for every file; ext2 without dir_index for the linear peer.
fn create_image(s: &Sizes, p: PeerId) -> ImageSpec {
    let files = create_max(s, p);
    let ext2 = p == PeerId::Ext2;
    ImageSpec {
        key: if ext2 { "create-linear" } else { "create" },
        fstype: if ext2 { "ext2" } else { "ext4" },
        block: 4096,
        size_mib: files * 320 / (1 << 20) + 512,
        inodes: files + 10_000,
        no_dir_index: ext2,
        populate: None,
        finish: None,
    }
}

// ---------------------------------------------------------------------
// helpers

fn fig(metric: impl Into<String>, unit: &'static str, higher_better: bool, x: Option<f64>, value: f64) -> Figure {
    Figure {
        metric: metric.into(),
        unit,
        higher_better,
        x,
        variant: None,
        value,
    }
}

fn io<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Run `f(thread_index)` on `n` threads at once; the wall time of all.
fn par<T: Send>(n: usize, f: impl Fn(usize) -> Result<T, String> + Sync) -> Result<(Vec<T>, Duration), String> {
    let t = Instant::now();
    let out = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let f = &f;
                s.spawn(move || f(i))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker thread panicked".into())))
            .collect::<Result<Vec<T>, String>>()
    })?;
    Ok((out, t.elapsed()))
}

fn root() -> Cred {
    Cred::root()
}

fn wflags(create: bool) -> OpenFlags {
    OpenFlags {
        access: Access::WriteOnly,
        create,
        trunc: create,
        ..Default::default()
    }
}

fn rwflags() -> OpenFlags {
    OpenFlags {
        access: Access::ReadWrite,
        ..Default::default()
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// 1 MiB of pseudo-random bytes (incompressible, never all zero).
fn random_mib(seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; 1 << 20];
    ext4kit_testkit::TestRng::new(seed).fill(&mut v);
    v
}

// ---------------------------------------------------------------------
// lseek: a lock-free position

const SEEK_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

fn w_lseek(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let mut out = Vec::new();
    let ops = s.lseek_ops;
    let span = 128i64 << 20;
    for &n in &s.threads {
        let x = Some(n as f64);
        let metric = "seeks/s, all threads";
        match l.target()? {
            Target::Lib(fs) => {
                let files = (0..n)
                    .map(|_| fs.open(b"/big", OpenFlags::default()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(io("open /big"))?;
                let (_, d) = par(n, |i| {
                    let mut r = SmallRng::seed_from_u64(SEEK_SEED ^ i as u64);
                    for _ in 0..ops {
                        let off = r.random_range(0..span);
                        std::hint::black_box(fs.lseek(&files[i], off, Whence::Set).map_err(io("lseek"))?);
                    }
                    Ok(())
                })?;
                out.push(fig(metric, "M/s", true, x, (ops * n) as f64 / d.as_secs_f64() / 1e6));
                // The baseline: the same seek behind one lock per inode.
                let inode_lock = Mutex::new(());
                let (_, d) = par(n, |i| {
                    let mut r = SmallRng::seed_from_u64(SEEK_SEED ^ i as u64);
                    for _ in 0..ops {
                        let off = r.random_range(0..span);
                        let _g = inode_lock.lock().unwrap_or_else(|p| p.into_inner());
                        std::hint::black_box(fs.lseek(&files[i], off, Whence::Set).map_err(io("lseek"))?);
                    }
                    Ok(())
                })?;
                let mut f = fig(metric, "M/s", true, x, (ops * n) as f64 / d.as_secs_f64() / 1e6);
                f.variant = Some("i_mutex");
                out.push(f);
            }
            Target::Dir(dir) => {
                let files = (0..n)
                    .map(|_| std::fs::File::open(dir.join("big")))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(io("open big"))?;
                let (_, d) = par(n, |i| {
                    use std::io::Seek;
                    let mut f = &files[i];
                    let mut r = SmallRng::seed_from_u64(SEEK_SEED ^ i as u64);
                    for _ in 0..ops {
                        let off = r.random_range(0..span as u64);
                        std::hint::black_box(f.seek(std::io::SeekFrom::Start(off)).map_err(io("lseek"))?);
                    }
                    Ok(())
                })?;
                out.push(fig(metric, "M/s", true, x, (ops * n) as f64 / d.as_secs_f64() / 1e6));
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------
// storm and dpath: lock-free path walk, dentry references and d_path

/// The storm's loop on the library: `ops` open/read/close of the four
/// small files by path per thread, each thread with its own descriptor
/// table.
fn lib_storm(fs: &Arc<Fs>, n: usize, ops: usize) -> Result<Duration, String> {
    Ok(par(n, |i| {
        let mut p = Process::new(fs.clone());
        let mut buf = [0u8; 1024];
        for k in 0..ops {
            let path = format!("/etc/small{}", (k + i) % 4);
            let fd = p.open(path.as_bytes(), OpenFlags::default()).map_err(io("open"))?;
            let got = p.read(fd, &mut buf).map_err(io("read"))?;
            p.close(fd).map_err(io("close"))?;
            if got != 600 {
                return Err(format!("{path}: read {got} bytes, not 600"));
            }
        }
        Ok(())
    })?
    .1)
}

/// The lseek workload's loop, the storm's yardstick: `ops` random SEEK_SETs per
/// thread, each thread on its own open file of `/big` — work that shares
/// nothing, so its scaling is what this machine gives work that shares
/// nothing at the moment it is measured.
fn lib_seeks(fs: &Fs, files: &[Arc<ext4kit::File>], ops: usize) -> Result<Duration, String> {
    Ok(par(files.len(), |i| {
        let mut r = SmallRng::seed_from_u64(SEEK_SEED ^ i as u64);
        for _ in 0..ops {
            let off = r.random_range(0..128i64 << 20);
            std::hint::black_box(fs.lseek(&files[i], off, Whence::Set).map_err(io("lseek"))?);
        }
        Ok(())
    })?
    .1)
}

/// Writes to shared cache lines one open/read/close of the storm costs
/// on this thread in steady state, as the library counts them
/// (`ext4kit::vfs::shared`; this crate builds it with `count-shared`).
/// `None` when the count is not compiled in.
fn shared_writes_per_open(fs: &Arc<Fs>) -> Result<Option<f64>, String> {
    let mut p = Process::new(fs.clone());
    let mut buf = [0u8; 1024];
    let mut once = |k: usize| -> Result<(), String> {
        let fd = p
            .open(&format!("/etc/small{}", k % 4), OpenFlags::default())
            .map_err(io("open"))?;
        p.read(fd, &mut buf).map_err(io("read"))?;
        p.close(fd).map_err(io("close"))
    };
    // Warm: the caches filled and this thread's pins made.
    for k in 0..16 {
        once(k)?;
    }
    let Some(before) = ext4kit::vfs::shared::count() else {
        return Ok(None);
    };
    let n = 10_000;
    for k in 0..n {
        once(k)?;
    }
    Ok(ext4kit::vfs::shared::count().map(|after| (after - before) as f64 / n as f64))
}

/// Metric of the storm's yardstick (peer `lib:shared-nothing`).
pub const STORM_YARDSTICK: &str = "shared-nothing SEEK_SETs beside it, all threads";
/// Metric of the storm's counted shared writes.
pub const STORM_SHARED: &str = "shared-line writes per open/read/close (counted)";

fn w_storm(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let ops = s.storm_ops;
    let dir = match l.target()? {
        Target::Lib(fs) => return lib_w_storm(fs, s),
        Target::Dir(dir) => dir,
    };
    let paths: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("etc/small{i}"))).collect();
    let mut out = Vec::new();
    for &n in &s.threads {
        let d = par(n, |i| {
            let mut buf = [0u8; 1024];
            for k in 0..ops {
                let mut f = std::fs::File::open(&paths[(k + i) % 4]).map_err(io("open"))?;
                std::hint::black_box(f.read(&mut buf).map_err(io("read"))?);
            }
            Ok(())
        })?
        .1;
        out.push(fig(
            "open/read/close, all threads",
            "k ops/s",
            true,
            Some(n as f64),
            (ops * n) as f64 / d.as_secs_f64() / 1e3,
        ));
    }
    Ok(out)
}

/// The storm on the library, with its yardstick and its shared writes.
/// The target: the storm must scale as well as work that shares nothing
/// on the same machine. The yardstick (the lseek workload's seeks, peer
/// `lib:shared-nothing`) runs right after the storm at every thread
/// count, in the same round and for as long, so a machine busier in one
/// round than in another moves both.
fn lib_w_storm(fs: &Arc<Fs>, s: &Sizes) -> Result<Vec<Figure>, String> {
    let mut out = Vec::new();
    let ops = s.storm_ops;
    let max = s.threads.iter().copied().max().unwrap_or(1);
    let files = (0..max)
        .map(|_| fs.open(b"/big", OpenFlags::default()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io("open /big"))?;
    // Warm both (caches, the threads' pins, CPU frequency), and size the
    // yardstick so that its single-thread run lasts as long as the
    // storm's (the fastest of three warm-ups each: a run the scheduler
    // stalled would misjudge the cost per operation). A much shorter run
    // would measure thread start-up and the scheduler, not the work.
    let (w_storm, w_seeks) = (ops / 10 + 1, s.lseek_ops / 10 + 1);
    let mut t_storm = f64::INFINITY;
    let mut t_seeks = f64::INFINITY;
    for _ in 0..3 {
        t_storm = t_storm.min(lib_storm(fs, 1, w_storm)?.as_secs_f64() / w_storm as f64);
        t_seeks = t_seeks.min(lib_seeks(fs, &files[..1], w_seeks)?.as_secs_f64() / w_seeks as f64);
    }
    let seeks = ((ops as f64 * t_storm / t_seeks.max(1e-12)) as usize).clamp(1000, 1 << 30);
    for &n in &s.threads {
        let x = Some(n as f64);
        let d = lib_storm(fs, n, ops)?;
        out.push(fig(
            "open/read/close, all threads",
            "k ops/s",
            true,
            x,
            (ops * n) as f64 / d.as_secs_f64() / 1e3,
        ));
        let d = lib_seeks(fs, &files[..n], seeks)?;
        let mut f = fig(
            STORM_YARDSTICK,
            "M/s",
            true,
            x,
            (seeks * n) as f64 / d.as_secs_f64() / 1e6,
        );
        f.variant = Some("shared-nothing");
        out.push(f);
    }
    if let Some(w) = shared_writes_per_open(fs)? {
        out.push(fig(STORM_SHARED, "writes", false, None, w));
    }
    for f in files {
        fs.close_file(f).map_err(io("close /big"))?;
    }
    Ok(out)
}

/// Let the renamer get going before the readers start (at most a second:
/// a renamer that failed has set `stop`), so every reader runs against
/// renames, even in a short run.
fn wait_for_renames(renames: &AtomicU64, stop: &AtomicBool) {
    let t = Instant::now();
    while renames.load(Ordering::Relaxed) < 2 && !stop.load(Ordering::Relaxed) && t.elapsed() < Duration::from_secs(1) {
        std::thread::yield_now();
    }
}

fn w_dpath(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let mut out = Vec::new();
    let ops = s.dpath_ops;
    for &n in &s.threads {
        let stop = AtomicBool::new(false);
        let renames = AtomicU64::new(0);
        let t = Instant::now();
        let (d, renamed) = match l.target()? {
            Target::Lib(fs) => {
                let dentry = fs
                    .resolve(ext4kit::Target::path(b"/a/b/c/d/file").nofollow())
                    .map_err(io("resolve"))?;
                std::thread::scope(|sc| {
                    let renamer = sc.spawn(|| -> Result<(), String> {
                        let cred = root();
                        while !stop.load(Ordering::Relaxed) {
                            fs.rename(b"/a/b", b"/a/x", RenameFlags::default(), &cred)
                                .map_err(io("rename"))?;
                            fs.rename(b"/a/x", b"/a/b", RenameFlags::default(), &cred)
                                .map_err(io("rename"))?;
                            renames.fetch_add(2, Ordering::Relaxed);
                        }
                        Ok(())
                    });
                    wait_for_renames(&renames, &stop);
                    let r = par(n, |_| {
                        for _ in 0..ops {
                            let p = fs.d_path(&dentry);
                            if !p.ends_with(b"/c/d/file") {
                                return Err(format!("d_path gave {:?}", String::from_utf8_lossy(&p)));
                            }
                        }
                        Ok(())
                    });
                    stop.store(true, Ordering::Relaxed);
                    let rr = renamer.join().unwrap_or_else(|_| Err("the renamer panicked".into()));
                    let (_, d) = r?;
                    rr?;
                    Ok::<_, String>((d, renames.load(Ordering::Relaxed)))
                })?
            }
            Target::Dir(dir) => {
                let f = std::fs::File::open(dir.join("a/b/c/d/file")).map_err(io("open"))?;
                let link = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f)));
                let (b, x) = (dir.join("a/b"), dir.join("a/x"));
                std::thread::scope(|sc| {
                    let renamer = sc.spawn(|| -> Result<(), String> {
                        while !stop.load(Ordering::Relaxed) {
                            std::fs::rename(&b, &x).map_err(io("rename"))?;
                            std::fs::rename(&x, &b).map_err(io("rename"))?;
                            renames.fetch_add(2, Ordering::Relaxed);
                        }
                        Ok(())
                    });
                    wait_for_renames(&renames, &stop);
                    let r = par(n, |_| {
                        for _ in 0..ops {
                            let p = std::fs::read_link(&link).map_err(io("readlink"))?;
                            if !p.ends_with("c/d/file") {
                                return Err(format!("/proc/self/fd gave {}", p.display()));
                            }
                        }
                        Ok(())
                    });
                    stop.store(true, Ordering::Relaxed);
                    let rr = renamer.join().unwrap_or_else(|_| Err("the renamer panicked".into()));
                    let (_, d) = r?;
                    rr?;
                    Ok::<_, String>((d, renames.load(Ordering::Relaxed)))
                })?
            }
        };
        let x = Some(n as f64);
        out.push(fig(
            "d_path, all threads (one more renaming)",
            "k calls/s",
            true,
            x,
            (ops * n) as f64 / d.as_secs_f64() / 1e3,
        ));
        out.push(fig(
            "renames meanwhile",
            "renames/s",
            true,
            x,
            renamed as f64 / t.elapsed().as_secs_f64(),
        ));
    }
    Ok(out)
}

// ---------------------------------------------------------------------
// dd: descriptor lookup without atomics

fn w_dd(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let count = s.dd_count;
    let metric = dd_metric(count);
    let mut out = Vec::new();
    match l.target()? {
        Target::Lib(fs) => {
            for shared in [false, true] {
                let name = if shared { "/dd-shared" } else { "/dd" };
                let mut p = Process::new(fs.clone());
                let _other = shared.then(|| p.share());
                let t = Instant::now();
                let fd = p
                    .open_as(name, &OpenRequest::new(wflags(true)).mode(0o644).cred(&root()))
                    .map_err(io("open"))?;
                for _ in 0..count {
                    if p.write(fd, &[0]).map_err(io("write"))? != 1 {
                        return Err("dd: a one-byte write wrote nothing".into());
                    }
                }
                p.close(fd).map_err(io("close"))?;
                let secs = t.elapsed().as_secs_f64();
                let size = fs.stat(name.as_bytes()).map_err(io("stat"))?.size;
                if size != count {
                    return Err(format!("dd: {name} has {size} bytes, wrote {count}"));
                }
                let mut f = fig(metric.clone(), "s", false, None, secs);
                f.variant = shared.then_some("shared-fd-table");
                out.push(f);
            }
        }
        Target::Dir(dir) => {
            let path = dir.join("dd.out");
            let t = Instant::now();
            let mut f = std::fs::File::create(&path).map_err(io("create"))?;
            for _ in 0..count {
                if f.write(&[0]).map_err(io("write"))? != 1 {
                    return Err("dd: a one-byte write wrote nothing".into());
                }
            }
            drop(f);
            let secs = t.elapsed().as_secs_f64();
            let size = std::fs::metadata(&path).map_err(io("stat"))?.len();
            if size != count {
                return Err(format!("dd: the file has {size} bytes, wrote {count}"));
            }
            out.push(fig(metric, "s", false, None, secs));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------
// fsync: O(dirty) fsync and a real fdatasync

const FSYNC_BS: u64 = 2048;

fn fill(blocks: u64) -> Vec<u8> {
    (0..blocks * FSYNC_BS)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(1))
        .collect()
}

fn w_fsync(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let rounds = 10.min(s.fsync_ops.max(1));
    let per_round = s.fsync_ops.div_ceil(rounds);
    let block = vec![0x5Au8; FSYNC_BS as usize];
    let nsz = s.fsync_blocks.len();
    // per_op[size * 2 + kind]: kind 0 fsync, 1 fdatasync. Each round runs
    // a slice of both kinds on every size, so the VM's flush-latency
    // bursts hit all four series alike.
    let mut per_op: Vec<Vec<f64>> = vec![Vec::new(); nsz * 2];
    let mut inode_writes = vec![0u64; nsz];
    let mut rng = ext4kit_testkit::TestRng::new(0x2545_F491_4F6C_DD1D);
    match l.target()? {
        Target::Lib(fs) => {
            let mut files = Vec::new();
            for &n in &s.fsync_blocks {
                let path = format!("/f{n}");
                let f = fs
                    .open_as(
                        path.as_bytes(),
                        &OpenRequest::new(OpenFlags::from_bits(0o100 | 2))
                            .mode(0o644)
                            .cred(&root()),
                    )
                    .map_err(io("create"))?;
                let data = fill(n);
                for c in data.chunks(1 << 20) {
                    fs.write(&f, c).map_err(io("write"))?;
                }
                fs.fsync(&f).map_err(io("fsync"))?;
                let mut back = vec![0u8; data.len()];
                fs.pread(&f, 0, &mut back).map_err(io("read"))?;
                if back != data {
                    return Err(format!("{path}: read back differs"));
                }
                files.push(f);
            }
            for _ in 0..rounds {
                for (i, &n) in s.fsync_blocks.iter().enumerate() {
                    for data_only in [false, true] {
                        let w0 = fs.stats().inode_writes;
                        for _ in 0..per_round {
                            let off = rng.below(n) * FSYNC_BS;
                            let t = Instant::now();
                            fs.pwrite(&files[i], off, &block).map_err(io("pwrite"))?;
                            if data_only {
                                fs.fdatasync(&files[i]).map_err(io("fdatasync"))?;
                            } else {
                                fs.fsync(&files[i]).map_err(io("fsync"))?;
                            }
                            per_op[i * 2 + usize::from(data_only)].push(t.elapsed().as_secs_f64() * 1e6);
                        }
                        if data_only {
                            inode_writes[i] += fs.stats().inode_writes - w0;
                        }
                    }
                }
            }
        }
        Target::Dir(dir) => {
            let mut files = Vec::new();
            for &n in &s.fsync_blocks {
                let p = dir.join(format!("f{n}"));
                std::fs::write(&p, fill(n)).map_err(io("write"))?;
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&p)
                    .map_err(io("open"))?;
                f.sync_all().map_err(io("fsync"))?;
                let mut sink = Vec::new();
                (&f).read_to_end(&mut sink).map_err(io("read"))?;
                if sink.len() as u64 != n * FSYNC_BS {
                    return Err(format!("fsync: read back {} bytes of {}", sink.len(), n * FSYNC_BS));
                }
                files.push(f);
            }
            for _ in 0..rounds {
                for (i, &n) in s.fsync_blocks.iter().enumerate() {
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
                            per_op[i * 2 + usize::from(data_only)].push(t.elapsed().as_secs_f64() * 1e6);
                        }
                    }
                }
            }
        }
    }
    let lib = l.peer() == PeerId::Lib;
    let mut out = Vec::new();
    for (i, &n) in s.fsync_blocks.iter().enumerate() {
        let x = Some(n as f64);
        out.push(fig(
            "2 KiB write + fsync",
            "µs/op",
            false,
            x,
            median(&mut per_op[i * 2]),
        ));
        out.push(fig(
            "2 KiB write + fdatasync",
            "µs/op",
            false,
            x,
            median(&mut per_op[i * 2 + 1]),
        ));
        if lib {
            let ops = (per_round * rounds) as f64;
            out.push(fig(
                "inode records written per fdatasync",
                "per op",
                false,
                x,
                inode_writes[i] as f64 / ops,
            ));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------
// create and lookup: htree, no linear directory scans

fn create_max(s: &Sizes, p: PeerId) -> u64 {
    match p {
        PeerId::Ext2 | PeerId::Fuse2fs => s.create_linear_max.min(s.create_max),
        _ => s.create_max,
    }
}

/// Interval ends: 10k steps to 50k, 50k steps to 200k, 200k steps beyond
/// (the seeds-create program's); a small maximum gets four equal steps.
pub fn create_points(max: u64) -> Vec<u64> {
    let mut v = Vec::new();
    if max <= 20_000 {
        let step = max.div_ceil(4).max(1);
        let mut n = 0;
        while n < max {
            n = (n + step).min(max);
            v.push(n);
        }
        return v;
    }
    let mut n = 0;
    while n < max {
        n += if n < 50_000 {
            10_000
        } else if n < 200_000 {
            50_000
        } else {
            200_000
        };
        v.push(n.min(max));
    }
    v
}

fn cname(i: u64) -> String {
    format!("file-{i:08}")
}

fn w_create(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let max = create_max(s, l.peer());
    // The linear peers stop early, on the same interval ends as the others
    // (so every interval has a ratio to the kernel).
    let mut pts: Vec<u64> = create_points(s.create_max).into_iter().filter(|&p| p < max).collect();
    pts.push(max);
    let mut out = Vec::new();
    let mut i = 0u64;
    let (stat_secs, unlink_secs);
    match l.target()? {
        Target::Lib(fs) => {
            fs.create(&NewInode::dir(b"/d").mode(0o755).cred(&root()))
                .map_err(io("mkdir"))?;
            for &p in &pts {
                let t = Instant::now();
                let n = p - i;
                while i < p {
                    fs.create(
                        &NewInode::file(format!("/d/{}", cname(i)).as_bytes())
                            .mode(0o644)
                            .owner(0, 0),
                    )
                    .map_err(|e| format!("create #{i}: {e}"))?;
                    i += 1;
                }
                out.push(fig(
                    CREATE_METRIC,
                    "files/s",
                    true,
                    Some(p as f64),
                    n as f64 / t.elapsed().as_secs_f64(),
                ));
            }
            let t = Instant::now();
            for k in 0..max {
                fs.stat(format!("/d/{}", cname(k)).as_bytes())
                    .map_err(|e| format!("stat #{k}: {e}"))?;
            }
            stat_secs = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let cred = root();
            for k in 0..max {
                fs.unlink(format!("/d/{}", cname(k)).as_bytes(), &cred)
                    .map_err(|e| format!("unlink #{k}: {e}"))?;
            }
            unlink_secs = t.elapsed().as_secs_f64();
        }
        Target::Dir(dir) => {
            let d = dir.join("d");
            std::fs::create_dir(&d).map_err(io("mkdir"))?;
            for &p in &pts {
                let t = Instant::now();
                let n = p - i;
                while i < p {
                    std::fs::File::create(d.join(cname(i))).map_err(|e| format!("create #{i}: {e}"))?;
                    i += 1;
                }
                out.push(fig(
                    CREATE_METRIC,
                    "files/s",
                    true,
                    Some(p as f64),
                    n as f64 / t.elapsed().as_secs_f64(),
                ));
                if let Some(mib) = l.server_rss_mib() {
                    out.push(fig(CREATE_RSS_METRIC, "MiB", false, Some(p as f64), mib));
                }
            }
            let t = Instant::now();
            for k in 0..max {
                std::fs::symlink_metadata(d.join(cname(k))).map_err(|e| format!("stat #{k}: {e}"))?;
            }
            stat_secs = t.elapsed().as_secs_f64();
            let t = Instant::now();
            for k in 0..max {
                std::fs::remove_file(d.join(cname(k))).map_err(|e| format!("unlink #{k}: {e}"))?;
            }
            unlink_secs = t.elapsed().as_secs_f64();
        }
    }
    let x = Some(max as f64);
    out.push(fig("stat of every name", "files/s", true, x, max as f64 / stat_secs));
    out.push(fig(
        "unlink of every name",
        "files/s",
        true,
        x,
        max as f64 / unlink_secs,
    ));
    Ok(out)
}

fn w_lookup(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let mut out = Vec::new();
    for &n in &s.lookup_sizes {
        for kind in ["htree", "linear"] {
            // The linear search is O(n): fewer probes.
            let probes = if kind == "linear" {
                s.lookup_probes.min(500)
            } else {
                s.lookup_probes
            }
            .min(n);
            let mut times = Vec::with_capacity(probes);
            let mut blocks = None;
            match l.target()? {
                Target::Lib(fs) => {
                    let dir = format!("/{kind}/d{n}");
                    // Directory blocks into the cache, no dentries made.
                    fs.read_dir(dir.as_bytes()).map_err(io("readdir"))?;
                    let before = fs.stats().dir_block_reads;
                    for k in 0..probes {
                        let p = format!("{dir}/{}", lookup_name((k * 7919) % n));
                        let t = Instant::now();
                        let d = fs
                            .resolve(ext4kit::Target::path(p.as_bytes()).nofollow())
                            .map_err(io("lookup"))?;
                        times.push(t.elapsed().as_secs_f64() * 1e6);
                        std::hint::black_box(d);
                    }
                    blocks = Some((fs.stats().dir_block_reads - before) as f64 / probes as f64);
                }
                Target::Dir(root) => {
                    let dir = root.join(format!("{kind}/d{n}"));
                    let _ = std::fs::read_dir(&dir).map_err(io("readdir"))?.count();
                    for k in 0..probes {
                        let p = dir.join(lookup_name((k * 7919) % n));
                        let t = Instant::now();
                        let r = std::fs::symlink_metadata(&p);
                        times.push(t.elapsed().as_secs_f64() * 1e6);
                        r.map_err(io("lookup"))?;
                    }
                }
            }
            let x = Some(n as f64);
            out.push(fig(
                format!("lookup, {kind} directory"),
                "µs",
                false,
                x,
                median(&mut times),
            ));
            if let Some(b) = blocks {
                out.push(fig(
                    format!("directory blocks read per lookup, {kind}"),
                    "blocks",
                    false,
                    x,
                    b,
                ));
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------
// sequential

fn w_seq(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let mib = s.seq_mib;
    let mut chunk = random_mib(7);
    // Write, tagging each MiB with its index.
    let wsecs = match l.target()? {
        Target::Lib(fs) => {
            let t = Instant::now();
            let f = fs
                .open_as(b"/seq", &OpenRequest::new(wflags(true)).mode(0o644).cred(&root()))
                .map_err(io("create"))?;
            for i in 0..mib {
                chunk[..8].copy_from_slice(&i.to_le_bytes());
                let mut off = 0;
                while off < chunk.len() {
                    off += fs.write(&f, &chunk[off..]).map_err(io("write"))?;
                }
            }
            fs.fsync(&f).map_err(io("fsync"))?;
            drop(f);
            t.elapsed().as_secs_f64()
        }
        Target::Dir(dir) => write_file(&dir.join("seq"), mib, &mut chunk)?,
    };
    l.cold()?;
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let mut total = 0u64;
    let mut chunks = 0u64;
    let target = l.target()?;
    let lib_file = match &target {
        Target::Lib(fs) => Some(fs.open(b"/seq", OpenFlags::default()).map_err(io("open"))?),
        Target::Dir(_) => None,
    };
    let mut std_file = match &target {
        Target::Dir(dir) => Some(std::fs::File::open(dir.join("seq")).map_err(io("open"))?),
        Target::Lib(_) => None,
    };
    loop {
        let mut got = 0;
        while got < buf.len() {
            let k = match (&target, &lib_file, &mut std_file) {
                (Target::Lib(fs), Some(f), _) => fs.read(f, &mut buf[got..]).map_err(io("read"))?,
                (_, _, Some(f)) => f.read(&mut buf[got..]).map_err(io("read"))?,
                _ => return Err("seq: no file open".into()),
            };
            if k == 0 {
                break;
            }
            got += k;
        }
        if got == 0 {
            break;
        }
        if got == buf.len() && buf[..8] != chunks.to_le_bytes() {
            return Err(format!("seq: MiB {chunks} read back wrong"));
        }
        chunks += 1;
        total += got as u64;
    }
    let rsecs = t.elapsed().as_secs_f64();
    if total != mib << 20 {
        return Err(format!("seq: read {total} bytes of {}", mib << 20));
    }
    Ok(vec![
        fig(seq_write_metric(mib), "MiB/s", true, None, mib as f64 / wsecs),
        fig(seq_read_metric(mib), "MiB/s", true, None, mib as f64 / rsecs),
    ])
}

/// Write `mib` MiB in 1 MiB writes, each tagged with its index, then
/// fsync; seconds.
pub(super) fn write_file(path: &Path, mib: u64, chunk: &mut [u8]) -> Result<f64, String> {
    let t = Instant::now();
    let mut f = std::fs::File::create(path).map_err(io("create"))?;
    for i in 0..mib {
        chunk[..8].copy_from_slice(&i.to_le_bytes());
        f.write_all(chunk).map_err(io("write"))?;
    }
    f.sync_all().map_err(io("fsync"))?;
    Ok(t.elapsed().as_secs_f64())
}

// ---------------------------------------------------------------------
// fio

fn w_fio(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let mut chunk = random_mib(3);
    let (r, w) = match l.target()? {
        Target::Lib(fs) => {
            let f = fs
                .open_as(b"/fio.dat", &OpenRequest::new(wflags(true)).mode(0o644).cred(&root()))
                .map_err(io("create"))?;
            for _ in 0..s.fio_mib {
                let mut off = 0;
                while off < chunk.len() {
                    off += fs.write(&f, &chunk[off..]).map_err(io("write"))?;
                }
            }
            fs.fsync(&f).map_err(io("fsync"))?;
            drop(f);
            (lib_random(fs, s, false)?, lib_random(fs, s, true)?)
        }
        Target::Dir(dir) => {
            let p = dir.join("fio.dat");
            write_file(&p, s.fio_mib, &mut chunk)?;
            (fio(&p, "randread", s)?, fio(&p, "randwrite", s)?)
        }
    };
    Ok(vec![
        fig(fio_metric("randread", s.fio_secs), "IOPS", true, None, r),
        fig(fio_metric("randwrite", s.fio_secs), "IOPS", true, None, w),
    ])
}

/// fio's pattern in-process: 2 threads, each its own open file, random
/// 4 KiB preads (or pwrites) for `fio_secs`; IOPS of both.
fn lib_random(fs: &Arc<Fs>, s: &Sizes, write: bool) -> Result<f64, String> {
    let blocks = (s.fio_mib << 20) / 4096;
    let until = Duration::from_secs(s.fio_secs);
    let (counts, d) = par(2, |i| {
        let f = fs.open(b"/fio.dat", rwflags()).map_err(io("open"))?;
        let mut r = SmallRng::seed_from_u64(0xF10 ^ i as u64);
        let mut buf = vec![0x33u8; 4096];
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed() < until {
            for _ in 0..64 {
                let off = r.random_range(0..blocks) * 4096;
                if write {
                    fs.pwrite(&f, off, &buf).map_err(io("pwrite"))?;
                } else {
                    fs.pread(&f, off, &mut buf).map_err(io("pread"))?;
                }
                n += 1;
            }
        }
        Ok(n)
    })?;
    Ok(counts.iter().sum::<u64>() as f64 / d.as_secs_f64())
}

/// fio's terse (`--minimal`, version 3) output: field 8 is read IOPS,
/// field 49 write IOPS, field 5 the error code (1-based).
fn fio(file: &Path, rw: &str, s: &Sizes) -> Result<f64, String> {
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
        .arg(format!("--size={}M", s.fio_mib))
        .arg(format!("--runtime={}", s.fio_secs))
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

// ---------------------------------------------------------------------
// untar / find / rm

/// The build workload's figure: seconds to build an image from the tree.
pub const BUILD_METRIC: &str = "image built from the tree";

/// `ext4kit mkfs -d` from the tree and from its tar, and `mke2fs -d` from
/// the tree, timed whole, in turn; each image is checked as it is made.
fn w_build(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let work = l.work_dir();
    let (tar, tree, counts) = unpacked_tree(&work, s)?;
    // Every peer starts warm: the round began with the kernel's caches
    // dropped, and whichever builder ran first would read the tree from
    // the disk for the others (4.5 s against 1.4 s here).
    crate::run(Command::new("sh").arg("-c").arg(format!(
        "find '{}' -type f -exec cat {{}} + > /dev/null && cat '{}' > /dev/null",
        tree.display(),
        tar.display()
    )))?;
    let size = format!("{}M", counts.bytes * 3 / (1 << 20) + 256);
    let img = work.join("build.img");
    let bin = l.ext4kit_bin().to_path_buf();
    let mut out = Vec::new();
    let runs: [(Option<&'static str>, Command); 3] = [
        (None, {
            let mut c = Command::new(&bin);
            c.args(["mkfs", "-q", "-b", "4096", "-d"])
                .arg(&tree)
                .arg(&img)
                .arg(&size);
            c
        }),
        (Some("from tar"), {
            let mut c = Command::new(&bin);
            c.args(["mkfs", "-q", "-b", "4096", "-d"])
                .arg(&tar)
                .arg(&img)
                .arg(&size);
            c
        }),
        (Some("mke2fs -d"), {
            let mut c = Command::new("mke2fs");
            c.args(["-q", "-F", "-t", "ext4", "-b", "4096", "-d"])
                .arg(&tree)
                .arg(&img)
                .arg(&size);
            c
        }),
    ];
    for (variant, mut cmd) in runs {
        let _ = std::fs::remove_file(&img);
        // The host's own writeback out of the way: a freshly unpacked tree
        // still dirty makes SEEK_DATA, which both builders use, wait for it.
        crate::run(&mut Command::new("sync"))?;
        let t = Instant::now();
        crate::run(&mut cmd)?;
        let secs = t.elapsed().as_secs_f64();
        let o = Command::new("e2fsck")
            .args(["-fn"])
            .arg(&img)
            .output()
            .map_err(io("e2fsck"))?;
        if !o.status.success() {
            return Err(format!(
                "{} built an image e2fsck finds damaged:\n{}",
                variant.unwrap_or("ext4kit mkfs -d"),
                String::from_utf8_lossy(&o.stdout)
            ));
        }
        out.push(Figure {
            metric: BUILD_METRIC.into(),
            unit: "s",
            higher_better: false,
            x: None,
            variant,
            value: secs,
        });
    }
    let _ = std::fs::remove_file(&img);
    Ok(out)
}

/// The library as a [`crate::srctree::TreeSink`]: the tree's names,
/// sizes and bytes written through the API.
struct LibSink<'a> {
    fs: &'a Arc<Fs>,
    cred: Cred,
}

fn bytes(p: &Path) -> &[u8] {
    std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str())
}

fn eio(e: ext4kit::Error) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl crate::srctree::TreeSink for LibSink<'_> {
    fn mkdir(&mut self, p: &Path) -> std::io::Result<()> {
        self.fs
            .create(&NewInode::dir(bytes(p)).mode(0o755).cred(&self.cred))
            .map(|_| ())
            .map_err(eio)
    }
    fn write(&mut self, p: &Path, data: &[u8]) -> std::io::Result<()> {
        let f = self
            .fs
            .open_as(bytes(p), &OpenRequest::new(wflags(true)).mode(0o644).cred(&self.cred))
            .map_err(eio)?;
        let mut off = 0;
        while off < data.len() {
            off += self.fs.write(&f, &data[off..]).map_err(eio)?;
        }
        Ok(())
    }
    fn symlink(&mut self, target: &str, p: &Path) -> std::io::Result<()> {
        self.fs
            .create(&NewInode::symlink(bytes(p), target.as_bytes()).owner(0, 0))
            .map(|_| ())
            .map_err(eio)
    }
}

/// `find`: every entry below `dir` (the library's readdir; an lstat only
/// where the entry has no type).
fn lib_find(fs: &Fs, dir: &[u8]) -> Result<u64, String> {
    let mut n = 0;
    for e in fs.read_dir(dir).map_err(io("readdir"))? {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        n += 1;
        let mut path = dir.to_vec();
        path.push(b'/');
        path.extend_from_slice(&e.name);
        let is_dir = match e.file_type {
            Some(t) => t == ext4kit::FileType::Directory,
            None => fs.lstat(&path).map_err(io("lstat"))?.ftype == ext4kit::FileType::Directory,
        };
        if is_dir {
            n += lib_find(fs, &path)?;
        }
    }
    Ok(n)
}

/// Read every regular file below `dir` through the library; bytes read.
fn lib_read_all(fs: &Fs, dir: &[u8]) -> Result<u64, String> {
    let mut total = 0;
    let mut buf = vec![0u8; 1 << 20];
    for e in fs.read_dir(dir).map_err(io("readdir"))? {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let mut path = dir.to_vec();
        path.push(b'/');
        path.extend_from_slice(&e.name);
        let ft = match e.file_type {
            Some(t) => t,
            None => fs.lstat(&path).map_err(io("lstat"))?.ftype,
        };
        if ft == ext4kit::FileType::Directory {
            total += lib_read_all(fs, &path)?;
        } else if ft == ext4kit::FileType::Regular {
            let f = fs.open(&path, OpenFlags::default()).map_err(io("open"))?;
            loop {
                let n = fs.read(&f, &mut buf).map_err(io("read"))?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
        }
    }
    Ok(total)
}

/// Read every regular file below `dir` with system calls; bytes read.
fn host_read_all(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    let mut buf = vec![0u8; 1 << 20];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(io("readdir"))? {
            let e = e.map_err(io("readdir"))?;
            let ft = e.file_type().map_err(io("file type"))?;
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                let mut f = std::fs::File::open(e.path()).map_err(io("open"))?;
                loop {
                    let n = f.read(&mut buf).map_err(io("read"))?;
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
            }
        }
    }
    Ok(total)
}

/// `rm -rf`: everything below `dir`, then `dir`.
fn lib_rm(fs: &Fs, dir: &[u8], cred: &Cred) -> Result<(), String> {
    for e in fs.read_dir(dir).map_err(io("readdir"))? {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let mut path = dir.to_vec();
        path.push(b'/');
        path.extend_from_slice(&e.name);
        let is_dir = match e.file_type {
            Some(t) => t == ext4kit::FileType::Directory,
            None => fs.lstat(&path).map_err(io("lstat"))?.ftype == ext4kit::FileType::Directory,
        };
        if is_dir {
            lib_rm(fs, &path, cred)?;
        } else {
            fs.unlink(&path, cred).map_err(io("unlink"))?;
        }
    }
    fs.rmdir(dir, cred).map_err(io("rmdir"))
}

fn w_tree(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let shape = tree_shape(s);
    let (tar, counts): (PathBuf, TreeCounts) = match l.target()? {
        Target::Lib(_) => (PathBuf::new(), crate::srctree::counts(&shape)),
        Target::Dir(_) => tarball(&l.work_dir(), &shape)?,
    };
    let untar = match l.target()? {
        Target::Lib(fs) => {
            let t = Instant::now();
            let mut sink = LibSink { fs, cred: root() };
            crate::srctree::build_tree_into(&mut sink, Path::new("/tree"), &shape).map_err(io("writing the tree"))?;
            t.elapsed().as_secs_f64()
        }
        Target::Dir(dir) => {
            let t = Instant::now();
            crate::run(Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(dir))?;
            t.elapsed().as_secs_f64()
        }
    };
    let untar_sync = untar + l.settle()?;
    l.cold()?;
    let want = counts.find_lines();
    let find = match l.target()? {
        Target::Lib(fs) => {
            let t = Instant::now();
            let n = 1 + lib_find(fs, b"/tree")?;
            let secs = t.elapsed().as_secs_f64();
            if n != want {
                return Err(format!("find listed {n} entries, the tree has {want}"));
            }
            secs
        }
        Target::Dir(dir) => {
            let t = Instant::now();
            let o = Command::new("find")
                .arg(dir.join("tree"))
                .stdin(Stdio::null())
                .output()
                .map_err(io("find"))?;
            let secs = t.elapsed().as_secs_f64();
            let lines = o.stdout.iter().filter(|&&b| b == b'\n').count() as u64;
            if !o.status.success() || lines != want {
                return Err(format!(
                    "find listed {lines} entries, the tree has {want} ({})",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            secs
        }
    };
    // Warm: the same walk again, then every file read (fuse-read's walk
    // and cat).
    let find_warm = match l.target()? {
        Target::Lib(fs) => {
            let t = Instant::now();
            lib_find(fs, b"/tree")?;
            t.elapsed().as_secs_f64()
        }
        Target::Dir(dir) => {
            let t = Instant::now();
            crate::run(Command::new("find").arg(dir.join("tree")).stdout(Stdio::null()))?;
            t.elapsed().as_secs_f64()
        }
    };
    let t = Instant::now();
    let read = match l.target()? {
        Target::Lib(fs) => lib_read_all(fs, b"/tree")?,
        Target::Dir(dir) => host_read_all(&dir.join("tree"))?,
    };
    let read_secs = t.elapsed().as_secs_f64();
    if read != counts.bytes {
        return Err(format!(
            "reading every file gave {read} bytes, the tree has {}",
            counts.bytes
        ));
    }
    let rm = match l.target()? {
        Target::Lib(fs) => {
            let t = Instant::now();
            lib_rm(fs, b"/tree", &root())?;
            t.elapsed().as_secs_f64()
        }
        Target::Dir(dir) => {
            let t = Instant::now();
            crate::run(Command::new("rm").arg("-rf").arg(dir.join("tree")))?;
            let secs = t.elapsed().as_secs_f64();
            if dir.join("tree").exists() {
                return Err("rm -rf: the tree is still there".into());
            }
            secs
        }
    };
    let n = s.tree_files;
    Ok(vec![
        fig(untar_metric(n), "s", false, None, untar),
        fig(format!("untar {n} files + sync"), "s", false, None, untar_sync),
        fig("find, cold", "s", false, None, find),
        fig("find, warm", "s", false, None, find_warm),
        fig(
            "read every file, warm",
            "MiB/s",
            true,
            None,
            read as f64 / read_secs / 1048576.0,
        ),
        fig(RM_METRIC, "s", false, None, rm),
    ])
}

// ---------------------------------------------------------------------
// parallel creates, fsync-heavy small files

fn w_pcreate(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let mut out = Vec::new();
    let files = s.pcreate_files;
    for &n in &s.pcreate_threads {
        let d = match l.target()? {
            Target::Lib(fs) => {
                for t in 0..n {
                    fs.create(&NewInode::dir(format!("/p{n}-{t}").as_bytes()).mode(0o755).cred(&root()))
                        .map_err(io("mkdir"))?;
                }
                par(n, |t| {
                    for i in 0..files {
                        fs.create(
                            &NewInode::file(format!("/p{n}-{t}/f{i:07}").as_bytes())
                                .mode(0o644)
                                .owner(0, 0),
                        )
                        .map_err(|e| format!("create #{i}: {e}"))?;
                    }
                    Ok(())
                })?
                .1
            }
            Target::Dir(dir) => {
                for t in 0..n {
                    std::fs::create_dir(dir.join(format!("p{n}-{t}"))).map_err(io("mkdir"))?;
                }
                par(n, |t| {
                    for i in 0..files {
                        std::fs::File::create(dir.join(format!("p{n}-{t}/f{i:07}")))
                            .map_err(|e| format!("create #{i}: {e}"))?;
                    }
                    Ok(())
                })?
                .1
            }
        };
        out.push(fig(
            "creates/s, all threads",
            "files/s",
            true,
            Some(n as f64),
            (files * n) as f64 / d.as_secs_f64(),
        ));
    }
    Ok(out)
}

fn w_fsmall(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let mut out = Vec::new();
    let files = s.fsmall_files;
    let data = vec![0xa5u8; 4096];
    for &n in &s.fsmall_threads {
        let x = Some(n as f64);
        let (lat, d, commits) = match l.target()? {
            Target::Lib(fs) => {
                for t in 0..n {
                    fs.create(&NewInode::dir(format!("/s{n}-{t}").as_bytes()).mode(0o755).cred(&root()))
                        .map_err(io("mkdir"))?;
                }
                let commits = || fs.volume().jbd().stats().map(|s| s.commits());
                let c0 = commits();
                let (lat, d) = par(n, |t| {
                    let mut p = Process::new(fs.clone());
                    let cred = root();
                    let mut lat = Vec::with_capacity(files);
                    for i in 0..files {
                        let path = format!("/s{n}-{t}/f{i}");
                        let fd = p
                            .open_as(&path, &OpenRequest::new(wflags(true)).mode(0o644).cred(&cred))
                            .map_err(io("create"))?;
                        p.write(fd, &data).map_err(io("write"))?;
                        let t0 = Instant::now();
                        p.fsync(fd).map_err(io("fsync"))?;
                        lat.push(t0.elapsed().as_secs_f64() * 1e6);
                        p.close(fd).map_err(io("close"))?;
                    }
                    Ok(lat)
                })?;
                let c = match (c0, commits()) {
                    (Some(a), Some(b)) => Some((b - a) as f64 / (n * files) as f64),
                    _ => None,
                };
                (lat, d, c)
            }
            Target::Dir(dir) => {
                for t in 0..n {
                    std::fs::create_dir(dir.join(format!("s{n}-{t}"))).map_err(io("mkdir"))?;
                }
                let (lat, d) = par(n, |t| {
                    let mut lat = Vec::with_capacity(files);
                    for i in 0..files {
                        let p = dir.join(format!("s{n}-{t}/f{i}"));
                        let mut f = std::fs::File::create(&p).map_err(io("create"))?;
                        f.write_all(&data).map_err(io("write"))?;
                        let t0 = Instant::now();
                        f.sync_all().map_err(io("fsync"))?;
                        lat.push(t0.elapsed().as_secs_f64() * 1e6);
                    }
                    Ok(lat)
                })?;
                (lat, d, None)
            }
        };
        let mut all: Vec<f64> = lat.into_iter().flatten().collect();
        out.push(fig(
            "files/s, all threads",
            "files/s",
            true,
            x,
            all.len() as f64 / d.as_secs_f64(),
        ));
        out.push(fig("median fsync", "µs", false, x, median(&mut all)));
        if let Some(c) = commits {
            out.push(fig("journal commits per fsync", "per fsync", false, x, c));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_intervals() {
        assert_eq!(create_points(10_000), vec![2_500, 5_000, 7_500, 10_000]);
        let full = create_points(1_000_000);
        assert_eq!(&full[..6], &[10_000, 20_000, 30_000, 40_000, 50_000, 100_000]);
        assert_eq!(full.last(), Some(&1_000_000));
        assert!(full.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn workload_names_are_unique_and_every_peer_list_has_the_kernel() {
        for (i, w) in WORKLOADS.iter().enumerate() {
            assert!(WORKLOADS[..i].iter().all(|v| v.name != w.name), "{} twice", w.name);
            // The ratios' base — except for building an image, which the
            // kernel does not do (its yardstick is mke2fs -d, run beside
            // the library as a variant of its own), and for the disk
            // formats, which the kernel does not read (the yardstick is
            // the same image raw, read by the same binary).
            assert!(
                w.peers.contains(&PeerId::Kernel) || w.name == "build" || w.name == "formats",
                "{} has no kernel peer",
                w.name
            );
        }
    }
}
