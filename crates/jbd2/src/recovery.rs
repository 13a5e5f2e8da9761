//! Journal recovery: the three passes of fs/jbd2/recovery.c (e2fsprogs'
//! e2fsck/recovery.c is the same file), with their checksum and failure
//! rules, producing a *plan* instead of writing.
//!
//! - **Scan** walks the log from `s_start` with sequence `s_sequence`,
//!   transaction by transaction, and finds where the valid log ends: the
//!   first block that is not a journal block of the expected sequence, a
//!   commit whose checksum fails (and, without async commit, marks that
//!   transaction as the failed commit), or stale blocks detected by commit
//!   times going backwards. Then the fast-commit area is scanned for the
//!   fast commits that extend the last transaction.
//! - **Revoke** collects the revoke records of every transaction up to
//!   that end.
//! - **Replay** names, for each filesystem block, the newest logged copy
//!   not revoked and whose tag checksum holds.
//!
//! The plan ([`Recovery::replay`]) maps each filesystem block to the
//! journal block holding its final copy. The caller applies it: written
//! home for a read-write open, redirected in an in-memory overlay for a
//! read-only one (the image is never touched). Later copies of a block
//! replace earlier ones exactly as the kernel's successive buffer writes
//! do, so applying the plan equals replaying in log order.
//!
//! Failures follow the kernel: a pass that fails stops recovery (what the
//! replay pass had already named stays in the plan, as the kernel's
//! buffers were already written); a bad data-block checksum skips that
//! block and fails recovery at the end; every such event is a
//! [`Recovery::problems`] line in the kernel's words.

use std::collections::BTreeMap;

use ext4kit_format::fast_commit::{self, Record};
use ext4kit_format::jbd2::{
    be32, put_be32, tag_data_checksum, tag_flags, BlockTag, BlockType, BLOCK_TAIL_SIZE, JBD2_MAGIC,
};

use crate::journal::Journal;
use crate::revoke::{tid_geq, RevokeTable};

/// Where the final copy of a replayed filesystem block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logged {
    /// Journal block (logical, within the journal) holding the copy.
    pub log_block: u32,
    /// The transaction it was logged in.
    pub sequence: u32,
    /// The copy's first word was the journal magic and was zeroed when
    /// logged (`JBD2_FLAG_ESCAPE`): replay writes the magic back.
    pub escaped: bool,
}

/// Why recovery failed (the non-zero `err` of `jbd2_journal_recover`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A checksum failed where the kernel gives up (`-EFSBADCRC`).
    BadChecksum(String),
    /// The log is inconsistent (`-EINVAL`, `-EFSCORRUPTED`, `-EIO` from a
    /// pass ending elsewhere than the scan said).
    Corrupt(String),
    /// A journal block could not be read.
    Io(String),
    /// The fast-commit area uses something unknown (`-EOPNOTSUPP`).
    Unsupported(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::BadChecksum(s) | Failure::Corrupt(s) | Failure::Io(s) | Failure::Unsupported(s) => f.write_str(s),
        }
    }
}

/// What recovery found and what it would write.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// `s_sequence`: the first transaction looked for.
    pub start_transaction: u32,
    /// The first transaction *not* replayed (`info->end_transaction`).
    /// After recovery the journal restarts at `end_transaction + 1`.
    pub end_transaction: u32,
    /// Filesystem block → its final logged copy.
    pub replay: BTreeMap<u64, Logged>,
    /// Logged copies written (a block written twice counts twice).
    pub nr_replays: usize,
    /// Revoke records read.
    pub nr_revokes: usize,
    /// Logged copies skipped because revoked.
    pub nr_revoke_hits: usize,
    /// A transaction whose commit checksum failed without async commit
    /// (`j_failed_commit`): the log ends before it, and e2fsck sets the
    /// journal's `s_errno` so the filesystem is marked as having errors.
    pub failed_commit: Option<u32>,
    /// Fast-commit records to apply after the replayed blocks, in order
    /// (only those before the last valid tail).
    pub fast_commits: Vec<Record>,
    /// How many fast-commit records the scan accepted (the replay pass
    /// collects that many).
    pub fc_valid_records: usize,
    /// Recovery failed; what the plan holds was already "written".
    pub failure: Option<Failure>,
    /// Messages, in the kernel's and e2fsck's words.
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Scan,
    Revoke,
    Replay,
}

/// Run recovery over `journal` (whose `s_start` is non-zero: the log holds
/// something). Never writes.
pub fn recover(journal: &Journal) -> Recovery {
    let mut info = Recovery::default();
    if journal.sb.start == 0 {
        info.start_transaction = journal.sb.sequence;
        info.end_transaction = journal.sb.sequence;
        return info;
    }
    let mut revokes = RevokeTable::default();
    for pass in [Pass::Scan, Pass::Revoke, Pass::Replay] {
        if let Err(f) = do_one_pass(journal, &mut info, &mut revokes, pass) {
            info.failure = Some(f);
            break;
        }
    }
    info
}

