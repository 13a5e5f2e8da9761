//! The opened filesystem (the kernel's `ext4_sb_info` and `super.c`): the
//! device, the superblock, the group descriptor table, geometry derived from
//! them, and the metadata buffer cache.
//!
//! Opening applies the feature rules of DESIGN.md: unknown INCOMPAT refuses,
//! unknown RO_COMPAT forces read-only. A volume whose journal still needs
//! recovery opens read-only: the journal is replayed before this (see
//! `journal.rs`), so the flag is set here only when replay was skipped.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use ext4kit_blockdev::BlockDevice;
use ext4kit_format::features::{self, incompat, OpenMode};
use ext4kit_format::group_desc::{GdCsum, GroupDesc};
use ext4kit_format::superblock::{Superblock, SUPERBLOCK_OFFSET};
use parking_lot::RwLock;

use super::buffer::{Buffer, BufferCache, StripeGuard};
use super::checkpoint::DirtyMeta;
use crate::budget::MemoryBudget;
use crate::disk::Disk;
use crate::error::{Error, Result};
use crate::geometry::Geometry;

/// How to open an image.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Refuse every write (and never touch the device for writing).
    pub read_only: bool,
    /// Memory budget for all caches together, in bytes.
    pub cache_budget: usize,
    /// Skip journal replay (the kernel's `-o noload`): show the home
    /// locations exactly as they are on disk, for a user who wants to see
    /// what a crash left before anything is recovered. Only with
    /// `read_only`; a read-write open of an image whose journal needs
    /// recovery always replays first (writing on top of an unreplayed
    /// journal would let a later replay undo the writes).
    pub no_replay: bool,
    /// Where in the image file (or device) the filesystem lives: the whole
    /// file, one partition of a partitioned disk, or a byte offset.
    pub location: ext4kit_blockdev::Location,
    /// How old the running transaction may get before the background
    /// worker commits it (the kernel's `commit=` mount option; 5 s when
    /// `None`; a zero duration means the default too, as in the kernel).
    /// Everything older than this survives a crash. Ignored without a
    /// journal, and under `SOURCE_DATE_EPOCH` (see `commit.rs`).
    pub commit_interval: Option<std::time::Duration>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read_only: true,
            cache_budget: 256 << 20,
            no_replay: false,
            location: ext4kit_blockdev::Location::Whole,
            commit_interval: None,
        }
    }
}

/// One block group's descriptor, behind its own lock (per-group locking:
/// allocation in different groups never contends).
#[derive(Debug)]
pub struct Group {
    /// The descriptor as last read or written. Its write lock is the group
    /// lock: allocation in the group holds it while changing bitmaps.
    pub desc: RwLock<GroupDesc>,
    /// Block of the primary descriptor table that holds this descriptor.
    pub desc_block: u64,
    /// Byte offset of the descriptor in that block.
    pub desc_offset: usize,
    /// Where the group's block bitmap, inode bitmap and inode table are.
    /// Fixed for the life of the filesystem (only an offline resize moves
    /// them), so layout questions never take any group lock — which is
    /// what lets one group's allocator ask about every other group's
    /// metadata while holding its own lock without a lock-order deadlock.
    pub meta: (u64, u64, u64),
    /// No inode of the group below this index is free: the inode allocator
    /// starts its bitmap scan here instead of at bit 0. With 32,768 inodes
    /// in a group a scan from 0 reads up to 4 KiB of bitmap per create, a
    /// cost that grows as the group fills (the seed-004 create curve).
    /// Read and written only under `desc`'s write lock; an atomic so the
    /// struct needs no second lock. A hint, never trusted for correctness:
    /// a scan that finds nothing above it rescans from the start.
    pub inode_hint: AtomicU32,
    /// What the allocators learnt of this group's bitmaps (`BITMAP_*`
    /// bits): checked once per open against the descriptor's free counts,
    /// and found inconsistent — the kernel's
    /// `EXT4_GROUP_INFO_BBITMAP_CORRUPT` / `IBITMAP_CORRUPT`, after which
    /// nothing is allocated from the group until e2fsck has repaired it.
    pub bitmap_state: std::sync::atomic::AtomicU8,
}

/// [`Group::bitmap_state`]: the block bitmap was checked.
pub const BITMAP_BLOCK_CHECKED: u8 = 1;
/// [`Group::bitmap_state`]: the block bitmap disagrees with the descriptor.
pub const BITMAP_BLOCK_CORRUPT: u8 = 2;
/// [`Group::bitmap_state`]: the inode bitmap was checked.
pub const BITMAP_INODE_CHECKED: u8 = 4;
/// [`Group::bitmap_state`]: the inode bitmap disagrees with the descriptor
/// or marks a live inode free.
pub const BITMAP_INODE_CORRUPT: u8 = 8;

