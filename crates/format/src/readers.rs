//! Which readers open an image: boot loaders (U-Boot, GRUB), Android's
//! platform build, and Linux by version; which feature bits stop each one,
//! and how (refused, read-only, or ignored).
//!
//! A reader decides from the three feature words alone. The kernel's rule
//! (`ext4_feature_set_ok` in fs/ext4/super.c) is the ext4 one: an INCOMPAT
//! bit it does not know refuses the mount, an unknown RO_COMPAT bit allows
//! a read-only mount, an unknown COMPAT bit is ignored. The boot loaders
//! check less and differently: GRUB checks INCOMPAT only (it never writes),
//! U-Boot checks INCOMPAT to read and INCOMPAT plus RO_COMPAT to write.
//!
//! [`TABLE`] is the single statement of who supports what; each row says
//! where its facts come from, and README.md's "Readers" table is generated
//! from it ([`markdown_table`]; a test keeps the two equal). Sources:
//!
//! - **Linux**: the "KERNEL SUPPORT" section of e2fsprogs' ext4(5)
//!   (misc/ext4.5.in; 1.47.0 ships it up to `stable_inodes`, e2fsprogs
//!   master adds `fast_commit` 5.10 and `orphan_file` 5.15). Rows it does
//!   not list (`needs_recovery`, `orphan_present`, `read-only`, …) say why
//!   in their note.
//! - **GRUB**: grub-core/fs/ext2.c, `EXT2_DRIVER_SUPPORTED_INCOMPAT` and
//!   `EXT2_DRIVER_IGNORED_INCOMPAT`, checked in `grub_ext2_mount`; GRUB
//!   2.06 as released ignores `needs_recovery` and `mmp` only, 2.12 also
//!   `metadata_csum_seed` (commit 7fd5feff9, 2021) and `large_dir`
//!   (2e9fa73a0, 2022). Debian's 2.06-13 carries both backports (Debian
//!   bug #1030846), so it reads like 2.12 here.
//! - **U-Boot**: include/ext4fs.h `EXT4_FEATURE_INCOMPAT_SUPP`,
//!   `EXT4_FEATURE_INCOMPAT_SUPP_LAZY_RO` and `EXT4_FEATURE_RO_COMPAT_SUPP`,
//!   checked by `ext4fs_mount` (fs/ext4/ext4_common.c, reading: logs
//!   "fs uses incompatible features" and reads on, possibly wrongly) and
//!   `ext4fs_write` (fs/ext4/ext4_write.c: refuses to write), as of
//!   v2025.01 (commit faf73fb70da); `ext4fs_write` also refuses a
//!   directory with a hash-tree index (`EXT4_INDEX_FL`, since 2016), and
//!   since v2019.04 a `metadata_csum` filesystem (2e7365518ac).
//! - **Android**: the features AOSP's platform build gives every ext4
//!   image, system/extras ext4_utils/mke2fs.conf (`base_features` plus the
//!   `ext4` type: has_journal, extent, huge_file, dir_nlink, extra_isize;
//!   earlier releases also flex_bg and uninit_bg, and 64bit, now
//!   `auto_64-bit_support`). Everything a device has handled since those
//!   releases; not `metadata_csum`.

use crate::features::{compat, incompat, ro_compat, COMPAT_NAMES, INCOMPAT_NAMES, RO_COMPAT_NAMES};

/// Which superblock word a feature bit lives in; it decides what a reader
/// that does not know the bit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Word {
    /// `s_feature_compat`: safe to ignore.
    Compat,
    /// `s_feature_incompat`: the format changed; refuse to read.
    Incompat,
    /// `s_feature_ro_compat`: readable, but a write could break it.
    RoCompat,
}

impl Word {
    /// How dumpe2fs and the kernel's messages name the word.
    pub fn name(self) -> &'static str {
        match self {
            Word::Compat => "compat",
            Word::Incompat => "incompat",
            Word::RoCompat => "ro_compat",
        }
    }
}

/// A Linux kernel version, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinuxVersion(pub u16, pub u16, pub u16);

impl std::fmt::Display for LinuxVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.2 == 0 {
            write!(f, "{}.{}", self.0, self.1)
        } else {
            write!(f, "{}.{}.{}", self.0, self.1, self.2)
        }
    }
}

