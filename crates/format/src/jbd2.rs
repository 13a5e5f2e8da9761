//! The jbd2 journal: its superblock, descriptor blocks and their block tags,
//! commit blocks, revoke blocks, and the crc32c checksums that protect them.
//!
//! Unlike everything else in ext4, the journal is **big-endian** on disk.
//! Every journal block that is not a logged copy of a filesystem block starts
//! with a 12-byte header `{h_magic = 0xC03B3998, h_blocktype, h_sequence}`.
//! Block 0 of the journal (`s_first - 1` in practice) holds the 1024-byte
//! superblock; the log proper is the circular area `s_first .. s_maxlen`.
//! A transaction is one or more descriptor blocks (each a list of tags naming
//! the filesystem blocks whose copies follow it), optional revoke blocks, and
//! a commit block carrying the same sequence number.
//!
//! Checksums (`CSUM_V2` / `CSUM_V3`) are kernel-style raw crc32c:
//! - superblock: `crc32c(~0, sb)` over the 1024 bytes with `s_checksum` zero;
//! - everything else chains from `seed = crc32c(~0, s_uuid)`:
//!   descriptor and revoke blocks end in a 4-byte tail holding
//!   `crc32c(seed, block)` computed with the tail zero; the commit block
//!   stores `crc32c(seed, block)` in `h_chksum[0]` (computed with that word
//!   zero); each tag holds `crc32c(crc32c(seed, be32 sequence), data)` of the
//!   logged block (all 32 bits with v3, the low 16 with v2).
//!
//! Each structure round-trips bit-exactly: every byte, padding included, is a
//! field.

use crate::checksum::crc32c;
use crate::error::{corrupt, FormatError, Result};

/// `h_magic` of every journal metadata block.
pub const JBD2_MAGIC: u32 = 0xC03B_3998;
/// Size of the journal superblock structure (it occupies a whole block).
pub const SUPERBLOCK_SIZE: usize = 1024;
/// `s_checksum_type` / `h_chksum_type` value for crc32 (checksum v1).
pub const CHECKSUM_CRC32: u8 = 1;
/// `h_chksum_type` value for md5 (checksum v1, never written by Linux).
pub const CHECKSUM_MD5: u8 = 2;
/// `h_chksum_type` value for sha1 (checksum v1, never written by Linux).
pub const CHECKSUM_SHA1: u8 = 3;
/// `s_checksum_type` value for crc32c (checksum v2 / v3).
pub const CHECKSUM_CRC32C: u8 = 4;
/// Bytes in `h_chksum` (`JBD2_CHECKSUM_BYTES` 32-bit words).
pub const CHECKSUM_WORDS: usize = 8;
/// Size of the checksum tail of descriptor and revoke blocks.
pub const BLOCK_TAIL_SIZE: usize = 4;
/// The smallest journal the kernel accepts (`JBD2_MIN_JOURNAL_BLOCKS`).
pub const MIN_JOURNAL_BLOCKS: u32 = 1024;

/// `h_blocktype`: what a journal metadata block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockType {
    /// A descriptor block: tags for the logged blocks that follow.
    Descriptor = 1,
    /// The commit block that closes a transaction.
    Commit = 2,
    /// A version-1 superblock (fields up to `s_errno` only).
    SuperblockV1 = 3,
    /// A version-2 superblock (features, uuid, users, checksum).
    SuperblockV2 = 4,
    /// A revoke block: filesystem blocks whose earlier copies must not be replayed.
    Revoke = 5,
}

impl BlockType {
    /// Decode `h_blocktype`; `None` for a value no jbd2 version writes
    /// (fast-commit blocks, 6, live outside the main log and are not handled here).
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Descriptor,
            2 => Self::Commit,
            3 => Self::SuperblockV1,
            4 => Self::SuperblockV2,
            5 => Self::Revoke,
            _ => return None,
        })
    }
}

/// Journal feature bits (`s_feature_compat`, `_incompat`, `_ro_compat`).
pub mod features {
    /// COMPAT: commit blocks carry a v1 (crc32) checksum of the transaction.
    pub const COMPAT_CHECKSUM: u32 = 0x1;
    /// INCOMPAT: the log contains revoke blocks.
    pub const INCOMPAT_REVOKE: u32 = 0x1;
    /// INCOMPAT: tags and revoke records carry 64-bit block numbers.
    pub const INCOMPAT_64BIT: u32 = 0x2;
    /// INCOMPAT: commit blocks may be written without waiting for the data.
    pub const INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
    /// INCOMPAT: crc32c checksums, 16-bit tag checksums (superseded by v3).
    pub const INCOMPAT_CSUM_V2: u32 = 0x8;
    /// INCOMPAT: crc32c checksums, 32-bit tag checksums (`journal_block_tag3_t`).
    pub const INCOMPAT_CSUM_V3: u32 = 0x10;
    /// INCOMPAT: a fast-commit area follows the main log.
    pub const INCOMPAT_FAST_COMMIT: u32 = 0x20;
    /// Every INCOMPAT bit this module knows how to parse.
    pub const INCOMPAT_KNOWN: u32 = INCOMPAT_REVOKE
        | INCOMPAT_64BIT
        | INCOMPAT_ASYNC_COMMIT
        | INCOMPAT_CSUM_V2
        | INCOMPAT_CSUM_V3
        | INCOMPAT_FAST_COMMIT;
}

/// Block tag flags (`t_flags`).
pub mod tag_flags {
    /// The logged copy had the journal magic in its first word, which was
    /// zeroed on write; replay must restore it.
    pub const ESCAPE: u32 = 0x1;
    /// The tag is not followed by a 16-byte UUID (same as the previous tag).
    pub const SAME_UUID: u32 = 0x2;
    /// The block was deleted by this transaction (unused by Linux).
    pub const DELETED: u32 = 0x4;
    /// The last tag in this descriptor block.
    pub const LAST_TAG: u32 = 0x8;
}

pub use crate::bytes::Be;

/// Read a big-endian u32 (bounds are the caller's responsibility).
#[inline]
pub fn be32(buf: &[u8], off: usize) -> u32 {
    <u32 as Be>::get(buf, off)
}

