//! `ext4kit info IMAGE`.

use std::path::Path;

use crate::fmt::{human, time_full};

/// Print the filesystem summary.
pub fn run(image: &Path, budget: usize) -> Result<(), String> {
    let fs = super::open(image, budget)?;
    let i = fs.info();
    let bs = i.block_size as u64;
    println!("Image:            {}", image.display());
    println!(
        "Label:            {}",
        if i.label.is_empty() { "<none>" } else { &i.label }
    );
    println!("UUID:             {}", i.uuid);
    println!("State:            {}", i.state);
    println!("Features:         {}", i.features.join(" "));
    println!("Block size:       {}", i.block_size);
    println!("Inode size:       {}", i.inode_size);
    println!("Blocks:           {} ({})", i.blocks, human(i.blocks * bs));
    println!("Free blocks:      {} ({})", i.free_blocks, human(i.free_blocks * bs));
    println!("Reserved blocks:  {}", i.reserved_blocks);
    println!("Inodes:           {}", i.inodes);
    println!("Free inodes:      {}", i.free_inodes);
    println!(
        "Groups:           {} ({} blocks, {} inodes each)",
        i.groups, i.blocks_per_group, i.inodes_per_group
    );
    println!("Directory hash:   {}", i.hash_alg);
    println!(
        "Created:          {}",
        time_full(ext4kit::Timestamp {
            sec: i.mkfs_time,
            nsec: 0
        })
    );
    println!(
        "Last written:     {}",
        time_full(ext4kit::Timestamp { sec: i.wtime, nsec: 0 })
    );
    Ok(())
}
