//! Panics in the server's threads, on record.
//!
//! A request thread that panics ends; its reply goes out as EIO while it
//! unwinds (fuser's `ReplyRaw::drop`). What follows depends on which thread
//! it was. fuser's `Session::run` joins its threads in the order it started
//! them and returns at the first one that panicked, so a panic in the first
//! request thread ends the session at once: the process flushes and exits
//! while the other threads still hold requests, and those callers get
//! ECONNABORTED (`fuse_dev_release` → `end_requests` in fs/fuse/dev.c) and
//! nothing else. A panic in a later thread leaves the mount served by one
//! thread fewer until the unmount; a panic in the engine's background
//! worker only stops its passes (`ext4kit_cache::flusher`). In every case
//! the server's stderr is the only account of the cause, and without
//! `RUST_BACKTRACE` the default hook names one line, not how the thread got
//! there — which is what a race needs.
//!
//! So a serving process installs [`install`]: every panic is written to
//! stderr with its thread's name and a backtrace (captured whatever
//! `RUST_BACKTRACE` says), and the first few are kept ([`first`]) so the
//! unmount's error and the status file name the first one.

use std::backtrace::Backtrace;
use std::sync::{Mutex, Once};

/// Panics kept beyond the first: enough to see whether one bug repeated,
/// bounded so a panicking loop cannot grow the list.
const KEPT: usize = 8;

/// The first panics of this process: "thread 'NAME' panicked at FILE:LINE:
/// MESSAGE".
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Install the hook (once per process; later calls do nothing). It
/// replaces the default hook, whose message it repeats with the backtrace.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("<unnamed>");
            let at = info
                .location()
                .map_or_else(|| "an unknown place".to_string(), |l| l.to_string());
            // `panic!` carries a `&str` or a `String` (PanicHookInfo's
            // `payload_as_str` is newer than our MSRV).
            let p = info.payload();
            let msg = p
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| p.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(a panic payload that is not a string)");
            let what = format!("thread '{name}' panicked at {at}: {msg}");
            // The hook runs on the panicking thread before it unwinds: the
            // stack captured here is the one that led to the panic.
            let bt = Backtrace::force_capture();
            eprintln!("ext4kit: internal error: {what}\nbacktrace:\n{bt}");
            // The lock cannot be poisoned by this hook (nothing here panics
            // while holding it); a poisoned one is still usable.
            let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
            if seen.len() < KEPT {
                seen.push(what);
            }
        }));
    });
}

/// The first panic of this process since [`install`], if any.
pub fn first() -> Option<String> {
    SEEN.lock().unwrap_or_else(|p| p.into_inner()).first().cloned()
}

/// How many panics were kept (at most eight).
pub fn count() -> usize {
    SEEN.lock().unwrap_or_else(|p| p.into_inner()).len()
}

/// Whether some kept panic matches `f`.
pub fn any(f: impl Fn(&str) -> bool) -> bool {
    SEEN.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|s| f(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_kept_with_its_thread_and_place() {
        install();
        let r = std::thread::Builder::new()
            .name("panics-test".into())
            .spawn(|| panic!("on purpose, for the record"))
            .expect("spawn")
            .join();
        assert!(r.is_err(), "the thread panicked");
        assert!(first().is_some() && count() >= 1);
        assert!(
            any(|s| s.starts_with("thread 'panics-test' panicked at ")
                && s.contains("panics.rs:")
                && s.ends_with(": on purpose, for the record")),
            "kept: {:?}",
            SEEN.lock().unwrap_or_else(|p| p.into_inner())
        );
    }
}
