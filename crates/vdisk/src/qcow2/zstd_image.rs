//! A qcow2 image whose compressed clusters are zstd frames
//! (compression_type 1, qemu's `-o compression_type=zstd`), read-only.
//!
//! imago 0.2.6 (the newest release) refuses the compression type feature
//! bit, so these images are read here: the active L1 and L2 tables, the
//! cluster kinds, the compressed cluster descriptor and the backing file
//! (opened through the same gate as imago's (`ChainGate`), so the same names
//! are followed and the same chains refused). The image is handed to the
//! rest of the crate as imago's raw format over [`DevStorage`], so a
//! backing chain can mix it with imago's qcow2 files in any order.
//! Writing would need allocation and refcounts: a writable open is refused.
//!
//! qcow2.txt facts relied on (all big-endian): an L1 entry holds its L2
//! table's offset in bits 9..=55 (0: unallocated); an L2 table is one
//! cluster of 8-byte entries. An L2 entry with bit 62 clear is a standard
//! cluster: bit 0 reads as zeros (version 3), otherwise bits 9..=55 are
//! the host cluster (0: unallocated, so the backing file or zeros). With
//! bit 62 set it is a compressed cluster descriptor: with
//! x = 62 - (cluster_bits - 8), bits 0..x are the host byte offset and
//! bits x..=61 the count of 512-byte sectors after the one holding that
//! offset; the data is one or more zstd frames that decode to exactly one
//! cluster, possibly followed by unrelated bytes (qemu's
//! `qcow2_zstd_decompress`).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use imago::format::gate::{DenyImplicitOpenGate, ImplicitOpenGate};
use imago::qcow2::Qcow2;
use imago::raw::Raw;
use imago::{FormatAccess, FormatDriverBuilder, StorageOpenOptions};
use parking_lot::Mutex;
use zstd::stream::raw::{DParameter, Decoder, InBuffer, Operation, OutBuffer};

use super::header::Facts;
use super::storage::DevStorage;
use crate::{corrupt, unsupported, BlockDevice, DiskFormat};

const FORMAT: DiskFormat = DiskFormat::Qcow2;
/// Offset bits 9..=55 of an L1 entry and of a standard L2 entry.
const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
/// L2 entry bit 62: a compressed cluster.
const COMPRESSED: u64 = 1 << 62;
/// L2 entry bit 0 of a standard cluster: reads as zeros.
const ZERO: u64 = 1;
/// Incompatible feature bits this reader follows: dirty (refcounts may be
/// stale, which a reader never looks at), corrupt (qemu still opens such
/// an image read-only) and the compression type.
const FOLLOWED: u64 = 1 | 1 << 1 | 1 << 3;
/// qemu's QCOW_MAX_L1_SIZE: 32 MiB of L1 entries.
const MAX_L1_ENTRIES: u64 = (32 << 20) / 8;
/// Largest zstd window accepted (16 MiB). qemu compresses one cluster (at
/// most 2 MiB) per frame, so its frames never need more; a hostile frame
/// asking for zstd's default limit of 128 MiB is refused instead.
const WINDOW_LOG_MAX: u32 = 24;
/// The qcow2 magic, "QFI\xfb".
const MAGIC: [u8; 4] = *b"QFI\xfb";

/// What a guest cluster is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cluster {
    /// Not in this image: the backing file's, or zeros.
    Unallocated,
    /// Reads as zeros.
    Zero,
    /// Stored as is at this host offset.
    Data(u64),
    /// zstd frames at a host offset, this L2 entry describing them.
    Compressed(u64),
}

/// The most recently decoded cluster (the engine reads a cluster a block
/// at a time) and the decoder, reused between clusters.
struct Recent {
    decoder: Decoder<'static>,
    /// The L2 entry of the cluster held, and its bytes.
    cluster: Option<(u64, Box<[u8]>)>,
}

/// A read-only qcow2 image with zstd-compressed clusters (module doc).
pub(super) struct ZstdImage {
    file: Arc<dyn BlockDevice>,
    /// The file's path, for messages ("(device)" without one).
    name: String,
    cluster_bits: u32,
    size: u64,
    /// The active L1 table, as many entries as the disk size needs.
    l1: Box<[u64]>,
    backing: Option<FormatAccess<DevStorage>>,
    recent: Mutex<Recent>,
}