/// Write a big-endian u32.
#[inline]
pub fn put_be32(buf: &mut [u8], off: usize, v: u32) {
    <u32 as Be>::put(v, buf, off)
}

crate::layout! {
    big_endian
    /// `journal_header_t`: the first 12 bytes of every journal metadata block.
    pub struct JournalHeader (12) {
        h_magic: u32 = 0x0,
        h_blocktype: u32 = 0x4,
        h_sequence: u32 = 0x8,
    }
}

impl JournalHeader {
    /// A header for a block of type `t` in transaction `sequence`.
    pub fn new(t: BlockType, sequence: u32) -> Self {
        JournalHeader {
            h_magic: JBD2_MAGIC,
            h_blocktype: t as u32,
            h_sequence: sequence,
        }
    }

    /// Decode and check the magic; the block type is returned decoded.
    pub fn parse(buf: &[u8]) -> Result<(Self, BlockType)> {
        const S: &str = "journal block header";
        if buf.len() < Self::SIZE {
            return Err(corrupt(S, format!("only {} bytes", buf.len())));
        }
        let h = Self::parse_raw(buf);
        if h.h_magic != JBD2_MAGIC {
            return Err(corrupt(S, format!("bad magic {:#010x}", h.h_magic)));
        }
        let t = BlockType::from_u32(h.h_blocktype)
            .ok_or_else(|| corrupt(S, format!("unknown block type {}", h.h_blocktype)))?;
        Ok((h, t))
    }
}

crate::layout! {
    big_endian
    /// `journal_superblock_t` (v1 and v2), field for field.
    pub struct JournalSuperblock (1024) {
        h_magic: u32 = 0x0,
        h_blocktype: u32 = 0x4,
        h_sequence: u32 = 0x8,
        /// Journal block size: must equal the filesystem block size.
        blocksize: u32 = 0xC,
        /// Total blocks in the journal file.
        maxlen: u32 = 0x10,
        /// First block of log information.
        first: u32 = 0x14,
        /// First commit ID expected in the log.
        sequence: u32 = 0x18,
        /// Block number of the start of the log; 0 means the log is empty
        /// (cleanly unmounted, nothing to replay).
        start: u32 = 0x1C,
        /// Error value, as set by `jbd2_journal_abort()`.
        errno: u32 = 0x20,
        feature_compat: u32 = 0x24,
        feature_incompat: u32 = 0x28,
        feature_ro_compat: u32 = 0x2C,
        /// The journal's UUID (the filesystem's for an internal journal).
        uuid: [u8; 16] = 0x30,
        /// Number of filesystems sharing the log (1 for an internal journal).
        nr_users: u32 = 0x40,
        /// Block number of the dynamic superblock copy (unused).
        dynsuper: u32 = 0x44,
        /// Limit of journal blocks per transaction (0: unlimited).
        max_transaction: u32 = 0x48,
        /// Limit of data blocks per transaction (0: unlimited).
        max_trans_data: u32 = 0x4C,
        checksum_type: u8 = 0x50,
        padding2: [u8; 3] = 0x51,
        /// Number of fast-commit blocks after the main log.
        num_fc_blks: u32 = 0x54,
        /// Head of the log, only up to date while the filesystem is clean.
        head: u32 = 0x58,
        padding: [u32; 40] = 0x5C,
        /// crc32c of the superblock (v2/v3 checksums).
        checksum: u32 = 0xFC,
        /// UUIDs of the filesystems sharing the log (16 bytes each).
        users: [u8; 768] = 0x100,
    }
}

/// Offset of `s_checksum` in the journal superblock.
const SB_CHECKSUM_OFFSET: usize = 0xFC;

impl JournalSuperblock {
    /// The superblock `mke2fs` writes for a fresh internal journal of
    /// `maxlen` blocks: v2, empty log (`s_start = 0`), sequence 1, one user,
    /// the filesystem's UUID. `incompat` chooses the journal features (e.g.
    /// `64BIT | CSUM_V3`, what the kernel would set at first mount).
    pub fn new_internal(block_size: u32, maxlen: u32, uuid: [u8; 16], incompat: u32) -> Self {
        let csum = incompat & (features::INCOMPAT_CSUM_V2 | features::INCOMPAT_CSUM_V3) != 0;
        JournalSuperblock {
            h_magic: JBD2_MAGIC,
            h_blocktype: BlockType::SuperblockV2 as u32,
            h_sequence: 0,
            blocksize: block_size,
            maxlen,
            first: 1,
            sequence: 1,
            start: 0,
            errno: 0,
            feature_compat: 0,
            feature_incompat: incompat,
            feature_ro_compat: 0,
            uuid,
            nr_users: 1,
            dynsuper: 0,
            max_transaction: 0,
            max_trans_data: 0,
            checksum_type: if csum { CHECKSUM_CRC32C } else { 0 },
            padding2: [0; 3],
            num_fc_blks: 0,
            head: 0,
            padding: [0; 40],
            checksum: 0,
            users: [0; 768],
        }
    }

