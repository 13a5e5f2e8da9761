//! Workloads: operation mixes run through the library over a recording
//! device, each thread keeping the [`History`] the crash checks judge.
//!
//! A run: the variant's fresh image ([`crate::fsimage`]) in a
//! [`MemDevice`] under a [`RecordingDevice`]; `Fs::open_device`
//! read-write on top; a setup step (a shared directory `/s_shared`, then a
//! sync); the workload's threads, each with its own [`Process`], its own
//! names (prefix `tN_`) under its own home directory and in `/s_shared`,
//! and a seeded generator; then a final sync whose marks cover every
//! object (so the last flush cut checks the whole model), the descriptors
//! closed and the `Fs` dropped (its close is recorded too). Every random
//! choice is drawn from a seeded `StdRng` over ordered collections, so a
//! single-threaded run issues the same operations, and the engine the same
//! writes, every time; with several threads the operations per thread are
//! the same but their interleaving (and so the log) is not.
//!
//! With a container format ([`RunSpec::container`]) the recording device
//! holds the container file instead (growing as the format appends), and
//! the format layer sits between it and the engine
//! ([`crate::container`]): the log is the container file's writes.

use ext4kit::{NewInode, OpenRequest};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use ext4kit::vfs::io::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};
use ext4kit::{Access, Cred, Fd, Fs, OpenFlags, OpenOptions, Process, RenameFlags};
use ext4kit_blockdev::{BlockDevice, MemDevice, RecordingDevice, WriteLog};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::container::{base_container, Container};
use crate::fsimage::{base_files, base_image, FsVariant};
use crate::model::{Content, History, Mark, ObjId, ObjKind, Op, RenameRec, Touch};

/// The operation mixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    /// One thread: create, write, append, overwrite, truncate, fallocate
    /// (all modes), rename (new names and replacing), unlink (also of open
    /// files), mkdir, rmdir, link, symlink, xattr set/remove, fsync,
    /// fdatasync, fsync of directories, close, sync.
    Mix,
    /// [`Workload::Mix`] on three threads at once, contending in
    /// `/s_shared`.
    MixThreads,
    /// xfstests generic/455's shape: fsx on one file per thread (four
    /// threads): writes, truncates, fallocate, hole punching and zeroing
    /// within 256 KiB, each followed by fsync or fdatasync — a mark at
    /// every fsync.
    G455,
    /// generic/457's shape: the same on files that start as copies of a
    /// 256 KiB file of 0xff (the test's reflinked clones; ext4 has no
    /// reflink, so here their blocks are allocated and written first),
    /// five files on each of two threads.
    G457,
    /// generic/482's shape: fsstress-like random operations on four
    /// threads, each thread syncing the filesystem (a mark) every 16
    /// operations.
    G482,
    /// Only reads (open/read/close, stat, readdir) of the base files: the
    /// only writes are the open's and the close's. Must pass trivially.
    ReadOnly,
    /// In-place overwrites of the files the base image holds (written by
    /// mke2fs), each followed by fsync or fdatasync: no allocation, no
    /// namespace change.
    Overwrite,
}