/// Every descriptor tag as the kernel walks them (`count_tags` and the
/// replay loop): tags start while one fits before the tail; a tag without
/// `SAME_UUID` is followed by 16 bytes of UUID; `LAST_TAG` ends the list.
pub fn descriptor_tags(journal: &Journal, block: &[u8]) -> Vec<BlockTag> {
    let fmt = journal.fmt;
    let size = block.len() - if fmt.has_tail() { BLOCK_TAIL_SIZE } else { 0 };
    let tag_bytes = fmt.tag_size();
    let mut off = 12;
    let mut out = Vec::new();
    while off + tag_bytes <= size {
        let t = &block[off..off + tag_bytes];
        let lo = be32(t, 0) as u64;
        let (flags, hi, csum) = if fmt.csum_v3 {
            let hi = if fmt.bit64 { be32(t, 8) } else { 0 };
            // journal_block_tag3_t: the checksum is always at byte 12.
            let csum = be32(t, 12);
            // The kernel reads flags as the be16 at byte 6 for every
            // layout: the low half of tag3's be32 t_flags.
            (u16::from_be_bytes([t[6], t[7]]) as u32, hi, csum)
        } else {
            let csum = u16::from_be_bytes([t[4], t[5]]) as u32;
            let hi = if fmt.bit64 { be32(t, 8) } else { 0 };
            (u16::from_be_bytes([t[6], t[7]]) as u32, hi, csum)
        };
        off += tag_bytes;
        let uuid = if flags & tag_flags::SAME_UUID == 0 {
            let u = block.get(off..off + 16).and_then(|u| <[u8; 16]>::try_from(u).ok());
            off += 16;
            u
        } else {
            None
        };
        out.push(BlockTag {
            blocknr: (hi as u64) << 32 | lo,
            flags,
            checksum: csum,
            uuid,
        });
        if flags & tag_flags::LAST_TAG != 0 {
            break;
        }
    }
    out
}

/// `jbd2_descriptor_block_csum_verify` (true without checksums v2/v3).
pub fn tail_ok(journal: &Journal, block: &[u8]) -> bool {
    match journal.seed {
        None => true,
        Some(seed) => ext4kit_format::jbd2::verify_block_tail(block, seed, "journal block").is_ok(),
    }
}

/// `jbd2_commit_block_csum_verify` (true without checksums v2/v3).
pub fn commit_ok(journal: &Journal, block: &[u8]) -> bool {
    match journal.seed {
        None => true,
        Some(seed) => ext4kit_format::jbd2::CommitHeader::compute_checksum(block, seed) == be32(block, 0x10),
    }
}

/// `jbd2_block_tag_csum_verify` (true without checksums v2/v3).
pub fn tag_ok(journal: &Journal, tag: &BlockTag, data: &[u8], sequence: u32) -> bool {
    match journal.seed {
        None => true,
        Some(seed) => {
            let c = tag_data_checksum(seed, sequence, data);
            if journal.fmt.csum_v3 {
                c == tag.checksum
            } else {
                c & 0xffff == tag.checksum & 0xffff
            }
        }
    }
}

/// `crc32_be`, the big-endian CRC-32 (polynomial 0x04c11db7, no
/// reflection, no final xor) of checksum v1 transactions.
pub(crate) fn crc32_be(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc ^= (b as u32) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04c1_1db7
            } else {
                crc << 1
            };
        }
    }
    crc
}

fn read(journal: &Journal, lblk: u32, buf: &mut [u8]) -> Result<(), Failure> {
    journal
        .read_block(lblk, buf)
        .map_err(|e| Failure::Io(format!("JBD2: IO error recovering block {lblk} in log: {e}")))
}

/// What a pass does after one log block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Read the next block.
    Next,
    /// The log ends here (`goto done` / `break` out of the walk).
    End,
}

/// One pass's walk along the log: `do_one_pass`'s position and the state
/// its block handlers share.
struct LogWalk<'j> {
    journal: &'j Journal,
    pass: Pass,
    /// The transaction the next block must belong to.
    next_commit_id: u32,
    /// The next journal block to read.
    next_log_block: u32,
    /// Checksum v1: the running crc32_be of the transaction's blocks.
    crc32_sum: u32,
    /// A descriptor or revoke block failed its checksum in the scan: the
    /// next commit's time tells a damaged transaction from an older log's
    /// leftovers.
    need_check_commit_time: bool,
    /// Commit time of the last good commit the scan passed.
    last_trans_commit_time: u64,
    /// A data block failed its tag checksum: recovery fails at the end.
    block_error: bool,
    /// The latest failure that does not stop the walk (the kernel's
    /// `success`): the pass returns it at the end.
    failure: Option<Failure>,
    /// Blocks walked; a log longer than the journal goes round in circles.
    steps: u64,
    /// Buffer for the blocks a descriptor describes.
    obh: Vec<u8>,
}

