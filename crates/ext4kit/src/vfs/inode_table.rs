//! Every inode record on disk, in use or not, with the inode bitmap's
//! verdict ([`Fs::inode_table`](crate::Fs::inode_table)): what a timeline
//! or an `ils`-style listing needs, beside the tree a path walk sees. The
//! records are read from the tables directly (`ext4::inode_table_scan`),
//! never through the inode cache, so a free inode's record is never
//! mistaken for a live one by the rest of the engine.

use ext4kit_format::inode::{FileType, Inode};

use super::stat::Stat;
use super::super_block::SuperBlock;
use crate::error::Result;
use crate::ext4::inode_table_scan::{self, InodeTableScan, RecordCheck, TableRecord};

/// One inode record of the tables, read as it is on disk.
#[derive(Debug, Clone)]
pub struct TableInode {
    in_use: Option<bool>,
    stat: Stat,
    dtime: u32,
    check: RecordCheck,
    has_type: bool,
}

impl TableInode {
    fn new(sb: &SuperBlock, r: &TableRecord) -> TableInode {
        let rec: &Inode = r.record();
        TableInode {
            in_use: r.in_use(),
            stat: Stat::from_inode(sb.vol(), r.ino(), rec),
            dtime: rec.base.dtime,
            check: r.check(),
            has_type: FileType::from_mode(rec.base.mode).is_some(),
        }
    }

    /// The inode number.
    pub fn ino(&self) -> u32 {
        self.stat.ino
    }

    /// Whether the inode bitmap marks it in use (`None`: its group's
    /// bitmap could not be read). A free inode's record is what its last
    /// owner left: see [`TableInode::looks_intact`].
    pub fn in_use(&self) -> Option<bool> {
        self.in_use
    }

    /// The record's attributes as `stat` reports them (for a free inode,
    /// those it had when it was freed; an inode freed by the kernel has
    /// size 0 and the deletion as its mtime and ctime).
    pub fn stat(&self) -> &Stat {
        &self.stat
    }

    /// `i_dtime`, seconds: when the inode was deleted (0 if never). On an
    /// inode in use with no links it is the orphan list's next link, not
    /// a time.
    pub fn dtime(&self) -> u32 {
        self.dtime
    }

    /// What the record's checksum says (metadata_csum), or that there is none.
    pub fn check(&self) -> RecordCheck {
        self.check
    }

    /// Whether the record still describes a file a tool may show: its
    /// mode names a file type, it has a change time, and its checksum is
    /// valid on a filesystem that keeps them (a record of a free slot
    /// half-overwritten, or reused for something else, fails one of
    /// these). Says nothing about the file's data: the kernel frees an
    /// unlinked file's blocks and empties its block map.
    pub fn looks_intact(&self) -> bool {
        self.has_type
            && self.stat.ctime.sec != 0
            && matches!(self.check, RecordCheck::ChecksumValid | RecordCheck::NoChecksum)
    }
}

/// The records of the inode tables in inode order ([`Fs::inode_table`](crate::Fs::inode_table)).
#[derive(Debug)]
pub struct InodeTable<'a> {
    sb: &'a SuperBlock,
    scan: InodeTableScan<'a>,
}

pub(crate) fn inode_table(sb: &SuperBlock) -> InodeTable<'_> {
    InodeTable {
        sb,
        scan: inode_table_scan::scan(sb.vol()),
    }
}

impl Iterator for InodeTable<'_> {
    type Item = Result<TableInode>;

    fn next(&mut self) -> Option<Self::Item> {
        self.scan.next().map(|r| r.map(|r| TableInode::new(self.sb, &r)))
    }
}

#[cfg(test)]
mod tests {
    use crate::{Cred, NewInode, RecordCheck};

    #[test]
    fn a_freed_record_is_seen_free_and_intact() {
        let fs = super::super::mem_fs();
        let gone = fs.write_file(&NewInode::file(b"/gone").owner(1234, 99), b"x").unwrap();
        let keep = fs.write_file(&NewInode::file(b"/keep"), b"y").unwrap();
        fs.unlink(b"/gone", &Cred::root()).unwrap();
        fs.sync().unwrap();
        let recs: Vec<_> = fs.inode_table().collect::<crate::Result<_>>().unwrap();
        let inos: Vec<u32> = recs.iter().map(|r| r.ino()).collect();
        assert!(inos.windows(2).all(|w| w[0] < w[1]), "inode order: {inos:?}");
        let k = recs.iter().find(|r| r.ino() == keep.ino).unwrap();
        assert_eq!((k.in_use(), k.looks_intact(), k.dtime()), (Some(true), true, 0));
        assert_eq!(k.stat(), &fs.stat(keep.ino).unwrap());
        let root = recs.iter().find(|r| r.ino() == 2).unwrap();
        assert_eq!(root.in_use(), Some(true));
        let g = recs
            .iter()
            .find(|r| r.ino() == gone.ino)
            .expect("the freed record is still there");
        assert_eq!(g.in_use(), Some(false));
        assert!(g.looks_intact() && g.dtime() != 0, "{g:?}");
        assert_eq!((g.stat().uid, g.stat().gid, g.stat().crtime), (1234, 99, gone.crtime));
        assert_eq!(g.check(), RecordCheck::ChecksumValid);
    }
}
