//! ext2/ext3/ext4 on-disk structures.
//!
//! This crate knows bytes, not files: every structure is parsed from and
//! serialised to byte slices, checked here (magic, bounds, checksums), and
//! round-trips bit-exactly. No I/O happens here, which is what makes every
//! parser fuzzable in isolation. Malformed input is a [`FormatError`] that
//! names the structure and the rule it breaks; nothing here panics on data.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bytes;
pub mod checksum;
pub mod dirent;
pub mod error;
pub mod extent;
pub mod fast_commit;
pub mod features;
pub mod group_desc;
pub mod hash;
pub mod htree;
pub mod indirect;
pub mod inode;
pub mod jbd2;
pub mod readers;
pub mod superblock;
pub mod time;
pub mod xattr;

pub use error::{FormatError, Result};
