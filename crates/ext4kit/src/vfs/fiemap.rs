//! Where a file's data lives on disk: its mapped runs, as `FS_IOC_FIEMAP`
//! reports them (for `ext4kit stat`, the tests and the tools that
//! inspect images).

use super::super_block::SuperBlock;
use crate::error::Result;
use crate::ext4::BlockMap;

/// One contiguous run of a file's data on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First logical block.
    pub logical: u64,
    /// First physical block.
    pub physical: u64,
    /// Blocks in the run.
    pub len: u64,
    /// Allocated but unwritten (reads as zeros).
    pub uninit: bool,
}

/// Where an inode's data lives (for `ext4kit stat` and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataLayout {
    /// "extent tree", "indirect block map", "inline data" or "none".
    pub kind: &'static str,
    /// Mapped runs in logical order.
    pub runs: Vec<Run>,
}

/// Where inode `ino`'s data lives ([`Fs::data_layout`](crate::Fs::data_layout)).
pub(crate) fn data_layout(sb: &SuperBlock, ino: u32) -> Result<DataLayout> {
    let i = sb.inode(ino)?;
    let map = i.block_map(sb.vol())?;
    let nblocks = i.size().div_ceil(sb.vol().block_size() as u64);
    Ok(match &*map {
        BlockMap::Extents(ext) => DataLayout {
            kind: "extent tree",
            runs: ext
                .iter()
                .map(|e| Run {
                    logical: e.block as u64,
                    physical: e.start(),
                    len: e.length() as u64,
                    uninit: e.is_uninit(),
                })
                .collect(),
        },
        BlockMap::Indirect(_) => DataLayout {
            kind: "indirect block map",
            runs: map
                .runs(sb.vol(), nblocks)?
                .into_iter()
                .map(|(l, p, n)| Run {
                    logical: l,
                    physical: p,
                    len: n,
                    uninit: false,
                })
                .collect(),
        },
        BlockMap::Inline(_) => DataLayout {
            kind: "inline data",
            runs: vec![],
        },
        BlockMap::None => DataLayout {
            kind: "none",
            runs: vec![],
        },
    })
}
