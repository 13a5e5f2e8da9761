//! The opened filesystem (the kernel's `ext4_sb_info` and `super.c`): a
//! composition of the parts that own its state — geometry, device,
//! superblock, group table, buffer cache, reservations, owner map, orphan
//! links, error state, journal, counters — with accessors to them and the
//! few operations that need several at once.
//!
//! Opening applies the feature rules of `write_access.rs`: unknown INCOMPAT
//! refuses, unknown RO_COMPAT and `mmp` force read-only. A volume whose journal still needs
//! recovery opens read-only: the journal is replayed before this (see
//! `journal.rs`), so the flag is set here only when replay was skipped.
//! The journal is started for writing after the open (`journal.rs`'s
//! `open_volume`, which reads the journal inode through the open volume);
//! until then, and on a filesystem without one, handles' blocks go
//! straight to the checkpoint set.
//!
//! The journal is jbd2's ([`ext4kit_jbd2::Jbd`]), over the buffer cache
//! (`journal_io.rs`); the compositions here — `begin`, the commit and
//! checkpoint entry points, `close_journal` — hand it the parts it writes
//! through.
//!
//! Locking: the volume has no lock of its own; each part documents its
//! own. Lock order where several are held: orphan links, then the
//! superblock's update lock, then block (stripe) locks; a group lock is
//! never held across another group's.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use ext4kit_blockdev::BlockDevice;
use ext4kit_format::features::incompat;
use ext4kit_format::group_desc::{GroupDesc, BG_BLOCK_UNINIT, BG_INODE_UNINIT};
use ext4kit_format::superblock::{Superblock, SUPERBLOCK_OFFSET};
use ext4kit_format::time::Clock;

use super::buffer::{Buffer, BufferCache, StripeGuard};
use super::transaction::Handle;
use crate::busy::BusyExtents;
use crate::disk::Disk;
use crate::error::{Errno, Error, Result};
use crate::fs_errors::FsErrors;
use crate::geometry::Geometry;
use crate::group::GroupTable;
use crate::journal_io::{Journal, MetaIo, MetaParts};
use crate::orphan_links::OrphanLinks;
use crate::owners::OwnerMap;
use crate::reservation::Reservations;
use crate::stats::Stats;
use crate::superblock::SuperState;
use crate::system_zone::SystemZone;
use crate::write_access::{self, Access};
use ext4kit_cache::MemoryBudget;

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
    /// journal, and under a fixed clock (see jbd2's `commit.rs`).
    pub commit_interval: Option<std::time::Duration>,
    /// Where every time the filesystem stamps comes from: inode times, the
    /// superblock's mount, write and error times, `i_dtime`, the journal's
    /// commit blocks. The default is the clock `SOURCE_DATE_EPOCH` asks for
    /// ([`Clock::from_source_date_epoch`]; a value that is not a number is
    /// ignored here, the frontends report it), else the system clock.
    pub clock: Clock,
    /// Every change durable when its call returns (the kernel's `-o sync`,
    /// `SB_SYNCHRONOUS`): applied by the vfs layer, as for an inode with
    /// the synchronous flag.
    pub sync: bool,
    /// Directory changes durable when their call returns (`-o dirsync`),
    /// as for a directory with the dirsync flag.
    pub dirsync: bool,
    /// The image file's container format (qcow2, VHDX, VMDK, VHD, Android
    /// sparse, raw) when the user forced it; chosen by content when `None`.
    pub disk_format: Option<ext4kit_vdisk::DiskFormat>,
    /// Follow files an image names (a qcow2 backing file, VMDK extents)
    /// anywhere on this machine; by default only inside the image's own
    /// directory (`ext4kit_vdisk::NamedFiles`).
    pub any_backing_path: bool,
    /// An LVM2 logical volume ("VG/LV") of the image's disk that holds the
    /// filesystem, found on the disk or any of its partitions; `location`
    /// must then be `Whole`.
    pub volume: Option<String>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read_only: true,
            cache_budget: 256 << 20,
            no_replay: false,
            location: ext4kit_blockdev::Location::Whole,
            commit_interval: None,
            clock: Clock::from_source_date_epoch().unwrap_or_default(),
            sync: false,
            dirsync: false,
            disk_format: None,
            any_backing_path: false,
            volume: None,
        }
    }
}

