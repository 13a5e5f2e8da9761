//! The filesystem's error state: the kernel's `ext4_error` and
//! `errors=remount-ro`, for damage found in the middle of a change.
//!
//! Most damage is found before an operation changes anything (the write
//! paths check what they will touch first: `release_check.rs`, the
//! allocators' bitmap checks) and the operation is simply refused. When
//! damage is met only after a handle has changed blocks
//! ([`crate::transaction::Handle`] dropped without `commit`, with a
//! corruption error raised on its thread since it began), the volume:
//!
//! - records the error in the superblock at home — `s_state`'s error bit,
//!   `s_error_count`, first and last error time, inode, block, function and
//!   code — as the kernel's `__ext4_error` → `ext4_commit_super` does, so
//!   that `e2fsck -p` checks the filesystem at the next boot ("contains a
//!   file system with errors");
//! - aborts the journal (`jbd2_journal_abort`): the running transaction,
//!   which holds the failed operation's half-made change, is never
//!   committed, and nothing more is checkpointed, so the disk keeps the
//!   last committed, consistent state (the log replays at the next open);
//! - refuses every later write with a message that names the first damage
//!   and says "run e2fsck".
//!
//! Without a journal there is nothing to abort: the half-made change is
//! written as the kernel's ext2 writes it, and the write paths order their
//! steps so that it is at most a leak.

use std::sync::atomic::{AtomicBool, Ordering};

use ext4kit_format::superblock::{Superblock, STATE_ERROR, SUPERBLOCK_OFFSET};
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::volume::Volume;

/// `EXT4_ERR_EFSCORRUPTED`: the code `s_first_error_errcode` /
/// `s_last_error_errcode` store for corruption.
const ERRCODE_EFSCORRUPTED: u8 = 5;

/// What the volume knows of damage met while writing.
#[derive(Debug, Default)]
pub struct FsErrors {
    failed: AtomicBool,
    journal_aborted: AtomicBool,
    first: Mutex<Option<String>>,
}

impl FsErrors {
    /// Whether writes are refused.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Whether the journal was aborted (no commit, no checkpoint).
    pub fn journal_aborted(&self) -> bool {
        self.journal_aborted.load(Ordering::Acquire)
    }

    /// The first error recorded.
    pub fn first(&self) -> Option<String> {
        self.first.lock().clone()
    }
}

impl Volume {
    /// The error a write meets once the volume is in the error state.
    pub fn refused_after_error(&self) -> Error {
        let first = self
            .fs_errors
            .first()
            .unwrap_or_else(|| "an operation failed part-way".into());
        Error::corrupt_msg(
            "filesystem",
            "error state",
            format!("writes are refused since damage was found: {first}"),
        )
    }

    /// Enter the error state because of `what` (see the module doc):
    /// abort the journal, record the error in the superblock at home.
    /// Returns whether this was the first error.
    pub fn fs_error(&self, what: &str) -> bool {
        if self.jbd.is_some() {
            self.fs_errors.journal_aborted.store(true, Ordering::Release);
        }
        let first = !self.fs_errors.failed.swap(true, Ordering::AcqRel);
        {
            let mut f = self.fs_errors.first.lock();
            if f.is_none() {
                *f = Some(what.to_string());
            }
        }
        if let Err(e) = self.record_error_at_home() {
            // The error state holds in memory; the superblock could not
            // say so (a device error): nothing more to do than report.
            eprintln!("ext4kit: recording the error in the superblock failed: {e}");
        }
        first
    }

    /// Set the error fields in the in-memory superblock and in the copy at
    /// home (read, changed, written back: the home copy is the last
    /// checkpointed one, and nothing uncommitted may reach it).
    fn record_error_at_home(&self) -> Result<()> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let set = |sb: &mut Superblock| {
            sb.state |= STATE_ERROR;
            sb.error_count = sb.error_count.saturating_add(1);
            let mut func = [0u8; 32];
            func[..7].copy_from_slice(b"ext4kit");
            if sb.first_error_time() == 0 {
                sb.set_first_error_time(now as i64);
                sb.first_error_func = func;
                sb.first_error_errcode = ERRCODE_EFSCORRUPTED;
            }
            sb.set_last_error_time(now as i64);
            sb.last_error_func = func;
            sb.last_error_errcode = ERRCODE_EFSCORRUPTED;
        };
        let _g = self.sb_lock.lock();
        set(&mut self.sb.write());
        if self.read_only {
            return Ok(());
        }
        let mut raw = vec![0u8; Superblock::SIZE];
        self.device()
            .read_at(SUPERBLOCK_OFFSET, &mut raw)
            .map_err(|e| Error::io("reading the superblock", e))?;
        let mut sb = Superblock::parse(&raw).map_err(|e| Error::corrupt("superblock at byte 1024", e))?;
        set(&mut sb);
        self.device()
            .write_at(SUPERBLOCK_OFFSET, &sb.to_bytes_with_checksum())
            .map_err(|e| Error::io("writing the superblock", e))?;
        self.device()
            .flush()
            .map_err(|e| Error::io("flushing the superblock", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{scratch_volume, scratch_volume_unjournaled};

    fn home_sb(v: &Volume) -> Superblock {
        let mut raw = vec![0u8; Superblock::SIZE];
        v.device().read_at(SUPERBLOCK_OFFSET, &mut raw).unwrap();
        Superblock::parse(&raw).unwrap()
    }

    /// A handle that changed a block and then met damage: nothing of it is
    /// committed, the error is recorded at home, later writes are refused.
    #[test]
    fn damage_met_half_way_aborts_the_journal_and_refuses_writes() {
        let v = scratch_volume();
        let blk = v.groups[0].meta.2 + 100; // unused inode-table block
        let mut before = vec![0u8; v.block_size];
        v.read_raw(blk, &mut before).unwrap();
        let r: Result<()> = (|| {
            let mut h = v.begin()?;
            h.modify(blk, |d| {
                d[9] ^= 0x5a;
                Ok(())
            })?;
            Err(Error::corrupt_msg("block 1234", "extent index", "a made-up node"))
        })();
        assert!(r.is_err());
        assert!(v.fs_errors.failed() && v.fs_errors.journal_aborted());
        let sb = home_sb(&v);
        assert_ne!(sb.state & STATE_ERROR, 0, "the error bit is set at home");
        assert_eq!(sb.error_count, 1);
        assert_eq!(&sb.first_error_func[..7], b"ext4kit");
        let e = v.begin().expect_err("writes are refused").to_string();
        assert!(e.contains("run e2fsck") && e.contains("damage"), "{e}");
        assert!(v.commit_running().is_err(), "the aborted journal commits nothing");
        let mut after = vec![0u8; v.block_size];
        v.read_raw(blk, &mut after).unwrap();
        assert_eq!(before, after, "the half-made change never reached home");
        let j = crate::journal::open_journal(v.device()).unwrap();
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
        let blk = v.groups[0].meta.2 + 100;
        let r: Result<()> = (|| {
            let mut h = v.begin()?;
            h.modify(blk, |d| {
                d[9] ^= 0x5a;
                Ok(())
            })?;
            Err(Error::posix(crate::error::Errno::ENOSPC, "full"))
        })();
        assert!(r.is_err());
        assert!(!v.fs_errors.failed());
        assert!(v.begin().is_ok());
        assert_eq!(home_sb(&v).state & STATE_ERROR, 0);
    }
}
