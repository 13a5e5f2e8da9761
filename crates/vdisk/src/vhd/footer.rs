//! The VHD footer: the 512-byte record at the end of every VHD (and, in a
//! dynamic disk, copied into its first sector), big-endian.
//!
//! Layout (Virtual Hard Disk Image Format Specification, "Hard Disk
//! Footer Format"): cookie "conectix" (0), features (8), file format
//! version (12), data offset (16, the dynamic header's offset, or all ones
//! for a fixed disk), time stamp (24), creator application (28), creator
//! version (32), creator host OS (36), original size (40), current size
//! (48), disk geometry cylinders/heads/sectors (56, 58, 59), disk type (60:
//! 2 fixed, 3 dynamic, 4 differencing), checksum (64: the one's complement
//! of the sum of the footer's bytes with this field zero), unique id (68),
//! saved state (84).

use std::fmt;

/// Size of the footer (and of its copy at the start of a dynamic disk).
pub(super) const FOOTER_LEN: usize = 512;
/// `"conectix"`.
const COOKIE: &[u8; 8] = b"conectix";
/// The largest CHS geometry (65535 cylinders, 16 heads, 255 sectors):
/// a disk this size or larger records its true size only in
/// `current_size`.
pub(super) const MAX_GEOMETRY_SECTORS: u64 = 65535 * 16 * 255;

/// What kind of VHD the footer describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DiskType {
    /// Data, then the footer.
    Fixed,
    /// A header and a block allocation table; blocks appended as written.
    Dynamic,
    /// A dynamic disk holding only the changes to a parent.
    Differencing,
}

impl fmt::Display for DiskType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DiskType::Fixed => "fixed",
            DiskType::Dynamic => "dynamic",
            DiskType::Differencing => "differencing",
        })
    }
}

/// A checked footer.
#[derive(Debug, Clone)]
pub(super) struct Footer {
    raw: [u8; FOOTER_LEN],
    disk_type: DiskType,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(super) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(super) fn be64(b: &[u8], at: usize) -> u64 {
    (be32(b, at) as u64) << 32 | be32(b, at + 4) as u64
}

/// The VHD checksum of `b` with the 4 bytes at `field` counted as zero.
pub(super) fn checksum(b: &[u8], field: usize) -> u32 {
    let sum = b
        .iter()
        .enumerate()
        .filter(|(i, _)| !(field..field + 4).contains(i))
        .fold(0u32, |s, (_, &x)| s.wrapping_add(x as u32));
    !sum
}

impl Footer {
    /// Check `raw` as a footer: cookie, checksum, disk type.
    pub(super) fn parse(raw: &[u8; FOOTER_LEN]) -> Result<Footer, String> {
        if &raw[..8] != COOKIE {
            return Err("no \"conectix\" cookie".into());
        }
        let stored = be32(raw, 64);
        let computed = checksum(raw, 64);
        if stored != computed {
            return Err(format!("checksum {stored:#010x}, the bytes sum to {computed:#010x}"));
        }
        let disk_type = match be32(raw, 60) {
            2 => DiskType::Fixed,
            3 => DiskType::Dynamic,
            4 => DiskType::Differencing,
            t => return Err(format!("disk type {t} (2 fixed, 3 dynamic and 4 differencing exist)")),
        };
        Ok(Footer { raw: *raw, disk_type })
    }

    /// Fixed, dynamic or differencing.
    pub(super) fn disk_type(&self) -> DiskType {
        self.disk_type
    }

    /// Where the dynamic disk header is.
    pub(super) fn data_offset(&self) -> u64 {
        be64(&self.raw, 16)
    }

    /// The creator application, as text ("qemu", "win ", "vpc ").
    pub(super) fn creator(&self) -> String {
        String::from_utf8_lossy(&self.raw[28..32])
            .trim_end_matches(['\0', ' '])
            .to_string()
    }

    /// The disk's size in bytes, as qemu's `vpc_open` decides it (so that
    /// we and `qemu-img convert` agree on where the disk ends): Virtual PC
    /// and qemu's own "qemu" images are as large as their CHS geometry
    /// says; Hyper-V ("win "), disk2vhd ("d2v "), qemu's "qem2", XenServer
    /// ("tap") and XenConverter ("CTXS") images, and any image at the
    /// largest geometry, are `current_size`.
    pub(super) fn virtual_size(&self) -> u64 {
        let chs = be16(&self.raw, 56) as u64 * self.raw[58] as u64 * self.raw[59] as u64;
        let creator = &self.raw[28..32];
        let uses_current = [&b"win "[..], b"qem2", b"d2v ", b"CTXS"].contains(&creator) || creator.starts_with(b"tap");
        if uses_current || chs >= MAX_GEOMETRY_SECTORS {
            be64(&self.raw, 48)
        } else {
            chs * 512
        }
    }

    /// The footer's bytes, to write at the file's new end.
    pub(super) fn bytes(&self) -> &[u8; FOOTER_LEN] {
        &self.raw
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A footer as qemu writes one (creator "qemu", geometry for `sectors`).
    pub(crate) fn footer(
        disk_type: u32,
        data_offset: u64,
        size: u64,
        chs: (u16, u8, u8),
        creator: &[u8; 4],
    ) -> [u8; FOOTER_LEN] {
        let mut f = [0u8; FOOTER_LEN];
        f[..8].copy_from_slice(COOKIE);
        f[8..12].copy_from_slice(&2u32.to_be_bytes());
        f[12..16].copy_from_slice(&0x0001_0000u32.to_be_bytes());
        f[16..24].copy_from_slice(&data_offset.to_be_bytes());
        f[28..32].copy_from_slice(creator);
        f[40..48].copy_from_slice(&size.to_be_bytes());
        f[48..56].copy_from_slice(&size.to_be_bytes());
        f[56..58].copy_from_slice(&chs.0.to_be_bytes());
        f[58] = chs.1;
        f[59] = chs.2;
        f[60..64].copy_from_slice(&disk_type.to_be_bytes());
        let c = checksum(&f, 64);
        f[64..68].copy_from_slice(&c.to_be_bytes());
        f
    }

    #[test]
    fn size_follows_qemus_rule_for_each_creator() {
        let chs = (130, 16, 63); // 131040 sectors
        let f = Footer::parse(&footer(2, u64::MAX, 64 << 20, chs, b"qemu")).unwrap();
        assert_eq!(f.virtual_size(), 130 * 16 * 63 * 512);
        let f = Footer::parse(&footer(2, u64::MAX, 64 << 20, chs, b"win ")).unwrap();
        assert_eq!(f.virtual_size(), 64 << 20);
        assert_eq!(f.creator(), "win");
        let f = Footer::parse(&footer(3, 512, 1 << 40, (65535, 16, 255), b"vpc ")).unwrap();
        assert_eq!(f.virtual_size(), 1 << 40);
        assert_eq!(f.disk_type(), DiskType::Dynamic);
    }

    #[test]
    fn a_bad_cookie_checksum_or_type_is_named() {
        let mut f = footer(2, u64::MAX, 1 << 20, (1, 1, 1), b"qemu");
        f[100] ^= 1;
        assert!(Footer::parse(&f).unwrap_err().contains("checksum"));
        let mut f = footer(9, u64::MAX, 1 << 20, (1, 1, 1), b"qemu");
        assert!(Footer::parse(&f).unwrap_err().contains("disk type 9"));
        f[0] = b'C';
        assert!(Footer::parse(&f).unwrap_err().contains("cookie"));
    }
}
