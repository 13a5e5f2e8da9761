//! `ext4kit demo`: the engine on an image built into the binary.
//!
//! The sample (`assets/sample.img.gz`, a 4 MiB ext4 image with
//! metadata_csum made by mke2fs 1.47 from a small tree) is decompressed
//! into memory and opened through the library exactly as a file image
//! would be: a whole read path — superblock, groups, inodes, extents,
//! directories, symlinks — with nothing but this executable.

use std::io::Read;
use std::sync::Arc;

use ext4kit::device::MemDevice;
use ext4kit::{FileType, Fs, OpenFlags, OpenOptions};

use crate::fmt::{human, mode_string};

static SAMPLE: &[u8] = include_bytes!("../../assets/sample.img.gz");

/// Open the embedded sample, print its summary, its tree and one file.
pub fn run(budget: usize) -> Result<(), String> {
    let mut img = Vec::new();
    flate2::read::GzDecoder::new(SAMPLE)
        .read_to_end(&mut img)
        .map_err(|e| format!("embedded sample image: {e}"))?;
    let fs = Fs::open_device(
        Arc::new(MemDevice::from_vec_read_only(img)),
        &OpenOptions {
            read_only: true,
            cache_budget: budget,
            ..Default::default()
        },
    )
    .map_err(|e| format!("embedded sample image: {e}"))?;
    let i = fs.info();
    println!(
        "Embedded sample image: {} ext4, label {:?}, {} blocks of {} bytes, {} free",
        human(i.blocks * i.block_size as u64),
        i.label,
        i.blocks,
        i.block_size,
        human(i.free_blocks * i.block_size as u64)
    );
    println!("Features: {}\n", i.features.join(" "));
    println!("Tree:");
    tree(&fs, b"/", 0).map_err(|e| format!("embedded sample image: {e}"))?;
    println!("\n$ ext4kit cat <sample> /README.txt");
    let f = fs
        .open(b"/README.txt", OpenFlags::default())
        .map_err(|e| format!("embedded sample image: {e}"))?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = f
        .read(&fs, &mut buf)
        .map_err(|e| format!("embedded sample image: {e}"))?;
    print!("{}", String::from_utf8_lossy(&buf[..n]));
    Ok(())
}

fn tree(fs: &Fs, dir: &[u8], depth: usize) -> ext4kit::Result<()> {
    let mut entries = fs.read_dir(dir)?;
    entries.retain(|e| e.name != b"." && e.name != b"..");
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let total = entries.len();
    for (k, e) in entries.into_iter().enumerate() {
        let st = fs.stat_ino(e.ino)?;
        let name = String::from_utf8_lossy(&e.name).into_owned();
        let mut path = dir.to_vec();
        if !path.ends_with(b"/") {
            path.push(b'/');
        }
        path.extend_from_slice(&e.name);
        if total > 12 && k == 3 {
            println!("{}  ... {} more entries", "  ".repeat(depth), total - 6);
        }
        if total > 12 && (3..total - 3).contains(&k) {
            continue;
        }
        let extra = match st.ftype {
            FileType::Symlink => format!(" -> {}", String::from_utf8_lossy(&fs.read_link_ino(e.ino)?)),
            FileType::Regular => format!("  ({})", human(st.size)),
            _ => String::new(),
        };
        println!(
            "{}  {} {}{}",
            "  ".repeat(depth),
            mode_string(st.ftype, st.mode),
            name,
            extra
        );
        if st.ftype == FileType::Directory && name != "lost+found" {
            tree(fs, &path, depth + 1)?;
        }
    }
    Ok(())
}
