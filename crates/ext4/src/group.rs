//! The block group descriptor table (the kernel's `s_group_desc` and
//! `ext4_group_info`): each group's descriptor behind its own lock, where
//! its bitmaps and inode table are, what the allocators learnt of its
//! bitmaps, and the checksums a descriptor and its bitmaps carry.
//!
//! Locking: each group's descriptor `RwLock` is the group lock. Allocation
//! in a group holds its write lock across reading a bitmap, changing it and
//! updating the descriptor, so allocations in one group are serialised and
//! different groups never contend. Where a group's metadata lies is fixed
//! for the life of the filesystem, so layout questions take no lock; the
//! hints and bitmap states are atomics read without the group lock.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use ext4kit_format::checksum::crc32c;
use ext4kit_format::features::incompat;
use ext4kit_format::group_desc::{GdCsum, GroupDesc};
use ext4kit_format::superblock::Superblock;
use parking_lot::RwLock;

use crate::bitmap::{set_bit, test_bit};
use crate::disk::Disk;
use crate::error::{annotate, Error, Result};
use crate::geometry::Geometry;
use crate::system_zone::SystemZone;

/// [`Group::bitmap_state`]: the block bitmap was checked.
pub const BITMAP_BLOCK_CHECKED: u8 = 1;
/// [`Group::bitmap_state`]: the block bitmap disagrees with the descriptor.
pub const BITMAP_BLOCK_CORRUPT: u8 = 2;
/// [`Group::bitmap_state`]: the inode bitmap was checked.
pub const BITMAP_INODE_CHECKED: u8 = 4;
/// [`Group::bitmap_state`]: the inode bitmap disagrees with the descriptor
/// or marks a live inode free.
pub const BITMAP_INODE_CORRUPT: u8 = 8;

/// One block group's descriptor, behind its own lock (per-group locking:
/// allocation in different groups never contends).
#[derive(Debug)]
pub struct Group {
    /// The descriptor as last read or written. Its write lock is the group
    /// lock: allocation in the group holds it while changing bitmaps.
    desc: RwLock<GroupDesc>,
    /// Block of the primary descriptor table that holds this descriptor.
    desc_block: u64,
    /// Byte offset of the descriptor in that block.
    desc_offset: usize,
    /// Where the group's block bitmap, inode bitmap and inode table are.
    /// Fixed for the life of the filesystem (only an offline resize moves
    /// them), so layout questions never take any group lock — which is
    /// what lets one group's allocator ask about every other group's
    /// metadata while holding its own lock without a lock-order deadlock.
    meta: (u64, u64, u64),
    /// No inode of the group below this index is free: the inode allocator
    /// starts its bitmap scan here instead of at bit 0. With 32,768 inodes
    /// in a group a scan from 0 reads up to 4 KiB of bitmap per create, a
    /// cost that grows as the group fills (a create storm's per-create
    /// cost grew with the group's fill). Read and written only under
    /// `desc`'s write lock; an atomic so the struct needs no second lock. A
    /// hint, never trusted for correctness: a scan that finds nothing above
    /// it rescans from the start.
    inode_hint: AtomicU32,
    /// What the allocators learnt of this group's bitmaps (`BITMAP_*`
    /// bits): checked once per open against the descriptor's free counts,
    /// and found inconsistent — the kernel's
    /// `EXT4_GROUP_INFO_BBITMAP_CORRUPT` / `IBITMAP_CORRUPT`, after which
    /// nothing is allocated from the group until e2fsck has repaired it.
    bitmap_state: AtomicU8,
}

impl Group {
    /// The descriptor; its write lock is the group lock.
    #[inline]
    pub fn desc(&self) -> &RwLock<GroupDesc> {
        &self.desc
    }

    /// Block of the primary descriptor table that holds this descriptor.
    #[inline]
    pub fn desc_block(&self) -> u64 {
        self.desc_block
    }

