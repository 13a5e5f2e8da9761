//! Everything decided before a block is placed: the options checked, the
//! features resolved, the geometry, the journal's size, the identity and
//! the checksum seeds. The later steps read the plan and never change it.

use ext4kit_format::dirent::{self, DirFormat};
use ext4kit_format::features::{compat, incompat};
use ext4kit_format::inode::Inode;

use crate::checksum::Checksums;
use crate::error::Result;
use crate::features::Features;
use crate::geometry::{default_journal_blocks, Geometry};
use crate::identity::Identity;
use crate::inode::{self, NewInode};
use crate::options::MkfsOptions;

/// The decisions of mke2fs's `PRS()` and `ext2fs_initialize`, in one
/// read-only value.
#[derive(Debug)]
pub(crate) struct Plan {
    features: Features,
    geometry: Geometry,
    journal_blocks: u64,
    identity: Identity,
    checksums: Checksums,
    label: String,
    reserved_percent: f64,
    device_zeroed: bool,
    notes: Vec<String>,
}

impl Plan {
    /// Options → features → geometry → journal size → identity →
    /// checksums, each failing with the message mke2fs would give.
    pub(crate) fn new(size_bytes: u64, opts: &MkfsOptions) -> Result<Plan> {
        opts.check()?;
        let mut notes = Vec::new();
        let mut features = Features::from_options(opts, &mut notes)?;
        let geometry = Geometry::compute(size_bytes, &mut features, opts, &mut notes)?;
        let journal_blocks = journal_size(&geometry, &mut features, &mut notes);
        let identity = Identity::resolve(opts)?;
        let checksums = Checksums::new(&features, identity.uuid());
        Ok(Plan {
            features,
            geometry,
            journal_blocks,
            identity,
            checksums,
            label: opts.label.clone(),
            reserved_percent: opts.reserved_percent,
            device_zeroed: opts.device_zeroed,
            notes,
        })
    }

    /// The feature words.
    pub(crate) fn features(&self) -> &Features {
        &self.features
    }
    /// The sizes.
    pub(crate) fn geometry(&self) -> &Geometry {
        &self.geometry
    }
    /// Journal size in blocks (0: no journal).
    pub(crate) fn journal_blocks(&self) -> u64 {
        self.journal_blocks
    }
    /// UUID, hash seed and time.
    pub(crate) fn identity(&self) -> &Identity {
        &self.identity
    }
    /// Checksum kinds and seeds.
    pub(crate) fn checksums(&self) -> &Checksums {
        &self.checksums
    }
    /// `s_volume_name`.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }
    /// `-m`: percentage of blocks reserved for root.
    pub(crate) fn reserved_percent(&self) -> f64 {
        self.reserved_percent
    }
    /// The device reads as zeros: blocks that must be zero need no write.
    pub(crate) fn device_zeroed(&self) -> bool {
        self.device_zeroed
    }
    /// What the caller should be told (a feature dropped, the size trimmed).
    pub(crate) fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Files are mapped by extents (`extent`), else by indirect blocks.
    pub(crate) fn extents(&self) -> bool {
        self.features.has_incompat(incompat::EXTENTS)
    }

    /// How directory blocks are encoded (`filetype` in `name_len`'s high
    /// byte or not).
    pub(crate) fn dir_format(&self) -> DirFormat {
        DirFormat {
            block_size: self.geometry.block_size() as usize,
            filetype: self.features.has_incompat(incompat::FILETYPE),
        }
    }

    /// Bytes at the end of each directory block kept for the checksum
    /// tail (`struct ext4_dir_entry_tail`, with `metadata_csum`).
    pub(crate) fn dir_tail(&self) -> usize {
        if self.checksums.metadata() {
            dirent::TAIL_SIZE
        } else {
            0
        }
    }

    /// A fresh in-use inode: `mode`, `links`, every time the plan's, and
    /// `i_extra_isize = 32` when the records are large.
    pub(crate) fn new_inode(&self, mode: u16, links: u16) -> Result<Inode> {
        inode::new_inode(
            self.geometry.inode_size(),
            NewInode {
                mode,
                links,
                time: self.identity.now(),
                extra_isize: true,
            },
        )
    }
}

/// The journal's size (`figure_journal_size`): with `has_journal`,
/// `ext2fs_default_journal_size` of the block count; a filesystem too small
/// for one (below 2048 blocks) loses the feature.
fn journal_size(g: &Geometry, f: &mut Features, notes: &mut Vec<String>) -> u64 {
    if !f.has_compat(compat::HAS_JOURNAL) {
        return 0;
    }
    match default_journal_blocks(g.blocks()) {
        Some(j) => j as u64,
        None => {
            f.clear_compat(compat::HAS_JOURNAL);
            notes.push("filesystem too small for a journal: has_journal dropped".into());
            0
        }
    }
}
