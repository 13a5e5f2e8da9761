//! Make a new, empty ext2/ext3/ext4 filesystem on a block device, the way
//! `mke2fs` 1.47 does with its stock `/etc/mke2fs.conf`.
//!
//! [`mkfs`] runs mke2fs's steps in its order, each in a module of its own
//! that states the on-disk rule it follows:
//!
//! 1. **Options** (`options`): the request checked (`PRS()`).
//! 2. **Features** (`features`): the type's defaults, the `-O` edits, the
//!    rules between features.
//! 3. **Geometry** (`geometry`, `ext2fs_initialize`): block size, groups,
//!    inodes per group, descriptor and reserved GDT blocks; the journal's
//!    size. With the identity (`identity`: UUID, hash seed, time) and the
//!    checksum seeds (`checksum`) it makes the plan (`plan`) every later
//!    step reads.
//! 4. **Layout** (`layout`, `ext2fs_allocate_tables`): superblock areas,
//!    then bitmaps and inode tables, packed per flex group with `flex_bg`.
//! 5. **Inode tables** (`inode_tables`): zeroed (no lazy init), so every
//!    group is `ITABLE_ZEROED`.
//! 6. **Root and lost+found** (`root`), the bad-blocks inode.
//! 7. **Resize inode** (`resize`): the reserved GDT blocks' map.
//! 8. **Journal** (`journal`): the journal inode and its superblock.
//! 9. **Inode records** (`inode_tables`): every reserved inode's record
//!    into its table.
//! 10. **Groups** (`groups`): bitmaps and descriptors, uninitialised where
//!     mke2fs leaves them so.
//! 11. **Superblock** (`superblock`) and **write-out** (`flush`): the
//!     descriptor copies, then every superblock copy, primary last.
//! 12. **Report** ([`MkfsReport`]).
//!
//! Blocks are placed by a first-fit allocator over the used ranges
//! (`alloc`); files' blocks are mapped by extents or indirect blocks
//! (`file_map`); what is written goes through one writer (`writer`) that
//! collects small blocks in block order and counts `s_kbytes_written`.
//!
//! With the same UUID, hash seed and time, the result matches mke2fs 1.47
//! block for block except `s_kbytes_written` and the journal superblock's
//! feature bits (`64BIT`, `CSUM_V3`, which the kernel would set at first
//! mount); `tests/mkfs.rs` makes that comparison.
//!
//! Nothing here reads the system clock or a random source when `uuid` is
//! given and `clock` is fixed (`hash_seed` then defaults to a function of the
//! UUID): the output is a pure function of the options and the size.
//!
//! Not made here: `orphan_file`, `bigalloc`, `inline_data`, `encrypt`,
//! `quota` and other features outside the stock mke2fs.conf types ask for
//! [`MkfsError::Unsupported`].

#![warn(unreachable_pub)]

mod alloc;
mod checksum;
mod error;
mod features;
mod file_map;
mod flush;
mod geometry;
mod groups;
mod identity;
mod inode;
mod inode_tables;
mod journal;
mod layout;
mod options;
mod plan;
mod report;
mod resize;
mod root;
mod superblock;
mod writer;

use ext4kit_blockdev::BlockDevice;

pub use error::{MkfsError, Result};
/// The readers [`MkfsOptions::readers`] takes (`--compat`), and what each
/// supports.
pub use ext4kit_format::readers::{self, Reader};
/// The clock [`MkfsOptions::clock`] takes (fixed for a reproducible build).
pub use ext4kit_format::time::Clock;
pub use geometry::default_journal_blocks;
pub use identity::hash_seed_from_uuid;
pub use options::{FsType, MkfsOptions};
pub use report::MkfsReport;

use alloc::Alloc;
use inode::{BAD_INO, JOURNAL_INO, LPF_INO, RESIZE_INO, ROOT_INO};
use inode_tables::InodeRecords;
use layout::Layout;
use plan::Plan;
use superblock::SuperblockCounts;
use writer::Writer;

