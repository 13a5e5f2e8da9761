//! The full-tree walk: everything a reader of an image can ask the engine,
//! for every object reachable from the root.
//!
//! Every directory is listed (`read_dir_ino`), every inode is stat'ed, its
//! xattrs and data layout fetched, regular files are read through `pread`
//! (hopping over holes with SEEK_DATA/SEEK_HOLE, so a hostile 2^60-byte
//! size costs nothing), symlinks are read and followed, and every name
//! found is looked up again by path (`resolve`), which drives the htree
//! lookup path rather than only readdir. The forensic readers see the
//! damage too: each directory's removed names (`deleted_entries`) and,
//! last, every record of the inode tables (`inode_table`). A visited set keeps directory
//! cycles (a mutated entry pointing at an ancestor) from looping, and
//! caps bound the work per file and per image, so any hang is the engine's.
//!
//! Errors are the expected outcome on a damaged image and are counted by
//! kind. What is never acceptable besides a panic is a broken API
//! contract (SEEK_DATA moving backwards, `pread` returning more than asked
//! or 0 before the end of file): those are collected as
//! [`WalkReport::violations`].

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hasher};

use ext4kit::{Errno, Error, FileType, Fs, OpenFlags, Whence};
use ext4kit_format::FormatError;

use crate::prng::Rng;

/// The root directory's inode.
pub const ROOT_INO: u32 = 2;

/// Caps that keep a walk bounded on any image.
#[derive(Debug, Clone)]
pub struct WalkLimits {
    /// Bytes read from one file.
    pub max_file_bytes: u64,
    /// Bytes read in the whole walk.
    pub max_total_bytes: u64,
    /// SEEK_DATA steps (data runs visited) per file.
    pub max_seek_steps: usize,
    /// Distinct inodes visited.
    pub max_inodes: usize,
    /// Path lookups per directory.
    pub max_resolves_per_dir: usize,
    /// Inode-table records read by the final table scan.
    pub max_table_records: usize,
    /// When set, each directory's entries are processed in an order
    /// shuffled with this seed (concurrent walkers then collide less
    /// predictably); results are keyed by path, so they do not depend on it.
    pub order_seed: Option<u64>,
}

impl Default for WalkLimits {
    fn default() -> Self {
        WalkLimits {
            max_file_bytes: 1 << 20,
            max_total_bytes: 64 << 20,
            max_seek_steps: 256,
            max_inodes: 50_000,
            max_resolves_per_dir: 5_000,
            max_table_records: 200_000,
            order_seed: None,
        }
    }
}

/// What one walk saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkReport {
    /// Directories listed successfully.
    pub dirs: u64,
    /// Names seen (excluding "." and "..").
    pub entries: u64,
    /// Inodes stat'ed successfully.
    pub inodes: u64,
    /// Regular files read.
    pub files_read: u64,
    /// Bytes returned by `pread`.
    pub bytes_read: u64,
    /// Symlink targets read.
    pub symlinks: u64,
    /// Extended attributes listed.
    pub xattrs: u64,
    /// Successful path lookups.
    pub resolves: u64,
    /// Lookups by path that found a different inode than the directory
    /// listing, or whose `d_path` differs from the path looked up
    /// (legitimate on damaged images with duplicate names or names holding
    /// '/'; never on a clean one).
    pub resolve_mismatches: u64,
    /// Symlinks whose target could not be followed for a POSIX reason
    /// (dangling, loop): expected, not an error.
    pub follow_failures: u64,
    /// Removed names found in directory blocks (`Fs::deleted_entries`).
    pub deleted_names: u64,
    /// Inode-table records read (`Fs::inode_table`).
    pub table_records: u64,
    /// Errors by kind ("read_dir: corrupt directory entry", ...).
    pub errors: BTreeMap<String, u64>,
    /// The first few error messages, with the path they occurred on.
    pub error_samples: Vec<String>,
    /// Broken API contracts (always bugs, damaged image or not).
    pub violations: Vec<String>,
    /// A cap was reached.
    pub capped: bool,
}

