//! A journal as recovery sees it (the kernel's `journal_t` after
//! `jbd2_journal_load`): where its blocks are, its superblock, and the
//! geometry of the log and the fast-commit area.
//!
//! Loading applies e2fsck's rules (`e2fsck_journal_load`, the same checks
//! as the kernel's `journal_load_superblock`), in its order, because the
//! outcome of a bad journal superblock must be e2fsck's outcome: what is
//! corrupt, what is merely unsupported, and what is quietly cleared.

use std::io;
use std::sync::Arc;

use ext4kit_blockdev::BlockDevice;
use ext4kit_format::jbd2::{features, BlockType, JournalSuperblock, TagFormat, CHECKSUM_CRC32C, JBD2_MAGIC};

/// `JBD2_MIN_JOURNAL_BLOCKS`.
pub const MIN_JOURNAL_BLOCKS: u32 = 1024;
/// `JBD2_DEFAULT_FAST_COMMIT_BLOCKS`: the fast-commit area when
/// `s_num_fc_blks` is 0.
pub const DEFAULT_FAST_COMMIT_BLOCKS: u32 = 256;
/// `V1_SB_SIZE`: the bytes of a version-1 superblock; e2fsck zeroes what
/// follows when a v2 field makes no sense (`clear_v2_journal_fields`).
const V1_SB_SIZE: usize = 0x24;

/// Where the journal's blocks are on the device: its logical blocks in
/// runs, as the journal inode's block map (or an external device) gives
/// them (`jbd2_journal_bmap`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JournalMap {
    /// `(first logical block, first physical block, length)`, sorted,
    /// not overlapping.
    runs: Vec<(u64, u64, u64)>,
}

impl JournalMap {
    /// A map from `(logical, physical, len)` runs in any order; overlapping
    /// runs are an error (a corrupt journal inode).
    pub fn new(mut runs: Vec<(u64, u64, u64)>) -> Result<Self, String> {
        runs.retain(|r| r.2 > 0);
        runs.sort_unstable();
        for w in runs.windows(2) {
            if w[0].0 + w[0].2 > w[1].0 {
                return Err(format!(
                    "journal blocks {}..{} are mapped twice",
                    w[1].0,
                    w[0].0 + w[0].2
                ));
            }
        }
        Ok(JournalMap { runs })
    }

    /// A journal occupying `len` contiguous blocks from `start` (an
    /// external journal device, or a test).
    pub fn contiguous(start: u64, len: u64) -> Self {
        JournalMap {
            runs: vec![(0, start, len)],
        }
    }

    /// The physical block of journal block `lblk`, if mapped.
    pub fn physical(&self, lblk: u64) -> Option<u64> {
        let i = self.runs.partition_point(|r| r.0 + r.2 <= lblk);
        let &(l, p, n) = self.runs.get(i)?;
        (lblk >= l && lblk < l + n).then(|| p + (lblk - l))
    }

    /// How many journal blocks are mapped from block 0 without a hole:
    /// e2fsck requires every block up to the inode's size to be mapped.
    pub fn mapped_prefix(&self) -> u64 {
        let mut end = 0;
        for &(l, _, n) in &self.runs {
            if l != end {
                break;
            }
            end = l + n;
        }
        end
    }

    /// The runs, for listings.
    pub fn runs(&self) -> &[(u64, u64, u64)] {
        &self.runs
    }
}

