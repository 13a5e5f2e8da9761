//! Which container format a file holds, decided by its content.
//!
//! Extensions lie (a `.img` is often qcow2, WSL's `.vhdx` is VHDX, an
//! `.ova` member is a VMDK), so the format is read from magic numbers, as
//! `qemu-img info` and `file` decide it: qcow2's `QFI\xfb`, VHDX's
//! `vhdxfile`, sparse VMDK's `KDMV` or a VMDK descriptor's
//! `# Disk DescriptorFile`, Android sparse's `0xed26ff3a`, and VHD's
//! `conectix` footer (in the last sector; a dynamic VHD keeps a copy in
//! the first). Anything else is raw.

use std::fmt;
use std::io;
use std::str::FromStr;

use crate::BlockDevice;

/// A container format of a disk image file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiskFormat {
    /// The file is the disk, byte for byte.
    Raw,
    /// QEMU copy-on-write v2 or v3.
    Qcow2,
    /// Hyper-V's virtual hard disk v2.
    Vhdx,
    /// VMware's virtual disk: a sparse extent file, or a text descriptor
    /// naming extent files.
    Vmdk,
    /// Virtual PC / Azure's virtual hard disk (fixed or dynamic).
    Vhd,
    /// Android's sparse image (libsparse, `img2simg`).
    AndroidSparse,
}

impl DiskFormat {
    /// Every format, in the order `--format` lists them.
    pub const ALL: [DiskFormat; 6] = [
        DiskFormat::Raw,
        DiskFormat::Qcow2,
        DiskFormat::Vhdx,
        DiskFormat::Vmdk,
        DiskFormat::Vhd,
        DiskFormat::AndroidSparse,
    ];

    /// The name `--format` takes and messages use.
    pub fn name(self) -> &'static str {
        match self {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
            DiskFormat::Vhdx => "vhdx",
            DiskFormat::Vmdk => "vmdk",
            DiskFormat::Vhd => "vhd",
            DiskFormat::AndroidSparse => "android-sparse",
        }
    }
}

impl fmt::Display for DiskFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DiskFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        // "vpc" is qemu-img's name for VHD: users copy qemu-img command lines.
        if s == "vpc" {
            return Ok(DiskFormat::Vhd);
        }
        DiskFormat::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| {
            let names: Vec<_> = DiskFormat::ALL.iter().map(|f| f.name()).collect();
            format!("unknown disk format {s:?} (one of: {})", names.join(", "))
        })
    }
}

/// qcow2 header magic (`QCOW_MAGIC`, "QFI\xfb").
const QCOW2_MAGIC: &[u8] = b"QFI\xfb";
/// VHDX file type identifier signature.
const VHDX_MAGIC: &[u8] = b"vhdxfile";
/// Sparse VMDK extent header magic (`VMDK4_MAGIC`, "KDMV").
const VMDK_SPARSE_MAGIC: &[u8] = b"KDMV";
/// First line of a VMDK text descriptor.
pub(crate) const VMDK_DESCRIPTOR: &[u8] = b"# Disk DescriptorFile";
/// VHD footer cookie.
const VHD_COOKIE: &[u8] = b"conectix";
/// Android sparse header magic (libsparse's `SPARSE_HEADER_MAGIC`), little-endian.
const ANDROID_SPARSE_MAGIC: [u8; 4] = 0xed26_ff3au32.to_le_bytes();

/// Whether `head` (a file's first bytes) starts a VMDK text descriptor,
/// which may follow a UTF-8 byte order mark or blank lines.
pub(crate) fn is_vmdk_descriptor(head: &[u8]) -> bool {
    let text = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
    let first = text.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(text.len());
    text[first..].starts_with(VMDK_DESCRIPTOR)
}

/// The container format of `file`, from its first bytes and its last
/// sector. A file too short to hold any header is raw. Only a read error
/// is an error.
pub fn detect(file: &dyn BlockDevice) -> io::Result<DiskFormat> {
    let size = file.size();
    let mut head = vec![0u8; size.min(1024) as usize];
    file.read_at(0, &mut head)?;
    let starts = |magic: &[u8]| head.starts_with(magic);
    if starts(QCOW2_MAGIC) {
        return Ok(DiskFormat::Qcow2);
    }
    if starts(VHDX_MAGIC) {
        return Ok(DiskFormat::Vhdx);
    }
    if starts(VMDK_SPARSE_MAGIC) {
        return Ok(DiskFormat::Vmdk);
    }
    if starts(&ANDROID_SPARSE_MAGIC) {
        return Ok(DiskFormat::AndroidSparse);
    }
    if is_vmdk_descriptor(&head) {
        return Ok(DiskFormat::Vmdk);
    }
    if starts(VHD_COOKIE) {
        return Ok(DiskFormat::Vhd);
    }
    if size >= 512 {
        let mut tail = [0u8; 512];
        file.read_at(size - 512, &mut tail)?;
        if tail.starts_with(VHD_COOKIE) {
            return Ok(DiskFormat::Vhd);
        }
    }
    Ok(DiskFormat::Raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_blockdev::MemDevice;

    fn with_head(head: &[u8], size: usize) -> MemDevice {
        let mut v = vec![0u8; size];
        v[..head.len()].copy_from_slice(head);
        MemDevice::from_vec(v)
    }

    #[test]
    fn magics_decide_the_format() {
        let cases: [(&[u8], DiskFormat); 7] = [
            (b"QFI\xfb\0\0\0\x03", DiskFormat::Qcow2),
            (b"vhdxfile", DiskFormat::Vhdx),
            (b"KDMV\x01\0\0\0", DiskFormat::Vmdk),
            (b"# Disk DescriptorFile\nversion=1\n", DiskFormat::Vmdk),
            (b"\xef\xbb\xbf\n# Disk DescriptorFile\n", DiskFormat::Vmdk),
            (&[0x3a, 0xff, 0x26, 0xed], DiskFormat::AndroidSparse),
            (b"conectix", DiskFormat::Vhd),
        ];
        for (head, want) in cases {
            assert_eq!(detect(&with_head(head, 8192)).unwrap(), want, "{head:?}");
        }
    }

    #[test]
    fn a_vhd_footer_in_the_last_sector_is_a_fixed_vhd() {
        let mut v = vec![0u8; 8192];
        v[8192 - 512..8192 - 504].copy_from_slice(b"conectix");
        assert_eq!(detect(&MemDevice::from_vec(v)).unwrap(), DiskFormat::Vhd);
    }

    #[test]
    fn anything_else_is_raw_even_when_tiny() {
        assert_eq!(detect(&with_head(b"\x53\xef", 4096)).unwrap(), DiskFormat::Raw);
        assert_eq!(detect(&MemDevice::from_vec(vec![0x51, 0x46])).unwrap(), DiskFormat::Raw);
        assert_eq!(detect(&MemDevice::from_vec(Vec::new())).unwrap(), DiskFormat::Raw);
    }

    #[test]
    fn names_round_trip_and_vpc_is_vhd() {
        for f in DiskFormat::ALL {
            assert_eq!(f.name().parse::<DiskFormat>().unwrap(), f);
        }
        assert_eq!("vpc".parse::<DiskFormat>().unwrap(), DiskFormat::Vhd);
        let e = "qed".parse::<DiskFormat>().unwrap_err();
        assert!(e.contains("qcow2") && e.contains("qed"), "{e}");
    }
}
