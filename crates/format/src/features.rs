//! Feature flags (`s_feature_compat`, `s_feature_incompat`,
//! `s_feature_ro_compat`) and the rule for opening an image that has features
//! we do not know.
//!
//! The ext4 rule: an unknown INCOMPAT feature means the on-disk format may be
//! unreadable, so refuse; an unknown RO_COMPAT feature means we could read but
//! a write might break an invariant we do not maintain, so open read-only; an
//! unknown COMPAT feature is safe to ignore.

/// One named feature bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feature {
    /// The name mke2fs and dumpe2fs print.
    pub name: &'static str,
    /// The bit in its word.
    pub bit: u32,
}

macro_rules! features {
    ($set:ident, $all:ident: $( $c:ident = $bit:expr, $n:expr; )*) => {
        #[allow(missing_docs)]
        pub mod $set {
            $( pub const $c: u32 = $bit; )*
        }
        /// Every bit of this word we can name.
        pub const $all: &[Feature] = &[ $( Feature { name: $n, bit: $bit }, )* ];
    };
}

features!(compat, COMPAT_NAMES:
    DIR_PREALLOC = 0x1, "dir_prealloc";
    IMAGIC_INODES = 0x2, "imagic_inodes";
    HAS_JOURNAL = 0x4, "has_journal";
    EXT_ATTR = 0x8, "ext_attr";
    RESIZE_INODE = 0x10, "resize_inode";
    DIR_INDEX = 0x20, "dir_index";
    LAZY_BG = 0x40, "lazy_bg";
    EXCLUDE_BITMAP = 0x100, "snapshot_bitmap";
    SPARSE_SUPER2 = 0x200, "sparse_super2";
    FAST_COMMIT = 0x400, "fast_commit";
    STABLE_INODES = 0x800, "stable_inodes";
    ORPHAN_FILE = 0x1000, "orphan_file";
);

features!(incompat, INCOMPAT_NAMES:
    COMPRESSION = 0x1, "compression";
    FILETYPE = 0x2, "filetype";
    RECOVER = 0x4, "needs_recovery";
    JOURNAL_DEV = 0x8, "journal_dev";
    META_BG = 0x10, "meta_bg";
    EXTENTS = 0x40, "extent";
    BIT64 = 0x80, "64bit";
    MMP = 0x100, "mmp";
    FLEX_BG = 0x200, "flex_bg";
    EA_INODE = 0x400, "ea_inode";
    DIRDATA = 0x1000, "dirdata";
    CSUM_SEED = 0x2000, "metadata_csum_seed";
    LARGEDIR = 0x4000, "large_dir";
    INLINE_DATA = 0x8000, "inline_data";
    ENCRYPT = 0x10000, "encrypt";
    CASEFOLD = 0x20000, "casefold";
);

features!(ro_compat, RO_COMPAT_NAMES:
    SPARSE_SUPER = 0x1, "sparse_super";
    LARGE_FILE = 0x2, "large_file";
    BTREE_DIR = 0x4, "btree_dir";
    HUGE_FILE = 0x8, "huge_file";
    GDT_CSUM = 0x10, "uninit_bg";
    DIR_NLINK = 0x20, "dir_nlink";
    EXTRA_ISIZE = 0x40, "extra_isize";
    HAS_SNAPSHOT = 0x80, "snapshot";
    QUOTA = 0x100, "quota";
    BIGALLOC = 0x200, "bigalloc";
    METADATA_CSUM = 0x400, "metadata_csum";
    REPLICA = 0x800, "replica";
    READONLY = 0x1000, "read-only";
    PROJECT = 0x2000, "project";
    SHARED_BLOCKS = 0x4000, "shared_blocks";
    VERITY = 0x8000, "verity";
    ORPHAN_PRESENT = 0x10000, "orphan_present";
);

/// INCOMPAT features the engine understands well enough to read.
pub const INCOMPAT_READ_SUPPORTED: u32 = incompat::FILETYPE
    | incompat::RECOVER
    | incompat::META_BG
    | incompat::EXTENTS
    | incompat::BIT64
    | incompat::MMP
    | incompat::FLEX_BG
    | incompat::CSUM_SEED
    | incompat::LARGEDIR
    | incompat::INLINE_DATA;

/// RO_COMPAT features the engine maintains correctly when writing.
pub const RO_COMPAT_WRITE_SUPPORTED: u32 = ro_compat::SPARSE_SUPER
    | ro_compat::LARGE_FILE
    | ro_compat::HUGE_FILE
    | ro_compat::GDT_CSUM
    | ro_compat::DIR_NLINK
    | ro_compat::EXTRA_ISIZE
    | ro_compat::METADATA_CSUM
    | ro_compat::ORPHAN_PRESENT;

/// Names of the set bits of a feature word; unknown bits print as `0xNN`.
pub fn names(word: u32, table: &[Feature]) -> Vec<String> {
    let mut out = Vec::new();
    for bit in 0..32 {
        let b = 1u32 << bit;
        if word & b == 0 {
            continue;
        }
        match table.iter().find(|f| f.bit == b) {
            Some(f) => out.push(f.name.to_string()),
            None => out.push(format!("FEATURE_{b:#x}")),
        }
    }
    out
}

/// How an image may be opened, given its feature words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenMode {
    /// Every feature is understood.
    ReadWrite,
    /// Readable, but these RO_COMPAT features are not maintained by us.
    ReadOnly(Vec<String>),
    /// These INCOMPAT features make the image unreadable to us.
    Refuse(Vec<String>),
}

/// Apply the compat / ro_compat / incompat rule.
pub fn open_mode(_compat: u32, incompat: u32, ro_compat: u32) -> OpenMode {
    let bad = incompat & !INCOMPAT_READ_SUPPORTED;
    if bad != 0 {
        return OpenMode::Refuse(names(bad, INCOMPAT_NAMES));
    }
    let ro = ro_compat & !RO_COMPAT_WRITE_SUPPORTED;
    if ro != 0 {
        return OpenMode::ReadOnly(names(ro, RO_COMPAT_NAMES));
    }
    OpenMode::ReadWrite
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_incompat_refuses_and_names_it() {
        match open_mode(0, incompat::FILETYPE | incompat::ENCRYPT | 0x8000_0000, 0) {
            OpenMode::Refuse(n) => {
                assert_eq!(n, vec!["encrypt".to_string(), "FEATURE_0x80000000".to_string()])
            }
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn unknown_ro_compat_is_read_only() {
        assert_eq!(
            open_mode(0, incompat::FILETYPE, ro_compat::BIGALLOC),
            OpenMode::ReadOnly(vec!["bigalloc".into()])
        );
        assert_eq!(open_mode(0xffff_ffff, incompat::FILETYPE, 0), OpenMode::ReadWrite);
    }
}
