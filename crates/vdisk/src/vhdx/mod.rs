//! VHDX, Hyper-V's virtual hard disk v2 (MS-VHDX): the format of WSL's
//! `ext4.vhdx`, Hyper-V and Azure Stack disks.
//!
//! A VHDX file is a header section (file type identifier, two headers, two
//! region tables), a log of metadata updates, a metadata region (the
//! disk's geometry), a Block Allocation Table and payload blocks. Each
//! module here owns one of those structures as the spec names it; this one
//! puts them together into the guest's disk.
//!
//! Opening: the current header is chosen ([`header`]); if its `LogGuid` is
//! set the log is replayed ([`log`]) — into the file for a read-write open,
//! into memory for a read-only one, which never writes the file; then the
//! region table, the metadata and the BAT are read and every range they
//! name is checked against the file and against each other ([`layout`]).
//!
//! Writing: the first write of a session updates the headers' write GUIDs
//! (2.2.2.1). A write to a block the BAT does not map allocates a new block
//! at the end of the file (1 MiB-aligned), writes its data and zeros, and
//! only then points the in-memory BAT at it; [`BlockDevice::flush`] makes
//! the data durable before it writes the new BAT entries, so no entry in
//! the file ever points at a block whose data could be lost.
//!
//! A deviation, on purpose: the spec (2.3) asks that metadata updates go
//! through the log; here a new BAT entry (8 bytes, one per allocation) is
//! written in place after its data is durable. A power cut can then lose
//! the entry (the block reads as before the write, as an unflushed write
//! may), never leave it pointing at garbage; what it does not cover is a
//! device that tears a single 4 KiB sector write. qemu and Hyper-V read
//! such files as written; the log this code writes is always empty.
//!
//! Not supported: differencing VHDX (a parent disk), refused at open.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ext4kit_blockdev::OverlayDevice;
use parking_lot::Mutex;

use crate::{corrupt, BlockDevice, DiskFormat, DiskImage, LayerInfo};

mod bat;
mod bytes;
mod create;
mod guid;
mod header;
mod layout;
mod log;
mod metadata;
mod region;
#[cfg(test)]
pub(crate) mod testimg;
#[cfg(test)]
mod tests;

use bat::{Bat, Block, Geometry};
use guid::Guid;
use metadata::Metadata;
use region::Region;

pub(crate) use create::create;

/// 1 MiB: the unit of the file's layout (MS-VHDX 2.1).
pub(crate) const MIB: u64 = 1 << 20;
/// The most a read-only open holds in memory to replay a log.
const MAX_REPLAY_IN_MEMORY: u64 = 64 * MIB;

/// The error for a malformed VHDX.
pub(crate) fn bad(what: impl fmt::Display) -> io::Error {
    corrupt(DiskFormat::Vhdx, what)
}

/// Read `buf` at `off` of `file`, after checking the range lies in the
/// file: a structure a hostile header places past the end is corruption,
/// named as `what`.
pub(crate) fn read_checked(file: &dyn BlockDevice, off: u64, buf: &mut [u8], what: &str) -> io::Result<()> {
    let size = file.size();
    if off.checked_add(buf.len() as u64).is_none_or(|end| end > size) {
        return Err(bad(format!(
            "{what} at {off} ({} bytes) runs past the end of the file ({size} bytes)",
            buf.len()
        )));
    }
    file.read_at(off, buf)
}

/// A VHDX file presented as the guest's disk.
pub struct VhdxDisk {
    /// The .vhdx file: where writes go.
    file: Arc<dyn BlockDevice>,
    /// Where reads come from: the file, or for a read-only open whose log
    /// needed replay, the file under the replayed sectors.
    view: Arc<dyn BlockDevice>,
    writable: bool,
    meta: Metadata,
    geo: Geometry,
    bat: Bat,
    /// Blocks reading as zeros whose reserved file space a write reuses
    /// (a fixed VHDX's untouched blocks); checked by [`layout`].
    reusable: HashSet<u64>,
    /// Set once this session's header update is done: writes then take no
    /// lock unless they allocate.
    session: AtomicBool,
    state: Mutex<WriteState>,
    /// What happened to the log at open, for `info`.
    log_note: Option<String>,
}