/// One feature and which readers support it: the row of the README table.
#[derive(Debug, Clone, Copy)]
pub struct Support {
    /// The name mke2fs and dumpe2fs use.
    pub name: &'static str,
    /// Its word.
    pub word: Word,
    /// Its bit in that word.
    pub bit: u32,
    /// The first Linux that supports it; `None`: no version does.
    pub linux: Option<LinuxVersion>,
    /// The first Linux that accepts the bit, when earlier than `linux`:
    /// the versions between mount it with known serious bugs (ext4(5)).
    pub linux_early: Option<LinuxVersion>,
    /// GRUB 2.06 as released reads it.
    pub grub: bool,
    /// GRUB 2.12 reads it.
    pub grub_2_12: bool,
    /// U-Boot reads it (`ext4fs_mount`).
    pub uboot_read: bool,
    /// U-Boot writes it (`ext4fs_write`).
    pub uboot_write: bool,
    /// Android's platform build makes it.
    pub android: bool,
    /// What the reader columns leave out.
    pub note: &'static str,
}

const fn v(a: u16, b: u16, c: u16) -> Option<LinuxVersion> {
    Some(LinuxVersion(a, b, c))
}

macro_rules! row {
    ($name:literal, $word:ident, $bit:expr, $linux:expr,
     grub $g:literal $g12:literal, uboot $ur:literal $uw:literal, android $a:literal, $note:literal) => {
        Support {
            name: $name,
            word: Word::$word,
            bit: $bit,
            linux: $linux,
            linux_early: None,
            grub: $g,
            grub_2_12: $g12,
            uboot_read: $ur,
            uboot_write: $uw,
            android: $a,
            note: $note,
        }
    };
}

