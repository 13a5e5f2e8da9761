//! A recording device for crash tests, and the crash images its log
//! implies.
//!
//! [`RecordingDevice`] wraps any [`BlockDevice`]: reads, writes and flushes
//! pass through to it, and every write (offset and bytes) and every flush
//! is appended, in the order the inner device saw them, to a [`WriteLog`].
//! From that log and the bytes the device held when recording began, the
//! log rebuilds the images a power cut could leave ([`CrashPoint`]):
//!
//! - **at a flush** (`flush@N`): every write before flush entry `N`, none
//!   after — the cut falls just as the flush was issued (or completed: the
//!   bytes are the same);
//! - **between two flushes** (`cut@N/SEED`): everything before the last
//!   honoured flush before entry `N` is kept (a completed flush made it
//!   durable); of the writes after that flush and before `N`, a random
//!   subset chosen by `SEED` is dropped — what a volatile disk cache may
//!   lose, in any order. Nothing from entry `N` on is kept.
//!
//! Model of the disk: a write is atomic at the granularity it was issued
//! (no torn sectors); a flush makes every write logged before it durable.
//! Writes are logged under one lock together with the inner write, so the
//! log order is the order the inner device applied them, and replaying the
//! whole log onto the starting bytes gives the inner device's contents
//! (the unit tests check it).
//!
//! Faults for testing the tests: [`RecordingDevice::drop_flushes`] makes
//! chosen flushes *unhonoured* — the caller is told they succeeded, the log
//! records them (so marks taken after them count them), but the crash
//! points treat them as never reaching the disk, so writes before them may
//! still be lost. A harness that trusts such a flush must then report lost
//! data.
//!
//! Memory: entries are 32 bytes each; written bytes go to an in-memory
//! arena or, with [`WriteLog::with_spill`], to a file, so a long run keeps
//! only the index in memory.
//!
//! The log can be saved and loaded in the dm-log-writes format (the
//! kernel's `dm-log-writes` target and xfstests' `replay-log` read and
//! write it): a 512-byte super block (magic `0x6a736677736872`, version 1,
//! entry count, sector size), then per entry a header sector (sector,
//! sector count, flags, data length, then mark text) followed by the data
//! sectors. Flags: FLUSH 1, FUA 2, DISCARD 4, MARK 8, METADATA 16.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::BlockDevice;

/// Sector size of the log: every logged write is widened to whole sectors
/// of this size (dm-log-writes' unit).
pub const SECTOR: u64 = 512;

/// dm-log-writes' magic number ("jsfwshr").
pub const DM_LOG_MAGIC: u64 = 0x006a_7366_7773_6872;
const DM_LOG_VERSION: u64 = 1;
const FLAG_FLUSH: u64 = 1;
const FLAG_FUA: u64 = 2;
const FLAG_DISCARD: u64 = 4;
const FLAG_MARK: u64 = 8;
const FLAG_METADATA: u64 = 16;
/// Longest mark text (the rest of its header sector).
const MAX_MARK: usize = SECTOR as usize - 32;

/// What one log entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// `len` bytes written at `offset`.
    Write,
    /// A cache flush: every write before it is durable once it completes.
    /// `honoured: false` is an injected fault — the caller was told it
    /// succeeded, but crash points treat it as never having happened.
    Flush {
        /// Whether the flush reached the disk.
        honoured: bool,
    },
    /// A label the test put into the log (dm-log-writes' MARK); no I/O.
    Mark,
}

/// One entry of a [`WriteLog`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// What happened.
    pub kind: EntryKind,
    /// Byte offset of a write (0 otherwise).
    pub offset: u64,
    /// Length of a write, or of a mark's text.
    pub len: u32,
    /// A write with FUA (forced unit access): durable when it completes,
    /// so a crash point never drops it. Only logs loaded from elsewhere
    /// have them; [`BlockDevice`] has no FUA write.
    pub fua: bool,
    /// Where the bytes are in the log's store.
    data_at: u64,
}

impl Entry {
    /// Whether this is a write.
    pub fn is_write(&self) -> bool {
        self.kind == EntryKind::Write
    }

    /// Whether this is a flush (honoured or not).
    pub fn is_flush(&self) -> bool {
        matches!(self.kind, EntryKind::Flush { .. })
    }

    /// The bytes a write covers.
    pub fn range(&self) -> Range<u64> {
        self.offset..self.offset + u64::from(self.len)
    }
}

/// Where written bytes are kept.
#[derive(Debug)]
enum Store {
    Mem(Vec<u8>),
    File { file: File, len: u64 },
}

impl Store {
    fn len(&self) -> u64 {
        match self {
            Store::Mem(v) => v.len() as u64,
            Store::File { len, .. } => *len,
        }
    }

    fn append(&mut self, data: &[u8]) -> io::Result<u64> {
        match self {
            Store::Mem(v) => {
                let at = v.len() as u64;
                v.extend_from_slice(data);
                Ok(at)
            }
            Store::File { file, len } => {
                let at = *len;
                file.write_all_at(data, at)?;
                *len += data.len() as u64;
                Ok(at)
            }
        }
    }

