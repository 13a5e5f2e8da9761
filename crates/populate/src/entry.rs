//! One file of a source tree as every source reports it — a host
//! directory, a tar member, an OCI layer's member — so that one writer
//! puts all of them into the image.
//!
//! Paths are relative to the source's root, checked here once for every
//! source: a component `..` or a leading `/` would place a file outside
//! the tree being built, and is refused with the path named (GNU tar
//! strips a leading `/` with a warning; an image builder must not guess).

use ext4kit::Timestamp;

/// A checked path inside the tree: components without `.`, `..` or empty
/// ones, joined by `/`; empty for the tree's root.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EntryPath(Vec<u8>);

impl EntryPath {
    /// The tree's root.
    pub fn root() -> Self {
        EntryPath(Vec::new())
    }

    /// Check and normalise a path as a source wrote it: `./a//b/` is
    /// `a/b`; `/a` and `a/../b` are refused (the reason is the error).
    pub fn parse(raw: &[u8]) -> Result<Self, String> {
        if raw.first() == Some(&b'/') {
            return Err("an absolute path: it would land outside the tree".into());
        }
        if raw.contains(&0) {
            return Err("a NUL byte in the path".into());
        }
        let mut out: Vec<u8> = Vec::with_capacity(raw.len());
        for c in raw.split(|&b| b == b'/') {
            match c {
                b"" | b"." => {}
                b".." => return Err("a \"..\" component: it would land outside the tree".into()),
                c if c.len() > 255 => {
                    return Err(format!("a name of {} bytes (ext4 allows 255)", c.len()));
                }
                c => {
                    if !out.is_empty() {
                        out.push(b'/');
                    }
                    out.extend_from_slice(c);
                }
            }
        }
        Ok(EntryPath(out))
    }

    /// The path's bytes (`a/b`; empty for the root).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether this is the tree's root.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The parent directory and the last name; `None` for the root.
    pub fn split(&self) -> Option<(EntryPath, &[u8])> {
        if self.0.is_empty() {
            return None;
        }
        Some(match self.0.iter().rposition(|&b| b == b'/') {
            Some(i) => (EntryPath(self.0[..i].to_vec()), &self.0[i + 1..]),
            None => (EntryPath::root(), &self.0[..]),
        })
    }

    /// The components, first to last.
    pub fn components(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|&b| b == b'/').filter(|c| !c.is_empty())
    }

    /// `self/name`.
    pub fn join(&self, name: &[u8]) -> EntryPath {
        let mut v = self.0.clone();
        if !v.is_empty() {
            v.push(b'/');
        }
        v.extend_from_slice(name);
        EntryPath(v)
    }

    /// Whether `self` is `other` or lies below it.
    pub fn starts_with(&self, other: &EntryPath) -> bool {
        other.0.is_empty()
            || self.0 == other.0
            || (self.0.starts_with(&other.0) && self.0.get(other.0.len()) == Some(&b'/'))
    }
}

impl std::fmt::Display for EntryPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            f.write_str(".")
        } else {
            f.write_str(&String::from_utf8_lossy(&self.0))
        }
    }
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file of this size; its data comes with the entry.
    File {
        /// Size in bytes, holes included.
        size: u64,
    },
    /// A symbolic link to this target.
    Symlink(Vec<u8>),
    /// Another name for the file at this path, which the source gave
    /// before.
    HardLink(EntryPath),
    /// A character device (major, minor).
    CharDevice(u32, u32),
    /// A block device (major, minor).
    BlockDevice(u32, u32),
    /// A named pipe.
    Fifo,
    /// A Unix-domain socket.
    Socket,
    /// An OCI whiteout: the path is removed from what the earlier layers
    /// put there.
    Whiteout,
    /// An OCI opaque marker: the directory at this path keeps nothing of
    /// what the earlier layers put in it.
    Opaque,
}

/// Owner, permissions and times of an entry, as the source records them
/// (before any owner map).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Permission bits with setuid, setgid and sticky (`0o7777`).
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Last access.
    pub atime: Timestamp,
    /// Last modification.
    pub mtime: Timestamp,
}

/// Extended attributes: (name with its namespace prefix, value), in order.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// One entry of a source.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Where it goes, relative to the source's root.
    pub path: EntryPath,
    /// What it is.
    pub kind: EntryKind,
    /// Owner, permissions, times.
    pub meta: Meta,
    /// Extended attributes (name with its namespace prefix, value).
    pub xattrs: Xattrs,
    /// For a file with several names on the host: its device and inode
    /// there, so that every name of it, from any source of one build,
    /// becomes a name of one inode in the image.
    pub identity: Option<(u64, u64)>,
}

/// A regular file's contents, handed out as data segments in file order;
/// what lies between them is a hole.
pub trait FileData {
    /// Fill `buf` with the next bytes of data and say where in the file
    /// they go; `None` when no data is left.
    fn read_segment(&mut self, buf: &mut [u8]) -> std::io::Result<Option<(u64, usize)>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(EntryPath::parse(b"./a//b/").unwrap().as_bytes(), b"a/b");
        assert!(EntryPath::parse(b".").unwrap().is_root());
        assert!(EntryPath::parse(b"./").unwrap().is_root());
        assert!(EntryPath::parse(b"/etc/passwd").is_err());
        assert!(EntryPath::parse(b"a/../../x").is_err());
        assert!(EntryPath::parse(b"..").is_err());
        assert!(EntryPath::parse(&[b'n'; 256]).is_err());
        let p = EntryPath::parse(b"a/b/c").unwrap();
        let (d, n) = p.split().unwrap();
        assert_eq!((d.as_bytes(), n), (&b"a/b"[..], &b"c"[..]));
        assert!(p.starts_with(&EntryPath::parse(b"a/b").unwrap()));
        assert!(!EntryPath::parse(b"a/bc")
            .unwrap()
            .starts_with(&EntryPath::parse(b"a/b").unwrap()));
        assert!(p.starts_with(&EntryPath::root()));
        assert_eq!(EntryPath::root().join(b"x").as_bytes(), b"x");
    }
}
