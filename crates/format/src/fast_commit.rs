//! Fast commits (the `fast_commit` feature, fs/ext4/fast_commit.h): the
//! logical log ext4 writes to the blocks after the jbd2 main log between
//! two full commits.
//!
//! A fast-commit block is a sequence of tag-length-value records, all
//! little-endian: `{le16 tag, le16 len}` then `len` bytes of value. A fast
//! commit opens with `HEAD {features, tid}`, names what changed (extents
//! added and logical ranges removed per inode, directory entries created,
//! linked and unlinked, whole inode records) and closes with
//! `TAIL {tid, crc}`, where `crc` is the raw crc32c, seeded with 0, of
//! every record since the previous tail up to and including this tail's
//! `tid`. `PAD` fills the end of a block: since Linux 5.17 a record never
//! crosses a block boundary, and that is the only layout decoded here (a
//! record that would run past its block ends the scan, which is also what
//! the kernel's bounds check does).
//!
//! This module decodes records; which of them count (the tail rules) is
//! the recovery's business (`ext4kit-jbd2`), and what they do to the
//! filesystem is the ext4 layer's (`fc_replay`).

use crate::bytes::Le;
use crate::error::{corrupt, Result};
use crate::extent::Extent;

/// `EXT4_FC_TAG_ADD_RANGE`: an extent now maps part of an inode.
pub const TAG_ADD_RANGE: u16 = 0x0001;
/// `EXT4_FC_TAG_DEL_RANGE`: a logical range of an inode is no longer mapped.
pub const TAG_DEL_RANGE: u16 = 0x0002;
/// `EXT4_FC_TAG_CREAT`: a directory entry for a newly created inode.
pub const TAG_CREAT: u16 = 0x0003;
/// `EXT4_FC_TAG_LINK`: a directory entry added for an existing inode.
pub const TAG_LINK: u16 = 0x0004;
/// `EXT4_FC_TAG_UNLINK`: a directory entry removed.
pub const TAG_UNLINK: u16 = 0x0005;
/// `EXT4_FC_TAG_INODE`: an inode record, as it is in memory.
pub const TAG_INODE: u16 = 0x0006;
/// `EXT4_FC_TAG_PAD`: filler to the end of a block.
pub const TAG_PAD: u16 = 0x0007;
/// `EXT4_FC_TAG_TAIL`: closes one fast commit (tid and checksum).
pub const TAG_TAIL: u16 = 0x0008;
/// `EXT4_FC_TAG_HEAD`: opens the fast-commit area (features and tid).
pub const TAG_HEAD: u16 = 0x0009;

/// `EXT4_FC_SUPPORTED_FEATURES`: no fast-commit feature bits exist yet.
pub const SUPPORTED_FEATURES: u32 = 0;

/// Size of a record's tag and length (`EXT4_FC_TAG_BASE_LEN`).
pub const TL_SIZE: usize = 4;