    fn read(&self, at: u64, buf: &mut [u8]) -> io::Result<()> {
        match self {
            Store::Mem(v) => {
                let s = usize::try_from(at).map_err(|_| bad("log data offset"))?;
                let src = v.get(s..s + buf.len()).ok_or_else(|| bad("log data past the store"))?;
                buf.copy_from_slice(src);
                Ok(())
            }
            Store::File { file, .. } => file.read_exact_at(buf, at),
        }
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// The ordered record of a device's writes, flushes and marks.
#[derive(Debug)]
pub struct WriteLog {
    entries: Vec<Entry>,
    store: Store,
    flushes: u64,
}

impl Default for WriteLog {
    fn default() -> Self {
        Self::new()
    }
}

impl WriteLog {
    /// An empty log keeping written bytes in memory.
    pub fn new() -> Self {
        WriteLog {
            entries: Vec::new(),
            store: Store::Mem(Vec::new()),
            flushes: 0,
        }
    }

    /// An empty log keeping written bytes in `file` (from its start; its
    /// old contents are overwritten): memory then grows by 32 bytes per
    /// entry only. An unlinked temporary file is the usual choice.
    pub fn with_spill(file: File) -> Self {
        WriteLog {
            entries: Vec::new(),
            store: Store::File { file, len: 0 },
            flushes: 0,
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was logged.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry, in order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Number of flush entries (honoured or not).
    pub fn flushes(&self) -> u64 {
        self.flushes
    }

    /// Bytes of written data held (in memory or in the spill file).
    pub fn data_bytes(&self) -> u64 {
        self.store.len()
    }

    /// Append a write of `data` at `offset`.
    pub fn push_write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.push_write_fua(offset, data, false)
    }

    fn push_write_fua(&mut self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let len = u32::try_from(data.len()).map_err(|_| bad("a logged write over 4 GiB"))?;
        let data_at = self.store.append(data)?;
        self.entries.push(Entry {
            kind: EntryKind::Write,
            offset,
            len,
            fua,
            data_at,
        });
        Ok(())
    }

    /// Append a flush.
    pub fn push_flush(&mut self, honoured: bool) {
        self.flushes += 1;
        self.entries.push(Entry {
            kind: EntryKind::Flush { honoured },
            offset: 0,
            len: 0,
            fua: false,
            data_at: 0,
        });
    }

    /// Append a mark labelled `label` (cut to 480 bytes).
    pub fn push_mark(&mut self, label: &[u8]) -> io::Result<()> {
        let label = &label[..label.len().min(MAX_MARK)];
        let data_at = self.store.append(label)?;
        self.entries.push(Entry {
            kind: EntryKind::Mark,
            offset: 0,
            len: label.len() as u32,
            fua: false,
            data_at,
        });
        Ok(())
    }

    /// The bytes of entry `i` (a write's data, a mark's label).
    pub fn data(&self, i: usize) -> io::Result<Vec<u8>> {
        let e = self.entries.get(i).ok_or_else(|| bad("no such log entry"))?;
        let mut buf = vec![0; e.len as usize];
        self.store.read(e.data_at, &mut buf)?;
        Ok(buf)
    }

    /// Index of the first mark labelled `label`.
    pub fn find_mark(&self, label: &[u8]) -> Option<usize> {
        (0..self.entries.len())
            .find(|&i| self.entries[i].kind == EntryKind::Mark && self.data(i).is_ok_and(|d| d == label))
    }

    /// Apply the writes among entries `range` for which `keep(index)` says
    /// so onto `image` (the device's bytes).
    pub fn apply(&self, image: &mut [u8], range: Range<usize>, mut keep: impl FnMut(usize) -> bool) -> io::Result<()> {
        for i in range {
            let e = &self.entries[i];
            if !e.is_write() || !keep(i) {
                continue;
            }
            let start = usize::try_from(e.offset).map_err(|_| bad("write offset"))?;
            let dst = image
                .get_mut(start..start + e.len as usize)
                .ok_or_else(|| bad("a logged write past the end of the image"))?;
            self.store.read(e.data_at, dst)?;
        }
        Ok(())
    }

    /// `base` with every logged write applied: what the device held when
    /// recording stopped.
    pub fn replay(&self, base: &[u8]) -> io::Result<Vec<u8>> {
        let mut img = base.to_vec();
        self.apply_growing(&mut img, 0..self.entries.len(), |_| true)?;
        Ok(img)
    }

    /// [`WriteLog::apply`] onto an image that grows: a kept write past its
    /// end extends it (zeros in any gap). The device may be a file that
    /// grows (a container format appends clusters); the rule for a crash
    /// image is that the file is as long as the base or the furthest kept
    /// write, whichever is longer — its length became durable with the
    /// data that made it (a dropped append leaves no trace).
    pub fn apply_growing(
        &self,
        image: &mut Vec<u8>,
        range: Range<usize>,
        mut keep: impl FnMut(usize) -> bool,
    ) -> io::Result<()> {
        for i in range {
            let e = &self.entries[i];
            if !e.is_write() || !keep(i) {
                continue;
            }
            let end = usize::try_from(e.offset + u64::from(e.len)).map_err(|_| bad("write offset"))?;
            if end > image.len() {
                image.resize(end, 0);
            }
            self.apply(image, i..i + 1, |_| true)?;
        }
        Ok(())
    }

    /// Index of the last honoured flush before entry `end`, if any.
    fn last_honoured_before(&self, end: usize) -> Option<usize> {
        self.entries[..end]
            .iter()
            .rposition(|e| e.kind == EntryKind::Flush { honoured: true })
    }

    /// Number of flush entries (honoured or not) among entries `..end`.
    fn flushes_before(&self, end: usize) -> u64 {
        self.entries[..end].iter().filter(|e| e.is_flush()).count() as u64
    }

    /// The crash point "cut at the flush at entry `index`". Fails unless
    /// that entry is an honoured flush.
    pub fn flush_cut(&self, index: usize) -> io::Result<CrashPoint> {
        match self.entries.get(index) {
            Some(e) if e.kind == EntryKind::Flush { honoured: true } => Ok(CrashPoint {
                end: index,
                durable: index,
                flushes: self.flushes_before(index) + 1,
                drop_seed: None,
            }),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("log entry {index} is not an honoured flush"),
            )),
        }
    }

    /// A cut at every honoured flush, in log order.
    pub fn flush_cuts(&self) -> Vec<CrashPoint> {
        let mut out = Vec::new();
        let mut flushes = 0;
        for (i, e) in self.entries.iter().enumerate() {
            if let EntryKind::Flush { honoured } = e.kind {
                flushes += 1;
                if honoured {
                    out.push(CrashPoint {
                        end: i,
                        durable: i,
                        flushes,
                        drop_seed: None,
                    });
                }
            }
        }
        out
    }

    /// The crash point "cut before entry `end`, the writes since the last
    /// honoured flush thinned out by `seed`" (`end` may be the log's
    /// length: the cut after everything).
    pub fn random_cut_at(&self, end: usize, seed: u64) -> io::Result<CrashPoint> {
        if end > self.entries.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "cut at entry {end} past the end of the log ({} entries)",
                    self.entries.len()
                ),
            ));
        }
        Ok(CrashPoint {
            end,
            durable: self.last_honoured_before(end).map_or(0, |i| i + 1),
            flushes: self.flushes_before(end),
            drop_seed: Some(seed),
        })
    }

    /// A random crash point between two honoured flushes: an interval with
    /// at least one write is chosen uniformly, then a cut just after one of
    /// its writes, then a seed for the writes dropped. `None` when the log
    /// holds no write.
    pub fn random_cut(&self, rng: &mut impl Rng) -> Option<CrashPoint> {
        // Intervals: [start, stop) between honoured flushes (the last one
        // runs to the end of the log), with their writes.
        let mut intervals: Vec<(usize, usize)> = Vec::new();
        let mut start = 0;
        for (i, e) in self.entries.iter().enumerate() {
            if e.kind == (EntryKind::Flush { honoured: true }) {
                intervals.push((start, i));
                start = i + 1;
            }
        }
        intervals.push((start, self.entries.len()));
        let writes: Vec<Vec<usize>> = intervals
            .iter()
            .map(|&(a, b)| (a..b).filter(|&i| self.entries[i].is_write()).collect())
            .filter(|w: &Vec<usize>| !w.is_empty())
            .collect();
        if writes.is_empty() {
            return None;
        }
        let w = &writes[rng.random_range(0..writes.len())];
        let after = w[rng.random_range(0..w.len())];
        self.random_cut_at(after + 1, rng.random()).ok()
    }

    /// The crash image `cut` describes, built on `base`.
    pub fn image(&self, base: &[u8], cut: &CrashPoint) -> io::Result<Vec<u8>> {
        let mut img = base.to_vec();
        self.apply_growing(&mut img, 0..cut.durable, |_| true)?;
        let kept = cut.kept(self);
        self.apply_growing(&mut img, cut.durable..cut.end, |i| kept[i - cut.durable])?;
        Ok(img)
    }

    /// Save the log in the dm-log-writes format.
    pub fn write_dm_log(&self, mut w: impl Write) -> io::Result<()> {
        let mut sector = [0u8; SECTOR as usize];
        sector[0..8].copy_from_slice(&DM_LOG_MAGIC.to_le_bytes());
        sector[8..16].copy_from_slice(&DM_LOG_VERSION.to_le_bytes());
        sector[16..24].copy_from_slice(&(self.entries.len() as u64).to_le_bytes());
        sector[24..28].copy_from_slice(&(SECTOR as u32).to_le_bytes());
        w.write_all(&sector)?;
        for (i, e) in self.entries.iter().enumerate() {
            let mut hdr = [0u8; SECTOR as usize];
            let data = self.data(i)?;
            let (flags, sec, nr, data_len) = match e.kind {
                EntryKind::Write => {
                    if e.offset % SECTOR != 0 || u64::from(e.len) % SECTOR != 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!(
                                "log entry {i}: a write of {} bytes at {} is not whole sectors",
                                e.len, e.offset
                            ),
                        ));
                    }
                    let fua = if e.fua { FLAG_FUA } else { 0 };
                    (fua, e.offset / SECTOR, u64::from(e.len) / SECTOR, 0)
                }
                EntryKind::Flush { .. } => (FLAG_FLUSH, 0, 0, 0),
                EntryKind::Mark => {
                    hdr[32..32 + data.len()].copy_from_slice(&data);
                    (FLAG_MARK, 0, 0, data.len() as u64)
                }
            };
            hdr[0..8].copy_from_slice(&sec.to_le_bytes());
            hdr[8..16].copy_from_slice(&nr.to_le_bytes());
            hdr[16..24].copy_from_slice(&flags.to_le_bytes());
            hdr[24..32].copy_from_slice(&data_len.to_le_bytes());
            w.write_all(&hdr)?;
            if e.is_write() {
                w.write_all(&data)?;
            }
        }
        w.flush()
    }

    /// Load a dm-log-writes log (data kept in memory). A write entry that
    /// also carries FLUSH (a pre-flushed write) becomes a flush followed by
    /// the write; a discard becomes a write of zeros; METADATA is ignored.
    /// Flushes are all honoured.
    pub fn read_dm_log(mut r: impl Read) -> io::Result<WriteLog> {
        let mut sup = [0u8; 32];
        r.read_exact(&mut sup)?;
        let le64 = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        if le64(&sup[0..]) != DM_LOG_MAGIC {
            return Err(bad("not a dm-log-writes log (bad magic)"));
        }
        if le64(&sup[8..]) != DM_LOG_VERSION {
            return Err(bad("unsupported dm-log-writes version"));
        }
        let n = le64(&sup[16..]);
        let ss = u64::from(u32::from_le_bytes(sup[24..28].try_into().expect("4 bytes")));
        if !(512..=65536).contains(&ss) || !ss.is_power_of_two() {
            return Err(bad("dm-log-writes super: bad sector size"));
        }
        let mut skip = vec![0u8; ss as usize - 32];
        r.read_exact(&mut skip)?;
        let mut log = WriteLog::new();
        let mut hdr = vec![0u8; ss as usize];
        for i in 0..n {
            r.read_exact(&mut hdr)?;
            let (sec, nr, flags, data_len) = (le64(&hdr[0..]), le64(&hdr[8..]), le64(&hdr[16..]), le64(&hdr[24..]));
            if flags & !(FLAG_FLUSH | FLAG_FUA | FLAG_DISCARD | FLAG_MARK | FLAG_METADATA) != 0 {
                return Err(bad(&format!("dm-log entry {i}: unknown flags {flags:#x}")));
            }
            if flags & FLAG_MARK != 0 {
                let len = (data_len as usize).min(hdr.len() - 32);
                log.push_mark(&hdr[32..32 + len])?;
                continue;
            }
            if flags & FLAG_FLUSH != 0 {
                log.push_flush(true);
            }
            if nr == 0 {
                continue;
            }
            // Entry sectors are 512-byte bio sectors; data is whole log sectors.
            let bytes = nr
                .checked_mul(512)
                .filter(|&b| b <= 1 << 30)
                .ok_or_else(|| bad(&format!("dm-log entry {i}: absurd length")))?;
            let mut data = vec![0u8; bytes as usize];
            if flags & FLAG_DISCARD == 0 {
                r.read_exact(&mut data)?;
                let pad = bytes.next_multiple_of(ss) - bytes;
                if pad > 0 {
                    io::copy(&mut (&mut r).take(pad), &mut io::sink())?;
                }
            }
            log.push_write_fua(sec * 512, &data, flags & FLAG_FUA != 0)?;
        }
        Ok(log)
    }
}

