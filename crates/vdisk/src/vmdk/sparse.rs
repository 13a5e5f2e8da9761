//! The hosted sparse extent: a grain directory (GD) of grain table (GT)
//! sector offsets, grain tables of grain sector offsets, and grains.
//!
//! Spec ("Hosted Sparse Extents"): grain `n` of the extent is found
//! through GDE `n / numGTEsPerGT`, which holds the sector of a GT, whose
//! entry `n % numGTEsPerGT` (a GTE) holds the sector of the grain. A GTE
//! of 0 is a grain never written (zeros: no parent is opened here); a GTE
//! of 1 with the zeroed-grain flag is a grain of zeros. A GDE of 0 is a
//! GT not yet allocated. Both are 32-bit sector numbers, so an extent file
//! ends before 2 TiB.
//!
//! Reading: the GD is held in memory (checked to lie in the file, so its
//! size is bounded by the file's); a GTE is read from the file when it is
//! needed (the OS caches it), so no grain table is held and a read of an
//! allocated grain takes no lock.
//!
//! Writing: a write into an allocated grain goes in place. A first write
//! into a grain appends the whole grain at the end of the file under the
//! allocation lock; the new GTE is kept in memory (`pending`) until
//! [`SparseExtent::flush`], which makes the grains durable first and only
//! then writes the GTEs (and the GDEs of grain tables allocated meanwhile)
//! and makes those durable: a table entry never reaches the disk before
//! the data it points at. The redundant GD and GTs (`rgdOffset`) are kept
//! in step.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::file::ExtentFile;
use super::header::{cow_geometry, Geometry, HostedHeader, Kind, COWD, GD_AT_END, KDMV, SECTOR};
use super::stream;
use crate::{corrupt, unsupported, DiskFormat};

/// Compressed grains recently inflated, kept per extent: reads of a
/// stream come in blocks much smaller than a grain.
const INFLATED_CACHE: usize = 8;

/// Where one grain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grain {
    /// Never written, or a zeroed grain: reads as zeros.
    Zero,
    /// At this sector of the file.
    At(u64),
}

/// What the allocation lock guards.
struct Alloc {
    /// The next free sector at the end of the file.
    next_free: u64,
    /// GD indexes whose GT was allocated since the last flush.
    new_gts: Vec<u64>,
}

/// One sparse extent file (KDMV, or COWD read-only).
pub(crate) struct SparseExtent {
    file: Arc<dyn ExtentFile>,
    geo: Geometry,
    /// The grain directory: GT sectors, by GD index.
    gd: Vec<AtomicU32>,
    /// The redundant grain directory, when kept.
    rgd: Option<Vec<AtomicU32>>,
    writable: bool,
    alloc: Mutex<Alloc>,
    /// GTEs of grains allocated since the last flush, by grain index.
    pending: RwLock<HashMap<u64, u32>>,
    /// Serialises flushes (a flush's two phases must not interleave).
    flushing: Mutex<()>,
    inflated: Mutex<Vec<(u64, Arc<[u8]>)>>,
    what: String,
}

