//! A device that keeps only the blocks written to it, for building an
//! image whose output is not a raw file (an Android sparse image, later a
//! VM disk format): the filesystem is made and filled on this device, then
//! an exporter reads the written [`Run`]s in block order and writes its
//! container.
//!
//! The blocks live in an unlinked temporary file in the order they were
//! first written, with an index from device block to file slot. Its size is
//! what the filesystem wrote, not the device's size: a 4 GiB image that
//! holds 300 MiB needs 300 MiB of scratch, where building a raw image and
//! converting it (`img2simg`) needs the raw image on a filesystem with
//! holes plus the output. An exporter may [`ScratchDevice::release`] each
//! run once copied (the slots become holes), so the scratch shrinks as the
//! output grows and the two together stay near the written size.
//!
//! Unwritten blocks read as zeros, like a new sparse file: mkfs told so
//! (`device_zeroed`) skips writing zeros, which keeps them unwritten here.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use parking_lot::Mutex;
use rustix::fs::{fallocate, FallocateFlags, Mode, OFlags};

use crate::BlockDevice;

/// The unit the scratch keeps: a 4 KiB block, the block size of Android
/// sparse images (libsparse's default) and the page every host filesystem
/// can punch. Writes smaller than a unit (the superblock at byte 1024)
/// read, modify and write the unit.
pub const UNIT: u64 = 4096;

/// A stretch of written units: device units `start..start + len` are kept
/// at scratch slots `slot..slot + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    slot: u64,
    len: u64,
}

/// Written device units, in block order, as an exporter sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First device unit ([`UNIT`] bytes each).
    pub start: u64,
    /// Number of units.
    pub len: u64,
}

#[derive(Debug)]
struct State {
    /// Device unit where a span starts → the span. Spans never overlap;
    /// adjacent ones are merged when their slots are adjacent too.
    spans: BTreeMap<u64, Span>,
    /// The next free slot at the end of the scratch file.
    next_slot: u64,
}

/// See the module doc.
#[derive(Debug)]
pub struct ScratchDevice {
    file: File,
    size: u64,
    state: Mutex<State>,
}