/// The filesystem as the ext4 layer sees it (see the module doc).
pub struct Volume {
    geo: Geometry,
    disk: Disk,
    sup: SuperState,
    groups: GroupTable,
    /// Metadata blocks, with their per-block write locks and drafts.
    bcache: BufferCache,
    /// The cache memory shared by buffers and file pages.
    budget: Arc<MemoryBudget>,
    /// The journal: handles, the running transaction and its log when the
    /// volume is open for writing and has one, and the checkpoint set of
    /// committed blocks not yet written home.
    jbd: Journal,
    /// Freed blocks not to reuse before their transaction commits.
    busy: BusyExtents,
    /// Free blocks and delayed-allocation reservations; shared with the
    /// page cache, whose pages give theirs back when dropped.
    reservations: Arc<Reservations>,
    /// Blocks named twice, or named and marked free, and inode-table
    /// blocks a map names (see `owner_scan.rs`), found at the first
    /// allocation or free.
    owners: OwnerMap,
    orphans: OrphanLinks,
    errors: FsErrors,
    /// Where the times the filesystem stamps come from.
    clock: Clock,
    /// The blocks no file may own (see `system_zone.rs`), built on first
    /// use.
    system_zone: OnceLock<SystemZone>,
    /// Some handle changed metadata since the open: a sync with nothing
    /// changed writes nothing (a refused command leaves the image as it
    /// was, byte for byte).
    metadata_changed: AtomicBool,
    /// Things the user should know (read-only because of a feature, journal
    /// needs recovery, ...).
    warnings: Vec<String>,
    stats: Stats,
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
        match write_access::access(&sb) {
            Access::Refused(why) => return Err(Error::Unsupported(why)),
            Access::ReadOnly(why) => {
                if !read_only {
                    warnings.push(format!("opened read-only: {why}"));
                }
                read_only = true;
            }
            Access::ReadWrite => {}
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
        let groups = GroupTable::load(&disk, &geo, &sb)?;
        let free: u64 = groups.iter().map(|g| g.desc().read().free_blocks_count() as u64).sum();
        let reservations = Arc::new(Reservations::new(free, sb.r_blocks_count()));
        let budget = Arc::new(MemoryBudget::new(opts.cache_budget, block_size));
        let mut vol = Volume {
            geo,
            disk,
            sup: SuperState::new(sb),
            groups,
            bcache: BufferCache::new(block_size, budget.clone()),
            budget,
            jbd: Journal::unjournaled(),
            busy: BusyExtents::default(),
            reservations,
            owners: OwnerMap::default(),
            orphans: OrphanLinks::default(),
            errors: FsErrors::new(opts.clock),
            clock: opts.clock,
            system_zone: OnceLock::new(),
            metadata_changed: AtomicBool::new(false),
            warnings,
            stats: Stats::default(),
        };
        if !vol.read_only() {
            let bias = vol.damaged_count_bias();
            vol.sup.set_count_bias(bias);
        }
        Ok(vol)
    }

