//! Names a directory block still holds after they were removed: the
//! deleted entries in the slack of the live records, for forensic tools
//! (TSK's `fls -d`). Best effort by nature.
//!
//! How a removed name lingers: removing a record that has a predecessor
//! in its block grows the predecessor's `rec_len` over it (e2fsprogs'
//! `ext2fs_unlink`, the kernel before Linux 5.13, many other writers), so
//! its bytes — inode number, name, type — stay behind the predecessor's
//! name until a new record is inserted there. Linux 5.13 and later wipe
//! the removed record (`ext4_generic_delete_entry`), and so does this
//! engine: such names are gone. Removing the first record of a block only
//! zeroes its inode field, so its name has no inode to give.
//!
//! A candidate in the slack is taken when it looks like a record: 4-byte
//! aligned, an inode number in `1..=s_inodes_count`, a name of 1..=255
//! bytes with no `/` or NUL that fits the slack, a record length of at
//! least header plus name, and (with `filetype`) a known type. The scan
//! then skips the name and looks on: merged removals leave several
//! records behind one live name. Inline directories and the index blocks
//! of an htree are not searched (their slack holds index data, not names).

use ext4kit_format::dirent::{self, DirFormat, DIRENT_HEADER, NAME_MAX};
use ext4kit_format::inode::FileType;

use super::bmap::BlockMap;
use super::dir::DirEntry;
use super::dirblock::{self, DirRef};
use super::volume::Volume;
use crate::error::Result;

/// The removed names in directory `dir`'s blocks, in block order (see the
/// module doc for what is found and what cannot be). The name's inode may
/// since have been freed or given to another file: the caller judges.
pub fn deleted_entries(vol: &Volume, dir: DirRef<'_>) -> Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    if let BlockMap::Inline(_) = dir.map {
        return Ok(out);
    }
    dirblock::check_size(vol, dir)?;
    let indexed = dir.is_indexed(vol);
    let runs = dir.map.runs(vol, dir.nblocks(vol))?;
    dirblock::check_distinct(dir, &runs)?;
    let fmt = vol.geo().dir_format();
    let inodes = vol.geo().inodes_count();
    for (lstart, _, len) in runs {
        for lblk in lstart..lstart + len {
            // The htree root's slack after ".." is the index.
            if indexed && lblk == 0 {
                continue;
            }
            let Some(buf) = dirblock::read_leaf(vol, dir, lblk)? else {
                continue;
            };
            let d = &buf.data[..];
            let first = dirent::entry_at(d, 0, fmt);
            // An htree interior node: one empty record spanning the block.
            if indexed && first.inode == 0 && first.rec_len == d.len() && first.name.is_empty() {
                continue;
            }
            let limit = if vol.geo().csum_seed().is_some() && dirent::has_tail(d) {
                d.len() - dirent::TAIL_SIZE
            } else {
                d.len()
            };
            for e in dirent::entries(&d[..limit], fmt) {
                let start = e.offset + dirent::rec_len_for(e.name.len());
                let end = (e.offset + e.rec_len).min(limit);
                scan_slack(&d[..end], start, fmt, inodes, &mut out);
            }
        }
    }
    Ok(out)
}

/// Records that look whole in `d[start..]` (a live record's slack).
fn scan_slack(d: &[u8], start: usize, fmt: DirFormat, inodes: u32, out: &mut Vec<DirEntry>) {
    let mut p = start;
    while p + DIRENT_HEADER < d.len() {
        match candidate(d, p, fmt, inodes) {
            Some(e) => {
                p += dirent::rec_len_for(e.name.len());
                out.push(e);
            }
            None => p += 4,
        }
    }
}

/// The record at `p` of a slack ending at `d.len()`, if it looks like one.
fn candidate(d: &[u8], p: usize, fmt: DirFormat, inodes: u32) -> Option<DirEntry> {
    let e = dirent::entry_at(d, p, fmt);
    // Without `filetype` the length is 16 bits wide (a name is at most 255).
    let name_len = if fmt.filetype {
        d[p + 6] as usize
    } else {
        u16::from_le_bytes([d[p + 6], d[p + 7]]) as usize
    };
    let used = dirent::rec_len_for(name_len);
    let plausible = e.inode != 0
        && e.inode <= inodes
        && (1..=NAME_MAX).contains(&name_len)
        && e.name.len() == name_len
        && p + DIRENT_HEADER + name_len <= d.len()
        && e.rec_len >= used
        && e.rec_len.is_multiple_of(4)
        && !e.name.iter().any(|&b| b == b'/' || b == 0)
        && e.name != b"."
        && e.name != b"..";
    let file_type = FileType::from_dirent(e.file_type);
    if !plausible || (fmt.filetype && file_type.is_none()) {
        return None;
    }
    Some(DirEntry {
        ino: e.inode,
        name: e.name.to_vec(),
        file_type,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FMT: DirFormat = DirFormat {
        block_size: 1024,
        filetype: true,
    };

    /// A block as `ext2fs_unlink` leaves it: "keep" (inode 12) whose
    /// rec_len grew over "gone" (inode 13) and then "also" (inode 14).
    fn unlinked_block() -> Vec<u8> {
        let mut b = vec![0u8; 1024];
        dirent::write_entry(&mut b, 0, 12, 1024, b"keep", 1, FMT);
        dirent::write_entry(&mut b, 12, 13, 12, b"gone", 1, FMT);
        dirent::write_entry(&mut b, 24, 14, 1000, b"also", 2, FMT);
        b
    }

    #[test]
    fn finds_merged_removals_in_order() {
        let b = unlinked_block();
        let mut out = Vec::new();
        scan_slack(&b, 12, FMT, 100, &mut out);
        let got: Vec<(u32, &[u8])> = out.iter().map(|e| (e.ino, &e.name[..])).collect();
        assert_eq!(got, vec![(13, &b"gone"[..]), (14, &b"also"[..])]);
        assert_eq!(out[1].file_type, Some(FileType::Directory));
    }

    #[test]
    fn refuses_what_is_not_a_record() {
        let mut b = unlinked_block();
        // An inode number past the filesystem's, a name with '/', a wiped record.
        let mut out = Vec::new();
        scan_slack(&b, 12, FMT, 13, &mut out);
        assert_eq!(out.len(), 1, "inode 14 is past s_inodes_count 13");
        b[12 + 8] = b'/';
        b[24..40].fill(0);
        out.clear();
        scan_slack(&b, 12, FMT, 100, &mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn never_reads_past_the_slack() {
        // A name whose length runs past the end of the slack.
        let mut b = vec![0u8; 32];
        dirent::write_entry(&mut b, 0, 12, 32, b"x", 1, FMT);
        b[12..16].copy_from_slice(&5u32.to_le_bytes());
        b[16..18].copy_from_slice(&20u16.to_le_bytes());
        b[18] = 200;
        b[19] = 1;
        let mut out = Vec::new();
        scan_slack(&b, 12, FMT, 100, &mut out);
        assert!(out.is_empty());
    }
}
