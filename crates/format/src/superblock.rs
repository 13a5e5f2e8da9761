//! The superblock: 1024 bytes at byte offset 1024 of the image (and backup
//! copies at the start of some groups).
//!
//! Every field of `struct ext4_super_block` is here, reserved space included,
//! so a parsed superblock serialises back bit-exactly. `parse` validates what
//! the rest of the engine relies on (magic, block size, group geometry,
//! descriptor size, checksum); callers may trust those fields afterwards.

use crate::checksum::{crc32c, fs_csum_seed};
use crate::error::{corrupt, FormatError, Result};
use crate::features::{compat, incompat, ro_compat};

/// Byte offset of the primary superblock within the image.
pub const SUPERBLOCK_OFFSET: u64 = 1024;
/// `s_magic`.
pub const EXT4_MAGIC: u16 = 0xEF53;
/// `s_state` bit: cleanly unmounted.
pub const STATE_VALID: u16 = 0x1;
/// `s_state` bit: errors detected.
pub const STATE_ERROR: u16 = 0x2;
/// `s_state` bit: orphans being recovered.
pub const STATE_ORPHAN: u16 = 0x4;
/// `s_flags`: directory hashes use signed chars.
pub const FLAGS_SIGNED_HASH: u32 = 0x1;
/// `s_flags`: directory hashes use unsigned chars.
pub const FLAGS_UNSIGNED_HASH: u32 = 0x2;
/// `s_checksum_type` for crc32c.
pub const CHECKSUM_TYPE_CRC32C: u8 = 1;

