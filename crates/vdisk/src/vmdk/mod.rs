//! VMDK, VMware's virtual disk, as a block device.
//!
//! A VMDK is a descriptor (text: createType, parent link, extent list)
//! and extents, each mapping a run of the disk's sectors:
//!
//! - a hosted sparse extent ([`sparse`]): header "KDMV", grain directory,
//!   grain tables, grains appended as written; monolithicSparse keeps the
//!   descriptor inside it, twoGbMaxExtentSparse splits the disk into many;
//! - the same with deflated grains behind markers ([`stream`]):
//!   streamOptimized, the format of OVA exports; read-only here;
//! - a flat extent ([`flat`]): plain sectors at an offset in a file
//!   (monolithicFlat, twoGbMaxExtentFlat, ESX's vmfs);
//! - a ZERO extent: no file, zeros.
//!
//! [`VmdkDisk::open`] takes either a sparse extent file with an embedded
//! descriptor or a descriptor file; the extent files a descriptor names are
//! opened only through [`NamedFiles`]. A descriptor is never followed from
//! an extent (an embedded descriptor only supplies createType), so a chain
//! of files cannot cycle; a file named as an extent that is itself a
//! descriptor, and two extents sharing a sparse file or overlapping in a
//! flat one, are refused.
//!
//! Delta disks (a `parentCID` or `parentFileNameHint`), raw device
//! mappings and seSparse are refused as unsupported: their unallocated
//! grains or their sectors live somewhere this crate does not open.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{corrupt, unsupported, BlockDevice, DiskFormat, DiskImage, LayerInfo, NamedFiles};

mod descriptor;
mod file;
mod flat;
mod header;
mod sparse;
mod stream;

#[cfg(test)]
mod testimage;
#[cfg(test)]
mod tests;

use descriptor::{Access, Descriptor, ExtentType, MAX_DESCRIPTOR};
use file::{Device, ExtentFile};
use flat::FlatExtent;
use header::{Kind, COWD, KDMV, SECTOR};
use sparse::SparseExtent;

/// Extents listed one by one in [`DiskImage::layer`]'s details; a longer
/// list is summarised.
const LISTED_EXTENTS: usize = 8;

/// What backs one run of the disk.
enum Extent {
    Flat(FlatExtent),
    Sparse(Box<SparseExtent>),
    /// A ZERO extent.
    Zero,
    /// A NOACCESS extent: reading it is an error.
    Denied,
}

/// One extent placed in the disk.
struct Mapped {
    /// Byte offset of the extent in the disk.
    start: u64,
    /// Length in bytes.
    len: u64,
    extent: Extent,
    /// How `info` shows it: `RW SPARSE "disk-s001.vmdk"`.
    label: String,
}

/// A VMDK image presented as the guest's disk.
///
/// Reads take no lock of their own (a streamOptimized extent keeps a few
/// inflated grains behind a small lock); first writes into a sparse grain
/// are serialised per extent file. See [`VmdkDisk::open`].
pub struct VmdkDisk {
    extents: Vec<Mapped>,
    size: u64,
    writable: bool,
    create_type: String,
    details: Vec<(String, String)>,
}

impl std::fmt::Debug for VmdkDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmdkDisk")
            .field("create_type", &self.create_type)
            .field("size", &self.size)
            .field("extents", &self.extents.len())
            .field("writable", &self.writable)
            .finish()
    }
}

impl VmdkDisk {
    /// Open a VMDK held by `file` (a sparse extent file with an embedded
    /// descriptor, or a text descriptor file). Extent files named by a
    /// descriptor are opened through `named` (NamedFiles: the policy on
    /// which paths an image may name).
    ///
    /// Writing is refused (`Unsupported`) where it cannot be done safely:
    /// streamOptimized, ZERO / RDONLY / NOACCESS / COWD extents, and a
    /// sparse extent held by a `file` that does not grow
    /// ([`BlockDevice::grows`]: a disk or partition cannot take new
    /// grains): open a local image with [`VmdkDisk::open_path`].
    pub fn open(file: Arc<dyn BlockDevice>, writable: bool, named: &NamedFiles) -> io::Result<VmdkDisk> {
        Self::open_main(Arc::new(Device::new(file)), writable, named)
    }

