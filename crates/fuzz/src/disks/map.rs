//! Where each container's headers and tables live in a seed: the fields
//! the mutator aims at, the text regions it rewrites, and the checksums
//! it can re-seal.
//!
//! The map is read from the seed itself (which the real tools made, so it
//! is well formed); it walks only the structures the format defines at
//! fixed places or by pointers from them, and every read is bounds-checked
//! so a surprising seed yields a shorter map, never a panic.

/// How a field's value is interpreted, so mutations can pick values that
/// are hostile for that kind (past EOF for an offset, huge for a count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A flag word, version, magic or other scalar.
    Plain,
    /// A file offset in units of `unit` bytes.
    Offset(u64),
    /// A count or a length.
    Count,
    /// A qcow2 L1/L2/refcount-table entry: offset in bits 9..56, flags above.
    Qcow2Entry,
    /// A VHDX BAT entry: state in bits 0..3, offset in MiB from bit 20.
    VhdxBat,
}

/// One integer field of a structure.
#[derive(Debug, Clone)]
pub struct Field {
    /// Index of the file in the seed.
    pub file: usize,
    /// Byte offset in that file.
    pub off: usize,
    /// Width in bytes (1, 2, 4 or 8).
    pub width: usize,
    /// Big-endian (qcow2, VHD) or little-endian.
    pub be: bool,
    /// How to pick hostile values.
    pub kind: Kind,
    /// Structure and field, for reports.
    pub name: String,
}

/// A text the format parses (VMDK descriptor, LVM metadata, a backing name).
#[derive(Debug, Clone)]
pub struct TextRegion {
    /// File index.
    pub file: usize,
    /// Start in the file.
    pub off: usize,
    /// Bytes the text may occupy (the rest is zero-filled).
    pub room: usize,
    /// Current length of the text.
    pub len: usize,
    /// What it is.
    pub name: String,
    /// For LVM metadata: the offset of its `raw_locn`, whose size field
    /// follows the text's length.
    pub rlocn: Option<usize>,
    /// For a qcow2 backing name: the header's size field (u32 BE at 16).
    pub qcow2_backing: bool,
    /// The text is the whole file (a VMDK descriptor file).
    pub whole_file: bool,
}

/// A checksum that "fix checksums" recomputes after the edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seal {
    /// VHD footer or its copy (512 bytes, checksum at 64).
    VhdFooter(usize),
    /// VHD dynamic header (1024 bytes, checksum at 36).
    VhdDynamic(usize),
    /// VHDX header (4 KiB, CRC-32C at 4).
    VhdxHeader(usize),
    /// VHDX region table (64 KiB, CRC-32C at 4).
    VhdxRegion(usize),
    /// LVM label sector (CRC of bytes 20..512 at 16).
    LvmLabel(usize),
    /// LVM mda header (CRC of bytes 4..512 at 0) and its first text's CRC.
    LvmMda(usize),
}

/// The structure map of one seed.
#[derive(Debug, Clone, Default)]
pub struct DiskMap {
    /// Integer fields.
    pub fields: Vec<Field>,
    /// Text regions.
    pub texts: Vec<TextRegion>,
    /// Checksums to re-seal (file 0 unless stated: all seals are in file 0).
    pub seals: Vec<Seal>,
    /// Offsets of headers and tables in file 0, for "point at a structure".
    pub landmarks: Vec<u64>,
    /// qcow2 cluster size (for entry offsets), else 512.
    pub cluster: u64,
    /// VHDX log region (offset, length), if any.
    pub vhdx_log: Option<(u64, u64)>,
}

/// Bounds-checked integer reads.
pub(crate) fn get(b: &[u8], off: usize, width: usize, be: bool) -> Option<u64> {
    let s = b.get(off..off.checked_add(width)?)?;
    let mut v = 0u64;
    for i in 0..width {
        let byte = if be { s[i] } else { s[width - 1 - i] };
        v = (v << 8) | byte as u64;
    }
    Some(v)
}

/// Write `v` as `width` bytes.
pub(crate) fn put(b: &mut [u8], off: usize, width: usize, be: bool, v: u64) {
    if let Some(s) = off.checked_add(width).and_then(|end| b.get_mut(off..end)) {
        for i in 0..width {
            let byte = (v >> (8 * i)) as u8;
            if be {
                s[width - 1 - i] = byte;
            } else {
                s[i] = byte;
            }
        }
    }
}

