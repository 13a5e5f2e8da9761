//! Crash tests under a container format: the recording device holds the
//! container FILE (qcow2, VHDX, VHD, VMDK), the format layer sits on it, the engine on
//! the format layer. A power cut then cuts the container's own write
//! sequence — data clusters, L2 tables and refcount blocks, payload blocks
//! and BAT entries, grains and grain tables — at every point, and each
//! crash image is a container file.
//!
//! qemu-img is the oracle for the container: `qemu-img check` must find
//! every crash image (and every image after our replay) clean, and
//! `qemu-img convert -O raw` must read the same guest disk as our format
//! layer does. The rules relied on:
//!
//! - `qemu-img check` exits 0 when clean, 3 when the only findings are
//!   leaked clusters ("not an error": space no table points at, which a
//!   power cut between an allocation and its table update may leave), 2
//!   on corruption, 1 when it could not check; it has no check for VHD
//!   (qemu's `vpc` driver implements none), so there the guest disk
//!   `qemu-img convert` reads through the BAT is the container's oracle;
//! - a crash image's file is as long as its furthest kept write
//!   ([`ext4kit_blockdev::WriteLog::apply_growing`]): a dropped append
//!   leaves a shorter file.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use ext4kit_blockdev::{BlockDevice, MemDevice};
use ext4kit_vdisk::qcow2::Qcow2Disk;
use ext4kit_vdisk::vhd::VhdDisk;
use ext4kit_vdisk::vhdx::VhdxDisk;
use ext4kit_vdisk::vmdk::VmdkDisk;
use ext4kit_vdisk::{create, CreateRequest, DiskFormat, NamedFiles, VhdSizing};

use crate::fsimage::{base_image, scratch_root, FsVariant};

/// The container format a workload's image lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Container {
    /// qcow2 v3, 64 KiB clusters (qemu-img's defaults).
    Qcow2,
    /// VHDX, dynamic, 1 MiB blocks (the smallest: 32 blocks on a 32 MiB
    /// disk, so workloads allocate blocks as they go).
    Vhdx,
    /// VHD, dynamic, 512 KiB blocks (the format's smallest; qemu-img
    /// writes only 2 MiB, in which every workload here stays inside the
    /// blocks a fresh image holds), the exact size (no CHS rounding).
    Vhd,
    /// VMDK monolithicSparse: one file, 64 KiB grains, grain tables.
    Vmdk,
}

impl Container {
    /// Every format.
    pub const ALL: [Container; 4] = [Container::Qcow2, Container::Vhdx, Container::Vhd, Container::Vmdk];

    /// Its name, as our `--format` says it.
    pub fn name(self) -> &'static str {
        match self {
            Container::Qcow2 => "qcow2",
            Container::Vhdx => "vhdx",
            Container::Vhd => "vhd",
            Container::Vmdk => "vmdk",
        }
    }

    /// Its name as qemu-img's `-f`/`-O` says it (qemu calls VHD `vpc`).
    pub fn qemu_name(self) -> &'static str {
        match self {
            Container::Vhd => "vpc",
            c => c.name(),
        }
    }

    /// Whether `qemu-img check` can check it: qemu's vpc driver has no
    /// check, so a VHD crash image is judged by what qemu reads from it.
    pub fn qemu_checks(self) -> bool {
        self != Container::Vhd
    }

    /// The format called `s` (`raw` is `Ok(None)`).
    pub fn parse(s: &str) -> Result<Option<Container>, String> {
        match s {
            "raw" => Ok(None),
            _ => Self::ALL
                .into_iter()
                .find(|c| c.name() == s)
                .map(Some)
                .ok_or_else(|| format!("unknown format {s:?} (raw, qcow2, vhdx, vhd, vmdk)")),
        }
    }

    /// qemu-img's creation options for it (VHD is made by
    /// [`vhd_from_raw`]).
    fn create_opts(self) -> &'static str {
        match self {
            Container::Qcow2 => "compat=1.1",
            Container::Vhdx => "subformat=dynamic,block_size=1M",
            Container::Vmdk => "subformat=monolithicSparse",
            Container::Vhd => unreachable!("VHD bases are made by vhd_from_raw"),
        }
    }

    /// Our format layer over `file` (the container file's bytes).
    pub fn open(self, file: Arc<dyn BlockDevice>, writable: bool) -> io::Result<Arc<dyn BlockDevice>> {
        Ok(match self {
            Container::Qcow2 => Arc::new(Qcow2Disk::open(file, None, writable, &NamedFiles::none())?),
            Container::Vhdx => Arc::new(VhdxDisk::open(file, writable)?),
            Container::Vhd => Arc::new(VhdDisk::open(file, writable)?),
            Container::Vmdk => Arc::new(VmdkDisk::open(file, writable, &NamedFiles::none())?),
        })
    }

    /// The guest disk our format layer reads from the container `bytes`.
    pub fn read_disk(self, bytes: &[u8]) -> io::Result<Vec<u8>> {
        let dev = self.open(Arc::new(MemDevice::from_vec_read_only(bytes.to_vec())), false)?;
        let mut out = vec![0u8; usize::try_from(dev.size()).map_err(io::Error::other)?];
        for (k, chunk) in out.chunks_mut(1 << 20).enumerate() {
            dev.read_at((k as u64) << 20, chunk)?;
        }
        Ok(out)
    }
}

