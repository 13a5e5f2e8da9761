//! Open an image and walk it: every name, its type, permissions and size,
//! depth first — `ls -lR` in a few lines of the library.
//!
//! ```sh
//! cargo run -p ext4kit --example walk -- disk.img   # any ext2/3/4 image, opened read-only
//! cargo run -p ext4kit --example walk               # a small demo image made first
//! ```
//!
//! A read-only open never writes the image: a journal that needs recovery
//! is replayed in memory, so what is printed is the recovered tree.

mod common;

use std::error::Error;
use std::path::PathBuf;

use ext4kit::{Cred, FileType, Fs, OpenOptions};

fn main() -> Result<(), Box<dyn Error>> {
    let (image, scratch) = match std::env::args_os().nth(1) {
        Some(path) => (PathBuf::from(path), None),
        None => {
            let dir = common::scratch_dir("walk")?;
            let image = dir.join("demo.img");
            make_demo(&image)?;
            (image, Some(dir))
        }
    };

    // `OpenOptions::default()` is read-only.
    let fs = Fs::open_image(&image, &OpenOptions::default())?;
    walk(&fs, b"/")?;

    if let Some(dir) = scratch {
        std::fs::remove_dir_all(dir)?;
    }
    Ok(())
}

/// Print `dir` and everything below it.
fn walk(fs: &Fs, dir: &[u8]) -> Result<(), Box<dyn Error>> {
    // read_dir returns every entry, "." and ".." included, in on-disk
    // order; sort by name for a stable listing.
    let mut entries = fs.read_dir(dir)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    if dir == b"/" {
        print_entry(fs, b"/")?;
    }
    for e in entries {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let mut path = dir.to_vec();
        if !path.ends_with(b"/") {
            path.push(b'/');
        }
        path.extend_from_slice(&e.name);
        print_entry(fs, &path)?;
        if e.file_type == Some(FileType::Directory) {
            walk(fs, &path)?;
        }
    }
    Ok(())
}

/// One line per name: type, permission bits, size, path (and a symlink's
/// target). `lstat` does not follow a symlink in the last component.
fn print_entry(fs: &Fs, path: &[u8]) -> Result<(), Box<dyn Error>> {
    let st = fs.lstat(path)?;
    let kind = match st.ftype {
        FileType::Directory => 'd',
        FileType::Regular => 'f',
        FileType::Symlink => 'l',
        _ => '?',
    };
    let name = String::from_utf8_lossy(path);
    print!("{kind} {:04o} {:>8} {name}", st.mode & 0o7777, st.size);
    if st.ftype == FileType::Symlink {
        print!(" -> {}", String::from_utf8_lossy(&fs.read_link(path)?));
    }
    println!();
    Ok(())
}

/// A small tree to walk when no image is given.
fn make_demo(image: &std::path::Path) -> Result<(), Box<dyn Error>> {
    common::make_empty_image(image, 16 << 20)?;
    let fs = common::open_writable(image)?;
    let root = Cred::root();
    fs.mkdir(b"/etc", 0o755, &root)?;
    fs.write_file(b"/etc/hostname", b"demo\n", 0o644, 0, 0)?;
    fs.symlink(b"hostname", b"/etc/name", 0, 0)?;
    fs.mkdir(b"/home", 0o755, &root)?;
    fs.mkdir(b"/home/user", 0o700, &root)?;
    fs.write_file(b"/home/user/notes.txt", &b"walk me\n".repeat(1000), 0o600, 1000, 1000)?;
    // Dropping the last handle writes everything back and closes the
    // journal cleanly.
    Ok(())
}
