//! `ext4kit stat [--json] IMAGE PATH`.

use super::{Failure, Image};

use ext4kit::{FileType, Fs, Stat};
use serde_json::{json, Map, Value};

use crate::fmt::{mode_string, time_full};
use crate::json;

/// Text shows this many runs of the data map; JSON all of them.
const RUNS_SHOWN: usize = 64;

/// Print one inode's attributes and data layout, as text or (`json`) as
/// one JSON document.
pub fn run(image: &Image, path: &str, json_out: bool, budget: usize) -> Result<(), Failure> {
    let fs = super::open_fs(image, budget, json_out)?;
    let s = fs.lstat(path.as_bytes()).map_err(|e| Failure::engine(image, path, e))?;
    if json_out {
        return print_json(&fs, image, path, &s);
    }
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
    let layout = fs.data_layout(s.ino).map_err(|e| Failure::engine(image, path, e))?;
    println!("Data: {}", layout.kind);
    for r in layout.runs.iter().take(RUNS_SHOWN) {
        println!(
            "  logical {:>10} .. {:<10} -> physical {:>12} .. {}{}",
            r.logical,
            r.logical + r.len - 1,
            r.physical,
            r.physical + r.len - 1,
            if r.uninit { "  (unwritten)" } else { "" }
        );
    }
    if layout.runs.len() > RUNS_SHOWN {
        println!("  ... {} more runs", layout.runs.len() - RUNS_SHOWN);
    }
    Ok(())
}

/// `stat --json`: the inode's attributes ([`json::put_inode`]) with
/// `path`, `flags`, `generation`, `xattr_block`, `xattrs` (names and
/// sizes; `null` with `xattrs_error` when unreadable) and `data` (the
/// map's kind and every run).
fn print_json(fs: &Fs, image: &Image, path: &str, s: &Stat) -> Result<(), Failure> {
    let target = if s.ftype == FileType::Symlink {
        fs.read_link(s.ino).ok()
    } else {
        None
    };
    let mut m = Map::new();
    m.insert("path".into(), path.into());
    json::put_inode(&mut m, s, target.as_deref());
    m.insert("flags".into(), s.flags.into());
    m.insert("generation".into(), s.generation.into());
    m.insert(
        "xattr_block".into(),
        if s.file_acl != 0 {
            s.file_acl.into()
        } else {
            Value::Null
        },
    );
    match fs.xattrs(s.ino) {
        Ok(x) => {
            let list: Vec<Value> = x
                .iter()
                .map(|(n, v)| {
                    let mut e = Map::new();
                    json::put_bytes(&mut e, "name", n);
                    e.insert("size".into(), v.len().into());
                    Value::Object(e)
                })
                .collect();
            m.insert("xattrs".into(), list.into());
        }
        Err(e) => {
            m.insert("xattrs".into(), Value::Null);
            m.insert("xattrs_error".into(), e.to_string().into());
        }
    }
    let layout = fs.data_layout(s.ino).map_err(|e| Failure::engine(image, path, e))?;
    let runs: Vec<Value> = layout
        .runs
        .iter()
        .map(|r| json!({"logical": r.logical, "physical": r.physical, "len": r.len, "unwritten": r.uninit}))
        .collect();
    m.insert("data".into(), json!({"kind": layout.kind, "runs": runs}));
    json::print_document(&Value::Object(m))?;
    Ok(())
}