/// One pass over the log (`do_one_pass`): read block after block from
/// `s_start` while each carries the journal magic and the expected
/// transaction's sequence, and hand it to its type's handler.
fn do_one_pass(journal: &Journal, info: &mut Recovery, revokes: &mut RevokeTable, pass: Pass) -> Result<(), Failure> {
    let mut walk = LogWalk::new(journal, pass);
    if pass == Pass::Scan {
        info.start_transaction = walk.next_commit_id;
    }
    let mut bh = vec![0u8; journal.block_size];
    loop {
        walk.count_step()?;
        if pass != Pass::Scan && tid_geq(walk.next_commit_id, info.end_transaction) {
            break;
        }
        let Some((blocktype, sequence)) = walk.next_block(&mut bh)? else {
            break;
        };
        let step = match BlockType::from_u32(blocktype) {
            Some(BlockType::Descriptor) => walk.descriptor_block(&bh, sequence, info, revokes)?,
            Some(BlockType::Commit) => walk.commit_block(&bh, info)?,
            Some(BlockType::Revoke) => walk.revoke_block(&bh, info, revokes)?,
            _ => Step::End,
        };
        if step == Step::End {
            break;
        }
    }
    walk.finish(info)
}

impl<'j> LogWalk<'j> {
    fn new(journal: &'j Journal, pass: Pass) -> Self {
        LogWalk {
            journal,
            pass,
            next_commit_id: journal.sb.sequence,
            next_log_block: journal.sb.start,
            crc32_sum: !0,
            need_check_commit_time: false,
            last_trans_commit_time: 0,
            block_error: false,
            failure: None,
            steps: 0,
            obh: vec![0u8; journal.block_size],
        }
    }

    /// A log longer than the journal means the walk is going round a
    /// corrupt log: the kernel would loop too; we stop.
    fn count_step(&mut self) -> Result<(), Failure> {
        self.steps += 1;
        let limit = 2 * self.journal.total_len as u64 + 16;
        if self.steps > limit {
            return Err(Failure::Corrupt(format!(
                "JBD2: the log does not end after {limit} blocks (corrupt log)"
            )));
        }
        Ok(())
    }

    /// Read the next log block into `bh`: its block type and sequence, or
    /// `None` where the log ends — a block without the journal magic, or
    /// of another transaction than the one expected.
    fn next_block(&mut self, bh: &mut [u8]) -> Result<Option<(u32, u32)>, Failure> {
        read(self.journal, self.next_log_block, bh)?;
        self.next_log_block = self.journal.wrap(self.next_log_block + 1);
        if be32(bh, 0) != JBD2_MAGIC || be32(bh, 8) != self.next_commit_id {
            return Ok(None);
        }
        Ok(Some((be32(bh, 4), be32(bh, 8))))
    }

    /// A descriptor block and the blocks it describes: summed by the
    /// scan of a checksum v1 journal, replayed by the replay pass, skipped
    /// otherwise.
    fn descriptor_block(
        &mut self,
        bh: &[u8],
        sequence: u32,
        info: &mut Recovery,
        revokes: &RevokeTable,
    ) -> Result<Step, Failure> {
        self.check_descriptor_tail(bh)?;
        let tags = descriptor_tags(self.journal, bh);
        match self.pass {
            Pass::Replay => self.replay_tags(&tags, sequence, info, revokes),
            Pass::Scan if self.journal.v1_checksum() && !self.need_check_commit_time && info.end_transaction == 0 => {
                self.calc_chksums(bh, tags.len(), info)
            }
            _ => self.next_log_block = self.journal.wrap(self.next_log_block + tags.len() as u32),
        }
        Ok(Step::Next)
    }

    /// `jbd2_descriptor_block_csum_verify`: a descriptor whose tail
    /// checksum fails during the scan may be a block of an older log left
    /// past the end, which the next commit's time decides; in a later pass
    /// (the scan accepted it) it fails recovery with -EFSBADCRC.
    fn check_descriptor_tail(&mut self, bh: &[u8]) -> Result<(), Failure> {
        if tail_ok(self.journal, bh) {
            return Ok(());
        }
        if self.pass != Pass::Scan {
            return Err(Failure::BadChecksum(format!(
                "JBD2: Invalid checksum recovering block {} in log",
                self.next_log_block
            )));
        }
        self.need_check_commit_time = true;
        Ok(())
    }

