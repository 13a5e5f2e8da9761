//! The old tables of a churning cache map are freed while a thread that
//! only inserts keeps inserting (`ext4kit_cache::map::FlushClock`).
//!
//! A cache at its limit: one thread inserts new keys (the creating
//! threads), another removes the oldest (the background worker's sweep).
//! Live heap is counted by a wrapper around the system allocator (this
//! test binary's only test, so nothing else allocates meanwhile).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use ext4kit_cache::map::{self as cachemap, FlushClock};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to System, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Peak live bytes while `inserts` keys pass through a map of `limit`.
fn churn(inserts: u32, limit: u32, flush: bool) -> usize {
    thread_local!(static INSERTS: FlushClock = const { FlushClock::new() });
    let m: cachemap::Map<u32, u64> = cachemap::churning(1024);
    let (inserted, removed) = (AtomicU32::new(0), AtomicU32::new(0));
    let done = AtomicBool::new(false);
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Sweeps as the caches do: once past the limit by a quarter,
            // down to three quarters of it.
            let mut next = 0u32;
            while !done.load(Ordering::Acquire) {
                if inserted.load(Ordering::Acquire) - next > limit + limit / 4 {
                    let m = m.pin();
                    while inserted.load(Ordering::Acquire) - next > limit / 4 * 3 {
                        m.remove(&next);
                        next += 1;
                    }
                    removed.store(next, Ordering::Release);
                } else {
                    std::thread::yield_now();
                }
            }
        });
        for k in 0..inserts {
            // A cache's inserting caller sweeps itself when the worker is
            // this far behind; here it waits for it.
            while k - removed.load(Ordering::Acquire) > 2 * limit {
                std::thread::yield_now();
            }
            m.pin().insert(k, u64::from(k));
            inserted.store(k + 1, Ordering::Release);
            if flush {
                INSERTS.with(|c| c.tick(&m));
            }
        }
        done.store(true, Ordering::Release);
    });
    PEAK.load(Ordering::Relaxed) - base
}

#[test]
fn an_inserting_thread_frees_the_tables_it_retired() {
    const INSERTS: u32 = 2_000_000;
    const LIMIT: u32 = 8192;
    let without = churn(INSERTS, LIMIT, false);
    let with = churn(INSERTS, LIMIT, true);
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    eprintln!(
        "peak live heap: {:.1} MiB without flushing, {:.1} MiB with",
        mib(without),
        mib(with)
    );
    // At most 16,384 live entries (~0.4 MiB), tables of a few hundred
    // KiB, removed entries waiting in batches of 1,024; without the
    // flush, the inserting thread keeps every table it retired (~20 MiB
    // here).
    assert!(
        with < 4 << 20,
        "{:.1} MiB live at the peak with the flush clock",
        mib(with)
    );
    assert!(
        without > 3 * with,
        "the scenario no longer keeps old tables without flushing ({:.1} vs {:.1} MiB): \\
         the test shows nothing",
        mib(without),
        mib(with)
    );
}