struct Builder<'a> {
    map: DiskMap,
    file: usize,
    bytes: &'a [u8],
    be: bool,
}

impl Builder<'_> {
    fn f(&mut self, off: usize, width: usize, kind: Kind, name: impl Into<String>) -> Option<u64> {
        let v = get(self.bytes, off, width, self.be)?;
        self.map.fields.push(Field { file: self.file, off, width, be: self.be, kind, name: name.into() });
        Some(v)
    }

    /// Entries of a table; all non-zero ones, and the first few zero ones
    /// (unallocated entries are as interesting as allocated ones, but a
    /// mostly-empty table must not drown the header fields).
    fn table(&mut self, off: usize, n: usize, width: usize, kind: Kind, name: &str) -> Vec<(usize, u64)> {
        let mut out = Vec::new();
        let mut zeros = 0;
        for i in 0..n.min(1 << 16) {
            let at = off + i * width;
            let Some(v) = get(self.bytes, at, width, self.be) else { break };
            let empty = v == 0 || (width == 4 && v == 0xFFFF_FFFF);
            if empty {
                zeros += 1;
                if zeros > 4 {
                    continue;
                }
            }
            self.f(at, width, kind, format!("{name}[{i}]"));
            if !empty {
                out.push((i, v));
            }
        }
        out
    }
}

/// The map of a seed named `name` whose files are `files`.
pub fn map_seed(name: &str, files: &[(String, Vec<u8>)]) -> DiskMap {
    let mut b = Builder { map: DiskMap { cluster: 512, ..Default::default() }, file: 0, bytes: &files[0].1, be: false };
    if name.starts_with("qcow2") {
        b.be = true;
        qcow2(&mut b);
        if files.len() > 1 {
            b.file = 1;
            b.bytes = &files[1].1;
            qcow2(&mut b);
        }
    } else if name.starts_with("vhdx") {
        vhdx(&mut b);
    } else if name.starts_with("vhd") {
        b.be = true;
        vhd(&mut b);
    } else if name == "vmdk-flat" {
        let len = b.bytes.iter().rposition(|&c| c != 0).map_or(0, |p| p + 1);
        b.map.texts.push(TextRegion {
            file: 0,
            off: 0,
            room: 1 << 20,
            len,
            name: "descriptor".into(),
            rlocn: None,
            qcow2_backing: false,
            whole_file: true,
        });
    } else if name.starts_with("vmdk") {
        vmdk(&mut b);
    } else if name.starts_with("android") {
        android(&mut b);
    } else if name.starts_with("lvm") {
        lvm(&mut b);
    }
    b.map.landmarks.sort_unstable();
    b.map.landmarks.dedup();
    b.map
}

const QCOW2_OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;

