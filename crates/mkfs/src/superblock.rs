//! The superblock's fields, as `ext2fs_initialize` and mke2fs set them
//! (`s_kbytes_written` and each copy's `s_block_group_nr` and state are
//! set when the copies are written).

use ext4kit_format::features::incompat;
use ext4kit_format::superblock::{Superblock, CHECKSUM_TYPE_CRC32C, EXT4_MAGIC, FLAGS_SIGNED_HASH, STATE_VALID};

use crate::inode::{self, FIRST_INO, JOURNAL_INO};
use crate::layout::LOG_GROUPS_PER_FLEX;
use crate::plan::Plan;

/// `s_default_mount_opts`: `user_xattr,acl` (mke2fs.conf `default_mntopts`).
const DEFAULT_MOUNT_OPTS: u32 = 0x0004 | 0x0008;
/// `s_def_hash_version`: half_md4.
const HASH_HALF_MD4: u8 = 1;
/// `s_jnl_backup_type`: `s_jnl_blocks` holds a copy of the journal's i_block.
const JNL_BACKUP_BLOCKS: u8 = 1;
/// `s_errors`: continue (`EXT2_ERRORS_CONTINUE`, the default).
const ERRORS_CONTINUE: u16 = 1;
/// `s_max_mnt_count`: -1, no mount-count check (mke2fs 1.42+).
const NO_MAX_MOUNT_COUNT: u16 = 0xffff;
/// `s_rev_level`: `EXT2_DYNAMIC_REV`.
const DYNAMIC_REV: u32 = 1;

/// What the superblock counts that the plan does not know.
pub(crate) struct SuperblockCounts {
    /// `s_free_blocks_count`, summed over the groups.
    pub(crate) free_blocks: u64,
    /// `s_free_inodes_count`, summed over the groups.
    pub(crate) free_inodes: u64,
    /// `s_overhead_clusters`: the layout's metadata plus the journal.
    pub(crate) overhead: u64,
    /// `s_jnl_blocks`, with a journal.
    pub(crate) journal_backup: Option<[u32; 17]>,
}

/// The primary superblock, `s_kbytes_written` still 0. The reserved
/// block count is `-m` percent of the blocks, rounded down; every time is
/// the plan's; `s_flags` says the directory hash is signed (x86's
/// `char`), as mke2fs on x86 writes it.
pub(crate) fn build(plan: &Plan, c: &SuperblockCounts) -> Superblock {
    let g = plan.geometry();
    let f = plan.features();
    let id = plan.identity();
    let now = id.now();
    let bs = g.block_size();
    let mut sb = Superblock::parse_raw(&[0u8; 1024]);
    let r_blocks = (g.blocks() as f64 * plan.reserved_percent() / 100.0) as u64;
    sb.inodes_count = (g.inodes_per_group() * g.groups()) as u32;
    // The high words count only with 64bit, which geometry requires past
    // 2^32 - 1 blocks.
    let bit64 = f.has_incompat(incompat::BIT64);
    sb.set_blocks_count(g.blocks(), bit64);
    sb.set_r_blocks_count(r_blocks, bit64);
    sb.set_free_blocks_count(c.free_blocks, bit64);
    sb.free_inodes_count = c.free_inodes as u32;
    sb.first_data_block = g.first_data_block() as u32;
    sb.log_block_size = bs.trailing_zeros() - 10;
    sb.log_cluster_size = sb.log_block_size;
    sb.blocks_per_group = g.blocks_per_group() as u32;
    sb.clusters_per_group = g.blocks_per_group() as u32;
    sb.inodes_per_group = g.inodes_per_group() as u32;
    sb.set_wtime(now);
    sb.max_mnt_count = NO_MAX_MOUNT_COUNT;
    sb.magic = EXT4_MAGIC;
    sb.state = STATE_VALID;
    sb.errors = ERRORS_CONTINUE;
    sb.set_lastcheck(now);
    sb.rev_level = DYNAMIC_REV;
    sb.first_ino = FIRST_INO;
    sb.inode_size = g.inode_size() as u16;
    sb.feature_compat = f.compat();
    sb.feature_incompat = f.incompat();
    sb.feature_ro_compat = f.ro_compat();
    sb.uuid = id.uuid();
    let label = plan.label().as_bytes();
    sb.volume_name[..label.len()].copy_from_slice(label);
    sb.reserved_gdt_blocks = g.reserved_gdt_blocks() as u16;
    if let Some(b) = c.journal_backup {
        sb.journal_inum = JOURNAL_INO;
        sb.jnl_blocks = b;
        sb.jnl_backup_type = JNL_BACKUP_BLOCKS;
    }
    let seed = id.hash_seed();
    for (i, v) in sb.hash_seed.iter_mut().enumerate() {
        *v = u32::from_le_bytes([seed[4 * i], seed[4 * i + 1], seed[4 * i + 2], seed[4 * i + 3]]);
    }
    sb.def_hash_version = HASH_HALF_MD4;
    if f.has_incompat(incompat::BIT64) {
        sb.desc_size = g.desc_size() as u16;
    }
    sb.default_mount_opts = DEFAULT_MOUNT_OPTS;
    sb.set_mkfs_time(now);
    if inode::is_large(g.inode_size()) {
        sb.min_extra_isize = 32;
        sb.want_extra_isize = 32;
    }
    sb.flags = FLAGS_SIGNED_HASH;
    if f.has_incompat(incompat::FLEX_BG) {
        sb.log_groups_per_flex = LOG_GROUPS_PER_FLEX;
    }
    if plan.checksums().metadata() {
        sb.checksum_type = CHECKSUM_TYPE_CRC32C;
    }
    sb.checksum_seed = plan.checksums().checksum_seed();
    sb.overhead_clusters = c.overhead as u32;
    sb
}
