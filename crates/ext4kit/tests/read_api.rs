//! The library's read API on small images made by mke2fs: reads, holes and
//! unwritten extents, lock-free lseek, descriptor tables without atomics,
//! d_path, path-walk errors, and the feature rules for opening.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ext4kit::{Errno, Fs, OpenFlags, OpenOptions, Process, Whence};
use ext4kit_blockdev::MemDevice;
use ext4kit_format::superblock::Superblock;

struct Tmp(PathBuf);
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmpdir(tag: &str) -> Tmp {
    let d = std::env::temp_dir().join(format!("ext4kit-read-api-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Tmp(d)
}

fn sh(cmd: &mut Command) -> String {
    let out = ext4kit_testkit::run_ok(cmd, &[0]).unwrap_or_else(|e| panic!("{e} (apt-get install e2fsprogs)"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A tree with a file of every interesting shape, and its image.
fn image(dir: &Path, mkfs: &[&str]) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("d/e")).unwrap();
    std::fs::write(src.join("small"), b"hello\n").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.join("d/big"), &big).unwrap();
    // data, a 1 MiB hole, data
    let f = std::fs::File::create(src.join("sparse")).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(b"tail", (1 << 20) + 8192).unwrap();
    symlink("d/big", src.join("link")).unwrap();
    symlink("loop2", src.join("loop1")).unwrap();
    symlink("loop1", src.join("loop2")).unwrap();
    std::fs::write(src.join("d/e/deep"), b"deep").unwrap();
    let img = dir.join("img");
    sh(Command::new("mke2fs")
        .args(["-q", "-F"])
        .args(mkfs)
        .arg("-d")
        .arg(&src)
        .arg(&img)
        .arg("16M"));
    img
}

fn open(img: &Path) -> Arc<Fs> {
    Fs::open_image(img, &OpenOptions::default()).unwrap()
}

#[test]
fn reads_files_holes_and_symlinks() {
    let t = tmpdir("reads");
    let img = image(&t.0, &["-t", "ext4", "-b", "4096"]);
    let fs = open(&img);
    let f = fs.open(b"/d/big", OpenFlags::default()).unwrap();
    let mut all = Vec::new();
    let mut buf = vec![0u8; 7000]; // not a block multiple: exercises partial pages
    loop {
        let n = f.read(&fs, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        all.extend_from_slice(&buf[..n]);
    }
    let want: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(all, want);
    // Through the symlink, and pread in the middle.
    let l = fs.open(b"/link", OpenFlags::default()).unwrap();
    let mut b = [0u8; 10];
    assert_eq!(l.pread(&fs, 4095, &mut b).unwrap(), 10);
    assert_eq!(&b[..], &want[4095..4105]);
    // Holes read as zeros; SEEK_DATA / SEEK_HOLE find them.
    let s = fs.open(b"/sparse", OpenFlags::default()).unwrap();
    let mut hole = vec![1u8; 5000];
    assert_eq!(s.pread(&fs, 4096, &mut hole).unwrap(), 5000);
    assert!(hole.iter().all(|&x| x == 0));
    assert_eq!(s.lseek(&fs, 0, Whence::Hole).unwrap(), 4096);
    assert_eq!(s.lseek(&fs, 4096, Whence::Data).unwrap(), (1 << 20) + 8192);
    let end = (1u64 << 20) + 8192 + 4;
    assert_eq!(s.lseek(&fs, (1 << 20) + 8192, Whence::Hole).unwrap(), end);
    assert_eq!(
        s.lseek(&fs, end as i64, Whence::Data).unwrap_err().errno(),
        Errno::ENXIO
    );
    assert_eq!(fs.read_link(b"/link").unwrap(), b"d/big");
    assert_eq!(fs.stat(b"/link").unwrap().size, 300_000);
    assert_eq!(fs.lstat(b"/link").unwrap().size, 5);
}

#[test]
fn unwritten_extents_read_as_zeros() {
    let t = tmpdir("uninit");
    let img = image(&t.0, &["-t", "ext4"]);
    // debugfs's fallocate makes unwritten extents past the data.
    sh(Command::new("debugfs")
        .args(["-w", "-R", "fallocate /small 4 20"])
        .arg(&img));
    sh(Command::new("debugfs")
        .args(["-w", "-R", "sif /small size 90000"])
        .arg(&img));
    let fs = open(&img);
    let layout = fs.data_layout(fs.lstat(b"/small").unwrap().ino).unwrap();
    assert!(layout.runs.iter().any(|r| r.uninit), "no unwritten extent: {layout:?}");
    let f = fs.open(b"/small", OpenFlags::default()).unwrap();
    let mut b = vec![7u8; 90000];
    assert_eq!(f.pread(&fs, 0, &mut b).unwrap(), 90000);
    assert_eq!(&b[..6], b"hello\n");
    assert!(b[6..].iter().all(|&x| x == 0));
}

#[test]
fn lseek_follows_posix() {
    let t = tmpdir("lseek");
    let fs = open(&image(&t.0, &["-t", "ext4"]));
    let f = fs.open(b"/small", OpenFlags::default()).unwrap();
    assert_eq!(f.lseek(&fs, 3, Whence::Set).unwrap(), 3);
    assert_eq!(f.lseek(&fs, 2, Whence::Cur).unwrap(), 5);
    assert_eq!(f.lseek(&fs, -1, Whence::End).unwrap(), 5);
    assert_eq!(f.lseek(&fs, -7, Whence::Cur).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(f.position(), 5, "a failed lseek leaves the position alone");
    assert_eq!(
        f.lseek(&fs, 100, Whence::End).unwrap(),
        106,
        "seeking past the end is allowed"
    );
    let mut b = [0u8; 4];
    assert_eq!(f.read(&fs, &mut b).unwrap(), 0);
    // Many threads seeking one shared open file: every result is a value
    // some thread set (the position is one atomic, never torn).
    std::thread::scope(|s| {
        for k in 0..4i64 {
            let (fs, f) = (&fs, &f);
            s.spawn(move || {
                for i in 0..10_000i64 {
                    let p = f.lseek(fs, k * 1_000_000 + i, Whence::Set).unwrap();
                    assert_eq!(p, (k * 1_000_000 + i) as u64);
                    let c = f.position();
                    assert!(c % 1_000_000 < 10_000 && c / 1_000_000 < 4);
                }
            });
        }
    });
}

#[test]
fn descriptor_tables_unshared_and_shared() {
    let t = tmpdir("fds");
    let fs = open(&image(&t.0, &["-t", "ext4"]));
    let mut p = Process::new(fs.clone());
    let a = p.open("/small", OpenFlags::default()).unwrap();
    let b = p.open("/d/e/deep", OpenFlags::default()).unwrap();
    assert_eq!((a, b), (0, 1));
    let mut buf = [0u8; 16];
    assert_eq!(p.read(a, &mut buf).unwrap(), 6);
    let c = p.dup(a).unwrap();
    assert_eq!(p.lseek(c, 0, Whence::Cur).unwrap(), 6, "dup shares the position");
    p.close(a).unwrap();
    assert_eq!(p.read(a, &mut buf).unwrap_err().errno(), Errno::EBADF);
    assert_eq!(p.close(a).unwrap_err().errno(), Errno::EBADF);
    assert_eq!(
        p.open("/small", OpenFlags::default()).unwrap(),
        a,
        "lowest free number is reused"
    );
    // Share the table with another "thread": both see every descriptor.
    let mut q = p.share();
    assert!(p.is_shared() && q.is_shared());
    let d = q.open("/d/big", OpenFlags::default()).unwrap();
    assert_eq!(p.pread(d, &mut buf[..4], 0).unwrap(), 4);
    let h = std::thread::spawn(move || {
        let mut b = [0u8; 4];
        q.pread(1, &mut b, 0).unwrap();
        q.close(1).unwrap();
        b
    });
    assert_eq!(&h.join().unwrap(), b"deep");
    assert_eq!(p.read(1, &mut buf).unwrap_err().errno(), Errno::EBADF);
    // EMFILE at the limit.
    let mut r = Process::new(fs);
    r.set_max_fds(2);
    r.open("/small", OpenFlags::default()).unwrap();
    r.open("/small", OpenFlags::default()).unwrap();
    assert_eq!(
        r.open("/small", OpenFlags::default()).unwrap_err().errno(),
        Errno::EMFILE
    );
}

#[test]
fn path_walk_errors_and_d_path() {
    let t = tmpdir("walk");
    let fs = open(&image(&t.0, &["-t", "ext4"]));
    let e = |p: &[u8]| fs.resolve(p, true).unwrap_err().errno();
    assert_eq!(e(b"/nope"), Errno::ENOENT);
    assert_eq!(e(b"/nope"), Errno::ENOENT, "negative dentry answers the same");
    assert_eq!(e(b"/small/x"), Errno::ENOTDIR);
    assert_eq!(e(b"/loop1"), Errno::ELOOP);
    assert_eq!(e(&[b'a'; 256]), Errno::ENAMETOOLONG);
    assert_eq!(e(&b"/a".repeat(3000)), Errno::ENAMETOOLONG);
    assert!(fs.resolve(b"/loop1", false).is_ok(), "nofollow stops at the link");
    let d = fs.resolve(b"/d/./e/../e/deep", true).unwrap();
    assert_eq!(fs.d_path(&d), b"/d/e/deep");
    let via_link = fs.resolve(b"/link", true).unwrap();
    assert_eq!(fs.d_path(&via_link), b"/d/big");
    assert_eq!(fs.resolve(b"/..", true).unwrap().ino, 2);
    assert_eq!(fs.read_dir(b"/small").unwrap_err().errno(), Errno::ENOTDIR);
    let mut names: Vec<Vec<u8>> = fs.read_dir(b"/d").unwrap().into_iter().map(|e| e.name).collect();
    names.sort();
    assert_eq!(
        names,
        vec![b".".to_vec(), b"..".to_vec(), b"big".to_vec(), b"e".to_vec()]
    );
}

/// Rewrite the superblock of an image held in memory.
fn patch_sb(bytes: &mut [u8], f: impl FnOnce(&mut Superblock)) {
    let mut sb = Superblock::parse(&bytes[1024..2048]).unwrap();
    f(&mut sb);
    bytes[1024..2048].copy_from_slice(&sb.to_bytes_with_checksum());
}

#[test]
fn feature_rules_when_opening() {
    let t = tmpdir("features");
    let img = image(&t.0, &["-t", "ext4"]);
    let clean = std::fs::read(&img).unwrap();
    let opts = OpenOptions {
        read_only: false,
        ..Default::default()
    };
    let open_mem = |b: Vec<u8>| Fs::open_device(Arc::new(MemDevice::from_vec(b)), &opts);

    let fs = open_mem(clean.clone()).unwrap();
    assert!(fs.warnings().is_empty(), "{:?}", fs.warnings());

    let mut b = clean.clone();
    patch_sb(&mut b, |sb| sb.feature_incompat |= 0x10000); // encrypt
    let err = open_mem(b).unwrap_err().to_string();
    assert!(err.contains("encrypt"), "{err}");

    let mut b = clean.clone();
    patch_sb(&mut b, |sb| sb.feature_ro_compat |= 0x200); // bigalloc
    let fs = open_mem(b).unwrap();
    assert!(fs.info().read_only);
    assert!(
        fs.warnings().iter().any(|w| w.contains("bigalloc")),
        "{:?}",
        fs.warnings()
    );

    // needs_recovery over an empty log: a read-write open "replays"
    // nothing, clears the flag and goes on read-write; a read-only open
    // does the same in memory and leaves the bytes alone.
    let mut b = clean.clone();
    patch_sb(&mut b, |sb| sb.feature_incompat |= 0x4); // needs_recovery
    let dev = Arc::new(MemDevice::from_vec(b.clone()));
    let fs = Fs::open_device(dev.clone(), &opts).unwrap();
    assert!(!fs.info().read_only);
    assert!(
        fs.warnings().iter().any(|w| w.contains("recovery")),
        "{:?}",
        fs.warnings()
    );
    assert_eq!(fs.stat(b"/small").unwrap().size, 6, "still readable");
    drop(fs);
    let after = Superblock::parse(&dev.to_vec()[1024..2048]).unwrap();
    assert_eq!(after.feature_incompat & 0x4, 0, "needs_recovery cleared on disk");
    let ro = Arc::new(MemDevice::from_vec_read_only(b.clone()));
    let fs = Fs::open_device(ro.clone(), &OpenOptions::default()).unwrap();
    assert!(fs.info().read_only);
    assert_eq!(fs.stat(b"/small").unwrap().size, 6);
    drop(fs);
    assert!(ro.to_vec() == b, "a read-only open changed the image");

    let mut b = clean;
    b[1024 + 0x38] = 0; // magic
    let err = open_mem(b).unwrap_err().to_string();
    assert!(err.contains("superblock") && err.contains("magic"), "{err}");
}

#[test]
fn no_filetype_and_128_byte_inodes() {
    let t = tmpdir("oldfmt");
    let img = image(&t.0, &["-t", "ext2", "-O", "^filetype", "-I", "128"]);
    let fs = open(&img);
    let ents = fs.read_dir(b"/d").unwrap();
    assert!(
        ents.iter().all(|e| e.file_type.is_some()),
        "types filled in from inodes"
    );
    assert_eq!(fs.stat(b"/d/e/deep").unwrap().size, 4);
    assert_eq!(fs.read_link(b"/link").unwrap(), b"d/big");
}
