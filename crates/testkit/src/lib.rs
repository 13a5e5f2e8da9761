//! Test oracles for ext4kit.
//!
//! ext4kit's correctness claim is "mke2fs, e2fsck and the Linux kernel agree
//! with us". This crate supplies the machinery every test needs to check
//! that claim:
//!
//! - [`build_source_tree`]: a deterministic tree holding every object kind
//!   and boundary case the ext4 format treats specially;
//! - [`image_matrix`] / [`make_image`]: that tree baked into images by
//!   `mke2fs -d` across block sizes, features and directory-hash variants,
//!   each verified `e2fsck`-clean;
//! - [`make_kernel_image`]: the same tree written by the kernel (loop mount
//!   and `cp -a`), for "we read what the kernel wrote";
//! - [`compare_trees`]: the whole-tree comparator that judges a read-back.
//!
//! Binaries: `ext4kit-treecmp` (the comparator on the command line) and
//! `ext4kit-fixtures` (build the whole matrix into a directory).

#![warn(missing_docs)]

mod compare;
mod image;
mod prng;
mod tree;
mod util;

pub use compare::{compare_trees, read_xattrs, CompareOpts, DiffKind, Difference, TimeFidelity};
pub use image::{
    compare_rdump, debugfs_rdump, e2fsck_clean, image_matrix, is_kernel_unavailable,
    kernel_available, make_image, make_kernel_image, DirHash, HashSign, ImageSpec,
    KernelUnavailable, LoopMount, FIXED_HASH_SEED, FIXED_TIME, FIXED_UUID,
};
pub use prng::SplitMix64;
pub use tree::{build_source_tree, TreeManifest, TreeOpts, POST_2038_SECS, PRE_1970_SECS};
pub use util::escape_bytes;
