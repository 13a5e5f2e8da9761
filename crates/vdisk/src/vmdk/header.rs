//! The sparse extent headers: the hosted `SparseExtentHeader` ("KDMV",
//! versions 1–3) and ESX's older `COWDisk_Header` ("COWD", vmfsSparse),
//! reduced to the one [`Geometry`] the grain lookup needs, with every
//! number checked against the file before anything is allocated from it.

use std::io;

use crate::{corrupt, unsupported, DiskFormat};

/// Bytes per sector: every offset and size in a VMDK header counts these.
pub(crate) const SECTOR: u64 = 512;
/// `magicNumber` of a hosted sparse extent, "KDMV" on disk.
pub(crate) const KDMV: &[u8; 4] = b"KDMV";
/// The magic of an ESX COW sparse extent, "COWD" on disk.
pub(crate) const COWD: &[u8; 4] = b"COWD";
/// `gdOffset` of a stream whose grain directory is found through the
/// footer (spec: "GD_AT_END").
pub(crate) const GD_AT_END: u64 = u64::MAX;

/// `flags` bit 0: the newline-detection bytes are valid.
const FLAG_NL_DETECT: u32 = 1 << 0;
/// `flags` bit 1: a redundant grain directory is kept (`rgdOffset`).
const FLAG_RGD: u32 = 1 << 1;
/// `flags` bit 2: a GTE of 1 means a grain of zeros.
const FLAG_ZERO_GRAIN: u32 = 1 << 2;
/// `flags` bit 16: grains are compressed.
const FLAG_COMPRESSED: u32 = 1 << 16;
/// `flags` bit 17: grains and metadata are preceded by markers.
const FLAG_MARKERS: u32 = 1 << 17;
/// `compressAlgorithm` 1: deflate (a zlib stream, RFC 1950).
const COMPRESSION_DEFLATE: u16 = 1;

/// The largest grain accepted, in sectors (8 MiB; VMware writes 64 KiB):
/// a compressed grain and a grain being allocated are held in memory.
pub(crate) const MAX_GRAIN_SECTORS: u64 = 1 << 14;
/// `numGTEsPerGT` is 512 in every writer; qemu refuses more.
const MAX_GTES: u32 = 512;
/// A COWD grain table always holds 4096 entries.
const COWD_GTES: u32 = 4096;
/// The most grain directory entries kept in memory (64 MiB of them): a
/// 256 TiB disk of 64 KiB grains needs 8 Mi.
const MAX_GD_ENTRIES: u64 = 16 << 20;

/// Which header the geometry came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `SparseExtentHeader`, "KDMV".
    Hosted,
    /// `COWDisk_Header`, "COWD".
    Cow,
}

/// What a sparse extent's header says, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) kind: Kind,
    pub(crate) version: u32,
    /// `capacity`, in sectors.
    pub(crate) capacity: u64,
    /// `grainSize`, in sectors (a power of two).
    pub(crate) grain: u64,
    /// `numGTEsPerGT`.
    pub(crate) gtes: u32,
    /// `gdOffset`, in sectors (the footer's, for a stream).
    pub(crate) gd: u64,
    /// `rgdOffset` when a redundant directory is kept.
    pub(crate) rgd: Option<u64>,
    /// Entries in the grain directory.
    pub(crate) gd_entries: u64,
    /// A GTE of 1 reads as zeros.
    pub(crate) zero_grain: bool,
    /// Grains are deflated.
    pub(crate) compressed: bool,
    /// Grains start with a marker (`lba`, `size`).
    pub(crate) markers: bool,
    /// `descriptorOffset`, `descriptorSize` (sectors) of an embedded
    /// descriptor, if any.
    pub(crate) descriptor: Option<(u64, u64)>,
    /// Sectors before this hold header, descriptor and directories: no
    /// grain is written there.
    pub(crate) meta_end: u64,
}

impl Geometry {
    /// Bytes in one grain.
    pub(crate) fn grain_bytes(&self) -> u64 {
        self.grain * SECTOR
    }

    /// Sectors one grain table takes.
    pub(crate) fn gt_sectors(&self) -> u64 {
        (u64::from(self.gtes) * 4).div_ceil(SECTOR)
    }
}