/// Counters for tests and benchmarks.
#[derive(Debug, Default)]
pub struct Stats {
    /// Directory blocks looked at by lookups and readdir (cached or not).
    pub dir_block_reads: AtomicU64,
    /// Inode records read from the device.
    pub inode_reads: AtomicU64,
    /// Inode records written through a handle (seed 003: fdatasync writes none).
    pub inode_writes: AtomicU64,
}

/// The filesystem as the ext4 layer sees it.
pub struct Volume {
    geo: Geometry,
    disk: Disk,
    /// The primary superblock.
    pub sb: RwLock<Superblock>,
    /// Group descriptors.
    pub groups: Vec<Group>,
    /// Things the user should know (read-only because of a feature, journal
    /// needs recovery, ...).
    pub warnings: Vec<String>,
    /// Metadata blocks, with their per-block write locks and drafts.
    pub bcache: BufferCache,
    /// The cache memory shared by buffers and file pages.
    pub budget: Arc<MemoryBudget>,
    /// The orphan chain's links (`orphan.rs`).
    pub orphans: super::orphan::OrphanLinks,
    /// Committed metadata blocks not yet written home (`checkpoint.rs`).
    pub dirty_meta: DirtyMeta,
    /// The journal, when the volume is open for writing and has one
    /// (`commit.rs`): transactions go through its log.
    pub jbd: Option<super::commit::Jbd>,
    /// Where file inodes went last when their parent's group was full
    /// (the search for the next one starts there; see `alloc_inode`).
    pub inode_overflow_group: std::sync::atomic::AtomicU32,
    /// Some handle changed metadata since the open: a sync with nothing
    /// changed writes nothing (a refused command leaves the image as it
    /// was, byte for byte).
    pub metadata_changed: std::sync::atomic::AtomicBool,
    /// Damage met while writing (see `fs_errors.rs`).
    pub fs_errors: crate::fs_errors::FsErrors,
    /// The system zone (see `release_check.rs`), built on first use.
    pub(crate) system_zone: std::sync::OnceLock<Vec<(u64, u64, &'static str)>>,
    /// Blocks claimed twice, or claimed and marked free (see `claims.rs`),
    /// found at the first free.
    pub(crate) claims: crate::claims::Claims,
    /// What the superblock's free counts (blocks, inodes) keep apart from
    /// the groups' sums when a group's count is damaged (see
    /// `Volume::super_bytes`); (0, 0) on a consistent filesystem.
    pub(crate) count_bias: (i64, i64),
    /// Serialises superblock updates (free counts are kept in the groups
    /// and summed when the superblock is written).
    pub sb_lock: parking_lot::Mutex<()>,
    /// Free blocks and delayed-allocation claims (`reserve.rs`).
    pub space: Arc<super::reserve::Space>,
    /// `s_def_resuid` / `s_def_resgid`: besides root, who may use the
    /// root reserve (`ext4_has_free_clusters`).
    pub resuid: u32,
    /// See [`Self::resuid`].
    pub resgid: u32,
    /// Counters.
    pub stats: Stats,
}

impl std::fmt::Debug for Volume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volume")
            .field("block_size", &self.geo.block_size())
            .field("groups", &self.groups.len())
            .finish()
    }
}

