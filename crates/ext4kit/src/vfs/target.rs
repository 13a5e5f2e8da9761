//! Naming what a call acts on: a path, a name in a directory, or an inode
//! number — the three ways the kernel's calls take one (`stat(path)`,
//! `fstatat(dirfd, name)`, `fstat(fd)` / a file handle). One type for all
//! three means one `stat`, one `setxattr`, one `unlink`, whoever calls: a
//! program with paths, or a frontend that holds node ids (the FUSE
//! server, which the kernel sends `LOOKUP(parent, name)` and inode
//! numbers).
//!
//! A [`Target`] converts from a path (`&[u8]`, a byte-string literal,
//! `&str`, `&Vec<u8>`) and from an inode number (`u32`), so the common
//! calls read as `fs.stat(b"/etc/hostname")` or `fs.stat(ino)`.

/// What a call acts on (see the module doc).
///
/// Calls that act on an inode (`stat`, `setattr`, the xattr calls…)
/// accept all three forms. A path's final symlink is followed unless
/// [`Target::nofollow`] says not to; a name in a directory is the entry
/// itself (a symlink there is not followed: a frontend with node ids has
/// the kernel do its walking). Calls that change a directory entry
/// (`unlink`, `rmdir`, a new inode's name, a rename's two names) need a
/// name: a path or [`Target::at`]; an inode number there is EINVAL.
///
/// ```
/// use ext4kit::Target;
/// let by_path: Target = b"/etc/hostname".into();
/// let not_followed = Target::path(b"/lib").nofollow();
/// let by_number: Target = 12u32.into();
/// let in_dir = Target::at(2, b"etc");
/// # let _ = (by_path, not_followed, by_number, in_dir);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    named: Named<'a>,
    follow: bool,
}

/// The three forms of a [`Target`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Named<'a> {
    /// A path from the root.
    Path(&'a [u8]),
    /// A name in the directory with this inode number.
    At(u32, &'a [u8]),
    /// An inode number.
    Ino(u32),
}

impl<'a> Target<'a> {
    /// A path from the root (relative paths are taken from the root too);
    /// its final symlink is followed.
    pub fn path(path: &'a [u8]) -> Self {
        Target {
            named: Named::Path(path),
            follow: true,
        }
    }

    /// The entry `name` of directory inode `dir` (the `*at` calls' dirfd
    /// and name).
    pub fn at(dir: u32, name: &'a [u8]) -> Self {
        Target {
            named: Named::At(dir, name),
            follow: false,
        }
    }

    /// Inode `ino` itself.
    pub fn ino(ino: u32) -> Self {
        Target {
            named: Named::Ino(ino),
            follow: false,
        }
    }

    /// Do not follow a path's final symlink (`lstat`, `lchown`,
    /// `lsetxattr`: `AT_SYMLINK_NOFOLLOW`).
    pub fn nofollow(self) -> Self {
        Target { follow: false, ..self }
    }

    /// Which form it is.
    pub(crate) fn named(&self) -> Named<'a> {
        self.named
    }

    /// Whether a path's final symlink is followed.
    pub(crate) fn follows(&self) -> bool {
        self.follow
    }

    /// The path, for messages (`None` for the other forms).
    pub(crate) fn path_shown(&self) -> Option<&'a [u8]> {
        match self.named {
            Named::Path(p) => Some(p),
            _ => None,
        }
    }
}

impl<'a> From<&'a [u8]> for Target<'a> {
    fn from(p: &'a [u8]) -> Self {
        Target::path(p)
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for Target<'a> {
    fn from(p: &'a [u8; N]) -> Self {
        Target::path(p)
    }
}

impl<'a> From<&'a Vec<u8>> for Target<'a> {
    fn from(p: &'a Vec<u8>) -> Self {
        Target::path(p)
    }
}

impl<'a> From<&'a str> for Target<'a> {
    fn from(p: &'a str) -> Self {
        Target::path(p.as_bytes())
    }
}

impl<'a> From<&'a String> for Target<'a> {
    fn from(p: &'a String) -> Self {
        Target::path(p.as_bytes())
    }
}

impl From<u32> for Target<'_> {
    fn from(ino: u32) -> Self {
        Target::ino(ino)
    }
}
