//! What the log holds, block by block: the walk of `debugfs logdump`, for
//! `ext4kit journal`, so a user with a broken image can see what is in its
//! journal without e2fsprogs.
//!
//! The walk follows debugfs, not recovery: from `s_start` it reads journal
//! blocks while their header has the journal magic and the expected
//! sequence, moving to the next sequence after each commit block; it does
//! not stop at a checksum that fails (that is what recovery decides, and
//! the listing shows the verdict next to each block instead). The
//! fast-commit area is listed after the log, as debugfs lists it. Block
//! numbers are journal-relative.

use ext4kit_format::fast_commit::{self, Record};
use ext4kit_format::jbd2::{be32, tag_flags, JBD2_MAGIC};

use crate::journal::Journal;
use crate::recovery::{commit_ok, descriptor_tags, tag_ok, tail_ok};

/// One logged copy named by a descriptor tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedBlock {
    /// The filesystem block it is a copy of.
    pub fs_block: u64,
    /// The journal block holding the copy.
    pub log_block: u32,
    /// `t_flags` (escape, same UUID, deleted, last tag).
    pub flags: u32,
    /// Whether the tag's data checksum matches (true without checksums).
    pub checksum_ok: bool,
}

/// One transaction of the log as the walk found it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Transaction {
    /// Its sequence number.
    pub sequence: u32,
    /// Descriptor blocks: (journal block, tail checksum ok).
    pub descriptors: Vec<(u32, bool)>,
    /// The logged copies, in log order.
    pub blocks: Vec<LoggedBlock>,
    /// Revoke blocks: (journal block, tail checksum ok, revoked fs blocks).
    pub revokes: Vec<(u32, bool, Vec<u64>)>,
    /// The commit block: (journal block, checksum ok, seconds, nanoseconds);
    /// none when the log ends before it (an uncommitted transaction).
    pub commit: Option<(u32, bool, u64, u32)>,
}

/// How the walk ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The log is empty (`s_start` is 0: cleanly unmounted).
    Empty,
    /// A block without the journal magic.
    NoMagic(u32),
    /// A journal block of another sequence.
    OtherSequence {
        /// Where.
        block: u32,
        /// What it had.
        found: u32,
        /// What was expected.
        expected: u32,
    },
    /// A journal block of a type that is not descriptor, commit or revoke.
    UnexpectedType {
        /// Where.
        block: u32,
        /// Its `h_blocktype`.
        blocktype: u32,
    },
    /// A block could not be read (past the journal, a hole).
    Unreadable {
        /// Where.
        block: u32,
        /// Why.
        error: String,
    },
    /// The walk went round the whole journal without ending.
    Loops,
}

/// The whole listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing {
    /// `s_start`: where the log begins (0 if empty).
    pub start_block: u32,
    /// `s_sequence`: the first transaction expected.
    pub start_sequence: u32,
    /// Transactions in log order.
    pub transactions: Vec<Transaction>,
    /// How the log ended.
    pub end: End,
    /// Fast-commit records, block by block: (journal block, records).
    pub fast_commits: Vec<(u32, Vec<Record>)>,
}

/// Walk the log of `journal`.
pub fn list(journal: &Journal) -> Listing {
    let bs = journal.block_size;
    let mut out = Listing {
        start_block: journal.sb.start,
        start_sequence: journal.sb.sequence,
        transactions: Vec::new(),
        end: End::Empty,
        fast_commits: Vec::new(),
    };
    let mut buf = vec![0u8; bs];
    let mut data = vec![0u8; bs];
    let mut seq = journal.sb.sequence;
    if journal.sb.start != 0 {
        let mut blk = journal.sb.start;
        let mut cur = Transaction {
            sequence: seq,
            ..Default::default()
        };
        let mut steps = 0u64;
        out.end = loop {
            steps += 1;
            if steps > 2 * journal.total_len as u64 + 16 {
                break End::Loops;
            }
            if let Err(e) = journal.read_block(blk, &mut buf) {
                break End::Unreadable {
                    block: blk,
                    error: e.to_string(),
                };
            }
            if be32(&buf, 0) != JBD2_MAGIC {
                break End::NoMagic(blk);
            }
            let (blocktype, sequence) = (be32(&buf, 4), be32(&buf, 8));
            if sequence != seq {
                break End::OtherSequence {
                    block: blk,
                    found: sequence,
                    expected: seq,
                };
            }
            match blocktype {
                1 => {
                    cur.descriptors.push((blk, tail_ok(journal, &buf)));
                    blk = journal.wrap(blk + 1);
                    for tag in descriptor_tags(journal, &buf) {
                        let ok = journal
                            .read_block(blk, &mut data)
                            .is_ok_and(|()| tag_ok(journal, &tag, &data, sequence));
                        cur.blocks.push(LoggedBlock {
                            fs_block: tag.blocknr,
                            log_block: blk,
                            flags: tag.flags,
                            checksum_ok: ok,
                        });
                        blk = journal.wrap(blk + 1);
                    }
                }
                2 => {
                    let secs = u64::from_be_bytes(buf[0x30..0x38].try_into().unwrap_or([0; 8]));
                    let nsec = be32(&buf, 0x38);
                    cur.commit = Some((blk, commit_ok(journal, &buf), secs, nsec));
                    out.transactions.push(std::mem::take(&mut cur));
                    seq = seq.wrapping_add(1);
                    cur.sequence = seq;
                    blk = journal.wrap(blk + 1);
                }
                5 => {
                    let rec_len = if journal.fmt.bit64 { 8 } else { 4 };
                    let max = (be32(&buf, 12) as usize).min(bs);
                    let mut revoked = Vec::new();
                    let mut off = 16;
                    while off + rec_len <= max {
                        revoked.push(if rec_len == 4 {
                            be32(&buf, off) as u64
                        } else {
                            u64::from_be_bytes(buf[off..off + 8].try_into().unwrap_or([0; 8]))
                        });
                        off += rec_len;
                    }
                    cur.revokes.push((blk, tail_ok(journal, &buf), revoked));
                    blk = journal.wrap(blk + 1);
                }
                t => {
                    break End::UnexpectedType {
                        block: blk,
                        blocktype: t,
                    }
                }
            }
        };
        if !cur.descriptors.is_empty() || !cur.revokes.is_empty() {
            out.transactions.push(cur);
        }
    }
    if journal.fast_commit() {
        let mut blk = journal.fc_first;
        'blocks: while blk < journal.fc_last {
            if journal.read_block(blk, &mut buf).is_err() {
                break;
            }
            let mut recs = Vec::new();
            let mut done = false;
            for r in fast_commit::records(&buf) {
                let Ok(r) = r else {
                    done = true;
                    break;
                };
                let stale = match r.record {
                    Record::Head { tid, .. } | Record::Tail { tid, .. } => tid < seq,
                    Record::Unknown(_) => {
                        done = true;
                        break;
                    }
                    _ => false,
                };
                recs.push(r.record);
                if stale {
                    done = true;
                    break;
                }
            }
            if !recs.is_empty() {
                out.fast_commits.push((blk, recs));
            }
            if done {
                break 'blocks;
            }
            blk += 1;
        }
    }
    out
}

/// Whether a tag's flags say the copy was escaped.
pub fn escaped(flags: u32) -> bool {
    flags & tag_flags::ESCAPE != 0
}
