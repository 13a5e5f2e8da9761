//! Records inside one directory leaf block — the level of the kernel's
//! `ext4_find_dest_de`, `ext4_insert_dentry` and `search_dirblock`.
//!
//! A leaf is a chain of `ext4_dir_entry_2` records whose `rec_len`s cover
//! the block; with metadata_csum the last 12 bytes are the
//! `ext4_dir_entry_tail` instead, and records cover only the bytes before
//! it. A record's slack — `rec_len` minus the space its own name needs —
//! is where a new name goes. Bytes only: nothing here reads a block or
//! knows which directory a leaf belongs to (that is `dirblock.rs`).

use ext4kit_format::dirent::{self, rec_len_for, DirFormat};
use ext4kit_format::inode::FileType;

use super::geometry::Geometry;
use crate::error::{Errno, Error, Result};

/// A live record decoded from a leaf, owned (leaves are rebuilt from these
/// when they split).
#[derive(Debug, Clone)]
pub(crate) struct Rec {
    pub ino: u32,
    pub name: RecName,
    pub ft: u8,
}

/// A record's name, inline up to 32 bytes: a leaf split decodes every
/// record of the leaf (~170 in a 4 KiB leaf of short names), and with a
/// `Vec` per name that was 1.5 allocations per create in a create storm,
/// amortised over the inserts between splits (uprobe count).
pub(crate) type RecName = smallvec::SmallVec<[u8; 32]>;

/// A record to add, borrowed from the caller: the name, its inode and the
/// dirent type byte (0 without the `filetype` feature). Becomes an owned
/// [`Rec`] only when a leaf is rebuilt, so the common insert — into a
/// leaf with room — copies the name once, into the block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewRec<'n> {
    pub name: &'n [u8],
    pub ino: u32,
    pub ft: u8,
}

impl NewRec<'_> {
    /// The record as [`LeafLayout::build`] takes it.
    pub(crate) fn to_rec(self) -> Rec {
        Rec {
            ino: self.ino,
            name: RecName::from_slice(self.name),
            ft: self.ft,
        }
    }

    /// Bytes the record takes packed tight.
    pub(crate) fn rec_len(self) -> usize {
        rec_len_for(self.name.len())
    }
}

/// How records sit in a leaf of this filesystem: the dirent format and
/// the bytes records may cover (the block minus the checksum tail when
/// metadata_csum is on).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeafLayout {
    fmt: DirFormat,
    limit: usize,
}

impl LeafLayout {
    /// The layout of every leaf of the filesystem `geo` describes.
    pub(crate) fn of(geo: &Geometry) -> Self {
        let bs = geo.block_size();
        let limit = if geo.csum_seed().is_some() {
            bs - dirent::TAIL_SIZE
        } else {
            bs
        };
        Self {
            fmt: geo.dir_format(),
            limit,
        }
    }

    /// The dirent format (block size, `filetype` feature).
    pub(crate) fn fmt(self) -> DirFormat {
        self.fmt
    }

    /// Bytes the records of a leaf cover.
    pub(crate) fn limit(self) -> usize {
        self.limit
    }

    /// Offset of the first record whose slack can hold a record of `need`
    /// bytes, without changing the block (`ext4_find_dest_de`).
    pub(crate) fn find_slot(self, d: &[u8], need: usize) -> Option<usize> {
        let mut off = 0;
        while off + dirent::DIRENT_HEADER <= self.limit {
            let e = dirent::entry_at(d, off, self.fmt);
            if e.rec_len < dirent::DIRENT_HEADER {
                return None;
            }
            let used = if e.inode == 0 { 0 } else { rec_len_for(e.name.len()) };
            if e.rec_len >= used + need {
                return Some(off);
            }
            off += e.rec_len;
        }
        None
    }