    /// Start the journal for writing (a read-write volume with
    /// `has_journal`), from `journal` as `journal::open_journal` loaded
    /// it: its log must be empty — recovery ran before the volume opened.
    /// Our journal superblock asks for what the kernel sets at mount
    /// (revoke, 64-bit tags on a 64bit filesystem, checksum v3 with
    /// metadata_csum); nothing is written until the first commit, so an
    /// open that only reads leaves the image's bytes alone.
    /// `needs_recovery` is kept set in the in-memory superblock while the
    /// journal is in use, so every version of the superblock the log or a
    /// checkpoint writes says so. A journal we cannot write (an external
    /// one, a version 1 superblock, a corrupt one) leaves the volume
    /// unjournaled, with a warning. `commit_interval` as in
    /// [`OpenOptions`]; commit blocks carry the volume's clock's time.
    pub(crate) fn start_journal(
        &mut self,
        journal: Result<ext4kit_jbd2::Journal>,
        commit_interval: Option<std::time::Duration>,
    ) {
        use ext4kit_format::jbd2::features as jf;
        let journal = match journal {
            Ok(j) => j,
            Err(e) => {
                self.warnings.push(format!(
                    "the journal cannot be used for writing ({e}): changes are written without it, as on ext2; \
                     a crash may need e2fsck"
                ));
                return;
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
                self.sup.write().feature_incompat |= incompat::RECOVER;
                self.jbd = Journal::journaled(log, commit_interval, self.clock);
            }
            Err(e) => self.warnings.push(format!(
                "the journal cannot be used for writing ({e}): changes are written without it, as on ext2; a crash \
                 may need e2fsck"
            )),
        }
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

    /// Where the times this filesystem stamps come from
    /// ([`OpenOptions::clock`]).
    #[inline]
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The in-memory primary superblock, its update lock and count bias.
    #[inline]
    pub fn sb(&self) -> &SuperState {
        &self.sup
    }

    /// The group descriptor table.
    #[inline]
    pub fn groups(&self) -> &GroupTable {
        &self.groups
    }

    /// The metadata buffer cache.
    #[inline]
    pub fn bcache(&self) -> &BufferCache {
        &self.bcache
    }

    /// The cache memory shared by buffers and file pages.
    #[inline]
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// The journal (jbd2's): whether there is a log, the running
    /// transaction, the checkpoint set, counters.
    #[inline]
    pub fn jbd(&self) -> &Journal {
        &self.jbd
    }

    /// Freed blocks waiting for their transaction to commit.
    #[inline]
    pub fn busy(&self) -> &BusyExtents {
        &self.busy
    }

    /// The parts a metadata change and the journal write through.
    #[inline]
    pub(crate) fn meta_io(&self) -> MetaIo<'_> {
        MetaIo::new(MetaParts {
            bcache: &self.bcache,
            disk: &self.disk,
            sup: &self.sup,
            budget: &self.budget,
            owners: &self.owners,
            block_size: self.geo.block_size(),
        })
    }

    /// Free blocks and delayed-allocation reservations.
    #[inline]
    pub fn reservations(&self) -> &Arc<Reservations> {
        &self.reservations
    }

    /// The block-owner sets, built at the first allocation or free
    /// (`owner_scan.rs`).
    #[inline]
    pub fn owner_map(&self) -> &OwnerMap {
        &self.owners
    }

    /// Forget the owner sets: the next allocation or free scans again.
    #[cfg(test)]
    pub(crate) fn forget_owner_map(&mut self) {
        self.owners.forget();
    }

    /// The orphan chain's links in memory.
    #[inline]
    pub fn orphans(&self) -> &OrphanLinks {
        &self.orphans
    }

    /// The error state (damage met while writing).
    #[inline]
    pub fn errors(&self) -> &FsErrors {
        &self.errors
    }

    /// The blocks no file may own: bitmaps, inode tables, superblock and
    /// descriptor copies (built on first use from the group layout).
    #[inline]
    pub fn system_zone(&self) -> &SystemZone {
        self.system_zone
            .get_or_init(|| SystemZone::new(&self.geo, &self.sup.read(), self.groups.iter().map(|g| g.meta())))
    }

    /// Whether some handle changed metadata since the open (set by the
    /// handles; a sync with nothing changed writes nothing).
    #[inline]
    pub fn metadata_changed(&self) -> &AtomicBool {
        &self.metadata_changed
    }