/// qcow2 (docs/interop/qcow2.txt): header, extensions, L1 → L2, refcount
/// table → refcount blocks, backing file name.
fn qcow2(b: &mut Builder) {
    let fb = b.file;
    let p = |s: &str| if fb == 0 { s.to_string() } else { format!("backing {s}") };
    b.f(0, 4, Kind::Plain, p("magic"));
    let version = b.f(4, 4, Kind::Plain, p("version")).unwrap_or(3);
    let bfo = b.f(8, 8, Kind::Offset(1), p("backing_file_offset")).unwrap_or(0);
    let bfs = b.f(16, 4, Kind::Count, p("backing_file_size")).unwrap_or(0);
    let cbits = b.f(20, 4, Kind::Plain, p("cluster_bits")).unwrap_or(16);
    b.f(24, 8, Kind::Count, p("size"));
    b.f(32, 4, Kind::Plain, p("crypt_method"));
    let l1n = b.f(36, 4, Kind::Count, p("l1_size")).unwrap_or(0);
    let l1 = b.f(40, 8, Kind::Offset(1), p("l1_table_offset")).unwrap_or(0);
    let rt = b.f(48, 8, Kind::Offset(1), p("refcount_table_offset")).unwrap_or(0);
    let rtc = b.f(56, 4, Kind::Count, p("refcount_table_clusters")).unwrap_or(0);
    b.f(60, 4, Kind::Count, p("nb_snapshots"));
    b.f(64, 8, Kind::Offset(1), p("snapshots_offset"));
    let mut hlen = 72;
    let mut rorder = 4;
    if version >= 3 {
        b.f(72, 8, Kind::Plain, p("incompatible_features"));
        b.f(80, 8, Kind::Plain, p("compatible_features"));
        b.f(88, 8, Kind::Plain, p("autoclear_features"));
        rorder = b.f(96, 4, Kind::Plain, p("refcount_order")).unwrap_or(4);
        hlen = b.f(100, 4, Kind::Count, p("header_length")).unwrap_or(104);
        if hlen > 104 {
            b.f(104, 1, Kind::Plain, p("compression_type"));
        }
    }
    let cs = 1u64 << cbits.min(21);
    if fb == 0 {
        b.map.cluster = cs;
        b.map.landmarks.extend([0, l1, rt]);
    }
    // Header extensions: (type u32, length u32, data padded to 8) until type 0.
    let mut off = hlen as usize;
    for i in 0..32 {
        let Some(ty) = b.f(off, 4, Kind::Plain, p(&format!("ext[{i}].type"))) else { break };
        let len = b.f(off + 4, 4, Kind::Count, p(&format!("ext[{i}].length"))).unwrap_or(0);
        if ty == 0 {
            break;
        }
        off += 8 + (len as usize).div_ceil(8) * 8;
    }
    if bfo != 0 && bfs != 0 {
        b.map.texts.push(TextRegion {
            file: fb,
            off: bfo as usize,
            room: (cs as usize).saturating_sub(bfo as usize).min(1023),
            len: bfs as usize,
            name: p("backing file name"),
            rlocn: None,
            qcow2_backing: true,
            whole_file: false,
        });
    }
    let l2s = b.table(l1 as usize, l1n as usize, 8, Kind::Qcow2Entry, &p("L1"));
    for (i, e) in l2s.into_iter().take(16) {
        let at = e & QCOW2_OFFSET_MASK;
        if fb == 0 {
            b.map.landmarks.push(at);
        }
        b.table(at as usize, (cs / 8) as usize, 8, Kind::Qcow2Entry, &p(&format!("L2#{i}")));
    }
    let rbs = b.table(rt as usize, (rtc * cs / 8) as usize, 8, Kind::Qcow2Entry, &p("refcount_table"));
    let rwidth = match rorder {
        3 => 1,
        5 => 4,
        6 => 8,
        _ => 2,
    };
    for (i, e) in rbs.into_iter().take(4) {
        if fb == 0 {
            b.map.landmarks.push(e);
        }
        b.table(e as usize, 64, rwidth, Kind::Count, &p(&format!("refblock#{i}")));
    }
}

/// VHD (Virtual Hard Disk Image Format Specification): footer (and its
/// copy at 0), dynamic header, parent locators, BAT, block bitmaps.
fn vhd(b: &mut Builder) {
    let n = b.bytes.len();
    let Some(foot) = n.checked_sub(512) else { return };
    let dynamic = get(b.bytes, foot + 60, 4, true) != Some(2);
    let mut footers = vec![foot];
    if dynamic {
        footers.push(0);
    }
    for &f in &footers {
        let w = if f == 0 { "footer copy" } else { "footer" };
        b.f(f, 8, Kind::Plain, format!("{w} cookie"));
        b.f(f + 8, 4, Kind::Plain, format!("{w} features"));
        b.f(f + 12, 4, Kind::Plain, format!("{w} version"));
        b.f(f + 16, 8, Kind::Offset(1), format!("{w} data_offset"));
        b.f(f + 40, 8, Kind::Count, format!("{w} original_size"));
        b.f(f + 48, 8, Kind::Count, format!("{w} current_size"));
        b.f(f + 56, 4, Kind::Plain, format!("{w} geometry"));
        b.f(f + 60, 4, Kind::Plain, format!("{w} disk_type"));
        b.f(f + 64, 4, Kind::Plain, format!("{w} checksum"));
        b.map.seals.push(Seal::VhdFooter(f));
        b.map.landmarks.push(f as u64);
    }
    if !dynamic {
        return;
    }
    let Some(dh) = get(b.bytes, foot + 16, 8, true) else { return };
    let dh = dh as usize;
    b.map.landmarks.push(dh as u64);
    b.map.seals.push(Seal::VhdDynamic(dh));
    b.f(dh, 8, Kind::Plain, "dynamic cookie");
    b.f(dh + 8, 8, Kind::Offset(1), "dynamic data_offset");
    let bat = b.f(dh + 16, 8, Kind::Offset(1), "table_offset").unwrap_or(0);
    b.f(dh + 24, 4, Kind::Plain, "header_version");
    let entries = b.f(dh + 28, 4, Kind::Count, "max_table_entries").unwrap_or(0);
    let bs = b.f(dh + 32, 4, Kind::Count, "block_size").unwrap_or(0);
    b.f(dh + 36, 4, Kind::Plain, "dynamic checksum");
    for i in 0..8 {
        let l = dh + 576 + 24 * i;
        b.f(l, 4, Kind::Plain, format!("parent_locator[{i}].code"));
        b.f(l + 4, 4, Kind::Count, format!("parent_locator[{i}].data_space"));
        b.f(l + 8, 4, Kind::Count, format!("parent_locator[{i}].data_length"));
        b.f(l + 16, 8, Kind::Offset(1), format!("parent_locator[{i}].data_offset"));
    }
    b.map.landmarks.push(bat);
    let blocks = b.table(bat as usize, entries as usize, 4, Kind::Offset(512), "BAT");
    for (i, sector) in blocks.into_iter().take(8) {
        b.f(sector as usize * 512, 8, Kind::Plain, format!("block {i} bitmap"));
        let _ = bs;
    }
}