    /// One pass over a leaf for a create: the entry named `name` (inode,
    /// type byte) if the leaf holds it, else where [`Self::find_slot`]
    /// would put a record of `need` bytes. The lookup that proves a name
    /// absent and the search for room walk the same records; doing both
    /// in one walk reads the leaf once per create instead of twice.
    pub(crate) fn scan_for_insert(
        self,
        d: &[u8],
        name: &[u8],
        need: usize,
    ) -> std::result::Result<(u32, u8), Option<usize>> {
        let mut slot = None;
        let mut off = 0;
        while off + dirent::DIRENT_HEADER <= self.limit {
            let e = dirent::entry_at(d, off, self.fmt);
            if e.rec_len < dirent::DIRENT_HEADER {
                break;
            }
            if e.inode != 0 && dirent::same_name(e.name, name) {
                return Ok((e.inode, e.file_type));
            }
            if slot.is_none() {
                let used = if e.inode == 0 { 0 } else { rec_len_for(e.name.len()) };
                if e.rec_len >= used + need {
                    slot = Some(off);
                }
            }
            off += e.rec_len;
        }
        Err(slot)
    }

    /// Live records of a (validated) leaf, in block order; `skip_dots`
    /// drops the leading "." and ".." of block 0.
    pub(crate) fn records(self, d: &[u8], skip_dots: bool) -> Vec<Rec> {
        dirent::entries(&d[..self.limit], self.fmt)
            .enumerate()
            .filter(|(i, e)| e.inode != 0 && !(skip_dots && *i < 2 && (e.name == b"." || e.name == b"..")))
            .map(|(_, e)| Rec {
                ino: e.inode,
                name: RecName::from_slice(e.name),
                ft: e.file_type,
            })
            .collect()
    }

    /// A fresh leaf holding `recs` packed, the last record stretched to the
    /// end (an empty leaf is one unused record spanning it), plus the
    /// checksum tail when `seed` is given.
    pub(crate) fn build(self, recs: &[Rec], seed: Option<u32>) -> Result<Box<[u8]>> {
        let (fmt, limit) = (self.fmt, self.limit);
        if packed_size(recs) > limit {
            return Err(Error::posix(
                Errno::EIO,
                "directory leaf split produced more entries than a block holds",
            ));
        }
        let mut b = vec![0u8; fmt.block_size].into_boxed_slice();
        let mut off = 0;
        for (i, r) in recs.iter().enumerate() {
            let len = if i + 1 == recs.len() {
                limit - off
            } else {
                rec_len_for(r.name.len())
            };
            dirent::write_entry(&mut b, off, r.ino, len, &r.name, r.ft, fmt);
            off += len;
        }
        if recs.is_empty() {
            dirent::write_entry(&mut b, 0, 0, limit, b"", 0, fmt);
        }
        set_tail(&mut b, seed);
        Ok(b)
    }
}

/// Place `rec` in the record at `off` (found by [`LeafLayout::find_slot`]):
/// reuse an unused record, or shrink a live one to its name and take its
/// slack (`ext4_insert_dentry`).
pub(crate) fn insert_at(d: &mut [u8], off: usize, fmt: DirFormat, rec: NewRec<'_>) {
    let e = dirent::entry_at(d, off, fmt);
    let len = e.rec_len;
    if e.inode == 0 {
        dirent::write_entry(d, off, rec.ino, len, rec.name, rec.ft, fmt);
    } else {
        // The live record keeps its header and name; only its length
        // shrinks (copying its name out to rewrite it was an allocation
        // per create).
        let used = rec_len_for(e.name.len());
        dirent::set_rec_len(d, off, used, fmt);
        dirent::write_entry(d, off + used, rec.ino, len - used, rec.name, rec.ft, fmt);
    }
}

/// The live entry named `name` in a leaf: its inode and type
/// (`search_dirblock`).
pub(crate) fn find_name(d: &[u8], fmt: DirFormat, name: &[u8]) -> Option<(u32, Option<FileType>)> {
    dirent::entries(d, fmt)
        .find(|e| e.inode != 0 && dirent::same_name(e.name, name))
        .map(|e| (e.inode, FileType::from_dirent(e.file_type)))
}

/// Write the checksum tail (`ext4_dir_entry_tail`) of a leaf we built or
/// changed, when metadata_csum gives a `seed`; every changed leaf gets it
/// in the same handle.
pub(crate) fn set_tail(d: &mut [u8], seed: Option<u32>) {
    if let Some(s) = seed {
        if !dirent::has_tail(d) {
            dirent::init_tail(d);
        }
        dirent::set_tail_checksum(d, s);
    }
}

