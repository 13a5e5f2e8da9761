//! What an ext4 image served over HTTP costs on the wire for the two
//! workloads users ask about: `ls -R` (a directory walk with a stat of
//! every entry) and `get` (one file copied out). Prints requests, bytes
//! fetched and bytes the filesystem needed, per fetch unit, and checks the
//! walk and the copy are right. Needs mke2fs (e2fsprogs) and nginx.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::{image_bytes, Nginx};
use ext4kit::{FileType, Fs, OpenFlags, OpenOptions};
use ext4kit_remote::{open_url, RemoteDevice, RemoteOptions, RemoteStats};

/// A tree of 20 directories of 40 small files each, and one 16 MiB file.
fn make_tree(root: &Path) -> Vec<u8> {
    for d in 0..20 {
        let dir = root.join(format!("dir{d:02}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for f in 0..40 {
            std::fs::write(dir.join(format!("file{f:03}.txt")), format!("{d}/{f}\n").repeat(f + 1)).expect("write");
        }
    }
    let big = image_bytes(16 << 20, 42);
    std::fs::write(root.join("big.bin"), &big).expect("write big");
    big
}

fn walk(fs: &Fs, path: &mut Vec<u8>, entries: &mut usize) {
    for e in fs.read_dir(&path[..]).expect("read_dir") {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let len = path.len();
        if path.last() != Some(&b'/') {
            path.push(b'/');
        }
        path.extend_from_slice(&e.name);
        let st = fs.lstat(&path[..]).expect("lstat");
        *entries += 1;
        if e.file_type == Some(FileType::Directory) {
            walk(fs, path, entries);
        }
        let _ = st;
        path.truncate(len);
    }
}

fn report(what: &str, block: u64, s: &RemoteStats) {
    eprintln!(
        "{what:>6} block {:>5} KiB: {:>4} requests, {:>9} bytes fetched, {:>9} bytes needed ({:.1}x), {} cache hits",
        block >> 10,
        s.requests,
        s.bytes_fetched,
        s.bytes_read,
        s.bytes_fetched as f64 / s.bytes_read.max(1) as f64,
        s.cache_hits
    );
}

#[test]
fn ls_r_and_get_over_http() {
    let src = tempfile::tempdir().expect("tempdir");
    let big = make_tree(src.path());
    let nginx = Nginx::start();
    let img = nginx.put("fs.img", &[]);
    let out = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-d"])
        .arg(src.path())
        .arg(&img)
        .arg("64M")
        .output()
        .unwrap_or_else(|e| panic!("cannot run mke2fs (apt-get install e2fsprogs): {e}"));
    assert!(out.status.success(), "mke2fs: {}", String::from_utf8_lossy(&out.stderr));

    for block in [64 << 10, 256 << 10, 1 << 20] {
        let opts = RemoteOptions {
            block_size: block,
            ..RemoteOptions::default()
        };
        let open = || -> (Arc<RemoteDevice>, Arc<Fs>) {
            let dev = Arc::new(open_url(&nginx.url("/fs.img"), &opts).expect("open"));
            let fs = Fs::open_device(dev.clone(), &OpenOptions::default()).expect("mount");
            (dev, fs)
        };

        let (dev, fs) = open();
        let mut entries = 0;
        walk(&fs, &mut b"/".to_vec(), &mut entries);
        // 20 dirs + 800 files + big.bin + lost+found.
        assert_eq!(entries, 20 + 800 + 1 + 1);
        report("ls -R", block, &dev.stats());
        drop(fs);

        let (dev, fs) = open();
        let f = fs.open(b"/big.bin", OpenFlags::default()).expect("open big.bin");
        let mut got = Vec::with_capacity(big.len());
        let mut buf = vec![0u8; 128 << 10];
        loop {
            let n = fs.read(&f, &mut buf).expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got == big, "big.bin differs");
        report("get", block, &dev.stats());
    }
}