    /// Parse and validate a journal superblock from its 1024 bytes.
    ///
    /// Checks magic and type (v1 or v2), a power-of-two block size of at
    /// least 1 KiB, `0 < s_first < s_maxlen`, `s_start` inside the log,
    /// `s_nr_users <= 48`, that checksum v1 is not combined with v2/v3, and
    /// the superblock checksum when v2/v3 is on. Unknown INCOMPAT features
    /// are *not* an error here (see [`Self::unknown_incompat`]): whether
    /// they forbid replay is the caller's decision.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        const S: &str = "journal superblock";
        if buf.len() < Self::SIZE {
            return Err(corrupt(S, format!("only {} bytes", buf.len())));
        }
        let sb = Self::parse_raw(buf);
        if sb.h_magic != JBD2_MAGIC {
            return Err(corrupt(S, format!("bad magic {:#010x}", sb.h_magic)));
        }
        let v2 = match BlockType::from_u32(sb.h_blocktype) {
            Some(BlockType::SuperblockV1) => false,
            Some(BlockType::SuperblockV2) => true,
            _ => return Err(corrupt(S, format!("block type {} is not a superblock", sb.h_blocktype))),
        };
        if sb.blocksize < 1024 || sb.blocksize > 65536 || !sb.blocksize.is_power_of_two() {
            return Err(corrupt(S, format!("block size {} invalid", sb.blocksize)));
        }
        if sb.first == 0 || sb.first >= sb.maxlen {
            return Err(corrupt(
                S,
                format!("first log block {} outside a {}-block journal", sb.first, sb.maxlen),
            ));
        }
        if sb.start != 0 && (sb.start < sb.first || sb.start >= sb.maxlen) {
            return Err(corrupt(
                S,
                format!("log start {} outside {}..{}", sb.start, sb.first, sb.maxlen),
            ));
        }
        if !v2 {
            return Ok(sb);
        }
        if sb.nr_users > 48 {
            return Err(corrupt(S, format!("{} users (at most 48)", sb.nr_users)));
        }
        if sb.csum_v2or3() && sb.feature_compat & features::COMPAT_CHECKSUM != 0 {
            return Err(corrupt(S, "checksum v1 combined with v2/v3"));
        }
        if sb.csum_v2or3() {
            if sb.checksum_type != CHECKSUM_CRC32C {
                return Err(corrupt(S, format!("checksum type {} (want crc32c)", sb.checksum_type)));
            }
            let computed = Self::compute_checksum(buf);
            if computed != sb.checksum {
                return Err(FormatError::Checksum {
                    structure: S,
                    stored: sb.checksum,
                    computed,
                });
            }
        }
        Ok(sb)
    }

    /// `jbd2_superblock_csum`: crc32c(~0) over the 1024 bytes with
    /// `s_checksum` taken as zero.
    pub fn compute_checksum(buf: &[u8]) -> u32 {
        let c = crc32c(!0, &buf[..SB_CHECKSUM_OFFSET]);
        let c = crc32c(c, &[0; 4]);
        crc32c(c, &buf[SB_CHECKSUM_OFFSET + 4..Self::SIZE])
    }

    /// Serialise, refreshing `s_checksum` when checksum v2/v3 is on.
    pub fn to_bytes_with_checksum(&self) -> Vec<u8> {
        let mut v = self.to_bytes();
        if self.h_blocktype == BlockType::SuperblockV2 as u32 && self.csum_v2or3() {
            let c = Self::compute_checksum(&v);
            put_be32(&mut v, SB_CHECKSUM_OFFSET, c);
        }
        v
    }

    /// Whether an INCOMPAT feature is set.
    pub fn has_incompat(&self, f: u32) -> bool {
        self.feature_incompat & f != 0
    }

    /// INCOMPAT bits this module does not know (a replayer must refuse them).
    pub fn unknown_incompat(&self) -> u32 {
        self.feature_incompat & !features::INCOMPAT_KNOWN
    }

    /// Whether crc32c checksums (v2 or v3) protect the log.
    pub fn csum_v2or3(&self) -> bool {
        self.has_incompat(features::INCOMPAT_CSUM_V2 | features::INCOMPAT_CSUM_V3)
    }

    /// The seed every non-superblock checksum chains from (`j_csum_seed`).
    pub fn csum_seed(&self) -> u32 {
        crc32c(!0, &self.uuid)
    }

    /// How descriptor-block tags are laid out in this journal.
    pub fn tag_format(&self) -> TagFormat {
        TagFormat {
            bit64: self.has_incompat(features::INCOMPAT_64BIT),
            csum_v2: self.has_incompat(features::INCOMPAT_CSUM_V2),
            csum_v3: self.has_incompat(features::INCOMPAT_CSUM_V3),
        }
    }
}

/// Which tag layout a journal uses (`journal_block_tag_t` or
/// `journal_block_tag3_t`, with or without the high block word).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TagFormat {
    /// `INCOMPAT_64BIT`: tags carry `t_blocknr_high`.
    pub bit64: bool,
    /// `INCOMPAT_CSUM_V2`: 16-bit tag checksums.
    pub csum_v2: bool,
    /// `INCOMPAT_CSUM_V3`: 32-bit tag checksums, 32-bit flags.
    pub csum_v3: bool,
}

impl TagFormat {
    /// Whether descriptor and revoke blocks end in a checksum tail.
    pub fn has_tail(&self) -> bool {
        self.csum_v2 || self.csum_v3
    }

    /// `journal_tag_bytes()`: the size of one tag, not counting a UUID.
    /// A checksum-v3 tag is a whole `journal_block_tag3_t`, 16 bytes, with
    /// or without 64-bit block numbers (`t_blocknr_high` is then unused):
    /// only the older layouts shrink without `INCOMPAT_64BIT`.
    pub fn tag_size(&self) -> usize {
        if self.csum_v3 {
            return 16;
        }
        let sz = 12 + if self.csum_v2 { 2 } else { 0 };
        if self.bit64 {
            sz
        } else {
            sz - 4
        }
    }
}

/// One tag of a descriptor block: where the next logged block belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockTag {
    /// Filesystem block the logged copy is replayed to.
    pub blocknr: u64,
    /// `t_flags` ([`tag_flags`]).
    pub flags: u32,
    /// Checksum of the logged data (16 significant bits with v2).
    pub checksum: u32,
    /// The UUID following the tag, when `SAME_UUID` is clear.
    pub uuid: Option<[u8; 16]>,
}

impl BlockTag {
    /// Whether `data` (the logged copy, as stored in the journal) matches
    /// this tag's checksum in transaction `sequence`: all 32 bits with v3,
    /// the low 16 with v2; always true without v2/v3.
    pub fn data_checksum_matches(&self, fmt: TagFormat, seed: u32, sequence: u32, data: &[u8]) -> bool {
        let c = tag_data_checksum(seed, sequence, data);
        if fmt.csum_v3 {
            c == self.checksum
        } else if fmt.csum_v2 {
            c & 0xffff == self.checksum & 0xffff
        } else {
            true
        }
    }

    /// Bytes this tag occupies in a descriptor block.
    pub fn encoded_len(&self, fmt: TagFormat) -> usize {
        fmt.tag_size() + if self.flags & tag_flags::SAME_UUID == 0 { 16 } else { 0 }
    }

