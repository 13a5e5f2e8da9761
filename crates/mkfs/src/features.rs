//! The feature words (`s_feature_compat`, `s_feature_incompat`,
//! `s_feature_ro_compat`): the type's defaults from mke2fs.conf, less what
//! the readers asked for (`--compat`) do not support, the `-O` edits on
//! top, and the combinations mke2fs refuses or resolves.

use ext4kit_format::features::{self, compat, incompat, ro_compat};
use ext4kit_format::readers::{self, Reader};

use crate::error::{MkfsError, Result};
use crate::options::{FsType, MkfsOptions};

/// Compat features this crate knows how to lay out.
const COMPAT_OK: u32 = compat::HAS_JOURNAL | compat::EXT_ATTR | compat::RESIZE_INODE | compat::DIR_INDEX;
/// Incompat features this crate knows how to lay out.
const INCOMPAT_OK: u32 = incompat::FILETYPE
    | incompat::EXTENTS
    | incompat::BIT64
    | incompat::FLEX_BG
    | incompat::CSUM_SEED
    | incompat::LARGEDIR;
/// Read-only compat features this crate knows how to lay out.
const RO_COMPAT_OK: u32 = ro_compat::SPARSE_SUPER
    | ro_compat::LARGE_FILE
    | ro_compat::HUGE_FILE
    | ro_compat::GDT_CSUM
    | ro_compat::DIR_NLINK
    | ro_compat::EXTRA_ISIZE
    | ro_compat::METADATA_CSUM;

/// The three feature words of the superblock being made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Features {
    compat: u32,
    incompat: u32,
    ro_compat: u32,
}

impl Features {
    /// The features step: the type's defaults, less those a reader of
    /// `opts.readers` does not support (each dropped one is a note), each
    /// `-O` item in order (one a reader does not support is refused), then
    /// the rules between features that mke2fs's `PRS()` applies:
    /// `metadata_csum` supersedes `uninit_bg` (gdt_csum) and clears it;
    /// `metadata_csum_seed` needs `metadata_csum`; `64bit` needs `extent`.
    pub(crate) fn from_options(opts: &MkfsOptions, notes: &mut Vec<String>) -> Result<Self> {
        let mut f = Features::defaults(opts.fs_type);
        f.keep_supported(&opts.readers, notes);
        for item in opts.features.iter().flat_map(|s| s.split(',')) {
            f.edit(item, &opts.readers)?;
        }
        if f.has_ro(ro_compat::METADATA_CSUM) && f.has_ro(ro_compat::GDT_CSUM) {
            f.ro_compat &= !ro_compat::GDT_CSUM;
        }
        if f.has_incompat(incompat::CSUM_SEED) && !f.has_ro(ro_compat::METADATA_CSUM) {
            return Err(MkfsError::invalid("metadata_csum_seed needs metadata_csum"));
        }
        if f.has_incompat(incompat::BIT64) && !f.has_incompat(incompat::EXTENTS) {
            return Err(MkfsError::invalid("the 64bit feature needs extent"));
        }
        Ok(f)
    }

    /// mke2fs.conf's `[fs_types]` feature lists for ext2, ext3 and ext4
    /// (the `base_features` of `[defaults]` plus the type's own).
    pub(crate) fn defaults(t: FsType) -> Self {
        let mut f = Features {
            compat: compat::EXT_ATTR | compat::RESIZE_INODE | compat::DIR_INDEX,
            incompat: incompat::FILETYPE,
            ro_compat: ro_compat::SPARSE_SUPER | ro_compat::LARGE_FILE,
        };
        if t != FsType::Ext2 {
            f.compat |= compat::HAS_JOURNAL;
        }
        if t == FsType::Ext4 {
            f.incompat |= incompat::EXTENTS | incompat::FLEX_BG | incompat::BIT64;
            f.ro_compat |=
                ro_compat::HUGE_FILE | ro_compat::METADATA_CSUM | ro_compat::DIR_NLINK | ro_compat::EXTRA_ISIZE;
        }
        f
    }