    /// Byte offset of the descriptor in [`Self::desc_block`].
    #[inline]
    pub fn desc_offset(&self) -> usize {
        self.desc_offset
    }

    /// Block bitmap, inode bitmap and inode table locations (fixed while
    /// open; no lock).
    #[inline]
    pub fn meta(&self) -> (u64, u64, u64) {
        self.meta
    }

    /// Where the group's block bitmap is.
    #[inline]
    pub fn block_bitmap(&self) -> u64 {
        self.meta.0
    }

    /// Where the group's inode bitmap is.
    #[inline]
    pub fn inode_bitmap(&self) -> u64 {
        self.meta.1
    }

    /// Where the group's inode table starts.
    #[inline]
    pub fn inode_table(&self) -> u64 {
        self.meta.2
    }

    /// The first inode index that may be free (see the field's doc).
    #[inline]
    pub fn inode_hint(&self) -> &AtomicU32 {
        &self.inode_hint
    }

    /// What the allocators learnt of the bitmaps (`BITMAP_*` bits).
    #[inline]
    pub fn bitmap_state(&self) -> &AtomicU8 {
        &self.bitmap_state
    }
}

/// The group descriptor table (see the module doc).
#[derive(Debug)]
pub struct GroupTable {
    groups: Vec<Group>,
    csum: GdCsum,
    desc_size: usize,
    csum_seed: Option<u32>,
    inode_bitmap_bytes: usize,
    block_bitmap_bytes: usize,
    /// Where file inodes went last when their parent's group was full
    /// (the search for the next one starts there; see `ialloc::new_inode`).
    inode_overflow: AtomicU32,
}

impl GroupTable {
    /// Read the primary descriptor table of the filesystem `sb` describes,
    /// checking each descriptor's checksum and that its bitmaps and inode
    /// table lie inside the filesystem.
    pub fn load(disk: &Disk, geo: &Geometry, sb: &Superblock) -> Result<GroupTable> {
        let ngroups = geo.group_count();
        let dsz = geo.desc_size();
        let per_block = geo.block_size() / dsz;
        let csum = if let Some(seed) = geo.csum_seed() {
            GdCsum::Crc32c { seed }
        } else if sb.gdt_csum() {
            GdCsum::Crc16 { uuid: sb.uuid }
        } else {
            GdCsum::None
        };
        let meta_bg = geo.has_incompat(ext4kit_format::features::incompat::META_BG);
        let first_meta_bg = sb.first_meta_bg as u64;
        let nblocks = (ngroups as usize).div_ceil(per_block);
        let mut out = Vec::with_capacity(ngroups as usize);
        let mut buf = vec![0u8; geo.block_size()];
        for b in 0..nblocks as u64 {
            let blk = if meta_bg && b >= first_meta_bg {
                let g = b * per_block as u64;
                geo.group_first_block(g) + u64::from(sb.group_has_super(g))
            } else {
                geo.first_data_block() + 1 + b
            };
            disk.read_raw(blk, &mut buf)
                .map_err(|e| annotate(e, &format!("group descriptor block {blk}")))?;
            for i in 0..per_block {
                let g = b as usize * per_block + i;
                if g >= ngroups as usize {
                    break;
                }
                let raw = &buf[i * dsz..(i + 1) * dsz];
                let gd = GroupDesc::parse(raw, dsz, g as u32, csum)
                    .map_err(|e| Error::corrupt(format!("group descriptor {g} (block {blk})"), e))?;
                for (what, at) in [
                    ("block bitmap", gd.block_bitmap()),
                    ("inode bitmap", gd.inode_bitmap()),
                    ("inode table", gd.inode_table()),
                ] {
                    if at >= geo.blocks_count() || at < geo.first_data_block() {
                        return Err(Error::corrupt_msg(
                            format!("group descriptor {g}"),
                            "group descriptor",
                            format!("{what} at block {at} is outside the filesystem"),
                        ));
                    }
                }
                let meta = (gd.block_bitmap(), gd.inode_bitmap(), gd.inode_table());
                out.push(Group {
                    desc: RwLock::new(gd),
                    desc_block: blk,
                    desc_offset: i * dsz,
                    meta,
                    inode_hint: AtomicU32::new(0),
                    bitmap_state: AtomicU8::new(0),
                });
            }
        }
        Ok(GroupTable {
            groups: out,
            csum,
            desc_size: dsz,
            csum_seed: geo.csum_seed(),
            inode_bitmap_bytes: (geo.inodes_per_group() as usize).div_ceil(8),
            block_bitmap_bytes: (geo.blocks_per_group() as usize).div_ceil(8),
            inode_overflow: AtomicU32::new(0),
        })
    }

