//! `ext4kit stat IMAGE PATH`.

use super::Image;

use ext4kit::FileType;

use crate::fmt::{mode_string, time_full};

/// Print one inode's attributes and data layout.
pub fn run(image: &Image, path: &str, budget: usize) -> Result<(), String> {
    let fs = super::open(image, budget)?;
    let s = fs.lstat(path.as_bytes()).map_err(|e| super::err(image, path, e))?;
    let kind = match s.ftype {
        FileType::Regular => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::CharDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
    };
    println!("  File: {path}");
    if s.ftype == FileType::Symlink {
        if let Ok(t) = fs.read_link(s.ino) {
            println!("Target: {}", String::from_utf8_lossy(&t));
        }
    }
    println!(" Inode: {:<10} Type: {kind}", s.ino);
    println!(
        "  Mode: {:04o} ({})  Uid: {}  Gid: {}",
        s.perm(),
        mode_string(s.ftype, s.mode),
        s.uid,
        s.gid
    );
    println!(
        "  Size: {:<12} Links: {}  Blocks (512 B): {}",
        s.size, s.nlink, s.blocks
    );
    if matches!(s.ftype, FileType::CharDevice | FileType::BlockDevice) {
        println!("Device: {}, {}", s.rdev.0, s.rdev.1);
    }
    println!(" Flags: {:#010x}  Generation: {}", s.flags, s.generation);
    println!("Access: {}", time_full(s.atime));
    println!("Modify: {}", time_full(s.mtime));
    println!("Change: {}", time_full(s.ctime));
    if s.crtime.sec != 0 || s.crtime.nsec != 0 {
        println!(" Birth: {}", time_full(s.crtime));
    }
    if s.file_acl != 0 {
        println!("Xattr block: {}", s.file_acl);
    }
    match fs.xattrs(s.ino) {
        Ok(x) if !x.is_empty() => {
            println!("Xattrs:");
            for (n, v) in x {
                println!("  {} ({} bytes)", String::from_utf8_lossy(&n), v.len());
            }
        }
        Ok(_) => {}
        Err(e) => println!("Xattrs: unreadable: {e}"),
    }
    let layout = fs.data_layout(s.ino).map_err(|e| super::err(image, path, e))?;
    println!("Data: {}", layout.kind);
    for r in layout.runs.iter().take(64) {
        println!(
            "  logical {:>10} .. {:<10} -> physical {:>12} .. {}{}",
            r.logical,
            r.logical + r.len - 1,
            r.physical,
            r.physical + r.len - 1,
            if r.uninit { "  (unwritten)" } else { "" }
        );
    }
    if layout.runs.len() > 64 {
        println!("  ... {} more runs", layout.runs.len() - 64);
    }
    Ok(())
}
