//! Writing the log (fs/jbd2/commit.c's `jbd2_journal_commit_transaction`,
//! journal.c's tail and superblock updates): a committed transaction is
//! laid out as revoke blocks, descriptor blocks each followed by the
//! copies its tags name, and a commit block; the journal superblock says
//! where recovery must start.
//!
//! Ordering, which is what makes a commit atomic on a disk whose cache
//! may reorder and drop writes until a flush:
//!
//! 1. if the log was empty, the journal superblock first gets `s_start`
//!    (where this transaction begins) and `s_sequence` (its id);
//! 2. the revoke, descriptor and copy blocks;
//! 3. a flush: all of that (and, in ordered mode, the file data the
//!    transaction's metadata points at, which the caller wrote before) is
//!    durable;
//! 4. the commit block;
//! 5. a flush: the transaction is committed.
//!
//! A crash before 5 leaves a transaction without a durable commit block,
//! which recovery does not replay (its checksums, when the journal has
//! them, also catch a commit block that landed with torn contents). The
//! caller must have `needs_recovery` set in the filesystem superblock
//! before the first commit of an empty log reaches the disk — without it
//! neither the kernel nor e2fsck looks at the journal.
//!
//! Space: the log is the area `first..last`. Transactions are written at
//! the head, one after another; when the next one does not fit before
//! `last`, the caller checkpoints (writes every committed block home and
//! flushes) and calls [`Log::checkpointed`], which empties the log and
//! brings the head back to `first`. So a transaction never wraps round the
//! end of the log. Recovery handles wrapped logs (the kernel writes them),
//! but e2fsprogs 1.47's recovery wraps a fast-commit journal at the end of
//! the fast-commit area instead of the log's (`wrap()` with `j_fc_last`)
//! and would lose a wrapped transaction: not wrapping keeps every journal
//! we write replayable by e2fsck, the kernel and ourselves alike.

use std::io;

use ext4kit_format::jbd2::{
    escape, features, tag_data_checksum, tag_flags, BlockTag, BlockType, CommitHeader, DescriptorBlock, JournalHeader,
    RevokeBlock, BLOCK_TAIL_SIZE, CHECKSUM_CRC32C, JBD2_MAGIC,
};

use crate::journal::Journal;

/// A journal being written.
pub struct Log {
    journal: Journal,
    /// Next log block to write.
    head: u32,
    /// Id of the next transaction to commit.
    next_tid: u32,
    /// Whether the on-disk journal superblock says the log is empty
    /// (`s_start == 0`).
    empty_on_disk: bool,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("head", &self.head)
            .field("next_tid", &self.next_tid)
            .field("empty", &self.empty_on_disk)
            .finish()
    }
}

/// Where a committed transaction went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// Its id.
    pub tid: u32,
    /// Log blocks it took (revokes, descriptors, copies, commit).
    pub blocks: u32,
}

/// The log blocks of a transaction being laid out: where the next one
/// goes, and the (log block, bytes) pairs so far.
struct LogBlocks {
    pos: u32,
    blocks: Vec<(u32, Vec<u8>)>,
}

impl LogBlocks {
    /// The position of the next log block.
    fn next(&mut self) -> u32 {
        let p = self.pos;
        self.pos += 1;
        p
    }
}

