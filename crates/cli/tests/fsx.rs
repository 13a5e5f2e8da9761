//! Data integrity in the style of fsx (the file-system exerciser of
//! xfstests): one file on a read-write mount, a long seeded sequence of
//! reads, writes, truncates up and down, writes past EOF leaving holes,
//! fallocate (allocate, keep-size, punch-hole, zero-range), reads and
//! writes through shared mmap, fsync/fdatasync and close/reopen; every read
//! is checked against an in-memory model of the file. At the end the mount
//! is unmounted, `e2fsck -fn` must be clean, and the kernel (loop mount)
//! must read exactly the model.
//!
//! Environment:
//! - `EXT4KIT_FSX_TARGETS`: mount peers (default `ext4kit`; `kernel`,
//!   `fuse2fs` or `all` check the workload itself against the references);
//! - `EXT4KIT_FSX_SEED` (default 0x5eedf5c5), `EXT4KIT_FSX_OPS` (default
//!   100000), `EXT4KIT_FSX_MAXLEN` (largest file size, default 1 MiB).
//!
//! A failure prints the seed, the operation number, the last operations
//! and the first differing bytes (with the number of the operation that
//! wrote the expected byte), so it can be replayed exactly.
//!
//! - `EXT4KIT_BIN`: another ext4kit binary to judge (default: this build's).
//!
//! Needs root, loop devices and /dev/fuse; fails loudly without them.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ext4kit_testkit::mountpeer::{mkfs_ext4, peer_available, peers_from_env, process_state, Peer, PeerMount};
use ext4kit_testkit::{e2fsck_clean, LoopMount, TestRng};
use rustix::fs::FallocateFlags;
use rustix::io::Errno;

const BIN: &str = env!("CARGO_BIN_EXE_ext4kit");

/// The ext4kit binary under test (`EXT4KIT_BIN` judges another build).
fn ext4kit_bin() -> PathBuf {
    ext4kit_testkit::ext4kit_bin(BIN)
}
const PAGE: u64 = 4096;
/// Longest single read, write or fallocate.
const MAX_IO: u64 = 128 << 10;

use ext4kit_testkit::env_u64;

/// Which fallocate modes the target accepts (probed once; ext4 has all).
#[derive(Debug, Clone, Copy)]
struct Falloc {
    alloc: bool,
    keep_size: bool,
    punch: bool,
    zero: bool,
}

fn probe_falloc(dir: &Path) -> Falloc {
    let p = dir.join("fsx.probe");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.write_all_at(&[1u8; 8192], 0).unwrap();
    // fuse2fs 1.47 answers EINVAL (not EOPNOTSUPP) to modes it lacks.
    let try_mode = |mode: FallocateFlags, off: u64, len: u64| match rustix::fs::fallocate(&f, mode, off, len) {
        Ok(()) => true,
        Err(Errno::OPNOTSUPP) => false,
        Err(Errno::INVAL) if !mode.is_empty() => false,
        Err(e) => panic!("fallocate({mode:?}) probe on the mount failed with {e} (not EOPNOTSUPP)"),
    };
    let r = Falloc {
        alloc: try_mode(FallocateFlags::empty(), 8192, 4096),
        keep_size: try_mode(FallocateFlags::KEEP_SIZE, 16384, 4096),
        punch: try_mode(FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, 0, 4096),
        zero: try_mode(FallocateFlags::ZERO_RANGE, 4096, 100),
    };
    drop(f);
    std::fs::remove_file(&p).unwrap();
    r
}

/// The model: the file's bytes, and for each byte the number of the
/// operation that last wrote it (0: never written or zeroed), so a
/// mismatch names its culprit.
struct Model {
    data: Vec<u8>,
    writer: Vec<u32>,
}

impl Model {
    fn len(&self) -> u64 {
        self.data.len() as u64
    }
    fn resize(&mut self, n: u64) {
        self.data.resize(n as usize, 0);
        self.writer.resize(n as usize, 0);
    }
    fn zero(&mut self, off: u64, end: u64) {
        let end = end.min(self.len());
        if off < end {
            self.data[off as usize..end as usize].fill(0);
            self.writer[off as usize..end as usize].fill(0);
        }
    }
    fn write(&mut self, off: u64, buf: &[u8], op: u32) {
        let end = off + buf.len() as u64;
        if end > self.len() {
            self.resize(end);
        }
        self.data[off as usize..end as usize].copy_from_slice(buf);
        self.writer[off as usize..end as usize].fill(op);
    }
}

