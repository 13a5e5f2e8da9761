//! A whole filesystem tree as the engine reads it, in memory, and the
//! comparison of two of them.
//!
//! The crash checks read trees through the library rather than extracting
//! them to a host directory: a crash image is 16-32 MiB and thousands are
//! checked, so a walk that stays in memory is what keeps the CI run short.
//! A node keeps what a crash could get wrong: inode number, type, mode,
//! owner, links, size, mtime/ctime, contents or link target, and xattrs.

use std::collections::BTreeMap;
use std::fmt;

use ext4kit::{FileType, Fs, OpenFlags, Timestamp};

/// What kind of object a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A device, fifo or socket.
    Other,
}

/// Contents of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data {
    /// Directories and special files.
    None,
    /// A regular file's bytes.
    Bytes(Vec<u8>),
    /// A symlink's target.
    Target(Vec<u8>),
    /// Reading failed (the message).
    Unreadable(String),
}

/// One object of a [`Tree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Inode number.
    pub ino: u32,
    /// Type.
    pub kind: NodeKind,
    /// Full `i_mode`.
    pub mode: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links.
    pub nlink: u16,
    /// Size in bytes.
    pub size: u64,
    /// Last data change.
    pub mtime: (i64, u32),
    /// Last status change.
    pub ctime: (i64, u32),
    /// Contents.
    pub data: Data,
    /// Extended attributes, or why they could not be read.
    pub xattrs: Result<BTreeMap<Vec<u8>, Vec<u8>>, String>,
}

/// Path (absolute, `/`-separated, names escaped as
/// [`ext4kit_testkit::escape_bytes`] does) to node; `/` is the root.
pub type Tree = BTreeMap<String, Node>;

/// Largest file the walk reads (a crash image is small; a bigger size is a
/// corrupt inode).
const MAX_FILE: u64 = 256 << 20;
/// Deepest directory nesting the walk follows.
const MAX_DEPTH: usize = 64;
/// Most objects the walk visits.
const MAX_NODES: usize = 200_000;

fn ts(t: Timestamp) -> (i64, u32) {
    (t.sec, t.nsec)
}

/// Read the whole tree of `fs`. A directory that cannot be listed, or a
/// walk past the limits (a directory cycle), is an error; a file that
/// cannot be read is kept as [`Data::Unreadable`].
pub fn walk(fs: &Fs) -> Result<Tree, String> {
    let mut out = Tree::new();
    let root = fs.lstat(b"/").map_err(|e| format!("stat /: {e}"))?;
    let mut stack: Vec<(Vec<u8>, String, usize)> = vec![(b"/".to_vec(), "/".to_string(), 0)];
    out.insert("/".into(), node(fs, b"/", &root));
    let mut seen_dirs = std::collections::HashSet::new();
    seen_dirs.insert(root.ino);
    while let Some((raw, shown, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(format!("{shown}: nested deeper than {MAX_DEPTH} directories"));
        }
        let entries = fs.read_dir(&raw).map_err(|e| format!("listing {shown}: {e}"))?;
        for e in entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let mut craw = raw.clone();
            if craw != b"/" {
                craw.push(b'/');
            }
            craw.extend_from_slice(&e.name);
            let cshown = format!(
                "{}/{}",
                if shown == "/" { "" } else { &shown },
                ext4kit_testkit::escape_bytes(&e.name)
            );
            let st = match fs.lstat(&craw) {
                Ok(st) => st,
                Err(err) => return Err(format!("stat {cshown} (entry for inode {}): {err}", e.ino)),
            };
            let n = node(fs, &craw, &st);
            if n.kind == NodeKind::Dir {
                if !seen_dirs.insert(st.ino) {
                    return Err(format!("{cshown}: directory inode {} reached twice", st.ino));
                }
                stack.push((craw, cshown.clone(), depth + 1));
            }
            out.insert(cshown, n);
            if out.len() > MAX_NODES {
                return Err(format!("more than {MAX_NODES} objects"));
            }
        }
    }
    Ok(out)
}

