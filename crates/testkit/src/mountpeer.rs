//! One image, three ways to mount it read-write: the kernel's ext4 (loop
//! mount), fuse2fs (e2fsprogs' FUSE server) and `ext4kit mount`.
//!
//! The POSIX, stress and fsx tests run the same workload through whichever
//! peers they are given, so a workload is first checked against the kernel
//! (which defines the expected behaviour here) and fuse2fs (the incumbent),
//! and then judges ext4kit. The FUSE servers run in the foreground as our
//! own children, so a test can signal or kill exactly the server it started
//! and read its exit status.
//!
//! Peers are chosen by name (`kernel`, `fuse2fs`, `ext4kit`), usually from
//! an environment variable read by [`peers_from_env`].

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::image::{kernel_available, LoopMount, FIXED_HASH_SEED, FIXED_UUID};
use crate::util::{describe, run_ok, Context};

/// A way of mounting an ext4 image read-write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// The kernel's ext4 driver on a loop device.
    Kernel,
    /// `fuse2fs -f IMAGE DIR -o allow_other,default_permissions`.
    Fuse2fs,
    /// `EXT4KIT mount --foreground -o rw,allow_other IMAGE DIR`, with the
    /// given `ext4kit` binary; `EXT4KIT_MOUNT_OPTIONS` in the environment
    /// adds options (e.g. `cache=direct`).
    Ext4kit(PathBuf),
}

impl Peer {
    /// The peer's name as accepted by [`Peer::from_name`].
    pub fn name(&self) -> &'static str {
        match self {
            Peer::Kernel => "kernel",
            Peer::Fuse2fs => "fuse2fs",
            Peer::Ext4kit(_) => "ext4kit",
        }
    }

    /// `kernel`, `fuse2fs` or `ext4kit` (which runs `ext4kit_bin`).
    pub fn from_name(name: &str, ext4kit_bin: &Path) -> io::Result<Peer> {
        match name.trim() {
            "kernel" => Ok(Peer::Kernel),
            "fuse2fs" => Ok(Peer::Fuse2fs),
            "ext4kit" => Ok(Peer::Ext4kit(ext4kit_bin.to_path_buf())),
            other => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unknown mount peer `{other}` (known: kernel, fuse2fs, ext4kit, all)"),
            )),
        }
    }

    /// Whether a FUSE server process serves this peer's mounts (so it can
    /// be signalled or killed).
    pub fn has_server(&self) -> bool {
        !matches!(self, Peer::Kernel)
    }
}

/// The peers named by the environment variable `var` (comma-separated;
/// `all` = kernel,fuse2fs,ext4kit), or by `default` when it is unset. The
/// tests default to `ext4kit`; `VAR=kernel,fuse2fs` checks a workload
/// against the reference implementations.
pub fn peers_from_env(var: &str, default: &str, ext4kit_bin: &Path) -> io::Result<Vec<Peer>> {
    let spec = std::env::var(var).unwrap_or_else(|_| default.to_string());
    let spec = if spec.trim() == "all" {
        "kernel,fuse2fs,ext4kit".to_string()
    } else {
        spec
    };
    spec.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| Peer::from_name(s, ext4kit_bin))
        .collect()
}

/// Checks what mounting with `peer` needs (root, loop devices, /dev/fuse,
/// the fuse2fs program) and says what is missing.
pub fn peer_available(peer: &Peer) -> io::Result<()> {
    kernel_available()?;
    match peer {
        Peer::Kernel => Ok(()),
        Peer::Fuse2fs | Peer::Ext4kit(_) => {
            if !Path::new("/dev/fuse").exists() {
                return Err(io::Error::other(
                    "/dev/fuse does not exist: FUSE peers need the fuse driver (modprobe fuse)",
                ));
            }
            if let Peer::Ext4kit(bin) = peer {
                if !bin.exists() {
                    return Err(io::Error::other(format!(
                        "the ext4kit binary {} does not exist",
                        bin.display()
                    )));
                }
            } else if Command::new("fuse2fs").arg("-V").stdin(Stdio::null()).output().is_err() {
                return Err(io::Error::other("fuse2fs is not installed (apt-get install fuse2fs)"));
            }
            Ok(())
        }
    }
}