    /// Decode the tag at the start of `buf` (which must hold `tag_size` bytes).
    fn decode(buf: &[u8], fmt: TagFormat) -> (u64, u32, u32) {
        let lo = be32(buf, 0) as u64;
        if fmt.csum_v3 {
            let flags = be32(buf, 4);
            let hi = if fmt.bit64 { be32(buf, 8) as u64 } else { 0 };
            let csum = be32(buf, 12);
            (hi << 32 | lo, flags, csum)
        } else {
            // journal_block_tag_t: blocknr, be16 checksum, be16 flags, blocknr_high.
            let csum = u16::get(buf, 4) as u32;
            let flags = u16::get(buf, 6) as u32;
            let hi = if fmt.bit64 { be32(buf, 8) as u64 } else { 0 };
            (hi << 32 | lo, flags, csum)
        }
    }

    /// Encode at the start of `buf` (tag and, if any, UUID).
    fn encode(&self, buf: &mut [u8], fmt: TagFormat) {
        let sz = fmt.tag_size();
        buf[..sz].fill(0);
        put_be32(buf, 0, self.blocknr as u32);
        if fmt.csum_v3 {
            put_be32(buf, 4, self.flags);
            if fmt.bit64 {
                put_be32(buf, 8, (self.blocknr >> 32) as u32);
            }
            put_be32(buf, 12, self.checksum);
        } else {
            (self.checksum as u16).put(buf, 4);
            (self.flags as u16).put(buf, 6);
            if fmt.bit64 {
                put_be32(buf, 8, (self.blocknr >> 32) as u32);
            }
        }
        if self.flags & tag_flags::SAME_UUID == 0 {
            buf[sz..sz + 16].copy_from_slice(&self.uuid.unwrap_or([0; 16]));
        }
    }
}

/// Verify the 4-byte checksum tail of a descriptor or revoke block.
pub fn verify_block_tail(block: &[u8], seed: u32, structure: &'static str) -> Result<()> {
    if block.len() < JournalHeader::SIZE + BLOCK_TAIL_SIZE {
        return Err(corrupt(structure, "block too small for a checksum tail"));
    }
    let t = block.len() - BLOCK_TAIL_SIZE;
    let stored = be32(block, t);
    let computed = block_tail_checksum(block, seed);
    if stored != computed {
        return Err(FormatError::Checksum {
            structure,
            stored,
            computed,
        });
    }
    Ok(())
}

/// `jbd2_descriptor_block_csum`: crc32c(seed) over the block, tail as zero.
pub fn block_tail_checksum(block: &[u8], seed: u32) -> u32 {
    let t = block.len() - BLOCK_TAIL_SIZE;
    crc32c(crc32c(seed, &block[..t]), &[0; BLOCK_TAIL_SIZE])
}

/// Store the tail checksum of a descriptor or revoke block.
pub fn set_block_tail(block: &mut [u8], seed: u32) {
    let c = block_tail_checksum(block, seed);
    let t = block.len() - BLOCK_TAIL_SIZE;
    put_be32(block, t, c);
}

/// `jbd2_block_tag_csum`: the checksum of a logged block's data in
/// transaction `sequence` (store the low 16 bits with checksum v2).
pub fn tag_data_checksum(seed: u32, sequence: u32, data: &[u8]) -> u32 {
    crc32c(crc32c(seed, &sequence.to_be_bytes()), data)
}

/// Escape a block about to be logged: when its first word is the journal
/// magic, zero that word and return true (set [`tag_flags::ESCAPE`]).
pub fn escape(data: &mut [u8]) -> bool {
    if needs_escape(data) {
        data[..4].fill(0);
        true
    } else {
        false
    }
}

/// Undo [`escape`] on a logged copy whose tag has [`tag_flags::ESCAPE`].
pub fn unescape(data: &mut [u8]) {
    if data.len() >= 4 {
        put_be32(data, 0, JBD2_MAGIC);
    }
}

/// Whether a block about to be logged must be escaped (its first word is the
/// journal magic, which would make it look like journal metadata).
pub fn needs_escape(data: &[u8]) -> bool {
    data.len() >= 4 && be32(data, 0) == JBD2_MAGIC
}

/// A descriptor block: header plus the tags for the blocks that follow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorBlock {
    /// The header (type [`BlockType::Descriptor`]).
    pub header: JournalHeader,
    /// Tags in order; the i-th names the i-th block after this one.
    pub tags: Vec<BlockTag>,
}

impl DescriptorBlock {
    /// Decode a descriptor block. With `seed = Some(_)` (checksum v2/v3) the
    /// tail must verify and tags may not extend into it. Tags are read until
    /// one has `LAST_TAG` or the next would not fit, as the kernel does.
    pub fn parse(block: &[u8], fmt: TagFormat, seed: Option<u32>) -> Result<Self> {
        const S: &str = "journal descriptor block";
        let (header, t) = JournalHeader::parse(block)?;
        if t != BlockType::Descriptor {
            return Err(corrupt(
                S,
                format!("block type {} is not a descriptor", header.h_blocktype),
            ));
        }
        let mut limit = block.len();
        if fmt.has_tail() {
            if let Some(seed) = seed {
                verify_block_tail(block, seed, S)?;
            }
            limit = limit.saturating_sub(BLOCK_TAIL_SIZE);
        }
        let sz = fmt.tag_size();
        let mut off = JournalHeader::SIZE;
        let mut tags = Vec::new();
        while off + sz <= limit {
            let (blocknr, flags, checksum) = BlockTag::decode(&block[off..], fmt);
            off += sz;
            let uuid = if flags & tag_flags::SAME_UUID == 0 {
                if off + 16 > limit {
                    return Err(corrupt(S, format!("tag {} UUID runs past the end", tags.len())));
                }
                let mut u = [0u8; 16];
                u.copy_from_slice(&block[off..off + 16]);
                off += 16;
                Some(u)
            } else {
                None
            };
            tags.push(BlockTag {
                blocknr,
                flags,
                checksum,
                uuid,
            });
            if flags & tag_flags::LAST_TAG != 0 {
                break;
            }
        }
        Ok(DescriptorBlock { header, tags })
    }