    /// Leave out every feature some reader does not support. Without
    /// `metadata_csum` the group descriptors would carry no checksum at
    /// all; when every reader supports `uninit_bg` (the older crc16 of
    /// the descriptors, what AOSP's mke2fs.conf gives Android images) it
    /// takes its place, as `-O ^metadata_csum,uninit_bg` would.
    fn keep_supported(&mut self, readers: &[Reader], notes: &mut Vec<String>) {
        let mut csum_dropped = false;
        for r in readers {
            for row in readers::TABLE {
                let word = match row.word {
                    readers::Word::Compat => &mut self.compat,
                    readers::Word::Incompat => &mut self.incompat,
                    readers::Word::RoCompat => &mut self.ro_compat,
                };
                if *word & row.bit != 0 && !r.supports(row) {
                    *word &= !row.bit;
                    csum_dropped |= row.word == readers::Word::RoCompat && row.bit == ro_compat::METADATA_CSUM;
                    notes.push(format!("--compat {r}: left out {}: {}", row.name, r.why_not(row)));
                }
            }
        }
        let gdt_csum = readers::feature("uninit_bg").expect("the readers table names uninit_bg");
        if csum_dropped && readers.iter().all(|r| r.supports(gdt_csum)) {
            self.ro_compat |= ro_compat::GDT_CSUM;
            notes.push("group descriptors checksummed by uninit_bg instead of metadata_csum".into());
        }
    }

    /// Apply one mke2fs `-O` item (comma lists are split by the caller),
    /// with e2p's aliases `extents` and `gdt_csum`. Clearing any known
    /// feature is allowed; setting one needs this crate to lay it out and
    /// every reader in `readers` to support it.
    pub(crate) fn edit(&mut self, item: &str, readers: &[Reader]) -> Result<()> {
        let item = item.trim();
        if item.is_empty() {
            return Ok(());
        }
        if item == "none" {
            *self = Features::default();
            return Ok(());
        }
        let (clear, name) = match item.strip_prefix('^') {
            Some(n) => (true, n),
            None => (false, item),
        };
        let name = match name {
            "extents" => "extent",
            "gdt_csum" => "uninit_bg",
            n => n,
        };
        let find = |t: &[features::Feature]| t.iter().find(|f| f.name == name).map(|f| f.bit);
        let (word, ok) = if let Some(b) = find(features::COMPAT_NAMES) {
            ((&mut self.compat, b), COMPAT_OK & b != 0)
        } else if let Some(b) = find(features::INCOMPAT_NAMES) {
            ((&mut self.incompat, b), INCOMPAT_OK & b != 0)
        } else if let Some(b) = find(features::RO_COMPAT_NAMES) {
            ((&mut self.ro_compat, b), RO_COMPAT_OK & b != 0)
        } else {
            return Err(MkfsError::invalid(format!("unknown filesystem feature \"{name}\"")));
        };
        if !clear {
            if let Some(row) = readers::feature(name) {
                if let Some(r) = readers.iter().find(|r| !r.supports(row)) {
                    return Err(MkfsError::invalid(format!(
                        "-O {name} cannot be given with --compat {r}: {} does not support it ({})",
                        r.describe(),
                        r.why_not(row)
                    )));
                }
            }
        }
        if clear {
            *word.0 &= !word.1;
        } else if !ok {
            return Err(MkfsError::Unsupported(format!(
                "making a filesystem with feature \"{name}\" is not supported"
            )));
        } else {
            *word.0 |= word.1;
        }
        Ok(())
    }

    /// Drop a compat feature the geometry cannot carry (`resize_inode` past
    /// 2^32 blocks, `has_journal` below 2048 blocks).
    pub(crate) fn clear_compat(&mut self, b: u32) {
        self.compat &= !b;
    }

    pub(crate) fn has_compat(&self, b: u32) -> bool {
        self.compat & b != 0
    }
    pub(crate) fn has_incompat(&self, b: u32) -> bool {
        self.incompat & b != 0
    }
    pub(crate) fn has_ro(&self, b: u32) -> bool {
        self.ro_compat & b != 0
    }

    /// `s_feature_compat`.
    pub(crate) fn compat(&self) -> u32 {
        self.compat
    }
    /// `s_feature_incompat`.
    pub(crate) fn incompat(&self) -> u32 {
        self.incompat
    }
    /// `s_feature_ro_compat`.
    pub(crate) fn ro_compat(&self) -> u32 {
        self.ro_compat
    }

