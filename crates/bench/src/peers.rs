//! The three mounts the mount benchmark compares, each driven the way a
//! user drives it:
//!
//! - ext4kit: the `ext4kit mount` command (it detaches once the mount
//!   works) and `ext4kit umount` (returns when the server has flushed and
//!   exited);
//! - fuse2fs: e2fsprogs' FUSE server, run in the foreground (`-f`) as our
//!   child, so after `umount` we can wait for it to finish writing;
//! - the kernel's ext4 on a loop device (the physical limit).
//!
//! Each mount is undone on drop (best effort) so a failing run leaves no
//! mounts behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One of the compared filesystems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// `ext4kit mount`.
    Ext4kit,
    /// e2fsprogs' `fuse2fs`.
    Fuse2fs,
    /// The kernel's ext4 driver on a loop device.
    Kernel,
}

impl Peer {
    /// All peers, in table order.
    pub const ALL: [Peer; 3] = [Peer::Ext4kit, Peer::Fuse2fs, Peer::Kernel];

    /// Name used in tables.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Ext4kit => "ext4kit",
            Peer::Fuse2fs => "fuse2fs",
            Peer::Kernel => "kernel",
        }
    }
}

/// How to start the FUSE peers.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// The `ext4kit` binary (`target/release/ext4kit`).
    pub ext4kit_bin: PathBuf,
    /// `--threads` for the ext4kit server.
    pub threads: usize,
    /// Cache budget of the ext4kit server (`--cache-mib`) and the
    /// library, bytes.
    pub cache_budget: usize,
    /// Extra `-o` options for fuse2fs (besides `rw`/`ro`).
    pub fuse2fs_opts: String,
}

impl PeerConfig {
    /// The command that mounts `peer` (for the record printed with tables).
    pub fn describe(&self, peer: Peer, read_only: bool) -> String {
        let rw = if read_only { "ro" } else { "rw" };
        match peer {
            Peer::Ext4kit => format!(
                "{} mount -o {rw} --threads {} --cache-mib {} IMAGE DIR",
                self.ext4kit_bin.display(),
                self.threads,
                self.cache_budget >> 20
            ),
            Peer::Fuse2fs => format!("fuse2fs IMAGE DIR -f -o {}", self.fuse2fs_o(read_only)),
            Peer::Kernel => format!("mount -t ext4 -o loop{} IMAGE DIR", if read_only { ",ro" } else { "" }),
        }
    }

    fn fuse2fs_o(&self, read_only: bool) -> String {
        let rw = if read_only { "ro" } else { "rw" };
        if self.fuse2fs_opts.is_empty() {
            rw.to_string()
        } else {
            format!("{rw},{}", self.fuse2fs_opts)
        }
    }
}

enum Inner {
    Ext4kit,
    Fuse2fs(Child, PathBuf),
    Kernel(ext4kit_testkit::LoopMount),
    Gone,
}

/// A mounted peer; [`PeerMount::unmount`] reports failures, drop only tries.
pub struct PeerMount {
    peer: Peer,
    dir: PathBuf,
    cfg: PeerConfig,
    inner: Inner,
}

/// The fstype of the mount at `dir` in /proc/self/mountinfo, if any.
fn mounted_fstype(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = dir.to_str()?;
    // Fields: id parent maj:min root mount-point opts... - fstype source superopts
    info.lines().rev().find_map(|l| {
        let mut it = l.split(" - ");
        let (left, right) = (it.next()?, it.next()?);
        let mp = left.split(' ').nth(4)?;
        (mp == want).then(|| right.split(' ').next().unwrap_or("").to_string())
    })
}

/// The mount options the kernel shows for the mount at `dir` (e.g. to
/// record what fuse2fs really negotiated).
pub fn mount_options(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = std::fs::canonicalize(dir).ok()?;
    let want = want.to_str()?;
    info.lines().rev().find_map(|l| {
        let mut it = l.split(" - ");
        let (left, right) = (it.next()?, it.next()?);
        let f: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if f.get(4) != Some(&want) {
            return None;
        }
        Some(format!("{} {} | {}", r.first()?, f.get(5)?, r.get(2)?))
    })
}

