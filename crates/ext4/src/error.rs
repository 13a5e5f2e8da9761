//! Errors of the engine, errno-shaped so the FUSE layer and POSIX-minded
//! callers can map them, and descriptive so a CLI user sees *what* failed and
//! *where* (path, inode, block).

use ext4kit_format::FormatError;

/// POSIX error numbers the engine returns (Linux values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Errno {
    EPERM = 1,
    ENOENT = 2,
    EIO = 5,
    E2BIG = 7,
    ENXIO = 6,
    EBADF = 9,
    EACCES = 13,
    EBUSY = 16,
    EEXIST = 17,
    EXDEV = 18,
    ENOTDIR = 20,
    EISDIR = 21,
    EINVAL = 22,
    EMFILE = 24,
    EFBIG = 27,
    ENOSPC = 28,
    EROFS = 30,
    EMLINK = 31,
    ERANGE = 34,
    ENAMETOOLONG = 36,
    ENOTEMPTY = 39,
    ELOOP = 40,
    ENODATA = 61,
    EOVERFLOW = 75,
    EOPNOTSUPP = 95,
    /// A file handle names no live inode (NFS's "stale file handle").
    ESTALE = 116,
    /// "Structure needs cleaning": the kernel's EFSCORRUPTED.
    EUCLEAN = 117,
}

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A POSIX-level failure (no such file, not a directory, ...).
    #[error("{msg}")]
    Posix {
        /// The errno a syscall would return.
        errno: Errno,
        /// Human-readable context: which path or object and why.
        msg: String,
    },
    /// The device failed.
    #[error("I/O error {context}: {source}")]
    Io {
        /// What was being read or written.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// On-disk data breaks an ext4 rule. The message ends with "run
    /// e2fsck" (the kernel's "run e2fsck" in `ext4_error`): the user must
    /// learn both what is damaged and what repairs it.
    #[error("corrupt filesystem: {location}: {source}; run e2fsck")]
    Corrupt {
        /// Where: "inode 12", "block 8731 (directory inode 2)", ...
        location: String,
        /// What the format layer found wrong.
        #[source]
        source: FormatError,
    },
    /// The image uses something we cannot handle.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl Error {
    /// Build a POSIX error with a message.
    pub fn posix(errno: Errno, msg: impl Into<String>) -> Self {
        Error::Posix { errno, msg: msg.into() }
    }

    /// Wrap a format error with its location.
    pub fn corrupt(location: impl Into<String>, source: FormatError) -> Self {
        note_damage();
        Error::Corrupt {
            location: location.into(),
            source,
        }
    }

    /// Corruption detected by engine logic rather than a parser.
    pub fn corrupt_msg(location: impl Into<String>, structure: &'static str, reason: impl Into<String>) -> Self {
        note_damage();
        Error::Corrupt {
            location: location.into(),
            source: ext4kit_format::error::corrupt(structure, reason),
        }
    }

    /// Wrap an I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The errno a syscall would report for this error.
    pub fn errno(&self) -> Errno {
        match self {
            Error::Posix { errno, .. } => *errno,
            Error::Io { .. } => Errno::EIO,
            Error::Corrupt { .. } => Errno::EUCLEAN,
            Error::Unsupported(_) => Errno::EOPNOTSUPP,
        }
    }
}

thread_local! {
    static DAMAGE_SEEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn note_damage() {
    DAMAGE_SEEN.with(|c| c.set(c.get().wrapping_add(1)));
}

/// How many corruption errors this thread has raised so far. A
/// transaction handle compares it at its start and its drop: a handle
/// dropped half-done *because of damage* aborts the journal
/// (`fs_errors.rs`), one dropped for ENOSPC or an I/O error does not.
pub fn damage_seen() -> u64 {
    DAMAGE_SEEN.with(|c| c.get())
}

/// Result alias for the engine.
pub type Result<T> = std::result::Result<T, Error>;

/// Add location context to an error that lacks it.
pub fn annotate(e: Error, what: &str) -> Error {
    match e {
        Error::Io { context, source } => Error::Io {
            context: format!("{context} ({what})"),
            source,
        },
        Error::Corrupt { location, source } => Error::Corrupt {
            location: format!("{location} ({what})"),
            source,
        },
        other => other,
    }
}