fn node(fs: &Fs, path: &[u8], st: &ext4kit::Stat) -> Node {
    let kind = match st.ftype {
        FileType::Regular => NodeKind::File,
        FileType::Directory => NodeKind::Dir,
        FileType::Symlink => NodeKind::Symlink,
        _ => NodeKind::Other,
    };
    let data = match kind {
        NodeKind::File => read_file(fs, path, st.size),
        NodeKind::Symlink => match fs.read_link(path) {
            Ok(t) => Data::Target(t),
            Err(e) => Data::Unreadable(e.to_string()),
        },
        _ => Data::None,
    };
    let xattrs = fs
        .xattrs(path)
        .map(|v| v.into_iter().collect())
        .map_err(|e| e.to_string());
    Node {
        ino: st.ino,
        kind,
        mode: st.mode,
        uid: st.uid,
        gid: st.gid,
        nlink: st.nlink,
        size: st.size,
        mtime: ts(st.mtime),
        ctime: ts(st.ctime),
        data,
        xattrs,
    }
}

fn read_file(fs: &Fs, path: &[u8], size: u64) -> Data {
    if size > MAX_FILE {
        return Data::Unreadable(format!("size {size} is beyond what a crash image can hold"));
    }
    let f = match fs.open(path, OpenFlags::default()) {
        Ok(f) => f,
        Err(e) => return Data::Unreadable(e.to_string()),
    };
    let mut buf = vec![0u8; size as usize];
    let mut at = 0;
    while at < buf.len() {
        match fs.pread(&f, at as u64, &mut buf[at..]) {
            Ok(0) => {
                return Data::Unreadable(format!("short read: {at} of {size} bytes"));
            }
            Ok(n) => at += n,
            Err(e) => return Data::Unreadable(format!("at byte {at}: {e}")),
        }
    }
    Data::Bytes(buf)
}

/// The last component of `path`.
pub fn base_name(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(_, b)| b)
}

/// The parent of `path` (`/` for a top-level name).
pub fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The children of directory `dir` in `tree`: (name, node).
pub fn children<'a>(tree: &'a Tree, dir: &str) -> Vec<(&'a str, &'a Node)> {
    let pre = if dir == "/" { "/".to_string() } else { format!("{dir}/") };
    tree.range(pre.clone()..)
        .take_while(|(k, _)| k.starts_with(&pre))
        .filter(|(k, _)| k.len() > pre.len() && !k[pre.len()..].contains('/'))
        .map(|(k, n)| (&k[pre.len()..], n))
        .collect()
}

/// One way two trees differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeDiff {
    /// The path.
    pub path: String,
    /// What differs.
    pub what: String,
}

impl fmt::Display for TreeDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.what)
    }
}

fn describe_data(d: &Data) -> String {
    match d {
        Data::None => "none".into(),
        Data::Bytes(b) => format!("{} bytes", b.len()),
        Data::Target(t) => format!("-> {}", ext4kit_testkit::escape_bytes(t)),
        Data::Unreadable(e) => format!("unreadable ({e})"),
    }
}

