//! The log (MS-VHDX 2.3): metadata updates written ahead, replayed at open.
//!
//! Rules relied on:
//! - The log is a circular buffer of 4 KiB sectors at `LogOffset`,
//!   `LogLength` bytes, holding entries whose `LogGuid` matches the
//!   current header's; a zero `LogGuid` means nothing to replay (2.2.2).
//! - Log Entry Header (2.3.1.1): `Signature` "loge", `Checksum` (CRC-32C of
//!   the whole entry, `EntryLength` bytes, with the field zero),
//!   `EntryLength` (a multiple of 4 KiB), `Tail` (the offset in the log of
//!   the first entry of the sequence this entry ends), `SequenceNumber`
//!   (never 0), `DescriptorCount`, `LogGuid`, `FlushedFileOffset`,
//!   `LastFileOffset`. The header and the descriptors fill the first
//!   sectors (64 + 32 * count bytes, rounded up to 4 KiB); one data sector
//!   per data descriptor follows, in descriptor order.
//! - Zero Descriptor (2.3.1.2): "zero", `ZeroLength` and `FileOffset`
//!   (multiples of 4 KiB), `SequenceNumber` = the entry's.
//! - Data Descriptor (2.3.1.3) and Data Sector (2.3.1.4): "desc" with
//!   `TrailingBytes` (the sector's last 4 bytes), `LeadingBytes` (its first
//!   8), `FileOffset`, `SequenceNumber`; the data sector is "data",
//!   `SequenceHigh`, 4084 bytes, `SequenceLow`, and its sequence halves
//!   must equal the descriptor's.
//! - Log Replay (2.3.3): the active sequence is the run of valid entries
//!   with consecutive sequence numbers whose last entry (the head) has the
//!   greatest sequence number and whose head's `Tail` is the first entry of
//!   the run; its descriptors are applied from tail to head. A
//!   `FlushedFileOffset` past the end of the file means the file was
//!   truncated after the log was written: the file is corrupt.
//!
//! Hostile logs: every length is checked against the log before it is
//! followed, a chain of entries never covers more than the whole log (so
//! it cannot loop), the work of the search is bounded, and every target of
//! a descriptor must lie in the file, outside the headers and the log.

use std::io;

use super::bytes::{u32_at, u64_at};
use super::guid::Guid;
use super::header::{Header, HEADERS_END};
use super::region::Region;
use super::{bad, read_checked, MIB};
use crate::BlockDevice;

/// Log sectors are 4 KiB.
pub(crate) const SECTOR: u64 = 4096;
/// The largest log read into memory to search it (Hyper-V and qemu make
/// 1 MiB logs).
const MAX_LOG: u64 = 64 * MIB;

/// One change the log makes to the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Patch {
    /// Write these 4 KiB at `offset`.
    Data { offset: u64, bytes: Vec<u8> },
    /// Write `length` zero bytes at `offset`.
    Zero { offset: u64, length: u64 },
}

impl Patch {
    /// The file range the patch writes.
    fn range(&self) -> (u64, u64) {
        match self {
            Patch::Data { offset, bytes } => (*offset, bytes.len() as u64),
            Patch::Zero { offset, length } => (*offset, *length),
        }
    }
}

/// The active sequence, as changes to make in order.
#[derive(Debug, Clone)]
pub(crate) struct Replay {
    pub(crate) patches: Vec<Patch>,
    pub(crate) entries: usize,
    pub(crate) head_sequence: u64,
    /// The greatest `LastFileOffset` of the sequence: everything the log
    /// allocated lies below it.
    pub(crate) last_file_offset: u64,
}

#[derive(Debug)]
enum Desc {
    Zero {
        offset: u64,
        length: u64,
    },
    Data {
        offset: u64,
        leading: [u8; 8],
        trailing: [u8; 4],
        sector: u64,
    },
}

#[derive(Debug)]
struct Entry {
    start: u64,
    length: u64,
    sequence: u64,
    tail: u64,
    flushed: u64,
    last: u64,
    descs: Vec<Desc>,
}

/// The log's bytes and what searching it may cost.
struct Log {
    buf: Vec<u8>,
    guid: Guid,
    at: u64,
    budget: u64,
}

impl Log {
    fn len(&self) -> u64 {
        self.buf.len() as u64
    }

    /// Sector `k` of the entry at `start`, wrapping at the log's end.
    fn sector(&self, start: u64, k: u64) -> &[u8] {
        let off = ((start + k * SECTOR) % self.len()) as usize;
        &self.buf[off..off + SECTOR as usize]
    }

