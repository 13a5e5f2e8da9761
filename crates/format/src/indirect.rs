//! Indirect block maps (ext2/ext3, and ext4 files without the EXTENTS flag):
//! `i_block[0..12]` point at data, `i_block[12]` at a block of pointers,
//! `[13]` double- and `[14]` triple-indirect. A zero pointer is a hole.

use crate::bytes::le32;

/// Number of direct pointers in `i_block`.
pub const DIRECT: usize = 12;
/// `i_block` index of the single-indirect pointer.
pub const IND: usize = 12;
/// `i_block` index of the double-indirect pointer.
pub const DIND: usize = 13;
/// `i_block` index of the triple-indirect pointer.
pub const TIND: usize = 14;

/// The 15 pointers of `i_block`.
pub fn root_pointers(i_block: &[u8; 60]) -> [u32; 15] {
    let mut p = [0u32; 15];
    for (i, v) in p.iter_mut().enumerate() {
        *v = le32(i_block, 4 * i);
    }
    p
}

/// How many levels of indirect blocks hang below root slot `slot` of
/// `i_block`: 0 for the direct pointers (they name data), 1 for `[12]`, 2
/// for `[13]`, 3 for `[14]`.
pub fn slot_depth(slot: usize) -> usize {
    match slot {
        s if s < DIRECT => 0,
        IND => 1,
        DIND => 2,
        _ => 3,
    }
}

/// Where a logical block lives in the map: the root slot, then the index in
/// each level of indirect block below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndirectPath {
    /// Slot in `i_block`.
    pub root: usize,
    /// Index at each indirect level, outermost first (0..3 entries).
    pub levels: Vec<usize>,
}

/// Locate logical block `lblk`, or `None` past the triple-indirect range.
pub fn path_for(lblk: u64, block_size: usize) -> Option<IndirectPath> {
    let per = (block_size / 4) as u64;
    let mut l = lblk;
    if l < DIRECT as u64 {
        return Some(IndirectPath {
            root: l as usize,
            levels: vec![],
        });
    }
    l -= DIRECT as u64;
    if l < per {
        return Some(IndirectPath {
            root: IND,
            levels: vec![l as usize],
        });
    }
    l -= per;
    if l < per * per {
        return Some(IndirectPath {
            root: DIND,
            levels: vec![(l / per) as usize, (l % per) as usize],
        });
    }
    l -= per * per;
    if l < per * per * per {
        return Some(IndirectPath {
            root: TIND,
            levels: vec![
                (l / (per * per)) as usize,
                ((l / per) % per) as usize,
                (l % per) as usize,
            ],
        });
    }
    None
}

/// Read pointer `i` of an indirect block.
pub fn pointer(block: &[u8], i: usize) -> u32 {
    le32(block, 4 * i)
}

/// Logical blocks covered by one pointer at indirect depth `depth`
/// (0 = data block, 1 = single-indirect block, ...).
pub fn span(depth: usize, block_size: usize) -> u64 {
    let per = (block_size / 4) as u64;
    per.pow(depth as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            path_for(11, 1024).unwrap(),
            IndirectPath {
                root: 11,
                levels: vec![]
            }
        );
        assert_eq!(
            path_for(12, 1024).unwrap(),
            IndirectPath {
                root: IND,
                levels: vec![0]
            }
        );
        assert_eq!(
            path_for(12 + 256, 1024).unwrap(),
            IndirectPath {
                root: DIND,
                levels: vec![0, 0]
            }
        );
        assert_eq!(
            path_for(12 + 256 + 65536, 1024).unwrap(),
            IndirectPath {
                root: TIND,
                levels: vec![0, 0, 0]
            }
        );
        assert!(path_for(12 + 256 + 65536 + 256 * 65536, 1024).is_none());
    }
}
