//! Finding the journal and recovering it at open (the kernel's
//! `ext4_get_journal` + `ext4_load_journal`, e2fsck's
//! `e2fsck_get_journal` + `e2fsck_run_ext3_journal`).
//!
//! When the superblock says `needs_recovery`, the log holds committed
//! transactions whose blocks may not have reached their home locations.
//! Reading the home locations then shows a tree that never existed, so
//! every open replays first:
//!
//! - a **read-write** open replays on disk as the kernel's mount and e2fsck
//!   do: the plan's blocks are written home, the device is flushed, the
//!   journal superblock is reset (empty log, next sequence) and
//!   `needs_recovery` is cleared, flushed again, and then the open goes on;
//! - a **read-only** open replays into an in-memory overlay
//!   ([`OverlayDevice`]): the same blocks, journal superblock and
//!   superblock, seen through the overlay, while the image file is never
//!   written (a snapshot stays a snapshot). The overlay holds only where
//!   each replayed block's logged copy is, not the copy;
//! - `no_replay` (the kernel's `noload`) skips all of it and shows the home
//!   locations, read-only.
//!
//! What happens to a journal that cannot be replayed follows e2fsck, whose
//! result is the oracle: a corrupt or unsupported journal superblock is
//! discarded with nothing replayed; a failed recovery keeps what the replay
//! pass had written; a transaction whose commit checksum fails ends the log
//! and marks the filesystem as having errors. A read-only open shows that
//! result with a warning naming what was skipped. A read-write open refuses
//! instead, as the kernel's mount does (`jbd2_journal_load` fails on a
//! recovery error and on a failed commit): writing on top of a journal the
//! kernel cannot replay would leave e2fsck two problems instead of one.
//!
//! Fast commits and orphans are recovered by the ext4 code itself, one
//! layer up (`Fs::open_device`), on the device this module returns.
//!
//! After recovery, [`open_volume`] opens the volume and starts its journal
//! for writing (the kernel's `ext4_load_journal` at the end of the same
//! path): the journal inode is read through the opened volume, and the
//! log it maps is handed to the volume's jbd2 journal.

use std::sync::Arc;

use ext4kit_blockdev::{BlockDevice, OverlayDevice};
use ext4kit_format::fast_commit::Record;
use ext4kit_format::features::{compat, incompat, ro_compat};
use ext4kit_format::inode::{FileType, Inode};
use ext4kit_format::jbd2::JBD2_MAGIC;
use ext4kit_format::superblock::{Superblock, STATE_ERROR, STATE_VALID, SUPERBLOCK_OFFSET};
use ext4kit_jbd2::{Journal, JournalMap, LoadError, Recovery};

use super::volume::{OpenOptions, Volume};
use super::{bmap, inode};
use crate::error::{Errno, Error, Result};

/// `EXT3_JNL_BACKUP_BLOCKS`: `s_jnl_blocks` holds a copy of the journal
/// inode's `i_block`, `i_size_high` and `i_size`.
const JNL_BACKUP_BLOCKS: u8 = 1;

/// The device to open after recovery, and what recovery did.
pub struct Recovered {
    /// The device the filesystem should be opened on: the original one, or
    /// an overlay holding the recovered state of a read-only open.
    pub dev: Arc<dyn BlockDevice>,
    /// The overlay, when there is one (a read-only open that had something
    /// to recover); the caller may write fast-commit replay and orphan
    /// cleanup into it.
    pub overlay: Option<Arc<OverlayDevice>>,
    /// Fast-commit records to apply after the replayed blocks.
    pub fast_commits: Vec<Record>,
    /// What the user should know, one line each.
    pub warnings: Vec<String>,
    /// Whether the journal was replayed (blocks written home or overlaid).
    pub replayed: bool,
}

/// Read the primary superblock straight from `dev`.
pub fn read_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let mut raw = vec![0u8; Superblock::SIZE];
    dev.read_at(SUPERBLOCK_OFFSET, &mut raw)
        .map_err(|e| Error::io("reading the superblock (bytes 1024..2048)", e))?;
    Superblock::parse(&raw).map_err(|e| Error::corrupt("superblock at byte 1024", e))
}

fn write_superblock(dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    dev.write_at(SUPERBLOCK_OFFSET, &sb.to_bytes_with_checksum())
        .map_err(|e| Error::io("writing the superblock after journal recovery", e))
}