/// VHDX (MS-VHDX): file identifier, two headers, two region tables, the
/// metadata table and its items, the BAT.
fn vhdx(b: &mut Builder) {
    b.f(0, 8, Kind::Plain, "file identifier");
    let mut log = None;
    for (i, h) in [64 << 10, 128 << 10].into_iter().enumerate() {
        b.map.landmarks.push(h as u64);
        b.map.seals.push(Seal::VhdxHeader(h));
        b.f(h, 4, Kind::Plain, format!("header{i} signature"));
        b.f(h + 4, 4, Kind::Plain, format!("header{i} checksum"));
        b.f(h + 8, 8, Kind::Count, format!("header{i} sequence"));
        b.f(h + 48, 8, Kind::Plain, format!("header{i} log_guid.lo"));
        b.f(h + 56, 8, Kind::Plain, format!("header{i} log_guid.hi"));
        b.f(h + 64, 2, Kind::Plain, format!("header{i} log_version"));
        b.f(h + 66, 2, Kind::Plain, format!("header{i} version"));
        let ll = b.f(h + 68, 4, Kind::Count, format!("header{i} log_length")).unwrap_or(0);
        let lo = b.f(h + 72, 8, Kind::Offset(1), format!("header{i} log_offset")).unwrap_or(0);
        log = Some((lo, ll));
    }
    b.map.vhdx_log = log;
    let mut regions = Vec::new();
    for (i, r) in [192 << 10, 256 << 10].into_iter().enumerate() {
        b.map.landmarks.push(r as u64);
        b.map.seals.push(Seal::VhdxRegion(r));
        b.f(r, 4, Kind::Plain, format!("region table {i} signature"));
        let n = b.f(r + 8, 4, Kind::Count, format!("region table {i} entry_count")).unwrap_or(0);
        for k in 0..(n as usize).min(8) {
            let e = r + 16 + 32 * k;
            b.f(e, 8, Kind::Plain, format!("region {i}.{k} guid.lo"));
            let off = b.f(e + 16, 8, Kind::Offset(1), format!("region {i}.{k} file_offset")).unwrap_or(0);
            let len = b.f(e + 24, 4, Kind::Count, format!("region {i}.{k} length")).unwrap_or(0);
            b.f(e + 28, 4, Kind::Plain, format!("region {i}.{k} required"));
            if i == 0 {
                regions.push((off, len));
            }
        }
    }
    for (off, len) in regions {
        b.map.landmarks.push(off);
        let o = off as usize;
        if b.bytes.get(o..o + 8) == Some(b"metadata") {
            let n = b.f(o + 10, 2, Kind::Count, "metadata entry_count").unwrap_or(0);
            for k in 0..(n as usize).min(16) {
                let e = o + 32 + 32 * k;
                b.f(e, 8, Kind::Plain, format!("metadata[{k}] item_id.lo"));
                let io = b.f(e + 16, 4, Kind::Offset(1), format!("metadata[{k}] offset")).unwrap_or(0);
                let il = b.f(e + 20, 4, Kind::Count, format!("metadata[{k}] length")).unwrap_or(0);
                b.f(e + 24, 4, Kind::Plain, format!("metadata[{k}] flags"));
                let v = o + io as usize;
                b.f(v, 4, Kind::Count, format!("metadata[{k}] value u32"));
                if il >= 8 {
                    b.f(v, 8, Kind::Count, format!("metadata[{k}] value u64"));
                    b.f(v + 4, 4, Kind::Plain, format!("metadata[{k}] value u32@4"));
                }
            }
        } else {
            b.table(o, len as usize / 8, 8, Kind::VhdxBat, "BAT");
        }
    }
}

