//! Who owns which block, as far as allocating and freeing need to know:
//! the sets e2fsck's pass 1 derives from reading every inode (its
//! "multiply-claimed blocks", passes 1B-1D), built once per open by the
//! owner scan (`owner_scan.rs`) and consulted by every allocation, free
//! and record rewrite after it.
//!
//! [`OwnerSets`] holds four small sets — blocks named by more than one
//! inode (with the inodes naming them), blocks a live inode names though
//! the bitmap says free, xattr blocks named by several inodes, and
//! inode-table blocks an inode's map names — all empty on a healthy
//! filesystem; and whether a journal block is among the blocks named
//! twice, which stops every log write. After the scan they only shrink: the engine never makes a
//! block named twice, so nothing else keeps them up to date. [`OwnerMap`]
//! is the volume's slot for them, filled at the first allocation or free;
//! the checks that need no scan (a refcount, a record's table block, the
//! forgetting after a free) are its methods.
//!
//! Locking: the map's build mutex is held while the scan runs; every
//! allocation and free waits on it ([`OwnerMap::get_or_build`]), so no
//! block is allocated or freed while the scan reads. The sets' own mutexes are held only for a lookup or an
//! update; `clean` answers the common case (nothing found) with one atomic
//! load, without them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::{Error, Result};

/// How an inode names a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// File, directory or symlink data.
    Data,
    /// An extent tree index or leaf block.
    ExtentNode,
    /// An indirect block (single, double or triple).
    Indirect,
    /// The inode's xattr block (`i_file_acl`).
    Xattr,
}

impl Role {
    /// Short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Role::Data => "data",
            Role::ExtentNode => "extent tree block",
            Role::Indirect => "indirect block",
            Role::Xattr => "xattr block",
        }
    }
}

/// What the scan found, and how long it took.
#[derive(Debug, Clone, Default)]
pub struct ScanStats {
    /// Inode records read.
    pub records: u64,
    /// Live inodes whose maps were walked.
    pub inodes: u64,
    /// Blocks owned by some inode (counted once each).
    pub owned: u64,
    /// Blocks claimed more than once.
    pub multi: usize,
    /// Claimed blocks the bitmap marks free.
    pub unmarked: usize,
    /// Wall time of the scan.
    pub elapsed: Duration,
    /// Bytes the scan's claimed-block bitmap took at its largest.
    pub peak_bytes: usize,
}

#[derive(Debug, Default)]
struct Sets {
    multi: BTreeMap<u64, Vec<(u32, Role)>>,
    unmarked: BTreeSet<u64>,
}

impl Sets {
    fn is_empty(&self) -> bool {
        self.multi.is_empty() && self.unmarked.is_empty()
    }
}

/// What the owner scan found, handed to [`OwnerSets::new`].
#[derive(Debug, Default)]
pub struct Findings {
    /// Blocks named more than once, with the inodes naming them.
    pub multi: BTreeMap<u64, Vec<(u32, Role)>>,
    /// Named blocks the bitmap marks free.
    pub unmarked: BTreeSet<u64>,
    /// Xattr blocks named by several inodes, and by how many.
    pub shared_xattr: HashMap<u64, u32>,
    /// Inode-table blocks an inode's map names.
    pub itable: BTreeSet<u64>,
    /// The journal inode (`s_journal_inum`; 0 without one): a block of it
    /// in `multi` stops every log write.
    pub journal_ino: u32,
    /// The scan's figures.
    pub stats: ScanStats,
}

