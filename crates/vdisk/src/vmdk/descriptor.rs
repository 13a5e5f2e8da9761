//! The text descriptor ("# Disk DescriptorFile"): the disk's createType,
//! its parent link and its extent descriptions.
//!
//! The spec's grammar ("Virtual Disk Format 5.0", "The Descriptor"):
//! `key=value` lines in the header (`version`, `CID`, `parentCID`,
//! `createType`, `parentFileNameHint`), then one line per extent, in disk
//! order:
//!
//! ```text
//! RW 4192256 SPARSE "disk-s001.vmdk"
//! RW 8388608 FLAT "disk-flat.vmdk" 0
//! RDONLY 1024 ZERO
//! ```
//!
//! access (`RW`, `RDONLY`, `NOACCESS`), size in sectors, type (`FLAT`,
//! `SPARSE`, `ZERO`, `VMFS`, `VMFSSPARSE`, `VMFSRDM`, `VMFSRAW`,
//! `SESPARSE`), the file name in double quotes, and for flat extents the
//! offset in sectors where the extent starts in its file. Then the disk
//! database (`ddb.key = "value"`). Lines starting `#` are comments. The
//! text is limited here (total size, line length, extent count) so a
//! hostile descriptor costs bounded memory and time.

use std::io;

use crate::{corrupt, DiskFormat};

/// The largest descriptor read (VMware's own are a few hundred bytes; qemu
/// reads at most 1 MiB).
pub(crate) const MAX_DESCRIPTOR: u64 = 1 << 20;
/// The longest line accepted: a file name is at most PATH_MAX (4096).
const MAX_LINE: usize = 16 << 10;
/// The most extents a descriptor may list: a 2 TiB twoGbMaxExtent disk has
/// 1024; each extent holds an open file.
pub(crate) const MAX_EXTENTS: usize = 4096;

/// The `parentCID` of a disk with no parent (spec: "CID_NOPARENT").
const NO_PARENT: &str = "ffffffff";

/// How an extent may be accessed (the first word of its line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// `RW`
    ReadWrite,
    /// `RDONLY`
    ReadOnly,
    /// `NOACCESS`
    Denied,
}

/// The type of an extent (the third word of its line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtentType {
    /// `FLAT`: the sectors, as they are, at an offset in a file.
    Flat,
    /// `SPARSE`: a hosted sparse extent file (KDMV header).
    Sparse,
    /// `ZERO`: no file; reads as zeros.
    Zero,
    /// `VMFS`: an ESX flat extent.
    Vmfs,
    /// `VMFSSPARSE`: an ESX sparse extent (COWD header, or KDMV).
    VmfsSparse,
    /// `VMFSRDM` / `VMFSRAW`: a raw device mapping.
    RawDevice,
    /// `SESPARSE`: ESX's space-efficient sparse extent.
    SeSparse,
}

impl ExtentType {
    fn parse(s: &str) -> Option<ExtentType> {
        Some(match s {
            "FLAT" => ExtentType::Flat,
            "SPARSE" => ExtentType::Sparse,
            "ZERO" => ExtentType::Zero,
            "VMFS" => ExtentType::Vmfs,
            "VMFSSPARSE" => ExtentType::VmfsSparse,
            "VMFSRDM" | "VMFSRAW" => ExtentType::RawDevice,
            "SESPARSE" => ExtentType::SeSparse,
            _ => return None,
        })
    }

    /// The word as the descriptor spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ExtentType::Flat => "FLAT",
            ExtentType::Sparse => "SPARSE",
            ExtentType::Zero => "ZERO",
            ExtentType::Vmfs => "VMFS",
            ExtentType::VmfsSparse => "VMFSSPARSE",
            ExtentType::RawDevice => "VMFSRDM",
            ExtentType::SeSparse => "SESPARSE",
        }
    }
}

/// One extent description line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExtentLine {
    pub(crate) access: Access,
    /// Size in sectors.
    pub(crate) sectors: u64,
    pub(crate) kind: ExtentType,
    /// The file name (none for `ZERO`).
    pub(crate) file: Option<String>,
    /// Where a flat extent starts in its file, in sectors.
    pub(crate) offset: u64,
}

