//! What a workload promised, and the check of a crash image against it.
//!
//! A workload thread keeps a [`History`]: one [`Op`] per operation, with
//! the recording device's log position before it started (`start`) and
//! after it returned (`end`), the flush count when it returned
//! (`flushes`), what it may have changed ([`Touch`]) and what it made
//! durable ([`Mark`]: fsync, fdatasync, fsync of a directory, sync).
//! Threads own their names (each name a thread creates starts with its
//! prefix) and their objects, so each history is deterministic however
//! the threads interleave, and each is checked on its own.
//!
//! ## What must hold in a crash image
//!
//! A crash image is cut at log position `P` after `D` flushes completed
//! ([`ext4kit_blockdev::CrashPoint`]). For a history:
//!
//! - **Valid marks.** A mark made by an op whose `flushes <= D` holds: the
//!   fsync (or sync) returned after its flush, and that flush is in the
//!   image's durable prefix. For each object the latest valid mark is the
//!   promise.
//! - **Later ops.** An op that *started* before `P` (`start < P`) may or may
//!   not have reached the image, wholly or partly; an op starting at or
//!   after `P` cannot have (none of its writes precede `P`). So the promise
//!   is exact unless a later op touching the object started before `P`, and
//!   is then a lower bound:
//!   - a file whose last name was removed is not checked;
//!   - names (promised by fsync, fsync of a directory and sync — not by
//!     fdatasync, which like the kernel's need not commit a rename or link):
//!     with no later name change the object is at every path of the latest
//!     mark promising names; otherwise at one at least of those paths and
//!     the paths later operations gave it;
//!   - bytes: with no later data change the file's size and bytes equal the
//!     mark's; otherwise every byte below the mark's size that no later
//!     operation's range covers (a truncation covers everything from the new
//!     size on) is still there with the mark's value — so bytes appended
//!     after an fsync never cost the fsync'd ones;
//!   - xattrs (fsync and sync marks, not fdatasync): equal unless changed
//!     later; a symlink's target: equal;
//!   - a directory's entries (fsync of the directory, sync): every own name
//!     the mark lists is there with the same inode, and no own name the
//!     mark lacks is there, except names later operations touched.
//! - **Renames.** A rename of an object whose latest valid mark promising
//!   names predates the rename and lists the old path, with no other name change of the
//!   object and no directory moved since that mark, and that started before
//!   `P`: exactly one of the old and new paths holds the object (by inode
//!   number) — never neither, never both.
//!
//! What is *not* promised, so not checked: anything about an op that
//! started before `P` and was not followed by a valid mark (it may be lost
//! or partial — but the image must still be consistent, which e2fsck
//! judges), atimes, and which of the candidate names holds a renamed
//! object beyond the atomicity rule.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use crate::tree::{children, Data, Node, NodeKind, Tree};

/// A workload object (file, directory, symlink), unique within a run.
pub type ObjId = u64;

/// What an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
}

/// Bytes per chunk of [`Content`].
const CHUNK: usize = 4096;

/// File contents as shared 4 KiB chunks: every mark keeps the version it
/// promised, and a later write copies only the chunks it changes, so a
/// long fsx-style run keeping a version per fsync stays small. Bytes past
/// `len` in the last chunk are zero; zero chunks (holes, extensions) share
/// one allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Content {
    len: usize,
    chunks: Vec<Arc<Vec<u8>>>,
}

fn zero_chunk() -> Arc<Vec<u8>> {
    static ZERO: std::sync::OnceLock<Arc<Vec<u8>>> = std::sync::OnceLock::new();
    ZERO.get_or_init(|| Arc::new(vec![0; CHUNK])).clone()
}

impl Content {
    /// Contents holding `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut c = Content::default();
        c.write(0, bytes);
        c
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for c in &self.chunks {
            v.extend_from_slice(c);
        }
        v.truncate(self.len);
        v
    }

    /// Byte `i` (`None` past the end).
    pub fn get(&self, i: usize) -> Option<u8> {
        (i < self.len).then(|| self.chunks[i / CHUNK][i % CHUNK])
    }

    /// Set the length: cut (the bytes dropped read as zero if it grows
    /// again) or extend with zeros.
    pub fn resize(&mut self, len: usize) {
        if len < self.len {
            self.chunks.truncate(len.div_ceil(CHUNK));
            if !len.is_multiple_of(CHUNK) {
                let last = Arc::make_mut(self.chunks.last_mut().expect("a partial chunk"));
                last[len % CHUNK..].fill(0);
            }
        } else {
            self.chunks.resize_with(len.div_ceil(CHUNK), zero_chunk);
        }
        self.len = len;
    }

    /// Write `data` at `off`, extending with zeros as needed.
    pub fn write(&mut self, off: usize, data: &[u8]) {
        let end = off + data.len();
        if end > self.len {
            self.resize(end);
        }
        let mut at = off;
        while at < end {
            let (k, o) = (at / CHUNK, at % CHUNK);
            let n = (CHUNK - o).min(end - at);
            Arc::make_mut(&mut self.chunks[k])[o..o + n].copy_from_slice(&data[at - off..at - off + n]);
            at += n;
        }
    }

    /// Zero bytes `a..b` (within the length).
    pub fn zero(&mut self, a: usize, b: usize) {
        let b = b.min(self.len);
        let mut at = a;
        while at < b {
            let (k, o) = (at / CHUNK, at % CHUNK);
            let n = (CHUNK - o).min(b - at);
            if n == CHUNK {
                self.chunks[k] = zero_chunk();
            } else {
                Arc::make_mut(&mut self.chunks[k])[o..o + n].fill(0);
            }
            at += n;
        }
    }
}