    /// Encode into `block` (a whole journal block), zeroing the rest and
    /// setting the tail checksum when `seed` is given. The caller marks the
    /// last tag with `LAST_TAG`; an error if the tags do not fit.
    pub fn serialize_into(&self, block: &mut [u8], fmt: TagFormat, seed: Option<u32>) -> Result<()> {
        let limit = block
            .len()
            .saturating_sub(if fmt.has_tail() { BLOCK_TAIL_SIZE } else { 0 });
        let need: usize = JournalHeader::SIZE + self.tags.iter().map(|t| t.encoded_len(fmt)).sum::<usize>();
        if need > limit {
            return Err(corrupt(
                "journal descriptor block",
                format!("{} tags need {need} bytes, block holds {limit}", self.tags.len()),
            ));
        }
        block.fill(0);
        self.header.serialize_into(block);
        let mut off = JournalHeader::SIZE;
        for t in &self.tags {
            t.encode(&mut block[off..], fmt);
            off += t.encoded_len(fmt);
        }
        if let (true, Some(seed)) = (fmt.has_tail(), seed) {
            set_block_tail(block, seed);
        }
        Ok(())
    }
}

crate::layout! {
    big_endian
    /// `struct commit_header`: the commit block of a transaction.
    pub struct CommitHeader (60) {
        h_magic: u32 = 0x0,
        h_blocktype: u32 = 0x4,
        h_sequence: u32 = 0x8,
        /// Checksum v1 algorithm ([`CHECKSUM_CRC32`]...), 0 with v2/v3.
        chksum_type: u8 = 0xC,
        /// Checksum v1 size in bytes, 0 with v2/v3.
        chksum_size: u8 = 0xD,
        padding: [u8; 2] = 0xE,
        /// v1: the transaction checksum; v2/v3: word 0 is the block checksum.
        chksum: [u32; 8] = 0x10,
        /// Commit time, seconds.
        commit_sec: u64 = 0x30,
        /// Commit time, nanoseconds.
        commit_nsec: u32 = 0x38,
    }
}

/// Offset of `h_chksum[0]` in a commit block.
const COMMIT_CSUM_OFFSET: usize = 0x10;

impl CommitHeader {
    /// Decode a commit block; with `seed = Some(_)` (checksum v2/v3) its
    /// block checksum must verify.
    pub fn parse(block: &[u8], seed: Option<u32>) -> Result<Self> {
        const S: &str = "journal commit block";
        let (_, t) = JournalHeader::parse(block)?;
        if block.len() < Self::SIZE {
            return Err(corrupt(S, format!("only {} bytes", block.len())));
        }
        let c = Self::parse_raw(block);
        if t != BlockType::Commit {
            return Err(corrupt(S, format!("block type {} is not a commit", c.h_blocktype)));
        }
        if let Some(seed) = seed {
            let computed = Self::compute_checksum(block, seed);
            if computed != c.chksum[0] {
                return Err(FormatError::Checksum {
                    structure: S,
                    stored: c.chksum[0],
                    computed,
                });
            }
        }
        if c.commit_nsec >= 1_000_000_000 {
            return Err(corrupt(S, format!("commit nanoseconds {} out of range", c.commit_nsec)));
        }
        Ok(c)
    }

    /// `jbd2_commit_block_csum`: crc32c(seed) over the whole block with
    /// `h_chksum[0]` taken as zero.
    pub fn compute_checksum(block: &[u8], seed: u32) -> u32 {
        let c = crc32c(seed, &block[..COMMIT_CSUM_OFFSET]);
        let c = crc32c(c, &[0; 4]);
        crc32c(c, &block[COMMIT_CSUM_OFFSET + 4..])
    }

    /// Encode into a whole journal block (rest zeroed); with `seed` the
    /// v2/v3 block checksum is computed and stored in `h_chksum[0]`.
    pub fn serialize_block(&self, block: &mut [u8], seed: Option<u32>) {
        block.fill(0);
        self.serialize_into(block);
        if let Some(seed) = seed {
            let c = Self::compute_checksum(block, seed);
            put_be32(block, COMMIT_CSUM_OFFSET, c);
        }
    }
}

crate::layout! {
    big_endian
    /// `jbd2_journal_revoke_header_t`: header plus the bytes used.
    pub struct RevokeHeader (16) {
        h_magic: u32 = 0x0,
        h_blocktype: u32 = 0x4,
        h_sequence: u32 = 0x8,
        /// Bytes of the block in use, header included.
        r_count: u32 = 0xC,
    }
}

/// A revoke block: filesystem blocks whose earlier logged copies (in this
/// or older transactions) must not be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokeBlock {
    /// Transaction sequence.
    pub sequence: u32,
    /// Revoked filesystem block numbers.
    pub blocks: Vec<u64>,
}

impl RevokeBlock {
    /// Decode; records are 8 bytes with `bit64`, else 4. With checksum
    /// v2/v3 the tail must verify (when `seed` is given) and `r_count` may
    /// not reach into it.
    pub fn parse(block: &[u8], fmt: TagFormat, seed: Option<u32>) -> Result<Self> {
        const S: &str = "journal revoke block";
        let (h, t) = JournalHeader::parse(block)?;
        if t != BlockType::Revoke || block.len() < RevokeHeader::SIZE {
            return Err(corrupt(
                S,
                format!("block type {} is not a revoke block", h.h_blocktype),
            ));
        }
        let r = RevokeHeader::parse_raw(block);
        let mut limit = block.len();
        if fmt.has_tail() {
            if let Some(seed) = seed {
                verify_block_tail(block, seed, S)?;
            }
            limit -= BLOCK_TAIL_SIZE;
        }
        let count = r.r_count as usize;
        if count < RevokeHeader::SIZE || count > limit {
            return Err(corrupt(
                S,
                format!("r_count {count} outside {}..={limit}", RevokeHeader::SIZE),
            ));
        }
        let rec = if fmt.bit64 { 8 } else { 4 };
        let mut blocks = Vec::with_capacity((count - RevokeHeader::SIZE) / rec);
        let mut off = RevokeHeader::SIZE;
        while off + rec <= count {
            blocks.push(if fmt.bit64 {
                u64::get(block, off)
            } else {
                be32(block, off) as u64
            });
            off += rec;
        }
        Ok(RevokeBlock {
            sequence: h.h_sequence,
            blocks,
        })
    }

