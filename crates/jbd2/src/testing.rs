//! A filesystem in memory for the journal's own tests: [`Mem`] implements
//! [`Buffers`] over a block device laid out as
//!
//! - block 0: the "superblock", whose byte 0 is the needs-recovery flag;
//! - blocks `1..FS_BLOCKS`: metadata blocks, each a version byte repeated;
//! - blocks `JOURNAL_START..`: the journal (`JOURNAL_LEN` blocks), mapped
//!   in runs of [`JOURNAL_RUN`] blocks placed in reverse order, as a
//!   fragmented journal inode maps it: a transaction's log blocks are then
//!   several device writes, which a power cut may keep or lose apart.
//!
//! and [`recovered`] is what a mount makes of a device image after a power
//! cut: if the flag is set, the journal's recovery replayed home.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use ext4kit_blockdev::{BlockDevice, MemDevice};
use ext4kit_format::jbd2::{features, JournalSuperblock, JBD2_MAGIC};
use parking_lot::Mutex;

use crate::buffers::{Buffer, Buffers, Error};
use crate::journal::{Journal, JournalMap};

/// Bytes per block.
pub(crate) const BS: usize = 1024;
/// Blocks of the filesystem area (superblock included).
pub(crate) const FS_BLOCKS: u64 = 64;
/// First block of the journal.
pub(crate) const JOURNAL_START: u64 = FS_BLOCKS;
/// Blocks of the journal.
pub(crate) const JOURNAL_LEN: u32 = 1100;
/// Blocks per run of the journal's map.
pub(crate) const JOURNAL_RUN: u32 = 5;
/// The device's size in bytes.
pub(crate) const DEV_BYTES: usize = (JOURNAL_START as usize + JOURNAL_LEN as usize) * BS;
/// What the writer asks of the journal superblock (as ext4 on a 64bit,
/// metadata_csum filesystem).
pub(crate) const WANT: u32 = features::INCOMPAT_REVOKE | features::INCOMPAT_64BIT | features::INCOMPAT_CSUM_V3;

/// One block version: bytes and a dirty bit.
#[derive(Debug)]
pub(crate) struct MemBuffer {
    data: Box<[u8]>,
    dirty: AtomicBool,
}

impl Buffer for MemBuffer {
    fn data(&self) -> &[u8] {
        &self.data
    }

    fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }
}

/// The filesystem's side (see the module doc).
pub(crate) struct Mem {
    dev: Arc<dyn BlockDevice>,
    current: Mutex<HashMap<u64, Arc<MemBuffer>>>,
    home_writes: Mutex<Vec<(u64, usize)>>,
    fail: AtomicBool,
    refuse_log: AtomicBool,
    limit: AtomicUsize,
}

impl Mem {
    /// Over a fresh memory device (no journal written).
    pub(crate) fn new() -> Mem {
        Mem::over(Arc::new(MemDevice::new(DEV_BYTES)))
    }

    /// Over `dev`.
    pub(crate) fn over(dev: Arc<dyn BlockDevice>) -> Mem {
        Mem {
            dev,
            current: Mutex::new(HashMap::new()),
            home_writes: Mutex::new(Vec::new()),
            fail: AtomicBool::new(false),
            refuse_log: AtomicBool::new(false),
            limit: AtomicUsize::new(1 << 20),
        }
    }

    /// A handle's change of `block`: a new version, every byte `v`.
    pub(crate) fn change(&self, block: u64, v: u8) {
        let b = MemBuffer {
            data: vec![v; BS].into_boxed_slice(),
            dirty: AtomicBool::new(true),
        };
        self.current.lock().insert(block, Arc::new(b));
    }

    /// `block` was freed: the cache forgets it.
    pub(crate) fn forget(&self, block: u64) {
        self.current.lock().remove(&block);
    }

    /// The device.
    pub(crate) fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// What the device holds at `block`'s home.
    pub(crate) fn home(&self, block: u64) -> Vec<u8> {
        let mut b = vec![0u8; BS];
        self.dev.read_at(block * BS as u64, &mut b).unwrap();
        b
    }

    /// Home writes so far: (first block, blocks).
    pub(crate) fn home_writes(&self) -> Vec<(u64, usize)> {
        self.home_writes.lock().clone()
    }

    /// Make home writes fail (a device error) or succeed again.
    pub(crate) fn fail_home_writes(&self, fail: bool) {
        self.fail.store(fail, Ordering::Relaxed);
    }