/// VMDK hosted sparse extent (VMware Virtual Disk Format 1.1): header,
/// embedded descriptor, grain directory (and redundant), grain tables;
/// for streamOptimized, the footer's header and the stream's markers.
fn vmdk(b: &mut Builder) {
    let n = b.bytes.len();
    let mut headers = vec![(0usize, "header")];
    // streamOptimized puts GD_AT_END in the header and the real one in a
    // footer: a marker sector, then a header copy, then end-of-stream.
    if get(b.bytes, 56, 8, false) == Some(u64::MAX) && n >= 1536 {
        headers.push((n - 1024, "footer header"));
    }
    let mut gd = (0, 0, 0, 0);
    for (h, w) in headers {
        b.map.landmarks.push(h as u64);
        b.f(h, 4, Kind::Plain, format!("{w} magic"));
        b.f(h + 4, 4, Kind::Plain, format!("{w} version"));
        b.f(h + 8, 4, Kind::Plain, format!("{w} flags"));
        let cap = b.f(h + 12, 8, Kind::Count, format!("{w} capacity")).unwrap_or(0);
        let grain = b.f(h + 20, 8, Kind::Count, format!("{w} grain_size")).unwrap_or(1);
        let d_off = b.f(h + 28, 8, Kind::Offset(512), format!("{w} descriptor_offset")).unwrap_or(0);
        let d_size = b.f(h + 36, 8, Kind::Count, format!("{w} descriptor_size")).unwrap_or(0);
        let gtes = b.f(h + 44, 4, Kind::Count, format!("{w} num_gtes_per_gt")).unwrap_or(512);
        let rgd = b.f(h + 48, 8, Kind::Offset(512), format!("{w} rgd_offset")).unwrap_or(0);
        let gdo = b.f(h + 56, 8, Kind::Offset(512), format!("{w} gd_offset")).unwrap_or(0);
        b.f(h + 64, 8, Kind::Count, format!("{w} overhead"));
        b.f(h + 72, 1, Kind::Plain, format!("{w} unclean_shutdown"));
        b.f(h + 73, 4, Kind::Plain, format!("{w} newline chars"));
        b.f(h + 77, 2, Kind::Plain, format!("{w} compress_algorithm"));
        if h == 0 && d_off != 0 {
            let start = d_off as usize * 512;
            let room = (d_size as usize * 512).min(1 << 20);
            let text = b.bytes.get(start..start + room).unwrap_or(&[]);
            let len = text.iter().rposition(|&c| c != 0).map_or(0, |p| p + 1);
            b.map.texts.push(TextRegion {
                file: 0,
                off: start,
                room,
                len,
                name: "embedded descriptor".into(),
                rlocn: None,
                qcow2_backing: false,
                whole_file: false,
            });
        }
        if gdo != u64::MAX {
            gd = (gdo, rgd, cap.div_ceil(grain.max(1)).div_ceil(gtes.max(1)), gtes);
        }
    }
    let (gdo, rgd, gds, gtes) = gd;
    for (dir, name) in [(gdo, "GD"), (rgd, "RGD")] {
        if dir == 0 {
            continue;
        }
        b.map.landmarks.push(dir * 512);
        let gts = b.table(dir as usize * 512, gds as usize, 4, Kind::Offset(512), name);
        for (i, gt) in gts.into_iter().take(4) {
            b.map.landmarks.push(gt * 512);
            b.table(gt as usize * 512, gtes as usize, 4, Kind::Offset(512), &format!("{name} GT#{i}"));
        }
    }
    if headers_stream(b.bytes) {
        stream_markers(b);
    }
}

fn headers_stream(bytes: &[u8]) -> bool {
    get(bytes, 56, 8, false) == Some(u64::MAX)
}