    /// Open the VMDK at `path`, which this opens itself so that a
    /// monolithicSparse image can grow as grains are written. `named` is
    /// usually `NamedFiles::beside(path, ..)`.
    pub fn open_path(path: &Path, writable: bool, named: &NamedFiles) -> io::Result<VmdkDisk> {
        Self::open_main(Arc::new(Device::file(path, writable)?), writable, named)
    }

    fn open_main(main: Arc<dyn ExtentFile>, writable: bool, named: &NamedFiles) -> io::Result<VmdkDisk> {
        let len = main.len();
        let mut head = vec![0u8; len.min(SECTOR) as usize];
        main.read_at(0, &mut head)?;
        if head.starts_with(KDMV) || head.starts_with(COWD) {
            return Self::open_sparse_file(main, writable);
        }
        if !crate::probe::is_vmdk_descriptor(&head) {
            return Err(corrupt(
                DiskFormat::Vmdk,
                "neither a sparse extent (KDMV, COWD) nor a descriptor (\"# Disk DescriptorFile\")",
            ));
        }
        if len > MAX_DESCRIPTOR {
            return Err(corrupt(
                DiskFormat::Vmdk,
                format!("descriptor file of {len} bytes is larger than {MAX_DESCRIPTOR}"),
            ));
        }
        let mut text = vec![0u8; len as usize];
        main.read_at(0, &mut text)?;
        let d = Descriptor::parse(&text, "descriptor")?;
        Self::from_descriptor(&d, writable, named)
    }

    /// A sparse extent file opened as the image: it is the only extent;
    /// its embedded descriptor, if any, gives createType and the parent
    /// link (its extent line names the file itself and is not followed).
    fn open_sparse_file(main: Arc<dyn ExtentFile>, writable: bool) -> io::Result<VmdkDisk> {
        let sp = SparseExtent::open(main, writable, "sparse extent".into())?;
        let d = match sp.embedded_descriptor()? {
            Some(text) => Descriptor::parse(&text, "embedded descriptor")?,
            None => Descriptor::default(),
        };
        check_parent(&d)?;
        let g = sp.geometry();
        let create_type = d.create_type.clone().unwrap_or_else(|| {
            match (g.kind, g.compressed) {
                (Kind::Cow, _) => "vmfsSparse",
                (_, true) => "streamOptimized",
                _ => "monolithicSparse",
            }
            .to_string()
        });
        let size = sp.capacity_bytes();
        let label = "RW SPARSE (this file)".to_string();
        let mut details = Vec::new();
        sparse_details(&mut details, &sp);
        if let Some(a) = &d.adapter {
            details.push(("adapter".into(), a.clone()));
        }
        Ok(VmdkDisk {
            extents: vec![Mapped {
                start: 0,
                len: size,
                extent: Extent::Sparse(Box::new(sp)),
                label,
            }],
            size,
            writable,
            create_type,
            details,
        })
    }

