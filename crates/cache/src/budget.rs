//! One memory budget for the two big caches: metadata buffers (ext4's
//! `buffer.rs`) and file pages (the vfs layer's `pagecache.rs`).
//!
//! Each used to own a fixed slice of `OpenOptions::cache_budget` — pages a
//! half, buffers a quarter — so a create storm thrashed its 64 MiB of
//! buffers (a directory of 1,000,000 names is 32 MiB of leaves, and half
//! the buffers may be dirty) while the pages' 128 MiB stood empty, and a
//! streaming read could never use the buffers' idle quarter. Now the two
//! share three quarters of the budget (the last quarter stands for the
//! inode and dentry caches, which count entries): each may use what the
//! other leaves, and each keeps a floor that is always its own — buffers
//! an eighth of the budget, pages a quarter.
//!
//! Each cache evicts only its own entries, when it finds itself over its
//! limit. Buffers that grew into the pages' share give it back when the
//! page side runs short (`Fs::shrink_pages` asks the buffer cache to shrink
//! to its old quarter): the page side may call down into the ext4 layer,
//! never the other way.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The shared budget and what each cache holds of it.
#[derive(Debug)]
pub struct MemoryBudget {
    shared: usize,
    buffer_floor: usize,
    page_floor: usize,
    buffer_share: usize,
    dirty_pages: usize,
    /// Bytes of metadata buffers cached (kept by the buffer cache).
    buffers: AtomicUsize,
    /// Bytes of file pages cached (kept by the page budget).
    pages: AtomicUsize,
}

impl MemoryBudget {
    /// The split of `total` bytes of cache for blocks of `block_size`.
    pub fn new(total: usize, block_size: usize) -> Self {
        let total = total.max(block_size * 128);
        MemoryBudget {
            shared: total / 4 * 3,
            buffer_floor: (total / 8).max(block_size * 16),
            page_floor: (total / 4).max(block_size * 64),
            buffer_share: total / 4,
            dirty_pages: (total / 8).max(block_size * 16),
            buffers: AtomicUsize::new(0),
            pages: AtomicUsize::new(0),
        }
    }

    /// A budget with fixed limits and nothing shared: for tests of one
    /// cache, whose limit must not move with the other's use.
    pub fn fixed(buffers: usize, pages: usize) -> Self {
        MemoryBudget {
            shared: 0,
            buffer_floor: buffers,
            page_floor: pages,
            buffer_share: buffers,
            dirty_pages: pages / 4,
            buffers: AtomicUsize::new(0),
            pages: AtomicUsize::new(0),
        }
    }

    /// Bytes the buffer cache may hold now.
    pub fn buffer_limit(&self) -> usize {
        self.shared
            .saturating_sub(self.pages.load(Ordering::Relaxed))
            .max(self.buffer_floor)
    }

    /// Bytes the page cache may hold now.
    pub fn page_limit(&self) -> usize {
        self.shared
            .saturating_sub(self.buffers.load(Ordering::Relaxed))
            .max(self.page_floor)
    }

    /// What the buffer cache shrinks to when pages need their share back.
    pub fn buffer_share(&self) -> usize {
        self.buffer_share
    }

    /// Bytes of dirty pages before writers must write back.
    pub fn dirty_page_limit(&self) -> usize {
        self.dirty_pages
    }

    /// Bytes of metadata buffers cached.
    pub fn buffer_bytes(&self) -> usize {
        self.buffers.load(Ordering::Relaxed)
    }

    /// Bytes of file pages cached.
    pub fn page_bytes(&self) -> usize {
        self.pages.load(Ordering::Relaxed)
    }

    /// The buffer cache took `bytes` more; the bytes it holds now.
    #[inline]
    pub fn charge_buffers(&self, bytes: usize) -> usize {
        self.buffers.fetch_add(bytes, Ordering::Relaxed) + bytes
    }

    /// The buffer cache let `bytes` go.
    #[inline]
    pub fn release_buffers(&self, bytes: usize) {
        self.buffers.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// The page cache took `bytes` more; the bytes it holds now.
    #[inline]
    pub fn charge_pages(&self, bytes: usize) -> usize {
        self.pages.fetch_add(bytes, Ordering::Relaxed) + bytes
    }

    /// The page cache let `bytes` go.
    #[inline]
    pub fn release_pages(&self, bytes: usize) {
        self.pages.fetch_sub(bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_side_gets_what_the_other_leaves_above_its_floor() {
        let b = MemoryBudget::new(256 << 20, 4096);
        assert_eq!(
            b.buffer_limit(),
            192 << 20,
            "pages idle: buffers may use the shared part"
        );
        assert_eq!(b.page_limit(), 192 << 20);
        b.charge_pages(180 << 20);
        assert_eq!(b.buffer_limit(), 32 << 20, "never below the floor (an eighth)");
        b.release_pages(180 << 20);
        b.charge_buffers(150 << 20);
        assert_eq!(b.page_limit(), 64 << 20, "never below the floor (a quarter)");
        assert_eq!(b.buffer_share(), 64 << 20);
    }
}