/// Every feature ext4kit names, and who supports it. GRUB and U-Boot
/// reading never look at COMPAT or RO_COMPAT, so those rows say yes for
/// them: nothing there stops a read.
pub const TABLE: &[Support] = &[
    // s_feature_compat
    row!("dir_prealloc", Compat, compat::DIR_PREALLOC, None,
         grub true true, uboot true false, android false,
         "ext2's directory preallocation; no Linux ext4 uses it (ignored)"),
    row!("imagic_inodes", Compat, compat::IMAGIC_INODES, None,
         grub true true, uboot true false, android false,
         "AFS server inodes; ignored by Linux"),
    row!("has_journal", Compat, compat::HAS_JOURNAL, v(2, 4, 15),
         grub true true, uboot true true, android true,
         "ext3; GRUB does not replay the journal, U-Boot writes through it (ext4_journal.c)"),
    row!("ext_attr", Compat, compat::EXT_ATTR, v(2, 6, 0),
         grub true true, uboot true true, android true,
         "U-Boot neither reads nor writes xattrs"),
    row!("resize_inode", Compat, compat::RESIZE_INODE, v(2, 6, 10),
         grub true true, uboot true true, android true,
         "Linux 2.6.10 is online resizing"),
    row!("dir_index", Compat, compat::DIR_INDEX, v(2, 6, 0),
         grub true true, uboot true false, android true,
         "GRUB and U-Boot read indexed directories linearly; U-Boot will not write into one (ext4fs_write, EXT4_INDEX_FL)"),
    row!("lazy_bg", Compat, compat::LAZY_BG, None,
         grub true true, uboot true false, android false,
         "never merged into Linux (ignored)"),
    row!("snapshot_bitmap", Compat, compat::EXCLUDE_BITMAP, None,
         grub true true, uboot true false, android false,
         "next3 snapshots; never merged into Linux (ignored)"),
    row!("sparse_super2", Compat, compat::SPARSE_SUPER2, v(3, 16, 0),
         grub true true, uboot true false, android false,
         "older Linux ignores it (compat)"),
    row!("fast_commit", Compat, compat::FAST_COMMIT, v(5, 10, 0),
         grub true true, uboot true false, android false,
         "older Linux ignores it (compat) and never replays fast commits"),
    row!("stable_inodes", Compat, compat::STABLE_INODES, v(5, 5, 0),
         grub true true, uboot true false, android false,
         "older Linux ignores it (compat)"),
    row!("orphan_file", Compat, compat::ORPHAN_FILE, v(5, 15, 0),
         grub true true, uboot true false, android false,
         "older Linux ignores it (compat) but not orphan_present, which a used orphan file sets"),
    // s_feature_incompat
    row!("compression", Incompat, incompat::COMPRESSION, None,
         grub false false, uboot false false, android false,
         "out-of-tree ext2 compression; refused by every reader"),
    row!("filetype", Incompat, incompat::FILETYPE, v(2, 2, 0),
         grub true true, uboot true true, android true,
         ""),
    row!("needs_recovery", Incompat, incompat::RECOVER, v(2, 4, 15),
         grub true true, uboot true true, android true,
         "a state, not a choice: the journal holds transactions; Linux with has_journal (ext3); GRUB ignores it (EXT2_DRIVER_IGNORED_INCOMPAT)"),
    row!("journal_dev", Incompat, incompat::JOURNAL_DEV, None,
         grub false false, uboot false false, android false,
         "an external journal device, not a filesystem"),
    row!("meta_bg", Incompat, incompat::META_BG, v(2, 6, 28),
         grub true true, uboot false false, android false,
         ""),
    row!("extent", Incompat, incompat::EXTENTS, v(2, 6, 28),
         grub true true, uboot true true, android true,
         "Linux 2.6.28: ext4 no longer ext4dev"),
    row!("64bit", Incompat, incompat::BIT64, v(2, 6, 28),
         grub true true, uboot true true, android true,
         "U-Boot since v2017.01; Android: auto_64-bit_support (set when the size needs it)"),
    row!("mmp", Incompat, incompat::MMP, v(3, 0, 0),
         grub true true, uboot true false, android false,
         "GRUB and U-Boot reading ignore it (EXT2_DRIVER_IGNORED_INCOMPAT, EXT4_FEATURE_INCOMPAT_SUPP_LAZY_RO)"),
    row!("flex_bg", Incompat, incompat::FLEX_BG, v(2, 6, 28),
         grub true true, uboot true true, android true,
         "Android: in mke2fs.conf's ext4 type until Android 10"),
    row!("ea_inode", Incompat, incompat::EA_INODE, v(4, 13, 0),
         grub false false, uboot false false, android false,
         ""),
    row!("dirdata", Incompat, incompat::DIRDATA, None,
         grub false false, uboot false false, android false,
         "Lustre's; not in Linux"),
    row!("metadata_csum_seed", Incompat, incompat::CSUM_SEED, v(4, 4, 0),
         grub false true, uboot true false, android false,
         "GRUB 2.06 refuses it (Debian's 2.06-13 backports 2.12's rule); U-Boot reads without checking checksums"),
    row!("large_dir", Incompat, incompat::LARGEDIR, v(4, 13, 0),
         grub false true, uboot false false, android false,
         "GRUB 2.12 ignores it: it reads directories linearly"),
    row!("inline_data", Incompat, incompat::INLINE_DATA, v(3, 8, 0),
         grub false false, uboot false false, android false,
         ""),
    row!("encrypt", Incompat, incompat::ENCRYPT, v(4, 1, 0),
         grub true true, uboot true false, android false,
         "GRUB and U-Boot read the unencrypted files only"),
    row!("casefold", Incompat, incompat::CASEFOLD, v(5, 2, 0),
         grub false false, uboot false false, android false,
         ""),
    // s_feature_ro_compat
    row!("sparse_super", RoCompat, ro_compat::SPARSE_SUPER, v(2, 2, 0),
         grub true true, uboot true true, android true,
         ""),
    row!("large_file", RoCompat, ro_compat::LARGE_FILE, v(2, 2, 0),
         grub true true, uboot true true, android true,
         ""),
    row!("btree_dir", RoCompat, ro_compat::BTREE_DIR, v(2, 6, 28),
         grub true true, uboot true false, android false,
         "never used; Linux lists it as supported (EXT4_FEATURE_RO_COMPAT_SUPP)"),
    row!("huge_file", RoCompat, ro_compat::HUGE_FILE, v(2, 6, 28),
         grub true true, uboot true true, android true,
         ""),
    row!("uninit_bg", RoCompat, ro_compat::GDT_CSUM, v(2, 6, 28),
         grub true true, uboot true true, android true,
         "Android: in mke2fs.conf's ext4 type until Android 10"),
    row!("dir_nlink", RoCompat, ro_compat::DIR_NLINK, v(2, 6, 28),
         grub true true, uboot true true, android true,
         ""),
    row!("extra_isize", RoCompat, ro_compat::EXTRA_ISIZE, v(2, 6, 28),
         grub true true, uboot true true, android true,
         ""),
    row!("snapshot", RoCompat, ro_compat::HAS_SNAPSHOT, None,
         grub true true, uboot true false, android false,
         "next3 snapshots; Linux mounts read-only"),
    row!("quota", RoCompat, ro_compat::QUOTA, v(3, 6, 0),
         grub true true, uboot true false, android false,
         ""),
    row!("bigalloc", RoCompat, ro_compat::BIGALLOC, v(3, 2, 0),
         grub true true, uboot true false, android false,
         ""),
    Support {
        linux_early: v(3, 5, 0),
        ..row!("metadata_csum", RoCompat, ro_compat::METADATA_CSUM, v(3, 18, 0),
               grub true true, uboot true false, android false,
               "in Linux since 3.5, with serious bugs before 3.18 (ext4(5)); U-Boot refuses to write since v2019.04")
    },
    row!("replica", RoCompat, ro_compat::REPLICA, None,
         grub true true, uboot true false, android false,
         "Linux mounts read-only"),
    row!("read-only", RoCompat, ro_compat::READONLY, None,
         grub true true, uboot true false, android false,
         "asks every writer to stay away: Linux mounts read-only by design"),
    row!("project", RoCompat, ro_compat::PROJECT, v(4, 5, 0),
         grub true true, uboot true false, android false,
         ""),
    row!("shared_blocks", RoCompat, ro_compat::SHARED_BLOCKS, None,
         grub true true, uboot true false, android false,
         "e2fsdroid's block deduplication; Linux mounts read-only"),
    row!("verity", RoCompat, ro_compat::VERITY, v(5, 4, 0),
         grub true true, uboot true false, android false,
         ""),
    row!("orphan_present", RoCompat, ro_compat::ORPHAN_PRESENT, v(5, 15, 0),
         grub true true, uboot true false, android false,
         "set with orphan_file while the orphan file holds inodes"),
];