impl WalkReport {
    /// Total errors.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    fn error(&mut self, op: &str, path: &[u8], e: &Error) {
        *self.errors.entry(error_kind(op, e)).or_default() += 1;
        if self.error_samples.len() < 20 {
            self.error_samples.push(format!("{op} {}: {e}", String::from_utf8_lossy(path)));
        }
    }

    fn violation(&mut self, msg: String) {
        if self.violations.len() < 20 {
            self.violations.push(msg);
        }
    }
}

/// A stable name for an error's kind: operation, then the error class and,
/// for corruption, the structure that was found broken.
pub fn error_kind(op: &str, e: &Error) -> String {
    match e {
        Error::Posix { errno, .. } => format!("{op}: {errno:?}"),
        Error::Io { .. } => format!("{op}: I/O"),
        Error::Corrupt { source: FormatError::Corrupt { structure, .. }, .. } => format!("{op}: corrupt {structure}"),
        Error::Corrupt { source: FormatError::Checksum { structure, .. }, .. } => format!("{op}: checksum {structure}"),
        Error::Unsupported(_) => format!("{op}: unsupported"),
    }
}

/// Everything a walk can observe, keyed by path: the value describes the
/// inode (stat, content hash, link target, xattrs, data layout). Two walks
/// of one image must produce equal digests, whatever the interleaving.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeDigest {
    /// Path → "inode N: description".
    pub entries: BTreeMap<Vec<u8>, String>,
}

impl TreeDigest {
    /// The first path where two digests differ, with both descriptions.
    pub fn first_difference(&self, other: &TreeDigest) -> Option<String> {
        let keys: std::collections::BTreeSet<&Vec<u8>> = self.entries.keys().chain(other.entries.keys()).collect();
        for k in keys {
            let (a, b) = (self.entries.get(k), other.entries.get(k));
            if a != b {
                return Some(format!("{}:\n  left:  {a:?}\n  right: {b:?}", String::from_utf8_lossy(k)));
            }
        }
        None
    }
}

/// Walk `fs` with default limits.
pub fn walk(fs: &Fs) -> WalkReport {
    walk_with(fs, &WalkLimits::default(), None)
}

struct Walker<'a> {
    fs: &'a Fs,
    lim: &'a WalkLimits,
    rep: WalkReport,
    bytes_left: u64,
    /// Inode → description (for the digest); also the visited set.
    seen: HashMap<u32, Option<String>>,
    want_digest: bool,
    buf: Vec<u8>,
}

