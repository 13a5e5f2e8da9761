//! A guarding global allocator for fuzz binaries.
//!
//! A hostile image that makes the engine ask for gigabytes (`Vec` sized
//! from an on-disk length) does not panic: the allocation fails and Rust
//! aborts the process, so `catch_unwind` never sees it and the campaign
//! report is lost. Installing [`GuardedAlloc`] as the `#[global_allocator]`
//! of a fuzz binary turns that abort into a reproducible finding: before
//! refusing an allocation above [`GuardedAlloc::LIMIT`] it writes the seed
//! of the image being processed on this thread (see [`set_current_case`])
//! to stderr, with no allocation of its own. It also counts live heap
//! bytes, which is a sharper memory signal than RSS.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Sentinel for "this thread is not processing a fuzz case".
const NO_CASE: u64 = u64::MAX;

thread_local! {
    static CURRENT_CASE: Cell<u64> = const { Cell::new(NO_CASE) };
}

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Record which case (seed) this thread is working on, for the allocation
/// guard's message. `None` clears it.
pub fn set_current_case(seed: Option<u64>) {
    let _ = CURRENT_CASE.try_with(|c| c.set(seed.unwrap_or(NO_CASE)));
}

/// Live heap bytes, when [`GuardedAlloc`] is the global allocator.
pub fn live_heap_bytes() -> Option<usize> {
    INSTALLED.load(Ordering::Relaxed).then(|| LIVE.load(Ordering::Relaxed))
}

/// Peak live heap bytes since the last [`reset_peak_heap`].
pub fn peak_heap_bytes() -> Option<usize> {
    INSTALLED.load(Ordering::Relaxed).then(|| PEAK.load(Ordering::Relaxed))
}

/// Restart peak tracking from the current live size.
pub fn reset_peak_heap() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// The system allocator plus a size guard and a live-bytes counter.
#[derive(Debug, Default)]
pub struct GuardedAlloc;

impl GuardedAlloc {
    /// Largest single allocation allowed (1 GiB): nothing the engine does
    /// with an image of at most a few MiB legitimately needs more.
    pub const LIMIT: usize = 1 << 30;

    #[cold]
    fn report_refusal(size: usize) {
        let seed = CURRENT_CASE.try_with(|c| c.get()).unwrap_or(NO_CASE);
        // Format into a stack buffer: allocating here would recurse.
        let mut buf = [0u8; 256];
        let mut w = &mut buf[..];
        let _ = if seed == NO_CASE {
            write!(w, "\next4kit-fuzz: refusing a {size}-byte allocation (outside any fuzz case)\n")
        } else {
            write!(
                w,
                "\next4kit-fuzz: MEMORY BLOW-UP: refusing a {size}-byte allocation while processing seed {seed}; \
                 reproduce with: ext4kit-fuzz-images --seed {seed}\n"
            )
        };
        let left = w.len();
        let n = buf.len() - left;
        let _ = std::io::stderr().write_all(&buf[..n]);
    }
}

// SAFETY: every method forwards to `System` with the caller's layout; the
// bookkeeping only touches atomics and a const-initialised thread-local.
unsafe impl GlobalAlloc for GuardedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > Self::LIMIT {
            Self::report_refusal(layout.size());
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            track_alloc(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > Self::LIMIT {
            Self::report_refusal(layout.size());
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            track_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > Self::LIMIT {
            Self::report_refusal(new_size);
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            track_alloc(new_size);
        }
        p
    }
}

fn track_alloc(size: usize) {
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
    let now = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(now, Ordering::Relaxed);
}