/// Where a power cut falls in a [`WriteLog`], and which writes survive it.
///
/// The image is: every write before entry `durable`, plus those writes
/// among `durable..end` that [`CrashPoint::kept`] keeps. Written as
/// `flush@N` (a cut at the flush at entry `N`: `durable == end == N`) or
/// `cut@N/SEED` (a cut before entry `N`, writes since the last honoured
/// flush dropped as `SEED` chooses); [`CrashPoint::parse`] reads both back
/// against the same log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashPoint {
    /// Entries from here on never reach the image.
    pub end: usize,
    /// Every write before this entry is in the image (just past the last
    /// honoured flush before `end`; `end` itself for a flush cut).
    pub durable: usize,
    /// Flush entries (honoured or not) the writer saw complete before the
    /// cut: a promise made after `flushes` flushes ("this fsync returned
    /// when the flush count was F") must hold in this image when
    /// `F <= flushes`.
    pub flushes: u64,
    /// `None` for a cut at a flush; otherwise the seed that chooses which
    /// writes among `durable..end` are lost.
    pub drop_seed: Option<u64>,
}

impl CrashPoint {
    /// Whether this is a cut at a flush.
    pub fn is_flush_cut(&self) -> bool {
        self.drop_seed.is_none()
    }

    /// For each entry in `durable..end`, whether it is kept (non-writes
    /// are "kept"). FUA writes are always kept. The choice depends only on
    /// the seed and the entries: first a loss rate (none a quarter of the
    /// time, everything an eighth of the time, else uniform), then each
    /// write independently.
    pub fn kept(&self, log: &WriteLog) -> Vec<bool> {
        let n = self.end - self.durable;
        let Some(seed) = self.drop_seed else {
            return vec![true; n];
        };
        let mut rng = StdRng::seed_from_u64(seed);
        let rate: f64 = match rng.random_range(0..8) {
            0 | 1 => 0.0,
            2 => 1.0,
            _ => rng.random(),
        };
        (self.durable..self.end)
            .map(|i| {
                let e = &log.entries[i];
                let lost = rng.random::<f64>() < rate;
                !(e.is_write() && !e.fua && lost)
            })
            .collect()
    }