/// A program that will open the image: what `--compat READER` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reader {
    /// U-Boot reading (`ext4load`, `ext4ls`, `load`).
    UBootRead,
    /// U-Boot reading and writing (`ext4write`, `saveenv` to ext4).
    UBoot,
    /// GRUB 2.06 as released (Ubuntu 22.04, RHEL 9 and other 2.06s).
    Grub,
    /// GRUB 2.12 (and Debian 12's 2.06-13, which backports its rule).
    Grub212,
    /// Android's platform build and every device that mounts its images.
    Android,
    /// Linux's ext4 driver from this version on.
    Linux(LinuxVersion),
}

/// The readers `ext4kit info --compat` reports on, in its order: the boot
/// loaders, Android, and the long-term kernels distributions ship.
pub const SURVEY: &[Reader] = &[
    Reader::UBootRead,
    Reader::UBoot,
    Reader::Grub,
    Reader::Grub212,
    Reader::Android,
    Reader::Linux(LinuxVersion(3, 10, 0)),
    Reader::Linux(LinuxVersion(4, 4, 0)),
    Reader::Linux(LinuxVersion(4, 9, 0)),
    Reader::Linux(LinuxVersion(4, 14, 0)),
    Reader::Linux(LinuxVersion(4, 19, 0)),
    Reader::Linux(LinuxVersion(5, 4, 0)),
    Reader::Linux(LinuxVersion(5, 10, 0)),
    Reader::Linux(LinuxVersion(5, 15, 0)),
    Reader::Linux(LinuxVersion(6, 1, 0)),
];

/// The names [`Reader::parse`] takes, for help texts and errors.
pub const READER_NAMES: &str = "u-boot, u-boot-read, grub, grub-2.12, android, linux-X.Y (e.g. linux-4.19)";

/// What an unsupported feature does to one reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The reader will not open (or cannot reliably read) the image.
    Refuses,
    /// It reads the image but will not write it.
    ReadOnly,
    /// It opens and writes it, with a caveat the reason states (U-Boot
    /// will not write into an indexed directory; a kernel with known
    /// bugs in the feature; a feature Android's build does not make).
    Limited,
    /// It does not know the feature and goes on; the feature is not
    /// maintained by its writes.
    Ignored,
}

/// One feature that stands between a reader and the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Obstacle {
    /// The feature's name (`FEATURE_0x…` for a bit no table names).
    pub feature: String,
    /// Its word.
    pub word: Word,
    /// What it does to the reader.
    pub effect: Effect,
    /// Why, naming the reader's rule.
    pub why: String,
}

/// The feature words of a superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FeatureWords {
    /// `s_feature_compat`.
    pub compat: u32,
    /// `s_feature_incompat`.
    pub incompat: u32,
    /// `s_feature_ro_compat`.
    pub ro_compat: u32,
}

impl FeatureWords {
    /// The set features' names in dumpe2fs's order (compat, incompat,
    /// ro_compat); a bit no table names as `FEATURE_0x…`.
    pub fn names(&self) -> Vec<String> {
        let mut v = crate::features::names(self.compat, COMPAT_NAMES);
        v.extend(crate::features::names(self.incompat, INCOMPAT_NAMES));
        v.extend(crate::features::names(self.ro_compat, RO_COMPAT_NAMES));
        v
    }

