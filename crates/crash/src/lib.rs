//! Crash-state testing for ext4kit: does every image a power cut could
//! leave replay to a consistent filesystem that keeps every promise made?
//!
//! - [`workload`]: operation mixes (and the shapes of xfstests generic/455,
//!   457 and 482) run through the library over an
//!   [`ext4kit_blockdev::RecordingDevice`], each thread keeping a
//!   [`model::History`] of what it did and what fsync/fdatasync/sync made
//!   durable;
//! - crash images, rebuilt from the recorded log at every flush and at
//!   random points between flushes with unflushed writes dropped
//!   ([`ext4kit_blockdev::WriteLog`], [`campaign::choose_cuts`]);
//! - [`check`]: each image opened by ext4kit read-only and read-write
//!   (replay), `e2fsck -fn` after our replay, `e2fsck -fy`'s own replay
//!   compared tree for tree, and every promise ([`model::check_promises`]);
//! - [`campaign`]: many runs × many cuts on several threads, a summary
//!   table, the first failing image of each kind kept with a one-line
//!   reproduction command.
//!
//! - [`container`]: the same under qcow2 or VHDX — the recording device
//!   holds the container file, so a cut falls anywhere in the format's
//!   own writes; `qemu-img check` judges each crash image's container.
//!
//! The CI tests are `tests/crash.rs` and `tests/crash_formats.rs`; the
//! long campaign is the `ext4kit-crash` binary (`--format qcow2|vhdx`).

#![warn(missing_docs)]

pub mod campaign;
pub mod check;
pub mod container;
pub mod fsimage;
pub mod model;
pub mod tree;
pub mod workload;

pub use campaign::{check_run, choose_cuts, run_campaign, Campaign, Summary};
pub use check::Checker;
pub use container::Container;
pub use fsimage::FsVariant;
pub use model::{FailKind, Failure};
pub use workload::{run, Recorded, RunSpec, Workload};