/// What became of process `pid`, a child its parent has not reaped yet
/// (a FUSE server the test started): "running", or how it ended — its
/// wait status stays in `/proc/PID/stat` (field 52, `exit_code`) while it
/// is a zombie. A server that died mid-run says there whether it exited
/// (after a panic, say: its log has the message) or was killed by a signal
/// (SIGKILL: the OOM killer; SIGABRT: an abort, such as a stack overflow
/// or a failed allocation; SIGSEGV), which leaves nothing in its log.
pub fn process_state(pid: u32) -> String {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return "gone (already reaped, or not our child)".into();
    };
    // The command name (field 2) is in parentheses and may hold spaces:
    // the fields after the last ')' start with the state (field 3).
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .map_or_else(Vec::new, |(_, r)| r.split_whitespace().collect());
    let state = rest.first().copied().unwrap_or("?");
    if state != "Z" && state != "X" {
        return format!("running (state {state})");
    }
    match rest.get(49).and_then(|c| c.parse::<i32>().ok()) {
        Some(st) if st & 0x7f == 0 => format!("exited with status {}", (st >> 8) & 0xff),
        Some(st) => {
            let sig = st & 0x7f;
            let name = match sig {
                6 => " (SIGABRT)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                7 => " (SIGBUS)",
                15 => " (SIGTERM)",
                _ => "",
            };
            let core = if st & 0x80 != 0 { ", core dumped" } else { "" };
            format!("killed by signal {sig}{name}{core}")
        }
        None => format!("ended (state {state}, no exit status readable)"),
    }
}

/// `mke2fs -t ext4 -b 4096` of a fresh sparse image of `size_mib` MiB,
/// with the fixtures' fixed UUID and hash seed (two images made with the
/// same arguments are identical), plus `extra` mke2fs arguments.
pub fn mkfs_ext4(image: &Path, size_mib: u64, extra: &[&str]) -> io::Result<()> {
    match fs::remove_file(image) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context(|| format!("remove {}", image.display())),
    }
    let mut c = Command::new("mke2fs");
    c.args(["-F", "-q", "-t", "ext4", "-b", "4096", "-U", FIXED_UUID])
        .args(["-E", &format!("hash_seed={FIXED_HASH_SEED}")])
        .args(extra)
        .arg(image)
        .arg(format!("{size_mib}M"))
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    run_ok(&mut c, &[0]).map(|_| ())
}

/// Require the same observations (one line each) from the kernel's ext4
/// and from ext4kit for scenario `tag`: a panic listing the lines that
/// differ, with both counts, when they do. With `show_var` set in the
/// environment the kernel's lines are printed (to write a new scenario).
pub fn assert_same_observations(tag: &str, kernel: &[String], ours: &[String], show_var: &str) {
    if std::env::var_os(show_var).is_some() {
        eprintln!("{tag}, the kernel's observations:\n  {}", kernel.join("\n  "));
    }
    let diff: Vec<String> = kernel
        .iter()
        .zip(ours.iter().chain(std::iter::repeat(&String::new())))
        .filter(|(k, o)| k != o)
        .map(|(k, o)| format!("  kernel:  {k}\n  ext4kit: {o}"))
        .collect();
    assert!(
        diff.is_empty() && kernel.len() == ours.len(),
        "{tag}: ext4kit differs from the kernel's ext4:\n{}\n(kernel {} observations, ext4kit {})",
        diff.join("\n"),
        kernel.len(),
        ours.len()
    );
}