/// The name e2fsprogs and the kernel print for a tag (`tag2str`).
pub fn tag_name(tag: u16) -> &'static str {
    match tag {
        TAG_LINK => "ADD_ENTRY",
        TAG_UNLINK => "DEL_ENTRY",
        TAG_ADD_RANGE => "ADD_RANGE",
        TAG_CREAT => "CREAT_DENTRY",
        TAG_DEL_RANGE => "DEL_RANGE",
        TAG_INODE => "INODE",
        TAG_PAD => "PAD",
        TAG_TAIL => "TAIL",
        TAG_HEAD => "HEAD",
        _ => "ERROR",
    }
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// `HEAD`: features the writer used and the transaction id it belongs to.
    Head {
        /// `fc_features` (must be within [`SUPPORTED_FEATURES`]).
        features: u32,
        /// `fc_tid`: the jbd2 transaction this fast commit extends.
        tid: u32,
    },
    /// `ADD_RANGE`: `extent` now maps part of inode `ino`.
    AddRange {
        /// The inode.
        ino: u32,
        /// The on-disk extent record (logical block, length, physical start;
        /// an unwritten extent has the length's high bit).
        extent: Extent,
    },
    /// `DEL_RANGE`: blocks `lblk .. lblk + len` of inode `ino` are unmapped.
    DelRange {
        /// The inode.
        ino: u32,
        /// First logical block.
        lblk: u32,
        /// Number of blocks.
        len: u32,
    },
    /// `CREAT`, `LINK` or `UNLINK` (see `tag`): `name` in directory `parent`
    /// names (or no longer names) inode `ino`.
    Dentry {
        /// [`TAG_CREAT`], [`TAG_LINK`] or [`TAG_UNLINK`].
        tag: u16,
        /// The directory.
        parent: u32,
        /// The inode the entry names.
        ino: u32,
        /// The entry's name.
        name: Vec<u8>,
    },
    /// `INODE`: the whole inode record of `ino` (as many bytes as the
    /// record carries: 128 plus its `i_extra_isize` part).
    Inode {
        /// The inode.
        ino: u32,
        /// The raw record.
        raw: Vec<u8>,
    },
    /// `PAD`: nothing.
    Pad,
    /// `TAIL`: closes a fast commit of transaction `tid` whose records
    /// since the previous tail have crc32c `crc`.
    Tail {
        /// `fc_tid`.
        tid: u32,
        /// `fc_crc`.
        crc: u32,
    },
    /// A tag no kernel writes.
    Unknown(u16),
}

/// One record as it lies in a block: where, its raw tag and length, the
/// bytes to checksum, and its decoded value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRecord<'a> {
    /// Byte offset of the record in its block.
    pub offset: usize,
    /// `fc_tag`.
    pub tag: u16,
    /// The whole record (tag, length and value).
    pub bytes: &'a [u8],
    /// The decoded value.
    pub record: Record,
}

impl RawRecord<'_> {
    /// The bytes this record contributes to the running checksum: all of
    /// it, except a tail, which contributes its tag, length and tid only
    /// (`offsetof(struct ext4_fc_tail, fc_crc)`).
    pub fn checksummed(&self) -> &[u8] {
        if self.tag == TAG_TAIL {
            &self.bytes[..TL_SIZE + 4]
        } else {
            self.bytes
        }
    }
}

/// Decode the value of a record with tag `tag`; an error if it is too
/// short for its structure (`ext4_fc_value_len_isvalid`).
pub fn decode(tag: u16, val: &[u8]) -> Result<Record> {
    const S: &str = "fast-commit record";
    let need = match tag {
        TAG_ADD_RANGE => 16,
        TAG_DEL_RANGE => 12,
        TAG_CREAT | TAG_LINK | TAG_UNLINK => 8,
        TAG_INODE => 4 + 128,
        TAG_HEAD | TAG_TAIL => 8,
        _ => 0,
    };
    if val.len() < need {
        return Err(corrupt(
            S,
            format!("{} value of {} bytes (needs {need})", tag_name(tag), val.len()),
        ));
    }
    let u32_at = |o: usize| <u32 as Le>::get(val, o);
    Ok(match tag {
        TAG_ADD_RANGE => Record::AddRange {
            ino: u32_at(0),
            extent: Extent::parse_raw(&val[4..16]),
        },
        TAG_DEL_RANGE => Record::DelRange {
            ino: u32_at(0),
            lblk: u32_at(4),
            len: u32_at(8),
        },
        TAG_CREAT | TAG_LINK | TAG_UNLINK => Record::Dentry {
            tag,
            parent: u32_at(0),
            ino: u32_at(4),
            name: val[8..].to_vec(),
        },
        TAG_INODE => Record::Inode {
            ino: u32_at(0),
            raw: val[4..].to_vec(),
        },
        TAG_PAD => Record::Pad,
        TAG_HEAD => Record::Head {
            features: u32_at(0),
            tid: u32_at(4),
        },
        TAG_TAIL => Record::Tail {
            tid: u32_at(0),
            crc: u32_at(4),
        },
        other => Record::Unknown(other),
    })
}

