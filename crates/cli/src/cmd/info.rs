//! `ext4kit info IMAGE`: the filesystem summary, or for a partitioned disk
//! its partition table (and the summary of its one ext partition, if it
//! has exactly one).

use ext4kit::{Fs, Location};

use super::Image;
use crate::fmt::{human, time_full};
use crate::image::{Disk, Probe};

/// Print the filesystem summary, or the partition table of a disk.
pub fn run(image: &Image, budget: usize) -> Result<(), String> {
    print_container(image);
    if image.volume().is_none() {
        print_volumes(image);
    }
    if let Probe::Table(disk) = image.probe()? {
        print_table(image, &disk);
        if let Some(p) = disk.only_ext() {
            println!();
            println!("Partition {} holds the only ext2/3/4 filesystem:", p.part.number);
            let at = image.at(Location::Partition(p.part.number));
            let fs = super::open(&at, budget)?;
            print_summary(&at, &fs, Some(&disk));
        }
        return Ok(());
    }
    let fs = super::open(image, budget)?;
    let disk = match image.loc {
        // Describe the partition too.
        Location::Partition(_) => match image.at(Location::Whole).probe() {
            Ok(Probe::Table(d)) => Some(d),
            _ => None,
        },
        _ => None,
    };
    print_summary(image, &fs, disk.as_ref());
    Ok(())
}

/// The container layer (qcow2, VHDX, VMDK, VHD, Android sparse) the disk
/// is read through, when the file is not a raw disk: the first layer of
/// the stack (container → partition table → filesystem).
fn print_container(image: &Image) {
    let Ok(disk) = image.disk() else { return };
    let Some(l) = disk.layer() else { return };
    println!("Container:        {l}, a {} disk", human(l.virtual_size));
    for (k, v) in &l.details {
        println!("  {:<18}{v}", format!("{k}:"));
    }
}

/// The LVM2 volume groups on the disk (the whole disk or its
/// partitions), each logical volume with its size and layout, and how to
/// open one. Damaged LVM metadata is reported, not fatal: the rest of the
/// disk is still described.
fn print_volumes(image: &Image) {
    use ext4kit::device::vdisk::lvm::disk_volume_groups;
    let Ok(disk) = image.disk() else { return };
    let groups = match disk_volume_groups(disk.device()) {
        Ok(g) => g,
        Err(e) => {
            println!("LVM2:             cannot be read: {e}");
            println!();
            return;
        }
    };
    if groups.is_empty() {
        return;
    }
    for g in &groups {
        println!("Volume group:     {} (extents of {})", g.name(), human(g.extent_size()));
        for lv in g.logical_volumes().iter().filter(|l| l.visible()) {
            let layout = match (lv.segment_types(), lv.stripes()) {
                (t, 1) if t == ["striped"] => "linear".to_string(),
                (t, n) if t == ["striped"] => format!("striped x{n}"),
                (t, _) => format!("{} (cannot be opened)", t.join(", ")),
            };
            println!("  {:<16}{:>10}  {layout}", lv.name(), human(lv.size()));
        }
        for (uuid, hint) in g.missing_physical_volumes() {
            println!("  missing physical volume {uuid} (last seen as {hint})");
        }
    }
    if let Some(lv) = groups.iter().flat_map(|g| g.logical_volumes()).find(|l| l.visible()) {
        println!(
            "Open one with --lv VG/LV or IMAGE@VG/LV, e.g.: ext4kit ls {}@{}/{} /",
            image.path.display(),
            lv.vg(),
            lv.name()
        );
    }
    println!();
}