impl fmt::Display for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Fail unless qemu-img runs: the container oracle is not optional.
pub fn require_qemu_img() -> Result<(), String> {
    match Command::new("qemu-img").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(
            "qemu-img is missing: the crash tests over qcow2 and VHDX need it as their oracle \
                  (install qemu-utils: apt-get install qemu-utils)"
                .into(),
        ),
    }
}

/// The fresh image of `fs` inside `c` (made once per process): the raw
/// base image ([`base_image`]) converted by `qemu-img convert`, which
/// leaves zero runs unallocated, so a workload allocates clusters and
/// blocks as it writes.
pub fn base_container(fs: FsVariant, c: Container) -> Result<Arc<Vec<u8>>, String> {
    /// Each filesystem variant's image in each format.
    type Images = HashMap<(FsVariant, Container), Arc<Vec<u8>>>;
    static CACHE: OnceLock<Mutex<Images>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(img) = cache.get(&(fs, c)) {
        return Ok(img.clone());
    }
    require_qemu_img()?;
    let raw = base_image(fs).map_err(|e| format!("making the {} image: {e}", fs.name()))?;
    if c == Container::Vhd {
        let bytes = Arc::new(vhd_from_raw(&raw)?);
        cache.insert((fs, c), bytes.clone());
        return Ok(bytes);
    }
    let dir = scratch_root().join(format!("ext4kit-crash-base-{}-{}-{c}", std::process::id(), fs.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (src, dst) = (dir.join("base.raw"), dir.join(format!("base.{c}")));
    std::fs::write(&src, &*raw).map_err(|e| format!("{}: {e}", src.display()))?;
    let out = Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", c.qemu_name(), "-o", c.create_opts()])
        .arg(&src)
        .arg(&dst)
        .output()
        .map_err(|e| format!("running qemu-img convert: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "qemu-img convert -O {c} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let bytes = Arc::new(std::fs::read(&dst).map_err(|e| format!("{}: {e}", dst.display()))?);
    let _ = std::fs::remove_dir_all(&dir);
    cache.insert((fs, c), bytes.clone());
    Ok(bytes)
}

/// A dynamic VHD of 512 KiB blocks holding `raw`, made by our own
/// writer: only blocks with a nonzero 4 KiB unit are allocated, as
/// `qemu-img convert` would. qemu still judges every crash image made from
/// it (`qemu-img convert` reads each through the BAT).
fn vhd_from_raw(raw: &[u8]) -> Result<Vec<u8>, String> {
    const UNIT: usize = 4096;
    let file = Arc::new(MemDevice::growable(Vec::new()));
    let req = CreateRequest {
        allocation_unit: Some(512 << 10),
        vhd_sizing: VhdSizing::Exact,
        ..CreateRequest::new(DiskFormat::Vhd, raw.len() as u64)
    };
    let disk = create(file.clone(), &req).map_err(|e| format!("creating the VHD base: {e}"))?;
    for (k, unit) in raw.chunks(UNIT).enumerate() {
        if unit.iter().any(|&b| b != 0) {
            disk.write_at((k * UNIT) as u64, unit)
                .map_err(|e| format!("writing the VHD base: {e}"))?;
        }
    }
    disk.flush().map_err(|e| format!("flushing the VHD base: {e}"))?;
    drop(disk);
    Ok(file.to_vec())
}

/// What `qemu-img check` said about a container file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QemuCheck {
    /// Exit 0.
    Clean,
    /// Exit 3: leaked clusters only (accepted after a power cut).
    Leaks(String),
    /// Anything else: corruption (exit 2), or it could not check (1).
    Bad(i32, String),
}

/// Run `qemu-img check -f FORMAT path` (a format qemu cannot check,
/// [`Container::qemu_checks`], is `Clean`: its oracle is the conversion).
pub fn qemu_check(path: &Path, c: Container) -> Result<QemuCheck, String> {
    if !c.qemu_checks() {
        return Ok(QemuCheck::Clean);
    }
    let out = Command::new("timeout")
        .args(["60", "qemu-img", "check", "-f", c.qemu_name()])
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run qemu-img check: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut shown: Vec<String> = lines.iter().take(12).map(|l| format!("  {l}")).collect();
    if lines.len() > 12 {
        shown.push(format!("  ... {} more lines", lines.len() - 12));
    }
    let shown = shown.join("\n");
    Ok(match out.status.code().unwrap_or(-1) {
        0 => QemuCheck::Clean,
        3 => QemuCheck::Leaks(shown),
        code => QemuCheck::Bad(code, shown),
    })
}

/// `qemu-img convert -f FORMAT -O raw src dst`: the guest disk as qemu
/// reads it.
pub fn qemu_to_raw(src: &Path, c: Container, dst: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(dst);
    let out = Command::new("timeout")
        .args(["60", "qemu-img", "convert", "-f", c.qemu_name(), "-O", "raw"])
        .arg(src)
        .arg(dst)
        .output()
        .map_err(|e| format!("cannot run qemu-img convert: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "qemu-img convert -f {} -O raw failed (exit {}): {}",
            c.qemu_name(),
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