    /// Writes in `durable..end` this cut drops.
    pub fn dropped(&self, log: &WriteLog) -> usize {
        let kept = self.kept(log);
        (self.durable..self.end)
            .filter(|&i| log.entries[i].is_write() && !kept[i - self.durable])
            .count()
    }

    /// Read `flush@N` or `cut@N/SEED` (seed in decimal or 0x-hex) against
    /// `log`.
    pub fn parse(s: &str, log: &WriteLog) -> io::Result<CrashPoint> {
        let inval = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("crash point {s:?}: expected flush@N or cut@N/SEED"),
            )
        };
        if let Some(n) = s.strip_prefix("flush@") {
            return log.flush_cut(n.parse().map_err(|_| inval())?);
        }
        let rest = s.strip_prefix("cut@").ok_or_else(inval)?;
        let (n, seed) = rest.split_once('/').ok_or_else(inval)?;
        let seed = match seed.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => seed.parse(),
        }
        .map_err(|_| inval())?;
        log.random_cut_at(n.parse().map_err(|_| inval())?, seed)
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.drop_seed {
            None => write!(f, "flush@{}", self.end),
            Some(s) => write!(f, "cut@{}/{:#x}", self.end, s),
        }
    }
}

/// Builds many crash images from one log without replaying it from the
/// start each time: it keeps the image at the last `durable` point asked
/// for and moves it forward. Ask in increasing `durable` order (as
/// [`WriteLog::flush_cuts`] gives them, or sort); going back restarts from
/// the base.
#[derive(Debug)]
pub struct CrashImages<'a> {
    log: &'a WriteLog,
    base: Vec<u8>,
    cur: Vec<u8>,
    at: usize,
}