    /// Things the user should know (read-only because of a feature,
    /// journal needs recovery, ...).
    #[inline]
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Put warnings found before the open (journal recovery's) ahead of
    /// the volume's own.
    pub fn prepend_warnings(&mut self, earlier: Vec<String>) {
        self.warnings.splice(0..0, earlier);
    }

    /// I/O counters for tests and benchmarks.
    #[inline]
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// A metadata block through the buffer cache.
    pub fn buffer(&self, block: u64) -> Result<Arc<Buffer>> {
        self.disk.check_meta_block(block)?;
        self.bcache.get(block, |d| self.disk.read_raw(block, d))
    }

    /// [`Self::buffer`] for a caller holding the block's stripe lock.
    pub fn buffer_locked(&self, g: &mut StripeGuard<'_>, block: u64) -> Result<Arc<Buffer>> {
        self.meta_io().buffer_locked(g, block)
    }

    /// Start a transaction; EROFS on a read-only volume, and the error
    /// state's refusal once damage was met half-way (`fs_errors.rs`).
    pub fn begin(&self) -> Result<Handle<'_>> {
        if self.read_only() {
            return Err(Error::posix(Errno::EROFS, "filesystem is read-only"));
        }
        if self.errors.failed() {
            return Err(self.errors.refused_after_error());
        }
        if self.jbd.is_journaled() {
            // A journal sharing a block with a file cannot be written
            // (found by the owner scan, which the operations run before
            // their handle): refused while nothing has changed.
            self.owners.check_journal()?;
        }
        Ok(Handle::begin(
            self.meta_io(),
            &self.jbd,
            &self.errors,
            &self.metadata_changed,
        ))
    }

    /// Commit the running transaction if transaction `tid` (or an earlier
    /// one) has not been committed yet: the group commit behind fsync.
    /// Returns once `tid`'s changes are durable in the log. A no-op
    /// without a journal.
    pub fn commit_upto(&self, tid: u32) -> Result<()> {
        self.jbd.commit_upto(tid, &self.meta_io())
    }

    /// Commit whatever the running transaction holds now.
    pub fn commit_running(&self) -> Result<()> {
        self.jbd.commit_running(&self.meta_io())
    }

    /// The background worker's commit: the running transaction, if it is
    /// older than the commit interval or past its size limit.
    pub fn commit_if_due(&self) {
        self.jbd.commit_if_due(&self.meta_io());
    }

    /// Write every committed metadata block home, in block order, adjacent
    /// blocks together; with a journal, flush and empty the log afterwards.
    /// On a device error the unwritten blocks stay dirty, so nothing is
    /// lost and the next sync tries again. Durability where it is promised:
    /// sync(2), fsync and fdatasync write every dirty metadata block (with
    /// a journal, commit the running transaction) before the device flush.
    pub fn checkpoint(&self) -> Result<()> {
        if self.read_only() {
            return Ok(());
        }
        self.jbd.checkpoint(&self.meta_io())
    }

    /// The background worker's pass: checkpoint if over budget.
    pub fn checkpoint_if_over(&self) {
        self.jbd.checkpoint_if_over(&self.meta_io());
    }

    /// Blocks the checkpoint set may hold before it is written home.
    pub fn checkpoint_limit(&self) -> usize {
        ext4kit_jbd2::Buffers::checkpoint_limit(&self.meta_io())
    }

    /// Quiesce the journal: commit, write everything home, empty the log,
    /// clear `needs_recovery` at home and flush (jbd2_journal_destroy +
    /// ext4_put_super, or a freeze). After this the image file needs no
    /// recovery and is complete on its own. With `last` (the volume is
    /// closing) the in-memory superblock loses the flag too; otherwise it
    /// keeps it, so that every superblock version a later transaction logs
    /// says so (the next commit sets it at home again first).
    pub fn close_journal(&self, last: bool) -> Result<()> {
        self.jbd.close(&self.meta_io())?;
        if last && self.jbd.is_journaled() {
            self.sup.write().feature_incompat &= !incompat::RECOVER;
        }
        Ok(())
    }

