//! streamOptimized extents: deflated grains behind grain markers, and the
//! footer that holds the real header when the grain directory was written
//! last.
//!
//! Spec ("Stream-Optimized Compressed Sparse Extents"): a grain a GTE
//! points at starts with a marker `{ uint64 lba; uint32 size; }` followed
//! by `size` bytes of deflate data (a zlib stream, RFC 1950) that inflate
//! to one grain. Metadata markers have `size` 0 and a type (`MARKER_EOS`
//! 0, `MARKER_GT` 1, `MARKER_GD` 2, `MARKER_FOOTER` 3) and fill a sector.
//! When the header's `gdOffset` is `GD_AT_END`, the file ends with a
//! footer marker, a copy of the header whose `gdOffset` is the real one,
//! and an end-of-stream marker: the last three sectors.

use std::io;

use flate2::{Decompress, FlushDecompress, Status};

use super::file::ExtentFile;
use super::header::{HostedHeader, GD_AT_END, KDMV, SECTOR};
use crate::{corrupt, DiskFormat};

/// `MARKER_EOS`.
const MARKER_EOS: u32 = 0;
/// `MARKER_FOOTER`.
const MARKER_FOOTER: u32 = 3;
/// Bytes of a grain marker before the compressed data (`lba`, `size`).
pub(crate) const GRAIN_MARKER: u64 = 12;

/// The header to use for a stream whose primary header says
/// `GD_AT_END`: the footer's, checked.
pub(crate) fn footer_header(file: &dyn ExtentFile, what: &str) -> io::Result<HostedHeader> {
    let bad = |why: &str| corrupt(DiskFormat::Vmdk, format!("{what}: {why}"));
    let len = file.len();
    if len < 4 * SECTOR {
        return Err(bad("gdOffset is GD_AT_END but the file is too short for a footer"));
    }
    let mut tail = [0u8; 3 * SECTOR as usize];
    file.read_at(len - 3 * SECTOR, &mut tail)?;
    // A metadata marker: `val` is the number of sectors that follow (1 for
    // the footer, 0 for end-of-stream), `size` is 0, then the type.
    let marker = |m: &[u8]| {
        let val = u64::from_le_bytes(m[0..8].try_into().unwrap_or([0xff; 8]));
        let size = u32::from_le_bytes(m[8..12].try_into().unwrap_or([0xff; 4]));
        let ty = u32::from_le_bytes(m[12..16].try_into().unwrap_or([0xff; 4]));
        (size == 0).then_some((val, ty))
    };
    if !matches!(marker(&tail[..512]), Some((0 | 1, MARKER_FOOTER))) {
        return Err(bad(
            "gdOffset is GD_AT_END but the third-last sector is not a footer marker",
        ));
    }
    if marker(&tail[1024..]) != Some((0, MARKER_EOS)) {
        return Err(bad(
            "gdOffset is GD_AT_END but the last sector is not an end-of-stream marker",
        ));
    }
    let mut h = [0u8; 512];
    h.copy_from_slice(&tail[512..1024]);
    if &h[..4] != KDMV {
        return Err(bad("the footer holds no KDMV header"));
    }
    let footer = HostedHeader::parse(&h);
    if footer.gd_offset == GD_AT_END {
        return Err(bad("the footer's gdOffset is GD_AT_END too"));
    }
    Ok(footer)
}

