//! The geometry step (`ext2fs_initialize`): block size, groups, inodes per
//! group and inode table size, descriptor and reserved-GDT blocks — every
//! size that follows from the device size and the options, before any
//! block is placed. Also the journal's size rule, a function of the block
//! count alone.
//!
//! - Block size 1 KiB below 512 MiB, else 4 KiB (or as asked);
//!   `blocks_per_group = min(8 * block_size, 65528)`.
//! - Inode ratio 8192 below 3 MiB ("floppy"), 4096 below 512 MiB
//!   ("small"), 16384 up to 4 TiB, then 32768 / 65536 ("big" / "huge"),
//!   never below the block size. The inode table of a group fills whole
//!   blocks and `inodes_per_group` is a multiple of 8.
//! - The size is first rounded down to whole 4 KiB pages, as mke2fs rounds
//!   a device's size; a partial last group too small to hold its own
//!   metadata plus 50 blocks is dropped (the filesystem is shortened).

use ext4kit_format::features::{compat, incompat, ro_compat};

use crate::error::{MkfsError, Result};
use crate::features::Features;
use crate::inode::FIRST_INO;
use crate::options::MkfsOptions;

/// `EXT2_MAX_BLOCKS_PER_GROUP` (bigalloc aside).
const MAX_BLOCKS_PER_GROUP: u64 = 65528;
const MIB: u64 = 1 << 20;

/// The sizes of the filesystem being made. All counts are in blocks of
/// `block_size` unless named otherwise.
#[derive(Debug, Clone)]
pub(crate) struct Geometry {
    bs: u64,
    blocks: u64,
    fdb: u64,
    bpg: u64,
    groups: u64,
    ipg: u64,
    itb: u64,
    isz: u64,
    desc_size: u64,
    desc_blocks: u64,
    rsv_gdt: u64,
    sparse_super: bool,
}

impl Geometry {
    /// The geometry step. May drop `resize_inode` from `f` (it cannot
    /// describe a filesystem past 2^32 blocks) and shorten the filesystem
    /// by a too-small last group; each is recorded in `notes`.
    pub(crate) fn compute(
        size_bytes: u64,
        f: &mut Features,
        opts: &MkfsOptions,
        notes: &mut Vec<String>,
    ) -> Result<Geometry> {
        let bs = block_size(size_bytes, opts.block_size)?;
        let isz = opts.inode_size as u64;
        if isz < 128 || isz > bs || !isz.is_power_of_two() {
            return Err(MkfsError::invalid(format!(
                "inode size {isz} invalid (128..{bs}, a power of two)"
            )));
        }
        // Whole 4 KiB pages only, as mke2fs does with a device's size.
        let mut blocks = (size_bytes & !4095) / bs;
        if blocks > 0xffff_ffff && !f.has_incompat(incompat::BIT64) {
            return Err(MkfsError::invalid(format!(
                "{blocks} blocks need the 64bit feature (at most 2^32 - 1 without it)"
            )));
        }
        if blocks >= 1u64 << 48 {
            return Err(MkfsError::invalid(format!(
                "{blocks} blocks is more than ext4 can address"
            )));
        }
        if blocks > 0xffff_ffff && f.has_compat(compat::RESIZE_INODE) {
            f.clear_compat(compat::RESIZE_INODE);
            notes.push("resize_inode dropped: it cannot describe a filesystem past 2^32 blocks".into());
        }
        let fdb = u64::from(bs == 1024);
        let bpg = (8 * bs).min(MAX_BLOCKS_PER_GROUP);
        let ratio = inode_ratio(size_bytes).max(bs);
        let desc_size = if f.has_incompat(incompat::BIT64) { 64 } else { 32 };
        loop {
            if blocks <= fdb + 1 {
                return Err(MkfsError::invalid(format!(
                    "{size_bytes} bytes is too small for a filesystem"
                )));
            }
            let groups = (blocks - fdb).div_ceil(bpg);
            let desc_blocks = groups.div_ceil(bs / desc_size);
            let rsv_gdt = if f.has_compat(compat::RESIZE_INODE) {
                calc_reserved_gdt_blocks(&GdtRequest {
                    blocks,
                    first_data_block: fdb,
                    blocks_per_group: bpg,
                    block_size: bs,
                    desc_size,
                    desc_blocks,
                })
            } else {
                0
            };
            let want = match opts.inodes {
                Some(n) => n,
                None => ((blocks as u128 * bs as u128) / ratio as u128).min(u32::MAX as u128) as u64,
            }
            .max(FIRST_INO as u64 + 1);
            let (ipg, itb) = inode_table_size(want, groups, bs, isz);
            if ipg * groups > u32::MAX as u64 {
                return Err(MkfsError::invalid(format!(
                    "{} inodes is more than ext4 can count",
                    ipg * groups
                )));
            }
            let overhead = 3 + itb + desc_blocks + rsv_gdt;
            if overhead > bpg {
                return Err(MkfsError::invalid(format!(
                    "too many inodes: group metadata ({overhead} blocks) exceeds a group ({bpg} blocks)"
                )));
            }
            let rem = (blocks - fdb) % bpg;
            if groups == 1 && rem != 0 && rem < overhead {
                return Err(MkfsError::invalid(format!(
                    "{size_bytes} bytes is too small for a filesystem"
                )));
            }
            if rem != 0 && rem < overhead + 50 && groups > 1 {
                notes.push(format!(
                    "last {rem} blocks dropped: too few for a block group of their own"
                ));
                blocks -= rem;
                continue;
            }
            return Ok(Geometry {
                bs,
                blocks,
                fdb,
                bpg,
                groups,
                ipg,
                itb,
                isz,
                desc_size,
                desc_blocks,
                rsv_gdt,
                sparse_super: f.has_ro(ro_compat::SPARSE_SUPER),
            });
        }
    }

