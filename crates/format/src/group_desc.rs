//! Block group descriptors: 32 bytes, or `s_desc_size` (64+) on 64bit images.
//!
//! The 64-byte layout is the 32-byte one plus `_hi` halves; parsing a 32-byte
//! descriptor leaves the `_hi` fields zero and serialising writes only the
//! first 32 bytes, so both sizes round-trip bit-exactly.

use crate::checksum::{crc16, crc32c};
use crate::error::{corrupt, FormatError, Result};

/// `bg_flags`: inode table and bitmap not initialised.
pub const BG_INODE_UNINIT: u16 = 0x1;
/// `bg_flags`: block bitmap not initialised.
pub const BG_BLOCK_UNINIT: u16 = 0x2;
/// `bg_flags`: inode table has been zeroed.
pub const BG_INODE_ZEROED: u16 = 0x4;

crate::layout! {
    /// `struct ext4_group_desc` (the 64-byte form; see the module docs).
    pub struct GroupDesc (64) {
        block_bitmap_lo: u32 = 0x0,
        inode_bitmap_lo: u32 = 0x4,
        inode_table_lo: u32 = 0x8,
        free_blocks_count_lo: u16 = 0xC,
        free_inodes_count_lo: u16 = 0xE,
        used_dirs_count_lo: u16 = 0x10,
        flags: u16 = 0x12,
        exclude_bitmap_lo: u32 = 0x14,
        block_bitmap_csum_lo: u16 = 0x18,
        inode_bitmap_csum_lo: u16 = 0x1A,
        itable_unused_lo: u16 = 0x1C,
        checksum: u16 = 0x1E,
        block_bitmap_hi: u32 = 0x20,
        inode_bitmap_hi: u32 = 0x24,
        inode_table_hi: u32 = 0x28,
        free_blocks_count_hi: u16 = 0x2C,
        free_inodes_count_hi: u16 = 0x2E,
        used_dirs_count_hi: u16 = 0x30,
        itable_unused_hi: u16 = 0x32,
        exclude_bitmap_hi: u32 = 0x34,
        block_bitmap_csum_hi: u16 = 0x38,
        inode_bitmap_csum_hi: u16 = 0x3A,
        reserved: u32 = 0x3C,
    }
    split {
        /// Block number of the block bitmap.
        block_bitmap / set_block_bitmap: u64 = block_bitmap_lo + block_bitmap_hi,
        /// Block number of the inode bitmap.
        inode_bitmap / set_inode_bitmap: u64 = inode_bitmap_lo + inode_bitmap_hi,
        /// First block of the inode table.
        inode_table / set_inode_table: u64 = inode_table_lo + inode_table_hi,
        /// Free blocks in the group.
        free_blocks_count / set_free_blocks_count: u32 = free_blocks_count_lo + free_blocks_count_hi,
        /// Free inodes in the group.
        free_inodes_count / set_free_inodes_count: u32 = free_inodes_count_lo + free_inodes_count_hi,
        /// Directories in the group.
        used_dirs_count / set_used_dirs_count: u32 = used_dirs_count_lo + used_dirs_count_hi,
        /// Inodes at the end of the table never used.
        itable_unused / set_itable_unused: u32 = itable_unused_lo + itable_unused_hi,
        /// Block number of the snapshot exclude bitmap.
        exclude_bitmap / set_exclude_bitmap: u64 = exclude_bitmap_lo + exclude_bitmap_hi,
        /// `bg_block_bitmap_csum`: crc32c of the block bitmap; `wide` is
        /// `s_desc_size >= 64`, the descriptors that hold the high half (the
        /// kernel's `ext4_block_bitmap_csum_set`).
        set_block_bitmap_csum: u32 = block_bitmap_csum_lo + block_bitmap_csum_hi if wide,
        /// `bg_inode_bitmap_csum`: crc32c of the inode bitmap; `wide` is
        /// `s_desc_size >= 64`, the descriptors that hold the high half (the
        /// kernel's `ext4_inode_bitmap_csum_set`).
        set_inode_bitmap_csum: u32 = inode_bitmap_csum_lo + inode_bitmap_csum_hi if wide,
    }
}

/// Offset of `bg_checksum` within a descriptor.
const CSUM_OFF: usize = 0x1E;

/// Which checksum protects the descriptors of this filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GdCsum {
    /// Neither `metadata_csum` nor `gdt_csum`.
    None,
    /// `gdt_csum` (crc16 over uuid, group and descriptor).
    Crc16 {
        /// `s_uuid`.
        uuid: [u8; 16],
    },
    /// `metadata_csum` (low 16 bits of crc32c seeded with the fs seed).
    Crc32c {
        /// Filesystem checksum seed.
        seed: u32,
    },
}

impl GroupDesc {
    /// Decode a descriptor of `desc_size` bytes (32 or 64+) without checks.
    pub fn parse_sized(buf: &[u8], desc_size: usize) -> Self {
        if desc_size >= 64 {
            Self::parse_raw(buf)
        } else {
            let mut b = [0u8; 64];
            b[..32].copy_from_slice(&buf[..32]);
            Self::parse_raw(&b)
        }
    }

