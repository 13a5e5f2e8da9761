//! Which checksums the new filesystem carries and their seeds: with
//! `metadata_csum`, crc32c seeded by `crc32c(~0, s_uuid)` (or by
//! `s_checksum_seed` with `metadata_csum_seed`) over inodes, directory
//! blocks, extent blocks, bitmaps and descriptors; with `uninit_bg`
//! (gdt_csum) only a crc16 over each descriptor.

use ext4kit_format::checksum::{crc32c, fs_csum_seed, inode_csum_seed};
use ext4kit_format::features::{incompat, ro_compat};
use ext4kit_format::group_desc::GdCsum;

use crate::features::Features;

/// The checksum kinds and seeds of the filesystem being made.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checksums {
    metadata: bool,
    crc16_descriptors: bool,
    checksum_seed: u32,
    fs_seed: u32,
    uuid: [u8; 16],
}

impl Checksums {
    /// `s_checksum_seed` is `crc32c(~0, s_uuid)` when `metadata_csum_seed`
    /// is set (so the UUID can change later without rewriting checksums),
    /// else 0; the seed every checksum starts from is that, or the same
    /// crc of the UUID computed on the fly (`ext4_fill_super`).
    pub(crate) fn new(f: &Features, uuid: [u8; 16]) -> Self {
        let checksum_seed = if f.has_incompat(incompat::CSUM_SEED) {
            crc32c(!0, &uuid)
        } else {
            0
        };
        Checksums {
            metadata: f.has_ro(ro_compat::METADATA_CSUM),
            crc16_descriptors: f.has_ro(ro_compat::GDT_CSUM),
            checksum_seed,
            fs_seed: fs_csum_seed(&uuid, f.has_incompat(incompat::CSUM_SEED), checksum_seed),
            uuid,
        }
    }

    /// `metadata_csum`: every metadata block carries a crc32c.
    pub(crate) fn metadata(&self) -> bool {
        self.metadata
    }

    /// Descriptors carry a checksum of either kind, which is what lets a
    /// group be `BLOCK_UNINIT` / `INODE_UNINIT` and count
    /// `bg_itable_unused` (`ext2fs_has_group_desc_csum`).
    pub(crate) fn descriptors(&self) -> bool {
        self.metadata || self.crc16_descriptors
    }

    /// How `bg_checksum` is computed.
    pub(crate) fn descriptor_kind(&self) -> GdCsum {
        if self.metadata {
            GdCsum::Crc32c { seed: self.fs_seed }
        } else if self.crc16_descriptors {
            GdCsum::Crc16 { uuid: self.uuid }
        } else {
            GdCsum::None
        }
    }

    /// `s_checksum_seed` as stored (0 without `metadata_csum_seed`).
    pub(crate) fn checksum_seed(&self) -> u32 {
        self.checksum_seed
    }

    /// The filesystem-wide crc32c seed (bitmaps, descriptors, inodes).
    pub(crate) fn fs_seed(&self) -> u32 {
        self.fs_seed
    }

    /// The per-inode seed (`ext4_inode_csum_seed`, generation 0) of the
    /// blocks inode `ino` owns, with `metadata_csum`.
    pub(crate) fn inode_seed(&self, ino: u32) -> Option<u32> {
        self.metadata.then(|| inode_csum_seed(self.fs_seed, ino, 0))
    }

    /// The (inode number, fs seed) an inode record's checksum needs, with
    /// `metadata_csum`.
    pub(crate) fn inode_record(&self, ino: u32) -> Option<(u32, u32)> {
        self.metadata.then_some((ino, self.fs_seed))
    }
}