/// The partition table: one line per partition, then its problems.
fn print_table(image: &Image, disk: &Disk) {
    let t = &disk.table;
    println!("Image:            {}", image.display());
    println!(
        "Partition table:  {}, {}-byte sectors, {}",
        t.kind,
        t.sector_size,
        match t.partitions.len() {
            1 => "1 partition".to_string(),
            n => format!("{n} partitions"),
        }
    );
    for n in &t.notes {
        println!("Note:             {n}");
    }
    println!();
    println!(
        "{:>4}  {:>14}  {:>10}  {:<22}  {:<16}  filesystem",
        "#", "start (bytes)", "size", "type", "name"
    );
    for p in &disk.parts {
        let ty = if t.kind == ext4kit::device::TableKind::Mbr {
            format!("{} ({})", p.part.type_name, p.part.type_id)
        } else {
            p.part.type_name.to_string()
        };
        let fs = if p.part.extended {
            "(extended: holds the logical partitions)".to_string()
        } else {
            p.fs_text()
        };
        println!(
            "{:>4}  {:>14}  {:>10}  {:<22}  {:<16}  {}",
            p.part.number,
            p.part.start,
            human(p.part.size),
            ty,
            p.part.name,
            fs
        );
    }
    for p in &disk.parts {
        if let Some(why) = &p.part.problem {
            println!("Partition {} cannot be opened: {why}", p.part.number);
        } else if let Some(why) = &p.part.write_conflict {
            println!("Partition {} opens read-only only: {why}", p.part.number);
        }
        if t.kind == ext4kit::device::TableKind::Gpt && p.part.type_name == "unknown" {
            println!("Partition {} type GUID: {}", p.part.number, p.part.type_id);
        }
    }
    if let Some(p) = disk.parts.iter().find(|p| p.holds_ext()) {
        println!();
        println!(
            "Open one with --partition N or IMAGE@N, e.g.: ext4kit ls {}@{} /",
            image.path.display(),
            p.part.number
        );
    }
}

/// The filesystem summary (and where it is, for a partition or offset).
fn print_summary(image: &Image, fs: &Fs, disk: Option<&Disk>) {
    let i = fs.info();
    let bs = i.block_size as u64;
    println!("Image:            {}", image.display());
    match image.loc {
        Location::Whole => {}
        Location::Offset(o) => println!("Offset:           {o} bytes"),
        Location::Partition(n) => {
            if let Some(p) = disk.and_then(|d| d.parts.iter().find(|p| p.part.number == n)) {
                let name = if p.part.name.is_empty() {
                    String::new()
                } else {
                    format!(" \"{}\"", p.part.name)
                };
                println!(
                    "Partition:        {n} of {} ({}), bytes {}..{} ({}), {}{name}",
                    disk.map_or(0, |d| d.parts.len()),
                    disk.map_or("?".to_string(), |d| d.table.kind.to_string()),
                    p.part.start,
                    p.part.end(),
                    human(p.part.size),
                    p.part.type_name
                );
            }
        }
    }
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
}

/// `info --compat`: for each reader of the survey (boot loaders, Android,
/// long-term kernels), whether it opens the image and which features stop
/// it, from the superblock's feature words alone (the library's
/// `readers` table), so an image the engine itself refuses is judged too.
pub fn readers(image: &Image) -> Result<(), String> {
    use ext4kit::readers::{image_features, Effect, SURVEY};
    let loc = image.resolve()?;
    let fail = |e: String| format!("{}: {e}", image.display());
    let disk = image.disk().map_err(fail)?;
    let dev = ext4kit::device::open_location(disk.device().clone(), loc).map_err(|e| fail(e.to_string()))?;
    let words = image_features(&*dev).map_err(|e| fail(e.to_string()))?;
    println!("Image:            {}", image.display());
    println!("Features:         {}", words.names().join(" "));
    println!();
    for r in SURVEY {
        let v = r.check(words);
        let list = |e: Effect| v.with(e).join(", ");
        let status = if !v.opens() {
            format!("cannot open: {}", list(Effect::Refuses))
        } else if !v.writable() {
            format!("read-only: {}", list(Effect::ReadOnly))
        } else if v.with(Effect::Limited).is_empty() {
            "opens".to_string()
        } else {
            format!("opens, with caveats: {}", list(Effect::Limited))
        };
        let ignored = list(Effect::Ignored);
        let ignored = if ignored.is_empty() {
            String::new()
        } else {
            format!(" (ignores {ignored})")
        };
        println!("{:<12}  {:<26}  {status}{ignored}", r.name(), r.describe());
        for o in v.obstacles.iter().filter(|o| o.effect != Effect::Ignored) {
            println!("{:<14}{} ({}): {}", "", o.feature, o.word.name(), o.why);
        }
    }
    Ok(())
}