    /// Whether freed blocks wait for their transaction to commit: an
    /// ENOSPC is then worth a commit and one more try (the kernel's
    /// `ext4_should_retry_alloc`).
    pub fn has_busy_blocks(&self) -> bool {
        self.busy.any(&self.jbd)
    }

    /// Write descriptor `g` (as `gd`) into its descriptor-table block
    /// through `h`.
    pub fn write_group_desc(&self, h: &mut Handle<'_>, g: usize, gd: &GroupDesc) -> Result<()> {
        h.modify(self.groups[g].desc_block(), |d| {
            self.groups.encode_desc(g, gd, d);
            Ok(())
        })
    }

    /// Write the primary superblock with free counts summed from the groups
    /// (the kernel keeps them in per-cpu counters and writes them the same
    /// way at sync time).
    pub fn sync_super(&self) -> Result<()> {
        if self.jbd.is_journaled() && !self.read_only() {
            // Journaled like any metadata: the orphan chain's head lives
            // here, and must change in the same transaction as the links.
            let mut h = self.begin()?;
            self.journal_super(&mut h)?;
            return h.commit();
        }
        let _g = self.sup.update_lock();
        let bytes = self.sup.super_bytes(&self.geo, &self.groups);
        if self.read_only() {
            return Ok(());
        }
        self.disk
            .device()
            .write_at(SUPERBLOCK_OFFSET, &bytes)
            .map_err(|e| Error::io("writing the superblock", e))
    }

    /// Write the superblock through `h` (a journaled volume): bytes
    /// 1024..2048 of the block that holds them (block 0, or block 1 with
    /// 1 KiB blocks), so that it changes in `h`'s transaction.
    pub fn journal_super(&self, h: &mut Handle<'_>) -> Result<()> {
        let _g = self.sup.update_lock();
        let bytes = self.sup.super_bytes(&self.geo, &self.groups);
        let at = SUPERBLOCK_OFFSET as usize % self.geo.block_size();
        h.modify_superblock_block(|d| {
            d[at..at + bytes.len()].copy_from_slice(&bytes);
            Ok(())
        })
    }

    /// Enter the error state because of `what` (see `fs_errors.rs`):
    /// abort the journal, record the error in the superblock at home.
    /// Returns whether this was the first error.
    pub fn fs_error(&self, what: &str) -> bool {
        self.jbd.abort();
        self.errors.record(what, &self.sup, &self.disk)
    }