    fn from_descriptor(d: &Descriptor, writable: bool, named: &NamedFiles) -> io::Result<VmdkDisk> {
        let create_type = d
            .create_type
            .clone()
            .ok_or_else(|| corrupt(DiskFormat::Vmdk, "descriptor: no createType"))?;
        check_parent(d)?;
        if matches!(
            create_type.as_str(),
            "fullDevice" | "partitionedDevice" | "vmfsRaw" | "vmfsRawDeviceMap" | "vmfsPassthroughRawDeviceMap"
        ) {
            return Err(unsupported(
                DiskFormat::Vmdk,
                format!("createType {create_type} maps a raw host device, which is never opened"),
            ));
        }
        if d.extents.is_empty() {
            return Err(corrupt(DiskFormat::Vmdk, "descriptor: no extents"));
        }
        let mut extents = Vec::with_capacity(d.extents.len());
        // Files already named, with the runs of them in use, to refuse
        // extents that share a sparse file or overlap in a flat one.
        let mut used: HashMap<PathBuf, Vec<(bool, u64, u64, usize)>> = HashMap::new();
        let mut start = 0u64;
        let mut details = Vec::new();
        for (i, e) in d.extents.iter().enumerate() {
            let n = i + 1;
            let what = match &e.file {
                Some(f) => format!("extent {n} ({f})"),
                None => format!("extent {n}"),
            };
            let len = e
                .sectors
                .checked_mul(SECTOR)
                .ok_or_else(|| corrupt(DiskFormat::Vmdk, format!("{what}: {} sectors is absurd", e.sectors)))?;
            let end = start
                .checked_add(len)
                .filter(|&end| end <= i64::MAX as u64)
                .ok_or_else(|| corrupt(DiskFormat::Vmdk, format!("{what}: the disk's size overflows")))?;
            if writable && e.access != Access::ReadWrite {
                return Err(unsupported(
                    DiskFormat::Vmdk,
                    format!("{what} is {}; open the image read-only", access_name(e.access)),
                ));
            }
            let extent = match (e.access, e.kind) {
                (_, ExtentType::RawDevice | ExtentType::SeSparse) => {
                    return Err(unsupported(
                        DiskFormat::Vmdk,
                        format!("{what}: {} extents are not supported", e.kind.name()),
                    ))
                }
                (_, ExtentType::Zero) => {
                    if writable {
                        return Err(unsupported(
                            DiskFormat::Vmdk,
                            format!("{what} is a ZERO extent, which cannot hold writes; open the image read-only"),
                        ));
                    }
                    Extent::Zero
                }
                (Access::Denied, _) => Extent::Denied,
                (_, kind) => {
                    let name = e.file.as_deref().unwrap_or_default();
                    let path = named.resolve(&format!("vmdk extent {n}"), name)?;
                    let sparse = matches!(kind, ExtentType::Sparse | ExtentType::VmfsSparse);
                    let (lo, hi) = if sparse {
                        (0, u64::MAX)
                    } else {
                        (e.offset, e.offset.saturating_add(e.sectors))
                    };
                    let runs = used.entry(path.clone()).or_default();
                    if let Some(&(_, _, _, other)) =
                        runs.iter().find(|&&(s, a, b, _)| s || sparse || (lo < b && a < hi))
                    {
                        return Err(corrupt(
                            DiskFormat::Vmdk,
                            format!("{what} and extent {other} both use {}", path.display()),
                        ));
                    }
                    runs.push((sparse, lo, hi, n));
                    let file: Arc<dyn ExtentFile> = Arc::new(Device::file(&path, writable)?);
                    if sparse {
                        let sp = SparseExtent::open(file, writable, what.clone())?;
                        if sp.capacity_bytes() < len {
                            return Err(corrupt(
                                DiskFormat::Vmdk,
                                format!(
                                    "{what}: the descriptor says {} sectors, its header's capacity is {}",
                                    e.sectors,
                                    sp.geometry().capacity
                                ),
                            ));
                        }
                        if !details.iter().any(|(k, _)| k == "grain size") {
                            sparse_details(&mut details, &sp);
                        }
                        Extent::Sparse(Box::new(sp))
                    } else {
                        Extent::Flat(FlatExtent::open(file, e.offset, len, &what)?)
                    }
                }
            };
            let label = match &e.file {
                Some(f) => format!("{} {} {f:?}", access_name(e.access), e.kind.name()),
                None => format!("{} {}", access_name(e.access), e.kind.name()),
            };
            if len > 0 {
                extents.push(Mapped {
                    start,
                    len,
                    extent,
                    label,
                });
            }
            start = end;
        }
        if let Some(a) = &d.adapter {
            details.push(("adapter".into(), a.clone()));
        }
        Ok(VmdkDisk {
            extents,
            size: start,
            writable,
            create_type,
            details,
        })
    }

    /// The extents under `off..off+len`, each with the offset in it and
    /// the length of the piece.
    fn pieces(&self, off: u64, len: usize) -> impl Iterator<Item = (&Mapped, u64, usize)> {
        let mut at = off;
        let end = off + len as u64;
        let mut i = self.extents.partition_point(|m| m.start + m.len <= off);
        std::iter::from_fn(move || {
            // Zero-length extents are dropped at open, so each step advances.
            let m = self.extents.get(i).filter(|_| at < end)?;
            let within = at - m.start;
            let take = (m.len - within).min(end - at) as usize;
            at += take as u64;
            i += 1;
            Some((m, within, take))
        })
    }
}