/// The bytes operation `op` writes at file offset `off`: a period-251
/// ramp whose phase depends on the operation, recognisable in a hex dump
/// and never zero. Sliced from one table (the test profile is barely
/// optimised; a byte-by-byte modulo made writes dominate the run).
fn pattern(op: u32, off: u64, len: usize) -> &'static [u8] {
    static TABLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| (0..251 + MAX_IO as usize).map(|j| (j % 251) as u8 + 1).collect());
    let phase = ((u64::from(op) * 31 + off) % 251) as usize;
    &t[phase..phase + len]
}

struct Fsx<'a> {
    path: PathBuf,
    file: File,
    model: Model,
    rng: TestRng,
    seed: u64,
    op: u32,
    log: VecDeque<String>,
    maxlen: u64,
    falloc: Falloc,
    peer: &'a str,
    /// The FUSE server's log: a server that died mid-run says why there.
    server_log: Option<PathBuf>,
    /// The FUSE server's pid: whether it still runs, exited or was killed
    /// by a signal (which writes nothing to its log) is part of a failure.
    server_pid: Option<u32>,
    counts: [u64; 14],
    nanos: [u64; 14],
}

const NAMES: [&str; 14] = [
    "read",
    "write",
    "mapread",
    "mapwrite",
    "truncate",
    "falloc",
    "falloc-keep",
    "punch",
    "zero",
    "fsync",
    "fdatasync",
    "reopen",
    "verify",
    "stat",
];