    /// Number of groups.
    #[inline]
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Whether there are no groups (never, on an open filesystem).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Group `g`, if there is one.
    #[inline]
    pub fn get(&self, g: usize) -> Option<&Group> {
        self.groups.get(g)
    }

    /// Every group, in order.
    #[inline]
    pub fn iter(&self) -> std::slice::Iter<'_, Group> {
        self.groups.iter()
    }

    /// Where file inodes went last when their parent's group was full.
    #[inline]
    pub fn inode_overflow(&self) -> &AtomicU32 {
        &self.inode_overflow
    }

    /// How this filesystem checksums its descriptors (fixed at open: the
    /// seed or UUID it uses does not change while the filesystem is open).
    #[inline]
    pub fn gd_csum(&self) -> GdCsum {
        self.csum
    }

    /// Encode descriptor `g` (as `gd`, with its checksum) into `block`, the
    /// contents of its descriptor-table block ([`Group::desc_block`]).
    pub fn encode_desc(&self, g: usize, gd: &GroupDesc, block: &mut [u8]) {
        let off = self.groups[g].desc_offset;
        gd.write_sized_into(&mut block[off..off + self.desc_size], g as u32, self.csum);
    }

    /// Store the checksum of an inode bitmap in its descriptor
    /// (`bg_inode_bitmap_csum`: crc32c over inodes_per_group bits).
    pub fn set_inode_bitmap_csum(&self, gd: &mut GroupDesc, bitmap: &[u8]) {
        if let Some(seed) = self.csum_seed {
            let c = crc32c(seed, &bitmap[..self.inode_bitmap_bytes]);
            gd.set_inode_bitmap_csum(c, self.desc_size >= 64);
        }
    }

    /// The block bitmap uninitialised group `g` (BLOCK_UNINIT) implicitly
    /// has (the kernel's `ext4_init_block_bitmap`): its superblock backup,
    /// descriptor table and reserved GDT blocks when it carries a backup,
    /// any group's bitmaps and inode table placed inside it (flex_bg), and
    /// the padding past its last block.
    pub(crate) fn implied_block_bitmap(&self, g: usize, geo: &Geometry, sb: &Superblock) -> Result<Vec<u8>> {
        let bs = geo.block_size();
        let mut bm = vec![0u8; bs];
        let first = geo.group_first_block(g as u64);
        let n = geo.blocks_in_group(g);
        for i in n as usize..bs * 8 {
            set_bit(&mut bm, i);
        }
        if sb.group_has_super(g as u64) {
            if geo.has_incompat(incompat::META_BG) {
                return Err(Error::Unsupported(format!(
                    "initialising the block bitmap of meta_bg group {g}"
                )));
            }
            let per_block = bs / sb.desc_size();
            let gdt = self.groups.len().div_ceil(per_block) as u64;
            let meta = 1 + gdt + sb.reserved_gdt_blocks as u64;
            // Group 0 with 1 KiB blocks starts at block 1 (the superblock).
            for b in 0..meta.min(n) {
                set_bit(&mut bm, b as usize);
            }
        }
        let itable_blocks = geo.itable_blocks();
        for grp in &self.groups {
            let (bb, ib, it) = grp.meta;
            for (start, len) in [(bb, 1), (ib, 1), (it, itable_blocks)] {
                for b in start..start + len {
                    if b >= first && b < first + n {
                        set_bit(&mut bm, (b - first) as usize);
                    }
                }
            }
        }
        Ok(bm)
    }

    /// Whether group `g`'s block bitmap `bm` may be allocated from: checked
    /// once per open — its free bits must number what the descriptor `gd`
    /// counts (the kernel's `ext4_mb_generate_buddy`: "block bitmap and bg
    /// descriptor inconsistent"), and no block of the system zone may be
    /// marked free. A bitmap that lies about a live block (a cleared bit
    /// the count does not know of) would hand that block to a second
    /// owner; such a group is marked corrupt and skipped, as the kernel
    /// skips a group with `BBITMAP_CORRUPT`.
    pub(crate) fn block_bitmap_usable(
        &self,
        g: usize,
        gd: &GroupDesc,
        bm: &[u8],
        geo: &Geometry,
        zone: &SystemZone,
    ) -> bool {
        let st = &self.groups[g].bitmap_state;
        let s = st.load(Ordering::Relaxed);
        if s & BITMAP_BLOCK_CHECKED != 0 {
            return s & BITMAP_BLOCK_CORRUPT == 0;
        }
        let n = geo.blocks_in_group(g) as usize;
        let free = (0..n).filter(|&i| !test_bit(bm, i)).count() as u64;
        let first = geo.group_first_block(g as u64);
        let zone_free =
            (first..first + n as u64).any(|b| !test_bit(bm, (b - first) as usize) && zone.hit(b, b + 1).is_some());
        let ok = free == gd.free_blocks_count() as u64 && !zone_free;
        st.fetch_or(
            BITMAP_BLOCK_CHECKED | if ok { 0 } else { BITMAP_BLOCK_CORRUPT },
            Ordering::Relaxed,
        );
        ok
    }

    /// Whether group `g`'s inode bitmap `bm` may be allocated from: checked
    /// once per open — its free bits must number the descriptor's free
    /// count (a cleared bit the count does not know of is a live inode the
    /// bitmap lies about). The kernel marks such a group
    /// `EXT4_GROUP_INFO_IBITMAP_CORRUPT` and allocates elsewhere.
    pub(crate) fn inode_bitmap_usable(&self, g: usize, gd: &GroupDesc, bm: &[u8], geo: &Geometry) -> bool {
        let st = &self.groups[g].bitmap_state;
        let s = st.load(Ordering::Relaxed);
        if s & BITMAP_INODE_CHECKED != 0 {
            return s & BITMAP_INODE_CORRUPT == 0;
        }
        let ipg = geo.inodes_per_group() as usize;
        let free = (0..ipg).filter(|&i| !test_bit(bm, i)).count() as u64;
        let ok = free == gd.free_inodes_count() as u64;
        st.fetch_or(
            BITMAP_INODE_CHECKED | if ok { 0 } else { BITMAP_INODE_CORRUPT },
            Ordering::Relaxed,
        );
        ok
    }

    /// Store the checksum of a block bitmap in its descriptor
    /// (`bg_block_bitmap_csum`: crc32c over clusters_per_group bits).
    pub fn set_block_bitmap_csum(&self, gd: &mut GroupDesc, bitmap: &[u8]) {
        if let Some(seed) = self.csum_seed {
            let c = crc32c(seed, &bitmap[..self.block_bitmap_bytes]);
            gd.set_block_bitmap_csum(c, self.desc_size >= 64);
        }
    }
}

impl std::ops::Index<usize> for GroupTable {
    type Output = Group;

    #[inline]
    fn index(&self, g: usize) -> &Group {
        &self.groups[g]
    }
}

impl<'a> IntoIterator for &'a GroupTable {
    type Item = &'a Group;
    type IntoIter = std::slice::Iter<'a, Group>;

    fn into_iter(self) -> Self::IntoIter {
        self.groups.iter()
    }
}