/// The raw fields of a `SparseExtentHeader` (spec layout, little-endian,
/// packed: 512 bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostedHeader {
    pub(crate) version: u32,
    pub(crate) flags: u32,
    pub(crate) capacity: u64,
    pub(crate) grain_size: u64,
    pub(crate) descriptor_offset: u64,
    pub(crate) descriptor_size: u64,
    pub(crate) num_gtes_per_gt: u32,
    pub(crate) rgd_offset: u64,
    pub(crate) gd_offset: u64,
    pub(crate) over_head: u64,
    /// singleEndLineChar, nonEndLineChar, doubleEndLineChar1/2.
    pub(crate) newline_check: [u8; 4],
    pub(crate) compress_algorithm: u16,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl HostedHeader {
    /// The fields of a 512-byte header that starts with "KDMV".
    pub(crate) fn parse(b: &[u8; 512]) -> HostedHeader {
        let mut newline_check = [0u8; 4];
        newline_check.copy_from_slice(&b[73..77]);
        HostedHeader {
            version: u32_at(b, 4),
            flags: u32_at(b, 8),
            capacity: u64_at(b, 12),
            grain_size: u64_at(b, 20),
            descriptor_offset: u64_at(b, 28),
            descriptor_size: u64_at(b, 36),
            num_gtes_per_gt: u32_at(b, 44),
            rgd_offset: u64_at(b, 48),
            gd_offset: u64_at(b, 56),
            over_head: u64_at(b, 64),
            newline_check,
            compress_algorithm: u16::from_le_bytes([b[77], b[78]]),
        }
    }

    /// The checked geometry of this header in a file of `file_len` bytes.
    /// `gd_offset` must already be resolved (not [`GD_AT_END`]).
    pub(crate) fn geometry(&self, file_len: u64, what: &str) -> io::Result<Geometry> {
        let bad = |why: String| corrupt(DiskFormat::Vmdk, format!("{what}: {why}"));
        if !(1..=3).contains(&self.version) {
            return Err(unsupported(
                DiskFormat::Vmdk,
                format!("{what}: sparse extent version {} (only 1 to 3 are known)", self.version),
            ));
        }
        // The spec's check against a transfer in text mode (FTP's ASCII):
        // '\n', ' ', '\r', '\n' must arrive unchanged.
        if self.flags & FLAG_NL_DETECT != 0 && self.newline_check != *b"\n \r\n" {
            return Err(bad(
                "the newline-detection bytes are altered (was the file copied in text mode?)".into(),
            ));
        }
        let compressed = self.flags & FLAG_COMPRESSED != 0;
        if compressed && self.compress_algorithm != COMPRESSION_DEFLATE {
            return Err(unsupported(
                DiskFormat::Vmdk,
                format!(
                    "{what}: compressAlgorithm {} (only deflate is known)",
                    self.compress_algorithm
                ),
            ));
        }
        let grain = self.grain_size;
        if grain == 0 || !grain.is_power_of_two() || grain > MAX_GRAIN_SECTORS {
            return Err(bad(format!(
                "grainSize {grain} sectors (must be a power of two up to {MAX_GRAIN_SECTORS})"
            )));
        }
        let gtes = self.num_gtes_per_gt;
        if gtes == 0 || gtes > MAX_GTES {
            return Err(bad(format!("numGTEsPerGT {gtes} (must be 1 to {MAX_GTES})")));
        }
        let rgd = if self.flags & FLAG_RGD != 0 && self.rgd_offset != 0 {
            Some(self.rgd_offset)
        } else {
            None
        };
        let descriptor = (self.descriptor_offset != 0).then_some((self.descriptor_offset, self.descriptor_size));
        let mut g = Geometry {
            kind: Kind::Hosted,
            version: self.version,
            capacity: self.capacity,
            grain,
            gtes,
            gd: self.gd_offset,
            rgd,
            gd_entries: 0,
            zero_grain: self.flags & FLAG_ZERO_GRAIN != 0,
            compressed,
            markers: self.flags & FLAG_MARKERS != 0,
            descriptor,
            meta_end: self.over_head,
        };
        g.gd_entries =
            needed_gd_entries(&g).ok_or_else(|| bad(format!("capacity {} sectors is absurd", g.capacity)))?;
        check_tables(&mut g, file_len, what)?;
        Ok(g)
    }
}

