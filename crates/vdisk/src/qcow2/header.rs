//! The qcow2 header facts `info` shows, and the features we refuse before
//! imago sees them.
//!
//! Header (qemu's docs/interop/qcow2.txt, big-endian): magic (0), version
//! (4), backing_file_offset (8), backing_file_size (16), cluster_bits (20),
//! size (24), crypt_method (32), l1_size (36), l1_table_offset (40),
//! refcount_table_offset (48), refcount_table_clusters (56), nb_snapshots
//! (60), snapshots_offset (64); version 3 adds incompatible_features (72),
//! compatible_features (80), autoclear_features (88), refcount_order (96),
//! header_length (100) and, when the header is long enough,
//! compression_type (104: 0 zlib, 1 zstd).
//!
//! Incompatible feature bits: 0 dirty, 1 corrupt, 2 external data file,
//! 3 compression type (set exactly when compression_type is not zlib),
//! 4 extended L2 entries. A header extension of type 0xe2792aca holds the
//! backing file's format name ("qcow2", "raw").
//!
//! A snapshot table entry: l1_table_offset (0), l1_size (8), id_str_size
//! (12), name_size (14), date_sec (16), date_nsec (20), vm_clock_nsec
//! (24), vm_state_size (32), extra_data_size (36), then the extra data,
//! the id, the name, padded to 8 bytes.

use std::io;

use crate::{corrupt, unsupported, BlockDevice, DiskFormat};

const FORMAT: DiskFormat = DiskFormat::Qcow2;
/// qemu's QCOW_MAX_SNAPSHOTS.
const MAX_SNAPSHOTS: u32 = 65536;
/// incompatible_features bit 3: compression type other than zlib.
const INCOMPAT_COMPRESSION: u64 = 1 << 3;
/// compression_type values.
const COMPRESSION_ZLIB: u8 = 0;
const COMPRESSION_ZSTD: u8 = 1;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    (be32(b, at) as u64) << 32 | be32(b, at + 4) as u64
}

/// What the header says, for `info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Facts {
    pub(super) version: u32,
    pub(super) cluster_size: u64,
    pub(super) size: u64,
    /// The backing file's name as the image spells it.
    pub(super) backing: Option<String>,
    /// Compression of compressed clusters ("zlib", "zstd").
    pub(super) compression: &'static str,
    /// Snapshot names (id when unnamed), in table order.
    pub(super) snapshots: Vec<String>,
    /// Where the active tables are, for our own reader of zstd images
    /// (imago reads the others).
    pub(super) layout: Layout,
}

impl Facts {
    /// Compressed clusters are zstd frames, which imago cannot decode.
    pub(super) fn is_zstd(&self) -> bool {
        self.compression == "zstd"
    }
}

/// The header fields a reader of the active disk follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) cluster_bits: u32,
    pub(super) l1_table_offset: u64,
    /// Entries in the L1 table.
    pub(super) l1_size: u32,
    /// incompatible_features (0 for version 2).
    pub(super) incompatible: u64,
    /// The backing file's format as the header extension names it.
    pub(super) backing_format: Option<String>,
}