impl SparseExtent {
    /// Open the sparse extent in `file` (its header decides KDMV or COWD).
    /// `what` names it in errors ("extent 2 (disk-s002.vmdk)").
    pub(crate) fn open(file: Arc<dyn ExtentFile>, writable: bool, what: String) -> io::Result<SparseExtent> {
        let len = file.len();
        let mut h = [0u8; SECTOR as usize];
        let head = &mut h[..len.min(SECTOR) as usize];
        file.read_at(0, head)?;
        if !(head.starts_with(KDMV) || head.starts_with(COWD)) {
            return Err(corrupt(
                DiskFormat::Vmdk,
                format!("{what}: no sparse extent magic (KDMV or COWD)"),
            ));
        }
        if len < SECTOR {
            return Err(corrupt(
                DiskFormat::Vmdk,
                format!("{what}: {len} bytes, too short for a sparse extent header"),
            ));
        }
        let geo = if &h[..4] == KDMV {
            let mut hdr = HostedHeader::parse(&h);
            if hdr.gd_offset == GD_AT_END {
                let footer = stream::footer_header(&*file, &what)?;
                // The footer is the header to use; the descriptor stays where
                // the primary header put it.
                let (d_off, d_size) = (hdr.descriptor_offset, hdr.descriptor_size);
                hdr = footer;
                hdr.descriptor_offset = d_off;
                hdr.descriptor_size = d_size;
            }
            hdr.geometry(len, &what)?
        } else {
            cow_geometry(&h, len, &what)?
        };
        if writable {
            if geo.compressed {
                return Err(unsupported(
                    DiskFormat::Vmdk,
                    "streamOptimized images are read-only (convert with qemu-img convert -O vmdk first)",
                ));
            }
            if geo.kind == Kind::Cow {
                return Err(unsupported(
                    DiskFormat::Vmdk,
                    format!("{what}: COWD (vmfsSparse) extents are read-only here"),
                ));
            }
            if !file.grows() {
                return Err(unsupported(
                    DiskFormat::Vmdk,
                    format!(
                        "{what}: writing a sparse extent appends grains to its file, which a device of fixed size (a disk, \
                         a partition, a fixed buffer) cannot hold; copy the image to a regular file to write it"
                    ),
                ));
            }
        }
        let gd = read_directory(&*file, geo.gd, geo.gd_entries)?;
        let rgd = match geo.rgd {
            Some(r) if writable => Some(read_directory(&*file, r, geo.gd_entries)?),
            _ => None,
        };
        let next_free = len.div_ceil(SECTOR).max(geo.meta_end);
        Ok(SparseExtent {
            file,
            geo,
            gd,
            rgd,
            writable,
            alloc: Mutex::new(Alloc {
                next_free,
                new_gts: Vec::new(),
            }),
            pending: RwLock::new(HashMap::new()),
            flushing: Mutex::new(()),
            inflated: Mutex::new(Vec::new()),
            what,
        })
    }

    /// The checked header.
    pub(crate) fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// The embedded descriptor's bytes, if the header names one.
    pub(crate) fn embedded_descriptor(&self) -> io::Result<Option<Vec<u8>>> {
        let Some((off, size)) = self.geo.descriptor else {
            return Ok(None);
        };
        // Checked against the file and 1 MiB when the header was read.
        let mut buf = vec![0u8; (size * SECTOR) as usize];
        self.file.read_at(off * SECTOR, &mut buf)?;
        Ok(Some(buf))
    }

