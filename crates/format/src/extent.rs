//! Extent tree nodes (`struct ext4_extent_header`, `ext4_extent_idx`,
//! `ext4_extent`) and the checksum tail of on-disk extent blocks.
//!
//! A node is a 12-byte header followed by `eh_max` 12-byte slots; the root
//! lives in the inode's 60-byte `i_block` (at most 4 slots), other nodes fill
//! a block and end in a 4-byte `ext4_extent_tail` when `metadata_csum` is on.

use crate::bytes::{le16, le32};
use crate::checksum::crc32c;
use crate::error::{corrupt, FormatError, Result};

/// `eh_magic`.
pub const EXTENT_MAGIC: u16 = 0xF30A;
/// The kernel refuses trees deeper than this (`EXT4_MAX_EXTENT_DEPTH`).
pub const MAX_DEPTH: u16 = 5;
/// An initialised extent covers at most this many blocks.
pub const MAX_INIT_LEN: u16 = 32768;

crate::layout! {
    /// `struct ext4_extent_header`.
    pub struct ExtentHeader (12) {
        magic: u16 = 0x0,
        entries: u16 = 0x2,
        max: u16 = 0x4,
        depth: u16 = 0x6,
        generation: u32 = 0x8,
    }
}

crate::layout! {
    /// `struct ext4_extent_idx`: points at the node covering blocks from `block`.
    pub struct ExtentIndex (12) {
        block: u32 = 0x0,
        leaf_lo: u32 = 0x4,
        leaf_hi: u16 = 0x8,
        unused: u16 = 0xA,
    }
    split {
        /// Physical block of the child node.
        leaf / set_leaf: u64 = leaf_lo + leaf_hi,
    }
}

crate::layout! {
    /// `struct ext4_extent`: `len` blocks from logical `block` at physical `start`.
    pub struct Extent (12) {
        block: u32 = 0x0,
        len: u16 = 0x4,
        start_hi: u16 = 0x6,
        start_lo: u32 = 0x8,
    }
    split {
        /// Physical block of the first block of the extent.
        start / set_start: u64 = start_lo + start_hi,
    }
}

impl ExtentIndex {
    /// An index entry: the child node at physical block `leaf` covers the
    /// logical blocks from `block`.
    pub fn new(block: u32, leaf: u64) -> Self {
        let mut i = ExtentIndex {
            block,
            leaf_lo: 0,
            leaf_hi: 0,
            unused: 0,
        };
        i.set_leaf(leaf);
        i
    }
}

impl Extent {
    /// Number of blocks covered.
    pub fn length(&self) -> u32 {
        if self.len > MAX_INIT_LEN {
            (self.len - MAX_INIT_LEN) as u32
        } else {
            self.len as u32
        }
    }

    /// Whether the extent is allocated but unwritten (reads as zeros).
    pub fn is_uninit(&self) -> bool {
        self.len > MAX_INIT_LEN
    }

    /// Build an extent (encoding `uninit` in the length as the kernel does).
    pub fn new(block: u32, len: u32, start: u64, uninit: bool) -> Self {
        let l = if uninit { len as u16 + MAX_INIT_LEN } else { len as u16 };
        let mut e = Extent {
            block,
            len: l,
            start_hi: 0,
            start_lo: 0,
        };
        e.set_start(start);
        e
    }
}

/// The contents of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeEntries {
    /// Depth 0: extents.
    Leaf(Vec<Extent>),
    /// Depth > 0: pointers to children.
    Index(Vec<ExtentIndex>),
}

/// A decoded extent tree node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentNode {
    /// The header.
    pub header: ExtentHeader,
    /// Its entries, in on-disk order.
    pub entries: NodeEntries,
}

/// Offset of the checksum tail in an extent block whose header says `max`.
pub fn tail_offset(max: u16) -> usize {
    ExtentHeader::SIZE + ExtentIndex::SIZE * max as usize
}