impl Workload {
    /// Every workload.
    pub const ALL: [Workload; 7] = [
        Workload::Mix,
        Workload::MixThreads,
        Workload::G455,
        Workload::G457,
        Workload::G482,
        Workload::ReadOnly,
        Workload::Overwrite,
    ];

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Mix => "mix",
            Workload::MixThreads => "mix-mt",
            Workload::G455 => "g455",
            Workload::G457 => "g457",
            Workload::G482 => "g482",
            Workload::ReadOnly => "readonly",
            Workload::Overwrite => "overwrite",
        }
    }

    /// The workload called `s`.
    pub fn parse(s: &str) -> Option<Workload> {
        Self::ALL.into_iter().find(|w| w.name() == s)
    }

    /// Threads it runs on by default.
    pub fn default_threads(self) -> usize {
        match self {
            Workload::Mix | Workload::ReadOnly | Workload::Overwrite => 1,
            Workload::MixThreads => 3,
            Workload::G455 | Workload::G482 => 4,
            Workload::G457 => 2,
        }
    }

    /// Operations per thread by default.
    pub fn default_ops(self) -> usize {
        match self {
            Workload::Mix => 400,
            Workload::MixThreads => 200,
            Workload::G455 => 120,
            Workload::G457 => 100,
            Workload::G482 => 150,
            Workload::ReadOnly => 200,
            Workload::Overwrite => 200,
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One workload run to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSpec {
    /// The mix.
    pub workload: Workload,
    /// The filesystem.
    pub fs: FsVariant,
    /// Seed of every choice.
    pub seed: u64,
    /// Operations per thread.
    pub ops: usize,
    /// Threads.
    pub threads: usize,
    /// Fault injection: every `n`th flush is unhonoured (0: none).
    pub drop_flushes: u64,
    /// Keep the log's data in an unlinked scratch file instead of memory.
    pub spill: bool,
    /// The container format the image lives in (`None`: a raw image).
    pub container: Option<Container>,
}

impl RunSpec {
    /// `workload` on `fs` with `seed` and the workload's defaults.
    pub fn new(workload: Workload, fs: FsVariant, seed: u64) -> Self {
        RunSpec {
            workload,
            fs,
            seed,
            ops: workload.default_ops(),
            threads: workload.default_threads(),
            drop_flushes: 0,
            spill: false,
            container: None,
        }
    }

    /// The same run inside container `c`.
    pub fn in_container(self, c: Option<Container>) -> Self {
        RunSpec { container: c, ..self }
    }

    /// The summary's cell: `mix/ext4-4k`, or `mix/ext4-4k/qcow2`.
    pub fn cell(&self) -> String {
        match self.container {
            None => format!("{}/{}", self.workload, self.fs.name()),
            Some(c) => format!("{}/{}/{c}", self.workload, self.fs.name()),
        }
    }

    /// `mix/ext4-4k/seed 7`.
    pub fn label(&self) -> String {
        let mut s = format!("{}/seed {}", self.cell(), self.seed);
        if self.drop_flushes > 0 {
            s.push_str(&format!("/1 flush in {} unhonoured", self.drop_flushes));
        }
        s
    }

    /// The command-line arguments that rerun it.
    pub fn args(&self) -> String {
        let mut s = format!(
            "--workload {} --fs {} --seed {} --ops {} --threads {}",
            self.workload,
            self.fs.name(),
            self.seed,
            self.ops,
            self.threads
        );
        if self.drop_flushes > 0 {
            s.push_str(&format!(" --drop-flushes {}", self.drop_flushes));
        }
        if let Some(c) = self.container {
            s.push_str(&format!(" --format {c}"));
        }
        s
    }
}

/// A recorded run: everything the crash checks need.
#[derive(Debug)]
pub struct Recorded {
    /// What ran.
    pub spec: RunSpec,
    /// The image before the run (the container file's bytes, in a
    /// container).
    pub base: Arc<Vec<u8>>,
    /// Every write and flush the engine made, from its open to its close.
    pub log: WriteLog,
    /// The setup's history, then each thread's.
    pub histories: Vec<History>,
    /// Operations run, all threads together.
    pub ops: usize,
}

/// Run `spec`: the workload's operations through the library over a
/// recording device. An operation that fails is an error here (the
/// workloads only issue operations that must succeed), as is a log that
/// does not replay to what the device holds at the end.
pub fn run(spec: &RunSpec) -> Result<Recorded, String> {
    let (base, mem) = match spec.container {
        None => {
            let base = base_image(spec.fs).map_err(|e| format!("making the {} image: {e}", spec.fs.name()))?;
            let mem = Arc::new(MemDevice::from_vec(base.to_vec()));
            (base, mem)
        }
        Some(c) => {
            // A container file grows as the format appends to it.
            let base = base_container(spec.fs, c)?;
            let mem = Arc::new(MemDevice::growable(base.to_vec()));
            (base, mem)
        }
    };
    let log = if spec.spill {
        let dir = crate::fsimage::scratch_root();
        let path = dir.join(format!("ext4kit-crash-log-{}-{}", std::process::id(), spec.seed));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| format!("spill file {}: {e}", path.display()))?;
        let _ = std::fs::remove_file(&path);
        WriteLog::with_spill(f)
    } else {
        WriteLog::new()
    };
    let rec = Arc::new(RecordingDevice::with_log(mem.clone(), log));
    if spec.drop_flushes > 0 {
        let n = spec.drop_flushes;
        rec.drop_flushes(move |k| k % n == 0);
    }
    let disk: Arc<dyn BlockDevice> = match spec.container {
        None => rec.clone(),
        Some(c) => c
            .open(rec.clone(), true)
            .map_err(|e| format!("opening the fresh {c} image read-write: {e}"))?,
    };
    let fs = Fs::open_device(
        disk.clone(),
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .map_err(|e| format!("opening the fresh image read-write: {e}"))?;

    let mut histories = Vec::new();
    let mut workers = Vec::new();
    match spec.workload {
        Workload::ReadOnly => {
            let mut w = Worker::new(&fs, &rec, spec, 0, None);
            for _ in 0..spec.ops {
                w.read_step()?;
            }
            workers.push(w);
        }
        Workload::Overwrite => {
            // The base image's files, written by mke2fs: nothing to
            // allocate, no name to change.
            let mut w = Worker::new(&fs, &rec, spec, 0, None);
            w.adopt_base()?;
            for _ in 0..spec.ops {
                w.overwrite_step()?;
            }
            workers.push(w);
        }
        _ => {
            let mut setup = Worker::new(&fs, &rec, spec, usize::MAX, None);
            let shared = setup.setup()?;
            let mut ws: Vec<Worker> = (0..spec.threads)
                .map(|t| Worker::new(&fs, &rec, spec, t, Some(shared)))
                .collect();
            let results: Vec<Result<Worker, String>> = std::thread::scope(|s| {
                let hs: Vec<_> = ws
                    .drain(..)
                    .map(|mut w| {
                        s.spawn(move || {
                            w.run_thread()?;
                            Ok(w)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err("a workload thread panicked".into())))
                    .collect()
            });
            workers.push(setup);
            for r in results {
                workers.push(r?);
            }
        }
    }
    if spec.workload != Workload::ReadOnly {
        // The final sync: every object of every history is promised.
        let start = rec.position();
        fs.sync().map_err(|e| format!("final sync: {e}"))?;
        let (end, flushes) = (rec.position(), rec.flushes());
        for w in &mut workers {
            let marks = w.marks_all();
            w.hist.ops.push(Op {
                desc: "final sync".into(),
                start,
                end,
                flushes,
                touches: vec![],
                marks,
                rename: None,
            });
        }
    }
    let mut ops = 0;
    for mut w in workers {
        w.close_all()?;
        ops += w.hist.ops.len();
        histories.push(std::mem::take(&mut w.hist));
    }
    let refs = Arc::strong_count(&fs);
    if refs != 1 {
        return Err(format!("{refs} references to the Fs remain at the end of the run"));
    }
    drop(fs);
    // The format layer's close is recorded too (a VHDX writes what it did
    // not flush when dropped).
    drop(disk);
    let log = rec.take_log();
    let replayed = log.replay(&base).map_err(|e| format!("replaying the log: {e}"))?;
    if replayed != mem.to_vec() {
        return Err("the recorded log does not replay to the device's contents".into());
    }
    Ok(Recorded {
        spec: spec.clone(),
        base,
        log,
        histories,
        ops,
    })
}

const ROOT: ObjId = 0;
const SHARED: ObjId = 1;
const SHARED_PATH: &str = "/s_shared";

/// An object of a worker's model.
#[derive(Debug, Clone)]
struct Obj {
    kind: ObjKind,
    ino: u32,
    paths: BTreeSet<String>,
    /// Shared with the marks that hold it (chunk by chunk).
    content: Content,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    target: Vec<u8>,
    /// Created by this worker (root and the shared directory are not).
    owned: bool,
}

/// What an operation did, for its [`Op`].
#[derive(Default)]
struct Effect {
    touches: Vec<Touch>,
    marks: Vec<Mark>,
    rename: Option<RenameRec>,
}

type Res<T> = ext4kit::Result<T>;

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn parent_of(p: &str) -> &str {
    crate::tree::parent(p)
}

fn base_of(p: &str) -> &str {
    crate::tree::base_name(p)
}

/// One thread of a workload (or the setup): its model and history.
struct Worker {
    fs: Arc<Fs>,
    rec: Arc<RecordingDevice>,
    p: Process,
    rng: StdRng,
    cred: Cred,
    workload: Workload,
    ops: usize,
    prefix: String,
    objs: BTreeMap<ObjId, Obj>,
    by_path: BTreeMap<String, ObjId>,
    fds: BTreeMap<ObjId, Fd>,
    /// Descriptors of unlinked files (orphans until closed).
    orphans: Vec<Fd>,
    next_id: u64,
    next_name: u64,
    hist: History,
    /// Live file bytes this worker may hold.
    budget: u64,
    live: u64,
    /// Largest file offset fsx-like workloads use.
    max_file: u64,
    /// Files are extent-mapped (ext4): fallocate has every mode. On ext3
    /// (indirect maps) only hole punching exists, as in the kernel.
    extents: bool,
}

impl Worker {
    fn new(fs: &Arc<Fs>, rec: &Arc<RecordingDevice>, spec: &RunSpec, idx: usize, shared: Option<u32>) -> Self {
        let setup = idx == usize::MAX;
        let prefix = if setup { "s_".to_string() } else { format!("t{idx}_") };
        let mut objs = BTreeMap::new();
        let mut by_path = BTreeMap::new();
        objs.insert(
            ROOT,
            Obj {
                kind: ObjKind::Dir,
                ino: 2,
                paths: ["/".to_string()].into(),
                content: Content::default(),
                xattrs: BTreeMap::new(),
                target: vec![],
                owned: false,
            },
        );
        by_path.insert("/".to_string(), ROOT);
        if let Some(ino) = shared {
            objs.insert(
                SHARED,
                Obj {
                    ino,
                    paths: [SHARED_PATH.to_string()].into(),
                    ..objs[&ROOT].clone()
                },
            );
            by_path.insert(SHARED_PATH.to_string(), SHARED);
        }
        let threads = spec.threads.max(1) as u64;
        Worker {
            fs: fs.clone(),
            rec: rec.clone(),
            p: Process::new(fs.clone()),
            rng: StdRng::seed_from_u64(spec.seed ^ (idx as u64).wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            cred: Cred::root(),
            workload: spec.workload,
            ops: spec.ops,
            prefix: prefix.clone(),
            objs,
            by_path,
            fds: BTreeMap::new(),
            orphans: vec![],
            next_id: if setup { 2 } else { (idx as u64 + 1) << 32 },
            next_name: 0,
            hist: History {
                name: if setup { "setup".into() } else { format!("thread {idx}") },
                prefix,
                ops: vec![],
            },
            budget: spec.fs.size() / 5 / threads,
            live: 0,
            max_file: 256 << 10,
            extents: spec.fs != FsVariant::Ext3,
        }
    }

    /// Run one operation: log positions around it, the flush count after
    /// it, its effect.
    fn op(&mut self, desc: String, f: impl FnOnce(&mut Self) -> Res<Effect>) -> Result<(), String> {
        let start = self.rec.position();
        let eff = f(self).map_err(|e| {
            format!(
                "{}: operation {} `{desc}` failed: {e}",
                self.hist.name,
                self.hist.ops.len()
            )
        })?;
        let end = self.rec.position();
        let flushes = self.rec.flushes();
        if !eff.marks.is_empty() {
            let _ = self
                .rec
                .mark(format!("{} #{} {desc}", self.hist.name, self.hist.ops.len()).as_bytes());
        }
        self.hist.ops.push(Op {
            desc,
            start,
            end,
            flushes,
            touches: eff.touches,
            marks: eff.marks,
            rename: eff.rename,
        });
        Ok(())
    }

    // ---- the model ----

    fn new_id(&mut self) -> ObjId {
        self.next_id += 1;
        self.next_id
    }

    fn new_name(&mut self, letter: char) -> String {
        self.next_name += 1;
        format!("{}{letter}{}", self.prefix, self.next_name)
    }

    fn path(&self, id: ObjId) -> String {
        self.objs[&id].paths.iter().next().cloned().unwrap_or_default()
    }

    fn add(&mut self, id: ObjId, kind: ObjKind, ino: u32, path: &str) {
        self.objs.insert(
            id,
            Obj {
                kind,
                ino,
                paths: [path.to_string()].into(),
                content: Content::default(),
                xattrs: BTreeMap::new(),
                target: vec![],
                owned: true,
            },
        );
        self.by_path.insert(path.to_string(), id);
    }

    fn pick<T: Clone>(&mut self, v: &[T]) -> Option<T> {
        if v.is_empty() {
            None
        } else {
            Some(v[self.rng.random_range(0..v.len())].clone())
        }
    }

    fn owned(&self, kind: ObjKind) -> Vec<ObjId> {
        self.objs
            .iter()
            .filter(|(_, o)| o.owned && o.kind == kind)
            .map(|(id, _)| *id)
            .collect()
    }

    /// A directory to create a name in: an own directory or the shared one.
    fn pick_parent(&mut self) -> ObjId {
        let mut dirs = self.owned(ObjKind::Dir);
        if self.objs.contains_key(&SHARED) && self.rng.random_bool(0.2) {
            return SHARED;
        }
        if dirs.is_empty() {
            dirs.push(if self.objs.contains_key(&SHARED) { SHARED } else { ROOT });
        }
        self.pick(&dirs).expect("not empty")
    }

    fn children(&self, dir: &str) -> Vec<(String, ObjId)> {
        let pre = if dir == "/" { "/".to_string() } else { format!("{dir}/") };
        self.by_path
            .range(pre.clone()..)
            .take_while(|(k, _)| k.starts_with(&pre))
            .filter(|(k, _)| !k[pre.len()..].contains('/') && k.len() > pre.len())
            .map(|(k, id)| (k[pre.len()..].to_string(), *id))
            .collect()
    }

    /// The mark of object `id` as it is now: `full` for fsync and sync
    /// (xattrs, and a directory's entries), not for fdatasync.
    fn mark(&self, id: ObjId, full: bool) -> Mark {
        let o = &self.objs[&id];
        Mark {
            id,
            ino: o.ino,
            kind: o.kind,
            paths: o.paths.iter().cloned().collect(),
            names: full,
            content: (o.kind == ObjKind::File).then(|| o.content.clone()),
            target: (o.kind == ObjKind::Symlink).then(|| o.target.clone()),
            xattrs: (full && o.kind != ObjKind::Symlink && o.owned).then(|| o.xattrs.clone()),
            entries: (o.kind == ObjKind::Dir && full).then(|| {
                self.children(&self.path(id))
                    .into_iter()
                    .filter(|(n, _)| n.starts_with(&self.prefix))
                    .map(|(n, c)| (n, self.objs[&c].ino))
                    .collect()
            }),
        }
    }

    /// Marks of every object (a sync).
    fn marks_all(&self) -> Vec<Mark> {
        self.objs.keys().map(|&id| self.mark(id, true)).collect()
    }

    /// The descriptor of file `id`, opening it if needed.
    fn fd(&mut self, id: ObjId) -> Res<Fd> {
        if let Some(&fd) = self.fds.get(&id) {
            return Ok(fd);
        }
        let path = self.path(id);
        let fd = self.p.open_as(
            path.as_bytes(),
            &OpenRequest::new(OpenFlags {
                access: Access::ReadWrite,
                ..Default::default()
            })
            .mode(0)
            .cred(&self.cred),
        )?;
        self.fds.insert(id, fd);
        Ok(fd)
    }

    fn close_all(&mut self) -> Result<(), String> {
        let fds: Vec<Fd> = self.fds.values().copied().chain(self.orphans.drain(..)).collect();
        self.fds.clear();
        for fd in fds {
            self.p
                .close(fd)
                .map_err(|e| format!("{}: close: {e}", self.hist.name))?;
        }
        Ok(())
    }

    /// Remove path `p` of object `id` from the model: the touch it makes.
    fn drop_name(&mut self, id: ObjId, p: &str) -> Touch {
        self.by_path.remove(p);
        let o = self.objs.get_mut(&id).expect("known object");
        o.paths.remove(p);
        if !o.paths.is_empty() {
            return Touch::Names {
                id,
                paths: o.paths.iter().cloned().collect(),
            };
        }
        let o = self.objs.remove(&id).expect("known object");
        if o.kind == ObjKind::File {
            self.live -= o.content.len() as u64;
        }
        if let Some(fd) = self.fds.remove(&id) {
            self.orphans.push(fd);
        }
        Touch::Gone { id }
    }

    fn random_bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.rng.fill(&mut v[..]);
        v
    }

    fn write_len(&mut self) -> u64 {
        match self.rng.random_range(0..10) {
            0..=3 => self.rng.random_range(1..=512),
            4..=7 => self.rng.random_range(1..=8192),
            _ => self.rng.random_range(1..=65536),
        }
    }

    // ---- setup ----

    /// mkdir /s_shared and sync: returns its inode.
    fn setup(&mut self) -> Result<u32, String> {
        self.op(format!("mkdir {SHARED_PATH}"), |w| {
            let st =
                w.fs.create(&NewInode::dir(SHARED_PATH.as_bytes()).mode(0o755).cred(&w.cred))?;
            w.add(SHARED, ObjKind::Dir, st.ino, SHARED_PATH);
            Ok(Effect {
                touches: vec![Touch::Entry {
                    dir: ROOT,
                    name: "s_shared".into(),
                }],
                ..Default::default()
            })
        })?;
        self.sync()?;
        Ok(self.objs[&SHARED].ino)
    }

    // ---- the thread ----

    fn run_thread(&mut self) -> Result<(), String> {
        let home = self.prefix.clone() + "h";
        let home_path = join("/", &home);
        self.op(format!("mkdir {home_path}"), |w| {
            let st =
                w.fs.create(&NewInode::dir(home_path.as_bytes()).mode(0o755).cred(&w.cred))?;
            let id = w.new_id();
            w.add(id, ObjKind::Dir, st.ino, &home_path);
            Ok(Effect {
                touches: vec![Touch::Entry { dir: ROOT, name: home }],
                ..Default::default()
            })
        })?;
        match self.workload {
            Workload::G455 => {
                self.create_in(ObjKind::File, Some(self.home()))?;
            }
            Workload::G457 => {
                for _ in 0..5 {
                    self.create_in(ObjKind::File, Some(self.home()))?;
                    let id = *self.owned(ObjKind::File).last().expect("just made");
                    self.pwrite(id, 0, vec![0xff; 256 << 10])?;
                    self.fsync(id, false)?;
                }
            }
            _ => {}
        }
        for n in 0..self.ops {
            match self.workload {
                Workload::Mix | Workload::MixThreads => self.mix_step(true)?,
                Workload::G482 => {
                    self.mix_step(false)?;
                    if n % 16 == 15 {
                        self.sync()?;
                    }
                }
                Workload::G455 | Workload::G457 => self.fsx_step()?,
                Workload::Overwrite | Workload::ReadOnly => unreachable!("run without threads"),
            }
        }
        Ok(())
    }

    fn home(&self) -> ObjId {
        self.objs
            .iter()
            .find(|(_, o)| o.owned && o.kind == ObjKind::Dir)
            .map(|(id, _)| *id)
            .expect("home made first")
    }

    fn mix_step(&mut self, syncs: bool) -> Result<(), String> {
        let files = self.owned(ObjKind::File);
        let crowded = self.objs.len() > 250;
        let full = self.live > self.budget;
        let choice = self.rng.random_range(0..100);
        let file = self.pick(&files);
        match (choice, file) {
            (0..=9, _) | (_, None) if !crowded => self.create_in(ObjKind::File, None),
            (10..=19, Some(f)) if !full => {
                let size = self.objs[&f].content.len() as u64;
                let off = self.rng.random_range(0..=size + 8192);
                let len = self.write_len();
                let data = self.random_bytes(len as usize);
                self.pwrite(f, off, data)
            }
            (20..=27, Some(f)) if !full => {
                let size = self.objs[&f].content.len() as u64;
                let len = self.write_len();
                let data = self.random_bytes(len as usize);
                self.pwrite(f, size, data)
            }
            (28..=33, Some(f)) => self.overwrite(f),
            (34..=37, Some(f)) => self.truncate(f),
            (38..=41, Some(f)) => self.fallocate(f),
            (42..=49, _) => self.rename(),
            (50..=54, _) => self.unlink(),
            (55..=58, _) if !crowded => self.create_in(ObjKind::Dir, None),
            (59..=61, _) => self.rmdir(),
            (62..=64, Some(f)) if !crowded => self.link(f),
            (65..=67, _) if !crowded => self.create_in(ObjKind::Symlink, None),
            (68..=71, _) => self.setxattr(),
            (72..=73, _) => self.removexattr(),
            (74..=81, Some(f)) => self.fsync(f, false),
            (82..=86, Some(f)) => self.fsync(f, true),
            (87..=89, _) if syncs => self.fsync_dir(),
            (90..=93, _) => self.close_some(),
            (94, _) if syncs => self.sync(),
            // Over a budget, or nothing to act on: shrink.
            (_, Some(f)) if full || crowded => {
                if self.rng.random_bool(0.5) {
                    self.truncate(f)
                } else {
                    self.unlink()
                }
            }
            (_, Some(f)) => self.overwrite(f),
            _ => self.rmdir(),
        }
    }

    fn fsx_step(&mut self) -> Result<(), String> {
        let files = self.owned(ObjKind::File);
        let f = self.pick(&files).expect("fsx files made at setup");
        let size = self.objs[&f].content.len() as u64;
        match self.rng.random_range(0..70) {
            0..=9 => {
                // Read: fsx checks what it reads; so do we.
                let fd = self.fd(f).map_err(|e| e.to_string())?;
                let mut buf = vec![0u8; size as usize];
                let n = self.p.pread(fd, &mut buf, 0).map_err(|e| e.to_string())?;
                if buf[..n] != self.objs[&f].content.to_vec()[..n] {
                    return Err(format!("{}: read back differs from what was written", self.hist.name));
                }
            }
            10..=39 => {
                let off = self.rng.random_range(0..self.max_file);
                let len = self.write_len().min(self.max_file - off).max(1);
                let data = self.random_bytes(len as usize);
                self.pwrite(f, off, data)?;
            }
            40..=49 => self.truncate(f)?,
            _ => self.fallocate(f)?,
        }
        match self.rng.random_range(0..10) {
            0..=5 => self.fsync(f, false),
            6..=8 => self.fsync(f, true),
            _ => Ok(()),
        }
    }

    /// Take the base image's files (at least 100 bytes) into the model.
    fn adopt_base(&mut self) -> Result<(), String> {
        for (name, data) in base_files() {
            if data.len() < 100 {
                continue;
            }
            let path = format!("/base/{name}");
            let st = self.fs.lstat(path.as_bytes()).map_err(|e| format!("{path}: {e}"))?;
            let id = self.new_id();
            self.add(id, ObjKind::File, st.ino, &path);
            self.live += data.len() as u64;
            self.objs.get_mut(&id).expect("just added").content = Content::from_slice(&data);
        }
        Ok(())
    }

    fn overwrite_step(&mut self) -> Result<(), String> {
        let files = self.owned(ObjKind::File);
        let f = self.pick(&files).expect("files made at setup");
        self.overwrite(f)?;
        match self.rng.random_range(0..10) {
            0..=5 => self.fsync(f, false),
            6..=8 => self.fsync(f, true),
            _ => Ok(()),
        }
    }

    fn read_step(&mut self) -> Result<(), String> {
        let files = base_files();
        let (name, want) = self.pick(&files).expect("base files");
        let path = format!("/base/{name}");
        let start = self.rec.position();
        let r = (|| -> Res<bool> {
            match self.rng.random_range(0..3) {
                0 => {
                    let fd = self.p.open(path.as_bytes(), OpenFlags::default())?;
                    let mut buf = vec![0u8; want.len() + 10];
                    let n = self.p.pread(fd, &mut buf, 0)?;
                    self.p.close(fd)?;
                    Ok(buf[..n] == want[..])
                }
                1 => Ok(self.fs.stat(path.as_bytes())?.size == want.len() as u64),
                _ => Ok(!self.fs.read_dir(b"/base/sub")?.is_empty()),
            }
        })();
        self.hist.ops.push(Op {
            desc: format!("read {path}"),
            start,
            end: self.rec.position(),
            flushes: self.rec.flushes(),
            touches: vec![],
            marks: vec![],
            rename: None,
        });
        match r {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!("reading {path} gave other contents than the base image's")),
            Err(e) => Err(format!("reading {path}: {e}")),
        }
    }

    // ---- operations ----

    fn create_in(&mut self, kind: ObjKind, parent: Option<ObjId>) -> Result<(), String> {
        let parent = parent.unwrap_or_else(|| self.pick_parent());
        let letter = match kind {
            ObjKind::File => 'f',
            ObjKind::Dir => 'd',
            ObjKind::Symlink => 's',
        };
        let name = self.new_name(letter);
        let path = join(&self.path(parent), &name);
        let keep_open = self.rng.random_bool(0.5);
        let target = {
            let n = self.rng.random_range(1..=30);
            format!("target-{}-", self.rng.random_range(0..1000))
                .repeat(n)
                .into_bytes()
        };
        let desc = match kind {
            ObjKind::File => format!("create {path}"),
            ObjKind::Dir => format!("mkdir {path}"),
            ObjKind::Symlink => format!("symlink {path} ({} bytes)", target.len()),
        };
        self.op(desc, |w| {
            let id = w.new_id();
            let ino = match kind {
                ObjKind::File => {
                    let fd = w.p.open_as(
                        path.as_bytes(),
                        &OpenRequest::new(OpenFlags {
                            access: Access::ReadWrite,
                            create: true,
                            excl: true,
                            ..Default::default()
                        })
                        .mode(0o644)
                        .cred(&w.cred),
                    )?;
                    if keep_open {
                        w.fds.insert(id, fd);
                    } else {
                        w.p.close(fd)?;
                    }
                    w.fs.lstat(path.as_bytes())?.ino
                }
                ObjKind::Dir => {
                    w.fs.create(&NewInode::dir(path.as_bytes()).mode(0o755).cred(&w.cred))?
                        .ino
                }
                ObjKind::Symlink => {
                    w.fs.create(&NewInode::symlink(path.as_bytes(), &target).owner(0, 0))?
                        .ino
                }
            };
            w.add(id, kind, ino, &path);
            if kind == ObjKind::Symlink {
                w.objs.get_mut(&id).expect("just added").target = target;
            }
            Ok(Effect {
                touches: vec![
                    Touch::Entry { dir: parent, name },
                    Touch::Names {
                        id,
                        paths: vec![path.clone()],
                    },
                ],
                ..Default::default()
            })
        })
    }

    fn pwrite(&mut self, f: ObjId, off: u64, data: Vec<u8>) -> Result<(), String> {
        let path = self.path(f);
        let size = self.objs[&f].content.len() as u64;
        let len = data.len() as u64;
        self.op(format!("pwrite {path} {off}+{len}"), |w| {
            let fd = w.fd(f)?;
            let mut done = 0;
            while done < data.len() {
                done += w.p.pwrite(fd, &data[done..], off + done as u64)?;
            }
            let o = w.objs.get_mut(&f).expect("known file");
            let end = (off + len) as usize;
            if o.content.len() < end {
                w.live += (end - o.content.len()) as u64;
            }
            o.content.write(off as usize, &data);
            Ok(Effect {
                touches: vec![Touch::Data {
                    id: f,
                    lo: off.min(size),
                    hi: off + len,
                }],
                ..Default::default()
            })
        })
    }

    fn overwrite(&mut self, f: ObjId) -> Result<(), String> {
        let size = self.objs[&f].content.len() as u64;
        if size == 0 {
            let data = self.random_bytes(100);
            return self.pwrite(f, 0, data);
        }
        let off = self.rng.random_range(0..size);
        let len = self.rng.random_range(1..=(size - off).min(16384));
        let data = self.random_bytes(len as usize);
        self.pwrite(f, off, data)
    }

    fn truncate(&mut self, f: ObjId) -> Result<(), String> {
        let path = self.path(f);
        let old = self.objs[&f].content.len() as u64;
        let new = match self.rng.random_range(0..4) {
            0 => 0,
            1 => old / 2,
            2 => self.rng.random_range(0..=old),
            _ => (old + self.rng.random_range(0..16384)).min(self.max_file.max(old)),
        };
        self.op(format!("ftruncate {path} {old} -> {new}"), |w| {
            let fd = w.fd(f)?;
            w.p.ftruncate(fd, new)?;
            let o = w.objs.get_mut(&f).expect("known file");
            w.live = w.live - old + new;
            o.content.resize(new as usize);
            Ok(Effect {
                touches: vec![Touch::Data {
                    id: f,
                    lo: old.min(new),
                    hi: u64::MAX,
                }],
                ..Default::default()
            })
        })
    }

    fn fallocate(&mut self, f: ObjId) -> Result<(), String> {
        let path = self.path(f);
        let size = self.objs[&f].content.len() as u64;
        let off = self.rng.random_range(0..=size.min(self.max_file - 1) + 4096);
        let len = self.rng.random_range(1..=32768u64);
        let pick = if self.extents { self.rng.random_range(0..5) } else { 2 };
        let (mode, name) = match pick {
            0 => (0, "allocate"),
            1 => (FALLOC_FL_KEEP_SIZE, "keep-size"),
            2 => (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, "punch-hole"),
            3 => (FALLOC_FL_ZERO_RANGE, "zero-range"),
            _ => (FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, "zero-range keep-size"),
        };
        self.op(format!("fallocate {name} {path} {off}+{len}"), |w| {
            let fd = w.fd(f)?;
            w.p.fallocate(fd, mode, off, len)?;
            let o = w.objs.get_mut(&f).expect("known file");
            let end = off + len;
            let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
            let zero = mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0;
            let new_size = if keep { size } else { size.max(end) };
            if new_size > size {
                o.content.resize(new_size as usize);
                w.live += new_size - size;
            }
            if zero {
                o.content.zero(off as usize, end.min(new_size) as usize);
            }
            let touches = if zero || new_size > size {
                vec![Touch::Data {
                    id: f,
                    lo: off.min(size),
                    hi: end,
                }]
            } else {
                vec![]
            };
            Ok(Effect {
                touches,
                ..Default::default()
            })
        })
    }

    fn rename(&mut self) -> Result<(), String> {
        let home = self.home();
        let cands: Vec<ObjId> = self
            .objs
            .iter()
            .filter(|(id, o)| o.owned && **id != home)
            .map(|(id, _)| *id)
            .collect();
        let Some(src) = self.pick(&cands) else {
            return self.create_in(ObjKind::File, None);
        };
        let kind = self.objs[&src].kind;
        let src_paths: Vec<String> = self.objs[&src].paths.iter().cloned().collect();
        let old = self.pick(&src_paths).expect("a live object has a name");
        let under_old = |p: &str| p == old || p.starts_with(&format!("{old}/"));
        // Replace an existing object, or a new name.
        let victims: Vec<ObjId> = self
            .objs
            .iter()
            .filter(|(id, o)| {
                o.owned
                    && **id != src
                    && **id != home
                    && match (kind, o.kind) {
                        (ObjKind::Dir, ObjKind::Dir) => {
                            let p = o.paths.iter().next().expect("named");
                            self.children(p).is_empty() && !under_old(p) && !old.starts_with(&format!("{p}/"))
                        }
                        (ObjKind::Dir, _) | (_, ObjKind::Dir) => false,
                        _ => true,
                    }
            })
            .map(|(id, _)| *id)
            .collect();
        let victim = if self.rng.random_bool(0.3) {
            self.pick(&victims)
        } else {
            None
        };
        let new = match victim {
            Some(v) => {
                let ps: Vec<String> = self.objs[&v].paths.iter().cloned().collect();
                self.pick(&ps).expect("named")
            }
            None => {
                let mut parent = self.pick_parent();
                if kind == ObjKind::Dir && under_old(&self.path(parent)) {
                    parent = home;
                }
                let letter = match kind {
                    ObjKind::File => 'f',
                    ObjKind::Dir => 'd',
                    ObjKind::Symlink => 's',
                };
                let name = self.new_name(letter);
                join(&self.path(parent), &name)
            }
        };
        let noreplace = victim.is_none() && self.rng.random_bool(0.5);
        self.op(format!("rename {old} -> {new}"), |w| {
            w.fs.rename(
                old.as_bytes(),
                new.as_bytes(),
                RenameFlags {
                    noreplace,
                    ..Default::default()
                },
                &w.cred,
            )?;
            let ino = w.objs[&src].ino;
            let mut touches = vec![
                Touch::Entry {
                    dir: w.by_path[parent_of(&old)],
                    name: base_of(&old).to_string(),
                },
                Touch::Entry {
                    dir: w.by_path[parent_of(&new)],
                    name: base_of(&new).to_string(),
                },
            ];
            if let Some(v) = victim {
                touches.push(w.drop_name(v, &new));
            }
            // Move the object, and everything under it.
            let moved: Vec<(String, ObjId)> = w
                .by_path
                .iter()
                .filter(|(p, _)| **p == old || p.starts_with(&format!("{old}/")))
                .map(|(p, id)| (p.clone(), *id))
                .collect();
            for (p, id) in moved {
                let np = format!("{new}{}", &p[old.len()..]);
                w.by_path.remove(&p);
                w.by_path.insert(np.clone(), id);
                let o = w.objs.get_mut(&id).expect("known object");
                o.paths.remove(&p);
                o.paths.insert(np);
                touches.push(Touch::Names {
                    id,
                    paths: o.paths.iter().cloned().collect(),
                });
            }
            Ok(Effect {
                touches,
                rename: Some(RenameRec {
                    id: src,
                    ino,
                    old: old.clone(),
                    new: new.clone(),
                }),
                ..Default::default()
            })
        })
    }

    fn unlink(&mut self) -> Result<(), String> {
        let mut cands = self.owned(ObjKind::File);
        cands.extend(self.owned(ObjKind::Symlink));
        let Some(id) = self.pick(&cands) else {
            return self.create_in(ObjKind::File, None);
        };
        let ps: Vec<String> = self.objs[&id].paths.iter().cloned().collect();
        let path = self.pick(&ps).expect("named");
        self.op(format!("unlink {path}"), |w| {
            w.fs.unlink(path.as_bytes(), &w.cred)?;
            let t = w.drop_name(id, &path);
            Ok(Effect {
                touches: vec![
                    Touch::Entry {
                        dir: w.by_path[parent_of(&path)],
                        name: base_of(&path).to_string(),
                    },
                    t,
                ],
                ..Default::default()
            })
        })
    }

    fn rmdir(&mut self) -> Result<(), String> {
        let home = self.home();
        let cands: Vec<ObjId> = self
            .owned(ObjKind::Dir)
            .into_iter()
            .filter(|&d| d != home && self.children(&self.path(d)).is_empty())
            .collect();
        let Some(id) = self.pick(&cands) else {
            return self.create_in(ObjKind::Dir, None);
        };
        let path = self.path(id);
        self.op(format!("rmdir {path}"), |w| {
            w.fs.rmdir(path.as_bytes(), &w.cred)?;
            let t = w.drop_name(id, &path);
            Ok(Effect {
                touches: vec![
                    Touch::Entry {
                        dir: w.by_path[parent_of(&path)],
                        name: base_of(&path).to_string(),
                    },
                    t,
                ],
                ..Default::default()
            })
        })
    }

    fn link(&mut self, f: ObjId) -> Result<(), String> {
        let old = self.path(f);
        let parent = self.pick_parent();
        let name = self.new_name('l');
        let new = join(&self.path(parent), &name);
        self.op(format!("link {old} {new}"), |w| {
            w.fs.link(old.as_bytes(), new.as_bytes(), &w.cred)?;
            w.by_path.insert(new.clone(), f);
            let o = w.objs.get_mut(&f).expect("known file");
            o.paths.insert(new.clone());
            Ok(Effect {
                touches: vec![
                    Touch::Entry { dir: parent, name },
                    Touch::Names {
                        id: f,
                        paths: o.paths.iter().cloned().collect(),
                    },
                ],
                ..Default::default()
            })
        })
    }

    fn xattr_target(&mut self) -> Option<ObjId> {
        let mut c = self.owned(ObjKind::File);
        c.extend(self.owned(ObjKind::Dir));
        self.pick(&c)
    }

    fn setxattr(&mut self) -> Result<(), String> {
        let Some(id) = self.xattr_target() else {
            return self.create_in(ObjKind::File, None);
        };
        let path = self.path(id);
        let name = format!("user.k{}", self.rng.random_range(0..4)).into_bytes();
        let used: usize = self.objs[&id]
            .xattrs
            .iter()
            .filter(|(k, _)| **k != name)
            .map(|(k, v)| k.len() + v.len() + 24)
            .sum();
        // Keep every object's xattrs within one 1 KiB block.
        let room = 700usize.saturating_sub(used);
        let len = if self.rng.random_bool(0.2) {
            self.rng.random_range(0..=room.min(500))
        } else {
            self.rng.random_range(0..=room.min(40))
        };
        let value = self.random_bytes(len);
        self.op(
            format!("setxattr {path} {} ({len} bytes)", String::from_utf8_lossy(&name)),
            |w| {
                w.fs.setxattr(path.as_bytes(), &name, &value, 0, &w.cred)?;
                w.objs.get_mut(&id).expect("known").xattrs.insert(name, value);
                Ok(Effect {
                    touches: vec![Touch::Xattr { id }],
                    ..Default::default()
                })
            },
        )
    }

    fn removexattr(&mut self) -> Result<(), String> {
        let cands: Vec<(ObjId, Vec<u8>)> = self
            .objs
            .iter()
            .filter(|(_, o)| o.owned)
            .flat_map(|(id, o)| o.xattrs.keys().map(move |k| (*id, k.clone())))
            .collect();
        let Some((id, name)) = self.pick(&cands) else {
            return self.setxattr();
        };
        let path = self.path(id);
        self.op(format!("removexattr {path} {}", String::from_utf8_lossy(&name)), |w| {
            w.fs.removexattr(path.as_bytes(), &name, &w.cred)?;
            w.objs.get_mut(&id).expect("known").xattrs.remove(&name);
            Ok(Effect {
                touches: vec![Touch::Xattr { id }],
                ..Default::default()
            })
        })
    }

    fn fsync(&mut self, f: ObjId, data_only: bool) -> Result<(), String> {
        let path = self.path(f);
        let what = if data_only { "fdatasync" } else { "fsync" };
        self.op(format!("{what} {path}"), |w| {
            let fd = w.fd(f)?;
            if data_only {
                w.p.fdatasync(fd)?;
            } else {
                w.p.fsync(fd)?;
            }
            Ok(Effect {
                marks: vec![w.mark(f, !data_only)],
                ..Default::default()
            })
        })
    }

    fn fsync_dir(&mut self) -> Result<(), String> {
        let mut dirs = self.owned(ObjKind::Dir);
        if self.objs.contains_key(&SHARED) {
            dirs.push(SHARED);
        }
        let d = self.pick(&dirs).expect("home exists");
        let path = self.path(d);
        self.op(format!("fsync dir {path}"), |w| {
            let fd = w.p.open(
                path.as_bytes(),
                OpenFlags {
                    directory: true,
                    ..Default::default()
                },
            )?;
            let r = w.p.fsync(fd);
            w.p.close(fd)?;
            r?;
            Ok(Effect {
                marks: vec![w.mark(d, true)],
                ..Default::default()
            })
        })
    }

    fn close_some(&mut self) -> Result<(), String> {
        if !self.orphans.is_empty() && self.rng.random_bool(0.5) {
            let fd = self.orphans.remove(0);
            return self.op("close an unlinked file".into(), |w| {
                w.p.close(fd)?;
                Ok(Effect::default())
            });
        }
        let open: Vec<ObjId> = self.fds.keys().copied().collect();
        let Some(id) = self.pick(&open) else { return Ok(()) };
        let path = self.path(id);
        self.op(format!("close {path}"), |w| {
            let fd = w.fds.remove(&id).expect("open");
            w.p.close(fd)?;
            Ok(Effect::default())
        })
    }

    fn sync(&mut self) -> Result<(), String> {
        self.op("sync".into(), |w| {
            w.fs.sync()?;
            Ok(Effect {
                marks: w.marks_all(),
                ..Default::default()
            })
        })
    }
}