/// What an operation may have changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touch {
    /// Bytes `lo..hi` of a file (`hi == u64::MAX`: to the end, and the
    /// size).
    Data {
        /// The file.
        id: ObjId,
        /// First byte.
        lo: u64,
        /// End (exclusive).
        hi: u64,
    },
    /// The object's names changed; these are its paths afterwards.
    Names {
        /// The object.
        id: ObjId,
        /// Its paths after the operation.
        paths: Vec<String>,
    },
    /// The object's last name was removed.
    Gone {
        /// The object.
        id: ObjId,
    },
    /// The entry `name` of directory `dir` was added, removed or replaced.
    Entry {
        /// The directory.
        dir: ObjId,
        /// The name.
        name: String,
    },
    /// Extended attributes changed.
    Xattr {
        /// The object.
        id: ObjId,
    },
}

/// A durability promise about one object (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// The object.
    pub id: ObjId,
    /// Its inode number.
    pub ino: u32,
    /// Its kind.
    pub kind: ObjKind,
    /// Its paths when the mark was made.
    pub paths: Vec<String>,
    /// Whether the paths are promised (fsync, fsync of a directory, sync);
    /// fdatasync promises the bytes only: the kernel's commits up to the
    /// inode's last data-relevant change, which a rename or link is not.
    pub names: bool,
    /// A file's contents.
    pub content: Option<Content>,
    /// A symlink's target.
    pub target: Option<Vec<u8>>,
    /// Extended attributes, when promised (not by fdatasync).
    pub xattrs: Option<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// A directory's own entries (name to inode), when promised (fsync of
    /// the directory, sync).
    pub entries: Option<BTreeMap<String, u32>>,
}

/// A rename to check for atomicity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenameRec {
    /// The object renamed.
    pub id: ObjId,
    /// Its inode number.
    pub ino: u32,
    /// The old path.
    pub old: String,
    /// The new path.
    pub new: String,
}

/// One operation of a workload thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// What it was, for messages (`rename /t0_h/t0_f3 -> /s_shared/t0_f9`).
    pub desc: String,
    /// Log position before it started.
    pub start: u64,
    /// Log position after it returned.
    pub end: u64,
    /// Flush count when it returned.
    pub flushes: u64,
    /// What it may have changed.
    pub touches: Vec<Touch>,
    /// What it made durable.
    pub marks: Vec<Mark>,
    /// A rename it performed.
    pub rename: Option<RenameRec>,
}

/// The operations of one workload thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// Who (`thread 0`, `setup`).
    pub name: String,
    /// Every name this history creates starts with it; directory checks
    /// look at these names only.
    pub prefix: String,
    /// In order.
    pub ops: Vec<Op>,
}

/// Kinds of crash-check failure, in the order the summary lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailKind {
    /// `qemu-img check` finds the container file corrupt (exit 2) or
    /// cannot check it — the crash image itself, or after ext4kit's
    /// replay wrote to it; or qemu-img cannot convert it. Leaked clusters
    /// alone (exit 3) are no failure.
    Container,
    /// ext4kit's format layer reads another guest disk from the crash
    /// image's container than `qemu-img convert` does, or cannot read it.
    ContainerRead,
    /// ext4kit could not open the raw crash image read-only (replaying in
    /// memory) or list its tree.
    RoOpen,
    /// A file of the read-only view could not be read.
    RoRead,
    /// ext4kit could not open the crash image read-write (replaying on
    /// disk), list it, or close it.
    RwOpen,
    /// `e2fsck -fn` complained after ext4kit's read-write open and close.
    Fsck,
    /// `e2fsck -fy` on the raw crash image failed (exit 4 or more, or a
    /// timeout), or its result could not be read.
    E2fsckFailed,
    /// `e2fsck -fy`'s replay and repair reached a different tree than
    /// ext4kit's read-only view.
    E2fsckTree,
    /// ext4kit's read-write replay reached a different tree than its
    /// read-only view.
    RwTree,
    /// An fsync'd file (or symlink, or directory) is not where it must be.
    FsyncLost,
    /// An fsync'd file's bytes or size differ.
    FsyncData,
    /// An fsync'd file's xattrs differ.
    FsyncXattr,
    /// An fsync'd directory lost an entry or holds a wrong inode under it.
    DirEntryLost,
    /// An fsync'd directory holds a name it must not.
    DirEntryStale,
    /// A rename left neither name.
    RenameNeither,
    /// A rename left both names.
    RenameBoth,
}