/// Bytes the records need packed tight.
pub(crate) fn packed_size(recs: &[Rec]) -> usize {
    recs.iter().map(|r| rec_len_for(r.name.len())).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FMT: DirFormat = DirFormat {
        block_size: 1024,
        filetype: true,
    };
    const LEAF: LeafLayout = LeafLayout { fmt: FMT, limit: 1024 };

    /// Try to place an entry in one block's records; returns whether it fit.
    fn insert_in_block(d: &mut [u8], name: &[u8], ino: u32, ft: u8) -> bool {
        match LEAF.find_slot(d, rec_len_for(name.len())) {
            Some(off) => {
                insert_at(d, off, FMT, NewRec { name, ino, ft });
                true
            }
            None => false,
        }
    }

    #[test]
    fn insert_uses_slack_and_keeps_the_chain_valid() {
        let fmt = FMT;
        let mut b = vec![0u8; 1024];
        dirent::write_entry(&mut b, 0, 2, 12, b".", 2, fmt);
        dirent::write_entry(&mut b, 12, 2, 1012, b"..", 2, fmt);
        // "name-NNN" needs 16 bytes: (1024 - 12 - 12) / 16 = 62 fit.
        for i in 0..100u32 {
            let name = format!("name-{i:03}");
            let fit = insert_in_block(&mut b, name.as_bytes(), 100 + i, 1);
            dirent::check_block(&b, fmt, None).unwrap();
            if !fit {
                assert_eq!(i, 62, "ran out at {i}");
                let recs = LEAF.records(&b, true);
                assert_eq!(recs.len(), 62);
                assert_eq!(packed_size(&recs), 62 * 16);
                assert_eq!(&recs[61].name[..], b"name-061");
                return;
            }
        }
        panic!("a 1 KiB block cannot hold 100 such names");
    }

    /// The create's one-pass walk answers exactly what the lookup's walk
    /// and `find_slot` answer separately, on leaves with slack in the
    /// middle (removed entries merged into their predecessors) and unused
    /// records, for present and absent names of every length class.
    #[test]
    fn one_walk_finds_what_the_lookup_and_find_slot_find() {
        let fmt = FMT;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        let mut rnd = |n: u64| rng.random_range(0..n);
        let name_of = |i: u64, len: u64| format!("{i:0width$}", width = len as usize).into_bytes();
        for _ in 0..300 {
            let mut b = vec![0u8; 1024];
            dirent::write_entry(&mut b, 0, 0, 1024, b"", 0, fmt);
            let mut names = Vec::new();
            for i in 0..rnd(80) {
                let name = name_of(i, 1 + rnd(40));
                if insert_in_block(&mut b, &name, 100 + i as u32, 1) {
                    names.push(name);
                }
            }
            // Remove some: merged into the predecessor, or (first record)
            // left as an unused record.
            let mut off = 0;
            let mut prev: Option<usize> = None;
            while off < 1024 {
                let e = dirent::entry_at(&b, off, fmt);
                let len = e.rec_len;
                if e.inode != 0 && rnd(4) == 0 {
                    match prev {
                        Some(p) => {
                            let plen = dirent::entry_at(&b, p, fmt).rec_len;
                            dirent::set_rec_len(&mut b, p, plen + len, fmt);
                            off += len;
                            continue;
                        }
                        None => b[off..off + 4].fill(0),
                    }
                }
                prev = Some(off);
                off += len;
            }
            dirent::check_block(&b, fmt, None).unwrap();
            for probe in names
                .iter()
                .cloned()
                .chain((0..5).map(|i| name_of(500 + i, 1 + rnd(60))))
            {
                let need = rec_len_for(probe.len());
                let found = dirent::entries(&b, fmt)
                    .find(|e| e.inode != 0 && e.name == &probe[..])
                    .map(|e| (e.inode, e.file_type));
                let want = found.ok_or_else(|| LEAF.find_slot(&b, need));
                assert_eq!(LEAF.scan_for_insert(&b, &probe, need), want, "{probe:?}");
            }
        }
    }
}