    /// Decode and verify the checksum of descriptor `group`.
    pub fn parse(buf: &[u8], desc_size: usize, group: u32, csum: GdCsum) -> Result<Self> {
        if buf.len() < desc_size || desc_size < 32 {
            return Err(corrupt("group descriptor", format!("group {group}: short buffer")));
        }
        let gd = Self::parse_sized(buf, desc_size);
        if let Some(computed) = Self::compute_checksum(&buf[..desc_size], group, csum) {
            if computed != gd.checksum {
                return Err(FormatError::Checksum {
                    structure: "group descriptor",
                    stored: gd.checksum as u32,
                    computed: computed as u32,
                });
            }
        }
        Ok(gd)
    }

    /// The descriptor checksum for the raw bytes `raw` (its own checksum field
    /// is skipped), or `None` when the filesystem has no descriptor checksums.
    pub fn compute_checksum(raw: &[u8], group: u32, csum: GdCsum) -> Option<u16> {
        match csum {
            GdCsum::None => None,
            GdCsum::Crc32c { seed } => {
                let mut c = crc32c(seed, &group.to_le_bytes());
                c = crc32c(c, &raw[..CSUM_OFF]);
                c = crc32c(c, &[0, 0]);
                c = crc32c(c, &raw[CSUM_OFF + 2..]);
                Some((c & 0xffff) as u16)
            }
            GdCsum::Crc16 { uuid } => {
                let mut c = crc16(!0, &uuid);
                c = crc16(c, &group.to_le_bytes());
                c = crc16(c, &raw[..CSUM_OFF]);
                if raw.len() > CSUM_OFF + 2 {
                    c = crc16(c, &raw[CSUM_OFF + 2..]);
                }
                Some(c)
            }
        }
    }

    /// Serialise into `desc_size` bytes with a fresh checksum.
    pub fn to_bytes_sized(&self, desc_size: usize, group: u32, csum: GdCsum) -> Vec<u8> {
        let mut full = vec![0u8; Self::stored_len(desc_size)];
        self.write_sized_into(&mut full, group, csum);
        full
    }

    /// Bytes a descriptor takes with `s_desc_size` = `desc_size`: 32
    /// below 64 (no 64bit feature), else `desc_size`.
    pub fn stored_len(desc_size: usize) -> usize {
        if desc_size < 64 {
            32
        } else {
            desc_size
        }
    }

    /// [`Self::to_bytes_sized`] into `out` ([`Self::stored_len`] bytes):
    /// the writer encodes straight into the descriptor block, with no
    /// buffer allocated per descriptor written. Bytes past the 64 we know
    /// are zeroed.
    pub fn write_sized_into(&self, out: &mut [u8], group: u32, csum: GdCsum) {
        let mut full = [0u8; Self::SIZE];
        self.serialize_into(&mut full);
        let n = out.len().min(Self::SIZE);
        out[..n].copy_from_slice(&full[..n]);
        out[n..].fill(0);
        if let Some(c) = Self::compute_checksum(out, group, csum) {
            out[CSUM_OFF..CSUM_OFF + 2].copy_from_slice(&c.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_complete() {
        GroupDesc::layout_covers_every_byte();
    }

    proptest! {
        #[test]
        fn roundtrip_64(bytes in proptest::collection::vec(any::<u8>(), 64)) {
            prop_assert_eq!(GroupDesc::parse_raw(&bytes).to_bytes(), bytes);
        }

        #[test]
        fn roundtrip_32_with_checksum(bytes in proptest::collection::vec(any::<u8>(), 32), g in any::<u32>()) {
            let csum = GdCsum::Crc16 { uuid: [7; 16] };
            let gd = GroupDesc::parse_sized(&bytes, 32);
            let out = gd.to_bytes_sized(32, g, csum);
            prop_assert_eq!(&out[..CSUM_OFF], &bytes[..CSUM_OFF]);
            prop_assert!(GroupDesc::parse(&out, 32, g, csum).is_ok());
            let mut bad = out.clone();
            bad[0] ^= 1;
            prop_assert!(GroupDesc::parse(&bad, 32, g, csum).is_err());
        }

        /// Written in place over old bytes (as into a descriptor block),
        /// a 64bit descriptor is the 64 known bytes with a fresh crc32c
        /// and zeros after them, whatever was there before.
        #[test]
        fn written_in_place_over_garbage(bytes in proptest::collection::vec(any::<u8>(), 64), g in any::<u32>(), size in prop_oneof![Just(64usize), Just(128usize)]) {
            let csum = GdCsum::Crc32c { seed: 0x1234_5678 };
            let gd = GroupDesc::parse_raw(&bytes);
            let mut block = vec![0xAAu8; size + 16];
            gd.write_sized_into(&mut block[8..8 + size], g, csum);
            // Built the other way: the 64-byte layout, zero padding, then
            // the checksum over the whole descriptor.
            let mut expect = gd.to_bytes();
            expect.resize(size, 0);
            let c = GroupDesc::compute_checksum(&expect, g, csum).unwrap();
            expect[CSUM_OFF..CSUM_OFF + 2].copy_from_slice(&c.to_le_bytes());
            prop_assert_eq!(&block[8..8 + size], &expect[..]);
            prop_assert!(block[8 + 64..8 + size].iter().all(|&b| b == 0));
            prop_assert!(block[..8].iter().chain(&block[8 + size..]).all(|&b| b == 0xAA), "only its own bytes");
            prop_assert!(GroupDesc::parse(&block[8..8 + size], size, g, csum).is_ok());
            prop_assert_eq!(&block[8..8 + CSUM_OFF], &bytes[..CSUM_OFF]);
        }
    }
}
