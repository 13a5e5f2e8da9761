//! Many threads reading one shared `Fs` see exactly what one thread sees.
//!
//! The engine's read path is lock-free by design (lock-free lseek, lock-free
//! dentry references and path walk: ARCHITECTURE.md's principles): dentry
//! and inode caches read without locks, buffers checked once and then
//! trusted, page-cache eviction concurrent with lookups. The failure mode of
//! such code is not a crash but a wrong answer under contention — a
//! half-initialised inode, a page evicted under a reader, a negative dentry
//! raced into the cache. So eight threads walk the same image through one
//! `Arc<Fs>`, each in its own shuffled order, with a cache budget far below
//! the image's data so eviction runs all the time, and each thread's digest
//! of the whole tree (names, stat, content hashes, xattrs, link targets,
//! data layout) must equal a single-threaded walk on a fresh `Fs`.

use std::sync::{Arc, Barrier};

use ext4kit::{Fs, OpenOptions};
use ext4kit_blockdev::MemDevice;
use ext4kit_fuzz::base::{load_or_build, readers_spec};
use ext4kit_fuzz::{walk_with, TreeDigest, WalkLimits};

/// Far below the ~50 MiB of file data and the ~1.5 MiB of metadata: the
/// page cache, the buffer cache (a quarter of the budget) and the inode
/// cache all evict while other threads look things up.
const BUDGET: usize = 2 << 20;
const THREADS: usize = 8;
const ROUNDS: usize = 2;

fn open(bytes: &Arc<Vec<u8>>) -> Arc<Fs> {
    let dev = Arc::new(MemDevice::from_vec_read_only(bytes.as_ref().clone()));
    Fs::open_device(dev, &OpenOptions { read_only: true, cache_budget: BUDGET, ..Default::default() })
        .expect("open the readers image")
}

#[test]
fn concurrent_walks_match_a_single_threaded_walk() {
    let img = load_or_build(&readers_spec())
        .unwrap_or_else(|e| panic!("cannot build the concurrent-readers image, so nothing was tested: {e}"));
    let limits = WalkLimits::default();

    let mut reference = TreeDigest::default();
    let fresh = open(&img.bytes);
    let rep = walk_with(&fresh, &limits, Some(&mut reference));
    let distinct_metadata = fresh.stats().metadata_misses;
    assert!(rep.errors.is_empty() && rep.violations.is_empty(), "single-threaded walk failed: {:?}", rep.error_samples);
    assert!(!rep.capped, "the reference walk hit a cap: {rep:?}");
    assert!(reference.entries.len() > 4_000, "tree too small: {} paths", reference.entries.len());
    assert!(rep.bytes_read > 4 * BUDGET as u64, "data must exceed the cache budget to force eviction");

    let shared = open(&img.bytes);
    for round in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (fs, barrier) = (shared.clone(), barrier.clone());
                let limits = WalkLimits { order_seed: Some((round * THREADS + t) as u64), ..WalkLimits::default() };
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut d = TreeDigest::default();
                    let rep = walk_with(&fs, &limits, Some(&mut d));
                    (rep, d)
                })
            })
            .collect();
        for (t, h) in handles.into_iter().enumerate() {
            let (rep, d) = h.join().expect("a reader thread panicked");
            assert!(
                rep.errors.is_empty() && rep.violations.is_empty(),
                "round {round} thread {t}: errors {:?} violations {:?}",
                rep.error_samples,
                rep.violations
            );
            assert_eq!(rep.resolve_mismatches, 0, "round {round} thread {t}: lookup disagreed with readdir");
            if let Some(diff) = reference.first_difference(&d) {
                panic!("round {round} thread {t} saw a different tree than the single-threaded walk at {diff}");
            }
        }
        let st = shared.stats();
        eprintln!("round {round}: {st:?}");
        assert!(st.cached_page_bytes <= BUDGET, "page cache exceeded the budget: {st:?}");
        assert!(
            st.metadata_misses > (round as u64 + 1) * distinct_metadata,
            "metadata blocks were never evicted (misses {} vs {distinct_metadata} distinct): the test lost its teeth",
            st.metadata_misses
        );
    }
}