impl Fsx<'_> {
    fn note(&mut self, s: String) {
        if self.log.len() == 64 {
            self.log.pop_front();
        }
        self.log.push_back(format!("#{} {s}", self.op));
    }

    /// Panics with everything needed to replay and understand the failure.
    fn fail(&self, what: String) -> ! {
        let mut s = format!(
            "fsx on {} FAILED at operation {} (seed {:#x}; rerun with EXT4KIT_FSX_SEED={:#x} \
             EXT4KIT_FSX_TARGETS={}): {what}\nmodel size {}\nlast operations:\n",
            self.peer,
            self.op,
            self.seed,
            self.seed,
            self.peer,
            self.model.len()
        );
        for l in &self.log {
            let _ = writeln!(s, "  {l}");
        }
        if let Some(pid) = self.server_pid {
            // A server that is going away (ECONNABORTED: it died with our
            // request in flight) may still be flushing: give it a moment, so
            // that its state and the end of its log are final.
            let t = Instant::now();
            let mut state = process_state(pid);
            while state.starts_with("running") && t.elapsed() < std::time::Duration::from_secs(3) {
                std::thread::sleep(std::time::Duration::from_millis(50));
                state = process_state(pid);
            }
            let _ = writeln!(s, "the server (pid {pid}): {state}");
        }
        if let Some(text) = self.server_log.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            let _ = writeln!(s, "the server's log (last {} lines):", tail.len());
            for l in tail.iter().rev() {
                let _ = writeln!(s, "  {l}");
            }
        }
        panic!("{s}");
    }

    /// `got` (read at `off`) against the model.
    fn check(&self, how: &str, off: u64, got: &[u8], want_len: usize) {
        if got.len() != want_len {
            self.fail(format!(
                "{how} at {off:#x}: got {} bytes, the model has {want_len} there",
                got.len()
            ));
        }
        let want = &self.model.data[off as usize..off as usize + want_len];
        if got == want {
            return;
        }
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        let bad = got.iter().zip(want).filter(|(a, b)| a != b).count();
        let at = off as usize + first;
        let mut s = format!(
            "{how} at {off:#x}+{want_len:#x}: {bad} byte(s) differ, first at file offset {at:#x}: \
             read {:#04x}, expected {:#04x} (written by op #{}, 0 = hole/zeroed)\n  read:     ",
            got[first], want[first], self.model.writer[at]
        );
        let end = (first + 16).min(got.len());
        for b in &got[first..end] {
            let _ = write!(s, "{b:02x} ");
        }
        s.push_str("\n  expected: ");
        for b in &want[first..end] {
            let _ = write!(s, "{b:02x} ");
        }
        self.fail(s);
    }

    fn rand_range(&mut self, max_end: u64, max_len: u64) -> (u64, u64) {
        let max_end = max_end.max(1);
        let mut off = self.rng.below(max_end);
        let mut len = 1 + self.rng.below(max_len);
        // A quarter of the operations are page-aligned (whole blocks and
        // block-boundary edges matter to the extent code).
        if self.rng.below(4) == 0 {
            off -= off % PAGE;
            len = len.div_ceil(PAGE) * PAGE;
        }
        (off, len)
    }

    fn pread_full(&self, off: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            match self.file.read_at(&mut buf[got..], off + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => self.fail(format!("pread {off:#x}+{len:#x}: {e}")),
            }
        }
        buf.truncate(got);
        buf
    }

    fn do_read(&mut self) {
        let size = self.model.len();
        // Sometimes past EOF: must read short or nothing.
        let (off, len) = self.rand_range(size + size / 8 + 1, 65536);
        self.note(format!("read {off:#x}+{len:#x}"));
        let got = self.pread_full(off, len as usize);
        let want = size.saturating_sub(off).min(len) as usize;
        self.check("read", off.min(size), &got, want);
    }

    fn do_write(&mut self) {
        // Past EOF sometimes, leaving a hole between the old end and off.
        let (off, len) = self.rand_range(self.maxlen, 65536);
        let len = len.min(self.maxlen - off);
        self.note(format!("write {off:#x}+{len:#x} (size {:#x})", self.model.len()));
        let buf = pattern(self.op, off, len as usize);
        if let Err(e) = self.file.write_all_at(buf, off) {
            self.fail(format!("pwrite {off:#x}+{len:#x}: {e}"));
        }
        self.model.write(off, buf, self.op);
    }

    /// Maps the pages covering `off..off+len` (shared); returns the
    /// mapping and the offset of `off` inside it.
    fn map(&self, off: u64, len: u64, write: bool) -> (*mut u8, usize, usize) {
        use rustix::mm::{MapFlags, ProtFlags};
        let start = off - off % PAGE;
        let maplen = (off + len - start) as usize;
        let prot = if write {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a fresh shared mapping of our own file at an address the
        // kernel chooses; it is accessed only within `maplen`, which lies
        // inside the file's current size (the caller made sure), and unmapped
        // by `unmap` before the file can shrink.
        let p = unsafe { rustix::mm::mmap(std::ptr::null_mut(), maplen, prot, MapFlags::SHARED, &self.file, start) };
        match p {
            Ok(p) => (p.cast::<u8>(), maplen, (off - start) as usize),
            Err(e) => self.fail(format!("mmap {start:#x}+{maplen:#x}: {e}")),
        }
    }

    fn unmap(&self, p: *mut u8, maplen: usize) {
        // SAFETY: `p`/`maplen` are exactly a mapping made by `map` and no
        // reference into it outlives this call.
        if let Err(e) = unsafe { rustix::mm::munmap(p.cast(), maplen) } {
            self.fail(format!("munmap: {e}"));
        }
    }

    fn do_mapread(&mut self) {
        let size = self.model.len();
        if size == 0 {
            return self.do_read();
        }
        let (off, len) = self.rand_range(size, 65536);
        let len = len.min(size - off);
        self.note(format!("mapread {off:#x}+{len:#x}"));
        let (p, maplen, skip) = self.map(off, len, false);
        // SAFETY: skip+len <= maplen and the range is inside the file.
        let got = unsafe { std::slice::from_raw_parts(p.add(skip), len as usize) }.to_vec();
        self.unmap(p, maplen);
        self.check("mapread", off, &got, len as usize);
    }

    fn do_mapwrite(&mut self) {
        let (off, len) = self.rand_range(self.maxlen, 65536);
        let len = len.min(self.maxlen - off);
        let size = self.model.len();
        self.note(format!("mapwrite {off:#x}+{len:#x} (size {size:#x})"));
        // A mapping cannot extend a file: grow it first, as fsx does.
        if off + len > size {
            if let Err(e) = self.file.set_len(off + len) {
                self.fail(format!("ftruncate up to {:#x} before mapwrite: {e}", off + len));
            }
            self.model.resize(off + len);
        }
        let buf = pattern(self.op, off, len as usize);
        let (p, maplen, skip) = self.map(off, len, true);
        // SAFETY: skip+len <= maplen, inside the (grown) file, writable.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), p.add(skip), buf.len()) };
        if self.rng.below(16) == 0 {
            // SAFETY: the whole mapping made above.
            let r = unsafe { rustix::mm::msync(p.cast(), maplen, rustix::mm::MsyncFlags::SYNC) };
            if let Err(e) = r {
                self.fail(format!("msync: {e}"));
            }
        }
        self.unmap(p, maplen);
        self.model.write(off, buf, self.op);
    }

    fn do_truncate(&mut self) {
        let size = self.model.len();
        // Down as often as up; sometimes to zero, sometimes unaligned.
        let n = match self.rng.below(8) {
            0 => 0,
            1..=3 => self.rng.below(size + 1),
            _ => self.rng.below(self.maxlen + 1),
        };
        self.note(format!("truncate {size:#x} -> {n:#x}"));
        if let Err(e) = self.file.set_len(n) {
            self.fail(format!("ftruncate {n:#x}: {e}"));
        }
        self.model.resize(n);
        self.check_size();
    }

    fn do_falloc(&mut self, kind: usize) {
        let (off, len) = self.rand_range(self.maxlen, MAX_IO);
        let len = len.min(self.maxlen - off);
        let size = self.model.len();
        let (mode, name) = match kind {
            5 => (FallocateFlags::empty(), "falloc"),
            6 => (FallocateFlags::KEEP_SIZE, "falloc-keep"),
            7 => (FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, "punch"),
            _ => {
                if self.rng.below(2) == 0 {
                    (FallocateFlags::ZERO_RANGE, "zero")
                } else {
                    (FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE, "zero-keep")
                }
            }
        };
        self.note(format!("{name} {off:#x}+{len:#x} (size {size:#x})"));
        if let Err(e) = rustix::fs::fallocate(&self.file, mode, off, len) {
            self.fail(format!("fallocate {name} {off:#x}+{len:#x}: {e}"));
        }
        let keep = mode.contains(FallocateFlags::KEEP_SIZE);
        if mode.intersects(FallocateFlags::PUNCH_HOLE | FallocateFlags::ZERO_RANGE) {
            self.model.zero(off, off + len);
        }
        if !keep && off + len > size {
            self.model.resize(off + len);
        }
        self.check_size();
    }

    fn check_size(&mut self) {
        match self.file.metadata() {
            Ok(m) if m.len() == self.model.len() => {}
            Ok(m) => self.fail(format!("fstat size {:#x}, model {:#x}", m.len(), self.model.len())),
            Err(e) => self.fail(format!("fstat: {e}")),
        }
    }

    fn verify_all(&mut self, how: &str) {
        let size = self.model.len();
        let got = self.pread_full(0, size as usize + 4096);
        self.check(how, 0, &got, size as usize);
    }

    fn reopen(&mut self) {
        self.note("close + reopen".into());
        let f = OpenOptions::new().read(true).write(true).open(&self.path);
        match f {
            Ok(f) => self.file = f,
            Err(e) => self.fail(format!("reopen: {e}")),
        }
        self.check_size();
    }

    fn step(&mut self) {
        self.op += 1;
        // Weights per mille: reads and writes dominate, as in fsx; syncs are
        // rare (each costs a journal commit on the kernel, ~5 ms here).
        let r = self.rng.below(1000);
        let kind = match r {
            0..=219 => 0,
            220..=439 => 1,
            440..=539 => 2,
            540..=619 => 3,
            620..=699 => 4,
            700..=739 => 5,
            740..=779 => 6,
            780..=859 => 7,
            860..=939 => 8,
            940..=942 => 9,
            943..=945 => 10,
            946..=955 => 11,
            _ => 13,
        };
        let kind = match kind {
            5 if !self.falloc.alloc => 1,
            6 if !self.falloc.keep_size => 1,
            7 if !self.falloc.punch => 1,
            8 if !self.falloc.zero => 1,
            k => k,
        };
        self.counts[kind] += 1;
        let t = Instant::now();
        match kind {
            0 => self.do_read(),
            1 => self.do_write(),
            2 => self.do_mapread(),
            3 => self.do_mapwrite(),
            4 => self.do_truncate(),
            5..=8 => self.do_falloc(kind),
            9 => {
                self.note("fsync".into());
                if let Err(e) = self.file.sync_all() {
                    self.fail(format!("fsync: {e}"));
                }
            }
            10 => {
                self.note("fdatasync".into());
                if let Err(e) = self.file.sync_data() {
                    self.fail(format!("fdatasync: {e}"));
                }
            }
            11 => self.reopen(),
            _ => {
                self.note("fstat".into());
                self.check_size();
            }
        }
        self.nanos[kind] += t.elapsed().as_nanos() as u64;
        if self.op.is_multiple_of(2000) {
            self.counts[12] += 1;
            self.note("verify whole file".into());
            self.verify_all("periodic whole-file read");
        }
    }
}