impl PeerMount {
    /// Mount `image` at `dir` (created if missing) as `peer`.
    pub fn mount(peer: Peer, cfg: &PeerConfig, image: &Path, dir: &Path, read_only: bool) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let dir = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let inner = match peer {
            Peer::Ext4kit => {
                let o = Command::new(&cfg.ext4kit_bin)
                    .arg("mount")
                    .args(["-o", if read_only { "ro" } else { "rw" }])
                    .args(["--threads", &cfg.threads.to_string()])
                    .args(["--cache-mib", &(cfg.cache_budget >> 20).to_string()])
                    .arg(image)
                    .arg(&dir)
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| {
                        format!(
                            "{}: {e} (cargo build --release -p ext4kit-cli)",
                            cfg.ext4kit_bin.display()
                        )
                    })?;
                if !o.status.success() {
                    return Err(format!(
                        "ext4kit mount ({}): {}",
                        if read_only { "ro" } else { "rw" },
                        String::from_utf8_lossy(&o.stderr).trim()
                    ));
                }
                Inner::Ext4kit
            }
            Peer::Fuse2fs => {
                let log = dir.with_extension("fuse2fs.log");
                let logf = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
                let errf = logf.try_clone().map_err(|e| e.to_string())?;
                let mut child = Command::new("fuse2fs")
                    .arg(image)
                    .arg(&dir)
                    .args(["-f", "-o", &cfg.fuse2fs_o(read_only)])
                    .stdin(Stdio::null())
                    .stdout(logf)
                    .stderr(errf)
                    .spawn()
                    .map_err(|e| format!("fuse2fs: {e} (apt-get install fuse2fs)"))?;
                let t = Instant::now();
                loop {
                    if mounted_fstype(&dir).is_some_and(|t| t.starts_with("fuse")) {
                        break;
                    }
                    if let Ok(Some(st)) = child.try_wait() {
                        let msg = std::fs::read_to_string(&log).unwrap_or_default();
                        return Err(format!("fuse2fs exited ({st}) before mounting: {}", msg.trim()));
                    }
                    if t.elapsed() > Duration::from_secs(30) {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err("fuse2fs did not mount within 30 s".into());
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Inner::Fuse2fs(child, log)
            }
            Peer::Kernel => Inner::Kernel(
                ext4kit_testkit::LoopMount::mount(image, &dir, "ext4", read_only).map_err(|e| e.to_string())?,
            ),
        };
        Ok(Self {
            peer,
            dir,
            cfg: cfg.clone(),
            inner,
        })
    }

