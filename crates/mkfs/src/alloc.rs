//! The blocks in use while the filesystem is laid out — mkfs's block
//! bitmap, kept as ranges — and the allocator the steps draw from
//! (`ext2fs_get_free_blocks2` / `ext2fs_new_block2`: first fit from a goal,
//! wrapping to the start).

use std::collections::BTreeMap;

use crate::error::{MkfsError, Result};

/// Used blocks as sorted, merged ranges `start -> end` (exclusive): a new
/// filesystem uses a few ranges per group, so this stays small where a
/// bitmap would take `blocks / 8` bytes.
pub(crate) struct Alloc {
    used: BTreeMap<u64, u64>,
    blocks: u64,
}

impl Alloc {
    /// Nothing used yet on a filesystem of `blocks` blocks.
    pub(crate) fn new(blocks: u64) -> Self {
        Alloc {
            used: BTreeMap::new(),
            blocks,
        }
    }

    /// Mark `b .. b + n` used (merging with neighbouring ranges).
    pub(crate) fn mark(&mut self, b: u64, n: u64) {
        if n == 0 {
            return;
        }
        let (mut s, mut e) = (b, b + n);
        if let Some((&ps, &pe)) = self.used.range(..=s).next_back() {
            if pe >= s {
                s = ps;
                e = e.max(pe);
                self.used.remove(&ps);
            }
        }
        while let Some((&ns, &ne)) = self.used.range(s..).next() {
            if ns > e {
                break;
            }
            e = e.max(ne);
            self.used.remove(&ns);
        }
        self.used.insert(s, e);
    }

    /// Claim the first run of `n` free blocks at or after `goal` (then from
    /// `from`).
    pub(crate) fn alloc_range(&mut self, goal: u64, n: u64, from: u64) -> Result<u64> {
        for mut cand in [goal, from] {
            while cand + n <= self.blocks {
                match self.used.range(..cand + n).next_back() {
                    Some((_, &e)) if e > cand => cand = e,
                    _ => {
                        self.mark(cand, n);
                        return Ok(cand);
                    }
                }
            }
        }
        Err(MkfsError::NoSpace(format!(
            "filesystem too small: no room for {n} contiguous free blocks"
        )))
    }

    /// Claim one free block at or after `*cursor` (wrapping to `from`) and
    /// move the cursor past it.
    pub(crate) fn next(&mut self, cursor: &mut u64, from: u64) -> Result<u64> {
        let b = self.alloc_range(*cursor, 1, from)?;
        *cursor = b + 1;
        Ok(b)
    }

    /// The used ranges overlapping `start .. start + n`, clipped to it.
    pub(crate) fn used_in(&self, start: u64, n: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let end = start + n;
        let first = self.used.range(..=start).next_back().map(|(&s, _)| s).unwrap_or(start);
        self.used
            .range(first..end)
            .filter(move |(_, &e)| e > start)
            .map(move |(&s, &e)| (s.max(start), e.min(end)))
    }

    /// How many blocks of `start .. start + n` are used.
    pub(crate) fn count_used(&self, start: u64, n: u64) -> u64 {
        self.used_in(start, n).map(|(s, e)| e - s).sum()
    }
}