/// The filesystem type the mount table shows at exactly `dir`, if anything
/// is mounted there (`ext4`, `fuse.ext4kit`, `fuse.fuse2fs`, ...).
pub fn mounted_fstype(dir: &Path) -> Option<String> {
    let t = fs::read_to_string("/proc/self/mountinfo").ok()?;
    t.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mp = left.split(' ').nth(4)?;
        (Path::new(&unescape_mountinfo(mp)) == dir).then(|| right.split(' ').next().unwrap_or("").to_string())
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = std::str::from_utf8(&b[i + 1..i + 4]).ok();
            if let Some(v) = oct.and_then(|o| u8::from_str_radix(o, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A read-write mount of one image by one peer. Unmounted (lazily if need
/// be) and its server reaped when dropped, so a failing test leaves no
/// mount or process behind; [`PeerMount::unmount`] is the checked way.
#[derive(Debug)]
pub struct PeerMount {
    peer: &'static str,
    dir: PathBuf,
    log: Option<PathBuf>,
    loop_mount: Option<LoopMount>,
    server: Option<Child>,
    mounted: bool,
}

impl PeerMount {
    /// Mounts `image` read-write at `dir` (created if missing) with `peer`.
    /// Returns once the mount table shows the mount. A FUSE server's
    /// stderr goes to `IMAGE.PEER.log` (its text is quoted in errors).
    pub fn mount(peer: &Peer, image: &Path, dir: &Path) -> io::Result<PeerMount> {
        peer_available(peer)?;
        fs::create_dir_all(dir).context(|| format!("mkdir {}", dir.display()))?;
        let dir = fs::canonicalize(dir).context(|| format!("canonicalize {}", dir.display()))?;
        if let Some(t) = mounted_fstype(&dir) {
            return Err(io::Error::other(format!(
                "{} is already a mount point ({t})",
                dir.display()
            )));
        }
        let mut pm = PeerMount {
            peer: peer.name(),
            dir: dir.clone(),
            log: None,
            loop_mount: None,
            server: None,
            mounted: false,
        };
        let mut cmd = match peer {
            Peer::Kernel => {
                pm.loop_mount = Some(LoopMount::mount(image, &dir, "ext4", false)?);
                pm.mounted = true;
                return Ok(pm);
            }
            Peer::Fuse2fs => {
                let mut c = Command::new("fuse2fs");
                c.arg("-f")
                    .arg(image)
                    .arg(&dir)
                    .args(["-o", "allow_other,default_permissions"]);
                c
            }
            Peer::Ext4kit(bin) => {
                let mut opts = "rw,allow_other".to_string();
                if let Ok(extra) = std::env::var("EXT4KIT_MOUNT_OPTIONS") {
                    opts = format!("{opts},{extra}");
                }
                let mut c = Command::new(bin);
                c.args(["mount", "--foreground", "-o", &opts]).arg(image).arg(&dir);
                c
            }
        };
        let log = PathBuf::from(format!("{}.{}.log", image.display(), peer.name()));
        let logf = fs::File::create(&log).context(|| format!("create {}", log.display()))?;
        let logf2 = logf.try_clone()?;
        let desc = describe(&cmd);
        cmd.stdin(Stdio::null()).stdout(logf).stderr(logf2);
        let child = cmd.spawn().context(|| format!("cannot start `{desc}`"))?;
        pm.log = Some(log);
        pm.server = Some(child);
        let t = Instant::now();
        loop {
            if mounted_fstype(&dir).is_some() {
                pm.mounted = true;
                return Ok(pm);
            }
            if let Some(st) = pm.server.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                pm.server = None;
                return Err(io::Error::other(format!(
                    "`{desc}` exited with {st} before the mount appeared:\n{}",
                    pm.server_log()
                )));
            }
            if t.elapsed() > Duration::from_secs(30) {
                return Err(io::Error::other(format!(
                    "`{desc}`: no mount at {} after 30 s:\n{}",
                    dir.display(),
                    pm.server_log()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The mount point (canonical).
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The peer's name (`kernel`, `fuse2fs`, `ext4kit`).
    pub fn peer(&self) -> &'static str {
        self.peer
    }

    /// The FUSE server's pid (None for the kernel, or once reaped).
    pub fn server_pid(&self) -> Option<u32> {
        self.server.as_ref().map(Child::id)
    }

    /// Where the FUSE server's stdout/stderr go (None for the kernel): a
    /// caller that outlives its borrow of the mount can still quote it.
    pub fn log_path(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// What the FUSE server wrote to stdout/stderr so far.
    pub fn server_log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|l| fs::read(l).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Sends `sig` to the FUSE server.
    pub fn signal_server(&self, sig: rustix::process::Signal) -> io::Result<()> {
        let pid = self
            .server_pid()
            .ok_or_else(|| io::Error::other(format!("{}: no server process to signal", self.peer)))?;
        let pid = rustix::process::Pid::from_raw(pid as i32).ok_or_else(|| io::Error::other("pid 0"))?;
        rustix::process::kill_process(pid, sig).context(|| format!("kill {sig:?} {}", self.peer))
    }

    /// Waits up to `limit` for the FUSE server to exit and returns its
    /// status (the mount itself may still be attached: see
    /// [`PeerMount::detach`]).
    pub fn wait_server(&mut self, limit: Duration) -> io::Result<ExitStatus> {
        let peer = self.peer;
        let child = self
            .server
            .as_mut()
            .ok_or_else(|| io::Error::other(format!("{peer}: no server process")))?;
        let t = Instant::now();
        loop {
            if let Some(st) = child.try_wait()? {
                self.server = None;
                return Ok(st);
            }
            if t.elapsed() > limit {
                return Err(io::Error::other(format!(
                    "{peer}: the server did not exit within {limit:?}:\n{}",
                    self.server_log()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `umount -l`: detaches the mount point at once; the filesystem lives
    /// on for whoever still holds files or a working directory in it, and
    /// the FUSE server is told to stop when the last of them lets go.
    pub fn detach(&mut self) -> io::Result<()> {
        if mounted_fstype(&self.dir).is_some() {
            let mut c = Command::new("umount");
            c.arg("-l").arg(&self.dir).stdin(Stdio::null());
            run_ok(&mut c, &[0])?;
        }
        self.mounted = false;
        if let Some(lm) = self.loop_mount.take() {
            // The loop mount is gone already; keep Drop from retrying.
            std::mem::forget(lm);
        }
        Ok(())
    }

    /// Unmounts and, for FUSE peers, waits for the server to exit and
    /// requires exit status 0 (it flushed and closed the image cleanly).
    pub fn unmount(mut self) -> io::Result<()> {
        if let Some(lm) = self.loop_mount.take() {
            self.mounted = false;
            return lm.unmount();
        }
        // `umount` can say "busy" for a moment after a workload's last
        // process exits; retry like LoopMount::unmount.
        let mut last = None;
        for attempt in 0..100 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(100));
            }
            let mut c = Command::new("umount");
            c.arg(&self.dir).stdin(Stdio::null());
            match run_ok(&mut c, &[0]) {
                Ok(_) => {
                    last = None;
                    break;
                }
                Err(e) if e.to_string().contains("busy") => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        if let Some(e) = last {
            return Err(e);
        }
        self.mounted = false;
        let st = self.wait_server(Duration::from_secs(120))?;
        if !st.success() {
            return Err(io::Error::other(format!(
                "{}: the server exited with {st} after umount:\n{}",
                self.peer,
                self.server_log()
            )));
        }
        Ok(())
    }
}

impl Drop for PeerMount {
    fn drop(&mut self) {
        if self.mounted && self.loop_mount.is_none() {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.dir)
                .stdin(Stdio::null())
                .output();
        }
        if let Some(mut c) = self.server.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_names_round_trip_and_unknown_names_are_errors() {
        let bin = Path::new("/x/ext4kit");
        for n in ["kernel", "fuse2fs", "ext4kit"] {
            assert_eq!(Peer::from_name(n, bin).unwrap().name(), n);
        }
        assert!(Peer::from_name("ext3", bin).is_err());
        assert!(!Peer::Kernel.has_server());
        assert!(Peer::Fuse2fs.has_server());
    }

    #[test]
    fn process_state_tells_running_exited_and_killed_apart() {
        let wait_zombie = |c: &Child| {
            let t = Instant::now();
            while !process_state(c.id()).starts_with("exited") && !process_state(c.id()).starts_with("killed") {
                assert!(t.elapsed() < Duration::from_secs(10), "{}", process_state(c.id()));
                std::thread::sleep(Duration::from_millis(5));
            }
            process_state(c.id())
        };
        let mut running = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(
            process_state(running.id()).starts_with("running"),
            "{}",
            process_state(running.id())
        );
        running.kill().unwrap();
        assert_eq!(wait_zombie(&running), "killed by signal 9 (SIGKILL)");
        running.wait().unwrap();
        assert!(process_state(running.id()).starts_with("gone"));
        let mut exits = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        assert_eq!(wait_zombie(&exits), "exited with status 3");
        exits.wait().unwrap();
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/end\\"), "/end\\");
    }
}