impl FailKind {
    /// Every kind, in order.
    pub const ALL: [FailKind; 16] = [
        FailKind::Container,
        FailKind::ContainerRead,
        FailKind::RoOpen,
        FailKind::RoRead,
        FailKind::RwOpen,
        FailKind::Fsck,
        FailKind::E2fsckFailed,
        FailKind::E2fsckTree,
        FailKind::RwTree,
        FailKind::FsyncLost,
        FailKind::FsyncData,
        FailKind::FsyncXattr,
        FailKind::DirEntryLost,
        FailKind::DirEntryStale,
        FailKind::RenameNeither,
        FailKind::RenameBoth,
    ];

    /// Short name (tables, file names).
    pub fn name(self) -> &'static str {
        match self {
            FailKind::Container => "container-corrupt",
            FailKind::ContainerRead => "container-read-differs",
            FailKind::RoOpen => "ro-open",
            FailKind::RoRead => "ro-read",
            FailKind::RwOpen => "rw-open",
            FailKind::Fsck => "e2fsck-after-replay",
            FailKind::E2fsckFailed => "e2fsck-fy-failed",
            FailKind::E2fsckTree => "e2fsck-tree-differs",
            FailKind::RwTree => "rw-tree-differs",
            FailKind::FsyncLost => "fsync-lost",
            FailKind::FsyncData => "fsync-data",
            FailKind::FsyncXattr => "fsync-xattr",
            FailKind::DirEntryLost => "dir-entry-lost",
            FailKind::DirEntryStale => "dir-entry-stale",
            FailKind::RenameNeither => "rename-neither",
            FailKind::RenameBoth => "rename-both",
        }
    }

    /// One line on what it means.
    pub fn meaning(self) -> &'static str {
        match self {
            FailKind::Container => "qemu-img check finds the container corrupt (crash image, or after our replay)",
            FailKind::ContainerRead => "ext4kit reads another guest disk from the container than qemu-img",
            FailKind::RoOpen => "ext4kit cannot open the crash image read-only (in-memory replay) or list it",
            FailKind::RoRead => "a file of the crash image cannot be read",
            FailKind::RwOpen => "ext4kit cannot open, list or close the crash image read-write (replay on disk)",
            FailKind::Fsck => "e2fsck -fn complains after ext4kit's replay",
            FailKind::E2fsckFailed => "e2fsck -fy cannot repair the raw crash image",
            FailKind::E2fsckTree => "e2fsck -fy's replay+repair reaches another tree than ext4kit's view",
            FailKind::RwTree => "ext4kit's on-disk replay reaches another tree than its in-memory one",
            FailKind::FsyncLost => "an fsync'd object is missing from its path",
            FailKind::FsyncData => "an fsync'd file lost bytes (size or contents)",
            FailKind::FsyncXattr => "an fsync'd file's xattrs differ",
            FailKind::DirEntryLost => "an fsync'd directory lost an entry",
            FailKind::DirEntryStale => "an fsync'd directory holds a name removed before the fsync",
            FailKind::RenameNeither => "a rename left neither the old nor the new name",
            FailKind::RenameBoth => "a rename left both names",
        }
    }

    /// Whether the kind is about e2fsck / replay consistency (as opposed to
    /// a broken durability promise).
    pub fn is_consistency(self) -> bool {
        matches!(
            self,
            FailKind::Container
                | FailKind::ContainerRead
                | FailKind::RoOpen
                | FailKind::RoRead
                | FailKind::RwOpen
                | FailKind::Fsck
                | FailKind::E2fsckFailed
                | FailKind::E2fsckTree
                | FailKind::RwTree
        )
    }
}

impl fmt::Display for FailKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One failed check of one crash image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Which check.
    pub kind: FailKind,
    /// What was found (may span lines).
    pub detail: String,
    /// For [`FailKind::FsyncData`]: fsync'd bytes missing or changed.
    pub lost_bytes: u64,
}

impl Failure {
    /// A failure of `kind` saying `detail`.
    pub fn new(kind: FailKind, detail: impl Into<String>) -> Self {
        Failure {
            kind,
            detail: detail.into(),
            lost_bytes: 0,
        }
    }
}