impl ScratchDevice {
    /// A device of `size` bytes (a multiple of [`UNIT`]) whose written
    /// blocks are kept in an unlinked file created in `dir` (`O_TMPFILE`,
    /// or a name unlinked at once where the filesystem has none: nothing
    /// is left behind if the process dies).
    pub fn new(dir: &Path, size: u64) -> io::Result<ScratchDevice> {
        if size == 0 || !size.is_multiple_of(UNIT) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a scratch device's size must be a positive multiple of {UNIT} bytes, not {size}"),
            ));
        }
        let fail = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("cannot make a temporary file in {}: {e}", dir.display()),
            )
        };
        let mode = Mode::from_raw_mode(0o600);
        let file = match rustix::fs::open(dir, OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC, mode) {
            Ok(fd) => File::from(fd),
            // A filesystem without O_TMPFILE (NFS, some FUSE servers): a
            // new name, unlinked at once.
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR | rustix::io::Errno::INVAL) => {
                unlinked_file(dir).map_err(fail)?
            }
            Err(e) => return Err(fail(e.into())),
        };
        Ok(ScratchDevice {
            file,
            size,
            state: Mutex::new(State {
                spans: BTreeMap::new(),
                next_slot: 0,
            }),
        })
    }

    /// The written runs in block order (adjacent spans joined).
    pub fn runs(&self) -> Vec<Run> {
        let st = self.state.lock();
        let mut out: Vec<Run> = Vec::new();
        for (&start, sp) in &st.spans {
            match out.last_mut() {
                Some(r) if r.start + r.len == start => r.len += sp.len,
                _ => out.push(Run { start, len: sp.len }),
            }
        }
        out
    }

    /// Bytes the scratch file holds (written units × [`UNIT`]).
    pub fn written_bytes(&self) -> u64 {
        self.state.lock().spans.values().map(|s| s.len).sum::<u64>() * UNIT
    }

    /// Gives back the scratch space of device units `start..start + len`
    /// (they must have been exported already: they read as zeros after).
    /// Best effort: a filesystem that cannot punch holes keeps the space.
    pub fn release(&self, start: u64, len: u64) {
        let mut st = self.state.lock();
        let end = start + len;
        // The span that may start before `start`, and those inside.
        let before = st.spans.range(..start).next_back().map(|(&k, _)| k);
        let keys: Vec<u64> = before
            .into_iter()
            .chain(st.spans.range(start..end).map(|(&k, _)| k))
            .collect();
        for k in keys {
            let sp = st.spans[&k];
            let (a, b) = (k.max(start), (k + sp.len).min(end));
            if a >= b {
                continue;
            }
            // The slots of the released part become a hole in the file
            // (FALLOC_FL_PUNCH_HOLE must come with KEEP_SIZE).
            let _ = fallocate(
                &self.file,
                FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                (sp.slot + (a - k)) * UNIT,
                (b - a) * UNIT,
            );
            st.spans.remove(&k);
            if k < a {
                st.spans.insert(
                    k,
                    Span {
                        slot: sp.slot,
                        len: a - k,
                    },
                );
            }
            if b < k + sp.len {
                st.spans.insert(
                    b,
                    Span {
                        slot: sp.slot + (b - k),
                        len: k + sp.len - b,
                    },
                );
            }
        }
    }

    /// Where device unit `u` is kept, and how many units from `u` on are
    /// kept contiguously in the same span (`None`: unwritten, and how
    /// many units until the next written one, at most `max`).
    fn locate(st: &State, u: u64, max: u64) -> (Option<u64>, u64) {
        if let Some((&k, sp)) = st.spans.range(..=u).next_back() {
            if u < k + sp.len {
                return (Some(sp.slot + (u - k)), (k + sp.len - u).min(max));
            }
        }
        let gap = st.spans.range(u + 1..).next().map_or(max, |(&k, _)| (k - u).min(max));
        (None, gap)
    }

    /// Writes whole units `u..` from `data` (a multiple of [`UNIT`]).
    fn write_units(&self, st: &mut State, mut u: u64, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let want = data.len() as u64 / UNIT;
            let (at, n) = Self::locate(st, u, want);
            let bytes = (n * UNIT) as usize;
            let slot = match at {
                Some(slot) => slot,
                None => {
                    let slot = st.next_slot;
                    st.next_slot += n;
                    // A run that continues the span before it, in the
                    // device and in the file, extends it: the index stays
                    // one entry per stretch a file's data was written in.
                    match st.spans.range_mut(..u).next_back() {
                        Some((&k, sp)) if k + sp.len == u && sp.slot + sp.len == slot => sp.len += n,
                        _ => {
                            st.spans.insert(u, Span { slot, len: n });
                        }
                    }
                    slot
                }
            };
            self.file.write_all_at(&data[..bytes], slot * UNIT)?;
            data = &data[bytes..];
            u += n;
        }
        Ok(())
    }

    /// Reads whole units `u..` into `buf` (a multiple of [`UNIT`]).
    fn read_units(&self, st: &State, mut u: u64, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let want = buf.len() as u64 / UNIT;
            let (at, n) = Self::locate(st, u, want);
            let (head, rest) = buf.split_at_mut((n * UNIT) as usize);
            match at {
                Some(slot) => self.file.read_exact_at(head, slot * UNIT)?,
                None => head.fill(0),
            }
            buf = rest;
            u += n;
        }
        Ok(())
    }

    fn check_range(&self, off: u64, len: usize, what: &str) -> io::Result<()> {
        if off.checked_add(len as u64).is_none_or(|end| end > self.size) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{what} of {len} bytes at offset {off} past the end of the image ({} bytes)",
                    self.size
                ),
            ));
        }
        Ok(())
    }
}

/// A new file in `dir` under a name of its own, unlinked at once: the
/// scratch where the filesystem has no `O_TMPFILE` (NFS, some FUSE
/// servers).
fn unlinked_file(dir: &Path) -> io::Result<File> {
    let path = dir.join(format!(".ext4kit-scratch-{}", std::process::id()));
    let f = File::options().read(true).write(true).create_new(true).open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(f)
}