/// Make a filesystem of `size_bytes` (rounded down to whole blocks) at the
/// start of `dev`.
pub fn mkfs(dev: &dyn BlockDevice, size_bytes: u64, opts: &MkfsOptions) -> Result<MkfsReport> {
    options::check_device(dev, size_bytes)?;
    let plan = Plan::new(size_bytes, opts)?;
    let g = plan.geometry();
    let mut al = Alloc::new(g.blocks());
    let layout = Layout::place(&plan, &mut al)?;
    let mut w = Writer::new(dev, g.block_size());
    inode_tables::zero_inode_tables(&plan, &layout, &mut w)?;

    let mut inodes = InodeRecords::default();
    inodes.add(ROOT_INO, root::create_root_dir(&plan, &mut al, &mut w)?);
    inodes.add(LPF_INO, root::create_lost_and_found(&plan, &mut al, &mut w)?);
    inodes.add(BAD_INO, inode_tables::bad_block_inode(&plan)?);
    if let Some(ri) = resize::create_resize_inode(&plan, &mut al, &mut w)? {
        inodes.add(RESIZE_INO, ri);
    }
    let journal_backup = journal::add_journal_inode(&plan, &mut al, &mut w)?.map(|j| {
        let backup = j.backup();
        inodes.add(JOURNAL_INO, j.into_inode());
        backup
    });
    inodes.write(&plan, &layout, &mut w)?;

    let gdt = groups::write_groups(&plan, &layout, &al, &mut w)?;
    let sb = superblock::build(
        &plan,
        &SuperblockCounts {
            free_blocks: gdt.free_blocks(),
            free_inodes: gdt.free_inodes(),
            overhead: layout.overhead() + plan.journal_blocks(),
            journal_backup,
        },
    );
    flush::write_out(&plan, &mut w, &gdt, sb)?;
    Ok(MkfsReport::new(&plan, &gdt))
}

/// Do everything [`mkfs`] would, writing nothing: the report, or the error
/// `mkfs` would fail with. Lets a caller check the options before it
/// truncates an image file.
pub fn dry_run(size_bytes: u64, opts: &MkfsOptions) -> Result<MkfsReport> {
    let o = MkfsOptions {
        device_zeroed: true,
        ..opts.clone()
    };
    mkfs(&NullDevice { size: size_bytes }, size_bytes, &o)
}

/// A device that accepts every write and keeps nothing: what [`dry_run`]
/// lays the filesystem out on.
struct NullDevice {
    size: u64,
}

impl BlockDevice for NullDevice {
    fn read_at(&self, _off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, _off: u64, _buf: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_only(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_blockdev::MemDevice;
    use ext4kit_format::superblock::Superblock;

    fn fixed(t: FsType) -> MkfsOptions {
        MkfsOptions {
            fs_type: t,
            uuid: Some([1; 16]),
            hash_seed: Some([2; 16]),
            clock: ext4kit_format::time::Clock::fixed(1_700_000_000),
            ..Default::default()
        }
    }

    #[test]
    fn deterministic_and_self_consistent() {
        let a = MemDevice::new(8 << 20);
        let b = MemDevice::new(8 << 20);
        let r = mkfs(&a, 8 << 20, &fixed(FsType::Ext4)).unwrap();
        mkfs(&b, 8 << 20, &fixed(FsType::Ext4)).unwrap();
        assert!(a.to_vec() == b.to_vec());
        let img = a.to_vec();
        let sb = Superblock::parse(&img[1024..2048]).unwrap();
        assert_eq!(sb.blocks_count(), r.blocks_count);
        assert_eq!(sb.free_blocks_count(), r.free_blocks);
        assert_eq!(r.journal_blocks, 1024);
    }

    #[test]
    fn dry_run_reports_without_writing() {
        let r = dry_run(64 << 20, &fixed(FsType::Ext4)).unwrap();
        assert_eq!((r.blocks_count, r.inodes_count, r.journal_blocks), (65536, 16384, 4096));
        assert!(dry_run(8 << 10, &fixed(FsType::Ext4)).is_err());
    }

    #[test]
    fn too_small_is_an_error() {
        let d = MemDevice::new(8 << 10);
        assert!(mkfs(&d, 8 << 10, &fixed(FsType::Ext4)).is_err());
    }
}