impl Log {
    /// Start writing `journal`, whose log must be empty (cleanly unmounted
    /// or just recovered). The first transaction gets id `s_sequence`.
    /// `want` are the INCOMPAT features the filesystem's writer uses (the
    /// kernel sets 64bit and checksum v3 at mount when the filesystem has
    /// 64bit and metadata_csum; revoke always): they are added to the
    /// in-memory journal superblock now, with the checksum type and seed
    /// they imply, and reach the disk with the first commit, which writes
    /// the superblock before any of its blocks anyway (to point `s_start`
    /// at itself). Starting a log writes nothing: the on-disk superblock
    /// already says "empty" (`s_start` 0), so until something commits an
    /// image whose every operation is refused stays byte-identical.
    pub fn start(mut journal: Journal, want: u32) -> io::Result<Log> {
        if journal.sb.start != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the journal's log is not empty: recover it before writing",
            ));
        }
        if journal.sb.h_blocktype != BlockType::SuperblockV2 as u32 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a version 1 journal superblock: ext4kit writes version 2 journals only",
            ));
        }
        let mut sb = journal.sb;
        let add = want & !sb.feature_incompat;
        if add != 0 {
            sb.feature_incompat |= add;
            if sb.has_incompat(features::INCOMPAT_CSUM_V3) {
                // Checksum v3 replaces v2 and the v1 crc32.
                sb.feature_incompat &= !features::INCOMPAT_CSUM_V2;
                sb.feature_compat &= !features::COMPAT_CHECKSUM;
                sb.checksum_type = CHECKSUM_CRC32C;
            }
            journal.sb = sb;
            journal.fmt = sb.tag_format();
            journal.seed = sb.csum_v2or3().then(|| sb.csum_seed());
        }
        let first = journal.first;
        let next_tid = sb.sequence;
        Ok(Log {
            journal,
            head: first,
            next_tid,
            empty_on_disk: true,
        })
    }

    /// The journal being written.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Id of the next transaction.
    pub fn next_tid(&self) -> u32 {
        self.next_tid
    }

    /// Whether no transaction is live (everything committed is home).
    pub fn is_empty(&self) -> bool {
        self.empty_on_disk
    }

    /// Blocks of the main log.
    pub fn capacity(&self) -> u32 {
        self.journal.last - self.journal.first
    }

    /// Blocks free from the head to the end of the log.
    pub fn free(&self) -> u32 {
        self.journal.last - self.head
    }

    /// Tags that fit in one descriptor block: the first carries the
    /// journal's UUID, the rest say "same UUID".
    fn tags_per_descriptor(&self) -> usize {
        let bs = self.journal.block_size;
        let room = bs
            - JournalHeader::SIZE
            - if self.journal.fmt.has_tail() {
                BLOCK_TAIL_SIZE
            } else {
                0
            };
        let t = self.journal.fmt.tag_size();
        (room - 16) / t
    }

    fn revokes_per_block(&self) -> usize {
        let bs = self.journal.block_size;
        let room = bs
            - 16
            - if self.journal.fmt.has_tail() {
                BLOCK_TAIL_SIZE
            } else {
                0
            };
        room / if self.journal.fmt.bit64 { 8 } else { 4 }
    }

    /// Log blocks a transaction of `blocks` copies and `revokes` revoke
    /// records takes.
    pub fn space_needed(&self, blocks: usize, revokes: usize) -> u32 {
        let desc = blocks.div_ceil(self.tags_per_descriptor());
        let rev = revokes.div_ceil(self.revokes_per_block());
        (desc + blocks + rev + 1) as u32
    }

    /// Write the journal superblock: `s_start = start` (0: empty log),
    /// `s_sequence` the first transaction recovery should look for.
    fn write_superblock(&mut self, start: u32) -> io::Result<()> {
        let mut sb = self.journal.sb;
        sb.start = start;
        sb.sequence = self.next_tid;
        sb.errno = 0;
        self.journal.sb = sb;
        let bytes = sb.to_bytes_with_checksum();
        let at = self
            .journal
            .device_offset(0)
            .ok_or_else(|| io::Error::other("journal block 0 is not mapped"))?;
        self.journal.device().write_at(at, &bytes)?;
        self.empty_on_disk = start == 0;
        Ok(())
    }

    /// Commit one transaction: `blocks` are (filesystem block, contents as
    /// of the commit) pairs, `revokes` the filesystem blocks whose earlier
    /// logged copies must not be replayed, `time` the commit time
    /// (seconds, nanoseconds). Returns once the commit block is durable.
    /// The caller has checked [`Log::free`] against [`Log::space_needed`].
    /// The steps are the module doc's, in its order.
    pub fn commit(&mut self, blocks: &[(u64, &[u8])], revokes: &[u64], time: (u64, u32)) -> io::Result<Committed> {
        let need = self.space_needed(blocks.len(), revokes.len());
        if need > self.free() {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "a transaction of {need} log blocks does not fit the {} free (checkpoint first)",
                    self.free()
                ),
            ));
        }
        let tid = self.next_tid;
        if self.empty_on_disk {
            // Recovery must find this transaction: point the superblock at
            // it before anything of it can be durable (the flush below
            // covers the superblock too).
            self.write_superblock(self.head)?;
        }
        // Never past `last`: `need <= free()` was checked above.
        let mut out = LogBlocks {
            pos: self.head,
            blocks: Vec::with_capacity(need as usize),
        };
        self.revoke_records(tid, revokes, &mut out)?;
        let crc32 = self.metadata_blocks(tid, blocks, &mut out)?;
        self.write_blocks(&out.blocks)?;
        // Everything but the commit block durable before the commit block
        // is written: a commit block can never be durable without them.
        self.journal.device().flush()?;
        let commit_at = out.next();
        self.write_blocks(&[(commit_at, self.commit_block(tid, time, crc32))])?;
        self.journal.device().flush()?;
        self.head = out.pos;
        self.next_tid = tid.wrapping_add(1);
        Ok(Committed { tid, blocks: need })
    }

    /// The revoke blocks of transaction `tid`.
    fn revoke_records(&self, tid: u32, revokes: &[u64], out: &mut LogBlocks) -> io::Result<()> {
        let bs = self.journal.block_size;
        for chunk in revokes.chunks(self.revokes_per_block().max(1)) {
            let mut b = vec![0u8; bs];
            RevokeBlock {
                sequence: tid,
                blocks: chunk.to_vec(),
            }
            .serialize_into(&mut b, self.journal.fmt, self.journal.seed)
            .map_err(io::Error::other)?;
            let at = out.next();
            out.blocks.push((at, b));
        }
        Ok(())
    }

    /// The descriptor blocks of transaction `tid`, each followed by the
    /// copies its tags name (escaped where they begin with the journal's
    /// magic). Returns the checksum v1 crc32 of all of them (only used
    /// when the journal has checksum v1).
    fn metadata_blocks(&self, tid: u32, blocks: &[(u64, &[u8])], out: &mut LogBlocks) -> io::Result<u32> {
        let bs = self.journal.block_size;
        let seed = self.journal.seed;
        let v1 = self.journal.v1_checksum();
        let mut crc32 = !0u32;
        for chunk in blocks.chunks(self.tags_per_descriptor().max(1)) {
            let mut copies = Vec::with_capacity(chunk.len());
            let mut tags = Vec::with_capacity(chunk.len());
            for (i, &(fs_block, data)) in chunk.iter().enumerate() {
                let mut copy = data.to_vec();
                let escaped = escape(&mut copy);
                let mut flags = if i > 0 { tag_flags::SAME_UUID } else { 0 };
                if escaped {
                    flags |= tag_flags::ESCAPE;
                }
                if i == chunk.len() - 1 {
                    flags |= tag_flags::LAST_TAG;
                }
                tags.push(BlockTag {
                    blocknr: fs_block,
                    flags,
                    checksum: seed.map_or(0, |s| tag_data_checksum(s, tid, &copy)),
                    uuid: (i == 0).then_some(self.journal.sb.uuid),
                });
                copies.push(copy);
            }
            let mut d = vec![0u8; bs];
            DescriptorBlock {
                header: JournalHeader::new(BlockType::Descriptor, tid),
                tags,
            }
            .serialize_into(&mut d, self.journal.fmt, seed)
            .map_err(io::Error::other)?;
            if v1 {
                crc32 = crate::recovery::crc32_be(crc32, &d);
                for c in &copies {
                    crc32 = crate::recovery::crc32_be(crc32, c);
                }
            }
            let at = out.next();
            out.blocks.push((at, d));
            for c in copies {
                let at = out.next();
                out.blocks.push((at, c));
            }
        }
        Ok(crc32)
    }

    /// The commit block of transaction `tid` (with the v1 checksum `crc32`
    /// when the journal has checksum v1).
    fn commit_block(&self, tid: u32, time: (u64, u32), crc32: u32) -> Vec<u8> {
        let mut c = vec![0u8; self.journal.block_size];
        let mut hdr = CommitHeader {
            h_magic: JBD2_MAGIC,
            h_blocktype: BlockType::Commit as u32,
            h_sequence: tid,
            chksum_type: 0,
            chksum_size: 0,
            padding: [0; 2],
            chksum: [0; 8],
            commit_sec: time.0,
            commit_nsec: time.1,
        };
        if self.journal.v1_checksum() {
            hdr.chksum_type = ext4kit_format::jbd2::CHECKSUM_CRC32;
            hdr.chksum_size = 4;
            hdr.chksum[0] = crc32;
        }
        hdr.serialize_block(&mut c, self.journal.seed);
        c
    }

    /// Everything committed has been written home and flushed by the
    /// caller: the log is empty. The superblock says so (`s_start = 0`,
    /// the next id) and is flushed, and the head goes back to `first`. The
    /// old transactions' blocks stay where they are, but their ids are
    /// older than any the superblock now asks for: recovery stops at them.
    pub fn checkpointed(&mut self) -> io::Result<()> {
        if !self.empty_on_disk {
            self.write_superblock(0)?;
            self.journal.device().flush()?;
        }
        self.head = self.journal.first;
        Ok(())
    }

    /// Write `(log block, bytes)` pairs, joining physically adjacent ones.
    fn write_blocks(&self, blocks: &[(u32, Vec<u8>)]) -> io::Result<()> {
        let bs = self.journal.block_size as u64;
        let mut i = 0;
        while i < blocks.len() {
            let start = self
                .journal
                .device_offset(blocks[i].0)
                .ok_or_else(|| io::Error::other(format!("journal block {} is not mapped", blocks[i].0)))?;
            let mut buf = blocks[i].1.clone();
            let mut j = i + 1;
            while j < blocks.len() && buf.len() < (1 << 20) {
                match self.journal.device_offset(blocks[j].0) {
                    Some(o) if o == start + buf.len() as u64 && blocks[j].0 == blocks[j - 1].0 + 1 => {
                        buf.extend_from_slice(&blocks[j].1);
                        j += 1;
                    }
                    _ => break,
                }
            }
            debug_assert_eq!(buf.len() as u64 % bs, 0);
            self.journal.device().write_at(start, &buf)?;
            i = j;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ext4kit_blockdev::{BlockDevice, MemDevice};
    use ext4kit_format::jbd2::JournalSuperblock;

    use super::*;
    use crate::journal::JournalMap;

    const BS: usize = 1024;
    const LEN: u32 = 1100;

    fn fresh(incompat: u32) -> (Arc<MemDevice>, Journal) {
        let dev = Arc::new(MemDevice::new(LEN as usize * BS));
        let sb = JournalSuperblock::new_internal(BS as u32, LEN, [3; 16], incompat);
        dev.write_at(0, &sb.to_bytes_with_checksum()).unwrap();
        let d: Arc<dyn BlockDevice> = dev.clone();
        let j = Journal::load(d, JournalMap::contiguous(0, LEN as u64), BS, LEN, true).unwrap();
        (dev, j)
    }

    fn reload(dev: &Arc<MemDevice>) -> Journal {
        let d: Arc<dyn BlockDevice> = dev.clone();
        Journal::load(d, JournalMap::contiguous(0, LEN as u64), BS, LEN, true).unwrap()
    }

    fn data(fill: u8) -> Vec<u8> {
        let mut v = vec![fill; BS];
        if fill == 0xC0 {
            v[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        }
        v
    }

    /// What recovery would write, read back as (fs block, first byte,
    /// escaped-magic restored).
    fn replayed(dev: &Arc<MemDevice>) -> Vec<(u64, Vec<u8>)> {
        let j = reload(dev);
        let r = crate::recover(&j);
        assert_eq!(r.failure, None, "{:?}", r.problems);
        let mut buf = vec![0u8; BS];
        r.replay
            .iter()
            .map(|(&b, l)| {
                j.read_block(l.log_block, &mut buf).unwrap();
                let mut v = buf.clone();
                if l.escaped {
                    v[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
                }
                (b, v)
            })
            .collect()
    }

    const V3_64: u32 = features::INCOMPAT_REVOKE | features::INCOMPAT_64BIT | features::INCOMPAT_CSUM_V3;

    #[test]
    fn what_is_committed_is_what_recovery_replays() {
        for want in [
            0,
            features::INCOMPAT_REVOKE,
            V3_64,
            features::INCOMPAT_REVOKE | features::INCOMPAT_CSUM_V3,
        ] {
            let (dev, j) = fresh(0);
            let mut log = Log::start(j, want).unwrap();
            let a = data(1);
            let b = data(0xC0);
            log.commit(
                &[(500, &a), (9_000_000_001 & if want & 2 != 0 { !0 } else { 0xffff }, &b)],
                &[],
                (10, 0),
            )
            .unwrap();
            let c = data(3);
            log.commit(&[(500, &c)], &[77], (11, 5)).unwrap();
            let got = replayed(&dev);
            assert_eq!(got.len(), 2, "{want:#x}");
            assert_eq!(got[0].0.min(got[1].0), 500);
            let b500 = got.iter().find(|g| g.0 == 500).unwrap();
            assert_eq!(b500.1, c, "{want:#x}: the newest copy wins");
            assert!(
                got.iter().any(|g| g.1 == b),
                "{want:#x}: the escaped block comes back whole"
            );
        }
    }

    /// Starting a log (a read-write open) writes nothing, even when it
    /// adds features; the first commit writes them with the superblock.
    #[test]
    fn starting_a_log_writes_nothing_until_the_first_commit() {
        let (dev, j) = fresh(0);
        let mut before = vec![0u8; LEN as usize * BS];
        dev.read_at(0, &mut before).unwrap();
        let mut log = Log::start(j, V3_64).unwrap();
        let mut after = vec![0u8; LEN as usize * BS];
        dev.read_at(0, &mut after).unwrap();
        assert!(before == after, "Log::start changed the device");
        assert_eq!(reload(&dev).sb.feature_incompat, 0);
        log.commit(&[(500, &data(1))], &[], (1, 0)).unwrap();
        assert_eq!(reload(&dev).sb.feature_incompat, V3_64);
        assert_eq!(replayed(&dev).len(), 1);
    }

    #[test]
    fn many_blocks_span_descriptors_and_revokes_hide_older_copies() {
        let (dev, j) = fresh(0);
        let mut log = Log::start(j, V3_64).unwrap();
        let bufs: Vec<Vec<u8>> = (0..200).map(|i| data(i as u8)).collect();
        let blocks: Vec<(u64, &[u8])> = bufs
            .iter()
            .enumerate()
            .map(|(i, d)| (1000 + i as u64, &d[..]))
            .collect();
        let c = log.commit(&blocks, &[], (1, 0)).unwrap();
        assert!(c.blocks > 203, "200 copies need several descriptors: {c:?}");
        let revokes: Vec<u64> = (1000..1100).collect();
        log.commit(&[], &revokes, (2, 0)).unwrap();
        let got = replayed(&dev);
        assert_eq!(got.len(), 100);
        assert!(got.iter().all(|g| g.0 >= 1100));
    }

    #[test]
    fn a_full_log_is_emptied_by_a_checkpoint_and_an_emptied_log_is_not_replayed() {
        let (dev, j) = fresh(0);
        let mut log = Log::start(j, V3_64).unwrap();
        let d = data(9);
        let mut n = 0u64;
        // Fill most of the log, checkpointing whenever it would not fit.
        for round in 0..60 {
            let blocks: Vec<(u64, &[u8])> = (0..30).map(|i| (2000 + i, &d[..])).collect();
            if log.free() < log.space_needed(blocks.len(), 0) {
                log.checkpointed().unwrap();
                n = 0;
            }
            log.commit(&blocks, &[], (round, 0)).unwrap();
            n += 1;
        }
        assert!(n > 0);
        let j = reload(&dev);
        let r = crate::recover(&j);
        assert_eq!(r.failure, None, "{:?}", r.problems);
        assert_eq!(
            r.end_transaction.wrapping_sub(r.start_transaction) as u64,
            n,
            "exactly the transactions since the last checkpoint replay"
        );
        log.checkpointed().unwrap();
        let j = reload(&dev);
        assert_eq!(j.sb.start, 0, "an emptied log is empty on disk");
        assert!(crate::recover(&j).replay.is_empty());
    }

    #[test]
    fn a_transaction_that_does_not_fit_is_refused_not_written() {
        let (_dev, j) = fresh(0);
        let mut log = Log::start(j, V3_64).unwrap();
        let d = data(1);
        let blocks: Vec<(u64, &[u8])> = (0..2000).map(|i| (i + 10, &d[..])).collect();
        let e = log.commit(&blocks, &[], (0, 0)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert!(log.is_empty());
    }
}