    /// The feature words of a superblock's 1024 bytes. Only the length and
    /// the magic are checked: a reader decides from these words alone, so
    /// an image the engine would refuse for other reasons is still judged.
    pub fn from_superblock(buf: &[u8]) -> crate::Result<FeatureWords> {
        use crate::superblock::{Superblock, EXT4_MAGIC};
        if buf.len() < Superblock::SIZE {
            return Err(crate::error::corrupt("superblock", format!("only {} bytes", buf.len())));
        }
        let sb = Superblock::parse_raw(buf);
        if sb.magic != EXT4_MAGIC {
            return Err(crate::error::corrupt(
                "superblock",
                format!("bad magic {:#06x} (want 0xef53): not an ext2/3/4 filesystem", sb.magic),
            ));
        }
        Ok(FeatureWords {
            compat: sb.feature_compat,
            incompat: sb.feature_incompat,
            ro_compat: sb.feature_ro_compat,
        })
    }
}

/// How one reader fares with one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The reader.
    pub reader: Reader,
    /// Every feature it does not support, with its effect.
    pub obstacles: Vec<Obstacle>,
}

impl Verdict {
    /// The reader opens the image.
    pub fn opens(&self) -> bool {
        !self.obstacles.iter().any(|o| o.effect == Effect::Refuses)
    }

    /// The reader opens the image and may write it (for a reader that
    /// never writes, such as GRUB: it opens it).
    pub fn writable(&self) -> bool {
        self.opens() && !self.obstacles.iter().any(|o| o.effect == Effect::ReadOnly)
    }

    /// The features with this effect, by name.
    pub fn with(&self, effect: Effect) -> Vec<&str> {
        self.obstacles
            .iter()
            .filter(|o| o.effect == effect)
            .map(|o| o.feature.as_str())
            .collect()
    }
}

/// `--compat` named no known reader.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reader \"{given}\": {hint} (readers: {READER_NAMES})")]
pub struct UnknownReader {
    /// What was given.
    pub given: String,
    /// What was wrong with it.
    pub hint: &'static str,
}

impl Reader {
    /// Parse a reader's name: `u-boot`, `u-boot-read`, `grub` (2.06),
    /// `grub-2.06`, `grub-2.12`, `android`, or `linux-X.Y[.Z]`.
    pub fn parse(s: &str) -> Result<Reader, UnknownReader> {
        let err = |hint| UnknownReader {
            given: s.to_string(),
            hint,
        };
        let lower = s.trim().to_ascii_lowercase();
        Ok(match lower.as_str() {
            "u-boot" | "uboot" | "u-boot-write" => Reader::UBoot,
            "u-boot-read" | "uboot-read" => Reader::UBootRead,
            "grub" | "grub2" | "grub-2.06" => Reader::Grub,
            "grub-2.12" => Reader::Grub212,
            "android" => Reader::Android,
            "linux" => return Err(err("give the kernel's version")),
            l => {
                let ver = l
                    .strip_prefix("linux-")
                    .ok_or_else(|| err("not a reader ext4kit knows"))?;
                let parts: Vec<&str> = ver.split('.').collect();
                if !(2..=3).contains(&parts.len()) {
                    return Err(err("a kernel version is X.Y or X.Y.Z"));
                }
                let mut n = [0u16; 3];
                for (i, p) in parts.iter().enumerate() {
                    n[i] = p
                        .parse()
                        .map_err(|_| err("a kernel version is X.Y or X.Y.Z, in numbers"))?;
                }
                if n[0] < 2 || (n[0] == 2 && n[1] < 2) {
                    return Err(err("ext2's feature words begin with Linux 2.2"));
                }
                Reader::Linux(LinuxVersion(n[0], n[1], n[2]))
            }
        })
    }

    /// The name [`Reader::parse`] takes back.
    pub fn name(&self) -> String {
        match self {
            Reader::UBootRead => "u-boot-read".into(),
            Reader::UBoot => "u-boot".into(),
            Reader::Grub => "grub".into(),
            Reader::Grub212 => "grub-2.12".into(),
            Reader::Android => "android".into(),
            Reader::Linux(v) => format!("linux-{v}"),
        }
    }

    /// A phrase for messages: "U-Boot (writing)", "Linux 4.19".
    pub fn describe(&self) -> String {
        match self {
            Reader::UBootRead => "U-Boot (reading)".into(),
            Reader::UBoot => "U-Boot (writing)".into(),
            Reader::Grub => "GRUB 2.06".into(),
            Reader::Grub212 => "GRUB 2.12".into(),
            Reader::Android => "Android's platform build".into(),
            Reader::Linux(v) => format!("Linux {v}"),
        }
    }

