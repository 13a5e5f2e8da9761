//! Small helpers shared by the modules: error context, byte paths, commands.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// The ext4kit binary a test runs: `built` (the test crate's own,
/// `env!("CARGO_BIN_EXE_ext4kit")`) unless `EXT4KIT_BIN` names another
/// build to judge (a branch's release binary, say).
pub fn ext4kit_bin(built: &str) -> std::path::PathBuf {
    std::env::var_os("EXT4KIT_BIN").map_or_else(|| std::path::PathBuf::from(built), std::path::PathBuf::from)
}