/// What writers share; allocation and header updates hold its lock.
struct WriteState {
    header: header::Current,
    /// `FileWriteGuid` was changed this session.
    file_guid_changed: bool,
    /// `DataWriteGuid` was changed this session.
    data_guid_changed: bool,
    /// Where the file ends for allocation: new blocks go at or after it.
    file_end: u64,
    /// BAT entries allocated since the last flush, by payload block: raw
    /// entries not yet in the file.
    pending: BTreeMap<u64, u64>,
}

impl fmt::Debug for VhdxDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VhdxDisk")
            .field("meta", &self.meta)
            .field("writable", &self.writable)
            .finish()
    }
}

/// Bytes the patches of `r` would hold in memory.
fn replay_bytes(r: &log::Replay) -> u64 {
    r.patches
        .iter()
        .map(|p| match p {
            log::Patch::Data { bytes, .. } => bytes.len() as u64,
            log::Patch::Zero { length, .. } => *length,
        })
        .fold(0u64, u64::saturating_add)
}

/// Make the changes of a replay on `dev`.
fn apply(dev: &dyn BlockDevice, r: &log::Replay) -> io::Result<()> {
    let zeros = vec![0u8; MIB as usize];
    for p in &r.patches {
        match p {
            log::Patch::Data { offset, bytes } => dev.write_at(*offset, bytes)?,
            log::Patch::Zero { offset, length } => {
                let mut done = 0;
                while done < *length {
                    let n = (*length - done).min(MIB);
                    dev.write_at(offset + done, &zeros[..n as usize])?;
                    done += n;
                }
            }
        }
    }
    Ok(())
}