    /// The valid entry at `start`, or `None` if there is none there. An
    /// error only when the search has done more work than any real log
    /// needs.
    fn entry_at(&mut self, start: u64) -> io::Result<Option<Entry>> {
        let h = self.sector(start, 0);
        if &h[..4] != b"loge" {
            return Ok(None);
        }
        let length = u64::from(u32_at(h, 8));
        let tail = u64::from(u32_at(h, 12));
        let sequence = u64_at(h, 16);
        let count = u64::from(u32_at(h, 24));
        let (flushed, last) = (u64_at(h, 48), u64_at(h, 56));
        let sectors = length / SECTOR;
        let desc_sectors = (count + 2).div_ceil(SECTOR / 32);
        if length == 0
            || !length.is_multiple_of(SECTOR)
            || length > self.len()
            || !tail.is_multiple_of(SECTOR)
            || tail >= self.len()
            || sequence == 0
            || Guid::at(h, 32) != self.guid
            || desc_sectors > sectors
        {
            return Ok(None);
        }
        let want = u32_at(h, 4);
        self.budget = self.budget.checked_sub(length).ok_or_else(|| {
            bad(format!(
                "log at {}: its entries overlap so much that searching it would not end; the log is corrupt",
                self.at
            ))
        })?;
        let mut crc = 0u32;
        for k in 0..sectors {
            let s = self.sector(start, k);
            crc = if k == 0 {
                let c = crc32c::crc32c_append(crc, &s[..4]);
                let c = crc32c::crc32c_append(c, &[0; 4]);
                crc32c::crc32c_append(c, &s[8..])
            } else {
                crc32c::crc32c_append(crc, s)
            };
        }
        if crc != want {
            return Ok(None);
        }
        let mut descs = Vec::with_capacity(count as usize);
        let mut next_data = desc_sectors;
        for i in 0..count {
            let pos = 64 + 32 * i;
            let within = (pos % SECTOR) as usize;
            let d = &self.sector(start, pos / SECTOR)[within..within + 32];
            let offset = u64_at(d, 16);
            if u64_at(d, 24) != sequence || !offset.is_multiple_of(SECTOR) {
                return Ok(None);
            }
            match &d[..4] {
                b"zero" => {
                    let length = u64_at(d, 8);
                    if !length.is_multiple_of(SECTOR) {
                        return Ok(None);
                    }
                    descs.push(Desc::Zero { offset, length });
                }
                b"desc" => {
                    if next_data >= sectors {
                        return Ok(None);
                    }
                    let s = self.sector(start, next_data);
                    if &s[..4] != b"data"
                        || u32_at(s, 4) != (sequence >> 32) as u32
                        || u32_at(s, 4092) != sequence as u32
                    {
                        return Ok(None);
                    }
                    let mut leading = [0u8; 8];
                    leading.copy_from_slice(&d[8..16]);
                    let mut trailing = [0u8; 4];
                    trailing.copy_from_slice(&d[4..8]);
                    descs.push(Desc::Data {
                        offset,
                        leading,
                        trailing,
                        sector: next_data,
                    });
                    next_data += 1;
                }
                _ => return Ok(None),
            }
        }
        Ok(Some(Entry {
            start,
            length,
            sequence,
            tail,
            flushed,
            last,
            descs,
        }))
    }

    /// The active sequence (2.3.3), tail first, if the log has one.
    fn active(&mut self) -> io::Result<Vec<Entry>> {
        let len = self.len();
        let mut best: Vec<Entry> = Vec::new();
        let mut s = 0;
        while s < len {
            let Some(first) = self.entry_at(s)? else {
                s += SECTOR;
                continue;
            };
            // Follow the run; it may wrap, but never covers more than the log.
            let mut covered = first.length;
            let mut chain = vec![first];
            while covered < len {
                let prev = chain.last().map_or(0, |e| e.sequence);
                let Some(next) = self.entry_at((s + covered) % len)? else {
                    break;
                };
                if prev.checked_add(1) != Some(next.sequence) || covered + next.length > len {
                    break;
                }
                covered += next.length;
                chain.push(next);
            }
            let head = chain.last().map_or((0, 0), |h| (h.tail, h.sequence));
            if let Some(t) = chain.iter().position(|e| e.start == head.0) {
                if best.last().is_none_or(|b| head.1 > b.sequence) {
                    chain.drain(..t);
                    best = chain;
                }
            }
            if s + covered >= len {
                break;
            }
            s += covered;
        }
        Ok(best)
    }
}

