//! Block allocation (the kernel's `balloc.c` / a first `mballoc.c`):
//! goal-directed, one group at a time under that group's lock, so
//! sequential writers get contiguous runs and allocations in different
//! groups never contend.
//!
//! A group flagged BLOCK_UNINIT has no bitmap on disk yet; its contents are
//! implied by the layout (superblock backup, descriptor table and reserved
//! GDT blocks when the group carries a backup, plus any group's bitmaps and
//! inode table placed inside it by flex_bg) and are written out the first
//! time the group is allocated from, clearing the flag.

use ext4kit_format::features::{incompat, ro_compat};
use ext4kit_format::group_desc::{GroupDesc, BG_BLOCK_UNINIT};

use super::bitmap::{clear_bit, set_bit, test_bit};
use super::group::{BITMAP_BLOCK_CHECKED, BITMAP_BLOCK_CORRUPT};
use super::reservation::Reserver;
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};
use std::sync::atomic::Ordering;

impl Volume {
    /// Blocks in group `g` (the last group may be short).
    pub fn blocks_in_group(&self, g: usize) -> u64 {
        let start = self.geo().group_first_block(g as u64);
        (self.geo().blocks_count() - start).min(self.geo().blocks_per_group())
    }

    /// The block bitmap an uninitialised group implicitly has.
    fn implied_block_bitmap(&self, g: usize) -> Result<Vec<u8>> {
        let mut bm = vec![0u8; self.block_size()];
        let first = self.geo().group_first_block(g as u64);
        let n = self.blocks_in_group(g);
        for i in n as usize..self.block_size() * 8 {
            set_bit(&mut bm, i);
        }
        let sb = self.sb().read();
        if sb.group_has_super(g as u64) {
            if self.geo().has_incompat(incompat::META_BG) {
                return Err(Error::Unsupported(format!(
                    "initialising the block bitmap of meta_bg group {g}"
                )));
            }
            let per_block = self.block_size() / sb.desc_size();
            let gdt = self.groups().len().div_ceil(per_block) as u64;
            let meta = 1 + gdt + sb.reserved_gdt_blocks as u64;
            // Group 0 with 1 KiB blocks starts at block 1 (the superblock).
            for b in 0..meta.min(n) {
                set_bit(&mut bm, b as usize);
            }
        }
        let itable_blocks = self.geo().itable_blocks();
        for grp in self.groups() {
            let (bb, ib, it) = grp.meta();
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

    /// [`Self::implied_block_bitmap`] for the claim scan, which must not
    /// fail (an unsupported layout: `None`, the group is skipped).
    pub(crate) fn implied_block_bitmap_of(&self, g: usize) -> Option<Vec<u8>> {
        self.implied_block_bitmap(g).ok()
    }

    /// Whether uninitialised group `g` may be initialised: every one of
    /// its bitmaps and inode-table blocks that lies in another group
    /// (flex_bg) is marked in that group's bitmap. While `g` is
    /// BLOCK_UNINIT, e2fsprogs marks those blocks itself when it reads the
    /// bitmaps (`read_bitmaps` → `ext2fs_reserve_super_and_bgd` and the
    /// group's own metadata); once the flag is cleared only the home
    /// group's bitmap speaks for them, so a home bitmap that lies about
    /// them (e2fsprogs' j_recover_csum2_* replay a zeroed one) would show
    /// up as new "block bitmap differences". Such a group is not
    /// allocated from. Reads only.
    fn uninit_group_metadata_marked(&self, g: usize) -> Result<bool> {
        let geo = self.geo();
        let first = geo.group_first_block(g as u64);
        let end = first + self.blocks_in_group(g);
        let itable_blocks = geo.itable_blocks();
        let (bb, ib, it) = self.groups()[g].meta();
        let csum_groups = geo.has_ro_compat(ro_compat::GDT_CSUM | ro_compat::METADATA_CSUM);
        for b in [bb, ib].into_iter().chain(it..it.saturating_add(itable_blocks)) {
            if (first..end).contains(&b) || b < geo.first_data_block() || b >= geo.blocks_count() {
                continue;
            }
            let f = ((b - geo.first_data_block()) / geo.blocks_per_group()) as usize;
            let fd = *self.groups()[f].desc().read();
            if csum_groups && fd.flags & BG_BLOCK_UNINIT != 0 {
                // Its implied bitmap marks every group's metadata in it.
                continue;
            }
            let bm = self.buffer(fd.block_bitmap())?;
            if !test_bit(&bm.data, (b - geo.group_first_block(f as u64)) as usize) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub(crate) fn block_bitmap_of(&self, g: usize, gd: &GroupDesc) -> Result<(Vec<u8>, bool)> {
        let csum_groups = self.geo().has_ro_compat(ro_compat::GDT_CSUM | ro_compat::METADATA_CSUM);
        if csum_groups && gd.flags & BG_BLOCK_UNINIT != 0 {
            return Ok((self.implied_block_bitmap(g)?, true));
        }
        Ok((self.buffer(gd.block_bitmap())?.data.to_vec(), false))
    }

    /// Allocate up to `want` contiguous blocks, preferring `goal`; returns
    /// the first block and how many were allocated (at least one).
    ///
    /// This is the unprivileged allocator: it never takes the last
    /// `s_r_blocks_count` free blocks (the root reserve), the way the
    /// kernel's `ext4_has_free_clusters` treats a caller without
    /// CAP_SYS_RESOURCE — nor blocks that buffered writes have reserved
    /// for data not yet written back (`reservation.rs`). Blocks the handle
    /// was given from such reservations ([`Handle::add_reserved`],
    /// writeback) are drawn first and need no check: they were counted
    /// when the write was accepted. Map and directory blocks of other operations go
    /// through here whoever the caller is (this layer has no caller
    /// identity), so root making a directory does not dip into the
    /// reserve — stricter than the kernel, never looser. Callers that must
    /// succeed where root would use [`Self::alloc_blocks_as`].
    pub fn alloc_blocks(&self, h: &mut Handle<'_>, goal: u64, want: u32) -> Result<(u64, u32)> {
        self.alloc_blocks_as(h, goal, want, false)
    }

    /// [`Self::alloc_blocks`], with `privileged` allowed to use the root
    /// reserve (`s_r_blocks_count`; the kernel's `EXT4_MB_USE_RESERVED`).
    ///
    /// The check and the bitmap change are not one atomic step, so the
    /// grant is claimed first (`ext4_claim_free_clusters`) and released
    /// once the group's free count has dropped: concurrent allocations and
    /// buffered writes never promise the same block twice.
    pub fn alloc_blocks_as(&self, h: &mut Handle<'_>, goal: u64, want: u32, privileged: bool) -> Result<(u64, u32)> {
        // Nothing is handed out before the owner scan (claims.rs) has
        // found the blocks live inodes claim though the bitmap says free.
        // Taken here, before any group lock: the scan reads descriptors.
        self.claim_set()?;
        let want = want.max(1) as u64;
        // Writeback of accepted data may take the reserve for what its
        // claims did not cover (see `Handle::writes_back_delayed`).
        let who = if privileged || h.writes_back_delayed() {
            Reserver::Privileged
        } else {
            Reserver::User
        };
        let drawn = h.draw_reserved(want);
        let mut claimed = 0;
        if drawn < want {
            match self.reservations().reserve_up_to(want - drawn, who) {
                Ok(k) => claimed = k,
                Err(e) if drawn == 0 => return Err(e),
                Err(_) => {}
            }
        }
        let grant = (drawn + claimed) as u32;
        let r = self.alloc_granted(h, goal, grant);
        let used = r.as_ref().map_or(0, |&(_, n)| n as u64);
        let from_drawn = used.min(drawn);
        // What the handle drew and did not use stays its own; the claims
        // used are now allocated blocks (the free count dropped already),
        // and an ordinary allocation's unused claim is not needed any more.
        h.return_reserved(drawn - from_drawn);
        self.reservations().release(from_drawn + claimed);
        r
    }

    /// Find `grant` blocks (or fewer, contiguous) near `goal`: the groups
    /// from the goal's onward, wrapping around.
    fn alloc_granted(&self, h: &mut Handle<'_>, goal: u64, grant: u32) -> Result<(u64, u32)> {
        let ngroups = self.groups().len();
        let goal = goal.clamp(self.geo().first_data_block(), self.geo().blocks_count() - 1);
        let g0 = ((goal - self.geo().first_data_block()) / self.geo().blocks_per_group()) as usize;
        for k in 0..ngroups {
            let g = (g0 + k) % ngroups;
            let from = if k == 0 {
                goal - self.geo().group_first_block(g as u64)
            } else {
                0
            };
            if let Some(r) = self.alloc_in_group(h, g, from as usize, grant.max(1))? {
                return Ok(r);
            }
        }
        // Space a damaged bitmap hides is not "no space": say which.
        let bad: Vec<usize> = (0..ngroups)
            .filter(|&g| self.groups()[g].bitmap_state().load(Ordering::Relaxed) & BITMAP_BLOCK_CORRUPT != 0)
            .collect();
        if !bad.is_empty() {
            return Err(Error::corrupt_msg(
                format!("block bitmaps of groups {bad:?}"),
                "block bitmap",
                "no usable free blocks: the other groups are full and these disagree with their descriptors' free counts",
            ));
        }
        Err(Error::posix(Errno::ENOSPC, "no free blocks left on the filesystem"))
    }

    /// Check, before an operation changes anything, that block allocation
    /// will not meet a damaged bitmap: some group with free blocks, from
    /// `goal`'s on, has a bitmap that agrees with its descriptor. An
    /// operation that allocates only after it has begun changing the
    /// filesystem (mkdir's directory block, a symlink's block, a growing
    /// directory) is refused here, while the image is as it was, instead
    /// of failing half-way. Cheap once each group has been checked (one
    /// flag per group). ENOSPC is left to the allocation itself.
    pub fn check_block_allocatable(&self, goal: u64) -> Result<()> {
        // The first allocation of a session waits for the owner scan
        // (claims.rs): run it here, before the caller's handle begins.
        self.claim_set()?;
        let n = self.groups().len();
        let goal = goal.clamp(
            self.geo().first_data_block(),
            self.geo().blocks_count().saturating_sub(1),
        );
        let g0 = ((goal - self.geo().first_data_block()) / self.geo().blocks_per_group()) as usize;
        let csum_groups = self.geo().has_ro_compat(ro_compat::GDT_CSUM | ro_compat::METADATA_CSUM);
        let mut bad = Vec::new();
        for k in 0..n {
            let g = (g0 + k) % n;
            let gd = *self.groups()[g].desc().read();
            if gd.free_blocks_count() == 0 {
                continue;
            }
            let st = self.groups()[g].bitmap_state().load(Ordering::Relaxed);
            if st & BITMAP_BLOCK_CORRUPT != 0 {
                bad.push(g);
                continue;
            }
            if csum_groups && gd.flags & BG_BLOCK_UNINIT != 0 {
                if self.uninit_group_metadata_marked(g)? {
                    return Ok(());
                }
                bad.push(g);
                continue;
            }
            if st & BITMAP_BLOCK_CHECKED != 0 {
                return Ok(());
            }
            let bm = self.buffer(gd.block_bitmap())?;
            if self.block_bitmap_usable(g, &gd, &bm.data) {
                return Ok(());
            }
            bad.push(g);
        }
        if bad.is_empty() {
            return Ok(());
        }
        Err(Error::corrupt_msg(
            format!("block bitmaps of groups {bad:?}"),
            "block bitmap",
            "disagree with their descriptors' free counts (or mark metadata free); no block can be allocated safely",
        ))
    }

    /// Whether group `g`'s block bitmap `bm` may be allocated from: checked
    /// once per open — its free bits must number what the descriptor
    /// counts (the kernel's `ext4_mb_generate_buddy`: "block bitmap and bg
    /// descriptor inconsistent"). A bitmap that lies about a live block
    /// (a cleared bit the count does not know of) would hand that block
    /// to a second owner; such a group is marked corrupt and skipped, as
    /// the kernel skips a group with `BBITMAP_CORRUPT`.
    pub(crate) fn block_bitmap_usable(&self, g: usize, gd: &GroupDesc, bm: &[u8]) -> bool {
        let st = self.groups()[g].bitmap_state();
        let s = st.load(Ordering::Relaxed);
        if s & BITMAP_BLOCK_CHECKED != 0 {
            return s & BITMAP_BLOCK_CORRUPT == 0;
        }
        let n = self.blocks_in_group(g) as usize;
        let free = (0..n).filter(|&i| !test_bit(bm, i)).count() as u64;
        let first = self.geo().group_first_block(g as u64);
        // And no bitmap, inode table or superblock copy marked free.
        let zone_free = (first..first + n as u64)
            .any(|b| !test_bit(bm, (b - first) as usize) && self.system_zone_hit(b, b + 1).is_some());
        let ok = free == gd.free_blocks_count() as u64 && !zone_free;
        st.fetch_or(
            BITMAP_BLOCK_CHECKED | if ok { 0 } else { BITMAP_BLOCK_CORRUPT },
            Ordering::Relaxed,
        );
        ok
    }

    fn alloc_in_group(&self, h: &mut Handle<'_>, g: usize, from: usize, want: u32) -> Result<Option<(u64, u32)>> {
        let grp = &self.groups()[g];
        // Checked before this group's lock: it reads other groups'
        // descriptors (no lock order between groups is needed).
        let csum_groups = self.geo().has_ro_compat(ro_compat::GDT_CSUM | ro_compat::METADATA_CSUM);
        if csum_groups && grp.desc().read().flags & BG_BLOCK_UNINIT != 0 && !self.uninit_group_metadata_marked(g)? {
            return Ok(None);
        }
        let mut gd = grp.desc().write();
        if gd.free_blocks_count() == 0 {
            return Ok(None);
        }
        let (mut bm, uninit) = self.block_bitmap_of(g, &gd)?;
        if !uninit && !self.block_bitmap_usable(g, &gd, &bm) {
            return Ok(None);
        }
        let n = self.blocks_in_group(g) as usize;
        let first = self.geo().group_first_block(g as u64);
        // Blocks freed by a transaction not yet committed look used (see
        // busy.rs): the allocator works on a copy of the bitmap with
        // them set, and sets only bits free in the real one.
        let mut view = bm.clone();
        if self.jbd().is_journaled() {
            let runs = self.busy().busy_in(self.jbd(), first, first + n as u64);
            for (p, len) in &runs {
                for b in *p..*p + *len {
                    set_bit(&mut view, (b - first) as usize);
                }
            }
            if !runs.is_empty() && super::bitmap::find_zero(&view, 0, n).is_none() {
                return Ok(None);
            }
        }
        // Blocks a live inode claims though the bitmap says free (the claim
        // scan's `unmarked`, claims.rs, built before the first allocation)
        // are never handed out.
        if let Some(c) = self.claim_set_if_built() {
            if c.mask_unmarked(first, n, &mut view) && super::bitmap::find_zero(&view, 0, n).is_none() {
                return Ok(None);
            }
        }
        // First free bit at or after the goal, else from the group start.
        let start = super::bitmap::find_zero(&view, from.min(n), n).or_else(|| super::bitmap::find_zero(&view, 0, n));
        let Some(start) = start else {
            return Err(Error::corrupt_msg(
                format!("group {g}"),
                "group descriptor",
                format!("{} free blocks counted but the bitmap is full", gd.free_blocks_count()),
            ));
        };
        if let Some((zs, zl, name)) = self.system_zone_hit(first + start as u64, first + start as u64 + 1) {
            // A free bit on a bitmap or inode table: the bitmap lies.
            self.groups()[g]
                .bitmap_state()
                .fetch_or(BITMAP_BLOCK_CORRUPT, Ordering::Relaxed);
            return Err(Error::corrupt_msg(
                format!("block bitmap of group {g} (block {})", gd.block_bitmap()),
                "block bitmap",
                format!(
                    "block {} is marked free but is {name} (blocks {zs}..{})",
                    first + start as u64,
                    zs + zl
                ),
            ));
        }
        let mut len = 0usize;
        while len < want as usize
            && start + len < n
            && !test_bit(&view, start + len)
            && (len == 0
                || self
                    .system_zone_hit(first + (start + len) as u64, first + (start + len) as u64 + 1)
                    .is_none())
        {
            set_bit(&mut bm, start + len);
            set_bit(&mut view, start + len);
            len += 1;
        }
        self.busy().allocated(self.jbd(), first + start as u64, len as u64);
        let mut new = *gd;
        if uninit {
            new.flags &= !BG_BLOCK_UNINIT;
        }
        let free = gd.free_blocks_count().checked_sub(len as u32).ok_or_else(|| {
            Error::corrupt_msg(
                format!("group {g}"),
                "group descriptor",
                "free block count below the bitmap's",
            )
        })?;
        new.set_free_blocks_count(free);
        self.groups().set_block_bitmap_csum(&mut new, &bm);
        h.overwrite(gd.block_bitmap(), bm.into_boxed_slice())?;
        self.write_group_desc(h, g, &new)?;
        *gd = new;
        self.reservations().free_changed(-(len as i64));
        Ok(Some((
            self.geo().group_first_block(g as u64) + start as u64,
            len as u32,
        )))
    }

    /// Set the bitmap bits of `runs` to `used`, whatever each was, and
    /// move each group's free count by the bits that changed (recovery's
    /// `ext2fs_mark_block_bitmap_range2` / `unmark`): a fast commit names
    /// extents but not the bitmap, which may already say what it should.
    /// Blocks freed this way leave the buffer cache as in
    /// [`Self::free_block_runs`]. Returns how many bits changed.
    pub(crate) fn set_block_runs(&self, h: &mut Handle<'_>, runs: &[(u64, u64)], used: bool) -> Result<u64> {
        let mut pieces: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
        for &(mut p, mut n) in runs {
            while n > 0 {
                if p < self.geo().first_data_block() || p >= self.geo().blocks_count() {
                    return Err(Error::corrupt_msg(
                        format!("block {p}"),
                        "block map",
                        "a replayed extent names a block outside the filesystem",
                    ));
                }
                let g = (p - self.geo().first_data_block()) / self.geo().blocks_per_group();
                let k = n.min(self.geo().group_first_block(g) + self.geo().blocks_per_group() - p);
                pieces.push((p, k));
                p += k;
                n -= k;
            }
        }
        pieces.sort_unstable();
        if !used {
            self.forget_freed(&pieces);
        }
        let mut changed = 0u64;
        let mut i = 0;
        while i < pieces.len() {
            let g = ((pieces[i].0 - self.geo().first_data_block()) / self.geo().blocks_per_group()) as usize;
            let mut j = i;
            while j < pieces.len()
                && ((pieces[j].0 - self.geo().first_data_block()) / self.geo().blocks_per_group()) as usize == g
            {
                j += 1;
            }
            let mut gd = self.groups()[g].desc().write();
            let (mut bm, uninit) = self.block_bitmap_of(g, &gd)?;
            let first = self.geo().group_first_block(g as u64);
            let mut delta = 0i64;
            for &(s, n) in &pieces[i..j] {
                for b in s..s + n {
                    let bit = (b - first) as usize;
                    if test_bit(&bm, bit) != used {
                        if used {
                            set_bit(&mut bm, bit);
                            delta -= 1;
                        } else {
                            clear_bit(&mut bm, bit);
                            delta += 1;
                        }
                    }
                }
            }
            if delta != 0 || uninit {
                let mut new = *gd;
                if uninit {
                    new.flags &= !BG_BLOCK_UNINIT;
                }
                let free = (gd.free_blocks_count() as i64 + delta).clamp(0, self.blocks_in_group(g) as i64) as u32;
                new.set_free_blocks_count(free);
                self.groups().set_block_bitmap_csum(&mut new, &bm);
                h.overwrite(gd.block_bitmap(), bm.into_boxed_slice())?;
                self.write_group_desc(h, g, &new)?;
                self.reservations()
                    .free_changed(free as i64 - gd.free_blocks_count() as i64);
                *gd = new;
            }
            changed += delta.unsigned_abs();
            i = j;
        }
        Ok(changed)
    }

    /// Return many runs `(start, len)` to the free pool, changing each
    /// group's bitmap once however many runs fall in it (a truncate of a
    /// fragmented file frees thousands of runs). Runs may cross groups.
    /// Groups are locked one at a time, in ascending order.
    pub fn free_block_runs(&self, h: &mut Handle<'_>, runs: &[(u64, u64)]) -> Result<()> {
        let mut pieces: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
        for &(mut p, mut n) in runs {
            while n > 0 {
                if p < self.geo().first_data_block() || p >= self.geo().blocks_count() {
                    return Err(Error::corrupt_msg(
                        format!("block {p}"),
                        "block map",
                        "freeing a block outside the filesystem",
                    ));
                }
                let g = (p - self.geo().first_data_block()) / self.geo().blocks_per_group();
                let k = n.min(self.geo().group_first_block(g) + self.geo().blocks_per_group() - p);
                if let Some((zs, zl, name)) = self.system_zone_hit(p, p + k) {
                    // A map naming metadata: freeing it would hand a
                    // bitmap or inode table out as data.
                    return Err(Error::corrupt_msg(
                        format!("block {p}"),
                        "block map",
                        format!(
                            "freeing blocks {p}+{k}, which overlap {name} (blocks {zs}..{})",
                            zs + zl
                        ),
                    ));
                }
                pieces.push((p, k));
                p += k;
                n -= k;
            }
        }
        pieces.sort_unstable();
        // No block another inode still claims is freed (claims.rs): all
        // runs are looked at before the first group changes.
        self.claims_on_free(&pieces)?;
        let mut i = 0;
        while i < pieces.len() {
            let g = (pieces[i].0 - self.geo().first_data_block()) / self.geo().blocks_per_group();
            let mut j = i;
            while j < pieces.len() && (pieces[j].0 - self.geo().first_data_block()) / self.geo().blocks_per_group() == g
            {
                j += 1;
            }
            self.free_in_group(h, g as usize, &pieces[i..j])?;
            i = j;
        }
        self.claims_freed(&pieces);
        Ok(())
    }

    /// Drop freed blocks from the buffer cache, and make sure no
    /// checkpoint writes their old contents (the kernel's `ext4_forget` /
    /// `bforget`): a freed block may be allocated again at once — as file
    /// data written straight to the device — and a late write of the stale
    /// extent node, indirect block, directory or xattr block would destroy
    /// it. Taking the checkpoint's I/O lock waits out a checkpoint that may
    /// be writing one of them right now; once forgotten, a checkpoint finds
    /// no dirty version and skips the block. Most freed blocks are file
    /// data that was never cached: a miss per block.
    fn forget_freed(&self, runs: &[(u64, u64)]) {
        // Revoke what the log holds of them, and keep them from reuse
        // until the freeing transaction commits (busy.rs).
        self.jbd().forget(runs);
        self.busy().freed(self.jbd(), runs);
        let _io = self.jbd().hold_checkpoint();
        for &(p, n) in runs {
            for blk in p..p + n {
                if self.bcache().contains(blk) {
                    let mut g = self.bcache().lock(blk);
                    // Its draft (the freed block's last contents) goes too.
                    self.bcache().forget_locked(&mut g, blk);
                }
            }
        }
    }

    /// Return `len` blocks from `start` to the free pool (they must lie in
    /// one group).
    pub fn free_blocks(&self, h: &mut Handle<'_>, start: u64, len: u32) -> Result<()> {
        if start < self.geo().first_data_block() {
            return Err(Error::corrupt_msg(
                format!("block {start}"),
                "block map",
                "before the first data block",
            ));
        }
        let g = ((start - self.geo().first_data_block()) / self.geo().blocks_per_group()) as usize;
        self.claims_on_free(&[(start, len as u64)])?;
        self.free_in_group(h, g, &[(start, len as u64)])?;
        self.claims_freed(&[(start, len as u64)]);
        Ok(())
    }

    /// Clear the bits of `runs` (all inside group `g`) under the group lock.
    fn free_in_group(&self, h: &mut Handle<'_>, g: usize, runs: &[(u64, u64)]) -> Result<()> {
        self.forget_freed(runs);
        let start = runs.first().map_or(0, |r| r.0);
        let grp = self
            .groups()
            .get(g)
            .ok_or_else(|| Error::corrupt_msg(format!("block {start}"), "block map", "outside every group"))?;
        let mut gd = grp.desc().write();
        let (mut bm, uninit) = self.block_bitmap_of(g, &gd)?;
        let first = self.geo().group_first_block(g as u64);
        let mut total = 0u32;
        for &(s, len) in runs {
            let off = (s - first) as usize;
            if off + len as usize > self.blocks_in_group(g) as usize {
                return Err(Error::corrupt_msg(
                    format!("block {s}"),
                    "block map",
                    format!("run of {len} crosses group {g}"),
                ));
            }
            // A bit already clear is a bitmap that lied about a live
            // block: it is freed all the same (the bitmap was already
            // right about its future) and not counted twice — the
            // kernel's mb_free_blocks, which reports "freeing already
            // freed block" and carries on. The group's bitmap is then
            // known to disagree with its count until e2fsck.
            for i in off..off + len as usize {
                if test_bit(&bm, i) {
                    clear_bit(&mut bm, i);
                    total += 1;
                } else {
                    self.groups()[g]
                        .bitmap_state()
                        .fetch_or(BITMAP_BLOCK_CORRUPT, Ordering::Relaxed);
                }
            }
        }
        let mut new = *gd;
        if uninit {
            new.flags &= !BG_BLOCK_UNINIT;
        }
        let free = gd.free_blocks_count() + total;
        new.set_free_blocks_count(free);
        self.groups().set_block_bitmap_csum(&mut new, &bm);
        h.overwrite(gd.block_bitmap(), bm.into_boxed_slice())?;
        self.write_group_desc(h, g, &new)?;
        *gd = new;
        self.reservations().free_changed(total as i64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reservation::Reserver;

    /// Ordinary allocations see the reservations; a handle given reserved blocks
    /// (writeback) draws from them without a check; the free counter stays
    /// the sum of the group descriptors.
    #[test]
    fn allocations_respect_reservations_and_draw_from_the_handle() {
        let v = crate::volume::scratch_volume();
        let groups = |v: &crate::volume::Volume| -> u64 {
            v.groups()
                .iter()
                .map(|g| g.desc().read().free_blocks_count() as u64)
                .sum()
        };
        let free = v.reservations().free();
        assert_eq!(free, groups(&v));
        let avail = v.reservations().available(Reserver::User);
        v.reservations().reserve(avail, Reserver::User).unwrap();
        let mut h = v.begin().unwrap();
        let e = v.alloc_blocks(&mut h, 0, 1).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOSPC, "{e}");
        h.add_reserved(10);
        let (p, n) = v.alloc_blocks(&mut h, 0, 4).unwrap();
        assert!((1..=4).contains(&n));
        assert_eq!(h.reserved_left(), 10 - n as u64);
        assert_eq!(
            v.reservations().dirty(),
            avail - n as u64,
            "the blocks drawn left the reservations"
        );
        assert_eq!(v.reservations().free(), free - n as u64);
        assert_eq!(v.reservations().free(), groups(&v));
        v.free_blocks(&mut h, p, n).unwrap();
        assert_eq!(v.reservations().free(), groups(&v));
        h.commit().unwrap();
    }
}
