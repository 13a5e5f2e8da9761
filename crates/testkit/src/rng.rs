//! The seeded random source of fixtures and randomized tests.
//!
//! Fixtures must be byte-identical on every machine and every run, and must
//! not change when a dependency is updated, so this is ChaCha8 from
//! `rand_chacha`, whose output for a seed is part of its documented
//! contract (unlike `rand`'s `StdRng`, which may change algorithm between
//! releases). A failure is replayed from its seed alone.

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A deterministic generator: its whole output is a function of the seed
/// (and, for [`TestRng::for_label`], the label).
#[derive(Debug, Clone)]
pub struct TestRng(ChaCha8Rng);

impl TestRng {
    /// A generator whose whole output is determined by `seed`.
    pub fn new(seed: u64) -> Self {
        Self(ChaCha8Rng::seed_from_u64(seed))
    }

    /// A generator for one named purpose, so adding a file to a generated
    /// tree does not shift the contents of every other file: the label
    /// picks the stream (ChaCha's 64-bit stream number, from a stable FNV-1a
    /// hash of the label — `std`'s hasher is not stable across releases).
    pub fn for_label(seed: u64, label: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in label.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        r.set_stream(h);
        Self(r)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A value in `0..n` (`0` when `n` is `0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.0.random_range(0..n)
        }
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        self.0.fill_bytes(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_and_a_label_fix_the_output() {
        let mut a = TestRng::new(42);
        let mut b = TestRng::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(TestRng::new(1).next_u64(), TestRng::new(2).next_u64());
        let (mut x, mut y) = (TestRng::for_label(7, "a"), TestRng::for_label(7, "b"));
        assert_ne!(x.next_u64(), y.next_u64());
        assert_eq!(
            TestRng::for_label(7, "a").next_u64(),
            TestRng::for_label(7, "a").next_u64()
        );
        let mut r = TestRng::new(3);
        assert!((0..1000).all(|_| r.below(10) < 10));
        assert_eq!(r.below(0), 0);
    }
}
