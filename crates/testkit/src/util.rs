//! Small helpers shared by the modules: error context, byte paths, commands.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Adds a human-readable context to an `io::Error` while keeping its kind, so
/// a failing fixture says *which* file or *which* tool went wrong.
pub(crate) trait Context<T> {
    fn context<F: FnOnce() -> String>(self, f: F) -> io::Result<T>;
}

impl<T> Context<T> for io::Result<T> {
    fn context<F: FnOnce() -> String>(self, f: F) -> io::Result<T> {
        self.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", f())))
    }
}

impl<T> Context<T> for Result<T, rustix::io::Errno> {
    fn context<F: FnOnce() -> String>(self, f: F) -> io::Result<T> {
        self.map_err(|e| {
            let e = io::Error::from(e);
            io::Error::new(e.kind(), format!("{}: {e}", f()))
        })
    }
}

/// `root` joined with a relative path given as raw bytes (names need not be
/// UTF-8 on Linux).
pub(crate) fn join_bytes(root: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(rel))
    }
}

/// Renders raw path bytes readably: printable ASCII as is, everything else
/// as `\xNN`, so a difference report never hides an odd byte.
pub fn escape_bytes(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    match std::str::from_utf8(b) {
        Ok(text) => {
            for c in text.chars() {
                if c == '\\' {
                    s.push_str("\\\\");
                } else if c.is_control() {
                    s.push_str(&format!("\\x{:02x}", c as u32));
                } else {
                    s.push(c);
                }
            }
        }
        Err(_) => {
            for &c in b {
                if c == b'\\' {
                    s.push_str("\\\\");
                } else if (0x20..0x7f).contains(&c) {
                    s.push(c as char);
                } else {
                    s.push_str(&format!("\\x{c:02x}"));
                }
            }
        }
    }
    s
}

/// Runs a command to completion, capturing its output. Fails only if the
/// program could not be started; the caller judges the exit status.
pub(crate) fn run(cmd: &mut Command) -> io::Result<Output> {
    let desc = describe(cmd);
    cmd.output().context(|| format!("cannot run `{desc}`"))
}

/// Runs a command and fails unless its exit code is in `ok`; the error
/// names the command and carries its output. Tests and benchmarks use it
/// instead of their own `Command` wrappers.
pub fn run_ok(cmd: &mut Command, ok: &[i32]) -> io::Result<Output> {
    let desc = describe(cmd);
    let out = run(cmd)?;
    match out.status.code() {
        Some(c) if ok.contains(&c) => Ok(out),
        code => Err(io::Error::other(format!(
            "`{desc}` failed with {}:\n{}{}",
            code.map_or_else(|| "a signal".to_string(), |c| format!("exit code {c}")),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))),
    }
}

/// A shell-like rendering of a command for error messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        let a = a.to_string_lossy();
        if a.contains([' ', '"', '\'']) {
            s.push('\'');
            s.push_str(&a);
            s.push('\'');
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// 64-bit FNV-1a: a stable hash for deriving per-path values (times).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A numeric knob from the environment (decimal or `0x` hex; `default`
/// when unset). Soaks and replays set these (`EXT4KIT_STRESS_OPS`,
/// `EXT4KIT_FSX_SEED`, ...); a value that is not a number fails loudly
/// rather than silently running the default.
pub fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        }
        Err(_) => default,
    }
}

/// Run `script` with `sh -c` in `dir` as user and group `uid` (root:
/// directly; others through `setpriv`, with no capabilities and no
/// supplementary groups), its output discarded. Returns the exit code.
pub fn sh_as(uid: u32, dir: &Path, script: &str) -> i32 {
    let mut c = if uid == 0 {
        Command::new("sh")
    } else {
        let mut c = Command::new("setpriv");
        c.args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "sh",
        ]);
        c
    };
    c.args(["-c", script])
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    c.status().map_or(-1, |s| s.code().unwrap_or(-1))
}

/// The ext4kit binary a test runs: `built` (the test crate's own,
/// `env!("CARGO_BIN_EXE_ext4kit")`) unless `EXT4KIT_BIN` names another
/// build to judge (a branch's release binary, say).
pub fn ext4kit_bin(built: &str) -> std::path::PathBuf {
    std::env::var_os("EXT4KIT_BIN").map_or_else(|| std::path::PathBuf::from(built), std::path::PathBuf::from)
}