    /// Which peer this is.
    pub fn peer(&self) -> Peer {
        self.peer
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The FUSE server's peak resident memory so far (`VmHWM`), KiB; None
    /// for the kernel, or when the server cannot be found.
    pub fn server_peak_rss_kib(&self) -> Option<u64> {
        self.server_status_kib("VmHWM:")
    }

    /// The FUSE server's resident memory now (`VmRSS`), KiB; None as for
    /// [`Self::server_peak_rss_kib`].
    pub fn server_rss_kib(&self) -> Option<u64> {
        self.server_status_kib("VmRSS:")
    }

    fn server_status_kib(&self, field: &str) -> Option<u64> {
        let pid = match &self.inner {
            Inner::Fuse2fs(child, _) => child.id(),
            Inner::Ext4kit => ext4kit_server_pid(&self.cfg.ext4kit_bin, &self.dir)?,
            Inner::Kernel(_) | Inner::Gone => return None,
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    }

    /// Unmount and wait until the server (if any) has finished writing the
    /// image, so the image can be checked or mounted again.
    pub fn unmount(mut self) -> Result<(), String> {
        let inner = std::mem::replace(&mut self.inner, Inner::Gone);
        match inner {
            Inner::Ext4kit => {
                // "busy" is retried for a while, as for fuse2fs: a process
                // that just finished (or a scanner of new mounts) may
                // still hold the directory for a moment.
                let mut last = String::new();
                for attempt in 0..50 {
                    if attempt > 0 {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    let o = Command::new(&self.cfg.ext4kit_bin)
                        .args(["umount", "--timeout", "300"])
                        .arg(&self.dir)
                        .stdin(Stdio::null())
                        .output()
                        .map_err(|e| e.to_string())?;
                    if o.status.success() {
                        return Ok(());
                    }
                    last = String::from_utf8_lossy(&o.stderr).trim().to_string();
                    if !last.contains("busy") {
                        break;
                    }
                }
                // Leave no mount behind for the next user of the directory.
                self.inner = Inner::Ext4kit;
                Err(format!("ext4kit umount: {last}"))
            }
            Inner::Fuse2fs(mut child, log) => {
                umount_retrying(&self.dir)?;
                // fuse2fs writes the superblock and bitmaps in its destroy
                // callback; the image is consistent only once it exits.
                let st = child.wait().map_err(|e| e.to_string())?;
                if !st.success() {
                    let msg = std::fs::read_to_string(&log).unwrap_or_default();
                    return Err(format!("fuse2fs exited with {st}: {}", msg.trim()));
                }
                Ok(())
            }
            Inner::Kernel(m) => m.unmount().map_err(|e| e.to_string()),
            Inner::Gone => Ok(()),
        }
    }
}

/// The process serving `ext4kit mount … DIR`: `ext4kit mount` forks the
/// server before it mounts (lifecycle.rs `run_detached`), so the server's
/// command line is the one this benchmark ran, ending in DIR.
fn ext4kit_server_pid(bin: &Path, dir: &Path) -> Option<u32> {
    let bin_name = bin.file_name()?.to_str()?;
    let dir = dir.to_str()?;
    let me = std::process::id();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
        let ours = pid != me
            && args.first().is_some_and(|a| a.ends_with(bin_name.as_bytes()))
            && args.iter().any(|a| *a == b"mount")
            && args.last() == Some(&dir.as_bytes());
        ours.then_some(pid)
    })
}

/// `umount DIR`, retried while "busy" (a just-finished child may still
/// hold its working directory there for a moment).
fn umount_retrying(dir: &Path) -> Result<(), String> {
    let mut last = String::new();
    for attempt in 0..100 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let o = Command::new("umount")
            .arg(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if o.status.success() {
            return Ok(());
        }
        last = String::from_utf8_lossy(&o.stderr).trim().to_string();
        if !last.contains("busy") {
            break;
        }
    }
    Err(format!("umount {}: {last}", dir.display()))
}

impl Drop for PeerMount {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.inner, Inner::Gone) {
            Inner::Gone => {}
            Inner::Kernel(m) => drop(m),
            Inner::Ext4kit => {
                let ok = Command::new(&self.cfg.ext4kit_bin)
                    .arg("umount")
                    .arg(&self.dir)
                    .stdin(Stdio::null())
                    .output()
                    .is_ok_and(|o| o.status.success());
                // A crashed server leaves a dead mount (ENOTCONN): detach it.
                if !ok {
                    let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
                }
            }
            Inner::Fuse2fs(mut child, _) => {
                if umount_retrying(&self.dir).is_err() {
                    let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
                }
                let _ = child.wait();
            }
        }
    }
}

/// `e2fsck -fn IMAGE`: "clean", or "NOT CLEAN (exit N): first lines".
pub fn fsck_verdict(image: &Path) -> (bool, String) {
    match Command::new("e2fsck")
        .arg("-fn")
        .arg(image)
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => (true, "clean".into()),
        Ok(o) => {
            let out = String::from_utf8_lossy(&o.stdout);
            let first: Vec<&str> = out.lines().filter(|l| !l.starts_with("Pass ")).take(6).collect();
            (
                false,
                format!("NOT CLEAN (exit {:?}): {}", o.status.code(), first.join(" / ")),
            )
        }
        Err(e) => (false, format!("e2fsck did not run: {e}")),
    }
}
