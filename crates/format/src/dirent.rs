//! Linear directory blocks: `struct ext4_dir_entry_2` records chained by
//! `rec_len`, optionally ending in a 12-byte checksum tail
//! (`struct ext4_dir_entry_tail`).
//!
//! Checked once, trusted after: a directory block is validated once, when
//! it is read from disk ([`check_block`]); afterwards the iterator trusts it
//! and decodes each record with a couple of loads and no error branches.

use crate::bytes::{le16, le32, put16, put32};
use crate::checksum::crc32c;
use crate::error::{corrupt, FormatError, Result};

/// Size of the fixed part of a directory entry.
pub const DIRENT_HEADER: usize = 8;
/// Size of the checksum tail.
pub const TAIL_SIZE: usize = 12;
/// `file_type` value that marks the checksum tail.
pub const TAIL_FILE_TYPE: u8 = 0xDE;
/// Longest name a directory entry can hold.
pub const NAME_MAX: usize = 255;

/// Decode a `rec_len`: 64 KiB blocks need the two low bits as high bits and
/// the values 0 / 65535 to mean "the whole block".
#[inline]
pub fn rec_len_from_disk(dlen: u16, block_size: usize) -> usize {
    let len = dlen as usize;
    if block_size < 65536 {
        return len; // the common case: below 64 KiB blocks rec_len is the length
    }
    if dlen == 65535 || dlen == 0 {
        block_size
    } else {
        (len & 65532) | ((len & 3) << 16)
    }
}

/// Encode a `rec_len`.
#[inline]
pub fn rec_len_to_disk(len: usize, block_size: usize) -> u16 {
    if block_size < 65536 {
        return len as u16;
    }
    if len == 65536 {
        return if block_size == 65536 { 65535 } else { 0 };
    }
    ((len & 65532) | ((len >> 16) & 3)) as u16
}

/// Minimal record length for a name of `name_len` bytes.
#[inline]
pub fn rec_len_for(name_len: usize) -> usize {
    (DIRENT_HEADER + name_len + 3) & !3
}

/// One directory record, borrowing its name from the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// Inode number (0 = unused slot).
    pub inode: u32,
    /// Decoded record length.
    pub rec_len: usize,
    /// `file_type` byte (0 when the filesystem lacks `filetype`).
    pub file_type: u8,
    /// The name.
    pub name: &'a [u8],
    /// Byte offset of the record in its buffer.
    pub offset: usize,
}

/// Geometry a directory block is checked against.
#[derive(Debug, Clone, Copy)]
pub struct DirFormat {
    /// Filesystem block size (rec_len decoding).
    pub block_size: usize,
    /// `filetype` feature: the high byte of name_len is a type.
    pub filetype: bool,
}

/// Whether a record's name is `name`. A directory walk compares the
/// searched name with every record of equal length, and names in one
/// directory often share their start (`file-00000001`, `file-00000002`):
/// comparing the last eight bytes first settles almost every record
/// without a `memcmp` call (measured: the call per record was a tenth of a
/// create's leaf walk when all names had the same length).
#[inline]
pub fn same_name(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let tail = |s: &[u8]| s.len().checked_sub(8).and_then(|i| <[u8; 8]>::try_from(&s[i..]).ok());
    if let (Some(x), Some(y)) = (tail(a), tail(b)) {
        if x != y {
            return false;
        }
    }
    a == b
}

/// Decode the record at `off` without checks (the buffer was validated).
#[inline]
pub fn entry_at(buf: &[u8], off: usize, fmt: DirFormat) -> DirEntry<'_> {
    let inode = le32(buf, off);
    let rec_len = rec_len_from_disk(le16(buf, off + 4), fmt.block_size);
    let (name_len, file_type) = if fmt.filetype {
        (buf[off + 6] as usize, buf[off + 7])
    } else {
        (le16(buf, off + 6) as usize & 0xff, 0)
    };
    let end = (off + DIRENT_HEADER + name_len).min(buf.len());
    DirEntry {
        inode,
        rec_len,
        file_type,
        name: &buf[(off + DIRENT_HEADER).min(end)..end],
        offset: off,
    }
}

