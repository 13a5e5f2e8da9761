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
//! - aborts the journal (`jbd2_journal_abort`, the journal's own state:
//!   the caller aborts it before recording here): the running transaction,
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
use ext4kit_format::time::Clock;
use parking_lot::Mutex;

use crate::disk::Disk;
use crate::error::{Error, Result};
use crate::superblock::SuperState;

/// `EXT4_ERR_EFSCORRUPTED`: the code `s_first_error_errcode` /
/// `s_last_error_errcode` store for corruption.
const ERRCODE_EFSCORRUPTED: u8 = 5;

/// What the volume knows of damage met while writing.
///
/// Locking: the flag is an atomic (set once, never cleared while open);
/// the first error's text has its own mutex, held only to read or set it.
#[derive(Debug, Default)]
pub struct FsErrors {
    failed: AtomicBool,
    first: Mutex<Option<String>>,
    /// Where `s_first_error_time` / `s_last_error_time` come from.
    clock: Clock,
}

impl FsErrors {
    /// No error yet; errors will be stamped with `clock`'s time.
    pub fn new(clock: Clock) -> Self {
        FsErrors {
            clock,
            ..FsErrors::default()
        }
    }

    /// Whether writes are refused.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The first error recorded.
    pub fn first(&self) -> Option<String> {
        self.first.lock().clone()
    }

    /// The error a write meets once the volume is in the error state.
    pub fn refused_after_error(&self) -> Error {
        let first = self.first().unwrap_or_else(|| "an operation failed part-way".into());
        Error::corrupt_msg(
            "filesystem",
            "error state",
            format!("writes are refused since damage was found: {first}"),
        )
    }

    /// Enter the error state because of `what` (see the module doc):
    /// record the error in the superblock `sup` and in its copy at home on
    /// `disk`. Returns whether this was the first error.
    pub fn record(&self, what: &str, sup: &SuperState, disk: &Disk) -> bool {
        let first = !self.failed.swap(true, Ordering::AcqRel);
        {
            let mut f = self.first.lock();
            if f.is_none() {
                *f = Some(what.to_string());
            }
        }
        if let Err(e) = record_error_at_home(sup, disk, self.clock.now().sec) {
            // The error state holds in memory; the superblock could not
            // say so (a device error): nothing more to do than report.
            eprintln!("ext4kit: recording the error in the superblock failed: {e}");
        }
        first
    }
}

/// Set the error fields (times: `now`) in the in-memory superblock and in
/// the copy at home (read, changed, written back: the home copy is the last
/// checkpointed one, and nothing uncommitted may reach it).
fn record_error_at_home(sup: &SuperState, disk: &Disk, now: i64) -> Result<()> {
    let set = |sb: &mut Superblock| {
        sb.state |= STATE_ERROR;
        sb.error_count = sb.error_count.saturating_add(1);
        let mut func = [0u8; 32];
        func[..7].copy_from_slice(b"ext4kit");
        if sb.first_error_time() == 0 {
            sb.set_first_error_time(now);
            sb.first_error_func = func;
            sb.first_error_errcode = ERRCODE_EFSCORRUPTED;
        }
        sb.set_last_error_time(now);
        sb.last_error_func = func;
        sb.last_error_errcode = ERRCODE_EFSCORRUPTED;
    };
    let _g = sup.update_lock();
    set(&mut sup.write());
    if disk.read_only() {
        return Ok(());
    }
    let dev = disk.device();
    let mut raw = vec![0u8; Superblock::SIZE];
    dev.read_at(SUPERBLOCK_OFFSET, &mut raw)
        .map_err(|e| Error::io("reading the superblock", e))?;
    let mut sb = Superblock::parse(&raw).map_err(|e| Error::corrupt("superblock at byte 1024", e))?;
    set(&mut sb);
    dev.write_at(SUPERBLOCK_OFFSET, &sb.to_bytes_with_checksum())
        .map_err(|e| Error::io("writing the superblock", e))?;
    dev.flush().map_err(|e| Error::io("flushing the superblock", e))
}