/// Whether the filesystem on `dev` has orphans to clean up (the classic
/// chain or the orphan file's `orphan_present`).
pub fn has_orphans(sb: &Superblock) -> bool {
    sb.last_orphan != 0 || sb.has_ro_compat(ro_compat::ORPHAN_PRESENT)
}

/// Recover the journal of the filesystem on `dev` if it needs it, as the
/// module doc describes; return the device to open. The steps as e2fsck's
/// `e2fsck_run_ext3_journal` takes them: whether to replay at all, load
/// the journal, run recovery and judge its outcome, replay.
pub fn recover(dev: Arc<dyn BlockDevice>, opts: &OpenOptions) -> Result<Recovered> {
    let sb = read_superblock(&*dev)?;
    let read_only = opts.read_only || dev.read_only();
    let mut out = Recovered {
        dev: dev.clone(),
        overlay: None,
        fast_commits: Vec::new(),
        warnings: Vec::new(),
        replayed: false,
    };
    match what_to_do(&sb, opts, read_only, &mut out.warnings)? {
        Todo::Nothing => return Ok(out),
        Todo::Discard => return discard(out, dev, sb, read_only),
        Todo::Replay => {}
    }
    let Some(journal) = load_for_replay(&dev, &sb, read_only, &mut out.warnings)? else {
        return discard(out, dev, sb, read_only);
    };
    let rec = ext4kit_jbd2::recover(&journal);
    judge(&rec, read_only, &mut out.warnings)?;
    replay(out, &journal, &rec, &sb, read_only)
}

/// What recovery does with a filesystem.
enum Todo {
    /// Nothing: no recovery needed, or replay skipped on purpose.
    Nothing,
    /// Clear `needs_recovery` without replaying (there is no journal).
    Discard,
    /// Load the journal and replay it.
    Replay,
}

/// Whether the filesystem with superblock `sb` is to be replayed; what the
/// user should know goes to `warnings`.
fn what_to_do(sb: &Superblock, opts: &OpenOptions, read_only: bool, warnings: &mut Vec<String>) -> Result<Todo> {
    if !sb.has_incompat(incompat::RECOVER) {
        return Ok(Todo::Nothing);
    }
    if opts.no_replay {
        if !read_only {
            return Err(Error::posix(
                Errno::EINVAL,
                "the journal needs recovery: a read-write open must replay it (no_replay is for read-only opens)",
            ));
        }
        warnings.push(
            "the journal needs recovery and was not replayed (no-replay): showing the home locations as they are, \
             without the transactions the journal holds"
                .to_string(),
        );
        return Ok(Todo::Nothing);
    }
    if !sb.has_compat(compat::HAS_JOURNAL) {
        // needs_recovery without a journal: e2fsck clears the flag
        // (PR_0_JOURNAL_RECOVER_SET); there is nothing to replay.
        warnings.push("needs_recovery is set but the filesystem has no journal: nothing to replay".to_string());
        return Ok(Todo::Discard);
    }
    if sb.journal_uuid != [0; 16] {
        return Err(Error::Unsupported(format!(
            "the journal needs recovery but lives on an external device (journal UUID {}): ext4kit replays internal \
             journals only; replay it with `e2fsck -E journal_only -j JOURNAL_DEVICE IMAGE`, or open with --no-replay \
             to see the home locations",
            uuid_string(&sb.journal_uuid)
        )));
    }
    Ok(Todo::Replay)
}

/// The journal to replay; `None` when it cannot be replayed and a
/// read-only open shows the filesystem without it (e2fsck -y discards such
/// a journal: nothing is replayed and the filesystem is marked not clean).
fn load_for_replay(
    dev: &Arc<dyn BlockDevice>,
    sb: &Superblock,
    read_only: bool,
    warnings: &mut Vec<String>,
) -> Result<Option<Journal>> {
    let journal = match load(dev, sb) {
        Ok(j) => j,
        Err(JournalTrouble::Io(e)) => return Err(e),
        Err(JournalTrouble::Bad(why)) => {
            if !read_only {
                return Err(Error::posix(
                    Errno::EUCLEAN,
                    format!(
                        "the journal needs recovery but cannot be replayed: {why}; nothing was written. Run e2fsck \
                         (it discards the journal), or open read-only to see the filesystem without it"
                    ),
                ));
            }
            warnings.push(format!(
                "the journal needs recovery but cannot be replayed: {why}; showing the filesystem without it, as \
                 e2fsck leaves it after discarding the journal; run e2fsck"
            ));
            return Ok(None);
        }
    };
    for n in &journal.notes {
        warnings.push(format!("journal: {n}"));
    }
    Ok(Some(journal))
}