impl BlockDevice for ScratchDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_range(off, buf.len(), "read")?;
        if buf.is_empty() {
            return Ok(());
        }
        let st = self.state.lock();
        let first = off / UNIT;
        let last = (off + buf.len() as u64 - 1) / UNIT;
        if off.is_multiple_of(UNIT) && (buf.len() as u64).is_multiple_of(UNIT) {
            return self.read_units(&st, first, buf);
        }
        let mut tmp = vec![0u8; ((last - first + 1) * UNIT) as usize];
        self.read_units(&st, first, &mut tmp)?;
        let skip = (off - first * UNIT) as usize;
        buf.copy_from_slice(&tmp[skip..skip + buf.len()]);
        Ok(())
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.check_range(off, buf.len(), "write")?;
        if buf.is_empty() {
            return Ok(());
        }
        // One lock over index and I/O: a partial unit's read-modify-write
        // must not interleave with another write of that unit, and the
        // scratch file is page cache on the host (a memcpy, not a wait).
        let mut st = self.state.lock();
        let first = off / UNIT;
        let last = (off + buf.len() as u64 - 1) / UNIT;
        if off.is_multiple_of(UNIT) && (buf.len() as u64).is_multiple_of(UNIT) {
            return self.write_units(&mut st, first, buf);
        }
        let mut tmp = vec![0u8; ((last - first + 1) * UNIT) as usize];
        // Only the first and last units can be partly covered.
        self.read_units(&st, first, &mut tmp[..UNIT as usize])?;
        let tail = tmp.len() - UNIT as usize;
        if last > first {
            self.read_units(&st, last, &mut tmp[tail..])?;
        }
        let skip = (off - first * UNIT) as usize;
        tmp[skip..skip + buf.len()].copy_from_slice(buf);
        self.write_units(&mut st, first, &tmp)
    }

    fn flush(&self) -> io::Result<()> {
        // The scratch is discarded if the process dies: durability is the
        // exporter's business (it syncs the output it writes).
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn dev(units: u64) -> ScratchDevice {
        ScratchDevice::new(&std::env::temp_dir(), units * UNIT).unwrap()
    }

    #[test]
    fn reads_back_like_a_zeroed_device_under_random_writes() {
        // The same writes on a zero-filled memory device and on the
        // scratch: every read agrees, and the runs are exactly the units
        // any write touched.
        let units = 64;
        let s = dev(units);
        let m = MemDevice::new((units * UNIT) as usize);
        let mut rng = StdRng::seed_from_u64(7);
        let mut touched = vec![false; units as usize];
        for i in 0..400 {
            let off = rng.random_range(0..units * UNIT - 1);
            let len = rng.random_range(1..=(units * UNIT - off).min(5 * UNIT)) as usize;
            let data: Vec<u8> = (0..len).map(|j| (i + j) as u8 | 1).collect();
            s.write_at(off, &data).unwrap();
            m.write_at(off, &data).unwrap();
            for u in off / UNIT..=(off + len as u64 - 1) / UNIT {
                touched[u as usize] = true;
            }
            let roff = rng.random_range(0..units * UNIT - 1);
            let rlen = rng.random_range(1..=(units * UNIT - roff).min(7 * UNIT)) as usize;
            let (mut a, mut b) = (vec![0; rlen], vec![0; rlen]);
            s.read_at(roff, &mut a).unwrap();
            m.read_at(roff, &mut b).unwrap();
            assert_eq!(a, b, "read of {rlen} at {roff} after write {i}");
        }
        let mut want = Vec::new();
        for (u, &t) in touched.iter().enumerate() {
            match (t, want.last_mut()) {
                (true, Some(Run { start, len })) if *start + *len == u as u64 => *len += 1,
                (true, _) => want.push(Run {
                    start: u as u64,
                    len: 1,
                }),
                (false, _) => {}
            }
        }
        assert_eq!(s.runs(), want);
        let written: u64 = want.iter().map(|r| r.len).sum::<u64>() * UNIT;
        assert_eq!(s.written_bytes(), written);
    }

    #[test]
    fn sequential_writes_keep_one_span() {
        let s = dev(1024);
        for u in 100..600 {
            s.write_at(u * UNIT, &[9u8; UNIT as usize]).unwrap();
        }
        assert_eq!(s.state.lock().spans.len(), 1);
        assert_eq!(s.runs(), vec![Run { start: 100, len: 500 }]);
    }

    #[test]
    fn release_reads_zeros_and_keeps_the_rest() {
        let s = dev(32);
        s.write_at(0, &vec![5u8; (10 * UNIT) as usize]).unwrap();
        s.release(3, 4);
        assert_eq!(s.runs(), vec![Run { start: 0, len: 3 }, Run { start: 7, len: 3 }]);
        let mut b = vec![1u8; (10 * UNIT) as usize];
        s.read_at(0, &mut b).unwrap();
        assert!(b[..(3 * UNIT) as usize].iter().all(|&x| x == 5));
        assert!(b[(3 * UNIT) as usize..(7 * UNIT) as usize].iter().all(|&x| x == 0));
        assert!(b[(7 * UNIT) as usize..].iter().all(|&x| x == 5));
    }

    #[test]
    fn the_fallback_scratch_file_leaves_no_name() {
        let d = std::env::temp_dir().join(format!("ext4kit-scratch-fallback-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = unlinked_file(&d).unwrap();
        f.write_all_at(b"kept", 0).unwrap();
        let mut b = [0u8; 4];
        f.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"kept");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "the name is gone");
        std::fs::remove_dir(&d).unwrap();
    }

    #[test]
    fn out_of_range_and_bad_sizes_are_errors() {
        let s = dev(2);
        assert!(s.write_at(2 * UNIT - 1, &[0, 0]).is_err());
        assert!(s.read_at(2 * UNIT, &mut [0]).is_err());
        assert!(ScratchDevice::new(&std::env::temp_dir(), 4097).is_err());
        assert!(ScratchDevice::new(Path::new("/nonexistent-dir"), UNIT).is_err());
    }
}
