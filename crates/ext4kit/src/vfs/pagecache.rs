//! The page cache: file data in memory, one page per filesystem block,
//! indexed per inode by logical block number.
//!
//! Reads are lock-free lookups. A miss maps the block run once and reads
//! it with a single device read. Holes and unwritten extents are never
//! cached: they are zero-filled straight into the caller's buffer, so a
//! sparse multi-GiB file costs no memory.
//!
//! Each inode's [`PageMap`] is where the write side will keep its dirty
//! set (seed 003: fsync walks the dirty set, never the whole map). The
//! global budget bounds memory: past it, clean pages not touched since
//! the last sweep are dropped.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// One cached block of file data.
#[derive(Debug)]
pub struct Page {
    /// The bytes (one filesystem block).
    pub data: Box<[u8]>,
    referenced: AtomicBool,
}

impl Page {
    /// A page holding `data`.
    pub fn new(data: Box<[u8]>) -> Self {
        Page {
            data,
            referenced: AtomicBool::new(true),
        }
    }
}

/// The pages of one inode.
#[derive(Debug, Default)]
pub struct PageMap {
    pages: papaya::HashMap<u64, Arc<Page>>,
}

impl PageMap {
    /// The cached page for logical block `lblk`.
    pub fn get(&self, lblk: u64) -> Option<Arc<Page>> {
        let m = self.pages.pin();
        let p = m.get(&lblk)?;
        crate::vfs::touch(&p.referenced);
        Some(p.clone())
    }

    /// Run `f` on the bytes of the cached page for `lblk`, without taking a
    /// reference on it.
    #[inline]
    pub fn with<R>(&self, lblk: u64, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let m = self.pages.pin();
        let p = m.get(&lblk)?;
        crate::vfs::touch(&p.referenced);
        Some(f(&p.data))
    }

    /// Insert a freshly read page; returns true when it was new.
    pub fn insert(&self, lblk: u64, page: Arc<Page>) -> bool {
        let m = self.pages.pin();
        let got = m.get_or_insert(lblk, page.clone());
        Arc::ptr_eq(got, &page)
    }

    /// Number of cached pages.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether no page is cached.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Drop clean pages not referenced since the last sweep; returns how many.
    pub fn sweep(&self) -> usize {
        let m = self.pages.pin();
        let mut n = 0;
        for (k, p) in m.iter() {
            if !p.referenced.swap(false, Ordering::Relaxed) && m.remove(k).is_some() {
                n += 1;
            }
        }
        n
    }
}

/// Memory accounting shared by every inode's page map.
#[derive(Debug)]
pub struct PageBudget {
    bytes: AtomicUsize,
    limit: usize,
    page_size: usize,
}

impl PageBudget {
    /// A budget of `limit` bytes of `page_size`-byte pages.
    pub fn new(limit: usize, page_size: usize) -> Self {
        PageBudget {
            bytes: AtomicUsize::new(0),
            limit: limit.max(page_size * 64),
            page_size,
        }
    }

    /// Account for `n` new pages; true when the budget is now exceeded.
    pub fn charge(&self, n: usize) -> bool {
        self.bytes.fetch_add(n * self.page_size, Ordering::Relaxed) + n * self.page_size > self.limit
    }

    /// Release `n` pages.
    pub fn release(&self, n: usize) {
        self.bytes.fetch_sub(n * self.page_size, Ordering::Relaxed);
    }

    /// Bytes in use.
    pub fn used(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The configured limit.
    pub fn limit(&self) -> usize {
        self.limit
    }
}
