//! Copy a file from the host into an image, the way `cp` would through a
//! mount: open with O_CREAT|O_TRUNC, write in chunks, fsync, close — then
//! read it back and compare.
//!
//! ```sh
//! cargo run -p ext4kit --example copy_in -- HOST_FILE IMAGE /path/in/image
//! cargo run -p ext4kit --example copy_in     # into a fresh demo image
//! ```

mod common;

use std::error::Error;
use std::io::Read;
use std::path::PathBuf;

use ext4kit::{Access, Cred, OpenFlags};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let mut scratch = None;
    let (host_file, image, dest) = match args.as_slice() {
        [src, img, dest] => (PathBuf::from(src), PathBuf::from(img), dest.as_encoded_bytes().to_vec()),
        [] => {
            // No arguments: a fresh image and a host file to copy into it.
            let dir = common::scratch_dir("copy_in")?;
            let image = dir.join("demo.img");
            common::make_empty_image(&image, 32 << 20)?;
            let src = dir.join("data.bin");
            let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
            std::fs::write(&src, data)?;
            scratch = Some(dir);
            (src, image, b"/incoming/data.bin".to_vec())
        }
        _ => return Err("usage: copy_in [HOST_FILE IMAGE /path/in/image]".into()),
    };

    // `Fs::open_image` with `OpenOptions { read_only: false, .. }`.
    let fs = common::open_writable(&image)?;

    // The parent directory, if missing (`mkdir -p` of one level).
    let parent = match dest.iter().rposition(|&b| b == b'/') {
        Some(0) | None => &b"/"[..],
        Some(i) => &dest[..i],
    };
    if fs.lstat(parent).is_err() {
        fs.mkdir(parent, 0o755, &Cred::root())?;
    }

    // Write: O_WRONLY|O_CREAT|O_TRUNC. Writes land in the page cache;
    // blocks are allocated at writeback (delayed allocation), but the
    // space is claimed now, so a full filesystem fails here with ENOSPC,
    // never later.
    let flags = OpenFlags {
        access: Access::WriteOnly,
        create: true,
        trunc: true,
        ..Default::default()
    };
    let file = fs.open(&dest, flags)?;
    let mut src = std::fs::File::open(&host_file)?;
    let mut buf = vec![0u8; 64 << 10];
    let mut copied = 0u64;
    loop {
        let n = src.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let mut done = 0;
        while done < n {
            done += file.write(&fs, &buf[done..n])?;
        }
        copied += n as u64;
    }
    // fsync: the data, then the journal commit of the inode and the
    // directory entry; after it returns the copy survives a crash.
    file.fsync(&fs)?;
    fs.close_file(file)?;
    println!(
        "copied {copied} bytes from {} to {} (fsync'd)",
        host_file.display(),
        String::from_utf8_lossy(&dest)
    );

    // Read it back through a new open and compare with the host file.
    let file = fs.open(&dest, OpenFlags::default())?;
    let mut back = Vec::new();
    loop {
        let n = file.read(&fs, &mut buf)?;
        if n == 0 {
            break;
        }
        back.extend_from_slice(&buf[..n]);
    }
    fs.close_file(file)?;
    let same = back == std::fs::read(&host_file)?;
    println!(
        "read back {} bytes: {}",
        back.len(),
        if same { "identical" } else { "DIFFERENT" }
    );

    drop(fs);
    if let Some(dir) = scratch {
        std::fs::remove_dir_all(dir)?;
    }
    if !same {
        return Err("the copy differs from the source".into());
    }
    Ok(())
}
