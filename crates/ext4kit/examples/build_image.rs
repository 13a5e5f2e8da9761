//! Build an image: make a filesystem with mkfs, populate it through the
//! library (directories, files, a symlink, a hard link, an owner, an
//! extended attribute), close it, and open it again read-only to see what
//! was made. The result passes `e2fsck -fn` and mounts with the kernel's
//! ext4.
//!
//! ```sh
//! cargo run -p ext4kit --example build_image -- out.img   # keep the image
//! cargo run -p ext4kit --example build_image              # in a temp dir, removed after
//! ```

mod common;

use std::error::Error;

use ext4kit::mkfs::MkfsOptions;
use ext4kit::{Cred, Fs, OpenOptions};

fn main() -> Result<(), Box<dyn Error>> {
    let (image, scratch) = match std::env::args_os().nth(1) {
        Some(path) => (std::path::PathBuf::from(path), None),
        None => {
            let dir = common::scratch_dir("build_image")?;
            (dir.join("built.img"), Some(dir))
        }
    };

    // 1. mkfs: an empty 64 MiB ext4 filesystem, mke2fs's defaults plus a
    //    label. (A fixed `clock` and `uuid` would make it reproducible.)
    let opts = MkfsOptions {
        label: "example".into(),
        ..Default::default()
    };
    common::make_image(&image, 64 << 20, &opts)?;

    // 2. Populate it. Every call is one POSIX operation; `root` is the
    //    caller's credentials (permission checks are those of the kernel).
    let fs = Fs::open_image(
        &image,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )?;
    let root = Cred::root();
    fs.mkdir(b"/etc", 0o755, &root)?;
    fs.write_file(b"/etc/hostname", b"example\n", 0o644, 0, 0)?;
    fs.mkdir(b"/usr", 0o755, &root)?;
    fs.mkdir(b"/usr/share", 0o755, &root)?;
    let readme = b"Built by ext4kit's build_image example.\n".repeat(200);
    fs.write_file(b"/usr/share/README", &readme, 0o644, 0, 0)?;
    fs.symlink(b"usr/share/README", b"/README", 0, 0)?;
    fs.link(b"/usr/share/README", b"/usr/share/README.hardlink", &root)?;
    fs.mkdir(b"/home", 0o755, &root)?;
    fs.mkdir(b"/home/user", 0o750, &root)?;
    fs.chown(b"/home/user", Some(1000), Some(1000), true, &root)?;
    fs.setxattr(b"/etc/hostname", b"user.comment", b"set by the example", 0, true, &root)?;

    // 3. Close: dropping the last handle writes back every dirty page,
    //    commits and checkpoints the journal, and marks the filesystem
    //    clean. (`fs.sync()` does the same without closing.)
    drop(fs);

    // 4. Open it again, read-only, and look.
    let fs = Fs::open_image(&image, &OpenOptions::default())?;
    let info = fs.info();
    println!("label: {}", info.label);
    println!(
        "block size: {}, blocks: {}, inodes: {}",
        info.block_size, info.blocks, info.inodes
    );
    println!("state: {}", info.state);
    let st = fs.statfs()?;
    // statfs counts data blocks, as the kernel's does: the journal and the
    // inode tables are not in `blocks`.
    println!(
        "in use: {} blocks, {} inodes",
        st.blocks - st.blocks_free,
        st.files - st.files_free
    );
    let readme_st = fs.stat(b"/README")?; // follows the symlink
    println!("/README -> {} bytes, {} links", readme_st.size, readme_st.nlink);
    let home = fs.stat(b"/home/user")?;
    println!("/home/user owner: {}:{}", home.uid, home.gid);
    let comment = fs.getxattr(b"/etc/hostname", b"user.comment")?;
    println!("/etc/hostname user.comment: {}", String::from_utf8_lossy(&comment));

    drop(fs);
    match scratch {
        Some(dir) => std::fs::remove_dir_all(dir)?,
        None => println!("image written to {}", image.display()),
    }
    Ok(())
}
