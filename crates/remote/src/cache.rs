//! The bounded LRU cache of fetched blocks.
//!
//! Remote reads cost a round trip each, so blocks are kept for reuse; but a
//! many-gigabyte image must not end up in memory, so the cache counts bytes
//! and evicts the least recently used blocks before it would exceed its
//! bound. A block handed to a reader is a shared `Bytes`: evicting it never
//! pulls data from under a reader, and it is freed when the last user drops
//! it.
//!
//! Plain maps under the device's one lock: the cache is consulted once per
//! block per read, which is nothing next to a network round trip.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

/// Blocks by index, with their recency.
pub(crate) struct BlockCache {
    cap: u64,
    used: u64,
    peak: u64,
    clock: u64,
    blocks: HashMap<u64, (Bytes, u64)>,
    /// Recency tick to block index; the first entry is the least recent.
    order: BTreeMap<u64, u64>,
}

impl BlockCache {
    /// A cache that never holds more than `cap` bytes.
    pub(crate) fn new(cap: u64) -> Self {
        BlockCache {
            cap,
            used: 0,
            peak: 0,
            clock: 0,
            blocks: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// The block, if cached, marked most recently used.
    pub(crate) fn get(&mut self, index: u64) -> Option<Bytes> {
        self.clock += 1;
        let tick = self.clock;
        let (data, old) = self.blocks.get_mut(&index)?;
        self.order.remove(old);
        *old = tick;
        self.order.insert(tick, index);
        Some(data.clone())
    }

    /// Whether the block is cached, without touching its recency (readahead
    /// asks this and must not keep blocks alive that nobody reads).
    pub(crate) fn contains(&self, index: u64) -> bool {
        self.blocks.contains_key(&index)
    }

    /// Keep `data` as block `index`, evicting least recently used blocks to
    /// stay within the bound. A block larger than the whole bound is not
    /// kept at all.
    pub(crate) fn insert(&mut self, index: u64, data: Bytes) {
        let len = data.len() as u64;
        if len > self.cap {
            return;
        }
        if let Some((old, tick)) = self.blocks.remove(&index) {
            self.order.remove(&tick);
            self.used -= old.len() as u64;
        }
        while self.used + len > self.cap {
            let Some((_, victim)) = self.order.pop_first() else {
                break;
            };
            if let Some((old, _)) = self.blocks.remove(&victim) {
                self.used -= old.len() as u64;
            }
        }
        self.clock += 1;
        self.order.insert(self.clock, index);
        self.blocks.insert(index, (data, self.clock));
        self.used += len;
        self.peak = self.peak.max(self.used);
    }

    /// Bytes held now.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// The most bytes ever held.
    pub(crate) fn peak(&self) -> u64 {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: usize) -> Bytes {
        Bytes::from(vec![0u8; n])
    }

    #[test]
    fn evicts_least_recent_within_bound() {
        let mut c = BlockCache::new(300);
        c.insert(1, block(100));
        c.insert(2, block(100));
        c.insert(3, block(100));
        assert!(c.get(1).is_some()); // 2 is now the least recent
        c.insert(4, block(100));
        assert!(c.contains(1) && !c.contains(2) && c.contains(3) && c.contains(4));
        assert_eq!(c.used(), 300);
        c.insert(5, block(250));
        assert_eq!(c.used(), 250);
        assert!(c.peak() <= 300);
        c.insert(6, block(301));
        assert!(!c.contains(6));
    }

    #[test]
    fn zero_bound_keeps_nothing() {
        let mut c = BlockCache::new(0);
        c.insert(1, block(1));
        assert!(c.get(1).is_none());
        assert_eq!(c.peak(), 0);
    }

    #[test]
    fn reinsert_replaces() {
        let mut c = BlockCache::new(100);
        c.insert(1, block(60));
        c.insert(1, block(40));
        assert_eq!(c.used(), 40);
        assert_eq!(c.order.len(), 1);
    }
}