    /// Whether this reader supports a feature: it reads it, and for a
    /// writer (U-Boot writing, Android, Linux) maintains it when writing.
    /// What `mkfs --compat` keeps.
    pub fn supports(&self, row: &Support) -> bool {
        match self {
            Reader::UBootRead => row.uboot_read,
            Reader::UBoot => row.uboot_write,
            Reader::Grub => row.grub,
            Reader::Grub212 => row.grub_2_12,
            Reader::Android => row.android,
            Reader::Linux(v) => row.linux.is_some_and(|since| since <= *v),
        }
    }

    /// What a feature of this word that the reader does not support does
    /// to it (the reader's rule, module docs).
    ///
    /// Android's column says what its build makes, not what a device's
    /// kernel refuses (that depends on the device): anything else is a
    /// caveat, [`Effect::Limited`].
    fn effect(&self, row: Option<&Support>, word: Word) -> Effect {
        match (self, word) {
            (Reader::Android, _) => Effect::Limited,
            (Reader::Linux(v), _) if row.and_then(|r| r.linux_early).is_some_and(|e| e <= *v) => Effect::Limited,
            (Reader::UBoot, Word::Incompat) if row.is_some_and(|r| r.uboot_read) => Effect::ReadOnly,
            (_, Word::Incompat) => Effect::Refuses,
            (Reader::UBoot, Word::RoCompat) => Effect::ReadOnly,
            (Reader::UBoot, Word::Compat) if row.is_some_and(|r| r.bit == compat::DIR_INDEX) => Effect::Limited,
            (Reader::Linux(_), Word::RoCompat) => Effect::ReadOnly,
            _ => Effect::Ignored,
        }
    }

    /// Why this reader lacks a feature, in a sentence naming its rule.
    pub fn why_not(&self, row: &Support) -> String {
        let word = row.word.name();
        match self {
            Reader::Linux(v) => match row.linux {
                Some(since) if row.linux_early.is_some_and(|e| e <= *v) => format!(
                    "Linux {v} mounts {} but it had known serious bugs until {since} (ext4(5))",
                    row.name
                ),
                Some(since) => format!("Linux supports {} from {since}; {v} is older", row.name),
                None => format!("no Linux version supports {}", row.name),
            },
            Reader::Grub | Reader::Grub212 => format!(
                "{}'s ext2 driver refuses incompat features outside EXT2_DRIVER_SUPPORTED_INCOMPAT and \
                 EXT2_DRIVER_IGNORED_INCOMPAT (grub-core/fs/ext2.c)",
                self.describe()
            ),
            Reader::UBootRead => "U-Boot reads only the incompat features of EXT4_FEATURE_INCOMPAT_SUPP and \
                                  _SUPP_LAZY_RO (include/ext4fs.h); with others it may read wrong data"
                .into(),
            Reader::UBoot if row.bit == compat::DIR_INDEX && row.word == Word::Compat => {
                "U-Boot's ext4fs_write refuses to write into a directory with a hash-tree index".into()
            }
            Reader::UBoot if row.bit == ro_compat::METADATA_CSUM && row.word == Word::RoCompat => {
                "U-Boot does not compute metadata checksums, so ext4fs_write refuses a metadata_csum \
                 filesystem (fs/ext4/ext4_write.c)"
                    .into()
            }
            Reader::UBoot => format!(
                "U-Boot's ext4fs_write refuses {word} features outside EXT4_FEATURE_{}_SUPP (include/ext4fs.h)",
                if row.word == Word::RoCompat {
                    "RO_COMPAT"
                } else {
                    "INCOMPAT"
                }
            ),
            Reader::Android => format!(
                "Android's platform build does not make {} (system/extras ext4_utils/mke2fs.conf)",
                row.name
            ),
        }
    }

    /// How this reader fares with an image of these feature words.
    pub fn check(&self, f: FeatureWords) -> Verdict {
        let mut obstacles = Vec::new();
        for (word, bits) in [
            (Word::Compat, f.compat),
            (Word::Incompat, f.incompat),
            (Word::RoCompat, f.ro_compat),
        ] {
            for i in 0..32 {
                let bit = 1u32 << i;
                if bits & bit == 0 {
                    continue;
                }
                let row = TABLE.iter().find(|r| r.word == word && r.bit == bit);
                let (feature, why) = match row {
                    Some(r) if self.supports(r) => continue,
                    Some(r) => (r.name.to_string(), self.why_not(r)),
                    None => (
                        format!("FEATURE_{bit:#x}"),
                        format!("an {} bit no reader in ext4kit's table knows", word.name()),
                    ),
                };
                obstacles.push(Obstacle {
                    feature,
                    word,
                    effect: self.effect(row, word),
                    why,
                });
            }
        }
        Verdict {
            reader: *self,
            obstacles,
        }
    }
}