/// GDEs needed to map `capacity` (each GT maps `gtes` grains).
fn needed_gd_entries(g: &Geometry) -> Option<u64> {
    g.capacity.checked_mul(SECTOR)?;
    let per_gt = g.grain.checked_mul(u64::from(g.gtes))?;
    Some(g.capacity.div_ceil(per_gt))
}

/// Check the descriptor and directories lie inside the file, after the
/// header, and set `meta_end` past all of them.
fn check_tables(g: &mut Geometry, file_len: u64, what: &str) -> io::Result<()> {
    let bad = |why: String| corrupt(DiskFormat::Vmdk, format!("{what}: {why}"));
    if g.gd_entries > MAX_GD_ENTRIES {
        return Err(bad(format!(
            "capacity {} sectors needs {} grain directory entries (at most {MAX_GD_ENTRIES})",
            g.capacity, g.gd_entries
        )));
    }
    let region = |name: &str, sector: u64, bytes: u64| -> io::Result<u64> {
        let end = sector
            .checked_mul(SECTOR)
            .and_then(|s| s.checked_add(bytes))
            .filter(|&e| sector >= 1 && e <= file_len)
            .ok_or_else(|| {
                bad(format!(
                    "{name} at sector {sector} ({bytes} bytes) is not inside the file ({file_len} bytes) after the header"
                ))
            })?;
        Ok(end.div_ceil(SECTOR))
    };
    let gd_bytes = g.gd_entries * 4;
    let mut meta_end = g.meta_end.max(region("grain directory (gdOffset)", g.gd, gd_bytes)?);
    if let Some(rgd) = g.rgd {
        meta_end = meta_end.max(region("redundant grain directory (rgdOffset)", rgd, gd_bytes)?);
    }
    if let Some((off, size)) = g.descriptor {
        let bytes = size
            .checked_mul(SECTOR)
            .filter(|&b| b <= super::descriptor::MAX_DESCRIPTOR)
            .ok_or_else(|| bad(format!("descriptorSize {size} sectors is larger than 1 MiB")))?;
        meta_end = meta_end.max(region("embedded descriptor (descriptorOffset)", off, bytes)?);
    }
    g.meta_end = meta_end.max(1);
    Ok(())
}

