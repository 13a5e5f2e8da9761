//! Shared pieces of the benchmark programs: building images with the
//! kernel (loop mount) so peers and ext4kit see the very same bytes, and
//! small statistics helpers (medians, since these machines are noisy).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Run a command, failing with its stderr.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// Whether we run as root (loop mounts need it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// A loop mount that unmounts when dropped.
pub struct Mount {
    /// Where it is mounted.
    pub dir: PathBuf,
}

impl Mount {
    /// `mount -o loop[,opts] image dir`.
    pub fn new(image: &Path, dir: &Path, opts: &str) -> Result<Mount, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let o = if opts.is_empty() {
            "loop".to_string()
        } else {
            format!("loop,{opts}")
        };
        run(Command::new("mount").arg("-o").arg(o).arg(image).arg(dir))?;
        Ok(Mount { dir: dir.to_path_buf() })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
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
