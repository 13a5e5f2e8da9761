//! Shared pieces of the benchmark programs: thin wrappers over the test
//! kit's command runner and loop mounts (so peers and ext4kit see the very
//! same bytes), and statistics helpers (medians: these machines are noisy).
//!
//! [`suite`] is `ext4kit bench` (the `ext4kit-bench` program, which the
//! `ext4kit` binary runs): every workload of the programs in `src/bin` on
//! every peer, in one run, with a report and charts. The library sets no
//! global allocator; each program here sets the one the `ext4kit` binary
//! ships with.

pub mod peers;
pub mod session;
pub mod srctree;
pub mod suite;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Run a command to success (the test kit's runner), as a `String` error
/// for the benchmark mains.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    ext4kit_testkit::run_ok(cmd, &[0])
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Fail unless loop mounts are possible (root and a loop device).
pub fn need_kernel(what: &str) -> Result<(), String> {
    ext4kit_testkit::kernel_available().map_err(|e| format!("{what} needs a loop mount for the kernel peer: {e}"))
}

/// A loop mount (unmounted on drop); `opts` is "" or "ro".
pub fn mount(image: &Path, dir: &Path, opts: &str) -> Result<ext4kit_testkit::LoopMount, String> {
    ext4kit_testkit::LoopMount::mount(image, dir, "ext4", opts == "ro").map_err(|e| e.to_string())
}

/// Median of durations (upper median for even counts).
pub fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Drop the kernel's page cache so a "cold" run really reads the device.
pub fn drop_kernel_caches() {
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}