/// The checked geometry of a COWD header (`COWDisk_Header`: magic,
/// version, flags, numSectors, grainSize, gdOffset, numGDEntries,
/// freeSector, all 32-bit little-endian; grain tables of 4096 entries).
pub(crate) fn cow_geometry(b: &[u8; 512], file_len: u64, what: &str) -> io::Result<Geometry> {
    let bad = |why: String| corrupt(DiskFormat::Vmdk, format!("{what}: {why}"));
    let version = u32_at(b, 4);
    if version != 1 {
        return Err(unsupported(
            DiskFormat::Vmdk,
            format!("{what}: COWD version {version} (only 1 is known)"),
        ));
    }
    let grain = u64::from(u32_at(b, 16));
    if grain == 0 || !grain.is_power_of_two() || grain > MAX_GRAIN_SECTORS {
        return Err(bad(format!("COWD grainSize {grain} sectors")));
    }
    let mut g = Geometry {
        kind: Kind::Cow,
        version,
        capacity: u64::from(u32_at(b, 12)),
        grain,
        gtes: COWD_GTES,
        gd: u64::from(u32_at(b, 20)),
        rgd: None,
        gd_entries: u64::from(u32_at(b, 24)),
        zero_grain: false,
        compressed: false,
        markers: false,
        descriptor: None,
        meta_end: 0,
    };
    let needed = needed_gd_entries(&g).unwrap_or(u64::MAX);
    if g.gd_entries < needed {
        return Err(bad(format!(
            "COWD numGDEntries {} cannot map {} sectors ({needed} needed)",
            g.gd_entries, g.capacity
        )));
    }
    check_tables(&mut g, file_len, what)?;
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid header like qemu-img's: 64 KiB grains, GD at sector 26.
    pub(crate) fn header(capacity: u64) -> [u8; 512] {
        let mut b = [0u8; 512];
        b[..4].copy_from_slice(KDMV);
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..12].copy_from_slice(&3u32.to_le_bytes());
        b[12..20].copy_from_slice(&capacity.to_le_bytes());
        b[20..28].copy_from_slice(&128u64.to_le_bytes());
        b[44..48].copy_from_slice(&512u32.to_le_bytes());
        b[48..56].copy_from_slice(&21u64.to_le_bytes());
        b[56..64].copy_from_slice(&26u64.to_le_bytes());
        b[64..72].copy_from_slice(&128u64.to_le_bytes());
        b[73..77].copy_from_slice(b"\n \r\n");
        b
    }

    fn geo(b: &[u8; 512], len: u64) -> io::Result<Geometry> {
        HostedHeader::parse(b).geometry(len, "t")
    }

    #[test]
    fn a_qemu_header() {
        let g = geo(&header(16384), 1 << 20).unwrap();
        assert_eq!(
            (g.grain, g.gtes, g.gd, g.rgd, g.gd_entries),
            (128, 512, 26, Some(21), 1)
        );
        assert_eq!(g.meta_end, 128);
        assert!(!g.compressed && !g.zero_grain);
    }

    #[test]
    fn absurd_numbers_are_errors_not_allocations() {
        let mut cases: Vec<([u8; 512], &str)> = Vec::new();
        let mut b = header(16384);
        b[20..28].copy_from_slice(&100u64.to_le_bytes());
        cases.push((b, "grainSize"));
        let mut b = header(16384);
        b[20..28].copy_from_slice(&u64::MAX.to_le_bytes());
        cases.push((b, "grainSize"));
        let mut b = header(16384);
        b[44..48].copy_from_slice(&u32::MAX.to_le_bytes());
        cases.push((b, "numGTEsPerGT"));
        cases.push((header(u64::MAX / 4), "capacity"));
        // 2^40 sectors need 16 Mi GDEs: more than the file holds.
        cases.push((header(1 << 40), "grain directory"));
        let mut b = header(16384);
        b[56..64].copy_from_slice(&0u64.to_le_bytes());
        cases.push((b, "after the header"));
        let mut b = header(16384);
        b[56..64].copy_from_slice(&(u64::MAX / 256).to_le_bytes());
        cases.push((b, "gdOffset"));
        let mut b = header(16384);
        b[48..56].copy_from_slice(&9999u64.to_le_bytes());
        cases.push((b, "rgdOffset"));
        let mut b = header(16384);
        b[28..36].copy_from_slice(&1u64.to_le_bytes());
        b[36..44].copy_from_slice(&(1u64 << 40).to_le_bytes());
        cases.push((b, "descriptorSize"));
        let mut b = header(16384);
        b[74] = b'\r';
        cases.push((b, "text mode"));
        for (b, want) in cases {
            let e = geo(&b, 1 << 20).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{want}: {e}");
            assert!(e.to_string().contains(want), "{want}: {e}");
        }
        let mut b = header(16384);
        b[4..8].copy_from_slice(&4u32.to_le_bytes());
        assert_eq!(geo(&b, 1 << 20).unwrap_err().kind(), io::ErrorKind::Unsupported);
    }

    #[test]
    fn a_cow_header() {
        let mut b = [0u8; 512];
        b[..4].copy_from_slice(COWD);
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[12..16].copy_from_slice(&8192u32.to_le_bytes());
        b[16..20].copy_from_slice(&1u32.to_le_bytes());
        b[20..24].copy_from_slice(&4u32.to_le_bytes());
        b[24..28].copy_from_slice(&2u32.to_le_bytes());
        let g = cow_geometry(&b, 1 << 20, "t").unwrap();
        assert_eq!((g.gtes, g.gd_entries, g.grain), (4096, 2, 1));
        b[24..28].copy_from_slice(&1u32.to_le_bytes());
        assert!(cow_geometry(&b, 1 << 20, "t")
            .unwrap_err()
            .to_string()
            .contains("numGDEntries"));
    }
}
