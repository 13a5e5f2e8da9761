//! Whole-tree comparison: the oracle that says whether a tree read out of an
//! image (by ext4kit, the kernel, debugfs…) is the tree that went in.
//!
//! Everything a filesystem is supposed to preserve is compared: names as
//! bytes, types, permission bits including setuid/setgid/sticky, owners,
//! sizes, contents (holes read as zeros, so sparse and dense copies of the
//! same bytes are equal), symlink targets, device numbers, the partition of
//! names into hard-link groups and link counts, every xattr, and mtimes to
//! the nanosecond. Knobs exist only for what a given reader legitimately
//! cannot preserve (owners without root, nanoseconds in 128-byte inodes…).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::Path;

use crate::util::{escape_bytes, join_bytes, Context};

/// How precisely timestamps are expected to survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeFidelity {
    /// Seconds and nanoseconds must match (ext4 with ≥ 256-byte inodes).
    #[default]
    Nanoseconds,
    /// Seconds must match, nanoseconds are ignored (e.g. `debugfs rdump`,
    /// which restores times with utime(2)).
    Seconds,
    /// What a 128-byte inode can hold: the expected seconds truncated to a
    /// signed 32-bit value (so 3000000000 reads back as 1929), no
    /// nanoseconds. This is exactly what the kernel reports for such inodes.
    Seconds32,
    /// Timestamps are not compared.
    Ignore,
}

/// What [`compare_trees`] compares. The default compares everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompareOpts {
    /// Compare uid/gid (turn off when the extractor could not chown).
    pub owners: bool,
    /// Skip `lost+found` directly below the roots (mke2fs and the kernel
    /// create it; a source tree does not have it).
    pub ignore_lost_found: bool,
    /// Skip the root directory's own mode, owner, times and xattrs (the
    /// root of an extraction is often created by the test, not restored).
    pub ignore_root_attrs: bool,
    /// Compare extended attributes (`security.selinux` is always skipped).
    pub xattrs: bool,
    /// Compare hard-link groups and link counts of non-directories.
    pub hard_links: bool,
    /// Precision of mtime comparison.
    pub times: TimeFidelity,
    /// Compare symlink mtimes too (not every tool can set them).
    pub symlink_times: bool,
    /// Compare directory mtimes (restorers must set them after filling the
    /// directory).
    pub dir_times: bool,
}

impl Default for CompareOpts {
    fn default() -> Self {
        Self {
            owners: true,
            ignore_lost_found: false,
            ignore_root_attrs: false,
            xattrs: true,
            hard_links: true,
            times: TimeFidelity::Nanoseconds,
            symlink_times: true,
            dir_times: true,
        }
    }
}

/// One way in which `actual` differs from `expected`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// Path relative to the compared roots, as raw bytes ("" is the root).
    pub path: Vec<u8>,
    /// What differs.
    pub kind: DiffKind,
}