impl BlockDevice for VmdkDisk {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        if off.checked_add(buf.len() as u64).is_none_or(|end| end > self.size) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at offset {off} past the end of the disk ({} bytes)",
                    buf.len(),
                    self.size
                ),
            ));
        }
        let mut done = 0;
        for (m, within, take) in self.pieces(off, buf.len()) {
            let piece = &mut buf[done..done + take];
            match &m.extent {
                Extent::Flat(f) => f.read(within, piece)?,
                Extent::Sparse(s) => s.read(within, piece)?,
                Extent::Zero => piece.fill(0),
                Extent::Denied => {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("vmdk: {} is NOACCESS", m.label),
                    ))
                }
            }
            done += take;
        }
        Ok(())
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "vmdk opened read-only"));
        }
        if off.checked_add(buf.len() as u64).is_none_or(|end| end > self.size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "write of {} bytes at {off} past the end of the disk ({} bytes)",
                    buf.len(),
                    self.size
                ),
            ));
        }
        let mut done = 0;
        for (m, within, take) in self.pieces(off, buf.len()) {
            let piece = &buf[done..done + take];
            match &m.extent {
                Extent::Flat(f) => f.write(within, piece)?,
                Extent::Sparse(s) => s.write(within, piece)?,
                // Refused at open; kept as an error, not a panic.
                Extent::Zero | Extent::Denied => {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("vmdk: {} cannot be written", m.label),
                    ))
                }
            }
            done += take;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if !self.writable {
            return Ok(());
        }
        for m in &self.extents {
            match &m.extent {
                Extent::Flat(f) => f.flush()?,
                Extent::Sparse(s) => s.flush()?,
                Extent::Zero | Extent::Denied => {}
            }
        }
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        !self.writable
    }
}

impl DiskImage for VmdkDisk {
    fn layer(&self) -> LayerInfo {
        let mut details = vec![("extents".to_string(), self.extents.len().to_string())];
        if self.extents.len() <= LISTED_EXTENTS {
            for (i, m) in self.extents.iter().enumerate() {
                details.push((format!("extent {}", i + 1), format!("{} ({} bytes)", m.label, m.len)));
            }
        }
        details.extend(self.details.iter().cloned());
        LayerInfo {
            format: DiskFormat::Vmdk,
            variant: self.create_type.clone(),
            virtual_size: self.size,
            details,
        }
    }
}

/// Delta disks read their unallocated grains from a parent, which is not
/// opened here: reading them as zeros would show a wrong disk.
fn check_parent(d: &Descriptor) -> io::Result<()> {
    if d.has_parent() {
        return Err(unsupported(
            DiskFormat::Vmdk,
            format!(
                "a delta disk (parentCID {}, parent {:?}) needs its parent, which is not supported; \
                 merge it with qemu-img convert first",
                d.parent_cid.as_deref().unwrap_or("?"),
                d.parent_hint.as_deref().unwrap_or("?")
            ),
        ));
    }
    Ok(())
}

fn access_name(a: Access) -> &'static str {
    match a {
        Access::ReadWrite => "RW",
        Access::ReadOnly => "RDONLY",
        Access::Denied => "NOACCESS",
    }
}

fn sparse_details(details: &mut Vec<(String, String)>, sp: &SparseExtent) {
    let g = sp.geometry();
    details.push(("grain size".into(), format!("{} bytes", g.grain_bytes())));
    let header = match g.kind {
        Kind::Hosted => format!("KDMV version {}", g.version),
        Kind::Cow => "COWD".to_string(),
    };
    details.push(("sparse header".into(), header));
    let compression = if g.compressed {
        if g.markers {
            "deflate, grain markers"
        } else {
            "deflate"
        }
    } else {
        "none"
    };
    details.push(("compression".into(), compression.into()));
}