impl<'a> CrashImages<'a> {
    /// A builder over `log`, starting from `base`.
    pub fn new(log: &'a WriteLog, base: Vec<u8>) -> Self {
        CrashImages {
            log,
            cur: base.clone(),
            base,
            at: 0,
        }
    }

    /// The image of `cut`.
    pub fn image(&mut self, cut: &CrashPoint) -> io::Result<Vec<u8>> {
        let mut img = Vec::new();
        self.image_into(cut, &mut img)?;
        Ok(img)
    }

    /// The image of `cut`, into `img` (its old contents replaced). Reusing
    /// one buffer for many images avoids allocating and faulting in a
    /// fresh image-sized buffer each time, which costs more than the copy.
    pub fn image_into(&mut self, cut: &CrashPoint, img: &mut Vec<u8>) -> io::Result<()> {
        if cut.durable < self.at {
            // The image may have grown past the base: start again from it.
            self.cur.clear();
            self.cur.extend_from_slice(&self.base);
            self.at = 0;
        }
        self.log.apply_growing(&mut self.cur, self.at..cut.durable, |_| true)?;
        self.at = cut.durable;
        img.clear();
        img.extend_from_slice(&self.cur);
        let kept = cut.kept(self.log);
        self.log
            .apply_growing(img, cut.durable..cut.end, |i| kept[i - cut.durable])
    }
}

/// A [`BlockDevice`] that passes everything to `inner` and logs every write
/// and flush (see the module doc).
pub struct RecordingDevice {
    inner: Arc<dyn BlockDevice>,
    log: Mutex<Option<WriteLog>>,
    /// Entries logged so far (readable without the lock).
    position: AtomicU64,
    /// Flushes logged so far.
    flushes: AtomicU64,
    unhonoured: Mutex<Option<FlushFault>>,
}

type FlushFault = Box<dyn Fn(u64) -> bool + Send + Sync>;

impl fmt::Debug for RecordingDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordingDevice")
            .field("position", &self.position())
            .field("flushes", &self.flushes())
            .finish_non_exhaustive()
    }
}

impl RecordingDevice {
    /// Record into an in-memory log.
    pub fn new(inner: Arc<dyn BlockDevice>) -> Self {
        Self::with_log(inner, WriteLog::new())
    }

    /// Record into `log` (e.g. [`WriteLog::with_spill`]), which should be
    /// empty.
    pub fn with_log(inner: Arc<dyn BlockDevice>, log: WriteLog) -> Self {
        let position = AtomicU64::new(log.len() as u64);
        let flushes = AtomicU64::new(log.flushes());
        RecordingDevice {
            inner,
            log: Mutex::new(Some(log)),
            position,
            flushes,
            unhonoured: Mutex::new(None),
        }
    }

    /// Entries logged so far. A caller that reads it before starting an
    /// operation knows that none of the operation's writes sit before this
    /// index.
    pub fn position(&self) -> u64 {
        self.position.load(Ordering::Acquire)
    }

