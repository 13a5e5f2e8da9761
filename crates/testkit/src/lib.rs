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
//! - [`compare_trees`]: the whole-tree comparator that judges a read-back;
//! - [`journal`]: images whose journal needs recovery (kernel- and
//!   debugfs-written), with the replayed and unreplayed trees as oracles;
//! - [`vm`]: Debian's kernel booted in qemu with a test's disk images and
//!   a script, for what the host kernel lacks (device-mapper: [`lvm`]).
//!
//! Binaries: `ext4kit-treecmp` (the comparator on the command line) and
//! `ext4kit-fixtures` (build the whole matrix into a directory).
//!
//! A reader test, in outline:
//!
//! ```no_run
//! use ext4kit_testkit::*;
//! # fn main() -> std::io::Result<()> {
//! let tmp = std::env::temp_dir().join("my-test");
//! let src = tmp.join("src");
//! build_source_tree(&src, &TreeOpts::small())?;
//! for spec in image_matrix() {
//!     let img = tmp.join(format!("{}.img", spec.name));
//!     make_image(&spec, &src, &img)?;
//!     let out = tmp.join(format!("out-{}", spec.name));
//!     // ... extract `img` into `out` with the engine under test ...
//!     let diffs = compare_trees(&src, &out, &spec.compare_opts())?;
//!     assert!(diffs.is_empty(), "{}: {diffs:?}", spec.name);
//! }
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod compare;
mod image;
pub mod journal;
pub mod lvm;
pub mod mountpeer;
mod rng;
pub mod servers;
mod tree;
mod util;
pub mod vm;

pub use compare::{compare_trees, read_xattrs, CompareOpts, DiffKind, Difference, TimeFidelity};
pub use image::{
    compare_rdump, debugfs_rdump, e2fsck_clean, image_matrix, is_kernel_unavailable, kernel_available, make_image,
    make_kernel_image, DirHash, HashSign, ImageSpec, KernelUnavailable, LoopMount, FIXED_HASH_SEED, FIXED_TIME,
    FIXED_UUID,
};
pub use rng::TestRng;

/// Version of what [`build_source_tree`] and [`make_image`] produce. Bump
/// it whenever either changes its output, so `ext4kit-fixtures --reuse`
/// rebuilds fixture directories made by older code.
pub const FIXTURE_VERSION: u32 = 1;
pub use tree::{build_source_tree, TreeManifest, TreeOpts, POST_2038_SECS, PRE_1970_SECS};
pub use util::{
    describe, drop_kernel_caches_until, env_u64, escape_bytes, ext4kit_bin, require_root_and_fuse, run_ok, sh_as,
    Scratch,
};