    /// `calc_chksums`: checksum v1's crc32_be of a transaction covers its
    /// descriptors and every block they describe; the commit block holds
    /// the sum. A read error ends this descriptor's sum (C's `break`
    /// inside the `case`), not the walk.
    fn calc_chksums(&mut self, bh: &[u8], count: usize, info: &mut Recovery) {
        self.crc32_sum = crc32_be(self.crc32_sum, bh);
        for _ in 0..count {
            let io_block = self.next_log_block;
            self.next_log_block = self.journal.wrap(self.next_log_block + 1);
            if let Err(e) = read(self.journal, io_block, &mut self.obh) {
                info.problems.push(e.to_string());
                break;
            }
            self.crc32_sum = crc32_be(self.crc32_sum, &self.obh);
        }
    }

    /// The replay pass's write, as a plan: each described block's copy
    /// becomes the newest one of its filesystem block, unless a revoke
    /// record of this or a later transaction covers it
    /// (`jbd2_journal_test_revoke`). A copy that cannot be read, or whose
    /// tag checksum fails (`jbd2_block_tag_csum_verify`), is skipped and
    /// fails recovery once the pass ends.
    fn replay_tags(&mut self, tags: &[BlockTag], sequence: u32, info: &mut Recovery, revokes: &RevokeTable) {
        for tag in tags {
            let io_block = self.next_log_block;
            self.next_log_block = self.journal.wrap(self.next_log_block + 1);
            if let Err(e) = read(self.journal, io_block, &mut self.obh) {
                info.problems.push(e.to_string());
                self.failure = Some(e);
                continue;
            }
            let blocknr = tag.blocknr;
            if revokes.test(blocknr, self.next_commit_id) {
                info.nr_revoke_hits += 1;
                continue;
            }
            if !tag_ok(self.journal, tag, &self.obh, sequence) {
                let msg = format!("JBD2: Invalid checksum recovering data block {blocknr} in log");
                info.problems.push(msg.clone());
                self.failure = Some(Failure::BadChecksum(msg));
                self.block_error = true;
                continue;
            }
            let escaped = tag.flags & tag_flags::ESCAPE != 0;
            let logged = Logged {
                log_block: io_block,
                sequence,
                escaped,
            };
            info.replay.insert(blocknr, logged);
            info.nr_replays += 1;
        }
    }

    /// A commit block closes the expected transaction: the walk moves on
    /// to the next sequence unless its checksum fails. In recovery.c the
    /// `break`s of this case leave the `switch`, not the walk: after a
    /// failed commit the next block is read with the same expected
    /// sequence (and normally ends the walk by not matching).
    fn commit_block(&mut self, bh: &[u8], info: &mut Recovery) -> Result<Step, Failure> {
        let commit_time = u64::from_be_bytes(bh[0x30..0x38].try_into().unwrap_or([0; 8]));
        if self.need_check_commit_time {
            return self.check_commit_time(commit_time);
        }
        let mut chksum_error = false;
        if self.pass == Pass::Scan && self.journal.v1_checksum() {
            if info.end_transaction != 0 {
                info.failed_commit = Some(info.end_transaction);
                return Ok(Step::Next);
            }
            chksum_error = !self.commit_v1_sum_ok(bh);
        }
        if chksum_error || (self.pass == Pass::Scan && !commit_ok(self.journal, bh)) {
            if commit_time < self.last_trans_commit_time {
                // ignore_crc_mismatch: an older journal's block.
                return Ok(Step::End);
            }
            info.end_transaction = self.next_commit_id;
            if !self.journal.async_commit() {
                info.failed_commit = Some(self.next_commit_id);
                return Ok(Step::Next);
            }
        }
        if self.pass == Pass::Scan {
            self.last_trans_commit_time = commit_time;
        }
        self.next_commit_id = self.next_commit_id.wrapping_add(1);
        Ok(Step::Next)
    }

    /// After a descriptor or revoke block whose checksum failed in the
    /// scan, the commit's time decides: no older than the last good
    /// commit, the transaction is damaged (-EFSBADCRC); older, the blocks
    /// are a previous log's leftovers and the log ends here.
    fn check_commit_time(&self, commit_time: u64) -> Result<Step, Failure> {
        if commit_time >= self.last_trans_commit_time {
            return Err(Failure::BadChecksum(format!(
                "JBD2: Invalid checksum found in transaction {}",
                self.next_commit_id
            )));
        }
        Ok(Step::End)
    }

    /// Checksum v1: the commit's `h_chksum[0]` equals the transaction's
    /// crc32_be sum (`h_chksum_type` 1, `h_chksum_size` 4), or the commit
    /// carries no checksum at all (type, size and value zero). The sum
    /// starts afresh for the next transaction.
    fn commit_v1_sum_ok(&mut self, bh: &[u8]) -> bool {
        let found = be32(bh, 0x10);
        let (ctype, csize) = (bh[0xC], bh[0xD]);
        let ok = (self.crc32_sum == found && ctype == 1 && csize == 4) || (ctype == 0 && csize == 0 && found == 0);
        self.crc32_sum = !0;
        ok
    }