impl Volume {
    /// Open the filesystem on `dev`.
    pub fn open(dev: Arc<dyn BlockDevice>, opts: &OpenOptions) -> Result<Volume> {
        let mut raw = vec![0u8; Superblock::SIZE];
        dev.read_at(SUPERBLOCK_OFFSET, &mut raw)
            .map_err(|e| Error::io("reading the superblock (bytes 1024..2048)", e))?;
        let sb = Superblock::parse(&raw).map_err(|e| Error::corrupt("superblock at byte 1024", e))?;
        let mut warnings = Vec::new();
        let mut read_only = opts.read_only || dev.read_only();
        match features::open_mode(sb.feature_compat, sb.feature_incompat, sb.feature_ro_compat) {
            OpenMode::Refuse(names) => {
                return Err(Error::Unsupported(format!(
                    "image uses incompatible feature(s) ext4kit does not implement: {}",
                    names.join(", ")
                )))
            }
            OpenMode::ReadOnly(names) => {
                if !read_only {
                    warnings.push(format!(
                        "opened read-only: unsupported read-only-compatible feature(s) {}",
                        names.join(", ")
                    ));
                }
                read_only = true;
            }
            OpenMode::ReadWrite => {}
        }
        if sb.has_incompat(incompat::RECOVER) {
            // Recovery (`journal::recover`) clears the flag before the
            // volume opens; it is still set only when replay was skipped on
            // purpose (`no_replay`, which already says so) or when a caller
            // opened the volume without recovering. Either way the home
            // locations are stale: never write on top of them.
            if !opts.no_replay {
                warnings.push(
                    "the journal needs recovery and was not replayed: opened read-only; the transactions in the \
                     journal are not visible"
                        .to_string(),
                );
            }
            read_only = true;
        }
        let block_size = sb.block_size() as usize;
        let blocks_count = sb.blocks_count();
        if dev.size() < blocks_count.saturating_mul(block_size as u64) {
            warnings.push(format!(
                "image is {} bytes but the superblock claims {} blocks of {} bytes; reads beyond the end will fail",
                dev.size(),
                blocks_count,
                block_size
            ));
        }
        let ngroups = sb.group_count();
        if ngroups > u32::MAX as u64 || ngroups.saturating_mul(sb.desc_size() as u64) > (1 << 30) {
            return Err(Error::corrupt_msg(
                "superblock",
                "superblock",
                format!("{ngroups} groups is impossible"),
            ));
        }
        let geo = Geometry::from_superblock(&sb);
        let disk = Disk::new(dev, read_only, &geo);
        let budget = Arc::new(MemoryBudget::new(opts.cache_budget, block_size));
        let mut vol = Volume {
            warnings,
            bcache: BufferCache::new(block_size, budget.clone()),
            orphans: Default::default(),
            // Half the buffer cache may wait for a checkpoint. The more
            // blocks wait, the more changes each write carries: a create
            // storm in a directory larger than this (1,000,000 names is
            // ~8,700 leaf blocks, dirtied in hash order) writes about one
            // leaf per create at any threshold below the directory's size,
            // and the threshold sets how many creates share one. More than
            // half would leave too little room for clean blocks (dirty
            // ones are never evicted). Half of the buffer cache's current
            // limit: with file pages idle, that is 96 MiB of a 256 MiB
            // budget, which holds such a directory.
            dirty_meta: DirtyMeta::new(budget.clone(), block_size),
            budget,
            inode_overflow_group: Default::default(),
            system_zone: Default::default(),
            claims: Default::default(),
            count_bias: (0, 0),
            fs_errors: Default::default(),
            metadata_changed: Default::default(),
            geo,
            disk,
            sb_lock: parking_lot::Mutex::new(()),
            stats: Stats::default(),
            groups: Vec::new(),
            jbd: None,
            space: Default::default(),
            resuid: sb.def_resuid as u32,
            resgid: sb.def_resgid as u32,
            sb: RwLock::new(sb),
        };
        vol.groups = vol.load_groups(ngroups as u32)?;
        let free: u64 = vol
            .groups
            .iter()
            .map(|g| g.desc.read().free_blocks_count() as u64)
            .sum();
        let r_blocks = vol.sb.read().r_blocks_count();
        vol.space = Arc::new(super::reserve::Space::new(free, r_blocks));
        if !vol.read_only() {
            vol.count_bias = vol.damaged_count_bias();
        }
        if !vol.read_only() && vol.geo.has_compat(features::compat::HAS_JOURNAL) {
            vol.start_journal()?;
            if let (Some(j), Some(i)) = (vol.jbd.as_mut(), opts.commit_interval.filter(|d| !d.is_zero())) {
                if j.interval.is_some() {
                    j.interval = Some(i);
                }
            }
        }
        Ok(vol)
    }

    /// Open the journal for writing (a read-write volume with
    /// `has_journal`): its log must be empty — recovery ran before the
    /// volume opened. Our journal superblock asks for what the kernel
    /// sets at mount (revoke, 64-bit tags on a 64bit filesystem, checksum
    /// v3 with metadata_csum); nothing is written until the first commit,
    /// so an open that only reads leaves the image's bytes alone.
    /// `needs_recovery` is kept set in the in-memory superblock while the
    /// journal is in use, so every version of the superblock the log or a
    /// checkpoint writes says so (`commit.rs`). A journal we cannot write
    /// (an external one, a version 1 superblock, a corrupt one) leaves the
    /// volume unjournaled, with a warning.
    fn start_journal(&mut self) -> Result<()> {
        use ext4kit_format::jbd2::features as jf;
        let dev = self.disk.device().clone();
        let journal = match super::journal::open_journal(&dev) {
            Ok(j) => j,
            Err(e) => {
                self.warnings.push(format!(
                    "the journal cannot be used for writing ({e}): changes are written without it, as on ext2; \
                     a crash may need e2fsck"
                ));
                return Ok(());
            }
        };
        let mut want = jf::INCOMPAT_REVOKE;
        if self.geo.has_incompat(incompat::BIT64) {
            want |= jf::INCOMPAT_64BIT;
        }
        if self.geo.csum_seed().is_some() {
            want |= jf::INCOMPAT_CSUM_V3;
        }
        match ext4kit_jbd2::Log::start(journal, want) {
            Ok(log) => {
                self.sb.write().feature_incompat |= incompat::RECOVER;
                self.jbd = Some(super::commit::Jbd::new(log));
            }
            Err(e) => self.warnings.push(format!(
                "the journal cannot be used for writing ({e}): changes are written without it, as on ext2; a crash \
                 may need e2fsck"
            )),
        }
        Ok(())
    }