/// The blocks whose owners are not simply "one inode, marked in use" (see
/// the module doc).
#[derive(Debug)]
pub struct OwnerSets {
    sets: Mutex<Sets>,
    /// `multi` and `unmarked` empty: the common case, answered without the
    /// mutex.
    clean: AtomicBool,
    /// Xattr blocks named by more than one inode, and by how many (only
    /// the xattr release path looks: legitimately shared blocks are common
    /// where ACLs are, and must not slow every free).
    shared_xattr: Mutex<HashMap<u64, u32>>,
    /// A block of the journal that another inode's map names too, with the
    /// inodes naming it: every log write could change what that inode
    /// holds, so none is made ([`OwnerMap::check_journal`]).
    journal_shared: Option<(u64, Vec<(u32, Role)>)>,
    /// Inode-table blocks some inode's map names: the bad-blocks inode
    /// listing them, or a file whose map points into the table (e2fsck's
    /// "conflicts with critical metadata"). Their records are not handed
    /// out (`ialloc.rs`) nor rewritten. Never shrinks: no free takes a
    /// table block.
    itable: BTreeSet<u64>,
    /// The scan's figures.
    stats: ScanStats,
}

impl OwnerSets {
    /// The sets of what a scan found.
    pub fn new(found: Findings) -> OwnerSets {
        let Findings {
            multi,
            unmarked,
            shared_xattr,
            itable,
            journal_ino,
            stats,
        } = found;
        let journal_shared = (journal_ino != 0)
            .then(|| multi.iter().find(|(_, by)| by.iter().any(|c| c.0 == journal_ino)))
            .flatten()
            .map(|(&b, by)| (b, by.clone()));
        let sets = Sets { multi, unmarked };
        let clean = sets.is_empty();
        OwnerSets {
            sets: Mutex::new(sets),
            clean: AtomicBool::new(clean),
            shared_xattr: Mutex::new(shared_xattr),
            journal_shared,
            itable,
            stats,
        }
    }

    /// No block claimed twice and none claimed while marked free.
    #[inline]
    pub fn is_clean(&self) -> bool {
        self.clean.load(Ordering::Acquire)
    }

    fn update(&self, f: impl FnOnce(&mut Sets)) {
        let mut s = self.sets.lock();
        f(&mut s);
        self.clean.store(s.is_empty(), Ordering::Release);
    }

    /// The scan's figures.
    pub fn stats(&self) -> &ScanStats {
        &self.stats
    }

    /// The multiply-claimed blocks in `[start, start + len)`, with their
    /// claimants.
    pub(crate) fn multi_in(&self, start: u64, len: u64) -> Vec<(u64, Vec<(u32, Role)>)> {
        if self.is_clean() {
            return Vec::new();
        }
        let s = self.sets.lock();
        s.multi
            .range(start..start.saturating_add(len))
            .map(|(&b, c)| (b, c.clone()))
            .collect()
    }

    /// The first multiply-claimed block of `runs` (in their order), with
    /// its claimants.
    pub(crate) fn first_multi_in(&self, runs: &[(u64, u64)]) -> Option<(u64, Vec<(u32, Role)>)> {
        if self.is_clean() {
            return None;
        }
        let s = self.sets.lock();
        runs.iter().find_map(|&(start, len)| {
            s.multi
                .range(start..start.saturating_add(len))
                .next()
                .map(|(&b, c)| (b, c.clone()))
        })
    }

    /// The last line behind the checks: a block of `runs` (about to be
    /// freed) that the scan found claimed more than once is refused.
    pub(crate) fn refuse_multi_in(&self, runs: &[(u64, u64)]) -> Result<()> {
        match self.first_multi_in(runs) {
            Some((b, c)) => Err(cross_linked(b, 0, &c)),
            None => Ok(()),
        }
    }

    /// Block `b` is no longer claimed twice (a recheck of its claimants'
    /// current maps found one claim at most).
    pub(crate) fn forget_multi(&self, b: u64) {
        self.update(|s| {
            s.multi.remove(&b);
        });
    }

    /// `runs` were freed: the blocks of them the bitmap already called free
    /// have no owner left.
    pub(crate) fn forget_unmarked(&self, runs: &[(u64, u64)]) {
        if self.is_clean() {
            return;
        }
        self.update(|s| {
            for &(start, len) in runs {
                let gone: Vec<u64> = s.unmarked.range(start..start.saturating_add(len)).copied().collect();
                for b in gone {
                    s.unmarked.remove(&b);
                }
            }
        });
    }