    /// At open: how far the superblock's free counts should stay from the
    /// groups' sums. The kernel writes the sums (its per-cpu counters are
    /// initialised from the descriptors), and so did we; but when a
    /// group's count is damaged — it disagrees with the group's bitmap —
    /// the superblock's own count is the one e2fsck agrees with, and
    /// summing would put the damage into it at the next superblock write
    /// (a new "Free blocks count wrong" from any operation at all). So the
    /// difference found at open is kept, and the superblock moves by what
    /// the groups move. When every group agrees with its bitmap the
    /// superblock is the stale one (a crash, say) and the sums are written,
    /// as the kernel's. Reads every bitmap only when the counts differ.
    fn damaged_count_bias(&self) -> (i64, i64) {
        let (mut fb, mut fi) = (0i64, 0i64);
        for grp in &self.groups {
            let gd = grp.desc().read();
            fb += gd.free_blocks_count() as i64;
            fi += gd.free_inodes_count() as i64;
        }
        let (sb_b, sb_i) = {
            let sb = self.sup.read();
            (sb.free_blocks_count() as i64, sb.free_inodes_count as i64)
        };
        let csum_groups = self.geo.has_group_desc_csum();
        let mut bias = (0, 0);
        if sb_b != fb {
            let lying = (0..self.groups.len()).any(|g| {
                let gd = *self.groups[g].desc().read();
                if csum_groups && gd.flags & BG_BLOCK_UNINIT != 0 {
                    return false;
                }
                match self.buffer(gd.block_bitmap()) {
                    Ok(bm) => !self
                        .groups
                        .block_bitmap_usable(g, &gd, &bm.data, &self.geo, self.system_zone()),
                    Err(_) => true,
                }
            });
            if lying {
                bias.0 = sb_b - fb;
            }
        }
        if sb_i != fi {
            let lying = (0..self.groups.len()).any(|g| {
                let gd = *self.groups[g].desc().read();
                if csum_groups && gd.flags & BG_INODE_UNINIT != 0 {
                    return false;
                }
                match self.buffer(gd.inode_bitmap()) {
                    Ok(bm) => !self.groups.inode_bitmap_usable(g, &gd, &bm.data, &self.geo),
                    Err(_) => true,
                }
            });
            if lying {
                bias.1 = sb_i - fi;
            }
        }
        bias
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
    let mk = ext4kit_mkfs::MkfsOptions {
        features: features.iter().map(|f| f.to_string()).collect(),
        ..Default::default()
    };
    ext4kit_mkfs::mkfs(&*dev, 8 << 20, &mk).expect("mkfs on a memory device");
    let opts = OpenOptions {
        read_only: false,
        cache_budget: 8 << 20,
        ..Default::default()
    };
    super::journal::open_volume(dev, &opts).expect("open the fresh volume")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_format::superblock::STATE_ERROR;

    fn home_sb(v: &Volume) -> Superblock {
        let mut raw = vec![0u8; Superblock::SIZE];
        v.disk().device().read_at(SUPERBLOCK_OFFSET, &mut raw).unwrap();
        Superblock::parse(&raw).unwrap()
    }

    /// A handle that changed a block and then met damage: nothing of it is
    /// committed, the error is recorded at home, later writes are refused.
    #[test]
    fn damage_met_half_way_aborts_the_journal_and_refuses_writes() {
        let v = scratch_volume();
        let blk = v.groups()[0].inode_table() + 100; // unused inode-table block
        let mut before = vec![0u8; v.block_size()];
        v.disk().read_raw(blk, &mut before).unwrap();
        let r: Result<()> = (|| {
            let mut h = v.begin()?;
            h.modify(blk, |d| {
                d[9] ^= 0x5a;
                Ok(())
            })?;
            Err(Error::corrupt_msg("block 1234", "extent index", "a made-up node"))
        })();
        assert!(r.is_err());
        assert!(v.errors().failed() && v.jbd().is_aborted());
        let sb = home_sb(&v);
        assert_ne!(sb.state & STATE_ERROR, 0, "the error bit is set at home");
        assert_eq!(sb.error_count, 1);
        assert_eq!(&sb.first_error_func[..7], b"ext4kit");
        let e = v.begin().expect_err("writes are refused").to_string();
        assert!(e.contains("run e2fsck") && e.contains("damage"), "{e}");
        assert!(v.commit_running().is_err(), "the aborted journal commits nothing");
        let mut after = vec![0u8; v.block_size()];
        v.disk().read_raw(blk, &mut after).unwrap();
        assert_eq!(before, after, "the half-made change never reached home");
        let j = crate::journal::open_journal(v.disk().device()).unwrap();
        let plan = ext4kit_jbd2::recover(&j);
        assert!(
            !plan.replay.contains_key(&blk),
            "the half-made change is not in the log"
        );
    }

    /// An ENOSPC (not damage) half-way keeps today's behaviour: no error
    /// state, the handle's blocks are kept.
    #[test]
    fn a_handle_dropped_for_another_error_does_not_abort() {
        let v = scratch_volume_unjournaled();
        let blk = v.groups()[0].inode_table() + 100;
        let r: Result<()> = (|| {
            let mut h = v.begin()?;
            h.modify(blk, |d| {
                d[9] ^= 0x5a;
                Ok(())
            })?;
            Err(Error::posix(crate::error::Errno::ENOSPC, "full"))
        })();
        assert!(r.is_err());
        assert!(!v.errors().failed());
        assert!(v.begin().is_ok());
        assert_eq!(home_sb(&v).state & STATE_ERROR, 0);
    }
}