impl VhdxDisk {
    /// Open a VHDX held by `file` (the .vhdx file as a device).
    /// `writable`: read-write; the file must then be writable too.
    ///
    /// A log that needs replay (after a crash of Hyper-V or WSL) is
    /// replayed as the spec requires before anything else is read: into
    /// the file when `writable`, else in memory only, leaving the file as
    /// it was. A differencing VHDX is refused as `Unsupported`; a
    /// malformed one is `InvalidData` naming what is wrong where.
    pub fn open(file: Arc<dyn BlockDevice>, writable: bool) -> io::Result<VhdxDisk> {
        if writable && file.read_only() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "vhdx: the file is open read-only, so the disk cannot be opened read-write",
            ));
        }
        let mut cur = header::read_current(&*file)?;
        let replay = log::read(&*file, &cur.header)?;
        // Parse through the replayed view first, so a writable open does
        // not touch a file it will refuse.
        let mut view: Arc<dyn BlockDevice> = file.clone();
        let mut replayed_to_file = false;
        if let Some(r) = &replay {
            if replay_bytes(r) <= MAX_REPLAY_IN_MEMORY {
                let overlay = OverlayDevice::new(file.clone(), log::SECTOR);
                apply(&overlay, r)?;
                overlay.freeze();
                view = Arc::new(overlay);
            } else if writable {
                Self::replay_into(&*file, &mut cur, r)?;
                replayed_to_file = true;
            } else {
                return Err(crate::unsupported(
                    DiskFormat::Vhdx,
                    format!(
                        "the log needs replay and would change {} MiB, more than a read-only open holds in \
                         memory; open it read-write to replay it",
                        replay_bytes(r) / MIB
                    ),
                ));
            }
        }
        let regions = region::read(&*view)?;
        let meta = metadata::read(&*view, regions.metadata)?;
        let geo = Geometry::new(&meta);
        let bat = Bat::read(&*view, regions.bat, geo)?;
        let log_region = Region {
            offset: cur.header.log_offset,
            length: u64::from(cur.header.log_length),
        };
        let reusable = layout::check(
            view.size(),
            (log_region.length > 0).then_some(log_region),
            regions.bat,
            regions.metadata,
            &bat,
            &geo,
        )?;

        let mut file_guid_changed = false;
        let log_note = match &replay {
            Some(r) if writable => {
                if !replayed_to_file {
                    Self::replay_into(&*file, &mut cur, r)?;
                }
                view = file.clone();
                file_guid_changed = true;
                Some(format!(
                    "replayed at open ({} entries, up to sequence {})",
                    r.entries, r.head_sequence
                ))
            }
            Some(r) => Some(format!(
                "replayed at open in memory only ({} entries, up to sequence {}); the file still holds the log \
                 (read-only open)",
                r.entries, r.head_sequence
            )),
            None if !cur.header.log_guid.is_zero() && writable => {
                // A log GUID with no active sequence: nothing to replay,
                // but the log is no longer in use (2.2.2: LogGuid).
                let g = Guid::random();
                header::update(&*file, &mut cur, |h| {
                    h.file_write_guid = g;
                    h.log_guid = Guid::ZERO;
                })?;
                file_guid_changed = true;
                Some("in use but holding no valid entries: nothing to replay; the log GUID was cleared".to_string())
            }
            None if !cur.header.log_guid.is_zero() => {
                Some("in use but holding no valid entries: nothing to replay".to_string())
            }
            None => None,
        };
        let last = replay.as_ref().map_or(0, |r| r.last_file_offset);
        let file_end = file.size().max(last);
        Ok(VhdxDisk {
            file,
            view,
            writable,
            meta,
            geo,
            bat,
            reusable,
            session: AtomicBool::new(false),
            state: Mutex::new(WriteState {
                header: cur,
                file_guid_changed,
                data_guid_changed: false,
                file_end,
                pending: BTreeMap::new(),
            }),
            log_note,
        })
    }

    /// Replay `r` into the file (2.3.3): a new `FileWriteGuid` before the
    /// first change, the changes, a flush, then the log GUID cleared.
    fn replay_into(file: &dyn BlockDevice, cur: &mut header::Current, r: &log::Replay) -> io::Result<()> {
        let g = Guid::random();
        header::update(file, cur, |h| h.file_write_guid = g)?;
        apply(file, r)?;
        file.flush()?;
        header::update(file, cur, |h| h.log_guid = Guid::ZERO)
    }

    /// The session's header update (2.2.2.1): before the first write of
    /// guest data, new `FileWriteGuid` (unless already changed) and
    /// `DataWriteGuid`, durably.
    fn begin_write(&self) -> io::Result<()> {
        if self.session.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut st = self.state.lock();
        if !st.data_guid_changed {
            let fwg = (!st.file_guid_changed).then(Guid::random);
            let dwg = Guid::random();
            let st = &mut *st;
            header::update(&*self.file, &mut st.header, |h| {
                if let Some(g) = fwg {
                    h.file_write_guid = g;
                }
                h.data_write_guid = dwg;
            })?;
            st.file_guid_changed = true;
            st.data_guid_changed = true;
        }
        self.session.store(true, Ordering::Release);
        Ok(())
    }

    /// Write `data` at `within` of payload block `block`, which the BAT
    /// does not map: a new block at the end of the file, data and zeros
    /// written before the in-memory BAT points at it.
    fn allocate(&self, block: u64, within: u64, data: &[u8]) -> io::Result<()> {
        let mut st = self.state.lock();
        // Another writer may have allocated it while we waited.
        if let Block::Data(off) = self.bat.lookup(block) {
            drop(st);
            return self.file.write_at(off + within, data);
        }
        // The block's own reserved space, else a new block at the end
        // (2.1: payload blocks are 1 MiB-aligned).
        let reserved = self.bat.reserved(block).filter(|_| self.reusable.contains(&block));
        let (off, end) = match reserved {
            Some(off) => (off, st.file_end),
            None => st
                .file_end
                .checked_next_multiple_of(MIB)
                .and_then(|a| a.checked_add(self.geo.block_size).map(|end| (a, end)))
                .filter(|&(a, _)| a <= (1u64 << 63))
                .ok_or_else(|| bad("no room for another block in a 2^63-byte file"))?,
        };
        let bs = self.geo.block_size;
        let (d0, d1) = (within, within + data.len() as u64);
        let mut piece = vec![0u8; MIB.min(bs) as usize];
        let mut p = 0;
        while p < bs {
            let n = MIB.min(bs - p);
            let buf = &mut piece[..n as usize];
            buf.fill(0);
            let (lo, hi) = (d0.max(p), d1.min(p + n));
            if lo < hi {
                buf[(lo - p) as usize..(hi - p) as usize]
                    .copy_from_slice(&data[(lo - d0) as usize..(hi - d0) as usize]);
            }
            self.file.write_at(off + p, buf)?;
            p += n;
        }
        st.file_end = end;
        let raw = self.bat.set_present(block, off);
        st.pending.insert(block, raw);
        Ok(())
    }

    /// Write the BAT entries in `pending` (whose blocks' data is durable).
    fn write_entries(&self, pending: &BTreeMap<u64, u64>) -> io::Result<()> {
        let mut run: Vec<u8> = Vec::new();
        let mut run_at = 0;
        for (&block, &raw) in pending {
            let at = self.bat.entry_offset(block);
            if !run.is_empty() && run_at + run.len() as u64 != at {
                self.file.write_at(run_at, &run)?;
                run.clear();
            }
            if run.is_empty() {
                run_at = at;
            }
            run.extend_from_slice(&raw.to_le_bytes());
        }
        if !run.is_empty() {
            self.file.write_at(run_at, &run)?;
        }
        Ok(())
    }

    fn check_range(&self, off: u64, len: usize, what: &str) -> io::Result<()> {
        if off
            .checked_add(len as u64)
            .is_none_or(|end| end > self.geo.virtual_size)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "vhdx: {what} of {len} bytes at offset {off} past the end of the disk ({} bytes)",
                    self.geo.virtual_size
                ),
            ));
        }
        Ok(())
    }
}