/// Walk `fs`, filling `digest` when given.
pub fn walk_with(fs: &Fs, lim: &WalkLimits, digest: Option<&mut TreeDigest>) -> WalkReport {
    let mut w = Walker {
        fs,
        lim,
        rep: WalkReport::default(),
        bytes_left: lim.max_total_bytes,
        seen: HashMap::new(),
        want_digest: digest.is_some(),
        buf: vec![0; 64 * 1024],
    };
    let mut out = BTreeMap::new();
    let mut rng = lim.order_seed.map(Rng::new);
    let root_desc = w.visit_inode(ROOT_INO, b"/");
    out.insert(b"/".to_vec(), format!("inode {ROOT_INO}: {}", root_desc.unwrap_or_default()));
    let mut dirs_seen: HashSet<u32> = HashSet::from([ROOT_INO]);
    let mut queue: VecDeque<(u32, Vec<u8>)> = VecDeque::from([(ROOT_INO, b"/".to_vec())]);
    while let Some((dino, dpath)) = queue.pop_front() {
        let mut entries = match fs.read_dir(dino) {
            Ok(v) => v,
            Err(e) => {
                w.rep.error("read_dir", &dpath, &e);
                continue;
            }
        };
        w.rep.dirs += 1;
        match fs.deleted_entries(dino) {
            Ok(v) => w.rep.deleted_names += v.len() as u64,
            Err(e) => w.rep.error("deleted_entries", &dpath, &e),
        }
        if let Some(r) = rng.as_mut() {
            r.shuffle(&mut entries);
        }
        let mut resolves = 0;
        for e in entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            w.rep.entries += 1;
            let mut path = dpath.clone();
            if path.len() > 1 {
                path.push(b'/');
            }
            path.extend_from_slice(&e.name);
            if resolves < lim.max_resolves_per_dir {
                resolves += 1;
                match fs.resolve(ext4kit::Target::path(&path).nofollow()) {
                    Ok(d) => {
                        w.rep.resolves += 1;
                        // d_path walks the dentry parent chain back up: it
                        // must give the path we came down.
                        if d.ino != e.ino || fs.d_path(&d) != path {
                            w.rep.resolve_mismatches += 1;
                        }
                    }
                    Err(err) => w.rep.error("resolve", &path, &err),
                }
            } else {
                w.rep.capped = true;
            }
            let desc = if let Some(d) = w.seen.get(&e.ino) {
                d.clone()
            } else if w.seen.len() >= lim.max_inodes {
                w.rep.capped = true;
                None
            } else {
                let d = w.visit_inode(e.ino, &path);
                w.seen.insert(e.ino, d.clone());
                d
            };
            if w.want_digest {
                out.insert(path.clone(), format!("inode {}: {}", e.ino, desc.clone().unwrap_or_default()));
            }
            // Descend by the inode's own type, not the entry's (which may lie).
            let is_dir = fs.inode(e.ino).map(|i| i.ftype == FileType::Directory).unwrap_or(false);
            if is_dir && dirs_seen.insert(e.ino) {
                queue.push_back((e.ino, path));
            }
        }
    }
    for r in fs.inode_table().take(lim.max_table_records) {
        match r {
            Ok(r) => {
                w.rep.table_records += 1;
                // Every verdict is computed from the record alone: none may panic.
                let _ = (r.in_use(), r.looks_intact(), r.dtime(), r.check());
            }
            Err(e) => {
                w.rep.error("inode_table", b"", &e);
                break;
            }
        }
    }
    if let Some(d) = digest {
        d.entries = out;
    }
    w.rep
}

