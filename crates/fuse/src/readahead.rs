//! A readahead window as large as one FUSE request.
//!
//! The kernel's FUSE client reads ahead through the mount's backing device
//! info (`/sys/class/bdi/0:N`), whose window starts at the VM default of
//! 128 KiB, and `process_init_reply()` only ever lowers it (`ra_pages =
//! min(bdi, init.max_readahead)`). A cold sequential read then costs one
//! READ round trip per 128 KiB although a request may carry `max_pages` ×
//! 4 KiB = 1 MiB here ([`crate::server::MAX_WRITE`]): eight round trips
//! and eight 128 KiB reads of the image where one of each would do.
//! Widening the window to 1 MiB after the mount makes every readahead
//! READ 1 MiB: counted with the kernel's `fuse:fuse_request_send`
//! tracepoint, a 512 MiB `cat` went from 2,048 READs to 514.
//!
//! Only root may write the bdi's `read_ahead_kb`; an unprivileged mount
//! keeps the kernel's 128 KiB (the mount works the same, reads take more
//! round trips). `-o readahead=KIB` chooses the window, 0 leaves it alone.

use std::path::{Path, PathBuf};

/// The default window, KiB: one request of `max_write` (1 MiB).
pub const DEFAULT_KIB: u32 = crate::server::MAX_WRITE / 1024;

/// The `read_ahead_kb` file of the mount at `mount_point`: its superblock's
/// anonymous device names the bdi (`super_setup_bdi_name(sb, "%u:%u")` in
/// fuse_bdi_init). The device is taken from /proc/self/mountinfo, not from
/// a stat of the mount point: the server calls this before it serves
/// requests, and a stat would wait for its own GETATTR answer forever.
fn bdi_file(mount_point: &Path) -> Result<PathBuf, String> {
    // The last entry for a mount point is the one on top.
    let dev = crate::inuse::mounts()
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?
        .into_iter()
        .rev()
        .find(|m| m.mount_point == mount_point)
        .map(|m| m.dev)
        .ok_or_else(|| format!("{} is not in /proc/self/mountinfo", mount_point.display()))?;
    Ok(PathBuf::from(format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    )))
}

/// Set the mount's readahead window to `kib` unless it is already that
/// large. Fails without root (sysfs is root's), which callers ignore.
pub fn widen(mount_point: &Path, kib: u32) -> Result<(), String> {
    if kib == 0 {
        return Ok(());
    }
    let f = bdi_file(mount_point)?;
    let now: u32 = std::fs::read_to_string(&f)
        .map_err(|e| format!("{}: {e}", f.display()))?
        .trim()
        .parse()
        .map_err(|e| format!("{}: {e}", f.display()))?;
    if now >= kib {
        return Ok(());
    }
    std::fs::write(&f, kib.to_string()).map_err(|e| format!("{}: {e}", f.display()))
}

/// The window now in effect for the mount at `mount_point`, KiB.
pub fn current(mount_point: &Path) -> Result<u32, String> {
    let f = bdi_file(mount_point)?;
    std::fs::read_to_string(&f)
        .map_err(|e| format!("{}: {e}", f.display()))?
        .trim()
        .parse()
        .map_err(|e| format!("{}: {e}", f.display()))
}