crate::layout! {
    /// `struct ext4_super_block`, field for field.
    pub struct Superblock (1024) {
        inodes_count: u32 = 0x0,
        blocks_count_lo: u32 = 0x4,
        r_blocks_count_lo: u32 = 0x8,
        free_blocks_count_lo: u32 = 0xC,
        free_inodes_count: u32 = 0x10,
        first_data_block: u32 = 0x14,
        log_block_size: u32 = 0x18,
        log_cluster_size: u32 = 0x1C,
        blocks_per_group: u32 = 0x20,
        clusters_per_group: u32 = 0x24,
        inodes_per_group: u32 = 0x28,
        mtime: u32 = 0x2C,
        wtime: u32 = 0x30,
        mnt_count: u16 = 0x34,
        max_mnt_count: u16 = 0x36,
        magic: u16 = 0x38,
        state: u16 = 0x3A,
        errors: u16 = 0x3C,
        minor_rev_level: u16 = 0x3E,
        lastcheck: u32 = 0x40,
        checkinterval: u32 = 0x44,
        creator_os: u32 = 0x48,
        rev_level: u32 = 0x4C,
        def_resuid: u16 = 0x50,
        def_resgid: u16 = 0x52,
        first_ino: u32 = 0x54,
        inode_size: u16 = 0x58,
        block_group_nr: u16 = 0x5A,
        feature_compat: u32 = 0x5C,
        feature_incompat: u32 = 0x60,
        feature_ro_compat: u32 = 0x64,
        uuid: [u8; 16] = 0x68,
        volume_name: [u8; 16] = 0x78,
        last_mounted: [u8; 64] = 0x88,
        algorithm_usage_bitmap: u32 = 0xC8,
        prealloc_blocks: u8 = 0xCC,
        prealloc_dir_blocks: u8 = 0xCD,
        reserved_gdt_blocks: u16 = 0xCE,
        journal_uuid: [u8; 16] = 0xD0,
        journal_inum: u32 = 0xE0,
        journal_dev: u32 = 0xE4,
        last_orphan: u32 = 0xE8,
        hash_seed: [u32; 4] = 0xEC,
        def_hash_version: u8 = 0xFC,
        jnl_backup_type: u8 = 0xFD,
        desc_size: u16 = 0xFE,
        default_mount_opts: u32 = 0x100,
        first_meta_bg: u32 = 0x104,
        mkfs_time: u32 = 0x108,
        jnl_blocks: [u32; 17] = 0x10C,
        blocks_count_hi: u32 = 0x150,
        r_blocks_count_hi: u32 = 0x154,
        free_blocks_count_hi: u32 = 0x158,
        min_extra_isize: u16 = 0x15C,
        want_extra_isize: u16 = 0x15E,
        flags: u32 = 0x160,
        raid_stride: u16 = 0x164,
        mmp_interval: u16 = 0x166,
        mmp_block: u64 = 0x168,
        raid_stripe_width: u32 = 0x170,
        log_groups_per_flex: u8 = 0x174,
        checksum_type: u8 = 0x175,
        encryption_level: u8 = 0x176,
        reserved_pad: u8 = 0x177,
        kbytes_written: u64 = 0x178,
        snapshot_inum: u32 = 0x180,
        snapshot_id: u32 = 0x184,
        snapshot_r_blocks_count: u64 = 0x188,
        snapshot_list: u32 = 0x190,
        error_count: u32 = 0x194,
        first_error_time: u32 = 0x198,
        first_error_ino: u32 = 0x19C,
        first_error_block: u64 = 0x1A0,
        first_error_func: [u8; 32] = 0x1A8,
        first_error_line: u32 = 0x1C8,
        last_error_time: u32 = 0x1CC,
        last_error_ino: u32 = 0x1D0,
        last_error_line: u32 = 0x1D4,
        last_error_block: u64 = 0x1D8,
        last_error_func: [u8; 32] = 0x1E0,
        mount_opts: [u8; 64] = 0x200,
        usr_quota_inum: u32 = 0x240,
        grp_quota_inum: u32 = 0x244,
        overhead_clusters: u32 = 0x248,
        backup_bgs: [u32; 2] = 0x24C,
        encrypt_algos: [u8; 4] = 0x254,
        encrypt_pw_salt: [u8; 16] = 0x258,
        lpf_ino: u32 = 0x268,
        prj_quota_inum: u32 = 0x26C,
        checksum_seed: u32 = 0x270,
        wtime_hi: u8 = 0x274,
        mtime_hi: u8 = 0x275,
        mkfs_time_hi: u8 = 0x276,
        lastcheck_hi: u8 = 0x277,
        first_error_time_hi: u8 = 0x278,
        last_error_time_hi: u8 = 0x279,
        first_error_errcode: u8 = 0x27A,
        last_error_errcode: u8 = 0x27B,
        encoding: u16 = 0x27C,
        encoding_flags: u16 = 0x27E,
        orphan_file_inum: u32 = 0x280,
        reserved: [u32; 94] = 0x284,
        checksum: u32 = 0x3FC,
    }
    split {
        /// Total blocks; `bit64` is the 64bit feature, without which the
        /// high word is not part of the count (the getter is
        /// [`Superblock::blocks_count`], which reads the feature itself).
        set_blocks_count: u64 = blocks_count_lo + blocks_count_hi if bit64,
        /// Blocks reserved for root; `bit64` as for `set_blocks_count`.
        set_r_blocks_count: u64 = r_blocks_count_lo + r_blocks_count_hi if bit64,
        /// Free blocks; `bit64` as for `set_blocks_count`.
        set_free_blocks_count: u64 = free_blocks_count_lo + free_blocks_count_hi if bit64,
        /// Last mount time, seconds since the epoch (`s_mtime`, `s_mtime_hi`).
        mtime / set_mtime: i64 = mtime + mtime_hi,
        /// Last write time, seconds since the epoch (`s_wtime`, `s_wtime_hi`).
        wtime / set_wtime: i64 = wtime + wtime_hi,
        /// Creation time, seconds since the epoch (`s_mkfs_time`, `s_mkfs_time_hi`).
        mkfs_time / set_mkfs_time: i64 = mkfs_time + mkfs_time_hi,
        /// Last check time, seconds since the epoch (`s_lastcheck`, `s_lastcheck_hi`).
        lastcheck / set_lastcheck: i64 = lastcheck + lastcheck_hi,
        /// First recorded error's time (`s_first_error_time`, `_hi`; 0: none).
        first_error_time / set_first_error_time: i64 = first_error_time + first_error_time_hi,
        /// Last recorded error's time (`s_last_error_time`, `_hi`).
        last_error_time / set_last_error_time: i64 = last_error_time + last_error_time_hi,
    }
}

/// Offset of `s_checksum`: the superblock checksum covers the bytes before it.
const CHECKSUM_OFFSET: usize = 0x3FC;