/// Split `[off, off + len)` of the virtual disk into per-block pieces:
/// (block, offset within the block, offset within the request, length).
fn pieces(block_size: u64, off: u64, len: usize) -> impl Iterator<Item = (u64, u64, usize, usize)> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        if pos >= len {
            return None;
        }
        let abs = off + pos as u64;
        let (block, within) = (abs / block_size, abs % block_size);
        let n = ((block_size - within) as usize).min(len - pos);
        let item = (block, within, pos, n);
        pos += n;
        Some(item)
    })
}

impl BlockDevice for VhdxDisk {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_range(off, buf.len(), "read")?;
        for (block, within, at, n) in pieces(self.geo.block_size, off, buf.len()) {
            let part = &mut buf[at..at + n];
            match self.bat.lookup(block) {
                Block::Data(file_off) => self.view.read_at(file_off + within, part)?,
                Block::Zero => part.fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "vhdx: disk opened read-only",
            ));
        }
        self.check_range(off, buf.len(), "write")?;
        if buf.is_empty() {
            return Ok(());
        }
        self.begin_write()?;
        for (block, within, at, n) in pieces(self.geo.block_size, off, buf.len()) {
            let part = &buf[at..at + n];
            match self.bat.lookup(block) {
                Block::Data(file_off) => self.file.write_at(file_off + within, part)?,
                Block::Zero => self.allocate(block, within, part)?,
            }
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if !self.writable {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.state.lock().pending);
        if pending.is_empty() {
            return self.file.flush();
        }
        // Data first, then the entries pointing at it, then those entries.
        let res = self
            .file
            .flush()
            .and_then(|()| self.write_entries(&pending))
            .and_then(|()| self.file.flush());
        if res.is_err() {
            let mut st = self.state.lock();
            for (b, raw) in pending {
                st.pending.entry(b).or_insert(raw);
            }
        }
        res
    }

    fn size(&self) -> u64 {
        self.geo.virtual_size
    }

    fn read_only(&self) -> bool {
        !self.writable
    }
}

impl Drop for VhdxDisk {
    /// Write what a caller did not flush: without it, blocks allocated
    /// since the last flush would be unreachable from the file's BAT.
    fn drop(&mut self) {
        if self.writable {
            let _ = self.flush();
        }
    }
}

/// `n` bytes in the largest binary unit that divides it.
fn human(n: u64) -> String {
    for (unit, name) in [(1u64 << 30, "GiB"), (MIB, "MiB"), (1024, "KiB")] {
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{} {name}", n / unit);
        }
    }
    format!("{n} bytes")
}

impl DiskImage for VhdxDisk {
    fn layer(&self) -> LayerInfo {
        let allocated = (0..self.geo.data_blocks)
            .filter(|&b| matches!(self.bat.lookup(b), Block::Data(_)))
            .count();
        let mut details = vec![
            ("block size".to_string(), human(self.meta.block_size)),
            (
                "logical sector size".to_string(),
                human(u64::from(self.meta.logical_sector)),
            ),
            (
                "physical sector size".to_string(),
                human(u64::from(self.meta.physical_sector)),
            ),
            (
                "allocated blocks".to_string(),
                format!("{allocated} of {}", self.geo.data_blocks),
            ),
            ("disk id (page 83)".to_string(), self.meta.disk_id.to_string()),
        ];
        if let Some(n) = &self.log_note {
            details.push(("log".to_string(), n.clone()));
        }
        LayerInfo {
            format: DiskFormat::Vhdx,
            variant: if self.meta.leave_blocks_allocated {
                "fixed"
            } else {
                "dynamic"
            }
            .to_string(),
            virtual_size: self.geo.virtual_size,
            details,
        }
    }
}