/// Why a journal could not be loaded. The kinds follow e2fsck, which
/// treats them differently: a journal it cannot find or read is an error;
/// a corrupt or unsupported superblock is reset (its contents discarded)
/// under `-y`.
#[derive(Debug)]
pub enum LoadError {
    /// The superblock is not a journal superblock, or breaks a rule
    /// (`EXT2_ET_CORRUPT_JOURNAL_SB`, or a bad journal inode).
    Corrupt(String),
    /// A version or feature this code (and e2fsprogs 1.47) does not know
    /// (`EXT2_ET_JOURNAL_UNSUPP_VERSION`, `EXT2_ET_UNSUPP_FEATURE`,
    /// `EXT2_ET_RO_UNSUPP_FEATURE`, several filesystems sharing a log).
    Unsupported(String),
    /// The device could not be read.
    Io(io::Error),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Corrupt(s) => write!(f, "the journal superblock is corrupt: {s}"),
            LoadError::Unsupported(s) => write!(f, "the journal is of a kind ext4kit cannot replay: {s}"),
            LoadError::Io(e) => write!(f, "reading the journal: {e}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// A loaded journal: ready for recovery or for listing.
pub struct Journal {
    dev: Arc<dyn BlockDevice>,
    map: JournalMap,
    /// Bytes per journal block (the filesystem's block size).
    pub block_size: usize,
    /// The superblock as loaded (v2 fields cleared where e2fsck clears
    /// them).
    pub sb: JournalSuperblock,
    /// `j_total_len`: blocks of the journal (the smaller of `s_maxlen` and
    /// what the journal inode holds).
    pub total_len: u32,
    /// `j_first`: first block of the log.
    pub first: u32,
    /// `j_last`: one past the last block of the main log.
    pub last: u32,
    /// `j_fc_first`, `j_fc_last`: the fast-commit area (both 0 without the
    /// feature). As in jbd2, `fc_first` is `last + 1` and `fc_last` is
    /// `s_maxlen`.
    pub fc_first: u32,
    /// See `fc_first`.
    pub fc_last: u32,
    /// Tag layout of descriptor blocks.
    pub fmt: TagFormat,
    /// `j_csum_seed` when checksum v2/v3 is on.
    pub seed: Option<u32>,
    /// Things e2fsck would have said while loading (cleared fields).
    pub notes: Vec<String>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("block_size", &self.block_size)
            .field("total_len", &self.total_len)
            .field("first", &self.first)
            .field("last", &self.last)
            .field("fc_first", &self.fc_first)
            .field("fc_last", &self.fc_last)
            .field("fmt", &self.fmt)
            .finish()
    }
}

impl Journal {
    /// Load the journal whose blocks `map` places on `dev`, for a
    /// filesystem of `block_size`-byte blocks, whose inode (or device)
    /// holds `total_len` blocks. `internal` says whether it is an inode
    /// journal (several users are tolerated only when it is not).
    pub fn load(
        dev: Arc<dyn BlockDevice>,
        map: JournalMap,
        block_size: usize,
        total_len: u32,
        internal: bool,
    ) -> Result<Journal, LoadError> {
        let mut j = Journal {
            dev,
            map,
            block_size,
            sb: JournalSuperblock::parse_raw(&[0u8; 1024]),
            total_len,
            first: 0,
            last: 0,
            fc_first: 0,
            fc_last: 0,
            fmt: TagFormat::default(),
            seed: None,
            notes: Vec::new(),
        };
        if total_len == 0 {
            return Err(LoadError::Corrupt("the journal has no blocks".into()));
        }
        let mut raw = vec![0u8; block_size];
        j.read_block(0, &mut raw).map_err(LoadError::Io)?;
        let raw = &mut raw[..JournalSuperblock::SIZE.min(block_size)];
        let sb = JournalSuperblock::parse_raw(raw);
        if sb.h_magic != JBD2_MAGIC {
            return Err(LoadError::Corrupt(format!(
                "bad magic {:#010x} in journal block 0 (not a journal)",
                sb.h_magic
            )));
        }
        let v2 = match BlockType::from_u32(sb.h_blocktype) {
            Some(BlockType::SuperblockV1) => {
                if sb.feature_compat != 0 || sb.feature_incompat != 0 || sb.feature_ro_compat != 0 || sb.nr_users != 0 {
                    raw[V1_SB_SIZE..].fill(0);
                    j.notes
                        .push("a version 1 journal superblock had version 2 fields set; they were ignored".into());
                }
                false
            }
            Some(BlockType::SuperblockV2) => {
                if sb.nr_users > 1 && internal {
                    raw[V1_SB_SIZE..].fill(0);
                    j.notes.push(format!(
                        "an internal journal claimed {} users; its version 2 fields were ignored",
                        sb.nr_users
                    ));
                }
                true
            }
            Some(BlockType::Descriptor | BlockType::Commit | BlockType::Revoke) => {
                return Err(LoadError::Corrupt(format!(
                    "journal block 0 is a log block (type {}), not a superblock",
                    sb.h_blocktype
                )))
            }
            None => {
                return Err(LoadError::Unsupported(format!(
                    "journal superblock version {} is unknown",
                    sb.h_blocktype
                )))
            }
        };
        let sb = JournalSuperblock::parse_raw(raw);
        if v2 && sb.nr_users > 1 {
            return Err(LoadError::Unsupported(format!(
                "{} filesystems share this journal",
                sb.nr_users
            )));
        }
        let unknown = sb.feature_incompat & !features::INCOMPAT_KNOWN;
        if unknown != 0 {
            return Err(LoadError::Unsupported(format!(
                "unknown incompatible journal feature(s) {unknown:#x}"
            )));
        }
        if sb.feature_ro_compat != 0 {
            return Err(LoadError::Unsupported(format!(
                "unknown read-only-compatible journal feature(s) {:#x}",
                sb.feature_ro_compat
            )));
        }
        let v2csum = sb.has_incompat(features::INCOMPAT_CSUM_V2);
        let v3csum = sb.has_incompat(features::INCOMPAT_CSUM_V3);
        if v2csum && v3csum {
            return Err(LoadError::Corrupt("both checksum v2 and v3 are set".into()));
        }
        if (v2csum || v3csum) && sb.feature_compat & features::COMPAT_CHECKSUM != 0 {
            return Err(LoadError::Corrupt("checksum v1 is combined with v2/v3".into()));
        }
        if v2csum || v3csum {
            if sb.checksum_type != CHECKSUM_CRC32C {
                return Err(LoadError::Corrupt(format!(
                    "checksum type {} (checksum v2/v3 needs crc32c, 4)",
                    sb.checksum_type
                )));
            }
            let computed = JournalSuperblock::compute_checksum(raw);
            if computed != sb.checksum {
                return Err(LoadError::Corrupt(format!(
                    "superblock checksum {:#010x} does not match its contents ({computed:#010x})",
                    sb.checksum
                )));
            }
            j.seed = Some(sb.csum_seed());
        }
        if sb.blocksize as usize != block_size {
            return Err(LoadError::Corrupt(format!(
                "journal block size {} differs from the filesystem's {block_size}",
                sb.blocksize
            )));
        }
        if sb.maxlen < j.total_len {
            j.total_len = sb.maxlen;
        } else if sb.maxlen > j.total_len {
            return Err(LoadError::Corrupt(format!(
                "the superblock claims {} blocks but the journal holds {} (journal too short)",
                sb.maxlen, j.total_len
            )));
        }
        j.first = sb.first;
        if sb.has_incompat(features::INCOMPAT_FAST_COMMIT) {
            let fc = if sb.num_fc_blks != 0 {
                sb.num_fc_blks
            } else {
                DEFAULT_FAST_COMMIT_BLOCKS
            };
            if sb.maxlen.checked_sub(fc).is_none_or(|n| n < MIN_JOURNAL_BLOCKS) {
                return Err(LoadError::Corrupt(format!(
                    "{fc} fast-commit blocks leave fewer than {MIN_JOURNAL_BLOCKS} for the log"
                )));
            }
            j.fc_last = sb.maxlen;
            j.last = sb.maxlen - fc;
            j.fc_first = j.last + 1;
        } else {
            j.last = sb.maxlen;
        }
        // Not e2fsck rules but conditions under which its log walk would
        // read garbage or loop: refused as corrupt, with the numbers.
        if j.first == 0 || j.first >= j.last {
            return Err(LoadError::Corrupt(format!(
                "first log block {} is outside a {}-block log",
                j.first, j.last
            )));
        }
        j.fmt = if v2 { sb.tag_format() } else { TagFormat::default() };
        j.sb = sb;
        Ok(j)
    }

