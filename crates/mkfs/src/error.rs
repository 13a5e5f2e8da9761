//! Why mkfs refused or failed.

use ext4kit_format::FormatError;

/// Everything that can stop [`crate::mkfs`]. The messages name the option
/// or the size at fault, for a command line to print as they are.
#[derive(Debug, thiserror::Error)]
pub enum MkfsError {
    /// The options or the size cannot make a filesystem (mke2fs exits with
    /// a usage error): a bad block or inode size, too small, too many
    /// inodes, a feature combination ext4 forbids.
    #[error("{0}")]
    Invalid(String),
    /// The device cannot be written.
    #[error("device is read-only")]
    ReadOnly,
    /// The layout does not fit: no room for a contiguous run (the journal
    /// on a fragmented or tiny filesystem).
    #[error("{0}")]
    NoSpace(String),
    /// A feature ext4 knows but this mkfs cannot lay out.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The device (or `/dev/urandom`) failed.
    #[error("I/O error {context}: {source}")]
    Io {
        /// What was being read or written.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The format layer refused a record this mkfs built (a bug here).
    #[error("building {context}: {source}")]
    Format {
        /// Which record.
        context: String,
        /// What the format layer found wrong.
        #[source]
        source: FormatError,
    },
}

impl MkfsError {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        MkfsError::Invalid(msg.into())
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        MkfsError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, MkfsError>;