/// Read the facts from the header of `file`, refusing what imago would
/// refuse with a less useful message (encryption, an unknown compression
/// type).
pub(super) fn read(file: &dyn BlockDevice) -> io::Result<Facts> {
    let fsize = file.size();
    let mut h = [0u8; 112];
    let n = fsize.min(h.len() as u64) as usize;
    file.read_at(0, &mut h[..n])?;
    if n < 72 {
        return Err(corrupt(
            FORMAT,
            format_args!("a {fsize}-byte file cannot hold a header"),
        ));
    }
    let version = be32(&h, 4);
    if !(2..=3).contains(&version) {
        return Err(unsupported(FORMAT, format_args!("version {version} (2 and 3 exist)")));
    }
    let cluster_bits = be32(&h, 20);
    // qemu's MIN_CLUSTER_BITS and MAX_CLUSTER_BITS.
    if !(9..=21).contains(&cluster_bits) {
        return Err(corrupt(
            FORMAT,
            format_args!("cluster_bits {cluster_bits} (9 to 21 are valid)"),
        ));
    }
    if be32(&h, 32) != 0 {
        return Err(unsupported(
            FORMAT,
            "an encrypted image (convert it with qemu-img and its key first)",
        ));
    }
    let mut compression = "zlib";
    let mut incompatible = 0;
    if version >= 3 {
        incompatible = be64(&h, 72);
        let header_len = be32(&h, 100);
        let field = (header_len > 104 && n > 104).then_some(h[104]);
        let flagged = incompatible & INCOMPAT_COMPRESSION != 0;
        compression = match (flagged, field) {
            (false, None | Some(COMPRESSION_ZLIB)) => "zlib",
            (true, Some(COMPRESSION_ZSTD)) => "zstd",
            (true, None) => {
                return Err(corrupt(
                    FORMAT,
                    format_args!("the compression type feature bit is set, but the {header_len}-byte header has no compression_type field"),
                ))
            }
            (flagged, Some(t)) => {
                return Err(unsupported(
                    FORMAT,
                    format_args!(
                        "compression_type {t} with the compression type feature bit {} (0 zlib, unflagged, and 1 zstd, flagged, exist)",
                        if flagged { "set" } else { "clear" }
                    ),
                ))
            }
        };
    }
    let backing = match (be64(&h, 8), be32(&h, 16)) {
        (0, _) | (_, 0) => None,
        (off, len) if len <= 1023 && off.checked_add(len as u64).is_some_and(|e| e <= fsize) => {
            let mut name = vec![0u8; len as usize];
            file.read_at(off, &mut name)?;
            Some(String::from_utf8_lossy(&name).into_owned())
        }
        (off, len) => {
            return Err(corrupt(
                FORMAT,
                format_args!("the backing file name ({len} bytes at byte {off}) is outside the file or too long"),
            ))
        }
    };
    let backing_format = extensions(
        file,
        if version >= 3 { be32(&h, 100) as u64 } else { 72 },
        1 << cluster_bits,
    )?;
    refcounts(file, &h, 1 << cluster_bits)?;
    let snapshots = snapshot_names(file, be32(&h, 60), be64(&h, 64))?;
    Ok(Facts {
        version,
        cluster_size: 1 << cluster_bits,
        size: be64(&h, 24),
        backing,
        compression,
        snapshots,
        layout: Layout {
            cluster_bits,
            l1_table_offset: be64(&h, 40),
            l1_size: be32(&h, 36),
            incompatible,
            backing_format,
        },
    })
}

/// Header extension type of the feature name table.
const FEATURE_NAME_TABLE: u32 = 0x6803_f857;
/// Header extension type of the backing file format name.
const BACKING_FORMAT: u32 = 0xe279_2aca;
/// Longest backing format name read ("qcow2", "raw", "file" in practice).
const MAX_FORMAT_NAME: u64 = 32;

/// Header extensions (type u32, length u32, data padded to 8 bytes, until
/// type 0) in the first cluster; returns the backing format name. The
/// rule relied on: a feature name table is whole 48-byte entries
/// (qcow2.txt); imago 0.2.6 slices a shorter last entry and panics (found
/// by the hostile-disk campaign).
fn extensions(file: &dyn BlockDevice, start: u64, cluster: u64) -> io::Result<Option<String>> {
    let end = cluster.min(file.size());
    let mut backing_format = None;
    let mut at = start;
    while at + 8 <= end {
        let mut e = [0u8; 8];
        file.read_at(at, &mut e)?;
        let (ty, len) = (be32(&e, 0), be32(&e, 4) as u64);
        if ty == 0 {
            break;
        }
        if ty == FEATURE_NAME_TABLE && !len.is_multiple_of(48) {
            return Err(corrupt(
                FORMAT,
                format_args!("the feature name table at byte {at} is {len} bytes, not whole 48-byte entries"),
            ));
        }
        if ty == BACKING_FORMAT {
            if len > MAX_FORMAT_NAME || at + 8 + len > end {
                return Err(corrupt(
                    FORMAT,
                    format_args!("the backing format name at byte {at} is {len} bytes"),
                ));
            }
            let mut name = vec![0u8; len as usize];
            file.read_at(at + 8, &mut name)?;
            backing_format = Some(String::from_utf8_lossy(&name).into_owned());
        }
        at += 8 + len.div_ceil(8) * 8;
    }
    Ok(backing_format)
}

