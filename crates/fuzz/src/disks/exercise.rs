//! What a case does with a mutated image: open it as a container, read
//! the whole virtual disk (bounded), open the filesystem inside and walk
//! it, then — if it opens writable — write a few blocks and flush.
//!
//! Errors are the expected outcome and are only counted; the failures
//! this module can show are panics (caught by the caller), hangs and
//! runaway memory (caught by the supervising process). Each stage is
//! announced through `phase` so a hang is reported with where it was.

use std::path::Path;
use std::sync::Arc;

use ext4kit::{Fs, OpenOptions};
use ext4kit_blockdev::{BlockDevice, FileDevice};
use ext4kit_vdisk::{open_device, DiskRequest};

use super::seeds::Family;
use crate::walk::{walk_with, WalkLimits};

/// Bounds of one case.
#[derive(Debug, Clone, Copy)]
pub struct ExerciseLimits {
    /// Bytes read through the container per opened disk.
    pub read_budget: u64,
    /// Open the filesystem and walk it.
    pub engine: bool,
}

impl Default for ExerciseLimits {
    fn default() -> Self {
        ExerciseLimits { read_budget: 256 << 20, engine: true }
    }
}

/// What happened (none of it a failure).
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The container opened read-only (disks: one, or one per LV).
    pub opened: u32,
    /// The open error, if it did not.
    pub open_error: Option<String>,
    /// Bytes read, and read errors.
    pub bytes_read: u64,
    /// Read errors.
    pub read_errors: u64,
    /// The filesystem opened.
    pub fs_opened: bool,
    /// Names the walk visited.
    pub walked: u64,
    /// Walk errors.
    pub walk_errors: u64,
    /// Opened writable.
    pub writable: bool,
    /// Writes or flushes that failed.
    pub write_errors: u64,
    /// Blocks written that read back different (noted, not a failure:
    /// on a hostile image two table entries may alias).
    pub readback_mismatches: u64,
}

impl Outcome {
    /// One line for reports.
    pub fn line(&self) -> String {
        format!(
            "opened={} open_error={:?} read={} read_errors={} fs={} walked={} walk_errors={} writable={} \
             write_errors={} readback_mismatches={}",
            self.opened,
            self.open_error,
            self.bytes_read,
            self.read_errors,
            self.fs_opened,
            self.walked,
            self.walk_errors,
            self.writable,
            self.write_errors,
            self.readback_mismatches
        )
    }
}

/// Open the image at `path` (family `family`) and exercise it.
pub fn exercise(family: Family, path: &Path, lim: &ExerciseLimits, phase: &mut dyn FnMut(&str)) -> Outcome {
    let mut out = Outcome::default();
    phase("open read-only");
    match open(family, path, false) {
        Ok(devs) => {
            for (name, dev) in devs {
                out.opened += 1;
                read_all(&name, &*dev, lim.read_budget, &mut out, phase);
                if lim.engine {
                    engine(&name, dev, &mut out, phase);
                }
            }
        }
        Err(e) => out.open_error = Some(e),
    }
    phase("open writable");
    if let Ok(devs) = open(family, path, true) {
        out.writable = true;
        for (name, dev) in devs {
            write_some(&name, &*dev, &mut out, phase);
        }
    }
    phase("done");
    out
}

type Devs = Vec<(String, Arc<dyn BlockDevice>)>;