impl std::fmt::Debug for ZstdImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZstdImage")
            .field("name", &self.name)
            .field("cluster_bits", &self.cluster_bits)
            .field("size", &self.size)
            .finish()
    }
}

/// The refusal of a writable open, naming why and what to do instead.
pub(super) fn refuse_writable(name: &str) -> io::Error {
    unsupported(
        FORMAT,
        format_args!(
            "{name}: compressed clusters use zstd, which ext4kit reads but does not write; open it read-only, \
             or make a writable copy with `qemu-img convert -O qcow2 -o compression_type=zlib`"
        ),
    )
}

impl ZstdImage {
    /// Read the tables of the image in `file` whose header said `facts`,
    /// and open its backing file through `gate`.
    pub(super) fn open(
        file: Arc<dyn BlockDevice>,
        path: Option<&Path>,
        facts: &Facts,
        gate: &mut impl ImplicitOpenGate<DevStorage>,
    ) -> io::Result<ZstdImage> {
        let name = path.map_or_else(|| "(device)".to_string(), |p| p.display().to_string());
        let layout = &facts.layout;
        let unfollowed = layout.incompatible & !FOLLOWED;
        if unfollowed != 0 {
            let what = match unfollowed.trailing_zeros() {
                2 => "an external data file".to_string(),
                4 => "extended L2 entries (subclusters)".to_string(),
                bit => format!("incompatible feature bit {bit}"),
            };
            return Err(unsupported(
                FORMAT,
                format_args!("{name}: a zstd-compressed image with {what}, which ext4kit cannot read"),
            ));
        }
        let cluster_bits = layout.cluster_bits;
        // One L1 entry maps an L2 table's worth of clusters:
        // 2^(cluster_bits - 3) of them, 2^(2 * cluster_bits - 3) bytes.
        let needed = facts.size.div_ceil(1 << (2 * cluster_bits - 3));
        let l1_size = u64::from(layout.l1_size);
        if l1_size < needed || l1_size > MAX_L1_ENTRIES {
            return Err(corrupt(
                FORMAT,
                format_args!(
                    "{name}: the L1 table has {l1_size} entries; the {}-byte disk needs {needed} (qemu allows at most {MAX_L1_ENTRIES})",
                    facts.size
                ),
            ));
        }
        let at = layout.l1_table_offset;
        let cluster = 1u64 << cluster_bits;
        if !at.is_multiple_of(cluster) || at.checked_add(needed * 8).is_none_or(|end| end > file.size()) {
            return Err(corrupt(
                FORMAT,
                format_args!(
                    "{name}: the L1 table at byte {at} ({needed} entries) is not on a cluster boundary inside the {}-byte file",
                    file.size()
                ),
            ));
        }
        let mut raw = vec![0u8; (needed * 8) as usize];
        file.read_at(at, &mut raw)?;
        let l1 = raw
            .chunks_exact(8)
            .map(|e| u64::from_be_bytes(e.try_into().unwrap_or_default()))
            .collect();
        let backing = match &facts.backing {
            Some(b) => Some(open_backing(b, layout.backing_format.as_deref(), gate)?),
            None => None,
        };
        let mut decoder = Decoder::new()?;
        decoder.set_parameter(DParameter::WindowLogMax(WINDOW_LOG_MAX))?;
        Ok(ZstdImage {
            file,
            name,
            cluster_bits,
            size: facts.size,
            l1,
            backing,
            recent: Mutex::new(Recent { decoder, cluster: None }),
        })
    }

    /// This image as imago's raw format, so it can be a layer of a chain
    /// (and the top of [`super::Qcow2Disk`]) like imago's own.
    pub(super) fn into_format(self, path: Option<PathBuf>) -> io::Result<FormatAccess<DevStorage>> {
        let storage = DevStorage::new(Arc::new(self), path);
        // A raw layer names no other file: the gate that refuses all is enough.
        let raw = Raw::builder(storage)
            .write(false)
            .open(DenyImplicitOpenGate::default())?;
        Ok(FormatAccess::new(raw))
    }

    fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// What guest cluster `guest` is.
    fn lookup(&self, guest: u64) -> io::Result<Cluster> {
        let l2_bits = self.cluster_bits - 3;
        let l1_index = guest >> l2_bits;
        let l1_entry = self.l1.get(l1_index as usize).copied().unwrap_or(0);
        let table = l1_entry & OFFSET_MASK;
        if table == 0 {
            return Ok(Cluster::Unallocated);
        }
        let at = table + ((guest & ((1 << l2_bits) - 1)) << 3);
        if !table.is_multiple_of(self.cluster_size()) || at + 8 > self.file.size() {
            return Err(corrupt(
                FORMAT,
                format_args!(
                    "{}: L1 entry {l1_index} names an L2 table at byte {table}, not a cluster inside the {}-byte file",
                    self.name,
                    self.file.size()
                ),
            ));
        }
        let mut e = [0u8; 8];
        self.file.read_at(at, &mut e)?;
        let entry = u64::from_be_bytes(e);
        if entry & COMPRESSED != 0 {
            return Ok(Cluster::Compressed(entry));
        }
        let host = entry & OFFSET_MASK;
        if entry & ZERO != 0 {
            Ok(Cluster::Zero)
        } else if host == 0 {
            Ok(Cluster::Unallocated)
        } else if !host.is_multiple_of(self.cluster_size()) {
            Err(corrupt(
                FORMAT,
                format_args!(
                    "{}: the L2 entry at byte {at} names host byte {host}, not a cluster boundary",
                    self.name
                ),
            ))
        } else {
            Ok(Cluster::Data(host))
        }
    }

    /// `buf.len()` bytes of the file at `off`; past its end, zeros (a
    /// last cluster may be cut short, as imago also reads it).
    fn read_file(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let inside = self.file.size().saturating_sub(off).min(buf.len() as u64) as usize;
        self.file.read_at(off, &mut buf[..inside])?;
        buf[inside..].fill(0);
        Ok(())
    }

    /// The backing file's bytes at `off`, zeros past its end or without one.
    fn read_backing(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let inside = match &self.backing {
            Some(b) => {
                let inside = b.size().saturating_sub(off).min(buf.len() as u64) as usize;
                b.read(&mut buf[..inside], off)?;
                inside
            }
            None => 0,
        };
        buf[inside..].fill(0);
        Ok(())
    }

    /// Bytes `within..` of the compressed cluster `entry` of guest cluster
    /// `guest` into `buf`.
    fn read_compressed(&self, guest: u64, entry: u64, within: usize, buf: &mut [u8]) -> io::Result<()> {
        let mut recent = self.recent.lock();
        let recent = &mut *recent;
        let held = matches!(&recent.cluster, Some((e, _)) if *e == entry);
        if !held {
            let mut out = match recent.cluster.take() {
                Some((_, b)) => b,
                None => vec![0u8; self.cluster_size() as usize].into_boxed_slice(),
            };
            let x = 62 - (self.cluster_bits - 8);
            let desc = entry & (COMPRESSED - 1);
            let host = desc & ((1 << x) - 1);
            let sectors = (desc >> x) + 1;
            let bound = sectors * 512 - (host & 511);
            let avail = self.file.size().saturating_sub(host).min(bound);
            let at = || {
                format!(
                    "{}: guest cluster {guest} (the zstd data at host byte {host}, at most {bound} bytes)",
                    self.name
                )
            };
            if avail == 0 {
                return Err(corrupt(
                    FORMAT,
                    format_args!("{} is past the end of the {}-byte file", at(), self.file.size()),
                ));
            }
            let mut src = vec![0u8; avail as usize];
            self.file.read_at(host, &mut src)?;
            decode(&mut recent.decoder, &src, &mut out)
                .map_err(|why| corrupt(FORMAT, format_args!("{}: {why}", at())))?;
            recent.cluster = Some((entry, out));
        }
        let (_, data) = recent
            .cluster
            .as_ref()
            .ok_or_else(|| io::Error::other("qcow2: the decoded cluster went missing"))?;
        buf.copy_from_slice(&data[within..within + buf.len()]);
        Ok(())
    }
}

