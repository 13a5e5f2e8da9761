//! Counting the FUSE requests a workload costs, as the kernel sends them.
//!
//! Since 6.15 the kernel's FUSE client has the tracepoint
//! `fuse:fuse_request_send` (fs/fuse/fuse_trace.h), fired in
//! `fuse_send_one()` for every request it queues, whichever transport
//! carries it (/dev/fuse or io_uring). The count is therefore the
//! kernel's own, not what our server says it served: an external oracle
//! for "round trips per operation".
//!
//! This kernel has no histogram triggers (`CONFIG_HIST_TRIGGERS` is off),
//! so the events go to a ring buffer of a tracing instance of our own
//! (`instances/ext4kit-bench`, so the global buffer and anyone else's
//! tracing are left alone), filtered to one connection, and are counted
//! from the `trace` file afterwards. An event costs a few hundred ns
//! beside a round trip of ~20 µs; counting is done in a separate, untimed
//! pass all the same ([`super::bounds`]), so no timed figure pays for it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const TRACEFS: &str = "/sys/kernel/tracing";
const EVENT: &str = "events/fuse/fuse_request_send";

/// The FUSE requests of one counted stretch, by opcode name.
#[derive(Debug, Clone, Default)]
pub struct Requests {
    /// Requests per opcode name (`FUSE_LOOKUP` …).
    pub by_op: BTreeMap<String, u64>,
}

impl Requests {
    /// All requests.
    pub fn total(&self) -> u64 {
        self.by_op.values().sum()
    }

    /// The kinds in falling order of count: "2.00 CREATE, 1.00 LOOKUP"
    /// per `ops` operations (kinds below 0.01 per op are left out).
    pub fn per_op(&self, ops: u64) -> String {
        let mut v: Vec<(&String, &u64)> = self.by_op.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let ops = ops.max(1) as f64;
        let parts: Vec<String> = v
            .into_iter()
            .filter(|(_, &n)| n as f64 / ops >= 0.01)
            .map(|(k, &n)| format!("{:.2} {}", n as f64 / ops, k.trim_start_matches("FUSE_")))
            .collect();
        parts.join(", ")
    }
}

/// A tracing instance counting one FUSE connection's requests.
pub struct FuseTrace {
    dir: PathBuf,
}

fn put(path: &Path, what: &str) -> Result<(), String> {
    std::fs::write(path, what).map_err(|e| format!("writing {what:?} to {}: {e}", path.display()))
}

impl FuseTrace {
    /// Why requests cannot be counted here, if they cannot.
    pub fn unavailable() -> Option<String> {
        if !rustix::process::geteuid().is_root() {
            return Some("not root (tracefs)".into());
        }
        let ev = Path::new(TRACEFS).join(EVENT);
        if !ev.is_dir() && Path::new(TRACEFS).is_dir() {
            // tracefs is not always mounted on a fresh machine: mount it
            // where the kernel expects it (root only, as every peer here).
            let _ = std::process::Command::new("mount")
                .args(["-t", "tracefs", "nodev", TRACEFS])
                .output();
        }
        (!ev.is_dir()).then(|| {
            format!(
                "{} does not exist (tracefs not mounted, or a kernel before 6.15 without FUSE tracepoints)",
                ev.display()
            )
        })
    }

    /// Make (or reuse) the instance, with a buffer big enough for a
    /// counted stretch (64 MiB per CPU: about a million events).
    pub fn new() -> Result<Self, String> {
        if let Some(why) = Self::unavailable() {
            return Err(why);
        }
        let dir = Path::new(TRACEFS).join("instances/ext4kit-bench");
        if !dir.is_dir() {
            std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let t = FuseTrace { dir };
        put(&t.dir.join(EVENT).join("enable"), "0")?;
        put(&t.dir.join("buffer_size_kb"), "65536")?;
        Ok(t)
    }

    /// The `connection` field of the mount at `mnt`: `fc->dev`, which is
    /// the superblock's anonymous device, i.e. the mount's `st_dev` in
    /// the kernel's own encoding (`MKDEV`: major << 20 | minor).
    fn connection(mnt: &Path) -> Result<u64, String> {
        let st = rustix::fs::stat(mnt).map_err(|e| format!("stat {}: {e}", mnt.display()))?;
        let (major, minor) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
        Ok(((major as u64) << 20) | minor as u64)
    }

    /// Run `f` with the requests to the mount at `mnt` counted.
    pub fn count<T>(&self, mnt: &Path, f: impl FnOnce() -> Result<T, String>) -> Result<(T, Requests), String> {
        let ev = self.dir.join(EVENT);
        put(&ev.join("filter"), &format!("connection == {}", Self::connection(mnt)?))?;
        put(&self.dir.join("trace"), "")?;
        put(&ev.join("enable"), "1")?;
        let r = f();
        put(&ev.join("enable"), "0")?;
        let v = r?;
        self.check_overrun()?;
        let text = std::fs::read_to_string(self.dir.join("trace"))
            .map_err(|e| format!("{}: {e}", self.dir.join("trace").display()))?;
        put(&self.dir.join("trace"), "")?;
        Ok((v, parse(&text)))
    }

    /// A full ring buffer drops events; counts from it would be low.
    fn check_overrun(&self) -> Result<(), String> {
        let cpus = std::fs::read_dir(self.dir.join("per_cpu")).map_err(|e| format!("per_cpu: {e}"))?;
        for c in cpus.flatten() {
            let stats = std::fs::read_to_string(c.path().join("stats")).unwrap_or_default();
            let lost = stats
                .lines()
                .find_map(|l| l.strip_prefix("overrun:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
            if lost > 0 {
                return Err(format!(
                    "the trace buffer overflowed ({lost} events lost on {}): the counts would be low",
                    c.file_name().to_string_lossy()
                ));
            }
        }
        Ok(())
    }
}

impl Drop for FuseTrace {
    fn drop(&mut self) {
        let _ = put(&self.dir.join(EVENT).join("enable"), "0");
        // rmdir of an instance frees its buffers.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Count the events of a `trace` file: "... fuse_request_send: connection
/// 46 req 8 opcode 35 (FUSE_CREATE) len 66".
fn parse(text: &str) -> Requests {
    let mut r = Requests::default();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = l.split("opcode ").nth(1) else {
            continue;
        };
        let name = rest.split_once('(').and_then(|(_, t)| t.split_once(')')).map_or_else(
            || format!("opcode {}", rest.split(' ').next().unwrap_or("?")),
            |(n, _)| n.to_string(),
        );
        *r.by_op.entry(name).or_default() += 1;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_lines_are_counted_by_opcode() {
        let t = "# tracer: nop\n#\n\
            tar-5 [001] ..... 1.0: fuse_request_send: connection 46 req 8 opcode 35 (FUSE_CREATE) len 66\n\
            tar-5 [001] ..... 1.1: fuse_request_send: connection 46 req 10 opcode 1 (FUSE_LOOKUP) len 50\n\
            tar-5 [000] ..... 1.2: fuse_request_send: connection 46 req 12 opcode 35 (FUSE_CREATE) len 66\n\
            x-1 [000] ..... 1.3: fuse_request_send: connection 46 req 14 opcode 99 len 40\n";
        let r = parse(t);
        assert_eq!(r.total(), 4);
        assert_eq!(r.by_op["FUSE_CREATE"], 2);
        assert_eq!(r.by_op["opcode 99"], 1);
        assert_eq!(r.per_op(2), "1.00 CREATE, 0.50 LOOKUP, 0.50 opcode 99");
    }
}
