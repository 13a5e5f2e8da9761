//! The in-memory primary superblock (the kernel's `sbi->s_es`) and the
//! bytes written for it.
//!
//! Free counts are not kept here: the groups hold them (each under its
//! group lock), and [`SuperState::super_bytes`] sums them when the
//! superblock is written, as the kernel's per-cpu counters are summed at
//! `ext4_commit_super`. What a damaged group count keeps apart from that
//! sum is the count bias, fixed at open.
//!
//! Locking: the superblock's `RwLock` guards its fields (short holds, never
//! across I/O). The update mutex ([`SuperState::update_lock`]) serialises
//! whole-superblock writes — summing the counts, encoding and writing (or
//! journaling) the bytes, or editing the copy at home — so that two writers
//! never interleave their versions; it is taken after the orphan links'
//! mutex and before block locks.

use ext4kit_format::superblock::Superblock;
use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::geometry::Geometry;
use crate::group::GroupTable;

/// The superblock's in-memory state (see the module doc).
#[derive(Debug)]
pub struct SuperState {
    sb: RwLock<Superblock>,
    update: Mutex<()>,
    count_bias: (i64, i64),
    resuid: u32,
    resgid: u32,
}

impl SuperState {
    /// The state of the superblock `sb` as read at open (no count bias).
    pub fn new(sb: Superblock) -> SuperState {
        SuperState {
            resuid: sb.def_resuid as u32,
            resgid: sb.def_resgid as u32,
            sb: RwLock::new(sb),
            update: Mutex::new(()),
            count_bias: (0, 0),
        }
    }

    /// Read the in-memory superblock.
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, Superblock> {
        self.sb.read()
    }

    /// Change the in-memory superblock (it reaches the disk at the next
    /// superblock write).
    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, Superblock> {
        self.sb.write()
    }

    /// Serialise a whole-superblock write (see the module doc).
    #[inline]
    pub fn update_lock(&self) -> MutexGuard<'_, ()> {
        self.update.lock()
    }

    /// What the superblock's free counts (blocks, inodes) keep apart from
    /// the groups' sums when a group's count is damaged; (0, 0) on a
    /// consistent filesystem.
    #[inline]
    pub fn count_bias(&self) -> (i64, i64) {
        self.count_bias
    }

    /// Set the count bias found at open.
    pub fn set_count_bias(&mut self, bias: (i64, i64)) {
        self.count_bias = bias;
    }

    /// `s_def_resuid`: besides root, who may use the root reserve
    /// (`ext4_has_free_clusters`).
    #[inline]
    pub fn resuid(&self) -> u32 {
        self.resuid
    }

    /// `s_def_resgid`: see [`Self::resuid`].
    #[inline]
    pub fn resgid(&self) -> u32 {
        self.resgid
    }

    /// The superblock as it would be written now: the in-memory copy with
    /// the free counts summed from `groups` (plus the count bias). The
    /// caller holds [`Self::update_lock`].
    pub fn super_bytes(&self, geo: &Geometry, groups: &GroupTable) -> Vec<u8> {
        let (mut fb, mut fi) = (0u64, 0u64);
        for grp in groups.iter() {
            let gd = grp.desc().read();
            fb += gd.free_blocks_count() as u64;
            fi += gd.free_inodes_count() as u64;
        }
        let (bb, bi) = self.count_bias;
        let fb = (fb as i64).saturating_add(bb).clamp(0, geo.blocks_count() as i64) as u64;
        let fi = (fi as i64).saturating_add(bi).clamp(0, geo.inodes_count() as i64) as u64;
        let mut sb = self.sb.write();
        sb.set_free_blocks_count(fb, geo.has_incompat(ext4kit_format::features::incompat::BIT64));
        sb.free_inodes_count = fi as u32;
        sb.to_bytes_with_checksum()
    }
}