/// Decode the zstd frames in `src` into exactly `out.len()` bytes, as
/// qemu does: frame after frame until the cluster is full, bytes after
/// that ignored; a step that makes no progress, or a frame still going on
/// when the cluster is full, is damage.
fn decode(decoder: &mut Decoder<'static>, src: &[u8], out: &mut [u8]) -> Result<(), String> {
    decoder.reinit().map_err(|e| e.to_string())?;
    let want = out.len();
    let mut input = InBuffer::around(src);
    let mut output = OutBuffer::around(out);
    let mut left = 0;
    while output.pos() < want {
        let (was_in, was_out) = (input.pos(), output.pos());
        left = decoder.run(&mut input, &mut output).map_err(|e| format!("zstd: {e}"))?;
        if input.pos() == was_in && output.pos() == was_out {
            return Err(format!(
                "zstd frames end after {} of the cluster's {want} bytes",
                output.pos()
            ));
        }
    }
    if left > 0 {
        return Err(format!("zstd frame decodes to more than the cluster's {want} bytes"));
    }
    Ok(())
}

/// Open the backing file `name` of a zstd image through `gate` (format
/// from the header extension, else probed by its magic, as imago does).
fn open_backing(
    name: &str,
    format: Option<&str>,
    gate: &mut impl ImplicitOpenGate<DevStorage>,
) -> io::Result<FormatAccess<DevStorage>> {
    let file = gate.open_storage(StorageOpenOptions::new().filename(name).write(false))?;
    let qcow2 = match format {
        Some("qcow2") => true,
        Some("raw" | "file") => false,
        Some(other) => {
            return Err(unsupported(
                FORMAT,
                format_args!("backing file {name:?} has format {other:?} (qcow2 and raw are read)"),
            ))
        }
        None => {
            let dev = file.device();
            let mut magic = [0u8; 4];
            dev.size() >= 4 && dev.read_at(0, &mut magic).is_ok() && magic == MAGIC
        }
    };
    if qcow2 {
        gate.open_format(Qcow2::<DevStorage>::builder(file).write(false))
    } else {
        gate.open_format(Raw::builder(file).write(false))
    }
}

/// Open the qcow2 at `path` (a file of a backing chain, already let
/// through `gate`) with this reader if its clusters are zstd; `None` if
/// they are not, for imago to open.
pub(super) fn open_if_zstd(
    path: &Path,
    writable: bool,
    gate: &mut impl ImplicitOpenGate<DevStorage>,
) -> io::Result<Option<FormatAccess<DevStorage>>> {
    let dev: Arc<dyn BlockDevice> = Arc::new(
        ext4kit_blockdev::FileDevice::open(path, false)
            .map_err(|e| io::Error::new(e.kind(), format!("backing file {}: {e}", path.display())))?,
    );
    let facts = super::header::read(&*dev)?;
    if !facts.is_zstd() {
        return Ok(None);
    }
    if writable {
        return Err(refuse_writable(&path.display().to_string()));
    }
    let image = ZstdImage::open(dev, Some(path), &facts, gate)?;
    image.into_format(Some(path.to_path_buf())).map(Some)
}

impl BlockDevice for ZstdImage {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        if off.checked_add(buf.len() as u64).is_none_or(|e| e > self.size) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "qcow2: {} bytes at offset {off} run past the end of the {}-byte disk",
                    buf.len(),
                    self.size
                ),
            ));
        }
        let mask = self.cluster_size() - 1;
        let mut done = 0;
        while done < buf.len() {
            let pos = off + done as u64;
            let within = (pos & mask) as usize;
            let n = (self.cluster_size() as usize - within).min(buf.len() - done);
            let part = &mut buf[done..done + n];
            let guest = pos >> self.cluster_bits;
            match self.lookup(guest)? {
                Cluster::Unallocated => self.read_backing(pos, part)?,
                Cluster::Zero => part.fill(0),
                Cluster::Data(host) => self.read_file(host + within as u64, part)?,
                Cluster::Compressed(entry) => self.read_compressed(guest, entry, within, part)?,
            }
            done += n;
        }
        Ok(())
    }

    fn write_at(&self, _off: u64, _buf: &[u8]) -> io::Result<()> {
        Err(refuse_writable(&self.name))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        true
    }
}
