//! The feature words (`s_feature_compat`, `s_feature_incompat`,
//! `s_feature_ro_compat`): the type's defaults from mke2fs.conf, the `-O`
//! edits on top, and the combinations mke2fs refuses or resolves.

use ext4kit_format::features::{self, compat, incompat, ro_compat};

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
    /// The features step: the type's defaults, each `-O` item in order,
    /// then the rules between features that mke2fs's `PRS()` applies:
    /// `metadata_csum` supersedes `uninit_bg` (gdt_csum) and clears it;
    /// `metadata_csum_seed` needs `metadata_csum`; `64bit` needs `extent`.
    pub(crate) fn from_options(opts: &MkfsOptions) -> Result<Self> {
        let mut f = Features::defaults(opts.fs_type);
        for item in opts.features.iter().flat_map(|s| s.split(',')) {
            f.edit(item)?;
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

    /// Apply one mke2fs `-O` item (comma lists are split by the caller),
    /// with e2p's aliases `extents` and `gdt_csum`. Clearing any known
    /// feature is allowed; setting one needs this crate to lay it out.
    pub(crate) fn edit(&mut self, item: &str) -> Result<()> {
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
        f.edit("^has_journal").unwrap();
        assert!(!f.has_compat(compat::HAS_JOURNAL));
        assert!(f.edit("encrypt").is_err());
        assert!(f.edit("bogus").is_err());
        f.edit("none").unwrap();
        assert_eq!(f, Features::default());
    }
}
