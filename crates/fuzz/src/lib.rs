//! Hostile-image testing for ext4kit.
//!
//! The compatibility contract (ARCHITECTURE.md) promises that a damaged or
//! hostile image never panics, hangs or exhausts memory. This crate checks
//! that promise the way it is most likely to be broken: it takes small,
//! feature-diverse images made by `mke2fs` ([`base`]), breaks them one field
//! at a time with a structure-aware, seed-deterministic mutator ([`mutate`],
//! guided by a [`map`] of where each structure lives and able to recompute
//! checksums so corruptions reach the parsers behind them), opens each with
//! the engine and walks everything a reader can reach ([`mod@walk`]), on
//! worker threads under `catch_unwind` with a time bound and a memory watch
//! ([`campaign`]). Every failure is reproducible from its seed with the
//! `ext4kit-fuzz-images` binary.
//!
//! The same walker, with a digest of everything it saw, checks that many
//! threads reading one shared `Fs` see exactly what one thread sees
//! (`tests/concurrent_readers.rs`).
//!
//! # Running
//!
//! - CI: `cargo test --release -p ext4kit-fuzz` (2,000 mutated images,
//!   every truncation of one base, the clean bases, concurrent readers;
//!   about a minute on 2 cores). `EXT4KIT_FUZZ_COUNT` / `EXT4KIT_FUZZ_START`
//!   change the campaign's size and first seed. e2fsprogs must be
//!   installed; without it the tests fail and say so.
//! - Long campaigns: `cargo run --release -p ext4kit-fuzz --bin
//!   ext4kit-fuzz-images -- --count 1000000 --start 0`. Add
//!   `CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true` to the environment to
//!   also catch arithmetic overflow (a panic in debug builds).
//! - Replay: `... -- --seed N` prints the mutation field by field and what
//!   the engine did; `--save FILE` writes the image; `--minimize` drops
//!   edits the failure does not need.
//!
//! The container formats under the engine (qcow2, VHD, VHDX, VMDK,
//! Android sparse, LVM2) have their own campaign in [`disks`]
//! (`tests/hostile_disks.rs`, the `ext4kit-fuzz-disks` binary).
//!
//! Base images are cached in `target/fuzz-bases/` (or
//! `$EXT4KIT_FUZZ_BASES`); delete the directory to rebuild them.

pub mod alloc;
pub mod base;
pub mod campaign;
pub mod damaged;
pub mod disks;
pub mod map;
pub mod mutate;
pub mod prng;
pub mod walk;

pub use base::{base_named, base_specs, bases, check_tools, BaseError, BaseImage, BaseSpec, TreeOpts};
pub use campaign::{
    guarded, reproduce_command, run_campaign, run_case, run_cases, run_cases_with, run_image, run_seeds,
    CampaignConfig, CampaignReport, CaseResult, Failure, FailureKind, PanicReport,
};
pub use map::StructureMap;
pub use mutate::Mutation;
pub use walk::{walk, walk_with, TreeDigest, WalkLimits, WalkReport};