/// Inflate the grain whose GTE is `sector` into `out` (one grain; a
/// stream that inflates to less leaves the rest zero). `lba` is the grain's
/// first guest sector, which its marker must repeat.
pub(crate) fn read_grain(
    file: &dyn ExtentFile,
    sector: u64,
    lba: u64,
    markers: bool,
    out: &mut [u8],
    what: &str,
) -> io::Result<()> {
    let bad = |why: String| {
        corrupt(
            DiskFormat::Vmdk,
            format!("{what}: compressed grain at sector {sector}: {why}"),
        )
    };
    let len = file.len();
    let grain = out.len() as u64;
    // Deflate can expand incompressible data a little; qemu allows twice.
    let limit = 2 * grain + SECTOR;
    let start = sector
        .checked_mul(SECTOR)
        .filter(|&s| sector >= 1 && s < len)
        .ok_or_else(|| bad(format!("is not inside the file ({len} bytes) after the header")))?;
    let (data_at, size) = if markers {
        let mut m = [0u8; GRAIN_MARKER as usize];
        file.read_at(start, &mut m)
            .map_err(|e| bad(format!("its marker cannot be read: {e}")))?;
        let m_lba = u64::from_le_bytes(m[0..8].try_into().unwrap_or([0; 8]));
        let size = u64::from(u32::from_le_bytes(m[8..12].try_into().unwrap_or([0; 4])));
        if m_lba != lba {
            return Err(bad(format!(
                "its marker says sector {m_lba}, the grain table says {lba}"
            )));
        }
        if size == 0 || size > limit {
            return Err(bad(format!(
                "its marker's size {size} is absurd for a grain of {grain} bytes"
            )));
        }
        (start + GRAIN_MARKER, size)
    } else {
        // No marker: the stream's end is found by inflating it.
        (start, limit.min(len - start))
    };
    if data_at.checked_add(size).is_none_or(|e| e > len) {
        return Err(bad(format!(
            "its {size} bytes run past the end of the file ({len} bytes)"
        )));
    }
    let mut data = vec![0u8; size as usize];
    file.read_at(data_at, &mut data)?;
    let mut z = Decompress::new(true);
    out.fill(0);
    let status = z
        .decompress(&data, out, FlushDecompress::Finish)
        .map_err(|e| bad(format!("inflate: {e}")))?;
    if status != Status::StreamEnd {
        let why = if z.total_out() == grain {
            format!("inflates to more than a grain ({grain} bytes)")
        } else {
            "the deflate stream is truncated".to_string()
        };
        return Err(bad(why));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::file::{mem_file, Device};
    use super::*;
    use flate2::{Compress, Compression, FlushCompress};

    pub(crate) fn deflate(data: &[u8]) -> Vec<u8> {
        let mut c = Compress::new(Compression::fast(), true);
        let mut out = Vec::with_capacity(data.len() + 64);
        c.compress_vec(data, &mut out, FlushCompress::Finish).unwrap();
        out
    }

    fn grain_file(lba: u64, size_override: Option<u32>, payload: &[u8]) -> Device {
        let z = deflate(payload);
        let mut v = vec![0u8; 512];
        v.extend_from_slice(&lba.to_le_bytes());
        v.extend_from_slice(&size_override.unwrap_or(z.len() as u32).to_le_bytes());
        v.extend_from_slice(&z);
        v.resize(v.len().next_multiple_of(512), 0);
        mem_file(v).0
    }

    #[test]
    fn a_marked_grain_inflates() {
        let payload: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let f = grain_file(8, None, &payload);
        let mut out = vec![0u8; 4096];
        read_grain(&f, 1, 8, true, &mut out, "t").unwrap();
        assert_eq!(out, payload);
    }

    #[test]
    fn hostile_grains_are_errors() {
        let payload = vec![7u8; 4096];
        let mut out = vec![0u8; 4096];
        let e = read_grain(&grain_file(8, None, &payload), 1, 16, true, &mut out, "t").unwrap_err();
        assert!(e.to_string().contains("marker says"), "{e}");
        let e = read_grain(&grain_file(8, Some(u32::MAX), &payload), 1, 8, true, &mut out, "t").unwrap_err();
        assert!(e.to_string().contains("absurd"), "{e}");
        let e = read_grain(&grain_file(8, Some(5000), &payload), 1, 8, true, &mut out, "t").unwrap_err();
        assert!(e.to_string().contains("past the end"), "{e}");
        let e = read_grain(&grain_file(8, None, &payload), 99, 8, true, &mut out, "t").unwrap_err();
        assert!(e.to_string().contains("not inside"), "{e}");
        // A grain that inflates to more than a grain.
        let mut small = vec![0u8; 2048];
        let e = read_grain(&grain_file(8, None, &payload), 1, 8, true, &mut small, "t").unwrap_err();
        assert!(e.to_string().contains("more than a grain"), "{e}");
        // Garbage instead of deflate data.
        let (f, _) = mem_file({
            let mut v = vec![0u8; 1024];
            v[512..520].copy_from_slice(&8u64.to_le_bytes());
            v[520..524].copy_from_slice(&100u32.to_le_bytes());
            v[524..624].fill(0x55);
            v
        });
        let e = read_grain(&f, 1, 8, true, &mut out, "t").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}