    /// Block size in bytes.
    pub(crate) fn block_size(&self) -> u64 {
        self.bs
    }
    /// `s_blocks_count`.
    pub(crate) fn blocks(&self) -> u64 {
        self.blocks
    }
    /// `s_first_data_block`: 1 with 1 KiB blocks (block 0 is the boot
    /// block), else 0.
    pub(crate) fn first_data_block(&self) -> u64 {
        self.fdb
    }
    /// `s_blocks_per_group`.
    pub(crate) fn blocks_per_group(&self) -> u64 {
        self.bpg
    }
    /// Number of block groups.
    pub(crate) fn groups(&self) -> u64 {
        self.groups
    }
    /// `s_inodes_per_group`.
    pub(crate) fn inodes_per_group(&self) -> u64 {
        self.ipg
    }
    /// Blocks of one group's inode table.
    pub(crate) fn inode_table_blocks(&self) -> u64 {
        self.itb
    }
    /// `s_inode_size`.
    pub(crate) fn inode_size(&self) -> u64 {
        self.isz
    }
    /// `s_desc_size` (64 with `64bit`, else 32).
    pub(crate) fn desc_size(&self) -> u64 {
        self.desc_size
    }
    /// Blocks of one copy of the descriptor table.
    pub(crate) fn desc_blocks(&self) -> u64 {
        self.desc_blocks
    }
    /// `s_reserved_gdt_blocks`.
    pub(crate) fn reserved_gdt_blocks(&self) -> u64 {
        self.rsv_gdt
    }

    /// First block of group `g`.
    pub(crate) fn group_first(&self, g: u64) -> u64 {
        self.fdb + g * self.bpg
    }

    /// Blocks in group `g` (the last may be partial).
    pub(crate) fn blocks_in_group(&self, g: u64) -> u64 {
        (self.blocks - self.group_first(g)).min(self.bpg)
    }

    /// `ext2fs_bg_has_super`: every group without `sparse_super`; with
    /// it, groups 0, 1 and the powers of 3, 5 and 7.
    pub(crate) fn has_super(&self, g: u64) -> bool {
        if g <= 1 || !self.sparse_super {
            return true;
        }
        if g.is_multiple_of(2) {
            return false;
        }
        [3u64, 5, 7].iter().any(|&b| {
            let mut n = g;
            while n.is_multiple_of(b) {
                n /= b;
            }
            n == 1
        })
    }

    /// Blocks at the start of group `g` taken by superblock, descriptors and
    /// reserved descriptors (0 when the group has no backup).
    pub(crate) fn super_area(&self, g: u64) -> u64 {
        if self.has_super(g) {
            1 + self.desc_blocks + self.rsv_gdt
        } else {
            0
        }
    }

    /// The groups holding a superblock copy, in order.
    pub(crate) fn super_groups(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.groups).filter(|&g| self.has_super(g))
    }

    /// The group of inode `ino`.
    pub(crate) fn inode_group(&self, ino: u32) -> usize {
        ((ino - 1) as u64 / self.ipg) as usize
    }

    /// The index of inode `ino` inside its group's table.
    pub(crate) fn inode_index(&self, ino: u32) -> u64 {
        (ino - 1) as u64 % self.ipg
    }
}

/// The block size asked for, or mke2fs.conf's: 1024 below 512 MiB
/// ("small" and "floppy" types), 4096 otherwise; a power of two in
/// 1024..65536.
fn block_size(size_bytes: u64, asked: Option<u32>) -> Result<u64> {
    let bs = match asked {
        Some(b) => b as u64,
        None if size_bytes < 512 * MIB => 1024,
        None => 4096,
    };
    if !(1024..=65536).contains(&bs) || !bs.is_power_of_two() {
        return Err(MkfsError::invalid(format!(
            "block size {bs} invalid (1024..65536, a power of two)"
        )));
    }
    Ok(bs)
}

/// mke2fs.conf's `inode_ratio` by size type: bytes of filesystem per inode.
fn inode_ratio(size_bytes: u64) -> u64 {
    match size_bytes {
        s if s < 3 * MIB => 8192,
        s if s < 512 * MIB => 4096,
        s if s < 4 << 40 => 16384,
        s if s < 16 << 40 => 32768,
        _ => 65536,
    }
}