/// The log `header` names, searched and checked: `None` when there is
/// nothing to replay (a zero `LogGuid`, an empty log, or no active
/// sequence).
pub(crate) fn read(file: &dyn BlockDevice, header: &Header) -> io::Result<Option<Replay>> {
    let log = Region {
        offset: header.log_offset,
        length: u64::from(header.log_length),
    };
    if header.log_guid.is_zero() || log.length == 0 {
        return Ok(None);
    }
    if log.length > MAX_LOG {
        return Err(crate::unsupported(
            crate::DiskFormat::Vhdx,
            format!(
                "the log at {} needs replay and is {} MiB; logs over {} MiB are not replayed here",
                log.offset,
                log.length / MIB,
                MAX_LOG / MIB
            ),
        ));
    }
    let mut buf = vec![0u8; log.length as usize];
    read_checked(file, log.offset, &mut buf, "log")?;
    let mut l = Log {
        buf,
        guid: header.log_guid,
        at: log.offset,
        budget: 8 * log.length + MIB,
    };
    let active = l.active()?;
    let Some(head) = active.last() else {
        return Ok(None);
    };
    let file_size = file.size();
    let mut patches = Vec::new();
    let mut last_file_offset = 0;
    for e in &active {
        if e.flushed > file_size {
            return Err(bad(format!(
                "log entry {} at {}: FlushedFileOffset {} is past the end of the file ({file_size} bytes): the \
                 file was truncated after the log was written",
                e.sequence,
                log.offset + e.start,
                e.flushed
            )));
        }
        last_file_offset = last_file_offset.max(e.last);
        for d in &e.descs {
            let p = match d {
                Desc::Zero { offset, length } => Patch::Zero {
                    offset: *offset,
                    length: *length,
                },
                Desc::Data {
                    offset,
                    leading,
                    trailing,
                    sector,
                } => {
                    let s = l.sector(e.start, *sector);
                    let mut bytes = Vec::with_capacity(SECTOR as usize);
                    bytes.extend_from_slice(leading);
                    bytes.extend_from_slice(&s[8..4092]);
                    bytes.extend_from_slice(trailing);
                    Patch::Data { offset: *offset, bytes }
                }
            };
            let (off, n) = p.range();
            let end = off.checked_add(n).filter(|&end| end <= file_size);
            let ok = end.is_some_and(|end| off >= HEADERS_END && (end <= log.offset || off >= log.end()));
            if !ok {
                return Err(bad(format!(
                    "log entry {} at {}: a descriptor writes {n} bytes at {off}, which is not inside the file \
                     ({file_size} bytes) outside its headers and its log",
                    e.sequence,
                    log.offset + e.start
                )));
            }
            patches.push(p);
        }
    }
    Ok(Some(Replay {
        patches,
        entries: active.len(),
        head_sequence: head.sequence,
        last_file_offset,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vhdx::testimg::{log_entry, LogDesc, Spec, LOG_AT};
    use ext4kit_blockdev::MemDevice;

    fn spec_with(entries: Vec<(u64, Vec<u8>)>) -> (Spec, MemDevice) {
        let mut spec = Spec::dynamic(8 * MIB);
        spec.log_guid = Guid::new(1, 2, 3, [4; 8]);
        let mut img = spec.build();
        for (at, e) in entries {
            for (i, b) in e.iter().enumerate() {
                let p = (at as usize + i) % MIB as usize;
                img[LOG_AT as usize + p] = *b;
            }
        }
        (spec, MemDevice::growable(img))
    }

    fn header(dev: &MemDevice) -> Header {
        crate::vhdx::header::read_current(dev).unwrap().header
    }

    const TARGET: u64 = 3 * MIB + 16 * SECTOR;

    #[test]
    fn the_active_sequence_is_the_newest_complete_run() {
        let g = Guid::new(1, 2, 3, [4; 8]);
        let sec = |b: u8| vec![b; SECTOR as usize];
        // An old run (seq 1-2) then a newer one (seq 7-8) whose head's tail
        // is entry 7.
        let e1 = log_entry(g, 1, 0, &[LogDesc::Data(TARGET, sec(1))]);
        let e2 = log_entry(g, 2, 0, &[LogDesc::Data(TARGET, sec(2))]);
        let at7 = (e1.len() + e2.len()) as u64;
        let e7 = log_entry(
            g,
            7,
            at7 as u32,
            &[
                LogDesc::Data(TARGET, sec(7)),
                LogDesc::Zero(TARGET + SECTOR, 2 * SECTOR),
            ],
        );
        let at8 = at7 + e7.len() as u64;
        let e8 = log_entry(g, 8, at7 as u32, &[LogDesc::Data(TARGET + 2 * SECTOR, sec(8))]);
        let (_, dev) = spec_with(vec![(0, e1.clone()), (e1.len() as u64, e2), (at7, e7), (at8, e8)]);
        let r = read(&dev, &header(&dev)).unwrap().unwrap();
        assert_eq!((r.entries, r.head_sequence), (2, 8));
        assert_eq!(
            r.patches,
            vec![
                Patch::Data {
                    offset: TARGET,
                    bytes: sec(7)
                },
                Patch::Zero {
                    offset: TARGET + SECTOR,
                    length: 2 * SECTOR
                },
                Patch::Data {
                    offset: TARGET + 2 * SECTOR,
                    bytes: sec(8)
                },
            ]
        );
    }

    #[test]
    fn a_run_that_wraps_around_the_log_end_is_found() {
        let g = Guid::new(1, 2, 3, [4; 8]);
        let e5 = log_entry(g, 5, (MIB - 2 * SECTOR) as u32, &[LogDesc::Data(TARGET, vec![5; 4096])]);
        let e6 = log_entry(
            g,
            6,
            (MIB - 2 * SECTOR) as u32,
            &[LogDesc::Data(TARGET + SECTOR, vec![6; 4096])],
        );
        // e5 is 2 sectors at the log's last two; e6 follows at 0.
        let (_, dev) = spec_with(vec![(MIB - 2 * SECTOR, e5), (0, e6)]);
        let r = read(&dev, &header(&dev)).unwrap().unwrap();
        assert_eq!((r.entries, r.head_sequence), (2, 6));
    }

    #[test]
    fn damaged_or_foreign_entries_are_not_replayed() {
        let g = Guid::new(1, 2, 3, [4; 8]);
        let mut e = log_entry(g, 1, 0, &[LogDesc::Data(TARGET, vec![9; 4096])]);
        e[5000] ^= 1; // checksum no longer holds
        let (_, dev) = spec_with(vec![(0, e)]);
        assert!(read(&dev, &header(&dev)).unwrap().is_none());
        let other = log_entry(
            Guid::new(9, 9, 9, [9; 8]),
            1,
            0,
            &[LogDesc::Data(TARGET, vec![9; 4096])],
        );
        let (_, dev) = spec_with(vec![(0, other)]);
        assert!(read(&dev, &header(&dev)).unwrap().is_none());
    }

    #[test]
    fn hostile_targets_and_truncation_are_corrupt() {
        let g = Guid::new(1, 2, 3, [4; 8]);
        for (target, want) in [(64 * 1024, "headers"), (LOG_AT, "log"), (1 << 40, "inside the file")] {
            let e = log_entry(g, 1, 0, &[LogDesc::Data(target, vec![1; 4096])]);
            let (_, dev) = spec_with(vec![(0, e)]);
            let err = read(&dev, &header(&dev)).unwrap_err();
            assert!(err.to_string().contains(want), "{want}: {err}");
        }
        let e = log_entry(g, 1, 0, &[LogDesc::Zero(TARGET, u64::MAX - 4095)]);
        let (_, dev) = spec_with(vec![(0, e)]);
        assert!(read(&dev, &header(&dev)).is_err());
        let mut e = log_entry(g, 1, 0, &[]);
        crate::vhdx::bytes::put_u64(&mut e, 48, 1 << 40);
        crate::vhdx::bytes::seal(&mut e, 4);
        let (_, dev) = spec_with(vec![(0, e)]);
        let err = read(&dev, &header(&dev)).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn a_log_of_entries_claiming_the_whole_log_ends() {
        // Every sector claims to start a whole-log entry with a bad
        // checksum: the search must stop (by its work bound), not hang.
        let g = Guid::new(1, 2, 3, [4; 8]);
        let mut hdr = log_entry(g, 1, 0, &[]);
        crate::vhdx::bytes::put_u32(&mut hdr, 8, MIB as u32);
        let mut entries = Vec::new();
        for k in 0..MIB / SECTOR {
            entries.push((k * SECTOR, hdr[..SECTOR as usize].to_vec()));
        }
        let (_, dev) = spec_with(entries);
        let t = std::time::Instant::now();
        let r = read(&dev, &header(&dev));
        assert!(r.is_err() || r.unwrap().is_none());
        assert!(t.elapsed().as_secs() < 10);
    }
}