impl Walker<'_> {
    /// Everything about one inode; returns its description for the digest.
    fn visit_inode(&mut self, ino: u32, path: &[u8]) -> Option<String> {
        let fs = self.fs;
        let st = match fs.stat(ino) {
            Ok(s) => s,
            Err(e) => {
                self.rep.error("stat", path, &e);
                return Some(format!("stat error {}", error_kind("stat", &e)));
            }
        };
        self.rep.inodes += 1;
        let mut desc = String::new();
        if self.want_digest {
            let _ = write!(desc, "{st:?}");
        }
        match fs.xattrs(ino) {
            Ok(mut x) => {
                self.rep.xattrs += x.len() as u64;
                if self.want_digest {
                    x.sort();
                    for (n, v) in x {
                        let _ = write!(desc, " xattr {}={}", String::from_utf8_lossy(&n), hash_bytes(&v));
                    }
                }
            }
            Err(e) => self.rep.error("xattrs", path, &e),
        }
        match fs.data_layout(ino) {
            Ok(l) => {
                if self.want_digest {
                    let _ = write!(desc, " layout {} {:?}", l.kind, l.runs);
                }
            }
            Err(e) => self.rep.error("data_layout", path, &e),
        }
        match st.ftype {
            FileType::Regular => {
                let h = self.read_file(ino, st.size, path);
                let _ = write!(desc, " data {h:016x}");
            }
            FileType::Symlink => {
                match fs.read_link(ino) {
                    Ok(t) => {
                        self.rep.symlinks += 1;
                        let _ = write!(desc, " -> {}", String::from_utf8_lossy(&t));
                    }
                    Err(e) => self.rep.error("read_link", path, &e),
                }
                match fs.resolve(path) {
                    Ok(_) => {}
                    Err(Error::Posix { .. }) => self.rep.follow_failures += 1,
                    Err(e) => self.rep.error("follow", path, &e),
                }
            }
            FileType::Directory => {
                if let Err(e) = fs.open(ino, OpenFlags { directory: true, ..Default::default() }) {
                    self.rep.error("open_dir", path, &e);
                }
            }
            _ => {}
        }
        Some(desc)
    }

    /// Read a regular file's data runs; returns a hash of (offset, bytes).
    fn read_file(&mut self, ino: u32, size: u64, path: &[u8]) -> u64 {
        let fs = self.fs;
        let mut h = DefaultHasher::new();
        let f = match fs.open(ino, OpenFlags::default()) {
            Ok(f) => f,
            Err(e) => {
                self.rep.error("open", path, &e);
                return 0;
            }
        };
        self.rep.files_read += 1;
        // One plain read at 0 and one at the last byte, whatever the holes.
        for off in [0, size.saturating_sub(1)] {
            if off < size {
                let n = self.buf.len().min(4096);
                match fs.pread(&f, off, &mut self.buf[..n]) {
                    Ok(k) if k > n => self.rep.violation(format!("pread of {n} at {off} returned {k} (inode {ino})")),
                    Ok(0) => self.rep.violation(format!("pread at {off} < size {size} returned 0 (inode {ino})")),
                    Ok(_) => {}
                    Err(e) => self.rep.error("pread", path, &e),
                }
            }
        }
        let mut budget = self.lim.max_file_bytes.min(self.bytes_left);
        let mut off = 0u64;
        let mut steps = 0;
        while off < size && budget > 0 {
            if steps >= self.lim.max_seek_steps || off > i64::MAX as u64 {
                self.rep.capped = true;
                break;
            }
            steps += 1;
            let data = match fs.lseek(&f, off as i64, Whence::Data) {
                Ok(d) => d,
                Err(e) if e.errno() == Errno::ENXIO => break,
                Err(e) => {
                    self.rep.error("seek_data", path, &e);
                    break;
                }
            };
            if data < off || data >= size {
                self.rep.violation(format!("SEEK_DATA from {off} returned {data} (size {size}, inode {ino})"));
                break;
            }
            let hole = match fs.lseek(&f, data as i64, Whence::Hole) {
                Ok(x) if x <= data || x > size => {
                    self.rep
                        .violation(format!("SEEK_HOLE from data at {data} returned {x} (size {size}, inode {ino})"));
                    break;
                }
                Ok(x) => x,
                Err(e) => {
                    self.rep.error("seek_hole", path, &e);
                    size
                }
            };
            let end = hole.min(data.saturating_add(budget));
            let mut pos = data;
            while pos < end {
                let n = ((end - pos) as usize).min(self.buf.len());
                match fs.pread(&f, pos, &mut self.buf[..n]) {
                    Ok(0) => {
                        self.rep.violation(format!("pread at {pos} < size {size} returned 0 (inode {ino})"));
                        break;
                    }
                    Ok(k) if k > n => {
                        self.rep.violation(format!("pread of {n} at {pos} returned {k} (inode {ino})"));
                        break;
                    }
                    Ok(k) => {
                        h.write_u64(pos);
                        h.write(&self.buf[..k]);
                        pos += k as u64;
                    }
                    Err(e) => {
                        self.rep.error("pread", path, &e);
                        break;
                    }
                }
            }
            let got = pos - data;
            self.rep.bytes_read += got;
            self.bytes_left = self.bytes_left.saturating_sub(got);
            budget = budget.saturating_sub(got);
            off = hole;
        }
        if budget == 0 {
            self.rep.capped = true;
        }
        h.finish()
    }
}

fn hash_bytes(b: &[u8]) -> String {
    let mut h = DefaultHasher::new();
    h.write(b);
    format!("{}:{:016x}", b.len(), h.finish())
}