/// The records of one fast-commit block, in order, as the kernel's scan
/// reads them (`ext4_fc_replay_scan`): records start while at least a tag
/// and length fit; a record whose value would run past the block, or is
/// too short for its tag, ends the block with an error for that record,
/// and an unknown tag ends it after that record.
pub fn records(block: &[u8]) -> Vec<Result<RawRecord<'_>>> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while off + TL_SIZE <= block.len() {
        let tag = <u16 as Le>::get(block, off);
        let len = <u16 as Le>::get(block, off + 2) as usize;
        let end = off + TL_SIZE + len;
        if end > block.len() {
            out.push(Err(corrupt(
                "fast-commit block",
                format!(
                    "{} record at byte {off} runs {} bytes past the end of its block",
                    tag_name(tag),
                    end - block.len()
                ),
            )));
            break;
        }
        match decode(tag, &block[off + TL_SIZE..end]) {
            Ok(record) => {
                let unknown = matches!(record, Record::Unknown(_));
                out.push(Ok(RawRecord {
                    offset: off,
                    tag,
                    bytes: &block[off..end],
                    record,
                }));
                // Nothing after a tag no kernel writes can be trusted to
                // be a record (the scan stops there too).
                if unknown {
                    break;
                }
            }
            Err(e) => {
                out.push(Err(e));
                break;
            }
        }
        off = end;
    }
    out
}

/// Encode one record (for tests and tools that write fast commits).
pub fn encode(tag: u16, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(TL_SIZE + value.len());
    v.extend_from_slice(&tag.to_le_bytes());
    v.extend_from_slice(&(value.len() as u16).to_le_bytes());
    v.extend_from_slice(value);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::crc32c;

    #[test]
    fn a_block_decodes_record_by_record() {
        let mut b = Vec::new();
        b.extend(encode(TAG_HEAD, &[0, 0, 0, 0, 7, 0, 0, 0]));
        let mut dentry = vec![2, 0, 0, 0, 12, 0, 0, 0];
        dentry.extend_from_slice(b"hello");
        b.extend(encode(TAG_CREAT, &dentry));
        let ext = Extent {
            block: 0,
            len: 3,
            start_hi: 0,
            start_lo: 1000,
        };
        let mut add = vec![12, 0, 0, 0];
        add.extend(ext.to_bytes());
        b.extend(encode(TAG_ADD_RANGE, &add));
        let crc = crc32c(0, &b);
        let mut tail = encode(TAG_TAIL, &[7, 0, 0, 0, 0, 0, 0, 0]);
        let crc = crc32c(crc, &tail[..8]);
        tail[8..12].copy_from_slice(&crc.to_le_bytes());
        b.extend(tail);
        b.resize(1024, 0);
        let recs: Vec<_> = records(&b).into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(recs[0].record, Record::Head { features: 0, tid: 7 });
        assert_eq!(
            recs[1].record,
            Record::Dentry {
                tag: TAG_CREAT,
                parent: 2,
                ino: 12,
                name: b"hello".to_vec()
            }
        );
        assert_eq!(recs[2].record, Record::AddRange { ino: 12, extent: ext });
        assert_eq!(recs[3].record, Record::Tail { tid: 7, crc });
        // The running checksum of the records up to the tail's tid matches.
        let mut c = 0;
        for r in &recs[..4] {
            c = crc32c(c, r.checksummed());
        }
        assert_eq!(c, crc);
        // The zero bytes after the tail read as a tag 0 nobody writes: the
        // block ends there.
        assert_eq!(recs.len(), 5);
        assert_eq!(recs[4].record, Record::Unknown(0));
    }

    #[test]
    fn a_record_past_the_block_or_too_short_is_an_error_not_a_panic() {
        let mut b = encode(TAG_INODE, &[1, 0, 0, 0]);
        b.resize(64, 0);
        assert!(records(&b)[0].is_err());
        let b = encode(TAG_PAD, &[0; 100]);
        assert!(records(&b[..50])[0].is_err());
        for len in 0..40 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let _ = records(&junk);
        }
    }
}
