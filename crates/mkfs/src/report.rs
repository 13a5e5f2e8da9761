//! What mkfs tells its caller.

use crate::groups::DescriptorTable;
use crate::plan::Plan;

/// What was made.
#[derive(Debug, Clone, PartialEq)]
pub struct MkfsReport {
    /// Block size in bytes.
    pub block_size: u32,
    /// Blocks in the filesystem (may be less than the device holds).
    pub blocks_count: u64,
    /// Inodes in the filesystem.
    pub inodes_count: u32,
    /// Block groups.
    pub groups: u32,
    /// Blocks per group.
    pub blocks_per_group: u32,
    /// Inodes per group.
    pub inodes_per_group: u32,
    /// Journal size in blocks (0: no journal).
    pub journal_blocks: u32,
    /// Free blocks after creation.
    pub free_blocks: u64,
    /// Feature names, as dumpe2fs prints them.
    pub features: Vec<String>,
    /// The filesystem UUID.
    pub uuid: [u8; 16],
    /// Things the caller should know (a feature dropped, the size trimmed).
    pub notes: Vec<String>,
}

impl MkfsReport {
    /// The report step: the plan's sizes and the groups' free count.
    pub(crate) fn new(plan: &Plan, gdt: &DescriptorTable) -> Self {
        let g = plan.geometry();
        MkfsReport {
            block_size: g.block_size() as u32,
            blocks_count: g.blocks(),
            inodes_count: (g.inodes_per_group() * g.groups()) as u32,
            groups: g.groups() as u32,
            blocks_per_group: g.blocks_per_group() as u32,
            inodes_per_group: g.inodes_per_group() as u32,
            journal_blocks: plan.journal_blocks() as u32,
            free_blocks: gdt.free_blocks(),
            features: plan.features().names(),
            uuid: plan.identity().uuid(),
            notes: plan.notes().to_vec(),
        }
    }
}