/// Every difference between `a` and `b` (named `an` and `bn` in the
/// messages), in path order.
pub fn compare(a: &Tree, b: &Tree, an: &str, bn: &str) -> Vec<TreeDiff> {
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for k in keys {
        let (x, y) = match (a.get(k), b.get(k)) {
            (Some(x), Some(y)) => (x, y),
            (Some(x), None) => {
                out.push(TreeDiff {
                    path: k.clone(),
                    what: format!("only in {an} (inode {})", x.ino),
                });
                continue;
            }
            (None, Some(y)) => {
                out.push(TreeDiff {
                    path: k.clone(),
                    what: format!("only in {bn} (inode {})", y.ino),
                });
                continue;
            }
            (None, None) => continue,
        };
        let mut d = Vec::new();
        macro_rules! field {
            ($f:ident) => {
                if x.$f != y.$f {
                    d.push(format!(
                        "{} {:?} in {an}, {:?} in {bn}",
                        stringify!($f),
                        x.$f,
                        y.$f
                    ));
                }
            };
        }
        field!(ino);
        field!(kind);
        field!(mode);
        field!(uid);
        field!(gid);
        field!(nlink);
        field!(size);
        field!(mtime);
        field!(ctime);
        if x.data != y.data {
            let first = match (&x.data, &y.data) {
                (Data::Bytes(p), Data::Bytes(q)) => p
                    .iter()
                    .zip(q.iter())
                    .position(|(u, v)| u != v)
                    .map_or(String::new(), |i| format!(", first difference at byte {i}")),
                _ => String::new(),
            };
            d.push(format!(
                "contents {} in {an}, {} in {bn}{first}",
                describe_data(&x.data),
                describe_data(&y.data)
            ));
        }
        if x.xattrs != y.xattrs {
            d.push(format!(
                "xattrs {:?} in {an}, {:?} in {bn}",
                keys_of(&x.xattrs),
                keys_of(&y.xattrs)
            ));
        }
        if !d.is_empty() {
            out.push(TreeDiff {
                path: k.clone(),
                what: d.join("; "),
            });
        }
    }
    out
}

fn keys_of(x: &Result<BTreeMap<Vec<u8>, Vec<u8>>, String>) -> Result<Vec<String>, String> {
    x.as_ref()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{}({}B)", ext4kit_testkit::escape_bytes(k), v.len()))
                .collect()
        })
        .map_err(|e| e.clone())
}

/// `diffs` as at most `max` lines, with a count of the rest.
pub fn summarize(diffs: &[TreeDiff], max: usize) -> String {
    let mut s: Vec<String> = diffs.iter().take(max).map(|d| d.to_string()).collect();
    if diffs.len() > max {
        s.push(format!("... and {} more", diffs.len() - max));
    }
    s.join("\n")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A node for hand-built trees.
    pub(crate) fn file(ino: u32, data: &[u8]) -> Node {
        Node {
            ino,
            kind: NodeKind::File,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            nlink: 1,
            size: data.len() as u64,
            mtime: (0, 0),
            ctime: (0, 0),
            data: Data::Bytes(data.to_vec()),
            xattrs: Ok(BTreeMap::new()),
        }
    }

    pub(crate) fn dir(ino: u32) -> Node {
        Node {
            kind: NodeKind::Dir,
            mode: 0o40755,
            data: Data::None,
            size: 1024,
            nlink: 2,
            ..file(ino, b"")
        }
    }

    #[test]
    fn children_and_paths() {
        let mut t = Tree::new();
        t.insert("/".into(), dir(2));
        t.insert("/a".into(), dir(12));
        t.insert("/a/x".into(), file(13, b"x"));
        t.insert("/a/y".into(), dir(14));
        t.insert("/a/y/z".into(), file(15, b""));
        t.insert("/ab".into(), file(16, b""));
        let names: Vec<&str> = children(&t, "/a").into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["x", "y"]);
        let names: Vec<&str> = children(&t, "/").into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["a", "ab"]);
        assert_eq!(
            (parent("/a/y/z"), parent("/a"), base_name("/a/y/z")),
            ("/a/y", "/", "z")
        );
    }

    #[test]
    fn compare_names_each_difference() {
        let mut a = Tree::new();
        a.insert("/".into(), dir(2));
        a.insert("/f".into(), file(12, b"hello"));
        a.insert("/g".into(), file(13, b""));
        let mut b = a.clone();
        assert!(compare(&a, &b, "A", "B").is_empty());
        b.insert("/f".into(), file(12, b"hellO"));
        b.remove("/g");
        b.insert("/h".into(), file(14, b""));
        let d = compare(&a, &b, "A", "B");
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[0].what.contains("first difference at byte 4"), "{}", d[0]);
        assert!(d[1].what.contains("only in A"));
        assert!(d[2].what.contains("only in B"));
    }
}