/// The kinds of [`Difference`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffKind {
    /// Present in expected, absent in actual.
    Missing,
    /// Present in actual, absent in expected.
    Extra,
    /// Different file types (e.g. "regular file" vs "symlink").
    FileType {
        /// Type in expected.
        expected: &'static str,
        /// Type in actual.
        actual: &'static str,
    },
    /// Different permission bits (mode & 0o7777).
    Mode {
        /// Bits in expected.
        expected: u32,
        /// Bits in actual.
        actual: u32,
    },
    /// Different (uid, gid).
    Owner {
        /// Owner in expected.
        expected: (u32, u32),
        /// Owner in actual.
        actual: (u32, u32),
    },
    /// Different sizes (regular files and symlinks).
    Size {
        /// Size in expected.
        expected: u64,
        /// Size in actual.
        actual: u64,
    },
    /// Same size, different bytes; `offset` is the first differing byte.
    Content {
        /// First differing byte offset.
        offset: u64,
    },
    /// Different symlink targets.
    SymlinkTarget {
        /// Target in expected.
        expected: Vec<u8>,
        /// Target in actual.
        actual: Vec<u8>,
    },
    /// Different device numbers (major, minor).
    Device {
        /// Device in expected.
        expected: (u32, u32),
        /// Device in actual.
        actual: (u32, u32),
    },
    /// This path shares its inode with a different set of paths.
    HardLinks {
        /// Paths sharing the inode in expected (sorted).
        expected: Vec<Vec<u8>>,
        /// Paths sharing the inode in actual (sorted).
        actual: Vec<Vec<u8>>,
    },
    /// Different link counts (non-directories).
    LinkCount {
        /// Count in expected.
        expected: u64,
        /// Count in actual.
        actual: u64,
    },
    /// An xattr present in expected is absent in actual.
    XattrMissing {
        /// Attribute name.
        name: Vec<u8>,
    },
    /// An xattr present in actual is absent in expected.
    XattrExtra {
        /// Attribute name.
        name: Vec<u8>,
    },
    /// An xattr has a different value.
    XattrValue {
        /// Attribute name.
        name: Vec<u8>,
        /// Value in expected.
        expected: Vec<u8>,
        /// Value in actual.
        actual: Vec<u8>,
    },
    /// Different mtimes (seconds, nanoseconds).
    Mtime {
        /// Mtime in expected.
        expected: (i64, i64),
        /// Mtime in actual.
        actual: (i64, i64),
    },
    /// The entry could not be examined on one side.
    Error {
        /// What failed.
        message: String,
    },
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "/".to_string()
        } else {
            format!("/{}", escape_bytes(&self.path))
        };
        write!(f, "{path}: ")?;
        match &self.kind {
            DiffKind::Missing => write!(f, "missing in actual"),
            DiffKind::Extra => write!(f, "not in expected (extra in actual)"),
            DiffKind::FileType { expected, actual } => {
                write!(f, "type: expected {expected}, actual {actual}")
            }
            DiffKind::Mode { expected, actual } => {
                write!(f, "mode: expected {expected:04o}, actual {actual:04o}")
            }
            DiffKind::Owner { expected, actual } => write!(
                f,
                "owner: expected {}:{}, actual {}:{}",
                expected.0, expected.1, actual.0, actual.1
            ),
            DiffKind::Size { expected, actual } => {
                write!(f, "size: expected {expected}, actual {actual}")
            }
            DiffKind::Content { offset } => {
                write!(f, "content differs, first at byte offset {offset}")
            }
            DiffKind::SymlinkTarget { expected, actual } => write!(
                f,
                "symlink target: expected \"{}\", actual \"{}\"",
                escape_bytes(expected),
                escape_bytes(actual)
            ),
            DiffKind::Device { expected, actual } => write!(
                f,
                "device: expected {}:{}, actual {}:{}",
                expected.0, expected.1, actual.0, actual.1
            ),
            DiffKind::HardLinks { expected, actual } => {
                let j = |v: &Vec<Vec<u8>>| {
                    v.iter()
                        .map(|p| format!("/{}", escape_bytes(p)))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                write!(
                    f,
                    "hard links: expected same inode as [{}], actual [{}]",
                    j(expected),
                    j(actual)
                )
            }
            DiffKind::LinkCount { expected, actual } => {
                write!(f, "link count: expected {expected}, actual {actual}")
            }
            DiffKind::XattrMissing { name } => {
                write!(f, "xattr {} missing in actual", escape_bytes(name))
            }
            DiffKind::XattrExtra { name } => {
                write!(f, "xattr {} not in expected", escape_bytes(name))
            }
            DiffKind::XattrValue { name, expected, actual } => {
                let first = expected
                    .iter()
                    .zip(actual.iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(expected.len().min(actual.len()));
                write!(
                    f,
                    "xattr {} value: expected {} bytes, actual {} bytes, first difference at {first}",
                    escape_bytes(name),
                    expected.len(),
                    actual.len()
                )
            }
            DiffKind::Mtime { expected, actual } => write!(
                f,
                "mtime: expected {}.{:09}, actual {}.{:09}",
                expected.0, expected.1, actual.0, actual.1
            ),
            DiffKind::Error { message } => write!(f, "error: {message}"),
        }
    }
}

struct Entry {
    md: Metadata,
}

type Tree = BTreeMap<Vec<u8>, Entry>;