fn run_one(peer: &Peer, seed: u64, ops: u64, maxlen: u64) {
    let work = std::env::temp_dir().join(format!("ext4kit-fsx-{}-{}", peer.name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let img = work.join("fsx.img");
    mkfs_ext4(&img, 64, &[]).unwrap();
    let mnt = work.join("mnt");
    let m = PeerMount::mount(peer, &img, &mnt).unwrap();
    let falloc = probe_falloc(m.path());
    let path = m.path().join("fsx.file");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    let mut fsx = Fsx {
        path,
        file,
        model: Model {
            data: Vec::new(),
            writer: Vec::new(),
        },
        rng: TestRng::new(seed),
        seed,
        op: 0,
        log: VecDeque::new(),
        maxlen,
        falloc,
        peer: peer.name(),
        server_log: m.log_path().map(Path::to_path_buf),
        server_pid: m.server_pid(),
        counts: [0; 14],
        nanos: [0; 14],
    };
    let t = Instant::now();
    for _ in 0..ops {
        fsx.step();
    }
    fsx.verify_all("final whole-file read");
    fsx.file.sync_all().unwrap();
    let took = t.elapsed();
    let model = std::mem::take(&mut fsx.model.data);
    let summary: Vec<String> = NAMES
        .iter()
        .zip(fsx.counts.iter().zip(fsx.nanos))
        .filter(|(_, (c, _))| **c > 0)
        .map(|(n, (c, ns))| format!("{n} {c} ({} ms)", ns / 1_000_000))
        .collect();
    println!(
        "fsx on {}: {ops} operations in {:.1} s (seed {seed:#x}, final size {}, fallocate modes {falloc:?}): {}",
        peer.name(),
        took.as_secs_f64(),
        model.len(),
        summary.join(", ")
    );
    drop(fsx);
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap_or_else(|e| panic!("{}: after fsx: {e}", peer.name()));
    // The kernel reads exactly the model.
    let lm = LoopMount::mount(&img, &work.join("kmnt"), "ext4", true).unwrap();
    let on_disk = std::fs::read(lm.path().join("fsx.file")).unwrap();
    lm.unmount().unwrap();
    assert_eq!(on_disk.len(), model.len(), "{}: size the kernel reads", peer.name());
    if let Some(i) = on_disk.iter().zip(&model).position(|(a, b)| a != b) {
        panic!(
            "{}: the kernel reads {:#04x} at {i:#x} where the model has {:#04x} (seed {seed:#x})",
            peer.name(),
            on_disk[i],
            model[i]
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn fsx_one_file_matches_the_model_through_the_mount_and_on_disk() {
    let peers = peers_from_env("EXT4KIT_FSX_TARGETS", "ext4kit", &ext4kit_bin()).unwrap();
    let seed = env_u64("EXT4KIT_FSX_SEED", 0x5eed_f5c5);
    let ops = env_u64("EXT4KIT_FSX_OPS", 100_000);
    let maxlen = env_u64("EXT4KIT_FSX_MAXLEN", 1 << 20);
    assert!(maxlen >= 2 * PAGE, "EXT4KIT_FSX_MAXLEN must be at least 8192");
    for peer in &peers {
        peer_available(peer).unwrap_or_else(|e| panic!("fsx needs {}: {e}", peer.name()));
        run_one(peer, seed, ops, maxlen);
    }
}