/// Where the crash fell, as the promise check needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutView {
    /// Log position of the cut: ops starting here or later did not happen.
    pub end: u64,
    /// Flushes completed: marks with `flushes <= this` hold.
    pub flushes: u64,
}

/// What later ops (after the mark, started before the cut) did to one
/// object.
#[derive(Debug, Default)]
struct Later<'a> {
    data: Vec<(u64, u64)>,
    names: Vec<&'a [String]>,
    name_ops: BTreeSet<usize>,
    gone: bool,
    xattr: bool,
}

/// Check every promise of `h` in `tree` (the crash image as read after
/// replay), appending failures to `out`.
pub fn check_promises(h: &History, tree: &Tree, cut: CutView, out: &mut Vec<Failure>) {
    // Ops that may have touched the image: a prefix (starts increase).
    let started = h.ops.iter().take_while(|o| o.start < cut.end).count();
    // The latest valid mark of each object: (op index, mark); and the
    // latest that promises names.
    let mut latest: HashMap<ObjId, (usize, &Mark)> = HashMap::new();
    let mut latest_named: HashMap<ObjId, (usize, &Mark)> = HashMap::new();
    for (i, op) in h.ops.iter().enumerate() {
        if op.marks.is_empty() || op.flushes > cut.flushes {
            continue;
        }
        for m in &op.marks {
            latest.insert(m.id, (i, m));
            if m.names {
                latest_named.insert(m.id, (i, m));
            }
        }
    }
    // Touches of ops that started before the cut, by object / directory.
    let mut by_obj: HashMap<ObjId, Vec<(usize, &Touch)>> = HashMap::new();
    let mut by_dir: HashMap<ObjId, Vec<(usize, &str)>> = HashMap::new();
    let mut dir_moves: Vec<usize> = Vec::new();
    let dirs: BTreeSet<ObjId> = h
        .ops
        .iter()
        .flat_map(|o| o.marks.iter())
        .filter(|m| m.kind == ObjKind::Dir)
        .map(|m| m.id)
        .collect();
    for (j, op) in h.ops[..started].iter().enumerate() {
        for t in &op.touches {
            match t {
                Touch::Data { id, .. } | Touch::Gone { id } | Touch::Xattr { id } => {
                    by_obj.entry(*id).or_default().push((j, t))
                }
                Touch::Names { id, .. } => {
                    by_obj.entry(*id).or_default().push((j, t));
                    if dirs.contains(id) {
                        dir_moves.push(j);
                    }
                }
                Touch::Entry { dir, name } => by_dir.entry(*dir).or_default().push((j, name.as_str())),
            }
        }
    }
    let later = |id: ObjId, after: usize| -> Later<'_> {
        let mut l = Later::default();
        for &(j, t) in by_obj.get(&id).map_or(&[][..], |v| v.as_slice()) {
            if j <= after {
                continue;
            }
            match t {
                Touch::Data { lo, hi, .. } => l.data.push((*lo, *hi)),
                Touch::Names { paths, .. } => {
                    l.names.push(paths);
                    l.name_ops.insert(j);
                }
                Touch::Gone { .. } => {
                    l.gone = true;
                    l.name_ops.insert(j);
                }
                Touch::Xattr { .. } => l.xattr = true,
                Touch::Entry { .. } => {}
            }
        }
        l
    };

    let mut ids: Vec<&ObjId> = latest.keys().collect();
    ids.sort();
    for id in ids {
        let (i, m) = latest[id];
        let l = later(*id, i);
        if l.gone {
            continue;
        }
        let when = &h.ops[i].desc;
        // Where the object is: its names are promised by the latest mark
        // that promises names (fsync, sync), which may be older than `m`
        // (an fdatasync since).
        let node: Option<&Node> = match latest_named.get(id) {
            Some(&(k, mn)) => {
                let ln = later(*id, k);
                let named_by = &h.ops[k].desc;
                let found: Vec<&String> = mn
                    .paths
                    .iter()
                    .filter(|p| tree.get(*p).is_some_and(|n| n.ino == mn.ino))
                    .collect();
                if ln.names.is_empty() {
                    let missing: Vec<&String> = mn.paths.iter().filter(|p| !found.contains(p)).collect();
                    if !missing.is_empty() {
                        out.push(Failure::new(
                            FailKind::FsyncLost,
                            format!(
                                "{}: inode {} ({:?}) made durable by `{named_by}` is not at {} ({})",
                                h.name,
                                mn.ino,
                                mn.kind,
                                missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                                missing
                                    .iter()
                                    .map(|p| what_is_at(tree, p))
                                    .collect::<Vec<_>>()
                                    .join("; ")
                            ),
                        ));
                    }
                    found.first().and_then(|p| tree.get(*p))
                } else {
                    let cands: BTreeSet<&String> =
                        mn.paths.iter().chain(ln.names.iter().flat_map(|p| p.iter())).collect();
                    let at: Vec<&&String> = cands
                        .iter()
                        .filter(|p| tree.get(**p).is_some_and(|n| n.ino == mn.ino))
                        .collect();
                    if at.is_empty() {
                        out.push(Failure::new(
                            FailKind::FsyncLost,
                            format!(
                                "{}: inode {} ({:?}) made durable by `{named_by}` and renamed since is at none of {}",
                                h.name,
                                mn.ino,
                                mn.kind,
                                cands.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                            ),
                        ));
                    }
                    at.first().and_then(|p| tree.get(**p))
                }
            }
            // No name promised: look where it might be, judge nothing if
            // it is nowhere.
            None => m
                .paths
                .iter()
                .chain(l.names.iter().flat_map(|p| p.iter()))
                .find_map(|p| tree.get(p).filter(|n| n.ino == m.ino)),
        };
        let Some(node) = node else { continue };
        // Contents.
        if let Some(want) = &m.content {
            check_bytes(h, m, node, &want.to_vec(), &l.data, when, out);
        }
        if let Some(t) = &m.target {
            if node.data != Data::Target(t.clone()) {
                out.push(Failure::new(
                    FailKind::FsyncLost,
                    format!(
                        "{}: symlink inode {} made durable by `{when}` points to {:?}, not {}",
                        h.name,
                        m.ino,
                        node.data,
                        ext4kit_testkit::escape_bytes(t)
                    ),
                ));
            }
        }
        if let (Some(want), false) = (&m.xattrs, l.xattr) {
            let got: BTreeMap<Vec<u8>, Vec<u8>> = match &node.xattrs {
                Ok(x) => x
                    .iter()
                    .filter(|(k, _)| k.starts_with(b"user."))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                Err(e) => {
                    out.push(Failure::new(
                        FailKind::FsyncXattr,
                        format!("{}: xattrs of inode {} unreadable: {e}", h.name, m.ino),
                    ));
                    continue;
                }
            };
            if &got != want {
                out.push(Failure::new(
                    FailKind::FsyncXattr,
                    format!(
                        "{}: inode {} made durable by `{when}` has user xattrs {:?}, not {:?}",
                        h.name,
                        m.ino,
                        got.keys().map(|k| ext4kit_testkit::escape_bytes(k)).collect::<Vec<_>>(),
                        want.keys()
                            .map(|k| ext4kit_testkit::escape_bytes(k))
                            .collect::<Vec<_>>()
                    ),
                ));
            }
        }
        if let Some(want) = &m.entries {
            // The directory's path in the image: where its node was found.
            let path = m
                .paths
                .iter()
                .chain(l.names.iter().flat_map(|p| p.iter()))
                .find(|p| tree.get(*p).is_some_and(|n| n.ino == m.ino && n.kind == NodeKind::Dir));
            let Some(path) = path else { continue };
            let touched: BTreeSet<&str> = by_dir
                .get(id)
                .map_or(&[][..], |v| v.as_slice())
                .iter()
                .filter(|(j, _)| *j > i)
                .map(|(_, n)| *n)
                .collect();
            let got: BTreeMap<&str, u32> = children(tree, path)
                .into_iter()
                .filter(|(n, _)| n.starts_with(h.prefix.as_str()))
                .map(|(n, node)| (n, node.ino))
                .collect();
            for (name, ino) in want {
                if touched.contains(name.as_str()) {
                    continue;
                }
                match got.get(name.as_str()) {
                    Some(g) if g == ino => {}
                    g => out.push(Failure::new(
                        FailKind::DirEntryLost,
                        format!(
                            "{}: directory {path} (inode {}) fsync'd by `{when}` had {name} -> inode {ino}; now {}",
                            h.name,
                            m.ino,
                            g.map_or("missing".to_string(), |g| format!("inode {g}"))
                        ),
                    )),
                }
            }
            for (name, ino) in &got {
                if !want.contains_key(*name) && !touched.contains(name) {
                    out.push(Failure::new(
                        FailKind::DirEntryStale,
                        format!(
                            "{}: directory {path} (inode {}) fsync'd by `{when}` without {name}, now holds it (inode {ino})",
                            h.name, m.ino
                        ),
                    ));
                }
            }
        }
    }

    // Renames.
    for (j, op) in h.ops[..started].iter().enumerate() {
        let Some(r) = &op.rename else { continue };
        let Some(&(i, m)) = latest_named.get(&r.id) else {
            continue;
        };
        if i >= j || !m.paths.contains(&r.old) {
            continue;
        }
        let l = later(r.id, i);
        if l.name_ops.iter().any(|&k| k != j) || dir_moves.iter().any(|&k| k > i && k != j) {
            continue;
        }
        let at_old = tree.get(&r.old).is_some_and(|n| n.ino == r.ino);
        let at_new = tree.get(&r.new).is_some_and(|n| n.ino == r.ino);
        let kind = match (at_old, at_new) {
            (true, true) => FailKind::RenameBoth,
            (false, false) => FailKind::RenameNeither,
            _ => continue,
        };
        out.push(Failure::new(
            kind,
            format!(
                "{}: `{}` (inode {}, durable at the old name since `{}`): {} -> {}; {} -> {}",
                h.name,
                op.desc,
                r.ino,
                h.ops[i].desc,
                r.old,
                what_is_at(tree, &r.old),
                r.new,
                what_is_at(tree, &r.new)
            ),
        ));
    }
}