/// Compares the tree at `expected` with the tree at `actual` and returns
/// every difference, in path order (empty means identical).
///
/// Fails only when a root cannot be read at all; a problem with one entry
/// (unreadable file, failing readlink) is reported as a
/// [`DiffKind::Error`] difference so one bad file does not hide the rest.
pub fn compare_trees(expected: &Path, actual: &Path, opts: &CompareOpts) -> io::Result<Vec<Difference>> {
    let exp = collect(expected, opts)?;
    let act = collect(actual, opts)?;
    let exp_groups = link_groups(&exp);
    let act_groups = link_groups(&act);
    let mut diffs = Vec::new();
    let mut reported_groups = BTreeSet::new();

    let keys: BTreeSet<&Vec<u8>> = exp.keys().chain(act.keys()).collect();
    for rel in keys {
        let mut push = |kind| {
            diffs.push(Difference {
                path: rel.clone(),
                kind,
            })
        };
        let (e, a) = match (exp.get(rel), act.get(rel)) {
            (Some(e), Some(a)) => (e, a),
            (Some(_), None) => {
                push(DiffKind::Missing);
                continue;
            }
            (None, Some(_)) => {
                push(DiffKind::Extra);
                continue;
            }
            (None, None) => continue,
        };
        let (ep, ap) = (join_bytes(expected, rel), join_bytes(actual, rel));
        let (et, at) = (type_name(&e.md), type_name(&a.md));
        if et != at {
            push(DiffKind::FileType {
                expected: et,
                actual: at,
            });
            continue;
        }
        let ft = e.md.file_type();
        let is_root = rel.is_empty();
        let attrs = !(is_root && opts.ignore_root_attrs);

        if attrs {
            // Symlink permission bits are always 0777 on Linux: skip them.
            let (em, am) = (e.md.mode() & 0o7777, a.md.mode() & 0o7777);
            if !ft.is_symlink() && em != am {
                push(DiffKind::Mode {
                    expected: em,
                    actual: am,
                });
            }
            if opts.owners {
                let (eo, ao) = ((e.md.uid(), e.md.gid()), (a.md.uid(), a.md.gid()));
                if eo != ao {
                    push(DiffKind::Owner {
                        expected: eo,
                        actual: ao,
                    });
                }
            }
        }

        if ft.is_file() || ft.is_symlink() {
            if e.md.len() != a.md.len() {
                push(DiffKind::Size {
                    expected: e.md.len(),
                    actual: a.md.len(),
                });
            } else if ft.is_file() {
                match compare_contents(&ep, &ap, e.md.len()) {
                    Ok(None) => {}
                    Ok(Some(offset)) => push(DiffKind::Content { offset }),
                    Err(err) => push(DiffKind::Error {
                        message: err.to_string(),
                    }),
                }
            }
        }
        if ft.is_symlink() {
            match (fs::read_link(&ep), fs::read_link(&ap)) {
                (Ok(x), Ok(y)) => {
                    let (x, y) = (x.as_os_str().as_bytes(), y.as_os_str().as_bytes());
                    if x != y {
                        push(DiffKind::SymlinkTarget {
                            expected: x.to_vec(),
                            actual: y.to_vec(),
                        });
                    }
                }
                (Err(err), _) | (_, Err(err)) => push(DiffKind::Error {
                    message: format!("readlink: {err}"),
                }),
            }
        }
        if ft.is_char_device() || ft.is_block_device() {
            let (ed, ad) = (dev_pair(e.md.rdev()), dev_pair(a.md.rdev()));
            if ed != ad {
                push(DiffKind::Device {
                    expected: ed,
                    actual: ad,
                });
            }
        }
        if opts.hard_links && !ft.is_dir() {
            if e.md.nlink() != a.md.nlink() {
                push(DiffKind::LinkCount {
                    expected: e.md.nlink(),
                    actual: a.md.nlink(),
                });
            }
            let eg = group_of(&exp_groups, &e.md);
            let ag = group_of(&act_groups, &a.md);
            if eg != ag {
                let key = eg.first().cloned().unwrap_or_default();
                if reported_groups.insert(key) {
                    push(DiffKind::HardLinks {
                        expected: eg,
                        actual: ag,
                    });
                }
            }
        }
        if attrs && opts.xattrs {
            match (read_xattrs(&ep), read_xattrs(&ap)) {
                (Ok(ex), Ok(ax)) => {
                    for (name, ev) in &ex {
                        match ax.get(name) {
                            None => push(DiffKind::XattrMissing { name: name.clone() }),
                            Some(av) if av != ev => push(DiffKind::XattrValue {
                                name: name.clone(),
                                expected: ev.clone(),
                                actual: av.clone(),
                            }),
                            Some(_) => {}
                        }
                    }
                    for name in ax.keys().filter(|n| !ex.contains_key(*n)) {
                        push(DiffKind::XattrExtra { name: name.clone() });
                    }
                }
                (Err(err), _) | (_, Err(err)) => push(DiffKind::Error {
                    message: err.to_string(),
                }),
            }
        }
        let check_time = attrs && (!ft.is_symlink() || opts.symlink_times) && (!ft.is_dir() || opts.dir_times);
        if check_time {
            let et = (e.md.mtime(), e.md.mtime_nsec());
            let at = (a.md.mtime(), a.md.mtime_nsec());
            let same = match opts.times {
                TimeFidelity::Nanoseconds => et == at,
                TimeFidelity::Seconds => et.0 == at.0,
                TimeFidelity::Seconds32 => i64::from(et.0 as i32) == at.0,
                TimeFidelity::Ignore => true,
            };
            if !same {
                push(DiffKind::Mtime {
                    expected: et,
                    actual: at,
                });
            }
        }
    }
    Ok(diffs)
}