impl ExtentNode {
    /// Decode and validate a node held in `buf` (60 bytes for the root in
    /// `i_block`, a block otherwise).
    ///
    /// Checks magic, `entries <= max`, that `max` slots fit in `buf`, depth
    /// bound, and that entries are sorted by logical block (which is what
    /// makes the binary search in the mapper correct and cycle-free within a
    /// node).
    pub fn parse(buf: &[u8]) -> Result<Self> {
        const S: &str = "extent header";
        if buf.len() < ExtentHeader::SIZE {
            return Err(corrupt(S, "node too small"));
        }
        let h = ExtentHeader::parse_raw(buf);
        if h.magic != EXTENT_MAGIC {
            return Err(corrupt(S, format!("bad magic {:#06x}", h.magic)));
        }
        if h.entries > h.max {
            return Err(corrupt(S, format!("{} entries exceed max {}", h.entries, h.max)));
        }
        if tail_offset(h.max) > buf.len() {
            return Err(corrupt(
                S,
                format!("max {} slots overrun a {}-byte node", h.max, buf.len()),
            ));
        }
        if h.depth > MAX_DEPTH {
            return Err(corrupt(S, format!("depth {} exceeds {}", h.depth, MAX_DEPTH)));
        }
        let n = h.entries as usize;
        let slot = |i: usize| &buf[ExtentHeader::SIZE + 12 * i..ExtentHeader::SIZE + 12 * (i + 1)];
        let entries = if h.depth == 0 {
            let v: Vec<Extent> = (0..n).map(|i| Extent::parse_raw(slot(i))).collect();
            for w in v.windows(2) {
                if (w[0].block as u64) + w[0].length() as u64 > w[1].block as u64 {
                    return Err(corrupt(
                        "extent",
                        format!("extents at {} and {} overlap or are unsorted", w[0].block, w[1].block),
                    ));
                }
            }
            if let Some(e) = v.iter().find(|e| e.length() == 0) {
                return Err(corrupt(
                    "extent",
                    format!("zero-length extent at logical block {}", e.block),
                ));
            }
            NodeEntries::Leaf(v)
        } else {
            let v: Vec<ExtentIndex> = (0..n).map(|i| ExtentIndex::parse_raw(slot(i))).collect();
            for w in v.windows(2) {
                if w[0].block >= w[1].block {
                    return Err(corrupt(
                        "extent index",
                        format!("index entries {} and {} unsorted", w[0].block, w[1].block),
                    ));
                }
            }
            NodeEntries::Index(v)
        };
        Ok(ExtentNode { header: h, entries })
    }

    /// Serialise into `buf` (slots past `entries` are left as they are).
    pub fn serialize_into(&self, buf: &mut [u8]) {
        self.header.serialize_into(buf);
        match &self.entries {
            NodeEntries::Leaf(v) => {
                for (i, e) in v.iter().enumerate() {
                    e.serialize_into(&mut buf[12 + 12 * i..]);
                }
            }
            NodeEntries::Index(v) => {
                for (i, e) in v.iter().enumerate() {
                    e.serialize_into(&mut buf[12 + 12 * i..]);
                }
            }
        }
    }
}

/// Verify the `ext4_extent_tail` checksum of an extent block.
pub fn verify_block_checksum(block: &[u8], inode_seed: u32) -> Result<()> {
    let max = le16(block, 4);
    let off = tail_offset(max);
    if off + 4 > block.len() {
        return Err(corrupt("extent block", format!("tail at {off} beyond block")));
    }
    let stored = le32(block, off);
    let computed = crc32c(inode_seed, &block[..off]);
    if stored != computed {
        return Err(FormatError::Checksum {
            structure: "extent block",
            stored,
            computed,
        });
    }
    Ok(())
}

/// Write the `ext4_extent_tail` checksum of an extent block.
pub fn set_block_checksum(block: &mut [u8], inode_seed: u32) {
    let off = tail_offset(le16(block, 4));
    let c = crc32c(inode_seed, &block[..off]);
    block[off..off + 4].copy_from_slice(&c.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layouts_are_complete() {
        ExtentHeader::layout_covers_every_byte();
        ExtentIndex::layout_covers_every_byte();
        Extent::layout_covers_every_byte();
    }

    fn arb_leaf() -> impl Strategy<Value = Vec<(u32, u16, u64)>> {
        proptest::collection::vec((1u32..1000, 1u16..65535, 0u64..(1 << 48)), 0..4)
    }

    proptest! {
        #[test]
        fn leaf_roundtrip(raw in arb_leaf()) {
            let mut block = 0u32;
            let mut ext = Vec::new();
            for (gap, len, start) in raw {
                let len = if len == MAX_INIT_LEN { 1 } else { len };
                let mut e = Extent { block: block + gap, len, start_hi: 0, start_lo: 0 };
                e.set_start(start);
                block = block + gap + e.length();
                ext.push(e);
            }
            let node = ExtentNode {
                header: ExtentHeader { magic: EXTENT_MAGIC, entries: ext.len() as u16, max: 4, depth: 0, generation: 0 },
                entries: NodeEntries::Leaf(ext),
            };
            let mut buf = vec![0u8; 60];
            node.serialize_into(&mut buf);
            prop_assert_eq!(ExtentNode::parse(&buf).unwrap(), node);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = ExtentNode::parse(&bytes);
        }
    }

    #[test]
    fn block_checksum() {
        let mut b = vec![0u8; 1024];
        ExtentHeader {
            magic: EXTENT_MAGIC,
            entries: 0,
            max: 84,
            depth: 0,
            generation: 0,
        }
        .serialize_into(&mut b);
        set_block_checksum(&mut b, 42);
        verify_block_checksum(&b, 42).unwrap();
        b[20] = 1;
        assert!(verify_block_checksum(&b, 42).is_err());
    }
}
