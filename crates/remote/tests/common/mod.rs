//! What the remote tests share besides the servers (those are
//! `ext4kit_testkit::servers`, shared with the CLI's tests).

#![allow(dead_code)]

use rand::{Rng, SeedableRng};

#[allow(unused_imports)] // each test binary uses its own part
pub use ext4kit_testkit::servers::{free_port, Moto, Nginx};

/// Deterministic pseudo-random bytes: an image whose every block differs,
/// so a block served at the wrong offset cannot go unnoticed.
pub fn image_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

/// Read random ranges of `dev` from `threads` threads at once and check
/// every byte against `local`; returns the bytes read.
pub fn check_random_reads(
    dev: &ext4kit_remote::RemoteDevice,
    local: &[u8],
    threads: usize,
    reads: usize,
    max_len: usize,
    seed: u64,
) -> u64 {
    use ext4kit_blockdev::BlockDevice;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed + t as u64);
                    let mut total = 0u64;
                    for _ in 0..reads {
                        let len = rng.random_range(1..=max_len.min(local.len()));
                        let off = rng.random_range(0..=local.len() - len);
                        let mut buf = vec![0u8; len];
                        dev.read_at(off as u64, &mut buf)
                            .unwrap_or_else(|e| panic!("read of {len} at {off}: {e}"));
                        assert!(buf == local[off..off + len], "bytes differ in read of {len} at {off}");
                        total += len as u64;
                    }
                    total
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("reader thread")).sum()
    })
}
