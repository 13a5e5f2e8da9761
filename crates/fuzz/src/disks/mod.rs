//! Hostile-disk campaigns: every container format crates/vdisk opens
//! (qcow2, VHD, VHDX, VMDK, Android sparse, LVM2), mutated in its headers
//! and tables, must give a clear error — never a panic, a hang, or memory
//! out of proportion to the file.
//!
//! - [`seeds`]: real images made by qemu-img, img2simg and LVM2's tools
//!   from one small ext4, cached in `target/fuzz-disks/`.
//! - [`map`]: where each format's header fields, table entries and texts
//!   are in a seed; [`seal`] re-seals the checksums over them.
//! - [`mutate`] (with [`text`] and [`vhdx_log`]): a case is a pure
//!   function of (format, seed).
//! - [`exercise`]: open, read the whole virtual disk (bounded), open the
//!   filesystem and walk it, write and flush if writable.
//! - [`worker`] / [`runner`]: each case in its own process under
//!   `RLIMIT_AS` and a time limit.
//!
//! CI runs `tests/hostile_disks.rs`; long campaigns and replays use the
//! `ext4kit-fuzz-disks` binary.

pub mod exercise;
pub mod map;
pub mod mutate;
pub mod runner;
pub mod seal;
pub mod seeds;
pub mod text;
pub mod vhdx_log;
pub mod worker;

pub use exercise::{exercise, ExerciseLimits, Outcome};
pub use mutate::{generate, DiskCase};
pub use runner::{merge, run_family, still_fails, DiskCampaign, DiskFailure, DiskReport};
pub use seeds::{seeds, seeds_dir, Family, Seed};