/// The rule relied on: every cluster in use has a refcount, the header's
/// cluster 0 included, so an image has a refcount table and its first
/// entry names a refcount block. imago 0.2.6 recurses without end
/// (a stack overflow, found by the hostile-disk campaign) when asked to
/// allocate on an image without either.
fn refcounts(file: &dyn BlockDevice, h: &[u8; 112], cluster: u64) -> io::Result<()> {
    let (table, clusters) = (be64(h, 48), be32(h, 56));
    if clusters == 0 {
        return Err(corrupt(
            FORMAT,
            "refcount_table_clusters is 0: the image has no refcount table",
        ));
    }
    if !table.is_multiple_of(cluster) {
        return Err(corrupt(
            FORMAT,
            format_args!("refcount_table_offset {table} is not a multiple of the cluster size {cluster}"),
        ));
    }
    // A table past the end of the file reads as zeros: no refcount block
    // for anything (imago recurses on it as on a zero entry).
    if table.checked_add(8).is_none_or(|e| e > file.size()) {
        return Err(corrupt(
            FORMAT,
            format_args!(
                "the refcount table (at byte {table}) lies past the end of the file ({} bytes)",
                file.size()
            ),
        ));
    }
    let mut first = [0u8; 8];
    file.read_at(table, &mut first)?;
    if be64(&first, 0) == 0 {
        return Err(corrupt(
            FORMAT,
            format_args!("refcount table entry 0 (at byte {table}) is 0: the header's cluster has no refcount"),
        ));
    }
    Ok(())
}

/// The names in the snapshot table (bounded by qemu's limit and the file).
fn snapshot_names(file: &dyn BlockDevice, count: u32, mut at: u64) -> io::Result<Vec<String>> {
    if count > MAX_SNAPSHOTS {
        return Err(corrupt(
            FORMAT,
            format_args!("{count} snapshots (qemu allows {MAX_SNAPSHOTS})"),
        ));
    }
    let fsize = file.size();
    let mut names = Vec::new();
    for i in 0..count {
        let mut e = [0u8; 40];
        if at.checked_add(40).is_none_or(|end| end > fsize) {
            return Err(corrupt(
                FORMAT,
                format_args!("snapshot {i}'s table entry at byte {at} is past the end"),
            ));
        }
        file.read_at(at, &mut e)?;
        let id_len = u16::from_be_bytes([e[12], e[13]]) as u64;
        let name_len = u16::from_be_bytes([e[14], e[15]]) as u64;
        let extra = be32(&e, 36) as u64;
        // qemu bounds the extra data at 1 KiB (QCOW_MAX_SNAPSHOT_EXTRA_DATA).
        if extra > 1024 {
            return Err(corrupt(
                FORMAT,
                format_args!("snapshot {i} has {extra} bytes of extra data"),
            ));
        }
        let strings = at + 40 + extra;
        if strings.checked_add(id_len + name_len).is_none_or(|end| end > fsize) {
            return Err(corrupt(
                FORMAT,
                format_args!("snapshot {i}'s names run past the end of the file"),
            ));
        }
        let mut s = vec![0u8; (id_len + name_len) as usize];
        file.read_at(strings, &mut s)?;
        let (id, name) = s.split_at(id_len as usize);
        let shown = if name.is_empty() { id } else { name };
        names.push(String::from_utf8_lossy(shown).into_owned());
        at = (strings + id_len + name_len).next_multiple_of(8);
    }
    Ok(names)
}