    /// Refuse every log write (as a filesystem whose journal shares a
    /// block with a file does), or allow them again.
    pub(crate) fn refuse_log(&self, refuse: bool) {
        self.refuse_log.store(refuse, Ordering::Relaxed);
    }

    /// Set the checkpoint set's limit.
    pub(crate) fn set_limit(&self, blocks: usize) {
        self.limit.store(blocks, Ordering::Relaxed);
    }

    /// The needs-recovery flag at home.
    pub(crate) fn needs_recovery_at_home(&self) -> bool {
        self.home(0)[0] == 1
    }
}

impl Buffers for Mem {
    type Buffer = MemBuffer;
    type Error = Error;

    fn capture(&self, block: u64) -> Option<Arc<MemBuffer>> {
        self.current.lock().get(&block).cloned()
    }

    fn written_home(&self, _block: u64, version: &Arc<MemBuffer>) {
        version.dirty.store(false, Ordering::Release);
    }

    fn write_home(&self, block: u64, data: &[u8]) -> Result<(), Error> {
        assert!(
            (1..FS_BLOCKS).contains(&block),
            "a home write outside the filesystem: block {block}"
        );
        if self.fail.load(Ordering::Relaxed) {
            return Err(dev_error("a home write", io::Error::other("injected")));
        }
        self.home_writes.lock().push((block, data.len() / BS));
        self.dev
            .write_at(block * BS as u64, data)
            .map_err(|e| dev_error("a home write", e))
    }

    fn flush(&self) -> Result<(), Error> {
        self.dev.flush().map_err(|e| dev_error("a flush", e))
    }

    fn set_needs_recovery(&self, on: bool) -> Result<(), Error> {
        self.dev
            .write_at(0, &[u8::from(on)])
            .map_err(|e| dev_error("the flag", e))
    }

    fn checkpoint_limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    fn check_log_writable(&self) -> Result<(), Error> {
        if self.refuse_log.load(Ordering::Relaxed) {
            return Err(dev_error("the log", io::Error::other("refused by the filesystem")));
        }
        Ok(())
    }
}

fn dev_error(what: &str, source: io::Error) -> Error {
    Error::Log {
        what: what.into(),
        source,
    }
}

/// The journal's map (see the module doc).
fn journal_map() -> JournalMap {
    let runs = JOURNAL_LEN / JOURNAL_RUN;
    JournalMap::new(
        (0..runs)
            .map(|i| {
                let phys = JOURNAL_START + u64::from((runs - 1 - i) * JOURNAL_RUN);
                (u64::from(i * JOURNAL_RUN), phys, u64::from(JOURNAL_RUN))
            })
            .collect(),
    )
    .unwrap()
}

/// Write an empty journal (`s_start` 0, first transaction 1) on `dev`.
pub(crate) fn format_journal(dev: &dyn BlockDevice) {
    let sb = JournalSuperblock::new_internal(BS as u32, JOURNAL_LEN, [3; 16], 0);
    let at = journal_map().physical(0).unwrap() * BS as u64;
    dev.write_at(at, &sb.to_bytes_with_checksum()).unwrap();
}

/// The journal of `dev` (see [`format_journal`]), loaded.
pub(crate) fn load_journal(dev: Arc<dyn BlockDevice>) -> Journal {
    Journal::load(dev, journal_map(), BS, JOURNAL_LEN, true).unwrap()
}

/// A device image after a power cut, mounted: when the needs-recovery
/// flag is set, the journal's recovery writes its plan home. Returns the
/// first byte of each filesystem block (`0..FS_BLOCKS`), and asserts that
/// each block is whole (one version, not a mix).
pub(crate) fn recovered(img: Vec<u8>) -> Vec<u8> {
    let mem = Arc::new(MemDevice::from_vec(img));
    let dev: Arc<dyn BlockDevice> = mem.clone();
    if mem.to_vec()[0] == 1 {
        let j = load_journal(dev.clone());
        let r = crate::recover(&j);
        assert_eq!(r.failure, None, "{:?}", r.problems);
        let mut buf = vec![0u8; BS];
        for (&b, l) in &r.replay {
            j.read_block(l.log_block, &mut buf).unwrap();
            if l.escaped {
                buf[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
            }
            dev.write_at(b * BS as u64, &buf).unwrap();
        }
    }
    let img = mem.to_vec();
    (0..FS_BLOCKS as usize)
        .map(|b| {
            let blk = &img[b * BS..(b + 1) * BS];
            if b > 0 {
                assert!(blk.iter().all(|&x| x == blk[0]), "block {b} is torn: {blk:?}");
            }
            blk[0]
        })
        .collect()
}