    /// Read journal block `lblk` into `buf` (`jread`): an error past the
    /// journal's end or on a hole in its map.
    pub fn read_block(&self, lblk: u32, buf: &mut [u8]) -> io::Result<()> {
        if lblk >= self.total_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "journal block {lblk} is past the journal's end ({} blocks)",
                    self.total_len
                ),
            ));
        }
        let phys = self.map.physical(lblk as u64).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("journal block {lblk} is not mapped (a hole in the journal inode)"),
            )
        })?;
        self.dev.read_at(phys * self.block_size as u64, buf)
    }

    /// The byte offset on the device of journal block `lblk` (for replay
    /// into an overlay, which reads the logged copy from there later).
    pub fn device_offset(&self, lblk: u32) -> Option<u64> {
        if lblk >= self.total_len {
            return None;
        }
        self.map.physical(lblk as u64).map(|p| p * self.block_size as u64)
    }

    /// `jbd2_has_feature_checksum`: checksum v1 (a crc32 of the whole
    /// transaction in the commit block).
    pub fn v1_checksum(&self) -> bool {
        self.sb.h_blocktype == BlockType::SuperblockV2 as u32 && self.sb.feature_compat & features::COMPAT_CHECKSUM != 0
    }

    /// `jbd2_has_feature_async_commit`.
    pub fn async_commit(&self) -> bool {
        self.sb.has_incompat(features::INCOMPAT_ASYNC_COMMIT)
    }

    /// `jbd2_has_feature_fast_commit`.
    pub fn fast_commit(&self) -> bool {
        self.fc_last != 0
    }

    /// Advance a log position past the end of the log (`wrap`). As in
    /// e2fsprogs 1.47's recovery.c, a journal with fast commits wraps at
    /// the end of the fast-commit area (`j_fc_last`), not of the main log.
    pub fn wrap(&self, pos: u32) -> u32 {
        let end = if self.fast_commit() { self.fc_last } else { self.last };
        if pos >= end {
            pos - (end - self.first)
        } else {
            pos
        }
    }

    /// The journal superblock to write after recovery: the log is empty
    /// (`s_start = 0`), the next transaction is `next_sequence`, and
    /// `s_errno` is `errno` (e2fsck's `e2fsck_journal_release` with
    /// `reset`), with its checksum refreshed.
    pub fn reset_superblock(&self, next_sequence: u32, errno: i32) -> Vec<u8> {
        let mut sb = self.sb;
        sb.sequence = next_sequence;
        sb.start = 0;
        sb.errno = errno as u32;
        sb.to_bytes_with_checksum()
    }

    /// The block device the journal is read from.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_lookups_and_holes() {
        let m = JournalMap::new(vec![(10, 500, 5), (0, 100, 10)]).unwrap();
        assert_eq!(m.physical(0), Some(100));
        assert_eq!(m.physical(9), Some(109));
        assert_eq!(m.physical(10), Some(500));
        assert_eq!(m.physical(14), Some(504));
        assert_eq!(m.physical(15), None);
        assert_eq!(m.mapped_prefix(), 15);
        assert!(JournalMap::new(vec![(0, 1, 10), (5, 100, 2)]).is_err());
        let gap = JournalMap::new(vec![(0, 1, 10), (11, 100, 2)]).unwrap();
        assert_eq!(gap.mapped_prefix(), 10);
    }
}