/// A parsed descriptor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Descriptor {
    pub(crate) create_type: Option<String>,
    pub(crate) parent_cid: Option<String>,
    pub(crate) parent_hint: Option<String>,
    pub(crate) adapter: Option<String>,
    pub(crate) extents: Vec<ExtentLine>,
}

impl Descriptor {
    /// Parse descriptor text (`where_` names it in errors). The text ends
    /// at its first NUL: an embedded descriptor is padded with zeros.
    pub(crate) fn parse(bytes: &[u8], where_: &str) -> io::Result<Descriptor> {
        let bad = |what: String| corrupt(DiskFormat::Vmdk, format!("{where_}: {what}"));
        if bytes.len() as u64 > MAX_DESCRIPTOR {
            return Err(bad(format!(
                "descriptor of {} bytes is larger than {MAX_DESCRIPTOR}",
                bytes.len()
            )));
        }
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let text = String::from_utf8_lossy(&bytes[..end]);
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let mut d = Descriptor::default();
        for (n, raw) in text.split('\n').enumerate() {
            let lineno = n + 1;
            if raw.len() > MAX_LINE {
                return Err(bad(format!(
                    "descriptor line {lineno} is {} bytes long (at most {MAX_LINE})",
                    raw.len()
                )));
            }
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let first = line.split_whitespace().next().unwrap_or("");
            let access = match first {
                "RW" => Some(Access::ReadWrite),
                "RDONLY" => Some(Access::ReadOnly),
                "NOACCESS" => Some(Access::Denied),
                _ => None,
            };
            if let Some(access) = access {
                if d.extents.len() >= MAX_EXTENTS {
                    return Err(bad(format!("more than {MAX_EXTENTS} extents")));
                }
                let e =
                    parse_extent(access, &line[first.len()..]).map_err(|why| bad(format!("line {lineno}: {why}")))?;
                d.extents.push(e);
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                // The spec allows nothing else; VMware and qemu skip such lines.
                continue;
            };
            let value = unquote(value.trim());
            match key.trim() {
                "createType" => d.create_type = Some(value.to_string()),
                "parentCID" => d.parent_cid = Some(value.to_ascii_lowercase()),
                "parentFileNameHint" => d.parent_hint = Some(value.to_string()),
                "ddb.adapterType" => d.adapter = Some(value.to_string()),
                _ => {}
            }
        }
        Ok(d)
    }

    /// Whether the disk is a delta (child) disk: its unallocated grains
    /// would come from a parent, which this crate does not open.
    pub(crate) fn has_parent(&self) -> bool {
        self.parent_cid.as_deref().is_some_and(|p| p != NO_PARENT) || self.parent_hint.is_some()
    }
}

/// `"x"` → `x`.
fn unquote(v: &str) -> &str {
    v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v)
}