/// Judge recovery's outcome: a failure or a corrupt commit refuses a
/// read-write open, as the kernel's mount does (`jbd2_journal_load` fails
/// with -EFSCORRUPTED); a read-only open shows what can be replayed, with
/// warnings.
fn judge(rec: &Recovery, read_only: bool, warnings: &mut Vec<String>) -> Result<()> {
    if let Some(f) = &rec.failure {
        if !read_only {
            return Err(Error::posix(
                Errno::EUCLEAN,
                format!(
                    "journal recovery failed: {f}; nothing was written. Run e2fsck (it replays what it can and \
                     repairs the rest), or open read-only to see what can be recovered"
                ),
            ));
        }
        warnings.push(format!(
            "journal recovery failed ({f}): showing what could be replayed, as e2fsck would leave it; run e2fsck"
        ));
        for p in rec.problems.iter().filter(|p| **p != f.to_string()) {
            warnings.push(format!("journal: {p}"));
        }
    }
    if let Some(t) = rec.failed_commit {
        if !read_only {
            return Err(Error::posix(
                Errno::EUCLEAN,
                format!(
                    "journal transaction {t} is corrupt (its commit checksum fails); nothing was written. Run e2fsck \
                     (it replays the transactions before it), or open read-only to see that result"
                ),
            ));
        }
        warnings.push(format!(
            "journal transaction {t} was corrupt, replay was aborted there (the filesystem is marked as having errors; \
             run e2fsck)"
        ));
    }
    Ok(())
}

/// Replay `rec` of `journal`: home on a read-write open, into an overlay
/// on a read-only one; then the journal superblock and the filesystem's
/// state as e2fsck leaves them.
fn replay(
    mut out: Recovered,
    journal: &Journal,
    rec: &Recovery,
    sb: &Superblock,
    read_only: bool,
) -> Result<Recovered> {
    let target: Arc<dyn BlockDevice> = if read_only {
        let o = Arc::new(OverlayDevice::new(out.dev.clone(), sb.block_size() as u64));
        out.overlay = Some(o.clone());
        o
    } else {
        out.dev.clone()
    };
    apply(
        journal,
        rec,
        &*target,
        out.overlay.as_deref(),
        sb.blocks_count(),
        &mut out.warnings,
    )?;
    out.replayed = true;
    out.fast_commits = rec.fast_commits.clone();
    let n = rec.end_transaction.wrapping_sub(rec.start_transaction);
    out.warnings.push(format!(
        "the journal needed recovery: replayed {n} transaction(s) ({}..{}), {} block(s){}{}",
        rec.start_transaction,
        rec.end_transaction,
        rec.replay.len(),
        if rec.fast_commits.is_empty() {
            String::new()
        } else {
            format!(", and {} fast-commit record(s)", rec.fast_commits.len())
        },
        if read_only {
            " in memory; the image file was not changed"
        } else {
            " to the image"
        }
    ));
    // The journal superblock as e2fsck leaves it: an empty log restarting
    // after the last transaction. A failed commit, or an errno the journal
    // already carried, becomes the filesystem's error state and the
    // journal's errno is cleared (`e2fsck_check_ext3_journal`).
    let jsb = journal.reset_superblock(rec.end_transaction.wrapping_add(1), 0);
    let at = journal
        .device_offset(0)
        .ok_or_else(|| Error::corrupt_msg("journal", "journal inode", "block 0 of the journal is not mapped"))?;
    target
        .write_at(at, &jsb)
        .map_err(|e| Error::io("writing the journal superblock after recovery", e))?;
    // The superblock may itself have been replayed: read it back.
    let sb = read_superblock(&*target)?;
    let error_state = journal.sb.errno != 0 || rec.failed_commit.is_some();
    if journal.sb.errno != 0 {
        out.warnings.push(format!(
            "the journal recorded an error (errno {}): the filesystem is marked as having errors; run e2fsck",
            journal.sb.errno as i32
        ));
    }
    out.dev = target;
    finish_state(out, sb, read_only, error_state, rec.failure.is_some())
}

/// Open the filesystem on `dev` — recovered already (see [`recover`]) —
/// with its journal started for writing when the open is read-write and
/// the filesystem has one: the one way a library user gets a volume whose
/// changes go through the log.
pub fn open_volume(dev: Arc<dyn BlockDevice>, opts: &OpenOptions) -> Result<Volume> {
    let mut vol = Volume::open(dev.clone(), opts)?;
    if !vol.read_only() && vol.geo().has_compat(compat::HAS_JOURNAL) {
        vol.start_journal(open_journal(&dev), opts.commit_interval);
    }
    Ok(vol)
}