/// streamOptimized markers: a grain marker is (lba u64, size u32, data);
/// a metadata marker is (sectors u64, 0 u32, type u32) in its own sector.
fn stream_markers(b: &mut Builder) {
    let mut off = get(b.bytes, 64, 8, false).unwrap_or(0) as usize * 512;
    let mut grains = 0;
    for _ in 0..4096 {
        let (Some(v), Some(size)) = (get(b.bytes, off, 8, false), get(b.bytes, off + 8, 4, false)) else { break };
        if size > 0 {
            if grains < 64 {
                b.f(off, 8, Kind::Count, format!("grain marker @{off} lba"));
                b.f(off + 8, 4, Kind::Count, format!("grain marker @{off} size"));
            }
            grains += 1;
            off += (12 + size as usize).div_ceil(512) * 512;
        } else {
            let ty = b.f(off + 12, 4, Kind::Plain, format!("marker @{off} type")).unwrap_or(0);
            b.f(off, 8, Kind::Count, format!("marker @{off} sectors"));
            if ty == 0 {
                break;
            }
            off += 512 + v as usize * 512;
        }
    }
}

/// Android sparse (libsparse sparse_format.h): file header and every
/// chunk header.
fn android(b: &mut Builder) {
    b.f(0, 4, Kind::Plain, "magic");
    b.f(4, 2, Kind::Plain, "major_version");
    b.f(6, 2, Kind::Plain, "minor_version");
    let fh = b.f(8, 2, Kind::Count, "file_hdr_sz").unwrap_or(28);
    b.f(10, 2, Kind::Count, "chunk_hdr_sz");
    b.f(12, 4, Kind::Count, "blk_sz");
    b.f(16, 4, Kind::Count, "total_blks");
    let chunks = b.f(20, 4, Kind::Count, "total_chunks").unwrap_or(0);
    b.f(24, 4, Kind::Plain, "image_checksum");
    let mut off = fh as usize;
    for i in 0..chunks.min(4096) {
        b.map.landmarks.push(off as u64);
        b.f(off, 2, Kind::Plain, format!("chunk[{i}].type"));
        b.f(off + 4, 4, Kind::Count, format!("chunk[{i}].chunk_sz"));
        let Some(total) = b.f(off + 8, 4, Kind::Count, format!("chunk[{i}].total_sz")) else { break };
        if total < 12 {
            break;
        }
        off += total as usize;
    }
}

/// LVM2 PV: label sector, PV header with its area lists, mda header with
/// its raw_locn, and the metadata text.
fn lvm(b: &mut Builder) {
    let l = 512;
    b.map.seals.push(Seal::LvmLabel(l));
    b.f(l, 8, Kind::Plain, "label id");
    b.f(l + 8, 8, Kind::Count, "label sector_xl");
    b.f(l + 16, 4, Kind::Plain, "label crc");
    let ph = b.f(l + 20, 4, Kind::Offset(1), "label offset_xl").unwrap_or(32) as usize;
    b.f(l + 24, 8, Kind::Plain, "label type");
    let mut at = l + ph + 32;
    b.f(at, 8, Kind::Count, "pv device_size");
    at += 8;
    let mut mdas = Vec::new();
    for list in ["data area", "metadata area"] {
        for i in 0..8 {
            let off = b.f(at, 8, Kind::Offset(1), format!("{list}[{i}].offset")).unwrap_or(0);
            let size = b.f(at + 8, 8, Kind::Count, format!("{list}[{i}].size")).unwrap_or(0);
            at += 16;
            if off == 0 && size == 0 {
                break;
            }
            if list == "metadata area" {
                mdas.push(off as usize);
            }
        }
    }
    for m in mdas {
        b.map.landmarks.push(m as u64);
        b.map.seals.push(Seal::LvmMda(m));
        b.f(m, 4, Kind::Plain, "mda checksum");
        b.f(m + 4, 8, Kind::Plain, "mda magic");
        b.f(m + 20, 4, Kind::Plain, "mda version");
        let start = b.f(m + 24, 8, Kind::Offset(1), "mda start").unwrap_or(0);
        let size = b.f(m + 32, 8, Kind::Count, "mda size").unwrap_or(0);
        let r = m + 40;
        let toff = b.f(r, 8, Kind::Offset(1), "raw_locn offset").unwrap_or(0);
        let tsize = b.f(r + 8, 8, Kind::Count, "raw_locn size").unwrap_or(0);
        b.f(r + 16, 4, Kind::Plain, "raw_locn checksum");
        b.f(r + 20, 4, Kind::Plain, "raw_locn flags");
        if toff != 0 {
            let off = (start + toff) as usize;
            b.map.texts.push(TextRegion {
                file: 0,
                off,
                room: (size.saturating_sub(toff) as usize).min(256 << 10),
                len: tsize as usize,
                name: "lvm metadata".into(),
                rlocn: Some(r),
                qcow2_backing: false,
                whole_file: false,
            });
        }
    }
}