/// A test's scratch path (a directory or a single file) that is removed when
/// the test passes and kept, with its path printed, when it fails.
///
/// Why: the image tests write hundreds of MiB each; a suite that leaves them
/// behind fills `/tmp` after a few dozen runs (it reached 26 GiB on the dev
/// VM), while a failed run's images are exactly what one wants to inspect.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// A fresh, empty directory `$TMPDIR/<name>-<pid>` (an old one of the
    /// same name is removed first).
    pub fn dir(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        if let Err(e) = std::fs::create_dir_all(&d) {
            panic!("cannot create scratch directory {}: {e}", d.display());
        }
        Scratch(d)
    }

    /// Takes charge of `path` (a file or a directory) without creating it.
    pub fn adopt(path: PathBuf) -> Scratch {
        Scratch(path)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<OsStr> for Scratch {
    fn as_ref(&self) -> &OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test failed: kept its scratch {} for inspection", self.0.display());
            return;
        }
        // Something still mounted under the scratch is left alone: removing
        // through it would delete the mounted image's contents, not ours.
        if let Some(m) = mounted_under(&self.0) {
            eprintln!("kept scratch {}: {} is still mounted", self.0.display(), m.display());
            return;
        }
        let _ = match std::fs::symlink_metadata(&self.0) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&self.0),
            Ok(_) => std::fs::remove_file(&self.0),
            Err(_) => Ok(()),
        };
    }
}

/// The first mount point at or below `root`, from `/proc/self/mountinfo`
/// (field 5 is the mount point, with spaces etc. escaped as octal).
fn mounted_under(root: &Path) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_octal)
        .find(|m| m.starts_with(root))
}

fn unescape_octal(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let code = b
            .get(i + 1..i + 4)
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match (b[i], code) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Fails the test, loudly, unless it can mount through FUSE: /dev/fuse
/// exists and we are root. `needs` says what else root is for (it goes
/// into the message). CI runs as root with the device; a test that cannot
/// mount must never pass by doing nothing.
pub fn require_root_and_fuse(needs: &str) {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse does not exist: these tests need the FUSE driver (modprobe fuse, or run the container with \
         --device /dev/fuse)"
    );
    assert!(
        rustix::process::geteuid().is_root(),
        "these tests need root ({needs}); CI runs as root"
    );
}

/// Make the kernel drop its unused dentries and inodes (`sync`, then
/// `drop_caches` = 2) until `done` holds, so that a FUSE mount receives
/// the FORGETs of everything nobody uses; fails the test after `limit`
/// with `what()` saying what was still missing. Needs root.
pub fn drop_kernel_caches_until(limit: Duration, mut done: impl FnMut() -> bool, what: impl Fn() -> String) {
    let t = Instant::now();
    while !done() {
        let _ = Command::new("sync").status();
        std::fs::write("/proc/sys/vm/drop_caches", "2").expect("writing /proc/sys/vm/drop_caches (needs root)");
        assert!(t.elapsed() < limit, "{}", what());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_decode() {
        assert_eq!(unescape_octal("/tmp/a\\040b\\011c"), PathBuf::from("/tmp/a b\tc"));
        assert_eq!(unescape_octal("/x\\\\y\\04"), PathBuf::from("/x\\\\y\\04"));
    }

    #[test]
    fn root_is_mounted_under_root_and_a_fresh_dir_is_not() {
        assert!(mounted_under(Path::new("/")).is_some(), "/ itself is a mount point");
        let s = Scratch::dir("ext4kit-scratch-selftest");
        assert_eq!(mounted_under(&s), None);
    }

    #[test]
    fn a_passing_scratch_is_removed() {
        let p = {
            let s = Scratch::dir("ext4kit-scratch-removed");
            std::fs::write(s.join("f"), b"x").unwrap();
            s.to_path_buf()
        };
        assert!(!p.exists(), "{} survived its guard", p.display());
        let f = std::env::temp_dir().join(format!("ext4kit-scratch-file-{}", std::process::id()));
        std::fs::write(&f, b"x").unwrap();
        drop(Scratch::adopt(f.clone()));
        assert!(!f.exists());
    }
}