fn type_name(md: &Metadata) -> &'static str {
    let ft = md.file_type();
    if ft.is_file() {
        "regular file"
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else {
        "unknown"
    }
}

fn dev_pair(rdev: u64) -> (u32, u32) {
    (rustix::fs::major(rdev), rustix::fs::minor(rdev))
}

/// All entries below (and including, as "") the root, keyed by relative
/// byte path, without following symlinks.
fn collect(root: &Path, opts: &CompareOpts) -> io::Result<Tree> {
    let md = fs::symlink_metadata(root).context(|| format!("stat {}", root.display()))?;
    if !md.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{} is not a directory", root.display()),
        ));
    }
    let mut tree = Tree::new();
    tree.insert(Vec::new(), Entry { md });
    let mut stack = vec![Vec::<u8>::new()];
    while let Some(dir_rel) = stack.pop() {
        let dir = join_bytes(root, &dir_rel);
        for ent in fs::read_dir(&dir).context(|| format!("readdir {}", dir.display()))? {
            let ent = ent.context(|| format!("readdir {}", dir.display()))?;
            let name = ent.file_name();
            let name = name.as_bytes();
            if dir_rel.is_empty() && opts.ignore_lost_found && name == b"lost+found" {
                continue;
            }
            let mut rel = dir_rel.clone();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(name);
            let p = ent.path();
            let md = fs::symlink_metadata(&p).context(|| format!("stat {}", p.display()))?;
            if md.is_dir() {
                stack.push(rel.clone());
            }
            tree.insert(rel, Entry { md });
        }
    }
    Ok(tree)
}

type Groups = BTreeMap<(u64, u64), Vec<Vec<u8>>>;

fn link_groups(tree: &Tree) -> Groups {
    let mut g = Groups::new();
    for (rel, e) in tree {
        if !e.md.is_dir() {
            g.entry((e.md.dev(), e.md.ino())).or_default().push(rel.clone());
        }
    }
    g
}

fn group_of(groups: &Groups, md: &Metadata) -> Vec<Vec<u8>> {
    groups.get(&(md.dev(), md.ino())).cloned().unwrap_or_default()
}

/// Data ranges of a file per SEEK_DATA/SEEK_HOLE; the whole file if the
/// filesystem cannot tell.
fn data_ranges(f: &File, size: u64) -> Vec<(u64, u64)> {
    use rustix::fs::SeekFrom;
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let start = match rustix::fs::seek(f, SeekFrom::Data(pos)) {
            Ok(s) => s,
            Err(rustix::io::Errno::NXIO) => break,
            Err(_) => return vec![(0, size)],
        };
        let end = match rustix::fs::seek(f, SeekFrom::Hole(start)) {
            Ok(e) => e.min(size),
            Err(_) => return vec![(0, size)],
        };
        if end <= start {
            return vec![(0, size)];
        }
        out.push((start, end));
        pos = end;
    }
    out
}