impl Superblock {
    /// Parse and validate a superblock from its 1024 bytes.
    ///
    /// Checks the magic, the checksum (when `metadata_csum` is set), and the
    /// geometry the rest of the engine divides by or indexes with, so that a
    /// hostile image cannot make later arithmetic overflow or divide by zero.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        const S: &str = "superblock";
        if buf.len() < Self::SIZE {
            return Err(corrupt(S, format!("only {} bytes", buf.len())));
        }
        let sb = Self::parse_raw(buf);
        if sb.magic != EXT4_MAGIC {
            return Err(corrupt(S, format!("bad magic {:#06x} (want 0xef53)", sb.magic)));
        }
        if sb.has_ro_compat(ro_compat::METADATA_CSUM) {
            if sb.checksum_type != CHECKSUM_TYPE_CRC32C {
                return Err(corrupt(S, format!("unknown checksum type {}", sb.checksum_type)));
            }
            let computed = Self::compute_checksum(buf);
            if computed != sb.checksum {
                return Err(FormatError::Checksum {
                    structure: S,
                    stored: sb.checksum,
                    computed,
                });
            }
        }
        if sb.log_block_size > 6 {
            return Err(corrupt(
                S,
                format!("block size 2^(10+{}) out of range", sb.log_block_size),
            ));
        }
        let bs = sb.block_size();
        if sb.blocks_per_group == 0 || sb.blocks_per_group as u64 > 8 * bs as u64 {
            return Err(corrupt(S, format!("blocks_per_group {} invalid", sb.blocks_per_group)));
        }
        if sb.inodes_per_group == 0 || sb.inodes_per_group as u64 > 8 * bs as u64 {
            return Err(corrupt(S, format!("inodes_per_group {} invalid", sb.inodes_per_group)));
        }
        let isz = sb.inode_size() as u32;
        if isz < 128 || !isz.is_power_of_two() || isz > bs {
            return Err(corrupt(S, format!("inode size {isz} invalid")));
        }
        if sb.has_incompat(incompat::BIT64) {
            let d = sb.desc_size as u32;
            if !(64..=1024).contains(&d) || !d.is_power_of_two() {
                return Err(corrupt(S, format!("descriptor size {d} invalid")));
            }
        }
        let blocks = sb.blocks_count();
        if blocks == 0 || (sb.first_data_block as u64) >= blocks {
            return Err(corrupt(S, format!("blocks_count {blocks} invalid")));
        }
        if bs == 1024 && sb.first_data_block != 1 || bs > 1024 && sb.first_data_block != 0 {
            return Err(corrupt(
                S,
                format!("first_data_block {} wrong for {bs}-byte blocks", sb.first_data_block),
            ));
        }
        let groups = sb.group_count();
        if (sb.inodes_count as u64) > groups * sb.inodes_per_group as u64 {
            return Err(corrupt(
                S,
                format!("inodes_count {} exceeds groups * inodes_per_group", sb.inodes_count),
            ));
        }
        if sb.rev_level >= 1 && (sb.first_ino < 11 || sb.first_ino > sb.inodes_count) {
            return Err(corrupt(S, format!("first_ino {} invalid", sb.first_ino)));
        }
        Ok(sb)
    }

    /// crc32c of the bytes before `s_checksum`, seeded with ~0.
    pub fn compute_checksum(buf: &[u8]) -> u32 {
        crc32c(!0, &buf[..CHECKSUM_OFFSET])
    }

    /// Serialise, refreshing `s_checksum` when `metadata_csum` is set.
    pub fn to_bytes_with_checksum(&self) -> Vec<u8> {
        let mut v = self.to_bytes();
        if self.has_ro_compat(ro_compat::METADATA_CSUM) {
            let c = Self::compute_checksum(&v);
            v[CHECKSUM_OFFSET..].copy_from_slice(&c.to_le_bytes());
        }
        v
    }

    /// Block size in bytes (1 KiB .. 64 KiB).
    pub fn block_size(&self) -> u32 {
        1024u32 << self.log_block_size.min(6)
    }

    /// Total blocks, combining the `_hi` word when the image is 64bit.
    pub fn blocks_count(&self) -> u64 {
        self.lo_hi(self.blocks_count_lo, self.blocks_count_hi)
    }

    /// Blocks reserved for root.
    pub fn r_blocks_count(&self) -> u64 {
        self.lo_hi(self.r_blocks_count_lo, self.r_blocks_count_hi)
    }

    /// Free blocks as recorded in the superblock.
    pub fn free_blocks_count(&self) -> u64 {
        self.lo_hi(self.free_blocks_count_lo, self.free_blocks_count_hi)
    }

    fn lo_hi(&self, lo: u32, hi: u32) -> u64 {
        let hi = if self.has_incompat(incompat::BIT64) { hi } else { 0 };
        crate::bytes::join(lo, hi)
    }

    /// Number of block groups.
    pub fn group_count(&self) -> u64 {
        let data = self.blocks_count().saturating_sub(self.first_data_block as u64);
        data.div_ceil(self.blocks_per_group.max(1) as u64)
    }

    /// On-disk inode record size (128 for revision 0).
    pub fn inode_size(&self) -> u16 {
        if self.rev_level == 0 {
            128
        } else {
            self.inode_size
        }
    }

    /// First non-reserved inode number.
    pub fn first_ino(&self) -> u32 {
        if self.rev_level == 0 {
            11
        } else {
            self.first_ino
        }
    }

    /// Group descriptor size: `s_desc_size` on 64bit images, else 32.
    pub fn desc_size(&self) -> usize {
        if self.has_incompat(incompat::BIT64) {
            self.desc_size as usize
        } else {
            32
        }
    }

    /// Whether a COMPAT feature is set.
    pub fn has_compat(&self, f: u32) -> bool {
        self.feature_compat & f != 0
    }

    /// Whether an INCOMPAT feature is set.
    pub fn has_incompat(&self, f: u32) -> bool {
        self.feature_incompat & f != 0
    }

    /// Whether a RO_COMPAT feature is set.
    pub fn has_ro_compat(&self, f: u32) -> bool {
        self.feature_ro_compat & f != 0
    }

    /// Whether metadata blocks carry crc32c checksums.
    pub fn metadata_csum(&self) -> bool {
        self.has_ro_compat(ro_compat::METADATA_CSUM)
    }

    /// Whether group descriptors carry crc16 checksums (`uninit_bg`).
    pub fn gdt_csum(&self) -> bool {
        !self.metadata_csum() && self.has_ro_compat(ro_compat::GDT_CSUM)
    }

    /// Seed for every metadata checksum on this filesystem.
    pub fn csum_seed(&self) -> u32 {
        fs_csum_seed(&self.uuid, self.has_incompat(incompat::CSUM_SEED), self.checksum_seed)
    }

    /// Whether the directory hash treats name bytes as unsigned chars.
    pub fn unsigned_hash(&self) -> bool {
        self.flags & FLAGS_UNSIGNED_HASH != 0
    }

    /// Whether `dir_index` is on (htree directories may exist).
    pub fn dir_index(&self) -> bool {
        self.has_compat(compat::DIR_INDEX)
    }

    /// Volume label as text (trailing NULs removed).
    pub fn label(&self) -> String {
        let end = self.volume_name.iter().position(|&b| b == 0).unwrap_or(16);
        String::from_utf8_lossy(&self.volume_name[..end]).into_owned()
    }

    /// Whether `block_group` holds a superblock backup (sparse_super rule:
    /// groups 0, 1 and powers of 3, 5 and 7; sparse_super2: the two listed).
    pub fn group_has_super(&self, group: u64) -> bool {
        if group == 0 {
            return true;
        }
        if self.has_compat(compat::SPARSE_SUPER2) {
            return group == self.backup_bgs[0] as u64 || group == self.backup_bgs[1] as u64;
        }
        if group <= 1 || !self.has_ro_compat(ro_compat::SPARSE_SUPER) {
            return true;
        }
        if group & 1 == 0 {
            return false;
        }
        fn is_power(mut n: u64, b: u64) -> bool {
            while n.is_multiple_of(b) && n > 1 {
                n /= b;
            }
            n == 1
        }
        is_power(group, 3) || is_power(group, 5) || is_power(group, 7)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_complete() {
        Superblock::layout_covers_every_byte();
    }

    proptest! {
        #[test]
        fn roundtrip_is_bit_exact(bytes in proptest::collection::vec(any::<u8>(), 1024)) {
            let sb = Superblock::parse_raw(&bytes);
            prop_assert_eq!(sb.to_bytes(), bytes);
        }
    }

    #[test]
    fn sparse_super_groups() {
        let mut b = vec![0u8; 1024];
        b[0x64] = ro_compat::SPARSE_SUPER as u8;
        let sb = Superblock::parse_raw(&b);
        let with: Vec<u64> = (0..60).filter(|&g| sb.group_has_super(g)).collect();
        assert_eq!(with, vec![0, 1, 3, 5, 7, 9, 25, 27, 49]);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let b = vec![0xffu8; 1024];
        assert!(Superblock::parse(&b).is_err());
        assert!(Superblock::parse(&b[..10]).is_err());
    }
}