    /// Flushes logged so far (honoured or not). Read after an fsync
    /// returned, it is the count at which that fsync's promise starts to
    /// hold (see [`CrashPoint::flushes`]).
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Acquire)
    }

    /// Fault injection: from now on, the flush numbered `n` (1 for the
    /// first flush ever logged) is unhonoured when `pred(n)` says so.
    pub fn drop_flushes(&self, pred: impl Fn(u64) -> bool + Send + Sync + 'static) {
        *self.unhonoured.lock() = Some(Box::new(pred));
    }

    /// Put a labelled mark into the log (no I/O).
    pub fn mark(&self, label: &[u8]) -> io::Result<()> {
        let mut g = self.log.lock();
        let log = g.as_mut().ok_or_else(finished)?;
        log.push_mark(label)?;
        self.position.store(log.len() as u64, Ordering::Release);
        Ok(())
    }

    /// Stop recording and hand the log over; later writes and flushes
    /// still reach the inner device but are not logged.
    pub fn take_log(&self) -> WriteLog {
        self.log.lock().take().unwrap_or_default()
    }

    /// The device underneath.
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }
}

fn finished() -> io::Error {
    io::Error::other("the recording was taken")
}

impl BlockDevice for RecordingDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(off, buf)
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        let mut g = self.log.lock();
        self.inner.write_at(off, buf)?;
        let Some(log) = g.as_mut() else {
            return Ok(());
        };
        let end = off + buf.len() as u64;
        let (woff, wend) = (
            off / SECTOR * SECTOR,
            end.next_multiple_of(SECTOR).min(self.inner.size()),
        );
        if woff == off && wend == end {
            log.push_write(off, buf)?;
        } else {
            // Widen to whole sectors with what the device now holds there
            // (no other write can interleave: we hold the log lock).
            let mut wide = vec![0u8; (wend - woff) as usize];
            self.inner.read_at(woff, &mut wide)?;
            log.push_write(woff, &wide)?;
        }
        self.position.store(log.len() as u64, Ordering::Release);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut g = self.log.lock();
        if let Some(log) = g.as_mut() {
            let n = log.flushes() + 1;
            let honoured = !self.unhonoured.lock().as_ref().is_some_and(|p| p(n));
            log.push_flush(honoured);
            self.position.store(log.len() as u64, Ordering::Release);
            self.flushes.store(log.flushes(), Ordering::Release);
        }
        drop(g);
        self.inner.flush()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    fn grows(&self) -> bool {
        self.inner.grows()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    const SIZE: usize = 64 * 1024;

    fn base() -> Vec<u8> {
        (0..SIZE).map(|i| (i % 251) as u8).collect()
    }

    fn block(v: u8) -> Vec<u8> {
        vec![v; 4096]
    }

    /// A recorder over a copy of `base()`, with the inner device.
    fn recorder() -> (Arc<MemDevice>, RecordingDevice) {
        let mem = Arc::new(MemDevice::from_vec(base()));
        let rec = RecordingDevice::new(mem.clone());
        (mem, rec)
    }

    fn at(img: &[u8], blk: usize) -> u8 {
        img[blk * 4096]
    }

    #[test]
    fn passes_through_and_replays_to_the_inner_contents() {
        let (mem, rec) = recorder();
        rec.write_at(0, &block(1)).unwrap();
        rec.flush().unwrap();
        rec.write_at(8192, &block(2)).unwrap();
        rec.write_at(0, &block(3)).unwrap();
        rec.mark(b"after three").unwrap();
        let mut b = [0u8; 4];
        rec.read_at(8192, &mut b).unwrap();
        assert_eq!(b, [2; 4]);
        assert_eq!((rec.position(), rec.flushes()), (5, 1));
        let log = rec.take_log();
        assert_eq!(log.len(), 5);
        assert_eq!(log.replay(&base()).unwrap(), mem.to_vec());
        assert_eq!(log.find_mark(b"after three"), Some(4));
        // After the take, writes still reach the device, unlogged.
        rec.write_at(4096, &block(9)).unwrap();
        assert_eq!(at(&mem.to_vec(), 1), 9);
        assert_eq!(log.len(), 5);
    }

    #[test]
    fn flush_cuts_keep_exactly_what_came_before() {
        let (_, rec) = recorder();
        rec.write_at(0, &block(1)).unwrap(); // 0
        rec.flush().unwrap(); // 1
        rec.write_at(4096, &block(2)).unwrap(); // 2
        rec.write_at(0, &block(3)).unwrap(); // 3
        rec.flush().unwrap(); // 4
        rec.write_at(8192, &block(4)).unwrap(); // 5
        let log = rec.take_log();
        let cuts = log.flush_cuts();
        assert_eq!(
            cuts.iter().map(|c| (c.end, c.flushes)).collect::<Vec<_>>(),
            vec![(1, 1), (4, 2)]
        );
        let b = base();
        let i1 = log.image(&b, &cuts[0]).unwrap();
        assert_eq!((at(&i1, 0), at(&i1, 1), at(&i1, 2)), (1, b[4096], b[8192]));
        let i2 = log.image(&b, &cuts[1]).unwrap();
        assert_eq!((at(&i2, 0), at(&i2, 1), at(&i2, 2)), (3, 2, b[8192]));
        assert_eq!(cuts[1].to_string(), "flush@4");
        assert_eq!(CrashPoint::parse("flush@4", &log).unwrap(), cuts[1]);
        assert!(CrashPoint::parse("flush@3", &log).is_err());
    }

    #[test]
    fn random_cuts_keep_the_durable_prefix_and_nothing_after_the_cut() {
        let (_, rec) = recorder();
        // 16 writes, a flush, 15 more to distinct blocks (block i gets i+1).
        for i in 0..16u8 {
            rec.write_at(u64::from(i) * 4096, &block(i + 1)).unwrap();
            if i == 7 {
                rec.flush().unwrap();
            }
        }
        let log = rec.take_log();
        let b = base();
        let mut rng = StdRng::seed_from_u64(7);
        let (mut some_dropped, mut some_kept_all) = (false, false);
        for _ in 0..300 {
            let cut = log.random_cut(&mut rng).unwrap();
            let img = log.image(&b, &cut).unwrap();
            // Reproducible from its text.
            let again = CrashPoint::parse(&cut.to_string(), &log).unwrap();
            assert_eq!(again, cut);
            assert_eq!(log.image(&b, &again).unwrap(), img);
            let kept = cut.kept(&log);
            for (idx, e) in log.entries().iter().enumerate() {
                if !e.is_write() {
                    continue;
                }
                let blk = (e.offset / 4096) as usize;
                let present = at(&img, blk) == blk as u8 + 1;
                if idx < cut.durable {
                    assert!(present, "{cut}: durable write {idx} lost");
                } else if idx >= cut.end {
                    assert!(!present, "{cut}: write {idx} after the cut present");
                } else {
                    assert_eq!(present, kept[idx - cut.durable], "{cut}: write {idx}");
                }
            }
            if cut.dropped(&log) > 0 {
                some_dropped = true;
            } else if cut.end - cut.durable > 2 {
                some_kept_all = true;
            }
            // A cut after the flush keeps everything before it.
            if cut.end > 8 {
                assert_eq!(cut.durable, 9);
                assert_eq!(cut.flushes, 1);
            } else {
                assert_eq!((cut.durable, cut.flushes), (0, 0));
            }
        }
        assert!(some_dropped && some_kept_all);
        assert!(log.random_cut_at(log.len() + 1, 0).is_err());
        assert!(WriteLog::new().random_cut(&mut rng).is_none());
    }

    #[test]
    fn builder_gives_the_same_images_in_any_order() {
        let (_, rec) = recorder();
        for i in 0..40u64 {
            rec.write_at((i % 16) * 4096, &block(i as u8)).unwrap();
            if i % 5 == 4 {
                rec.flush().unwrap();
            }
        }
        let log = rec.take_log();
        let b = base();
        let mut rng = StdRng::seed_from_u64(1);
        let mut cuts = log.flush_cuts();
        cuts.extend((0..30).filter_map(|_| log.random_cut(&mut rng)));
        let mut builder = CrashImages::new(&log, b.clone());
        // Sorted, then reversed (restarts), then sorted again.
        cuts.sort_by_key(|c| c.durable);
        let mut buf = Vec::new();
        for c in cuts.iter().chain(cuts.iter().rev()).chain(cuts.iter()) {
            assert_eq!(builder.image(c).unwrap(), log.image(&b, c).unwrap(), "{c}");
            builder.image_into(c, &mut buf).unwrap();
            assert_eq!(buf, log.image(&b, c).unwrap(), "{c}");
        }
    }

    #[test]
    fn unhonoured_flushes_are_no_boundary_but_count() {
        let (_, rec) = recorder();
        rec.drop_flushes(|n| n == 2);
        rec.write_at(0, &block(1)).unwrap(); // 0
        rec.flush().unwrap(); // 1: honoured
        rec.write_at(4096, &block(2)).unwrap(); // 2
        rec.flush().unwrap(); // 3: dropped
        rec.write_at(8192, &block(3)).unwrap(); // 4
        assert_eq!(rec.flushes(), 2);
        let log = rec.take_log();
        assert_eq!(log.flush_cuts().len(), 1);
        assert!(log.flush_cut(3).is_err());
        // A cut after write 4: write 2 may be lost although flush 2 "returned".
        let cut = log.random_cut_at(5, 0).unwrap();
        assert_eq!((cut.durable, cut.flushes), (2, 2));
        let lost = (0..64u64).any(|s| {
            let c = log.random_cut_at(5, s).unwrap();
            !c.kept(&log)[0]
        });
        assert!(lost, "no seed drops the write before the unhonoured flush");
    }

    #[test]
    fn a_growing_device_gives_growing_crash_images() {
        let mem = Arc::new(MemDevice::growable(base()));
        let rec = RecordingDevice::new(mem.clone());
        rec.write_at(SIZE as u64, &block(1)).unwrap(); // 0: appended
        rec.flush().unwrap(); // 1
        rec.write_at(SIZE as u64 + 8192, &block(2)).unwrap(); // 2: appended past a gap
        rec.write_at(SIZE as u64 + 4096, &block(3)).unwrap(); // 3: fills the gap
        let log = rec.take_log();
        assert_eq!(log.replay(&base()).unwrap(), mem.to_vec());
        let at_flush = log.image(&base(), &log.flush_cut(1).unwrap()).unwrap();
        assert_eq!(at_flush.len(), SIZE + 4096);
        // Every cut's image is as long as its furthest kept write.
        let mut builder = CrashImages::new(&log, base());
        for s in 0..32u64 {
            let c = log.random_cut_at(4, s).unwrap();
            let kept = c.kept(&log);
            let img = builder.image(&c).unwrap();
            // kept[0] is entry 2 (ends 3 blocks past the base), kept[1] entry 3.
            let want = if kept[0] {
                SIZE + 3 * 4096
            } else if kept[1] {
                SIZE + 2 * 4096
            } else {
                SIZE + 4096
            };
            assert_eq!(img.len(), want, "{c}");
            assert_eq!(img, log.image(&base(), &c).unwrap());
            // Going back to the start restarts from the (shorter) base.
            assert_eq!(builder.image(&log.random_cut_at(0, 0).unwrap()).unwrap(), base());
        }
    }

    #[test]
    fn unaligned_writes_are_logged_as_whole_sectors() {
        let (mem, rec) = recorder();
        rec.write_at(1000, b"hello").unwrap();
        rec.write_at(SIZE as u64 - 3, b"end").unwrap();
        let log = rec.take_log();
        assert_eq!(log.entries()[0].range(), 512..1024);
        assert_eq!(log.entries()[1].range(), SIZE as u64 - 512..SIZE as u64);
        assert_eq!(log.replay(&base()).unwrap(), mem.to_vec());
    }

    #[test]
    fn spill_file_holds_the_data() {
        let path = std::env::temp_dir().join(format!("ext4kit-record-spill-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let mem = Arc::new(MemDevice::from_vec(base()));
        let rec = RecordingDevice::with_log(mem.clone(), WriteLog::with_spill(file));
        for i in 0..10u8 {
            rec.write_at(u64::from(i) * 4096, &block(i)).unwrap();
        }
        rec.flush().unwrap();
        let log = rec.take_log();
        assert_eq!(log.data_bytes(), 10 * 4096);
        assert_eq!(log.replay(&base()).unwrap(), mem.to_vec());
        assert_eq!(log.data(3).unwrap(), block(3));
    }

    #[test]
    fn dm_log_round_trip() {
        let (_, rec) = recorder();
        rec.write_at(0, &block(1)).unwrap();
        rec.mark(b"mkfs").unwrap();
        rec.flush().unwrap();
        rec.write_at(4096 * 3, &block(2)).unwrap();
        let log = rec.take_log();
        let mut bytes = Vec::new();
        log.write_dm_log(&mut bytes).unwrap();
        assert_eq!(u64::from_le_bytes(bytes[0..8].try_into().unwrap()), DM_LOG_MAGIC);
        // super + (hdr + 8 data sectors) + mark hdr + flush hdr + (hdr + 8).
        assert_eq!(bytes.len(), 512 * (1 + 9 + 1 + 1 + 9));
        let back = WriteLog::read_dm_log(&bytes[..]).unwrap();
        assert_eq!(back.len(), log.len());
        for (a, b) in back.entries().iter().zip(log.entries()) {
            assert_eq!((a.kind, a.offset, a.len), (b.kind, b.offset, b.len));
        }
        assert_eq!(back.replay(&base()).unwrap(), log.replay(&base()).unwrap());
        assert_eq!(back.find_mark(b"mkfs"), Some(1));
        assert!(WriteLog::read_dm_log(&[0u8; 512][..]).is_err());
    }

    #[test]
    fn dm_log_reader_splits_preflushed_writes_and_keeps_fua() {
        let mut bytes = vec![0u8; 512];
        bytes[0..8].copy_from_slice(&DM_LOG_MAGIC.to_le_bytes());
        bytes[8..16].copy_from_slice(&1u64.to_le_bytes());
        bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
        bytes[24..28].copy_from_slice(&512u32.to_le_bytes());
        let mut hdr = [0u8; 512];
        hdr[0..8].copy_from_slice(&2u64.to_le_bytes());
        hdr[8..16].copy_from_slice(&1u64.to_le_bytes());
        hdr[16..24].copy_from_slice(&(FLAG_FLUSH | FLAG_FUA).to_le_bytes());
        bytes.extend_from_slice(&hdr);
        bytes.extend_from_slice(&[7u8; 512]);
        let log = WriteLog::read_dm_log(&bytes[..]).unwrap();
        assert_eq!(log.len(), 2);
        assert!(log.entries()[0].is_flush());
        assert!(log.entries()[1].fua && log.entries()[1].offset == 1024);
        // A FUA write survives every random cut.
        for s in 0..32 {
            assert!(log.random_cut_at(2, s).unwrap().kept(&log).iter().all(|&k| k));
        }
    }

    #[test]
    fn concurrent_writers_log_in_device_order() {
        let (mem, rec) = recorder();
        let rec = Arc::new(rec);
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let rec = rec.clone();
                s.spawn(move || {
                    for i in 0..200u64 {
                        // All threads hit the same few blocks.
                        rec.write_at((i % 4) * 4096, &block(t * 50 + (i % 50) as u8)).unwrap();
                        if i % 37 == 0 {
                            rec.flush().unwrap();
                        }
                    }
                });
            }
        });
        let log = rec.take_log();
        assert_eq!(log.len() as u64, 800 + rec.flushes());
        assert_eq!(log.replay(&base()).unwrap(), mem.to_vec());
    }
}
