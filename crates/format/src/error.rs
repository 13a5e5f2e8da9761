//! Typed errors for malformed on-disk structures.
//!
//! The format layer knows bytes, not blocks: it names the *structure* that is
//! wrong and why. The ext4 layer, which knows where the bytes came from, wraps
//! these with the block or inode number so a user sees both.

/// A structure failed validation while being parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// A field holds a value the on-disk rules forbid (bad magic, a length
    /// that overruns its block, a count larger than its limit, ...).
    #[error("corrupt {structure}: {reason}")]
    Corrupt {
        /// Which on-disk structure (e.g. "superblock", "extent header").
        structure: &'static str,
        /// What rule the bytes break.
        reason: String,
    },
    /// The stored checksum does not match the one computed over the bytes.
    #[error("{structure} checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum {
        /// Which on-disk structure.
        structure: &'static str,
        /// The checksum recorded on disk.
        stored: u32,
        /// The checksum of the bytes as read.
        computed: u32,
    },
}

/// Shorthand used by every parser: build a [`FormatError::Corrupt`].
pub fn corrupt(structure: &'static str, reason: impl Into<String>) -> FormatError {
    FormatError::Corrupt {
        structure,
        reason: reason.into(),
    }
}

/// Result alias for the format layer.
pub type Result<T> = std::result::Result<T, FormatError>;