    /// How many inodes name xattr block `nr` (1 unless the scan found it
    /// shared).
    pub(crate) fn xattr_named(&self, nr: u64) -> u32 {
        self.shared_xattr.lock().get(&nr).copied().unwrap_or(1)
    }

    /// One inode dropped its reference to xattr block `nr`.
    pub(crate) fn xattr_unref(&self, nr: u64) {
        let mut m = self.shared_xattr.lock();
        if let Some(n) = m.get_mut(&nr) {
            *n = n.saturating_sub(1);
            if *n <= 1 {
                m.remove(&nr);
            }
        }
    }

    /// Blocks claimed more than once (for tests and reports).
    pub fn multi_blocks(&self) -> Vec<u64> {
        self.sets.lock().multi.keys().copied().collect()
    }

    /// The blocks of `[start, start + len)` (an inode table's) that some
    /// inode's map names; empty on a healthy filesystem.
    pub(crate) fn itable_named_in(&self, start: u64, len: u64) -> Vec<u64> {
        self.itable.range(start..start.saturating_add(len)).copied().collect()
    }

    /// Whether inode-table block `b` is named by an inode's map.
    pub(crate) fn itable_named(&self, b: u64) -> bool {
        self.itable.contains(&b)
    }

    /// Whether any inode-table block is named by an inode's map.
    pub(crate) fn any_itable_named(&self) -> bool {
        !self.itable.is_empty()
    }

    /// Claimed blocks the bitmap marks free (for tests and reports).
    pub fn unmarked_blocks(&self) -> Vec<u64> {
        self.sets.lock().unmarked.iter().copied().collect()
    }

    /// Set, in `view` (the bitmap of the `n` blocks from `first`), the bits
    /// of blocks a live inode claims though the bitmap says free, so the
    /// allocator passes them by. Returns whether any was set.
    pub(crate) fn mask_unmarked(&self, first: u64, n: usize, view: &mut [u8]) -> bool {
        if self.is_clean() {
            return false;
        }
        let s = self.sets.lock();
        let mut any = false;
        for &b in s.unmarked.range(first..first + n as u64) {
            crate::bitmap::set_bit(view, (b - first) as usize);
            any = true;
        }
        any
    }
}

/// The volume's owner sets, built at the first allocation or free (see the
/// module doc).
#[derive(Debug, Default)]
pub struct OwnerMap {
    set: OnceLock<OwnerSets>,
    /// Held while the scan runs: allocations and frees wait here.
    build: Mutex<()>,
}

impl OwnerMap {
    /// Forget the sets, so that the next use scans again (tests that
    /// damage a volume through the engine after its scan ran).
    #[cfg(test)]
    pub(crate) fn forget(&mut self) {
        self.set = OnceLock::new();
    }

    /// The sets if the scan has run.
    #[inline]
    pub fn get(&self) -> Option<&OwnerSets> {
        self.set.get()
    }

    /// The sets, running `scan` to build them the first time; a caller
    /// arriving while another's scan runs waits for it and uses its result.
    pub fn get_or_build(&self, scan: impl FnOnce() -> Result<OwnerSets>) -> Result<&OwnerSets> {
        if let Some(c) = self.set.get() {
            return Ok(c);
        }
        let _g = self.build.lock();
        if let Some(c) = self.set.get() {
            return Ok(c);
        }
        let c = scan()?;
        Ok(self.set.get_or_init(|| c))
    }

    /// `runs` were freed (their bitmap bits cleared, and with a journal
    /// held back from reuse until the freeing transaction commits): the
    /// ones the bitmap already called free have no owner left, and leave
    /// `unmarked` only now, so the allocator never sees them free before
    /// the journal does.
    pub(crate) fn freed(&self, runs: &[(u64, u64)]) {
        if let Some(set) = self.get() {
            set.forget_unmarked(runs);
        }
    }

