//! The first writes: creating files, fifos, sockets, device nodes and fast
//! symlinks through transaction handles — in linear and htree directories,
//! on ext2, ext4 with metadata_csum and ext4 with uninit_bg. After every
//! run `e2fsck -fn` must be clean, a fresh open must read what was written,
//! and (as root) the kernel must see it too.

use ext4kit::{NewInode, NodeKind};
use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit::{Errno, FileType, Fs, OpenOptions};

fn sh(cmd: &mut Command) -> String {
    let out = ext4kit_testkit::run_ok(cmd, &[0]).unwrap_or_else(|e| panic!("{e} (apt-get install e2fsprogs)"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn image(dir: &Path, tag: &str, mkfs: &[&str]) -> PathBuf {
    let src = dir.join(format!("src-{tag}"));
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::create_dir_all(src.join("big")).unwrap();
    for i in 0..400 {
        std::fs::write(src.join("big").join(format!("existing-entry-{i:04}")), b"").unwrap();
    }
    std::fs::write(src.join("sub/old"), b"old").unwrap();
    let img = dir.join(format!("{tag}.img"));
    sh(Command::new("mke2fs")
        .args(["-q", "-F"])
        .args(mkfs)
        .arg("-d")
        .arg(&src)
        .arg(&img)
        .arg("32M"));
    // Index the big directory (mke2fs -d leaves it linear).
    let st = Command::new("e2fsck").arg("-fyD").arg(&img).output().unwrap();
    assert!(st.status.code().is_some_and(|c| c <= 1), "e2fsck -fyD: {st:?}");
    img
}

fn fsck_clean(img: &Path) {
    ext4kit_testkit::e2fsck_clean(img).unwrap_or_else(|e| panic!("{e}"));
}

/// File sizes written: empty-ish, block boundaries, and multi-run sizes
/// (under 12 + block_size/4 blocks so ext2's single indirect suffices).
const SIZES: [usize; 6] = [1, 1023, 4096, 4097, 100_000, 500_000];

fn content(n: usize, salt: usize) -> Vec<u8> {
    (0..n).map(|k| ((k * 31 + salt * 7) % 251) as u8).collect()
}

fn exercise(img: &Path, htree_expected: bool) -> usize {
    let fs = Fs::open_image(
        img,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        fs.stat(b"/big").unwrap().flags & 0x1000 != 0,
        htree_expected,
        "the big directory's index flag"
    );
    fs.create(&NewInode::file(b"/hello").mode(0o644).owner(1000, 1000))
        .unwrap();
    fs.create(&NewInode::file(b"/sub/new-file").mode(0o600).owner(0, 0))
        .unwrap();
    fs.create(&NewInode::new(b"/fifo", NodeKind::Fifo).mode(0o640).owner(0, 0))
        .unwrap();
    fs.create(&NewInode::new(b"/sock", NodeKind::Socket).mode(0o755).owner(0, 0))
        .unwrap();
    fs.create(
        &NewInode::new(b"/null", NodeKind::CharDevice(1, 3))
            .mode(0o666)
            .owner(0, 0),
    )
    .unwrap();
    fs.create(
        &NewInode::new(b"/bigdev", NodeKind::BlockDevice(259, 300))
            .mode(0o660)
            .owner(0, 6),
    )
    .unwrap();
    fs.create(&NewInode::symlink(b"/link", b"sub/new-file").owner(0, 0))
        .unwrap();
    for (i, &n) in SIZES.iter().enumerate() {
        fs.write_file(
            &NewInode::file(format!("/data-{i}").as_bytes()).mode(0o644).owner(0, 0),
            &content(n, i),
        )
        .unwrap();
    }
    // The leaves e2fsck -D packed are nearly full: inserting splits them
    // (htree) or appends blocks (linear).
    let mut made = Vec::new();
    for i in 0..150 {
        let p = format!("/big/new-{i}-{}", "x".repeat(i % 40));
        fs.create(&NewInode::file(p.as_bytes()).mode(0o644).owner(0, 0))
            .unwrap();
        made.push(p);
    }
    // Errors leave nothing behind.
    assert_eq!(
        fs.create(&NewInode::file(b"/hello").mode(0o644).owner(0, 0))
            .unwrap_err()
            .errno(),
        Errno::EEXIST
    );
    assert_eq!(
        fs.create(&NewInode::file(b"/nodir/x").mode(0o644).owner(0, 0))
            .unwrap_err()
            .errno(),
        Errno::ENOENT
    );
    assert_eq!(
        fs.create(&NewInode::file(b"/hello/x").mode(0o644).owner(0, 0))
            .unwrap_err()
            .errno(),
        Errno::ENOTDIR
    );
    assert_eq!(
        fs.create(&NewInode::file(&[b'n'; 256]).mode(0o644).owner(0, 0))
            .unwrap_err()
            .errno(),
        Errno::ENAMETOOLONG
    );
    // Visible at once through the same Fs (the dentry cache was updated).
    assert_eq!(fs.stat(b"/hello").unwrap().uid, 1000);
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(img);

    let fs = Fs::open_image(img, &OpenOptions::default()).unwrap();
    let st = fs.stat(b"/hello").unwrap();
    assert_eq!(
        (st.ftype, st.perm(), st.uid, st.gid, st.size, st.nlink),
        (FileType::Regular, 0o644, 1000, 1000, 0, 1)
    );
    assert_eq!(fs.lstat(b"/fifo").unwrap().ftype, FileType::Fifo);
    assert_eq!(fs.lstat(b"/sock").unwrap().ftype, FileType::Socket);
    assert_eq!(fs.lstat(b"/null").unwrap().rdev, (1, 3));
    assert_eq!(fs.lstat(b"/bigdev").unwrap().rdev, (259, 300));
    assert_eq!(fs.read_link(b"/link").unwrap(), b"sub/new-file");
    assert_eq!(fs.stat(b"/link").unwrap().perm(), 0o600);
    for (i, &n) in SIZES.iter().enumerate() {
        let f = fs
            .open(format!("/data-{i}").as_bytes(), ext4kit::OpenFlags::default())
            .unwrap();
        let mut got = vec![0u8; n + 10];
        assert_eq!(fs.pread(&f, 0, &mut got).unwrap(), n);
        assert!(got[..n] == content(n, i)[..], "data-{i} differs");
    }
    assert_eq!(fs.read_dir(b"/big").unwrap().len(), 2 + 400 + made.len());
    for p in &made {
        fs.stat(p.as_bytes()).unwrap();
    }
    drop(fs);

    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("the kernel cross-check needs a loop mount ({e}); CI runs as root");
    }
    let mnt_dir = img.with_extension("mnt");
    let m = ext4kit_testkit::LoopMount::mount(img, &mnt_dir, "ext4", true).unwrap();
    let mnt = m.path().to_path_buf();
    let check = || -> Result<(), String> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let m = std::fs::symlink_metadata(mnt.join("hello")).map_err(|e| e.to_string())?;
        if !(m.is_file() && m.mode() & 0o7777 == 0o644 && m.uid() == 1000) {
            return Err(format!("hello: {m:?}"));
        }
        if !std::fs::symlink_metadata(mnt.join("fifo"))
            .map_err(|e| e.to_string())?
            .file_type()
            .is_fifo()
        {
            return Err("fifo".into());
        }
        let n = std::fs::symlink_metadata(mnt.join("null")).map_err(|e| e.to_string())?;
        if !(n.file_type().is_char_device() && n.rdev() == 0x103) {
            return Err(format!("null rdev {:#x}", n.rdev()));
        }
        if std::fs::read_link(mnt.join("link")).map_err(|e| e.to_string())? != Path::new("sub/new-file") {
            return Err("link".into());
        }
        for (i, &n) in SIZES.iter().enumerate() {
            let got = std::fs::read(mnt.join(format!("data-{i}"))).map_err(|e| e.to_string())?;
            if got != content(n, i) {
                return Err(format!("kernel reads data-{i} differently"));
            }
        }
        let count = std::fs::read_dir(mnt.join("big")).map_err(|e| e.to_string())?.count();
        if count != 400 + made.len() {
            return Err(format!("big has {count} entries"));
        }
        Ok(())
    };
    let r = check();
    m.unmount().unwrap();
    r.unwrap();
    made.len()
}

fn run(tag: &str, mkfs: &[&str], htree: bool) {
    let dir = std::env::temp_dir().join(format!("ext4kit-write-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let img = image(&dir, tag, mkfs);
    let made = exercise(&img, htree);
    eprintln!("{tag}: {made} of 150 names fitted in /big without growing it");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn create_on_ext4_metadata_csum() {
    run("ext4", &["-t", "ext4", "-b", "1024"], true);
}

#[test]
fn create_on_ext4_uninit_bg() {
    run(
        "ext4-uninit-bg",
        &["-t", "ext4", "-O", "^metadata_csum,uninit_bg", "-b", "4096"],
        true,
    );
}

#[test]
fn create_on_ext2_linear() {
    run("ext2", &["-t", "ext2", "-O", "^dir_index", "-b", "2048"], false);
}

/// A file larger than one group: allocation moves on to groups whose block
/// bitmaps were never initialised (BLOCK_UNINIT) and must build them from
/// the layout exactly as e2fsck computes it.
#[test]
fn allocation_spills_into_uninitialised_groups() {
    let dir = std::env::temp_dir().join(format!("ext4kit-write-spill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("spill.img");
    sh(Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-b", "1024"])
        .arg(&img)
        .arg("64M"));
    let uninit_before = sh(Command::new("dumpe2fs").arg(&img)).matches("BLOCK_UNINIT").count();
    assert!(uninit_before > 2, "mke2fs left no BLOCK_UNINIT groups to test with");
    let fs = Fs::open_image(
        &img,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap();
    let data = content(12 << 20, 3);
    fs.write_file(&NewInode::file(b"/twelve-mib").mode(0o644).owner(0, 0), &data)
        .unwrap();
    let runs = fs.data_layout(fs.stat(b"/twelve-mib").unwrap().ino).unwrap().runs;
    assert!(runs.len() >= 2, "expected the file to cross groups: {runs:?}");
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
    let uninit_after = sh(Command::new("dumpe2fs").arg(&img)).matches("BLOCK_UNINIT").count();
    assert!(
        uninit_after < uninit_before,
        "no group was initialised ({uninit_before} -> {uninit_after})"
    );
    let fs = Fs::open_image(&img, &OpenOptions::default()).unwrap();
    let f = fs.open(b"/twelve-mib", ext4kit::OpenFlags::default()).unwrap();
    let mut got = vec![0u8; data.len()];
    assert_eq!(fs.pread(&f, 0, &mut got).unwrap(), data.len());
    assert!(got == data);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Several threads creating and filling files at once, in different
/// directories and in one shared directory: group locks, block locks and
/// copy-on-write metadata buffers must not lose an update.
#[test]
fn concurrent_creates_stay_consistent() {
    let dir = std::env::temp_dir().join(format!("ext4kit-write-conc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = dir.join("src");
    for d in ["d0", "d1", "d2", "d3", "shared"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    let img = dir.join("conc.img");
    sh(Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-b", "4096", "-N", "4096", "-d"])
        .arg(&src)
        .arg(&img)
        .arg("64M"));
    let fs = Fs::open_image(
        &img,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap();
    std::thread::scope(|s| {
        for t in 0..4usize {
            let fs = &fs;
            s.spawn(move || {
                for i in 0..40usize {
                    let own = format!("/d{t}/f{i}");
                    fs.write_file(
                        &NewInode::file(own.as_bytes()).mode(0o644).owner(0, 0),
                        &content(3000 + i * 97, t),
                    )
                    .unwrap();
                    fs.create(
                        &NewInode::file(format!("/shared/t{t}-{i}").as_bytes())
                            .mode(0o600)
                            .owner(0, 0),
                    )
                    .unwrap();
                }
            });
        }
    });
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
    let fs = Fs::open_image(&img, &OpenOptions::default()).unwrap();
    assert_eq!(fs.read_dir(b"/shared").unwrap().len(), 2 + 160);
    for t in 0..4usize {
        for i in 0..40usize {
            let p = format!("/d{t}/f{i}");
            let f = fs.open(p.as_bytes(), ext4kit::OpenFlags::default()).unwrap();
            let n = 3000 + i * 97;
            let mut got = vec![0u8; n];
            assert_eq!(fs.pread(&f, 0, &mut got).unwrap(), n);
            assert!(got == content(n, t), "{p} differs");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
