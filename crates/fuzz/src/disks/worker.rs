//! The worker process: one case, under an address-space limit.
//!
//! `RLIMIT_AS` bounds everything the process maps, so an allocation sized
//! from a hostile field fails (Rust aborts with "memory allocation of N
//! bytes failed") instead of taking the machine; the supervisor sees the
//! abort and reports the case. A panic is printed with its location and
//! backtrace and the process exits 101. Each stage is printed as a
//! `PHASE` line on stderr (unbuffered), so a case killed for taking too
//! long is reported with the last thing it started.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use super::exercise::{exercise, ExerciseLimits};
use super::mutate::generate;
use super::seeds::{load, Family};

/// Limit this process's address space to `bytes`.
pub fn limit_memory(bytes: u64) -> std::io::Result<()> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    setrlimit(Resource::As, Rlimit { current: Some(bytes), maximum: Some(bytes) }).map_err(std::io::Error::from)
}

/// Peak resident size of this process (VmHWM), in KiB.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Print panics as `PANIC: message at file:line` plus a backtrace.
pub fn install_panic_printer() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".into());
        let loc = info.location().map(|l| format!(" at {}:{}:{}", l.file(), l.line(), l.column())).unwrap_or_default();
        let bt = std::backtrace::Backtrace::force_capture();
        let mut e = std::io::stderr().lock();
        let _ = writeln!(e, "PANIC: {msg}{loc}\n{bt}");
    }));
}

/// Write `bytes` to `path`, leaving all-zero 4 KiB blocks as holes: the
/// seeds are mostly empty disk, and a case should cost its tables, not
/// its zeros.
pub fn write_sparse(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(path)?;
    f.set_len(bytes.len() as u64)?;
    for (i, block) in bytes.chunks(4096).enumerate() {
        if block.iter().any(|&b| b != 0) {
            f.write_all_at(block, i as u64 * 4096)?;
        }
    }
    Ok(())
}

/// Where case directories go: `$EXT4KIT_FUZZ_DISK_TMP`, else `/dev/shm`
/// (memory: flushes and file writes cost nothing), else the temp dir.
pub fn scratch_dir() -> std::path::PathBuf {
    if let Some(d) = std::env::var_os("EXT4KIT_FUZZ_DISK_TMP") {
        return d.into();
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && rustix::fs::access(shm, rustix::fs::Access::WRITE_OK).is_ok() {
        return shm.into();
    }
    std::env::temp_dir()
}

/// Run case (`family`, `seed`, `skip`) in `dir` with seeds from
/// `seeds_dir`; prints `RESULT ...` and `HWM <KiB>` on stdout. Returns
/// the process exit code.
pub fn run_worker(
    family: Family,
    seed: u64,
    skip: u64,
    dir: &Path,
    seeds_dir: &Path,
    memory_limit: u64,
    lim: &ExerciseLimits,
) -> i32 {
    install_panic_printer();
    // Seeds are loaded before the limit: they are the campaign's, not the
    // case's, memory.
    let seeds = match load(seeds_dir, &[family]) {
        Ok(s) if !s.is_empty() => s,
        Ok(_) => {
            eprintln!("no seeds for {}", family.name());
            return 2;
        }
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let case = generate(&seeds, seed, skip);
    drop(seeds);
    for (name, bytes) in &case.files {
        if let Err(e) = write_sparse(&dir.join(name), bytes) {
            eprintln!("writing {name}: {e}");
            return 2;
        }
    }
    let main = dir.join(&case.files[0].0);
    drop(case);
    if let Err(e) = limit_memory(memory_limit) {
        eprintln!("setrlimit: {e}");
        return 2;
    }
    let mut phase = |p: &str| eprintln!("PHASE {p}");
    match catch_unwind(AssertUnwindSafe(|| exercise(family, &main, lim, &mut phase))) {
        Ok(out) => {
            println!("RESULT {}", out.line());
            println!("HWM {}", peak_rss_kib());
            0
        }
        Err(_) => 101,
    }
}