    /// Refuse to change the references of xattr block `nr` (inode `ino`
    /// names it; its refcount reads `refcount`) when the count disagrees
    /// with the number of inodes naming it (e2fsck's "extended attribute
    /// block has reference count R, should be N"): releasing the last
    /// reference would free the block under the others, dropping one of
    /// too many would leave it allocated and unreferenced. Before the
    /// scan nothing is known (every path that releases a reference ran it
    /// first), so this never scans: its caller holds the block's lock,
    /// which the scan may need.
    pub(crate) fn check_xattr_refcount(&self, ino: u32, nr: u64, refcount: u32) -> Result<()> {
        let Some(set) = self.get() else {
            return Ok(());
        };
        let named = set.xattr_named(nr);
        if refcount != named {
            return Err(Error::corrupt_msg(
                format!("xattr block {nr} (inode {ino})"),
                "xattr block",
                format!(
                    "its reference count is {refcount} but {named} inode(s) name it: dropping a reference \
                     would free it under another inode or leave it allocated and unreferenced"
                ),
            ));
        }
        Ok(())
    }

    /// One inode dropped its reference to xattr block `nr` (the refcount
    /// went down by one, under the block's lock, or the block was freed).
    pub(crate) fn xattr_unref(&self, nr: u64) {
        if let Some(set) = self.get() {
            set.xattr_unref(nr);
        }
    }

    /// Refuse to write the journal when the scan found one of its blocks
    /// named by another inode too (a flipped pointer or a bad repair
    /// pointing into the log): the log is written round and round, so any
    /// commit may overwrite that block, and what the other inode holds
    /// would change with it (e2fsck reads it as that inode's data or map).
    /// Nothing is known before the scan.
    pub fn check_journal(&self) -> Result<()> {
        match self.get().and_then(|s| s.journal_shared.as_ref()) {
            Some((b, by)) => {
                let who: Vec<String> = by.iter().map(|(i, r)| format!("inode {i} ({})", r.name())).collect();
                Err(Error::corrupt_msg(
                    "journal",
                    "journal",
                    format!(
                        "journal block {b} is also named by {} (cross-linked): writing the log would change what \
                         that inode holds",
                        who.join(" and ")
                    ),
                ))
            }
            None => Ok(()),
        }
    }

    /// Refuse to rewrite inode `ino`'s record, which lies in inode-table
    /// block `blk`, when an inode's map names that block too (the
    /// bad-blocks inode's list, or a file whose map points into the
    /// table): the block is cross-linked, and a new record would change
    /// what the other claimant holds as e2fsck reads it (e2fsprogs'
    /// f_ind_inode_collision: the root's new mtime became new "illegal
    /// block" pointers of inode 12, whose indirect block is the table
    /// block holding the root). Nothing is known before the scan.
    pub(crate) fn check_record(&self, ino: u32, blk: u64) -> Result<()> {
        match self.get() {
            Some(set) if set.itable_named(blk) => Err(Error::corrupt_msg(
                format!("inode {ino}"),
                "inode table",
                format!(
                    "its record lies in inode-table block {blk}, which the bad-blocks inode lists or another \
                     inode's block map names (cross-linked): rewriting it would change what that inode holds"
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// The refusal for block `b`, claimed by every inode of `by`, which inode
/// `freeing` (0: unknown) is about to free.
pub(crate) fn cross_linked(b: u64, freeing: u32, by: &[(u32, Role)]) -> Error {
    let who: Vec<String> = by.iter().map(|(i, r)| format!("inode {i} ({})", r.name())).collect();
    let whom = if freeing != 0 {
        format!("freeing it for inode {freeing}")
    } else {
        "freeing it".to_string()
    };
    Error::corrupt_msg(
        format!("block {b}"),
        "block map",
        format!(
            "cross-linked: claimed by {}; {whom} would take it from a file that still uses it",
            who.join(" and ")
        ),
    )
}