/// The disk(s) the image holds: one for a container, one per LV for a PV.
fn open(family: Family, path: &Path, writable: bool) -> Result<Devs, String> {
    let file = FileDevice::open(path, writable).map_err(|e| e.to_string())?;
    let file: Arc<dyn BlockDevice> = Arc::new(file);
    if family != Family::Lvm {
        let req = DiskRequest { writable, ..Default::default() };
        let disk = open_device(file, Some(path), &req).map_err(|e| e.to_string())?;
        return Ok(vec![("disk".into(), disk.into_device())]);
    }
    let vgs = ext4kit_vdisk::lvm::volume_groups(&[("pv".into(), file)]).map_err(|e| e.to_string())?;
    let mut out: Devs = Vec::new();
    let mut first_err = None;
    for vg in &vgs {
        for lv in vg.logical_volumes() {
            match vg.open(lv.name(), writable) {
                Ok(d) => out.push((format!("{}/{}", vg.name(), lv.name()), Arc::new(d))),
                Err(e) => first_err = first_err.or(Some(e.to_string())),
            }
        }
    }
    match (out.is_empty(), first_err) {
        (true, Some(e)) => Err(e),
        (true, None) => Err("no logical volume".into()),
        _ => Ok(out),
    }
}

/// Read from the start in 1 MiB chunks up to half the budget, then the
/// last MiB and a few chunks spread over the disk (the end of a huge
/// disk is where offset arithmetic overflows).
fn read_all(name: &str, dev: &dyn BlockDevice, budget: u64, out: &mut Outcome, phase: &mut dyn FnMut(&str)) {
    const CHUNK: u64 = 1 << 20;
    let size = dev.size();
    let mut buf = vec![0u8; CHUNK as usize];
    let mut offsets: Vec<u64> = (0..size.min(budget / 2).div_ceil(CHUNK)).map(|i| i * CHUNK).collect();
    if size > budget / 2 {
        offsets.push(size.saturating_sub(CHUNK));
        offsets.push(size.saturating_sub(512));
        let spread = (budget / 2 / CHUNK).min(16);
        offsets.extend((1..spread).map(|i| (size / spread * i) & !511));
    }
    let mut spent = 0;
    for off in offsets {
        let n = CHUNK.min(size - off.min(size)) as usize;
        if n == 0 || spent >= budget {
            continue;
        }
        phase(&format!("{name}: read {n} bytes at {off:#x} of {size:#x}"));
        match dev.read_at(off, &mut buf[..n]) {
            Ok(()) => out.bytes_read += n as u64,
            Err(_) => out.read_errors += 1,
        }
        spent += n as u64;
    }
}

/// The filesystem inside, read-only, and a short walk.
fn engine(name: &str, dev: Arc<dyn BlockDevice>, out: &mut Outcome, phase: &mut dyn FnMut(&str)) {
    phase(&format!("{name}: Fs::open_device"));
    let opts = OpenOptions { read_only: true, cache_budget: 16 << 20, ..Default::default() };
    let Ok(fs) = Fs::open_device(dev, &opts) else { return };
    out.fs_opened = true;
    phase(&format!("{name}: walk"));
    let _ = fs.info();
    let lim = WalkLimits { max_total_bytes: 16 << 20, max_inodes: 2000, ..Default::default() };
    let w = walk_with(&fs, &lim, None);
    out.walked += w.entries;
    out.walk_errors += w.error_count();
}

/// Write a block near the start, the middle and the end; flush; read back.
fn write_some(name: &str, dev: &dyn BlockDevice, out: &mut Outcome, phase: &mut dyn FnMut(&str)) {
    let size = dev.size();
    let mut done = Vec::new();
    for (i, off) in [64 << 10, size / 2, size.saturating_sub(4096)].into_iter().enumerate() {
        let off = off & !4095;
        if off + 4096 > size {
            continue;
        }
        let block = vec![0xA5 ^ i as u8; 4096];
        phase(&format!("{name}: write 4096 bytes at {off:#x} of {size:#x}"));
        match dev.write_at(off, &block) {
            Ok(()) => done.push((off, block)),
            Err(_) => out.write_errors += 1,
        }
    }
    phase(&format!("{name}: flush"));
    if dev.flush().is_err() {
        out.write_errors += 1;
    }
    let mut back = vec![0u8; 4096];
    for (off, block) in done {
        phase(&format!("{name}: read back {off:#x}"));
        if dev.read_at(off, &mut back).is_err() || back != block {
            out.readback_mismatches += 1;
        }
    }
}
