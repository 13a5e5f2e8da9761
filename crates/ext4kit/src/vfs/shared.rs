//! Counting the shared writes of the open path.
//!
//! A write to a cache line that other threads write too — an atomic
//! read-modify-write of a shared reference count, taking or releasing a
//! lock, a CAS into a shared map — is what keeps the open/read/close storm
//! from scaling: the line moves between cores on every such write. The
//! machines we measure on have no hardware performance counters (a VM:
//! `perf stat` reports cycles "not supported", so `perf c2c` cannot
//! count the transfers), so the writes are counted at their sites: every
//! place on the open → read → close path (walk, inode lookup, open-file
//! reference, permission check, page-cache read, close) that writes a line
//! shared with other openers of the same file calls [`note`] with the
//! number of such writes it makes (an `Arc` clone counts 2: the increment
//! now and the decrement when it is dropped).
//!
//! With the `count-shared` cargo feature the counts add up in a
//! per-thread counter ([`count`]); without it [`note`] compiles to
//! nothing. `seeds-read` enables the feature and prints the count per
//! open; the test `shared_writes_per_open` pins it down.

#[cfg(feature = "count-shared")]
thread_local! {
    static WRITES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Record `n` writes to shared cache lines made by the calling thread.
#[inline(always)]
pub(crate) fn note(n: u64) {
    #[cfg(feature = "count-shared")]
    WRITES.with(|c| c.set(c.get() + n));
    #[cfg(not(feature = "count-shared"))]
    let _ = n;
}

/// The calling thread's count of shared writes so far, or `None` when
/// the library was built without the `count-shared` feature.
pub fn count() -> Option<u64> {
    #[cfg(feature = "count-shared")]
    return Some(WRITES.with(|c| c.get()));
    #[cfg(not(feature = "count-shared"))]
    None
}