/// The journal of the filesystem on `dev`, loaded for inspection
/// (`ext4kit journal`): the same search and checks as recovery, with the
/// reason as an error when it cannot be loaded.
pub fn open_journal(dev: &Arc<dyn BlockDevice>) -> Result<Journal> {
    let sb = read_superblock(&**dev)?;
    if !sb.has_compat(compat::HAS_JOURNAL) {
        return Err(Error::posix(
            Errno::ENOENT,
            "the filesystem has no journal (has_journal is off)",
        ));
    }
    if sb.journal_uuid != [0; 16] {
        return Err(Error::Unsupported(format!(
            "the journal lives on an external device (journal UUID {}); ext4kit reads internal journals only",
            uuid_string(&sb.journal_uuid)
        )));
    }
    load(dev, &sb).map_err(|t| match t {
        JournalTrouble::Io(e) => e,
        JournalTrouble::Bad(why) => Error::corrupt_msg("journal", "journal", why),
    })
}

/// A journal that cannot be replayed (`Bad`) or a device that cannot be
/// read (`Io`).
enum JournalTrouble {
    Bad(String),
    Io(Error),
}

/// Locate and load the inode journal (`e2fsck_get_journal` and
/// `e2fsck_journal_load`), falling back to the superblock's backup of the
/// journal inode's block map (`s_jnl_blocks`) when the inode is unusable.
fn load(dev: &Arc<dyn BlockDevice>, sb: &Superblock) -> std::result::Result<Journal, JournalTrouble> {
    let bs = sb.block_size() as usize;
    let vol = Volume::open(
        dev.clone(),
        &OpenOptions {
            read_only: true,
            cache_budget: 4 << 20,
            no_replay: true,
            ..Default::default()
        },
    )
    .map_err(JournalTrouble::Io)?;
    let ino = sb.journal_inum;
    if ino == 0 || ino > sb.inodes_count {
        return Err(JournalTrouble::Bad(format!(
            "has_journal is set but s_journal_inum is {ino}, not an inode"
        )));
    }
    let from_inode = inode::read(&vol, ino)
        .map_err(|e| format!("journal inode {ino}: {e}"))
        .and_then(|inode| journal_map(&vol, ino, &inode));
    let (map, len) = match from_inode {
        Ok(m) => m,
        Err(why) => {
            if sb.jnl_backup_type != JNL_BACKUP_BLOCKS {
                return Err(JournalTrouble::Bad(why));
            }
            let inode = backup_inode(sb);
            journal_map(&vol, ino, &inode)
                .map_err(|e| JournalTrouble::Bad(format!("{why}; its backup in the superblock: {e}")))?
        }
    };
    Journal::load(dev.clone(), map, bs, len, true).map_err(|e| match e {
        LoadError::Io(e) => JournalTrouble::Io(Error::io("reading the journal superblock", e)),
        other => JournalTrouble::Bad(other.to_string()),
    })
}

/// The journal inode's block map and length in blocks, with e2fsck's
/// checks: a regular file with links, at least 1024 blocks, every block up
/// to its size mapped, inside the filesystem.
fn journal_map(vol: &Volume, ino: u32, inode: &Inode) -> std::result::Result<(JournalMap, u32), String> {
    let bs = vol.block_size() as u64;
    if inode.base.links_count == 0 || inode.file_type() != Some(FileType::Regular) {
        return Err(format!("journal inode {ino} is not a regular file in use"));
    }
    let blocks = inode.size() / bs;
    if blocks < ext4kit_jbd2::journal::MIN_JOURNAL_BLOCKS as u64 || blocks > u32::MAX as u64 {
        return Err(format!(
            "journal inode {ino} holds {blocks} blocks (too small or too large)"
        ));
    }
    let runs = bmap::load(vol, ino, inode)
        .and_then(|m| m.runs(vol, blocks))
        .map_err(|e| format!("journal inode {ino}: {e}"))?;
    for &(_, p, n) in &runs {
        if p < vol.geo().first_data_block() || p.checked_add(n).is_none_or(|e| e > vol.geo().blocks_count()) {
            return Err(format!(
                "journal inode {ino} maps blocks {p}..{} outside the filesystem",
                p.saturating_add(n)
            ));
        }
    }
    let map = JournalMap::new(runs).map_err(|e| format!("journal inode {ino}: {e}"))?;
    if map.mapped_prefix() < blocks {
        return Err(format!(
            "journal inode {ino} has a hole at block {} of {blocks}",
            map.mapped_prefix()
        ));
    }
    Ok((map, blocks as u32))
}