fn what_is_at(tree: &Tree, p: &str) -> String {
    match tree.get(p) {
        None => "nothing".into(),
        Some(n) => format!("inode {} ({:?})", n.ino, n.kind),
    }
}

/// Compare a file's bytes with the mark's, except where later ops wrote.
fn check_bytes(
    h: &History,
    m: &Mark,
    node: &Node,
    want: &[u8],
    later: &[(u64, u64)],
    when: &str,
    out: &mut Vec<Failure>,
) {
    let got = match &node.data {
        Data::Bytes(b) => b,
        other => {
            out.push(Failure {
                kind: FailKind::FsyncData,
                detail: format!(
                    "{}: file inode {} made durable by `{when}` ({} bytes) reads as {other:?}",
                    h.name,
                    m.ino,
                    want.len()
                ),
                lost_bytes: want.len() as u64,
            });
            return;
        }
    };
    if later.is_empty() && got.as_slice() == want {
        return;
    }
    // Uncovered ranges of 0..want.len().
    let mut cover: Vec<(u64, u64)> = later.to_vec();
    cover.sort();
    let mut checked: Vec<(usize, usize)> = Vec::new();
    let mut at = 0u64;
    let len = want.len() as u64;
    for (lo, hi) in cover {
        if lo > at {
            checked.push((at as usize, lo.min(len) as usize));
        }
        at = at.max(hi);
        if at >= len {
            break;
        }
    }
    if at < len {
        checked.push((at as usize, len as usize));
    }
    let mut lost = 0u64;
    let mut first: Option<usize> = None;
    for (a, b) in checked {
        for (k, w) in want.iter().enumerate().take(b).skip(a) {
            if got.get(k) != Some(w) {
                lost += 1;
                first.get_or_insert(k);
            }
        }
    }
    let size_wrong = later.is_empty() && got.len() != want.len();
    if lost == 0 && !size_wrong {
        return;
    }
    out.push(Failure {
        kind: FailKind::FsyncData,
        detail: format!(
            "{}: file inode {} made durable by `{when}`: {} bytes then, {} now; {lost} fsync'd bytes lost{}{}",
            h.name,
            m.ino,
            want.len(),
            got.len(),
            first.map_or(String::new(), |f| format!(", first at byte {f}")),
            if later.is_empty() {
                String::new()
            } else {
                format!(" ({} later writes excluded)", later.len())
            }
        ),
        lost_bytes: lost.max(1),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::tests::{dir, file};

    fn op(desc: &str, start: u64, end: u64, flushes: u64) -> Op {
        Op {
            desc: desc.into(),
            start,
            end,
            flushes,
            touches: vec![],
            marks: vec![],
            rename: None,
        }
    }

    fn fmark(id: ObjId, ino: u32, path: &str, content: &[u8]) -> Mark {
        Mark {
            id,
            ino,
            kind: ObjKind::File,
            paths: vec![path.into()],
            names: true,
            content: Some(Content::from_slice(content)),
            target: None,
            xattrs: None,
            entries: None,
        }
    }

    fn check(h: &History, t: &Tree, end: u64, flushes: u64) -> Vec<Failure> {
        let mut out = Vec::new();
        check_promises(h, t, CutView { end, flushes }, &mut out);
        out
    }

    fn kinds(f: &[Failure]) -> Vec<FailKind> {
        f.iter().map(|f| f.kind).collect()
    }

    /// create /d/p_a (ino 12) with "hello", fsync (flush 1 at position 10);
    /// then append " world" (started at 20), fsync (flush 2 at 30).
    fn appended() -> History {
        let mut h = History {
            name: "t".into(),
            prefix: "p_".into(),
            ops: vec![],
        };
        let mut o = op("create+write", 0, 5, 0);
        o.touches = vec![
            Touch::Entry {
                dir: 1,
                name: "p_a".into(),
            },
            Touch::Data { id: 7, lo: 0, hi: 5 },
        ];
        h.ops.push(o);
        let mut o = op("fsync a", 5, 11, 1);
        o.marks.push(fmark(7, 12, "/d/p_a", b"hello"));
        h.ops.push(o);
        let mut o = op("append a", 20, 20, 1);
        o.touches = vec![Touch::Data { id: 7, lo: 5, hi: 11 }];
        h.ops.push(o);
        let mut o = op("fsync a", 20, 31, 2);
        o.marks.push(fmark(7, 12, "/d/p_a", b"hello world"));
        h.ops.push(o);
        h
    }

    fn tree_with(a: Option<&[u8]>) -> Tree {
        let mut t = Tree::new();
        t.insert("/".into(), dir(2));
        t.insert("/d".into(), dir(11));
        if let Some(a) = a {
            t.insert("/d/p_a".into(), file(12, a));
        }
        t
    }

    #[test]
    fn content_chunks_behave_like_a_vec() {
        let mut c = Content::default();
        let mut v: Vec<u8> = Vec::new();
        let mut x = 7u32;
        for step in 0..400 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let off = (x >> 8) as usize % 20_000;
            let len = (x >> 3) as usize % 9000;
            match step % 4 {
                0 | 1 => {
                    let data: Vec<u8> = (0..len).map(|i| (i + step) as u8).collect();
                    c.write(off, &data);
                    if v.len() < off + len {
                        v.resize(off + len, 0);
                    }
                    v[off..off + len].copy_from_slice(&data);
                }
                2 => {
                    c.resize(off);
                    v.resize(off, 0);
                }
                _ => {
                    c.zero(off, off + len);
                    let e = (off + len).min(v.len());
                    if off < e {
                        v[off..e].fill(0);
                    }
                }
            }
            let snapshot = c.clone();
            assert_eq!(c.to_vec(), v, "step {step}");
            assert_eq!(c.len(), v.len());
            assert_eq!(c.get(v.len()), None);
            if !v.is_empty() {
                assert_eq!(c.get(v.len() - 1), Some(v[v.len() - 1]));
            }
            // A kept version does not change with later writes.
            c.write(0, b"changed");
            assert_eq!(snapshot.to_vec(), v);
            c = snapshot;
        }
    }

    #[test]
    fn fsynced_contents_are_exact_until_touched() {
        let h = appended();
        // Before the first fsync's flush: no promise.
        assert!(check(&h, &tree_with(None), 8, 0).is_empty());
        // After it, before the append started: exact.
        assert!(check(&h, &tree_with(Some(b"hello")), 15, 1).is_empty());
        assert_eq!(
            kinds(&check(&h, &tree_with(Some(b"hellO")), 15, 1)),
            [FailKind::FsyncData]
        );
        assert_eq!(
            kinds(&check(&h, &tree_with(Some(b"hello!")), 15, 1)),
            [FailKind::FsyncData]
        );
        assert_eq!(kinds(&check(&h, &tree_with(None), 15, 1)), [FailKind::FsyncLost]);
        // The append started: the fsync'd prefix must stay, the rest may be anything.
        assert!(check(&h, &tree_with(Some(b"hello")), 25, 1).is_empty());
        assert!(check(&h, &tree_with(Some(b"hello wo\0\0\0")), 25, 1).is_empty());
        let f = check(&h, &tree_with(Some(b"hel")), 25, 1);
        assert_eq!(kinds(&f), [FailKind::FsyncData]);
        assert_eq!(f[0].lost_bytes, 2);
        // The second fsync's flush: exact again.
        assert_eq!(
            kinds(&check(&h, &tree_with(Some(b"hello")), 40, 2)),
            [FailKind::FsyncData]
        );
        assert!(check(&h, &tree_with(Some(b"hello world")), 40, 2).is_empty());
    }

    #[test]
    fn fdatasync_promises_bytes_not_names() {
        let (mut h, _) = renamed();
        // fdatasync after the rename: the bytes are promised wherever the
        // file is; the new name is not.
        let mut o = op("fdatasync b", 23, 30, 2);
        let mut m = fmark(7, 12, "/d/p_b", b"HELLO");
        m.names = false;
        o.marks.push(m);
        h.ops.push(o);
        let mut at_old = tree_with(Some(b"HELLO"));
        assert!(check(&h, &at_old, 40, 2).is_empty());
        at_old.insert("/d/p_a".into(), file(12, b"hello"));
        assert_eq!(kinds(&check(&h, &at_old, 40, 2)), [FailKind::FsyncData]);
        // The name the last fsync promised is still owed: the file must
        // be at the old name or the new one (the rename started).
        assert_eq!(
            kinds(&check(&h, &tree_with(None), 40, 2)),
            [FailKind::FsyncLost, FailKind::RenameNeither]
        );
    }

    #[test]
    fn truncation_and_unlink_relax_the_promise() {
        let mut h = appended();
        h.ops.truncate(2);
        let mut o = op("truncate a 2", 20, 21, 1);
        o.touches = vec![Touch::Data {
            id: 7,
            lo: 2,
            hi: u64::MAX,
        }];
        h.ops.push(o);
        assert!(check(&h, &tree_with(Some(b"he")), 25, 1).is_empty());
        assert_eq!(kinds(&check(&h, &tree_with(Some(b"xe")), 25, 1)), [FailKind::FsyncData]);
        let mut o = op("unlink a", 22, 23, 1);
        o.touches = vec![
            Touch::Gone { id: 7 },
            Touch::Entry {
                dir: 1,
                name: "p_a".into(),
            },
        ];
        h.ops.push(o);
        assert!(check(&h, &tree_with(None), 25, 1).is_empty());
        // ... unless the unlink had not started.
        assert_eq!(kinds(&check(&h, &tree_with(None), 22, 1)), [FailKind::FsyncLost]);
    }

    fn renamed() -> (History, Tree) {
        let mut h = appended();
        h.ops.truncate(2);
        let mut o = op("rename a b", 20, 22, 1);
        o.touches = vec![
            Touch::Names {
                id: 7,
                paths: vec!["/d/p_b".into()],
            },
            Touch::Entry {
                dir: 1,
                name: "p_a".into(),
            },
            Touch::Entry {
                dir: 1,
                name: "p_b".into(),
            },
        ];
        o.rename = Some(RenameRec {
            id: 7,
            ino: 12,
            old: "/d/p_a".into(),
            new: "/d/p_b".into(),
        });
        h.ops.push(o);
        (h, tree_with(Some(b"hello")))
    }

    #[test]
    fn renames_are_atomic() {
        let (h, at_old) = renamed();
        assert!(check(&h, &at_old, 25, 1).is_empty());
        let mut at_new = at_old.clone();
        let n = at_new.remove("/d/p_a").unwrap();
        at_new.insert("/d/p_b".into(), n.clone());
        assert!(check(&h, &at_new, 25, 1).is_empty());
        let mut both = at_new.clone();
        both.insert("/d/p_a".into(), n);
        assert_eq!(kinds(&check(&h, &both, 25, 1)), [FailKind::RenameBoth]);
        let neither = tree_with(None);
        let f = check(&h, &neither, 25, 1);
        assert_eq!(kinds(&f), [FailKind::FsyncLost, FailKind::RenameNeither]);
        // Before the rename started, only the old name is right.
        assert_eq!(kinds(&check(&h, &at_new, 20, 1)), [FailKind::FsyncLost]);
        // A rename of a file never made durable is not judged.
        assert!(check(&h, &neither, 25, 0).is_empty());
    }

    #[test]
    fn directory_entries() {
        let mut h = History {
            name: "t".into(),
            prefix: "p_".into(),
            ops: vec![],
        };
        let mut o = op("fsync /d", 0, 10, 1);
        o.marks.push(Mark {
            id: 1,
            ino: 11,
            kind: ObjKind::Dir,
            paths: vec!["/d".into()],
            names: true,
            content: None,
            target: None,
            xattrs: None,
            entries: Some([("p_a".to_string(), 12u32)].into_iter().collect()),
        });
        h.ops.push(o);
        let mut o = op("create p_c", 20, 25, 1);
        o.touches = vec![Touch::Entry {
            dir: 1,
            name: "p_c".into(),
        }];
        h.ops.push(o);
        let mut t = tree_with(Some(b"x"));
        // Other threads' names are not ours to judge.
        t.insert("/d/q_z".into(), file(40, b""));
        assert!(check(&h, &t, 15, 1).is_empty());
        assert_eq!(kinds(&check(&h, &tree_with(None), 15, 1)), [FailKind::DirEntryLost]);
        let mut wrong = t.clone();
        wrong.insert("/d/p_a".into(), file(13, b""));
        assert_eq!(kinds(&check(&h, &wrong, 15, 1)), [FailKind::DirEntryLost]);
        let mut stale = t.clone();
        stale.insert("/d/p_b".into(), file(14, b""));
        assert_eq!(kinds(&check(&h, &stale, 15, 1)), [FailKind::DirEntryStale]);
        // p_c was being created when the cut fell: either way is fine.
        let mut c = t.clone();
        c.insert("/d/p_c".into(), file(15, b""));
        assert!(check(&h, &c, 22, 1).is_empty());
        assert_eq!(kinds(&check(&h, &c, 15, 1)), [FailKind::DirEntryStale]);
    }
}
