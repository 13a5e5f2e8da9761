//! The allocator the `ext4kit` binaries and benchmark programs ship with:
//! mimalloc, tuned for the engine's allocation pattern.
//!
//! Why mimalloc: a metadata block read after a change is a new 4 KiB
//! version (published from its draft, copied again at the next change,
//! freed when the last reader lets go), and the caches free what they
//! evict. Under glibc that churn — then a copy at every change — fragmented
//! the heap until `_int_malloc` was a fifth of a create at 500,000 files
//! and a create storm ran at 39% of its starting speed by 1,000,000 files;
//! with mimalloc it stayed at 68% (measured with `seeds-create`).
//!
//! Why [`tune`]: mimalloc returns freed memory to the kernel 10 ms after
//! it falls free (`purge_delay`). The engine's memory is bounded by its
//! cache budget and churns steadily (evicted inodes, dentries and buffers
//! are replaced by new ones at once), so every purged page came back a few
//! milliseconds later as a page fault — with transparent huge pages, a
//! 2 MiB zeroing each (`clear_page_erms` was 7 µs of a 21 µs create early
//! in a create storm). Not purging keeps the memory we will reuse anyway:
//! `seeds-create --max 200000` made 4,277 page faults and used 4.15 s of
//! CPU before, 1,122 and 3.42 s after. The resident size stays what the
//! cache budget makes it (it no longer shrinks after a burst).
//!
//! Programs embedding the library choose their own allocator; this is
//! what we recommend to them.

/// The global allocator type: `#[global_allocator] static A:
/// ext4kit_alloc::Allocator = ext4kit_alloc::Allocator;`, then [`tune`]
/// first thing in `main`.
pub use mimalloc::MiMalloc as Allocator;

/// mimalloc's `mi_option_purge_delay` (the same position in the option
/// enumeration of its v2 and v3 headers; the Rust bindings name no
/// constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Stop mimalloc from handing freed memory back to the kernel (see the
/// crate documentation). Call it at the start of `main`; options are read
/// when mimalloc next purges, so it takes effect at once.
pub fn tune() {
    // SAFETY: mi_option_set only stores an integer in mimalloc's option
    // table; -1 is the documented "never purge" value.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
}

/// The tuning of a long-running server with a memory budget (`ext4kit
/// mount`), called after [`tune`] and before it serves: no transparent
/// huge pages.
///
/// mimalloc asks for huge pages on its arenas (`MADV_HUGEPAGE`), so with
/// the kernel's THP in `madvise` mode (Debian's default) every 2 MiB of
/// address space the heap touches at all becomes 2 MiB resident: through
/// `ext4kit mount --cache-mib 64`, 1,000,000 creates peaked at 203 MiB
/// with 192 MiB of it huge pages, and at 161 MiB without them, creating as
/// fast (9,395 against 9,109 files/s); a 10,000-file run peaked at 39
/// instead of 70 MiB. The server keeps [`tune`]'s never-purge: purging
/// again (mimalloc's 10 ms) took the million-file peak to 119 MiB but
/// cost the mount's 1 GiB sequential write and cold read 30% and 23%
/// (393 and 547 MiB/s against 560 and 713 in two full `ext4kit bench`
/// runs; an A/B of `--only seq`, two rounds: 298–488 and 430–639 MiB/s
/// purging, 603–677 and 789–858 not, 670–697 and 671–777 with huge
/// pages and no purge — the huge pages themselves cost nothing there).
/// In-process work keeps them ([`tune`] alone): the library's 32 MiB
/// sequential write ran at 500–600 MiB/s without huge pages against
/// 800–970 with them (`ext4kit bench --quick --only seq --peers lib`,
/// three alternating runs each). The THP flag (`PR_SET_THP_DISABLE`)
/// belongs to the process and its future children.
pub fn tune_server() {
    // Failure leaves huge pages allowed: more memory, same results.
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

#[cfg(test)]
mod tests {
    use super::*;
    use libmimalloc_sys as sys;

    fn purge_delay() -> std::ffi::c_long {
        // SAFETY: reading an option.
        unsafe { sys::mi_option_get(MI_OPTION_PURGE_DELAY) }
    }

    /// The effects themselves are measured elsewhere: fewer page faults in
    /// a create storm (`seeds-create` under `perf stat -e page-faults`; a
    /// small unit test could not make mimalloc purge reliably either way),
    /// and the server's resident size through a mount (the mount test
    /// `a_server_uses_its_cache_budget_plus_a_small_fixed_overhead`). Here,
    /// that mimalloc and the kernel take the settings — in one test, as
    /// they are process-wide.
    #[test]
    fn tune_then_tune_server() {
        tune();
        assert_eq!(purge_delay(), -1, "tune: never purge");
        tune_server();
        assert_eq!(purge_delay(), -1, "tune_server keeps never-purge");
        assert_eq!(
            rustix::thread::transparent_huge_pages_are_disabled().ok(),
            Some(true),
            "tune_server: no huge pages"
        );
    }
}