/// `ext2fs_initialize`'s inode arithmetic: `want` inodes spread over
/// `groups`, at most `8 * block_size` per group (one bitmap block) and
/// below 65536, rounded so the table fills whole blocks and the count is a
/// multiple of 8, and at least enough for the reserved inodes and
/// lost+found (1..=11). Returns (inodes per group, inode table blocks).
fn inode_table_size(want: u64, groups: u64, bs: u64, isz: u64) -> (u64, u64) {
    let inodes_per_block = bs / isz;
    let mut ipg = want.div_ceil(groups).min(8 * bs).min(65536 - inodes_per_block);
    let mut itb = (ipg * isz).div_ceil(bs);
    ipg = (itb * bs / isz) & !7;
    let min_ipg = (FIRST_INO as u64 + 1).div_ceil(groups).next_multiple_of(8);
    if ipg < min_ipg {
        itb = (min_ipg * isz).div_ceil(bs);
        ipg = (itb * bs / isz) & !7;
    }
    ipg = ipg.min(8 * bs);
    itb = (ipg * isz).div_ceil(bs);
    (ipg, itb)
}

/// What [`calc_reserved_gdt_blocks`] needs.
struct GdtRequest {
    blocks: u64,
    first_data_block: u64,
    blocks_per_group: u64,
    block_size: u64,
    desc_size: u64,
    desc_blocks: u64,
}

/// mke2fs's `calc_reserved_gdt_blocks`: enough reserved descriptor blocks
/// to grow to 1024 times the size (capped at 2^32 blocks), at most one
/// indirect block's worth (`block_size / 4`, what the resize inode's
/// double-indirect block can list).
fn calc_reserved_gdt_blocks(r: &GdtRequest) -> u64 {
    let max_blocks: u64 = if r.blocks < 0xffff_ffff / 1024 {
        r.blocks * 1024
    } else {
        0xffff_ffff
    };
    let rsv_groups = (max_blocks - r.first_data_block).div_ceil(r.blocks_per_group);
    let gdpb = r.block_size / r.desc_size;
    let rsv = rsv_groups.div_ceil(gdpb).saturating_sub(r.desc_blocks);
    rsv.min(r.block_size / 4)
}

/// `ext2fs_default_journal_size`: journal blocks for a filesystem of
/// `blocks` blocks, or `None` when it is too small for one.
pub fn default_journal_blocks(blocks: u64) -> Option<u32> {
    Some(match blocks {
        b if b < 2048 => return None,
        b if b < 32768 => 1024,
        b if b < 256 * 1024 => 4096,
        b if b < 512 * 1024 => 8192,
        b if b < 4096 * 1024 => 16384,
        b if b < 8192 * 1024 => 32768,
        b if b < 16384 * 1024 => 65536,
        b if b < 32768 * 1024 => 131072,
        _ => 262144,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::FsType;

    fn gdt(blocks: u64, fdb: u64, bpg: u64, bs: u64, desc_size: u64, desc_blocks: u64) -> u64 {
        calc_reserved_gdt_blocks(&GdtRequest {
            blocks,
            first_data_block: fdb,
            blocks_per_group: bpg,
            block_size: bs,
            desc_size,
            desc_blocks,
        })
    }

    #[test]
    fn journal_size_rule() {
        assert_eq!(default_journal_blocks(1000), None);
        assert_eq!(default_journal_blocks(4096), Some(1024));
        assert_eq!(default_journal_blocks(65536), Some(4096));
        assert_eq!(default_journal_blocks(262144), Some(8192));
    }

    #[test]
    fn reserved_gdt_matches_mke2fs() {
        // Values dumpe2fs reports for mke2fs 1.47 images.
        assert_eq!(gdt(65536, 1, 8192, 1024, 64, 1), 256);
        assert_eq!(gdt(4096, 1, 8192, 1024, 64, 1), 31);
        assert_eq!(gdt(4096, 1, 8192, 1024, 32, 1), 15);
        assert_eq!(gdt(262144, 0, 32768, 4096, 64, 1), 127);
        assert_eq!(gdt(1024, 0, 65528, 65536, 64, 1), 0);
    }

    #[test]
    fn geometry_matches_mke2fs() {
        let mut notes = Vec::new();
        let o = MkfsOptions {
            fs_type: FsType::Ext4,
            ..Default::default()
        };
        let mut f = Features::defaults(FsType::Ext4);
        let g = Geometry::compute(600 * MIB, &mut f, &o, &mut notes).unwrap();
        assert_eq!((g.bs, g.blocks, g.ipg, g.itb, g.rsv_gdt), (4096, 153600, 7680, 480, 74));
        let g = Geometry::compute(2 * MIB, &mut f, &o, &mut notes).unwrap();
        assert_eq!((g.bs, g.blocks, g.ipg, g.itb, g.rsv_gdt), (1024, 2048, 256, 64, 15));
    }
}