impl std::fmt::Display for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// The row of a feature named as mke2fs's `-O` names it.
pub fn feature(name: &str) -> Option<&'static Support> {
    TABLE.iter().find(|r| r.name == name)
}

/// The README's "Readers" table, generated from [`TABLE`] so the two
/// cannot disagree.
pub fn markdown_table() -> String {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut s = String::from(
        "| feature | word | Linux | GRUB 2.06 | GRUB 2.12 | U-Boot read | U-Boot write | Android build | note |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for r in TABLE {
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            r.word.name(),
            r.linux.map_or("never".to_string(), |v| v.to_string()),
            yes(r.grub),
            yes(r.grub_2_12),
            yes(r.uboot_read),
            yes(r.uboot_write),
            yes(r.android),
            r.note
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_reader_and_refuses_the_rest() {
        assert_eq!(Reader::parse("u-boot"), Ok(Reader::UBoot));
        assert_eq!(Reader::parse("U-Boot-read"), Ok(Reader::UBootRead));
        assert_eq!(Reader::parse("grub"), Ok(Reader::Grub));
        assert_eq!(Reader::parse("grub-2.12"), Ok(Reader::Grub212));
        assert_eq!(Reader::parse("android"), Ok(Reader::Android));
        assert_eq!(Reader::parse("linux-4.19"), Ok(Reader::Linux(LinuxVersion(4, 19, 0))));
        assert_eq!(Reader::parse("linux-2.6.28"), Ok(Reader::Linux(LinuxVersion(2, 6, 28))));
        for bad in [
            "linux",
            "linux-4",
            "linux-4.x",
            "linux-1.2",
            "windows",
            "",
            "linux-4.19.1.2",
        ] {
            let e = Reader::parse(bad).unwrap_err();
            assert!(e.to_string().contains("linux-X.Y"), "{bad}: {e}");
        }
        for r in SURVEY {
            assert_eq!(Reader::parse(&r.name()).as_ref(), Ok(r));
        }
    }

    #[test]
    fn the_table_names_every_feature_bit_once_as_the_format_does() {
        for (word, names) in [
            (Word::Compat, COMPAT_NAMES),
            (Word::Incompat, INCOMPAT_NAMES),
            (Word::RoCompat, RO_COMPAT_NAMES),
        ] {
            for f in names {
                let rows: Vec<_> = TABLE.iter().filter(|r| r.word == word && r.bit == f.bit).collect();
                assert_eq!(rows.len(), 1, "{} ({})", f.name, word.name());
                assert_eq!(rows[0].name, f.name);
            }
            assert_eq!(TABLE.iter().filter(|r| r.word == word).count(), names.len());
        }
    }

    #[test]
    fn the_readers_rules_hold_in_the_table() {
        for r in TABLE {
            // GRUB and U-Boot reading check INCOMPAT only.
            if r.word != Word::Incompat {
                assert!(r.grub && r.grub_2_12 && r.uboot_read, "{}", r.name);
            }
            // GRUB 2.12 reads all 2.06 does; U-Boot writes only what it reads.
            assert!(!r.grub || r.grub_2_12, "{}", r.name);
            assert!(!r.uboot_write || r.uboot_read, "{}", r.name);
            // Android's build makes nothing Linux 3.10 lacks.
            assert!(
                !r.android || Reader::Linux(LinuxVersion(3, 10, 0)).supports(r),
                "{}",
                r.name
            );
        }
    }

    #[test]
    fn kernel_versions_match_the_sources() {
        let since = |n: &str| feature(n).unwrap().linux;
        assert_eq!(since("extent"), v(2, 6, 28));
        assert_eq!(since("metadata_csum"), v(3, 18, 0));
        assert_eq!(since("inline_data"), v(3, 8, 0));
        assert_eq!(since("encrypt"), v(4, 1, 0));
        assert_eq!(since("metadata_csum_seed"), v(4, 4, 0));
        assert_eq!(since("large_dir"), v(4, 13, 0));
        assert_eq!(since("ea_inode"), v(4, 13, 0));
        assert_eq!(since("casefold"), v(5, 2, 0));
        assert_eq!(since("verity"), v(5, 4, 0));
        assert_eq!(since("stable_inodes"), v(5, 5, 0));
        assert_eq!(since("fast_commit"), v(5, 10, 0));
        assert_eq!(since("orphan_file"), v(5, 15, 0));
    }

    /// mke2fs 1.47's ext4 defaults plus orphan_file and metadata_csum_seed.
    fn modern() -> FeatureWords {
        FeatureWords {
            compat: compat::HAS_JOURNAL
                | compat::EXT_ATTR
                | compat::RESIZE_INODE
                | compat::DIR_INDEX
                | compat::ORPHAN_FILE,
            incompat: incompat::FILETYPE
                | incompat::EXTENTS
                | incompat::BIT64
                | incompat::FLEX_BG
                | incompat::CSUM_SEED,
            ro_compat: ro_compat::SPARSE_SUPER
                | ro_compat::LARGE_FILE
                | ro_compat::HUGE_FILE
                | ro_compat::DIR_NLINK
                | ro_compat::EXTRA_ISIZE
                | ro_compat::METADATA_CSUM,
        }
    }

    #[test]
    fn verdicts_follow_each_readers_rule() {
        let f = modern();
        let grub = Reader::Grub.check(f);
        assert!(!grub.opens());
        assert_eq!(grub.with(Effect::Refuses), vec!["metadata_csum_seed"]);
        assert!(Reader::Grub212.check(f).opens());

        let ub = Reader::UBoot.check(f);
        assert!(ub.opens() && !ub.writable());
        assert_eq!(ub.with(Effect::ReadOnly), vec!["metadata_csum_seed", "metadata_csum"]);
        assert_eq!(ub.with(Effect::Limited), vec!["dir_index"]);
        assert!(Reader::UBootRead.check(f).writable());

        let early = Reader::Linux(LinuxVersion(3, 10, 0)).check(f);
        assert_eq!(early.with(Effect::Limited), vec!["metadata_csum"]);
        assert_eq!(
            Reader::Linux(LinuxVersion(3, 4, 0)).check(f).with(Effect::ReadOnly),
            vec!["metadata_csum"]
        );
        let android = Reader::Android.check(f);
        assert!(android.writable());
        assert_eq!(
            android.with(Effect::Limited),
            vec!["orphan_file", "metadata_csum_seed", "metadata_csum"]
        );

        let old = Reader::Linux(LinuxVersion(4, 1, 0)).check(f);
        assert_eq!(old.with(Effect::Refuses), vec!["metadata_csum_seed"]);
        assert_eq!(old.with(Effect::Ignored), vec!["orphan_file"]);
        let l510 = Reader::Linux(LinuxVersion(5, 10, 0)).check(f);
        assert!(l510.writable());
        assert_eq!(l510.with(Effect::Ignored), vec!["orphan_file"]);
        assert!(Reader::Linux(LinuxVersion(5, 15, 0)).check(f).obstacles.is_empty());

        // An ro_compat feature the kernel lacks: read-only, as ext4_feature_set_ok.
        let verity = FeatureWords {
            ro_compat: ro_compat::VERITY,
            ..FeatureWords::default()
        };
        let v = Reader::Linux(LinuxVersion(4, 19, 0)).check(verity);
        assert!(v.opens() && !v.writable());
        // A bit nobody names: refused by the kernel, named by its value.
        let unknown = FeatureWords {
            incompat: 0x8000_0000,
            ..FeatureWords::default()
        };
        let u = Reader::Linux(LinuxVersion(6, 1, 0)).check(unknown);
        assert_eq!(u.with(Effect::Refuses), vec!["FEATURE_0x80000000"]);
    }

    #[test]
    fn feature_words_come_from_the_superblock_fields() {
        let mut sb = vec![0u8; 1024];
        sb[0x38..0x3A].copy_from_slice(&0xEF53u16.to_le_bytes());
        sb[0x5C..0x60].copy_from_slice(&compat::ORPHAN_FILE.to_le_bytes());
        sb[0x60..0x64].copy_from_slice(&incompat::CASEFOLD.to_le_bytes());
        sb[0x64..0x68].copy_from_slice(&ro_compat::VERITY.to_le_bytes());
        let f = FeatureWords::from_superblock(&sb).unwrap();
        assert_eq!(
            f,
            FeatureWords {
                compat: compat::ORPHAN_FILE,
                incompat: incompat::CASEFOLD,
                ro_compat: ro_compat::VERITY
            }
        );
        sb[0x38] = 0;
        assert!(FeatureWords::from_superblock(&sb)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        assert!(FeatureWords::from_superblock(&sb[..100]).is_err());
    }

    #[test]
    fn the_markdown_table_has_a_row_per_feature() {
        let t = markdown_table();
        assert_eq!(t.lines().count(), TABLE.len() + 2);
        assert!(t.contains("| orphan_file | compat | 5.15 | yes | yes | yes | no | no |"));
    }
}