    fn load_groups(&self, ngroups: u32) -> Result<Vec<Group>> {
        let sb = self.sb.read();
        let dsz = sb.desc_size();
        let per_block = self.geo.block_size() / dsz;
        let csum = if let Some(seed) = self.geo.csum_seed() {
            GdCsum::Crc32c { seed }
        } else if sb.gdt_csum() {
            GdCsum::Crc16 { uuid: sb.uuid }
        } else {
            GdCsum::None
        };
        let meta_bg = sb.has_incompat(incompat::META_BG);
        let first_meta_bg = sb.first_meta_bg as u64;
        let nblocks = (ngroups as usize).div_ceil(per_block);
        let mut out = Vec::with_capacity(ngroups as usize);
        let mut buf = vec![0u8; self.geo.block_size()];
        for b in 0..nblocks as u64 {
            let blk = if meta_bg && b >= first_meta_bg {
                let g = b * per_block as u64;
                self.geo.group_first_block(g) + u64::from(sb.group_has_super(g))
            } else {
                self.geo.first_data_block() + 1 + b
            };
            self.disk
                .read_raw(blk, &mut buf)
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
                    if at >= self.geo.blocks_count() || at < self.geo.first_data_block() {
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
                    bitmap_state: std::sync::atomic::AtomicU8::new(0),
                });
            }
        }
        Ok(out)
    }

    /// A metadata block through the buffer cache.
    pub fn buffer(&self, block: u64) -> Result<Arc<Buffer>> {
        self.disk.check_meta_block(block)?;
        self.bcache.get(block, |d| self.disk.read_raw(block, d))
    }

    /// [`Self::buffer`] for a caller holding the block's stripe lock.
    pub fn buffer_locked(&self, g: &mut StripeGuard<'_>, block: u64) -> Result<Arc<Buffer>> {
        self.disk.check_meta_block(block)?;
        self.bcache.get_locked(g, block, |d| self.disk.read_raw(block, d))
    }

    /// The filesystem's sizes, counts and features.
    #[inline]
    pub fn geo(&self) -> &Geometry {
        &self.geo
    }

    /// The device and bounded raw block I/O.
    #[inline]
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// Bytes per block (the value nearly every path needs).
    #[inline]
    pub fn block_size(&self) -> usize {
        self.geo.block_size()
    }

    /// Opened without write access.
    #[inline]
    pub fn read_only(&self) -> bool {
        self.disk.read_only()
    }

    /// Count one directory block access (for the seed 004 assertions).
    pub fn count_dir_block(&self) {
        self.stats.dir_block_reads.fetch_add(1, Ordering::Relaxed);
    }
}

/// Add location context to an error that lacks it.
pub fn annotate(e: Error, what: &str) -> Error {
    match e {
        Error::Io { context, source } => Error::Io {
            context: format!("{context} ({what})"),
            source,
        },
        Error::Corrupt { location, source } => Error::Corrupt {
            location: format!("{location} ({what})"),
            source,
        },
        other => other,
    }
}

/// A fresh 8 MiB ext4 (mkfs defaults, journal included) in memory, opened
/// read-write: the fixture of the ext4 layer's unit tests.
#[cfg(test)]
pub(crate) fn scratch_volume() -> Volume {
    scratch_volume_with(&[])
}

/// [`scratch_volume`] without a journal (`^has_journal`): for tests of
/// the checkpoint's own mechanics, where committed blocks go straight to
/// the checkpoint set.
#[cfg(test)]
pub(crate) fn scratch_volume_unjournaled() -> Volume {
    scratch_volume_with(&["^has_journal"])
}

#[cfg(test)]
fn scratch_volume_with(features: &[&str]) -> Volume {
    let dev = Arc::new(ext4kit_blockdev::MemDevice::new(8 << 20));
    let mk = super::mkfs::MkfsOptions {
        features: features.iter().map(|f| f.to_string()).collect(),
        ..Default::default()
    };
    super::mkfs::mkfs(&*dev, 8 << 20, &mk).expect("mkfs on a memory device");
    let opts = OpenOptions {
        read_only: false,
        cache_budget: 8 << 20,
        ..Default::default()
    };
    Volume::open(dev, &opts).expect("open the fresh volume")
}