/// Iterate records of a validated buffer, including unused ones.
pub fn entries(buf: &[u8], fmt: DirFormat) -> impl Iterator<Item = DirEntry<'_>> {
    let mut off = 0usize;
    std::iter::from_fn(move || {
        if off + DIRENT_HEADER > buf.len() {
            return None;
        }
        let e = entry_at(buf, off, fmt);
        if e.rec_len < DIRENT_HEADER {
            return None; // defensive: never loop on an unvalidated buffer
        }
        off += e.rec_len;
        Some(e)
    })
}

/// Whether `buf` ends in a checksum tail.
pub fn has_tail(buf: &[u8]) -> bool {
    if buf.len() < TAIL_SIZE {
        return false;
    }
    let t = &buf[buf.len() - TAIL_SIZE..];
    le32(t, 0) == 0 && le16(t, 4) == TAIL_SIZE as u16 && t[6] == 0 && t[7] == TAIL_FILE_TYPE
}

/// Validate the record chain of `buf` (a block, or an inline-data area):
/// every `rec_len` 4-aligned, at least header + name, inside the buffer, and
/// the records tile the buffer exactly. With `csum = Some(inode_seed)` the
/// block must end in a tail whose checksum matches.
pub fn check_block(buf: &[u8], fmt: DirFormat, csum: Option<u32>) -> Result<()> {
    const S: &str = "directory entry";
    let mut limit = buf.len();
    if let Some(seed) = csum {
        if !has_tail(buf) {
            return Err(corrupt("directory block", "missing checksum tail"));
        }
        limit -= TAIL_SIZE;
        let stored = le32(buf, limit + 8);
        let computed = crc32c(seed, &buf[..limit]);
        if stored != computed {
            return Err(FormatError::Checksum {
                structure: "directory block",
                stored,
                computed,
            });
        }
    }
    let mut off = 0;
    while off < limit {
        if off + DIRENT_HEADER > limit {
            return Err(corrupt(S, format!("record at offset {off} runs past the end")));
        }
        let e = entry_at(buf, off, fmt);
        if !e.rec_len.is_multiple_of(4) || e.rec_len < DIRENT_HEADER {
            return Err(corrupt(S, format!("rec_len {} at offset {off} invalid", e.rec_len)));
        }
        if off + e.rec_len > limit {
            return Err(corrupt(
                S,
                format!("rec_len {} at offset {off} crosses the block end", e.rec_len),
            ));
        }
        if DIRENT_HEADER + e.name.len() > e.rec_len
            || (fmt.filetype && DIRENT_HEADER + buf[off + 6] as usize > e.rec_len)
        {
            return Err(corrupt(S, format!("name at offset {off} longer than its record",)));
        }
        if e.inode != 0 && e.name.is_empty() {
            return Err(corrupt(S, format!("empty name at offset {off}")));
        }
        off += e.rec_len;
    }
    Ok(())
}

/// Compute and store the tail checksum of a directory block.
pub fn set_tail_checksum(buf: &mut [u8], inode_seed: u32) {
    let limit = buf.len() - TAIL_SIZE;
    let c = crc32c(inode_seed, &buf[..limit]);
    put32(buf, limit + 8, c);
}

/// Write an empty checksum tail at the end of `buf`.
pub fn init_tail(buf: &mut [u8]) {
    let t = buf.len() - TAIL_SIZE;
    buf[t..].fill(0);
    put16(buf, t + 4, TAIL_SIZE as u16);
    buf[t + 7] = TAIL_FILE_TYPE;
}

