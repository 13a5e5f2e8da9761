//! The damaged-image corpus: write operations on images we damaged
//! ourselves, checked against `e2fsck -fn`.
//!
//! The compatibility contract (ARCHITECTURE.md) promises that a damaged
//! image is never made worse. The read campaign (`crate::campaign`) checks
//! that nothing panics or hangs; this module checks the write side: for each
//! damaged image and each write operation (mkdir, create+write, unlink,
//! rmdir, rename, link, symlink, truncate, setxattr — through the library
//! and through the `ext4kit` binary) the operation either succeeds and
//! `e2fsck -fn` reports no problem it did not report before, or it refuses
//! and leaves the image byte-identical (apart from the superblock's error
//! record, which the kernel's `ext4_error` also writes).
//!
//! - [`corpus`]: the clean bases (ext4 with a journal, ext4 without one on
//!   1 KiB blocks, ext2 and ext3 on 1 KiB blocks; made by `mke2fs -d` and
//!   then written by our own library) and the damage: bit flips aimed at
//!   every metadata structure, and the semantic damage e2fsprogs' test
//!   images carry (truncated extent trees, cross-linked blocks, bitmaps
//!   that lie, duplicate names, EA-inode references without `ea_inode`, a
//!   missing or non-directory root). Every image is a pure function of a
//!   seed.
//! - [`fsck`]: `e2fsck -fn`'s problem lines as a multiset to compare.
//! - [`ops`]: the operations, as library calls and as command lines.
//! - [`check`]: one case (image × operation × frontend) and its verdict.
//! - [`e2fsprogs`]: e2fsprogs' own corrupt test images (`tests/f_*`) with
//!   mkdir, put and rm through the `ext4kit` binary, e2fsck before and
//!   after — a campaign over images fetched from outside, never CI.

pub mod check;
pub mod corpus;
pub mod e2fsprogs;
pub mod fsck;
pub mod ops;
