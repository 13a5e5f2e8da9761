//! The filesystem's shape (the constant part of the kernel's
//! `ext4_sb_info`): block and inode sizes, counts, the group layout, the
//! checksum seed, the feature words and the directory hash settings, all
//! read from the superblock at open and fixed for the life of the volume
//! (only an offline resize or tune2fs changes them).
//!
//! Locking: none. Every field is immutable after open, so any thread reads
//! them without synchronisation — which is why they are copied out of the
//! superblock (behind its lock) instead of read from it.

use ext4kit_format::dirent::DirFormat;
use ext4kit_format::features::{incompat, ro_compat};
use ext4kit_format::superblock::Superblock;

/// Sizes, counts and features of an open filesystem (see the module doc).
#[derive(Debug, Clone)]
pub struct Geometry {
    block_size: usize,
    inode_size: usize,
    inodes_per_group: u32,
    inodes_count: u32,
    blocks_count: u64,
    first_data_block: u64,
    blocks_per_group: u64,
    group_count: u32,
    desc_size: usize,
    csum_seed: Option<u32>,
    incompat: u32,
    ro_compat: u32,
    compat: u32,
    hash_seed: [u32; 4],
    unsigned_hash: bool,
}

impl Geometry {
    /// The geometry `sb` describes. The caller has checked that the group
    /// count fits in a `u32`.
    pub fn from_superblock(sb: &Superblock) -> Geometry {
        Geometry {
            block_size: sb.block_size() as usize,
            inode_size: sb.inode_size() as usize,
            inodes_per_group: sb.inodes_per_group,
            inodes_count: sb.inodes_count,
            blocks_count: sb.blocks_count(),
            first_data_block: sb.first_data_block as u64,
            blocks_per_group: sb.blocks_per_group as u64,
            group_count: sb.group_count() as u32,
            desc_size: sb.desc_size(),
            csum_seed: sb.metadata_csum().then(|| sb.csum_seed()),
            incompat: sb.feature_incompat,
            ro_compat: sb.feature_ro_compat,
            compat: sb.feature_compat,
            hash_seed: sb.hash_seed,
            unsigned_hash: sb.unsigned_hash(),
        }
    }

    /// Bytes per block.
    #[inline]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes per inode record.
    #[inline]
    pub fn inode_size(&self) -> usize {
        self.inode_size
    }

    /// Inodes per group.
    #[inline]
    pub fn inodes_per_group(&self) -> u32 {
        self.inodes_per_group
    }

    /// Total inodes.
    #[inline]
    pub fn inodes_count(&self) -> u32 {
        self.inodes_count
    }

    /// Total blocks.
    #[inline]
    pub fn blocks_count(&self) -> u64 {
        self.blocks_count
    }

    /// First data block (1 for 1 KiB blocks, else 0).
    #[inline]
    pub fn first_data_block(&self) -> u64 {
        self.first_data_block
    }

    /// Blocks per group.
    #[inline]
    pub fn blocks_per_group(&self) -> u64 {
        self.blocks_per_group
    }

    /// Number of block groups.
    #[inline]
    pub fn group_count(&self) -> u32 {
        self.group_count
    }

    /// Bytes per group descriptor (`s_desc_size`, 32 without `64bit`).
    #[inline]
    pub fn desc_size(&self) -> usize {
        self.desc_size
    }

    /// Filesystem checksum seed when `metadata_csum` is on.
    #[inline]
    pub fn csum_seed(&self) -> Option<u32> {
        self.csum_seed
    }

    /// Per-inode checksum seed, when metadata checksums are on.
    #[inline]
    pub fn inode_seed(&self, ino: u32, generation: u32) -> Option<u32> {
        self.csum_seed
            .map(|s| ext4kit_format::checksum::inode_csum_seed(s, ino, generation))
    }

    /// `s_feature_incompat`.
    #[inline]
    pub fn incompat(&self) -> u32 {
        self.incompat
    }

    /// `s_feature_ro_compat`.
    #[inline]
    pub fn ro_compat(&self) -> u32 {
        self.ro_compat
    }

    /// `s_feature_compat`.
    #[inline]
    pub fn compat(&self) -> u32 {
        self.compat
    }

    /// Whether an INCOMPAT feature is on.
    #[inline]
    pub fn has_incompat(&self, f: u32) -> bool {
        self.incompat & f != 0
    }

    /// Whether a RO_COMPAT feature is on.
    #[inline]
    pub fn has_ro_compat(&self, f: u32) -> bool {
        self.ro_compat & f != 0
    }

    /// Whether a COMPAT feature is on.
    #[inline]
    pub fn has_compat(&self, f: u32) -> bool {
        self.compat & f != 0
    }

    /// `s_hash_seed`.
    #[inline]
    pub fn hash_seed(&self) -> &[u32; 4] {
        &self.hash_seed
    }

    /// Directory hashes treat bytes as unsigned chars.
    #[inline]
    pub fn unsigned_hash(&self) -> bool {
        self.unsigned_hash
    }

    /// How directory entries are encoded on this filesystem.
    #[inline]
    pub fn dir_format(&self) -> DirFormat {
        DirFormat {
            block_size: self.block_size,
            filetype: self.has_incompat(incompat::FILETYPE),
        }
    }

    /// Whether group descriptors carry checksums and lazy-init flags
    /// (`gdt_csum` or `metadata_csum`: the kernel's
    /// `ext4_has_group_desc_csum`). Without it BLOCK_UNINIT,
    /// INODE_UNINIT and `bg_itable_unused` mean nothing to the kernel.
    #[inline]
    pub fn has_group_desc_csum(&self) -> bool {
        self.has_ro_compat(ro_compat::GDT_CSUM | ro_compat::METADATA_CSUM)
    }

    /// Blocks in group `g` (the last group may be short).
    #[inline]
    pub fn blocks_in_group(&self, g: usize) -> u64 {
        let start = self.group_first_block(g as u64);
        (self.blocks_count - start).min(self.blocks_per_group)
    }

    /// The group block `b` lies in (`b` at or past the first data block).
    #[inline]
    pub fn group_of_block(&self, b: u64) -> usize {
        ((b - self.first_data_block) / self.blocks_per_group) as usize
    }

    /// Blocks of one group's inode table.
    #[inline]
    pub fn itable_blocks(&self) -> u64 {
        (self.inodes_per_group as u64 * self.inode_size as u64).div_ceil(self.block_size as u64)
    }

    /// First block of group `g`.
    #[inline]
    pub fn group_first_block(&self, g: u64) -> u64 {
        self.first_data_block + g * self.blocks_per_group
    }

    /// The first block of inode `ino`'s group: an allocation goal near it.
    pub fn group_first_block_of_inode(&self, ino: u32) -> u64 {
        let g = (ino.max(1) - 1) / self.inodes_per_group.max(1);
        self.group_first_block(g as u64 % self.group_count.max(1) as u64)
    }
}