/// Change only the record length of the entry at `off` (an insert taking a
/// live record's slack shrinks it to its name; nothing else moves).
pub fn set_rec_len(buf: &mut [u8], off: usize, rec_len: usize, fmt: DirFormat) {
    put16(buf, off + 4, rec_len_to_disk(rec_len, fmt.block_size));
}

/// Write a record header and name at `off` (caller checks space).
pub fn write_entry(buf: &mut [u8], off: usize, inode: u32, rec_len: usize, name: &[u8], file_type: u8, fmt: DirFormat) {
    put32(buf, off, inode);
    put16(buf, off + 4, rec_len_to_disk(rec_len, fmt.block_size));
    if fmt.filetype {
        buf[off + 6] = name.len() as u8;
        buf[off + 7] = file_type;
    } else {
        put16(buf, off + 6, name.len() as u16);
    }
    buf[off + DIRENT_HEADER..off + DIRENT_HEADER + name.len()].copy_from_slice(name);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FMT: DirFormat = DirFormat {
        block_size: 4096,
        filetype: true,
    };

    proptest! {
        #[test]
        fn build_check_iterate_roundtrip(names in proptest::collection::vec(proptest::collection::vec(1u8..=255, 1..40), 1..30), csum in any::<bool>()) {
            let mut buf = vec![0u8; 4096];
            let end = if csum { 4096 - TAIL_SIZE } else { 4096 };
            let mut off = 0;
            let mut written = Vec::new();
            for (i, n) in names.iter().enumerate() {
                let need = rec_len_for(n.len());
                if off + need + rec_len_for(40) > end { break; }
                let last = i == names.len() - 1;
                let rl = if last { end - off } else { need };
                write_entry(&mut buf, off, i as u32 + 11, rl, n, 1, FMT);
                written.push((i as u32 + 11, n.clone()));
                off += rl;
                if last { break; }
            }
            if off < end {
                if written.is_empty() {
                    write_entry(&mut buf, 0, 0, end, b"", 0, FMT);
                } else {
                    // stretch the last record to the end
                    let mut last_off = 0;
                    for e in entries(&buf[..off], FMT) { last_off = e.offset; }
                    let rl = end - last_off;
                    put16(&mut buf, last_off + 4, rec_len_to_disk(rl, 4096));
                }
            }
            if csum { init_tail(&mut buf); set_tail_checksum(&mut buf, 7); }
            prop_assert!(check_block(&buf, FMT, csum.then_some(7)).is_ok());
            let limit = if csum { 4096 - TAIL_SIZE } else { 4096 };
            let got: Vec<(u32, Vec<u8>)> = entries(&buf[..limit], FMT).filter(|e| e.inode != 0).map(|e| (e.inode, e.name.to_vec())).collect();
            prop_assert_eq!(got, written);
        }

        #[test]
        fn check_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = check_block(&bytes, DirFormat { block_size: 1024, filetype: true }, None);
            let _ = check_block(&bytes, DirFormat { block_size: 65536, filetype: false }, Some(1));
        }

        /// Names that differ anywhere — first byte, last byte, the middle,
        /// or only in length — compare as slices do.
        #[test]
        fn same_name_is_slice_equality(
            a in proptest::collection::vec(any::<u8>(), 0..24),
            flip in any::<prop::sample::Index>(),
            how in 0u8..4,
        ) {
            let mut b = a.clone();
            match how {
                0 => {}
                1 if !b.is_empty() => { let i = flip.index(b.len()); b[i] ^= 1; }
                2 => b.push(7),
                _ => { b.pop(); }
            }
            prop_assert_eq!(same_name(&a, &b), a == b);
            prop_assert_eq!(same_name(&b, &a), a == b);
        }

        #[test]
        fn rec_len_64k_roundtrip(len in (2u32..=16384).prop_map(|x| x as usize * 4)) {
            prop_assert_eq!(rec_len_from_disk(rec_len_to_disk(len, 65536), 65536), len);
        }
    }
}