    /// A revoke block: its checksum is checked by the scan (a failure
    /// makes the next commit's time decide, as for descriptors); its
    /// records are collected by the revoke pass.
    fn revoke_block(&mut self, bh: &[u8], info: &mut Recovery, revokes: &mut RevokeTable) -> Result<Step, Failure> {
        if self.pass == Pass::Scan && !tail_ok(self.journal, bh) {
            self.need_check_commit_time = true;
        }
        if self.pass == Pass::Revoke {
            scan_revoke_records(self.journal, bh, self.next_commit_id, info, revokes)?;
        }
        Ok(Step::Next)
    }

    /// The end of a pass (`done:`): the scan fixes where the log ends; a
    /// later pass must end at the same transaction. Then the fast-commit
    /// area (scan and replay passes), and the pass's deferred failure.
    fn finish(mut self, info: &mut Recovery) -> Result<(), Failure> {
        let pass = self.pass;
        if pass == Pass::Scan {
            if info.end_transaction == 0 {
                info.end_transaction = self.next_commit_id;
            }
        } else if info.end_transaction != self.next_commit_id {
            let msg = format!(
                "JBD2: recovery pass {} ended at transaction {}, expected {}",
                pass as u8, self.next_commit_id, info.end_transaction
            );
            info.problems.push(msg.clone());
            if self.failure.is_none() {
                self.failure = Some(Failure::Corrupt(msg));
            }
        }
        if self.journal.fast_commit() && pass != Pass::Revoke {
            if let Err(f) = fc_do_one_pass(self.journal, info, pass) {
                info.problems.push(f.to_string());
                self.failure = Some(f);
            }
        }
        if self.block_error && self.failure.is_none() {
            self.failure = Some(Failure::Io("JBD2: data block checksum errors".into()));
        }
        match self.failure {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }
}

/// `scan_revoke_records`: a revoke block holds `r_count` bytes of records
/// after its 16-byte header, each a filesystem block number (8 bytes with
/// 64bit, else 4) whose copies in this and earlier transactions must not
/// be replayed. A count past the block (less its checksum tail) is a
/// corrupt log.
fn scan_revoke_records(
    journal: &Journal,
    bh: &[u8],
    sequence: u32,
    info: &mut Recovery,
    revokes: &mut RevokeTable,
) -> Result<(), Failure> {
    let csum_size = if journal.fmt.has_tail() { BLOCK_TAIL_SIZE } else { 0 };
    let rcount = be32(bh, 12) as usize;
    if rcount > journal.block_size - csum_size {
        return Err(Failure::Corrupt(format!(
            "JBD2: revoke block of transaction {sequence} claims {rcount} bytes of records"
        )));
    }
    let record_len = if journal.fmt.bit64 { 8 } else { 4 };
    let mut offset = 16;
    while offset + record_len <= rcount {
        let blocknr = if record_len == 4 {
            be32(bh, offset) as u64
        } else {
            u64::from_be_bytes(bh[offset..offset + 8].try_into().unwrap_or([0; 8]))
        };
        offset += record_len;
        revokes.set(blocknr, sequence);
        info.nr_revokes += 1;
    }
    Ok(())
}

/// State of the fast-commit scan (`e2fsck_fc_replay_state`).
#[derive(Default)]
struct FcScan {
    expected_off: u32,
    num_tags: usize,
    cur_tag: usize,
    crc: u32,
}

/// `fc_do_one_pass` with e2fsck's callback (`ext4_fc_replay_scan` /
/// `ext4_fc_replay`): the scan pass finds how many records end in a valid
/// tail of the expected transaction; the replay pass hands those records
/// over.
fn fc_do_one_pass(journal: &Journal, info: &mut Recovery, pass: Pass) -> Result<(), Failure> {
    let expected = info.end_transaction;
    let bs = journal.block_size;
    let mut buf = vec![0u8; bs];
    if pass == Pass::Scan {
        let mut st = FcScan::default();
        let mut blk = journal.fc_first;
        while blk <= journal.fc_last {
            if journal.read_block(blk, &mut buf).is_err() {
                break;
            }
            let off = blk - journal.fc_first;
            blk += 1;
            match fc_scan_block(&mut st, &buf, off, expected)? {
                FcStep::Continue => {}
                FcStep::Stop => break,
            }
        }
        info.fast_commits.clear();
        info.fc_valid_records = st.num_tags;
        return Ok(());
    }
    let mut left = info.fc_valid_records;
    let mut blk = journal.fc_first;
    while left > 0 && blk <= journal.fc_last {
        if journal.read_block(blk, &mut buf).is_err() {
            break;
        }
        blk += 1;
        for r in fast_commit::records(&buf) {
            if left == 0 {
                break;
            }
            let Ok(r) = r else { break };
            left -= 1;
            info.fast_commits.push(r.record);
        }
    }
    Ok(())
}

enum FcStep {
    Continue,
    Stop,
}

fn fc_scan_block(st: &mut FcScan, block: &[u8], off: u32, expected: u32) -> Result<FcStep, Failure> {
    let recs = fast_commit::records(block);
    if st.expected_off == 0 {
        *st = FcScan::default();
        let first_is_head = matches!(recs.first(), Some(Ok(r)) if r.tag == fast_commit::TAG_HEAD);
        if !first_is_head {
            return Ok(FcStep::Stop);
        }
    }
    if off != st.expected_off {
        return Err(Failure::Corrupt(format!(
            "fast commit block {off} out of order (expected {})",
            st.expected_off
        )));
    }
    st.expected_off += 1;
    let stop_or = |st: &FcScan, f: Failure| if st.num_tags > 0 { Ok(FcStep::Stop) } else { Err(f) };
    for r in recs {
        let r = match r {
            Ok(r) => r,
            Err(e) => return stop_or(st, Failure::Corrupt(format!("fast commit area: {e}"))),
        };
        match r.record {
            Record::AddRange { .. }
            | Record::DelRange { .. }
            | Record::Dentry { .. }
            | Record::Inode { .. }
            | Record::Pad => {
                st.cur_tag += 1;
                st.crc = ext4kit_format::checksum::crc32c(st.crc, r.checksummed());
            }
            Record::Tail { tid, crc } => {
                st.cur_tag += 1;
                st.crc = ext4kit_format::checksum::crc32c(st.crc, r.checksummed());
                let ok = tid == expected && crc == st.crc;
                st.crc = 0;
                if ok {
                    st.num_tags = st.cur_tag;
                } else {
                    return stop_or(
                        st,
                        Failure::BadChecksum(format!(
                            "fast commit tail of transaction {tid} does not match (expected transaction {expected})"
                        )),
                    );
                }
            }
            Record::Head { features, tid } => {
                if features & !fast_commit::SUPPORTED_FEATURES != 0 {
                    return Err(Failure::Unsupported(format!(
                        "fast commit features {features:#x} are unknown"
                    )));
                }
                if tid != expected {
                    // e2fsprogs 1.47 fails recovery here (-EINVAL); the
                    // kernel stops the fast-commit scan (the area holds an
                    // older transaction's fast commits).
                    return Ok(FcStep::Stop);
                }
                st.cur_tag += 1;
                st.crc = ext4kit_format::checksum::crc32c(st.crc, r.checksummed());
            }
            Record::Unknown(t) => {
                return stop_or(st, Failure::Corrupt(format!("fast commit tag {t:#x} is unknown")));
            }
        }
    }
    Ok(FcStep::Continue)
}

/// The journal superblock bytes with `s_start` cleared and `s_sequence`
/// set (tests use it to build journals; recovery's callers use
/// [`Journal::reset_superblock`]).
#[doc(hidden)]
pub fn patch_superblock(sb: &mut [u8], start: u32, sequence: u32) {
    put_be32(sb, 0x1C, start);
    put_be32(sb, 0x18, sequence);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ext4kit_blockdev::{BlockDevice, MemDevice};
    use ext4kit_format::jbd2::{
        features, BlockType, CommitHeader, DescriptorBlock, JournalHeader, JournalSuperblock, RevokeBlock,
    };

    use super::*;
    use crate::journal::JournalMap;

    const BS: usize = 1024;
    const LEN: u32 = 1100;

    /// Writes a log into an in-memory journal the way jbd2 lays it out.
    struct Writer {
        dev: Arc<MemDevice>,
        sb: JournalSuperblock,
        pos: u32,
        seq: u32,
        time: u64,
    }

    impl Writer {
        fn new(incompat: u32, start: u32, seq: u32) -> Writer {
            let mut sb = JournalSuperblock::new_internal(BS as u32, LEN, [7; 16], incompat);
            sb.start = start;
            sb.sequence = seq;
            Writer {
                dev: Arc::new(MemDevice::new(LEN as usize * BS)),
                sb,
                pos: start,
                seq,
                time: 1000,
            }
        }
        fn seed(&self) -> Option<u32> {
            self.sb.csum_v2or3().then(|| self.sb.csum_seed())
        }
        fn put(&mut self, block: &[u8]) -> u32 {
            let at = self.pos;
            self.dev.write_at(at as u64 * BS as u64, block).unwrap();
            self.pos += 1;
            if self.pos >= LEN {
                self.pos = self.sb.first;
            }
            at
        }
        /// One transaction logging `blocks` (fs block, fill byte) and
        /// revoking `revoked`; `commit` false leaves it uncommitted.
        fn transaction(&mut self, blocks: &[(u64, u8)], revoked: &[u64], commit: bool) -> u32 {
            let fmt = self.sb.tag_format();
            let seed = self.seed();
            if !revoked.is_empty() {
                let mut b = vec![0u8; BS];
                RevokeBlock {
                    sequence: self.seq,
                    blocks: revoked.to_vec(),
                }
                .serialize_into(&mut b, fmt, seed)
                .unwrap();
                self.put(&b);
            }
            if !blocks.is_empty() {
                let tags = blocks
                    .iter()
                    .enumerate()
                    .map(|(i, &(blk, fill))| {
                        let mut data = vec![fill; BS];
                        if fill == 0xC0 {
                            data[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
                        }
                        let escaped = ext4kit_format::jbd2::escape(&mut data);
                        let mut flags = if i > 0 { tag_flags::SAME_UUID } else { 0 };
                        if escaped {
                            flags |= tag_flags::ESCAPE;
                        }
                        if i == blocks.len() - 1 {
                            flags |= tag_flags::LAST_TAG;
                        }
                        BlockTag {
                            blocknr: blk,
                            flags,
                            checksum: seed.map_or(0, |s| tag_data_checksum(s, self.seq, &data)),
                            uuid: (i == 0).then_some([7; 16]),
                        }
                    })
                    .collect();
                let mut d = vec![0u8; BS];
                DescriptorBlock {
                    header: JournalHeader::new(BlockType::Descriptor, self.seq),
                    tags,
                }
                .serialize_into(&mut d, fmt, seed)
                .unwrap();
                self.put(&d);
                for &(_, fill) in blocks {
                    let mut data = vec![fill; BS];
                    if fill == 0xC0 {
                        data[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
                    }
                    ext4kit_format::jbd2::escape(&mut data);
                    self.put(&data);
                }
            }
            let at = self.pos;
            if commit {
                self.time += 1;
                let mut c = vec![0u8; BS];
                CommitHeader {
                    h_magic: JBD2_MAGIC,
                    h_blocktype: BlockType::Commit as u32,
                    h_sequence: self.seq,
                    chksum_type: 0,
                    chksum_size: 0,
                    padding: [0; 2],
                    chksum: [0; 8],
                    commit_sec: self.time,
                    commit_nsec: 0,
                }
                .serialize_block(&mut c, seed);
                self.put(&c);
            }
            self.seq += 1;
            at
        }
        fn journal(&self) -> Journal {
            self.dev.write_at(0, &self.sb.to_bytes_with_checksum()).unwrap();
            let dev: Arc<dyn BlockDevice> = self.dev.clone();
            Journal::load(dev, JournalMap::contiguous(0, LEN as u64), BS, LEN, true).unwrap()
        }
    }

    fn fills(r: &Recovery, j: &Journal) -> Vec<(u64, u8)> {
        let mut buf = vec![0u8; BS];
        r.replay
            .iter()
            .map(|(&b, l)| {
                j.read_block(l.log_block, &mut buf).unwrap();
                (b, if l.escaped { 0xC0 } else { buf[100] })
            })
            .collect()
    }

    const V3: u32 = features::INCOMPAT_REVOKE | features::INCOMPAT_64BIT | features::INCOMPAT_CSUM_V3;

    #[test]
    fn committed_transactions_replay_newest_copy_last() {
        // Checksum v3 without 64-bit block numbers still has 16-byte tags
        // (the kernel's journal on ext4 with metadata_csum and ^64bit).
        let v3_32 = features::INCOMPAT_REVOKE | features::INCOMPAT_CSUM_V3;
        for incompat in [0, features::INCOMPAT_REVOKE, V3, v3_32, features::INCOMPAT_CSUM_V2] {
            let mut w = Writer::new(incompat, 1, 40);
            w.transaction(&[(500, 1), (501, 2)], &[], true);
            w.transaction(
                &[
                    (500, 3),
                    (9_000_000_000 & if incompat & 2 != 0 { u64::MAX } else { 0xffff }, 4),
                ],
                &[],
                true,
            );
            w.transaction(&[(502, 5)], &[], false); // never committed
            let j = w.journal();
            let r = recover(&j);
            assert_eq!(r.failure, None, "{incompat:#x}: {:?}", r.problems);
            assert_eq!((r.start_transaction, r.end_transaction), (40, 42));
            let got = fills(&r, &j);
            assert!(got.contains(&(500, 3)) && got.contains(&(501, 2)), "{got:?}");
            assert!(!got.iter().any(|&(b, _)| b == 502), "uncommitted block replayed");
            assert_eq!(r.nr_replays, 4);
        }
    }

    #[test]
    fn revokes_hide_older_copies_and_escaped_blocks_get_their_magic_back() {
        let mut w = Writer::new(V3, 1, 7);
        w.transaction(&[(600, 1), (601, 0xC0)], &[], true);
        w.transaction(&[(602, 2)], &[600, 602], true); // revokes 600 (older) and its own 602
        w.transaction(&[(602, 3)], &[], true); // newer than the revoke: replayed
        let j = w.journal();
        let r = recover(&j);
        assert_eq!(r.failure, None, "{:?}", r.problems);
        let got = fills(&r, &j);
        assert_eq!(got, vec![(601, 0xC0), (602, 3)]);
        assert!(r.replay[&601].escaped);
        assert_eq!(r.nr_revokes, 2);
        assert_eq!(r.nr_revoke_hits, 2);
    }

    #[test]
    fn the_log_wraps_at_the_end_of_the_journal() {
        let mut w = Writer::new(V3, LEN - 3, 100);
        w.transaction(&[(700, 1), (701, 2), (702, 3), (703, 4)], &[], true);
        w.transaction(&[(704, 5)], &[], true);
        let j = w.journal();
        let r = recover(&j);
        assert_eq!(r.failure, None, "{:?}", r.problems);
        assert_eq!(fills(&r, &j), vec![(700, 1), (701, 2), (702, 3), (703, 4), (704, 5)]);
        assert!(r.replay[&703].log_block < 10, "the fourth copy sits after the wrap");
    }

    #[test]
    fn a_bad_commit_checksum_ends_the_log_and_names_the_transaction() {
        let mut w = Writer::new(V3, 1, 10);
        w.transaction(&[(800, 1)], &[], true);
        let c = w.transaction(&[(801, 2)], &[], true);
        w.transaction(&[(802, 3)], &[], true);
        // Corrupt the second commit block.
        w.dev.write_at(c as u64 * BS as u64 + 200, &[0xFF]).unwrap();
        let j = w.journal();
        let r = recover(&j);
        assert_eq!(r.failed_commit, Some(11));
        assert_eq!(r.end_transaction, 11);
        assert_eq!(fills(&r, &j), vec![(800, 1)]);
        // With async commit the log goes on past it.
        let mut w = Writer::new(V3 | features::INCOMPAT_ASYNC_COMMIT, 1, 10);
        w.transaction(&[(800, 1)], &[], true);
        let c = w.transaction(&[(801, 2)], &[], true);
        w.dev.write_at(c as u64 * BS as u64 + 200, &[0xFF]).unwrap();
        let j = w.journal();
        let r = recover(&j);
        assert_eq!(r.failed_commit, None);
        assert_eq!(r.end_transaction, 11);
    }

    #[test]
    fn a_bad_data_checksum_skips_that_block_and_fails_recovery() {
        let mut w = Writer::new(V3, 1, 1);
        w.transaction(&[(900, 1), (901, 2)], &[], true);
        // The log starts at block 1 with the descriptor: the first logged
        // copy is journal block 2.
        w.dev.write_at(2 * BS as u64 + 5, &[0x55]).unwrap();
        let j = w.journal();
        let r = recover(&j);
        assert!(matches!(r.failure, Some(Failure::BadChecksum(_))), "{:?}", r.failure);
        assert_eq!(fills(&r, &j), vec![(901, 2)]);
        assert!(
            r.problems.iter().any(|p| p.contains("data block 900")),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn stale_blocks_after_the_log_are_not_replayed() {
        // An old log of a previous life of the journal: same sequence
        // numbers continue, but descriptor checksums do not match (other
        // uuid) and commit times go backwards.
        let mut w = Writer::new(V3, 1, 5);
        w.transaction(&[(1000, 1)], &[], true);
        let mut old = Writer::new(V3, w.pos, 6);
        old.sb.uuid = [9; 16];
        old.time = 10;
        old.transaction(&[(1001, 2)], &[], true);
        let stale = old.dev.to_vec();
        let from = w.pos as usize * BS;
        w.dev.write_at(from as u64, &stale[from..from + 3 * BS]).unwrap();
        let j = w.journal();
        let r = recover(&j);
        assert_eq!(r.failure, None, "{:?}", r.problems);
        assert_eq!(fills(&r, &j), vec![(1000, 1)]);
    }

    #[test]
    fn checksum_v1_transactions_verify_with_crc32_be() {
        // crc32_be seeded with ~0 and without a final xor is CRC-32/MPEG-2,
        // whose check value for "123456789" is 0x0376E6E7.
        assert_eq!(crc32_be(!0, b"123456789"), 0x0376_E6E7);
    }

    #[test]
    fn hostile_logs_end_without_panicking() {
        use proptest::prelude::*;
        let mut runner = proptest::test_runner::TestRunner::default();
        runner
            .run(&(prop::collection::vec((1u32..40, any::<u8>()), 1..60)), |flips| {
                let mut w = Writer::new(V3, 1, 1);
                for i in 0..6 {
                    w.transaction(&[(100 + i, i as u8), (200 + i, 7)], &[100 + i - 1], true);
                }
                for (blk, byte) in flips {
                    w.dev
                        .write_at(blk as u64 * BS as u64 + (byte as u64 * 3) % BS as u64, &[byte])
                        .unwrap();
                }
                let j = w.journal();
                let r = recover(&j);
                prop_assert!(r.replay.len() <= 12);
                Ok(())
            })
            .unwrap();
    }
}