    /// Encode into a whole journal block (rest zeroed), with the tail
    /// checksum when `seed` is given; an error if the records do not fit.
    pub fn serialize_into(&self, block: &mut [u8], fmt: TagFormat, seed: Option<u32>) -> Result<()> {
        let rec = if fmt.bit64 { 8 } else { 4 };
        let limit = block
            .len()
            .saturating_sub(if fmt.has_tail() { BLOCK_TAIL_SIZE } else { 0 });
        let count = RevokeHeader::SIZE + rec * self.blocks.len();
        if count > limit {
            return Err(corrupt(
                "journal revoke block",
                format!("{} records need {count} bytes, block holds {limit}", self.blocks.len()),
            ));
        }
        block.fill(0);
        RevokeHeader {
            h_magic: JBD2_MAGIC,
            h_blocktype: BlockType::Revoke as u32,
            h_sequence: self.sequence,
            r_count: count as u32,
        }
        .serialize_into(block);
        for (i, &b) in self.blocks.iter().enumerate() {
            let off = RevokeHeader::SIZE + rec * i;
            if fmt.bit64 {
                b.put(block, off);
            } else {
                put_be32(block, off, b as u32);
            }
        }
        if let (true, Some(seed)) = (fmt.has_tail(), seed) {
            set_block_tail(block, seed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Rebuild a 1024-byte block from its non-zero 16-byte lines.
    fn block(lines: &[(usize, [u8; 16])]) -> Vec<u8> {
        let mut b = vec![0u8; 1024];
        for (off, l) in lines {
            b[*off..*off + 16].copy_from_slice(l);
        }
        b
    }

    const UUID: [u8; 16] = [
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
    ];

    // `mke2fs -t ext4 -U 01234567-89ab-cdef-0123-456789abcdef` on a 64 MiB
    // image (1 KiB blocks, 4096-block journal), journal block 0 as written by
    // e2fsprogs 1.47.0: dumpe2fs says "Journal features: (none)", "Total
    // journal blocks: 4096", "Journal sequence: 0x00000001", "Journal start: 0".
    const MKE2FS_JSB: &[(usize, [u8; 16])] = &[
        (
            0x000,
            [0xc0, 0x3b, 0x39, 0x98, 0, 0, 0, 0x04, 0, 0, 0, 0, 0, 0, 0x04, 0],
        ),
        (0x010, [0, 0, 0x10, 0, 0, 0, 0, 0x01, 0, 0, 0, 0x01, 0, 0, 0, 0]),
        (0x030, UUID),
        (0x040, [0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    ];

    // The same image after one kernel (6.18) mount, file create, unmount:
    // dumpe2fs says "journal_64bit journal_checksum_v3", "Journal sequence:
    // 0x00000004", "Journal checksum type: crc32c", "Journal checksum:
    // 0xd04bd88d"; s_head = 10.
    const KERNEL_JSB: &[(usize, [u8; 16])] = &[
        (
            0x000,
            [0xc0, 0x3b, 0x39, 0x98, 0, 0, 0, 0x04, 0, 0, 0, 0, 0, 0, 0x04, 0],
        ),
        (0x010, [0, 0, 0x10, 0, 0, 0, 0, 0x01, 0, 0, 0, 0x04, 0, 0, 0, 0]),
        (0x020, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0, 0, 0, 0]),
        (0x030, UUID),
        (0x040, [0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        (0x050, [0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a, 0, 0, 0, 0]),
        (0x0f0, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xd0, 0x4b, 0xd8, 0x8d]),
    ];

    // A live kernel journal (image copied after `sync`, before unmount):
    // `debugfs -R "logdump -a"` shows descriptor block 1 of sequence 2 with
    // 11 tags (FS blocks 267 flags 0x0, 2, 277, 275, 4371, 1, 268, 260, 787,
    // 259 flags 0x2, 4385 flags 0xa) and the commit block at journal block 13.
    const LIVE_DESCRIPTOR: &[(usize, [u8; 16])] = &[
        (
            0x000,
            [0xc0, 0x3b, 0x39, 0x98, 0, 0, 0, 0x01, 0, 0, 0, 0x02, 0, 0, 0x01, 0x0b],
        ),
        (0x010, [0, 0, 0, 0, 0, 0, 0, 0, 0x03, 0xcb, 0xf2, 0x34, 0, 0, 0, 0]),
        (0x020, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02]),
        (
            0x030,
            [0, 0, 0, 0x02, 0, 0, 0, 0, 0xa5, 0xfc, 0x81, 0x7b, 0, 0, 0x01, 0x15],
        ),
        (
            0x040,
            [0, 0, 0, 0x02, 0, 0, 0, 0, 0x25, 0x0c, 0xfe, 0x8e, 0, 0, 0x01, 0x13],
        ),
        (
            0x050,
            [0, 0, 0, 0x02, 0, 0, 0, 0, 0xc4, 0x5b, 0xae, 0xb9, 0, 0, 0x11, 0x13],
        ),
        (
            0x060,
            [0, 0, 0, 0x02, 0, 0, 0, 0, 0xce, 0x80, 0xea, 0x07, 0, 0, 0, 0x01],
        ),
        (
            0x070,
            [0, 0, 0, 0x02, 0, 0, 0, 0, 0x28, 0xce, 0x1f, 0x26, 0, 0, 0x01, 0x0c],
        ),
        (
            0x080,
            [0, 0, 0, 0x02, 0, 0, 0, 0, 0x40, 0x78, 0x62, 0x59, 0, 0, 0x01, 0x04],
        ),
        (
            0x090,
            [0, 0, 0, 0x02, 0, 0, 0, 0, 0x3f, 0xe5, 0xf4, 0x9c, 0, 0, 0x03, 0x13],
        ),
        (
            0x0a0,
            [0, 0, 0, 0x02, 0, 0, 0, 0, 0x95, 0x51, 0x9f, 0xc1, 0, 0, 0x01, 0x03],
        ),
        (
            0x0b0,
            [0, 0, 0, 0x02, 0, 0, 0, 0, 0x60, 0xb1, 0x6d, 0x94, 0, 0, 0x11, 0x21],
        ),
        (0x0c0, [0, 0, 0, 0x0a, 0, 0, 0, 0, 0x53, 0x18, 0x9c, 0x53, 0, 0, 0, 0]),
        (0x3f0, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x8e, 0x33, 0xa0, 0x5d]),
    ];

    const LIVE_COMMIT: &[(usize, [u8; 16])] = &[
        (
            0x000,
            [0xc0, 0x3b, 0x39, 0x98, 0, 0, 0, 0x02, 0, 0, 0, 0x02, 0, 0, 0, 0],
        ),
        (0x010, [0x84, 0x40, 0x82, 0xef, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        (
            0x030,
            [0, 0, 0, 0, 0x6b, 0x02, 0x6d, 0x02, 0x34, 0, 0x44, 0x91, 0, 0, 0, 0],
        ),
    ];

    #[test]
    fn layouts_are_complete() {
        JournalHeader::layout_covers_every_byte();
        JournalSuperblock::layout_covers_every_byte();
        CommitHeader::layout_covers_every_byte();
        RevokeHeader::layout_covers_every_byte();
    }

    #[test]
    fn mke2fs_superblock() {
        let b = block(MKE2FS_JSB);
        let sb = JournalSuperblock::parse(&b).unwrap();
        assert_eq!(sb.h_blocktype, BlockType::SuperblockV2 as u32);
        assert_eq!(sb.blocksize, 1024);
        assert_eq!(sb.maxlen, 4096);
        assert_eq!(sb.first, 1);
        assert_eq!(sb.sequence, 1);
        assert_eq!(sb.start, 0);
        assert_eq!(sb.feature_incompat, 0);
        assert_eq!(sb.uuid, UUID);
        assert_eq!(sb.nr_users, 1);
        assert!(!sb.csum_v2or3());
        assert_eq!(sb.to_bytes(), b);
        // Our mkfs constructor writes exactly what mke2fs wrote.
        assert_eq!(
            JournalSuperblock::new_internal(1024, 4096, UUID, 0).to_bytes_with_checksum(),
            b
        );
    }

    #[test]
    fn kernel_superblock_with_csum_v3() {
        let b = block(KERNEL_JSB);
        let sb = JournalSuperblock::parse(&b).unwrap();
        assert_eq!(sb.maxlen, 4096);
        assert_eq!(sb.sequence, 4);
        assert_eq!(sb.start, 0);
        assert_eq!(sb.head, 10);
        assert_eq!(
            sb.feature_incompat,
            features::INCOMPAT_64BIT | features::INCOMPAT_CSUM_V3
        );
        assert_eq!(sb.checksum_type, CHECKSUM_CRC32C);
        assert_eq!(sb.checksum, 0xd04b_d88d);
        assert_eq!(sb.unknown_incompat(), 0);
        assert_eq!(sb.to_bytes(), b);
        assert_eq!(sb.to_bytes_with_checksum(), b);
        assert_eq!(
            sb.tag_format(),
            TagFormat {
                bit64: true,
                csum_v2: false,
                csum_v3: true
            }
        );
        let mut bad = b.clone();
        bad[0x200] = 1;
        assert!(matches!(
            JournalSuperblock::parse(&bad),
            Err(FormatError::Checksum { .. })
        ));
    }

    #[test]
    fn kernel_descriptor_and_commit() {
        let sb = JournalSuperblock::parse(&block(KERNEL_JSB)).unwrap();
        let fmt = sb.tag_format();
        let seed = sb.csum_seed();
        let b = block(LIVE_DESCRIPTOR);
        let d = DescriptorBlock::parse(&b, fmt, Some(seed)).unwrap();
        assert_eq!(d.header.h_sequence, 2);
        let blocks: Vec<u64> = d.tags.iter().map(|t| t.blocknr).collect();
        assert_eq!(blocks, vec![267, 2, 277, 275, 4371, 1, 268, 260, 787, 259, 4385]);
        assert_eq!(d.tags[0].flags, 0);
        assert_eq!(d.tags[0].uuid, Some([0; 16]));
        assert_eq!(d.tags[0].checksum, 0x03cb_f234);
        assert_eq!(d.tags[1].flags, tag_flags::SAME_UUID);
        assert_eq!(d.tags[10].flags, tag_flags::SAME_UUID | tag_flags::LAST_TAG);
        let mut out = vec![0u8; 1024];
        d.serialize_into(&mut out, fmt, Some(seed)).unwrap();
        assert_eq!(out, b);
        let mut bad = b.clone();
        bad[0x20] ^= 1;
        assert!(DescriptorBlock::parse(&bad, fmt, Some(seed)).is_err());

        let c = block(LIVE_COMMIT);
        let h = CommitHeader::parse(&c, Some(seed)).unwrap();
        assert_eq!(h.h_sequence, 2);
        assert_eq!(h.commit_sec, 0x6b02_6d02);
        assert_eq!(h.commit_nsec, 0x3400_4491);
        let mut out = vec![0xffu8; 1024];
        h.serialize_block(&mut out, Some(seed));
        assert_eq!(out, c);
        assert!(CommitHeader::parse(&c, Some(seed ^ 1)).is_err());
    }

    #[test]
    fn kernel_tag_data_checksum() {
        // Journal block 2 of the live journal: the logged copy of FS block
        // 267 (an inode bitmap: inodes 1..12 used, padding bits set).
        let mut data = vec![0u8; 1024];
        data[0] = 0xff;
        data[1] = 0x0f;
        data[0x100..].fill(0xff);
        let sb = JournalSuperblock::parse(&block(KERNEL_JSB)).unwrap();
        let d = DescriptorBlock::parse(&block(LIVE_DESCRIPTOR), sb.tag_format(), Some(sb.csum_seed())).unwrap();
        let t = d.tags[0];
        assert!(t.data_checksum_matches(sb.tag_format(), sb.csum_seed(), 2, &data));
        assert!(!t.data_checksum_matches(sb.tag_format(), sb.csum_seed(), 3, &data));
        data[5] = 1;
        assert!(!t.data_checksum_matches(sb.tag_format(), sb.csum_seed(), 2, &data));
    }

    #[test]
    fn escape_roundtrip() {
        let mut b = JBD2_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&[1, 2, 3]);
        let orig = b.clone();
        assert!(escape(&mut b));
        assert_eq!(&b[..4], &[0, 0, 0, 0]);
        unescape(&mut b);
        assert_eq!(b, orig);
        let mut plain = vec![1u8; 8];
        assert!(!escape(&mut plain));
    }

    #[test]
    fn tag_sizes_match_journal_tag_bytes() {
        let f = |bit64, csum_v2, csum_v3| {
            TagFormat {
                bit64,
                csum_v2,
                csum_v3,
            }
            .tag_size()
        };
        assert_eq!(f(false, false, false), 8);
        assert_eq!(f(true, false, false), 12);
        assert_eq!(f(false, true, false), 10);
        assert_eq!(f(true, true, false), 14);
        // journal_block_tag3_t is 16 bytes whatever INCOMPAT_64BIT says
        // (a kernel journal on ext4 without 64bit has 16-byte tags).
        assert_eq!(f(false, false, true), 16);
        assert_eq!(f(true, false, true), 16);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(JournalSuperblock::parse(&[0u8; 10]).is_err());
        assert!(JournalSuperblock::parse(&[0xffu8; 1024]).is_err());
        let mut b = block(MKE2FS_JSB);
        b[0x17] = 0; // s_first = 0
        assert!(JournalSuperblock::parse(&b).is_err());
        assert!(CommitHeader::parse(&[0u8; 8], None).is_err());
        assert!(RevokeBlock::parse(&[0u8; 8], TagFormat::default(), None).is_err());
        assert!(DescriptorBlock::parse(&[0u8; 8], TagFormat::default(), None).is_err());
    }

    #[test]
    fn escape_detection() {
        assert!(needs_escape(&JBD2_MAGIC.to_be_bytes()));
        assert!(!needs_escape(&[0, 0, 0]));
    }

    fn any_fmt() -> impl Strategy<Value = TagFormat> {
        (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(bit64, v2, v3)| TagFormat {
            bit64,
            csum_v2: v2 && !v3,
            csum_v3: v3,
        })
    }

    proptest! {
        #[test]
        fn superblock_roundtrip_is_bit_exact(bytes in proptest::collection::vec(any::<u8>(), 1024)) {
            prop_assert_eq!(JournalSuperblock::parse_raw(&bytes).to_bytes(), bytes);
        }

        #[test]
        fn commit_roundtrip_is_bit_exact(bytes in proptest::collection::vec(any::<u8>(), 60)) {
            prop_assert_eq!(CommitHeader::parse_raw(&bytes).to_bytes(), bytes);
        }

        #[test]
        fn superblock_checksum_roundtrip(maxlen in 1024u32..1 << 20, uuid in any::<[u8; 16]>(), seq in any::<u32>()) {
            let mut sb = JournalSuperblock::new_internal(4096, maxlen, uuid, features::INCOMPAT_CSUM_V3 | features::INCOMPAT_64BIT);
            sb.sequence = seq;
            let b = sb.to_bytes_with_checksum();
            let back = JournalSuperblock::parse(&b).unwrap();
            prop_assert_eq!(back.to_bytes(), b);
        }

        #[test]
        fn descriptor_roundtrip(fmt in any_fmt(), seq in any::<u32>(),
                                tags in proptest::collection::vec((any::<u64>(), any::<bool>(), any::<u32>(), any::<[u8; 16]>()), 1..40)) {
            let bs = 4096;
            let mut v: Vec<BlockTag> = tags.iter().enumerate().map(|(i, &(nr, same, csum, uuid))| {
                let same = same && i > 0;
                BlockTag {
                    blocknr: if fmt.bit64 { nr } else { nr & 0xffff_ffff },
                    flags: if same { tag_flags::SAME_UUID } else { 0 },
                    checksum: if fmt.csum_v3 { csum } else { csum & 0xffff },
                    uuid: (!same).then_some(uuid),
                }
            }).collect();
            if let Some(l) = v.last_mut() { l.flags |= tag_flags::LAST_TAG; }
            let d = DescriptorBlock { header: JournalHeader::new(BlockType::Descriptor, seq), tags: v };
            let mut b = vec![0u8; bs];
            d.serialize_into(&mut b, fmt, Some(7)).unwrap();
            let back = DescriptorBlock::parse(&b, fmt, Some(7)).unwrap();
            prop_assert_eq!(back, d);
        }

        #[test]
        fn revoke_roundtrip(fmt in any_fmt(), seq in any::<u32>(), blocks in proptest::collection::vec(any::<u64>(), 0..100)) {
            let blocks: Vec<u64> = blocks.into_iter().map(|b| if fmt.bit64 { b } else { b & 0xffff_ffff }).collect();
            let r = RevokeBlock { sequence: seq, blocks };
            let mut b = vec![0u8; 1024];
            r.serialize_into(&mut b, fmt, Some(9)).unwrap();
            prop_assert_eq!(RevokeBlock::parse(&b, fmt, Some(9)).unwrap(), r);
        }

        #[test]
        fn commit_checksum_roundtrip(seq in any::<u32>(), sec in any::<u64>(), nsec in 0u32..1_000_000_000, seed in any::<u32>()) {
            let mut h = CommitHeader::parse_raw(&[0u8; 60]);
            h.h_magic = JBD2_MAGIC;
            h.h_blocktype = BlockType::Commit as u32;
            h.h_sequence = seq;
            h.commit_sec = sec;
            h.commit_nsec = nsec;
            let mut b = vec![0u8; 2048];
            h.serialize_block(&mut b, Some(seed));
            let back = CommitHeader::parse(&b, Some(seed)).unwrap();
            prop_assert_eq!(back.h_sequence, seq);
            prop_assert_eq!(back.commit_sec, sec);
        }

        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1100), fmt in any_fmt()) {
            let _ = JournalSuperblock::parse(&bytes);
            let _ = DescriptorBlock::parse(&bytes, fmt, Some(1));
            let _ = DescriptorBlock::parse(&bytes, fmt, None);
            let _ = CommitHeader::parse(&bytes, Some(1));
            let _ = RevokeBlock::parse(&bytes, fmt, None);
            let _ = JournalHeader::parse(&bytes);
        }
    }
}