    /// Capacity in bytes.
    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.geo.capacity * SECTOR
    }

    fn bad(&self, why: String) -> io::Error {
        corrupt(DiskFormat::Vmdk, format!("{}: {why}", self.what))
    }

    /// The sector of the GTE for grain `n`, if its GT is allocated.
    fn gte_pos(&self, n: u64) -> io::Result<Option<u64>> {
        let gdi = n / u64::from(self.geo.gtes);
        let gti = n % u64::from(self.geo.gtes);
        let Some(gde) = self.gd.get(gdi as usize) else {
            return Err(self.bad(format!("grain {n} is past the grain directory")));
        };
        let gt = u64::from(gde.load(Ordering::Acquire));
        if gt == 0 {
            return Ok(None);
        }
        let end = gt + self.geo.gt_sectors();
        if end * SECTOR > self.file.len() {
            return Err(self.bad(format!(
                "GDE {gdi} points at a grain table at sector {gt}, past the end of the file"
            )));
        }
        // A GT that overlaps a directory or the descriptor would have its
        // entries written over them.
        let gd_sectors = (self.geo.gd_entries * 4).div_ceil(SECTOR);
        let overlaps = |at: u64, len: u64| gt < at + len && at < end;
        if overlaps(self.geo.gd, gd_sectors)
            || self.geo.rgd.is_some_and(|r| overlaps(r, gd_sectors))
            || self.geo.descriptor.is_some_and(|(d, l)| overlaps(d, l))
        {
            return Err(self.bad(format!(
                "GDE {gdi} points at a grain table at sector {gt}, inside a grain directory or the descriptor"
            )));
        }
        Ok(Some(gt * SECTOR + gti * 4))
    }

    fn read_gte(&self, pos: u64) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.file.read_at(pos, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Where grain `n` is: its GTE as the file has it, or as allocated
    /// since the last flush.
    fn lookup(&self, n: u64) -> io::Result<Grain> {
        let Some(pos) = self.gte_pos(n)? else {
            return Ok(Grain::Zero);
        };
        let gte = self.read_gte(pos)?;
        let unwritten = |g: u32| g == 0 || (g == 1 && self.geo.zero_grain);
        if !unwritten(gte) {
            return Ok(Grain::At(u64::from(gte)));
        }
        if !self.writable {
            return Ok(Grain::Zero);
        }
        if let Some(&s) = self.pending.read().get(&n) {
            return Ok(Grain::At(u64::from(s)));
        }
        // A flush writes the GTE before it drops the pending entry: read
        // the file again so an entry flushed meanwhile is not missed.
        let gte = self.read_gte(pos)?;
        Ok(if unwritten(gte) {
            Grain::Zero
        } else {
            Grain::At(u64::from(gte))
        })
    }

    /// Read `buf` from byte `off` of the extent (inside its capacity).
    pub(crate) fn read(&self, mut off: u64, mut buf: &mut [u8]) -> io::Result<()> {
        let gb = self.geo.grain_bytes();
        while !buf.is_empty() {
            let n = off / gb;
            let within = off % gb;
            let take = ((gb - within) as usize).min(buf.len());
            let (piece, rest) = buf.split_at_mut(take);
            match self.lookup(n)? {
                Grain::Zero => piece.fill(0),
                Grain::At(s) if self.geo.compressed => {
                    let g = self.inflate(n, s)?;
                    piece.copy_from_slice(&g[within as usize..within as usize + take]);
                }
                Grain::At(s) => {
                    let at = self.grain_at(n, s, within, take as u64, false)?;
                    self.file.read_at(at, piece)?;
                }
            }
            buf = rest;
            off += take as u64;
        }
        Ok(())
    }

    /// The file offset of bytes `within..within+len` of grain `n` at
    /// sector `s`, checked to be inside the file and, for a write, after
    /// the metadata.
    fn grain_at(&self, n: u64, s: u64, within: u64, len: u64, write: bool) -> io::Result<u64> {
        let start = s * SECTOR;
        if s == 0 || (write && s < self.geo.meta_end) {
            return Err(self.bad(format!(
                "grain {n} at sector {s} lies in the header or the tables (overHead is {} sectors)",
                self.geo.meta_end
            )));
        }
        if start + within + len > self.file.len() {
            return Err(self.bad(format!(
                "grain {n} at sector {s} is past the end of the file ({} bytes)",
                self.file.len()
            )));
        }
        Ok(start + within)
    }

    fn inflate(&self, n: u64, s: u64) -> io::Result<Arc<[u8]>> {
        if let Some((_, g)) = self.inflated.lock().iter().find(|(k, _)| *k == n) {
            return Ok(g.clone());
        }
        let mut g = vec![0u8; self.geo.grain_bytes() as usize];
        stream::read_grain(&*self.file, s, n * self.geo.grain, self.geo.markers, &mut g, &self.what)?;
        let g: Arc<[u8]> = g.into();
        let mut c = self.inflated.lock();
        if c.len() >= INFLATED_CACHE {
            c.remove(0);
        }
        c.push((n, g.clone()));
        Ok(g)
    }

    /// Write `buf` at byte `off` of the extent (inside its capacity).
    pub(crate) fn write(&self, mut off: u64, mut buf: &[u8]) -> io::Result<()> {
        let gb = self.geo.grain_bytes();
        while !buf.is_empty() {
            let n = off / gb;
            let within = off % gb;
            let take = ((gb - within) as usize).min(buf.len());
            let (piece, rest) = buf.split_at(take);
            match self.lookup(n)? {
                Grain::At(s) => {
                    let at = self.grain_at(n, s, within, take as u64, true)?;
                    self.file.write_at(at, piece)?;
                }
                Grain::Zero => self.allocate(n, within, piece)?,
            }
            buf = rest;
            off += take as u64;
        }
        Ok(())
    }

    /// First write into grain `n`: append the whole grain (zeros around
    /// `data`) and record its GTE as pending; allocate its GT first if the
    /// GDE is 0.
    fn allocate(&self, n: u64, within: u64, data: &[u8]) -> io::Result<()> {
        let mut a = self.alloc.lock();
        // Another writer may have allocated it while we waited.
        if let Grain::At(s) = self.lookup(n)? {
            drop(a);
            let at = self.grain_at(n, s, within, data.len() as u64, true)?;
            return self.file.write_at(at, data);
        }
        let gdi = n / u64::from(self.geo.gtes);
        if self.gd[gdi as usize].load(Ordering::Acquire) == 0 {
            // A new GT (and redundant GT) of zeros; its GDE is written at
            // the next flush, after the GT is durable.
            let gt = self.append_zeros(&mut a, self.geo.gt_sectors())?;
            if let Some(rgd) = &self.rgd {
                let rgt = self.append_zeros(&mut a, self.geo.gt_sectors())?;
                rgd[gdi as usize].store(rgt, Ordering::Release);
            }
            self.gd[gdi as usize].store(gt, Ordering::Release);
            a.new_gts.push(gdi);
        }
        let gb = self.geo.grain_bytes() as usize;
        let s = self.reserve(&mut a, self.geo.grain)?;
        if data.len() == gb {
            self.file.write_at(u64::from(s) * SECTOR, data)?;
        } else {
            let mut g = vec![0u8; gb];
            g[within as usize..within as usize + data.len()].copy_from_slice(data);
            self.file.write_at(u64::from(s) * SECTOR, &g)?;
        }
        self.pending.write().insert(n, s);
        Ok(())
    }

    /// Reserve `sectors` at the end of the file; grain and GT offsets are
    /// 32-bit sector numbers.
    fn reserve(&self, a: &mut Alloc, sectors: u64) -> io::Result<u32> {
        let s = a.next_free;
        let end = s + sectors;
        if end > u64::from(u32::MAX) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "vmdk: {}: the extent file is full (grain offsets are 32-bit sectors: 2 TiB)",
                    self.what
                ),
            ));
        }
        a.next_free = end;
        Ok(s as u32)
    }

    fn append_zeros(&self, a: &mut Alloc, sectors: u64) -> io::Result<u32> {
        let s = self.reserve(a, sectors)?;
        self.file
            .write_at(u64::from(s) * SECTOR, &vec![0u8; (sectors * SECTOR) as usize])?;
        Ok(s)
    }

    /// Make every write durable: grains (and new GTs) first, then the GTEs
    /// and GDEs that point at them.
    pub(crate) fn flush(&self) -> io::Result<()> {
        if !self.writable {
            return Ok(());
        }
        let _f = self.flushing.lock();
        // What to publish: everything allocated before this point.
        let (entries, new_gts) = {
            let mut a = self.alloc.lock();
            let entries: Vec<(u64, u32)> = self.pending.read().iter().map(|(&k, &v)| (k, v)).collect();
            (entries, std::mem::take(&mut a.new_gts))
        };
        // Phase 1: the grains and the zeroed GTs they will hang off.
        self.file.flush()?;
        if entries.is_empty() && new_gts.is_empty() {
            return Ok(());
        }
        // Phase 2: the entries that point at them.
        let publish = || -> io::Result<()> {
            let gtes = u64::from(self.geo.gtes);
            for &(n, s) in &entries {
                let (gdi, gti) = ((n / gtes) as usize, n % gtes);
                let gt = u64::from(self.gd[gdi].load(Ordering::Acquire));
                self.file.write_at(gt * SECTOR + gti * 4, &s.to_le_bytes())?;
                if let Some(rgd) = &self.rgd {
                    let rgt = u64::from(rgd[gdi].load(Ordering::Acquire));
                    if rgt != 0 && (rgt + self.geo.gt_sectors()) * SECTOR <= self.file.len() {
                        self.file.write_at(rgt * SECTOR + gti * 4, &s.to_le_bytes())?;
                    }
                }
            }
            for &gdi in &new_gts {
                let gt = self.gd[gdi as usize].load(Ordering::Acquire);
                self.file.write_at(self.geo.gd * SECTOR + gdi * 4, &gt.to_le_bytes())?;
                if let (Some(rgd), Some(r)) = (&self.rgd, self.geo.rgd) {
                    let rgt = rgd[gdi as usize].load(Ordering::Acquire);
                    self.file.write_at(r * SECTOR + gdi * 4, &rgt.to_le_bytes())?;
                }
            }
            self.file.flush()
        };
        if let Err(e) = publish() {
            // Nothing is dropped from `pending`; GDEs are written again
            // next time.
            self.alloc.lock().new_gts.extend(new_gts);
            return Err(e);
        }
        let mut p = self.pending.write();
        for (n, s) in entries {
            if p.get(&n) == Some(&s) {
                p.remove(&n);
            }
        }
        Ok(())
    }
}

/// Read a grain directory of `entries` GDEs at `sector` (checked to lie in
/// the file by the header).
fn read_directory(file: &dyn ExtentFile, sector: u64, entries: u64) -> io::Result<Vec<AtomicU32>> {
    let mut raw = vec![0u8; (entries * 4) as usize];
    file.read_at(sector * SECTOR, &mut raw)?;
    Ok(raw
        .chunks_exact(4)
        .map(|c| AtomicU32::new(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect())
}