/// Union of two sorted range lists.
fn union(mut a: Vec<(u64, u64)>, b: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    a.extend(b);
    a.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in a {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// First differing byte of two equally long files, or None. Holes read as
/// zeros, so only the union of both files' data ranges is read.
fn compare_contents(a: &Path, b: &Path, size: u64) -> io::Result<Option<u64>> {
    let fa = File::open(a).context(|| format!("open {}", a.display()))?;
    let fb = File::open(b).context(|| format!("open {}", b.display()))?;
    let ranges = union(data_ranges(&fa, size), data_ranges(&fb, size));
    const CHUNK: usize = 1 << 20;
    let mut ba = vec![0u8; CHUNK];
    let mut bb = vec![0u8; CHUNK];
    for (start, end) in ranges {
        let mut off = start;
        while off < end {
            let n = ((end - off) as usize).min(CHUNK);
            fa.read_exact_at(&mut ba[..n], off)
                .context(|| format!("read {} at {off}", a.display()))?;
            fb.read_exact_at(&mut bb[..n], off)
                .context(|| format!("read {} at {off}", b.display()))?;
            if ba[..n] != bb[..n] {
                let i = ba[..n].iter().zip(&bb[..n]).position(|(x, y)| x != y).unwrap_or(0);
                return Ok(Some(off + i as u64));
            }
            off += n as u64;
        }
    }
    Ok(None)
}

/// All xattrs of a path (not following symlinks), minus `security.selinux`
/// (a property of the host's policy, not of the tree).
pub fn read_xattrs(p: &Path) -> io::Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let names = loop {
        let n = rustix::fs::llistxattr_query(p).context(|| format!("listxattr {}", p.display()))?;
        let mut buf = vec![0u8; n];
        match rustix::fs::llistxattr(p, &mut buf[..]) {
            Ok(m) => {
                buf.truncate(m);
                break buf;
            }
            Err(rustix::io::Errno::RANGE) => continue,
            Err(e) => return Err(e).context(|| format!("listxattr {}", p.display())),
        }
    };
    for name in names.split(|&c| c == 0).filter(|n| !n.is_empty()) {
        if name == b"security.selinux" {
            continue;
        }
        let cname = std::ffi::OsStr::from_bytes(name);
        let value = loop {
            let n = rustix::fs::lgetxattr_query(p, cname)
                .context(|| format!("getxattr {} on {}", escape_bytes(name), p.display()))?;
            let mut buf = vec![0u8; n];
            match rustix::fs::lgetxattr(p, cname, &mut buf[..]) {
                Ok(m) => {
                    buf.truncate(m);
                    break buf;
                }
                Err(rustix::io::Errno::RANGE) => continue,
                Err(e) => return Err(e).context(|| format!("getxattr {} on {}", escape_bytes(name), p.display())),
            }
        };
        out.insert(name.to_vec(), value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    use rustix::fs::{AtFlags, Timespec, Timestamps, XattrFlags, CWD};

    fn set_mtime(p: &Path, s: i64, ns: i64) {
        let ts = Timespec { tv_sec: s, tv_nsec: ns };
        rustix::fs::utimensat(
            CWD,
            p,
            &Timestamps {
                last_access: ts,
                last_modification: ts,
            },
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .expect("utimensat");
    }

    /// A small tree with one of each thing the mutations below break.
    fn mini(root: &Path) {
        fs::create_dir(root.join("d")).expect("mkdir");
        let mut f = File::create(root.join("d/file")).expect("create");
        f.write_all(&(0..=255u8).cycle().take(5000).collect::<Vec<_>>())
            .expect("write");
        drop(f);
        fs::hard_link(root.join("d/file"), root.join("link")).expect("link");
        rustix::fs::lsetxattr(root.join("d/file"), "user.k", b"v", XattrFlags::empty())
            .expect("setxattr (does the temp dir's filesystem support user xattrs?)");
        std::os::unix::fs::symlink("d/file", root.join("sym")).expect("symlink");
        // Sparse: 4 KiB data after a 1 MiB hole.
        let f = File::create(root.join("sparse")).expect("create");
        f.write_all_at(b"tail", 1 << 20).expect("write");
        drop(f);
        fs::set_permissions(root.join("d/file"), fs::Permissions::from_mode(0o4755)).expect("chmod");
        for (p, s) in [
            ("d/file", 1_000_000_000),
            ("sym", 1_100_000_000),
            ("sparse", 1_200_000_000),
            ("d", 1_300_000_000),
            ("", 1_400_000_000),
        ] {
            set_mtime(&root.join(p), s, 123_456_789);
        }
    }

    fn pair() -> (tempfile::TempDir, tempfile::TempDir) {
        let a = tempfile::tempdir().expect("tempdir");
        let b = tempfile::tempdir().expect("tempdir");
        mini(a.path());
        mini(b.path());
        (a, b)
    }

    fn diffs(a: &Path, b: &Path) -> Vec<Difference> {
        compare_trees(a, b, &CompareOpts::default()).expect("compare")
    }

    fn only(d: &[Difference]) -> &DiffKind {
        assert_eq!(d.len(), 1, "expected exactly one difference, got {d:#?}");
        &d[0].kind
    }

    #[test]
    fn identical_trees_have_no_differences() {
        let (a, b) = pair();
        assert_eq!(diffs(a.path(), b.path()), vec![]);
    }

    #[test]
    fn detects_changed_byte() {
        let (a, b) = pair();
        let f = fs::OpenOptions::new()
            .write(true)
            .open(b.path().join("d/file"))
            .expect("open");
        f.write_all_at(b"\xff", 4321).expect("write");
        drop(f);
        set_mtime(&b.path().join("d/file"), 1_000_000_000, 123_456_789);
        let d = diffs(a.path(), b.path());
        // Both names of the hard-linked file report it.
        assert_eq!(d.len(), 2, "{d:#?}");
        assert!(d.iter().all(|x| x.kind == DiffKind::Content { offset: 4321 }));
        assert_eq!(d[0].path, b"d/file");
        assert!(d[0].to_string().contains("/d/file: content differs"));
    }

    #[test]
    fn detects_changed_byte_in_sparse_file_data() {
        let (a, b) = pair();
        let f = fs::OpenOptions::new()
            .write(true)
            .open(b.path().join("sparse"))
            .expect("open");
        f.write_all_at(b"T", 1 << 20).expect("write");
        drop(f);
        set_mtime(&b.path().join("sparse"), 1_200_000_000, 123_456_789);
        let d = diffs(a.path(), b.path());
        assert_eq!(only(&d), &DiffKind::Content { offset: 1 << 20 });
    }

    #[test]
    fn holes_equal_written_zeros() {
        let (a, b) = pair();
        let mut data = vec![0u8; (1 << 20) + 4];
        data[1 << 20..].copy_from_slice(b"tail");
        fs::write(b.path().join("sparse"), &data).expect("write");
        set_mtime(&b.path().join("sparse"), 1_200_000_000, 123_456_789);
        assert_eq!(diffs(a.path(), b.path()), vec![]);
    }

    #[test]
    fn detects_changed_mode() {
        let (a, b) = pair();
        fs::set_permissions(b.path().join("d/file"), fs::Permissions::from_mode(0o755)).expect("chmod");
        let d = diffs(a.path(), b.path());
        assert!(d.iter().all(|x| x.kind
            == DiffKind::Mode {
                expected: 0o4755,
                actual: 0o755
            }));
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].to_string(), "/d/file: mode: expected 4755, actual 0755");
    }

    #[test]
    fn detects_broken_hard_link() {
        let (a, b) = pair();
        let p = b.path().join("link");
        fs::remove_file(&p).expect("unlink");
        fs::copy(b.path().join("d/file"), &p).expect("copy");
        rustix::fs::lsetxattr(&p, "user.k", b"v", XattrFlags::empty()).expect("setxattr");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o4755)).expect("chmod");
        set_mtime(&p, 1_000_000_000, 123_456_789);
        set_mtime(b.path(), 1_400_000_000, 123_456_789);
        let d = diffs(a.path(), b.path());
        assert!(
            d.iter().any(|x| matches!(
                &x.kind,
                DiffKind::HardLinks { expected, actual }
                    if expected == &vec![b"d/file".to_vec(), b"link".to_vec()]
                        && actual == &vec![b"d/file".to_vec()]
            )),
            "{d:#?}"
        );
        assert!(d
            .iter()
            .any(|x| x.kind == DiffKind::LinkCount { expected: 2, actual: 1 }));
        // Nothing else differs.
        assert!(d
            .iter()
            .all(|x| matches!(x.kind, DiffKind::HardLinks { .. } | DiffKind::LinkCount { .. })));
        let no_links = CompareOpts {
            hard_links: false,
            ..CompareOpts::default()
        };
        assert_eq!(compare_trees(a.path(), b.path(), &no_links).expect("compare"), vec![]);
    }

    #[test]
    fn detects_missing_xattr() {
        let (a, b) = pair();
        rustix::fs::lremovexattr(b.path().join("d/file"), "user.k").expect("removexattr");
        let d = diffs(a.path(), b.path());
        assert_eq!(d.len(), 2);
        assert_eq!(
            d[0].kind,
            DiffKind::XattrMissing {
                name: b"user.k".to_vec()
            }
        );
        rustix::fs::lsetxattr(b.path().join("d/file"), "user.k", b"w", XattrFlags::empty()).expect("setxattr");
        let d = diffs(a.path(), b.path());
        assert!(matches!(&d[0].kind, DiffKind::XattrValue { .. }), "{d:#?}");
        let no_x = CompareOpts {
            xattrs: false,
            ..CompareOpts::default()
        };
        assert_eq!(compare_trees(a.path(), b.path(), &no_x).expect("compare"), vec![]);
    }

    #[test]
    fn detects_mtime_nanosecond() {
        let (a, b) = pair();
        set_mtime(&b.path().join("d"), 1_300_000_000, 123_456_788);
        let d = diffs(a.path(), b.path());
        assert_eq!(
            only(&d),
            &DiffKind::Mtime {
                expected: (1_300_000_000, 123_456_789),
                actual: (1_300_000_000, 123_456_788)
            }
        );
        let secs = CompareOpts {
            times: TimeFidelity::Seconds,
            ..CompareOpts::default()
        };
        assert_eq!(compare_trees(a.path(), b.path(), &secs).expect("compare"), vec![]);
    }

    #[test]
    fn seconds32_wraps_like_a_128_byte_inode() {
        let (a, b) = pair();
        set_mtime(&a.path().join("d"), 3_000_000_000, 5);
        set_mtime(&b.path().join("d"), 3_000_000_000 - (1 << 32), 0);
        let opts = CompareOpts {
            times: TimeFidelity::Seconds32,
            ..CompareOpts::default()
        };
        assert_eq!(compare_trees(a.path(), b.path(), &opts).expect("compare"), vec![]);
        assert_eq!(diffs(a.path(), b.path()).len(), 1);
    }

    #[test]
    fn detects_symlink_target_missing_and_extra() {
        let (a, b) = pair();
        fs::remove_file(b.path().join("sym")).expect("unlink");
        std::os::unix::fs::symlink("d/filE", b.path().join("sym")).expect("symlink");
        set_mtime(&b.path().join("sym"), 1_100_000_000, 123_456_789);
        fs::write(b.path().join("d/new"), b"").expect("write");
        set_mtime(&b.path().join("d"), 1_300_000_000, 123_456_789);
        fs::remove_file(b.path().join("sparse")).expect("unlink");
        set_mtime(b.path(), 1_400_000_000, 123_456_789);
        let d = diffs(a.path(), b.path());
        let kinds: Vec<_> = d.iter().map(|x| (x.path.clone(), x.kind.clone())).collect();
        assert_eq!(
            kinds,
            vec![
                (b"d/new".to_vec(), DiffKind::Extra),
                (b"sparse".to_vec(), DiffKind::Missing),
                (
                    b"sym".to_vec(),
                    DiffKind::SymlinkTarget {
                        expected: b"d/file".to_vec(),
                        actual: b"d/filE".to_vec()
                    }
                ),
            ]
        );
    }

    #[test]
    fn lost_found_and_root_attrs_can_be_ignored() {
        let (a, b) = pair();
        fs::create_dir(b.path().join("lost+found")).expect("mkdir");
        fs::set_permissions(b.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
        let d = diffs(a.path(), b.path());
        assert!(d.iter().any(|x| x.path == b"lost+found" && x.kind == DiffKind::Extra));
        let opts = CompareOpts {
            ignore_lost_found: true,
            ignore_root_attrs: true,
            ..CompareOpts::default()
        };
        assert_eq!(compare_trees(a.path(), b.path(), &opts).expect("compare"), vec![]);
    }

    #[test]
    fn display_escapes_odd_bytes() {
        let d = Difference {
            path: b"a/\xff\x01b".to_vec(),
            kind: DiffKind::Missing,
        };
        assert_eq!(d.to_string(), "/a/\\xff\\x01b: missing in actual");
    }
}