/// The rest of an extent line after its access word.
fn parse_extent(access: Access, rest: &str) -> Result<ExtentLine, String> {
    let rest = rest.trim_start();
    let (size, rest) = rest
        .split_once(char::is_whitespace)
        .ok_or("extent line without a type")?;
    let sectors: u64 = size
        .parse()
        .map_err(|_| format!("extent size {size:?} is not a number"))?;
    let rest = rest.trim_start();
    let (kind_s, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let kind = ExtentType::parse(kind_s).ok_or_else(|| format!("unknown extent type {kind_s:?}"))?;
    let rest = rest.trim();
    let (file, rest) = if let Some(q) = rest.strip_prefix('"') {
        let close = q.find('"').ok_or("extent file name without its closing quote")?;
        (Some(q[..close].to_string()), q[close + 1..].trim())
    } else if rest.is_empty() {
        (None, "")
    } else {
        // Some writers omit the quotes around a name without spaces.
        let (name, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        (Some(name.to_string()), rest.trim())
    };
    let offset = match rest.split_whitespace().next() {
        Some(o) => o.parse().map_err(|_| format!("extent offset {o:?} is not a number"))?,
        None => 0,
    };
    if kind != ExtentType::Zero && file.is_none() {
        return Err(format!("{} extent without a file name", kind.name()));
    }
    Ok(ExtentLine {
        access,
        sectors,
        kind,
        file,
        offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_GB: &str = "# Disk DescriptorFile\nversion=1\nCID=79015f80\nparentCID=ffffffff\n\
        createType=\"twoGbMaxExtentSparse\"\n\n# Extent description\n\
        RW 4192256 SPARSE \"disk-s001.vmdk\"\nRW 8192 SPARSE \"disk-s002.vmdk\"\n\n\
        # The Disk Data Base\n#DDB\n\nddb.virtualHWVersion = \"4\"\nddb.adapterType = \"ide\"\n";

    #[test]
    fn a_split_sparse_descriptor() {
        let d = Descriptor::parse(TWO_GB.as_bytes(), "t").unwrap();
        assert_eq!(d.create_type.as_deref(), Some("twoGbMaxExtentSparse"));
        assert!(!d.has_parent());
        assert_eq!(d.adapter.as_deref(), Some("ide"));
        assert_eq!(d.extents.len(), 2);
        assert_eq!(
            d.extents[0],
            ExtentLine {
                access: Access::ReadWrite,
                sectors: 4192256,
                kind: ExtentType::Sparse,
                file: Some("disk-s001.vmdk".into()),
                offset: 0
            }
        );
    }

    #[test]
    fn flat_zero_spaces_crlf_and_padding() {
        let text = b"# Disk DescriptorFile\r\ncreateType=\"custom\"\r\n\
            RW 100 FLAT \"my disk-flat.vmdk\" 2048\r\nRDONLY 50 ZERO\r\nNOACCESS 7 VMFS bare.vmdk\r\n\0\0\0junk";
        let d = Descriptor::parse(text, "t").unwrap();
        assert_eq!(d.extents.len(), 3);
        assert_eq!(d.extents[0].file.as_deref(), Some("my disk-flat.vmdk"));
        assert_eq!(d.extents[0].offset, 2048);
        assert_eq!(d.extents[1].kind, ExtentType::Zero);
        assert_eq!(d.extents[1].access, Access::ReadOnly);
        assert_eq!(d.extents[1].file, None);
        assert_eq!(d.extents[2].file.as_deref(), Some("bare.vmdk"));
        assert_eq!(d.extents[2].access, Access::Denied);
    }

    #[test]
    fn a_parent_is_seen() {
        let d = Descriptor::parse(b"parentCID=1234abcd\ncreateType=\"monolithicSparse\"\n", "t").unwrap();
        assert!(d.has_parent());
        let d = Descriptor::parse(b"parentFileNameHint=\"base.vmdk\"\n", "t").unwrap();
        assert!(d.has_parent());
    }

    #[test]
    fn hostile_descriptors_are_errors() {
        let long = format!("createType=\"{}\"\n", "x".repeat(100_000));
        let many = "RW 1 ZERO\n".repeat(MAX_EXTENTS + 1);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (long.into_bytes(), "bytes long"),
            (many.into_bytes(), "more than"),
            (b"RW 12x SPARSE \"a\"\n".to_vec(), "not a number"),
            (b"RW 12 BOGUS \"a\"\n".to_vec(), "unknown extent type"),
            (b"RW 12 FLAT \"a\n".to_vec(), "closing quote"),
            (b"RW 12 FLAT\n".to_vec(), "without a file name"),
            (b"RW 99999999999999999999999 FLAT \"a\"\n".to_vec(), "not a number"),
            (b"RW 1 FLAT \"a\" -5\n".to_vec(), "offset"),
            (vec![b'#'; MAX_DESCRIPTOR as usize + 1], "larger than"),
        ];
        for (text, want) in cases {
            let e = Descriptor::parse(&text, "t").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains(want), "{want}: {e}");
        }
    }
}