    /// Feature names in dumpe2fs's order.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut v = features::names(self.compat, features::COMPAT_NAMES);
        v.extend(features::names(self.incompat, features::INCOMPAT_NAMES));
        v.extend(features::names(self.ro_compat, features::RO_COMPAT_NAMES));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_edits() {
        let mut f = Features::defaults(FsType::Ext4);
        f.edit("^has_journal", &[]).unwrap();
        assert!(!f.has_compat(compat::HAS_JOURNAL));
        assert!(f.edit("encrypt", &[]).is_err());
        assert!(f.edit("bogus", &[]).is_err());
        f.edit("none", &[]).unwrap();
        assert_eq!(f, Features::default());
    }

    fn with_readers(names: &[&str], edits: &[&str]) -> (Result<Features>, Vec<String>) {
        let opts = MkfsOptions {
            readers: names.iter().map(|n| Reader::parse(n).unwrap()).collect(),
            features: edits.iter().map(|s| s.to_string()).collect(),
            ..MkfsOptions::default()
        };
        let mut notes = Vec::new();
        (Features::from_options(&opts, &mut notes), notes)
    }

    #[test]
    fn readers_drop_defaults_they_do_not_support() {
        let (f, notes) = with_readers(&["u-boot"], &[]);
        let f = f.unwrap();
        assert!(!f.has_ro(ro_compat::METADATA_CSUM) && !f.has_compat(compat::DIR_INDEX));
        assert!(f.has_ro(ro_compat::GDT_CSUM), "uninit_bg takes metadata_csum's place");
        assert!(f.has_incompat(incompat::EXTENTS | incompat::BIT64));
        assert!(notes.iter().any(|n| n.contains("left out metadata_csum")), "{notes:?}");
        // GRUB 2.06 reads every default feature: nothing dropped.
        let (g, notes) = with_readers(&["grub"], &[]);
        assert_eq!(g.unwrap(), Features::defaults(FsType::Ext4));
        assert!(notes.is_empty());
        // Linux 3.2 predates metadata_csum (3.18): dropped; 2.6.28 has the rest.
        let (l, _) = with_readers(&["linux-3.2"], &[]);
        let l = l.unwrap();
        assert!(!l.has_ro(ro_compat::METADATA_CSUM) && l.has_ro(ro_compat::GDT_CSUM));
        // Several readers: the intersection.
        let (both, _) = with_readers(&["grub", "linux-2.6.28"], &[]);
        assert!(!both.unwrap().has_ro(ro_compat::METADATA_CSUM));
        // Every reader's image holds only what each reader supports.
        for r in readers::SURVEY {
            let (f, _) = with_readers(&[&r.name()], &[]);
            let f = f.unwrap();
            for row in readers::TABLE {
                let word = match row.word {
                    readers::Word::Compat => f.compat,
                    readers::Word::Incompat => f.incompat,
                    readers::Word::RoCompat => f.ro_compat,
                };
                assert!(word & row.bit == 0 || r.supports(row), "{r}: {}", row.name);
            }
        }
    }

    #[test]
    fn an_edit_a_reader_does_not_support_is_refused_naming_both() {
        let (f, _) = with_readers(&["grub"], &["metadata_csum_seed"]);
        let e = f.unwrap_err().to_string();
        assert!(
            e.contains("metadata_csum_seed") && e.contains("--compat grub") && e.contains("GRUB 2.06"),
            "{e}"
        );
        let (f, _) = with_readers(&["linux-5.10"], &["orphan_file"]);
        let e = f.unwrap_err().to_string();
        assert!(
            e.contains("orphan_file") && e.contains("linux-5.10") && e.contains("from 5.15"),
            "{e}"
        );
        // Clearing is always allowed; a supported edit goes through.
        let (f, _) = with_readers(&["u-boot"], &["^has_journal"]);
        assert!(!f.unwrap().has_compat(compat::HAS_JOURNAL));
        let (f, _) = with_readers(&["grub-2.12"], &["metadata_csum_seed"]);
        assert!(f.unwrap().has_incompat(incompat::CSUM_SEED));
    }
}
