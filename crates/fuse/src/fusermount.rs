//! Unprivileged mounting through `fusermount3`.
//!
//! fuser's own unprivileged path first opens /dev/fuse itself and gives up
//! when that is refused (the device is mode 0600 on many systems), instead
//! of falling back to the setuid helper. So non-root mounts do what libfuse
//! does: start `fusermount3 -o OPTIONS -- MOUNTPOINT` with `_FUSE_COMMFD`
//! naming one end of a socket pair; it opens /dev/fuse, mounts, and sends
//! the descriptor back with SCM_RIGHTS. The session is then built on that
//! descriptor (`Session::from_fd`); unmounting is `fusermount3 -u`.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::sys;

/// Mount `mount_point` with `options` (the comma-separated fusermount3
/// option string) and return the /dev/fuse descriptor.
pub fn mount(mount_point: &Path, options: &str) -> Result<OwnedFd, String> {
    let (ours, theirs) = sys::socketpair_for_child().map_err(|e| format!("socketpair: {e}"))?;
    let out = Command::new("fusermount3")
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .arg("-o")
        .arg(options)
        .arg("--")
        .arg(mount_point)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running fusermount3: {e} (unprivileged mounts need it: apt-get install fuse3)"))?;
    drop(theirs);
    let got = sys::recv_fd(&ours);
    let res = out.wait_with_output().map_err(|e| format!("fusermount3: {e}"))?;
    match got {
        Ok(fd) if res.status.success() => Ok(fd),
        Ok(_) | Err(_) => {
            let msg = String::from_utf8_lossy(&res.stderr).trim().to_string();
            // fusermount3 opens the device with the caller's rights.
            let hint = if msg.contains("/dev/fuse") && msg.contains("Permission denied") {
                " (/dev/fuse must be readable and writable by everyone, mode 0666, as fuse3's udev rule sets it)"
            } else {
                ""
            };
            Err(format!("fusermount3 failed ({}): {msg}{hint}", res.status))
        }
    }
}
