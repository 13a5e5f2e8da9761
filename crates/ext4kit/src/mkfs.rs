//! Making a new filesystem (`mke2fs`): the `ext4kit-mkfs` crate's API,
//! re-exported so that a program needs the library alone. [`mkfs`] writes
//! an empty ext2, ext3 or ext4 filesystem onto a
//! [`BlockDevice`](crate::device::BlockDevice) in mke2fs's steps;
//! [`dry_run`] checks options and a size without writing;
//! [`MkfsOptions::readers`] ([`Reader`], see [`crate::readers`]) keeps
//! out what a boot loader or an older kernel cannot read. A fixed
//! [`Clock`](crate::Clock) and UUID make the result reproducible.

pub use ext4kit_mkfs::{
    default_journal_blocks, dry_run, hash_seed_from_uuid, mkfs, FsType, MkfsError, MkfsOptions, MkfsReport, Reader,
};