/// An inode made from `s_jnl_blocks`, as e2fsck builds it.
fn backup_inode(sb: &Superblock) -> Inode {
    let Ok(mut inode) = Inode::parse_raw(&[0u8; 128]) else {
        unreachable!("a zeroed 128-byte inode record always parses")
    };
    let mut iblock = [0u8; 60];
    for (i, w) in sb.jnl_blocks[..15].iter().enumerate() {
        iblock[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
    }
    inode.base.block = iblock;
    inode.base.size_high = sb.jnl_blocks[15];
    inode.base.size_lo = sb.jnl_blocks[16];
    inode.base.links_count = 1;
    inode.base.mode = 0o100600;
    // An extent root in the backup (0xF30A magic) needs the extents flag,
    // which the backup does not carry.
    if u16::from_le_bytes([iblock[0], iblock[1]]) == 0xF30A {
        inode.base.flags |= ext4kit_format::inode::flags::EXTENTS;
    }
    inode
}

/// Write the plan's blocks home, in block order, or redirect them in
/// `overlay` when there is one (a redirect costs no copy). A target outside
/// the filesystem is skipped with a warning (the kernel would fail that
/// write).
fn apply(
    journal: &Journal,
    rec: &Recovery,
    target: &dyn BlockDevice,
    overlay: Option<&OverlayDevice>,
    blocks_count: u64,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let bs = journal.block_size;
    let mut buf = vec![0u8; bs];
    for (&blk, logged) in &rec.replay {
        if blk == 0 && bs == 1024 || blk >= blocks_count {
            warnings.push(format!(
                "journal: a logged copy names block {blk}, outside the filesystem ({blocks_count} blocks); skipped"
            ));
            continue;
        }
        let from = journal.device_offset(logged.log_block).ok_or_else(|| {
            Error::corrupt_msg(
                "journal",
                "journal inode",
                format!("journal block {} is not mapped", logged.log_block),
            )
        })?;
        let head = logged.escaped.then(|| JBD2_MAGIC.to_be_bytes());
        if let Some(o) = overlay {
            o.redirect(blk, from, head)
                .map_err(|e| Error::io(format!("replaying block {blk} into memory"), e))?;
        } else {
            journal
                .read_block(logged.log_block, &mut buf)
                .map_err(|e| Error::io(format!("reading journal block {}", logged.log_block), e))?;
            if let Some(h) = head {
                buf[..4].copy_from_slice(&h);
            }
            target
                .write_at(blk * bs as u64, &buf)
                .map_err(|e| Error::io(format!("replaying block {blk} from the journal"), e))?;
        }
    }
    if overlay.is_none() {
        target
            .flush()
            .map_err(|e| Error::io("flushing the replayed blocks", e))?;
    }
    Ok(())
}

/// Clear `needs_recovery` on a filesystem whose journal was discarded or
/// absent (nothing replayed), in an overlay for a read-only open; the
/// filesystem is marked not clean, as e2fsck marks it.
fn discard(mut out: Recovered, dev: Arc<dyn BlockDevice>, sb: Superblock, read_only: bool) -> Result<Recovered> {
    if read_only {
        let o = Arc::new(OverlayDevice::new(dev, sb.block_size() as u64));
        out.overlay = Some(o.clone());
        out.dev = o;
    }
    finish_state(out, sb, read_only, false, true)
}

/// Write the superblock with `needs_recovery` cleared (and the error or
/// not-clean state e2fsck would record), then flush a real device.
fn finish_state(
    out: Recovered,
    mut sb: Superblock,
    read_only: bool,
    error_state: bool,
    not_clean: bool,
) -> Result<Recovered> {
    sb.feature_incompat &= !incompat::RECOVER;
    if not_clean {
        sb.state &= !STATE_VALID;
    }
    if error_state {
        sb.state |= STATE_ERROR;
    }
    write_superblock(&*out.dev, &sb)?;
    if !read_only {
        out.dev
            .flush()
            .map_err(|e| Error::io("flushing the superblock after journal recovery", e))?;
    }
    Ok(out)
}

fn uuid_string(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}
