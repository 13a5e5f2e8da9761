//! VMDK images made by qemu-img (Debian's qemu-utils), read and written
//! through `VmdkDisk`, checked against the raw disk they were made from
//! and, after our writes, by qemu-img itself (`check`, `convert`,
//! `compare`).
//!
//! qemu-img and mke2fs are required: without them these tests fail with
//! the package to install, rather than passing without testing anything.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ext4kit_blockdev::FileDevice;
use ext4kit_vdisk::vmdk::VmdkDisk;
use ext4kit_vdisk::{BlockDevice, DiskImage, NamedFiles};
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;

/// The first of `names` that runs, or a failure saying what to install.
fn tool(names: &[&str], version_arg: &str, package: &str) -> String {
    for name in names {
        if Command::new(name).arg(version_arg).output().is_ok() {
            return name.to_string();
        }
    }
    panic!(
        "{} is needed by this test and was not found: install {package} (apt-get install {package})",
        names[0]
    )
}

fn qemu_img() -> String {
    tool(&["qemu-img", "/usr/bin/qemu-img"], "--version", "qemu-utils")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("ext4kit-vmdk-qemu-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An ext4 made by mke2fs from a directory of files: 64 MiB, or filling a
/// sparse file truncated to `truncate_to` bytes.
fn make_raw(dir: &Dir, truncate_to: Option<u64>) -> PathBuf {
    let files = dir.path("files");
    std::fs::create_dir_all(files.join("sub")).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for i in 0..12 {
        let len = rng.random_range(1..600_000usize);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        std::fs::write(files.join(format!("f{i}")), &data).unwrap();
    }
    std::fs::write(files.join("sub/hello.txt"), b"hello, vmdk\n").unwrap();
    let raw = dir.path("raw.img");
    let mke2fs = tool(&["mke2fs", "/usr/sbin/mke2fs", "/sbin/mke2fs"], "-V", "e2fsprogs");
    let mut cmd = Command::new(mke2fs);
    cmd.args(["-q", "-F", "-t", "ext4", "-d"]).arg(&files).arg(&raw);
    match truncate_to {
        Some(size) => {
            std::fs::File::create(&raw).unwrap().set_len(size).unwrap();
        }
        None => {
            cmd.arg("64M");
        }
    }
    run(&mut cmd);
    raw
}

fn convert(raw: &Path, subformat: &str, out: &Path) {
    run(Command::new(qemu_img())
        .args(["convert", "-f", "raw", "-O", "vmdk", "-o"])
        .arg(format!("subformat={subformat}"))
        .arg(raw)
        .arg(out));
}

fn open(path: &Path, writable: bool) -> io::Result<VmdkDisk> {
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(path, writable)?);
    VmdkDisk::open(dev, writable, &NamedFiles::beside(path, false))
}

/// Every byte of `disk` equals `raw`'s.
fn assert_same(disk: &dyn BlockDevice, raw: &Path, what: &str) {
    let f = std::fs::File::open(raw).unwrap();
    let len = f.metadata().unwrap().len();
    assert_eq!(disk.size(), len, "{what}: size");
    let chunk = 4 * MIB;
    let (mut a, mut b) = (vec![0u8; chunk as usize], vec![0u8; chunk as usize]);
    let mut off = 0;
    while off < len {
        let n = (len - off).min(chunk) as usize;
        disk.read_at(off, &mut a[..n])
            .unwrap_or_else(|e| panic!("{what}: read at {off}: {e}"));
        f.read_exact_at(&mut b[..n], off).unwrap();
        if a[..n] != b[..n] {
            let i = (0..n).find(|&i| a[i] != b[i]).unwrap_or(0);
            panic!("{what}: byte {} differs from the raw image", off + i as u64);
        }
        off += n as u64;
    }
}

#[test]
fn qemu_made_images_read_back_as_the_raw_disk() {
    let dir = Dir::new("read");
    let raw = make_raw(&dir, None);
    for sub in ["monolithicSparse", "streamOptimized", "monolithicFlat"] {
        let img = dir.path(&format!("{sub}.vmdk"));
        convert(&raw, sub, &img);
        let disk = open(&img, false).unwrap_or_else(|e| panic!("{sub}: {e}"));
        let info = disk.layer();
        assert_eq!(info.variant, sub, "{info:?}");
        assert_eq!(info.virtual_size, 64 * MIB);
        assert_same(&disk, &raw, sub);
        let by_path = VmdkDisk::open_path(&img, false, &NamedFiles::beside(&img, false)).unwrap();
        assert_same(&by_path, &raw, &format!("{sub} by path"));
    }
}

#[test]
fn split_images_over_2_gib_read_back_as_the_raw_disk() {
    let dir = Dir::new("split");
    let raw = make_raw(&dir, Some(2100 * MIB));
    // Data across the 2 GiB split and in the last extent's tail.
    let f = std::fs::OpenOptions::new().write(true).open(&raw).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    for at in [2048 * MIB - 70_000, 2099 * MIB + 12_345] {
        let data: Vec<u8> = (0..300_000).map(|_| rng.random()).collect();
        f.write_all_at(&data, at).unwrap();
    }
    drop(f);
    for sub in ["twoGbMaxExtentSparse", "twoGbMaxExtentFlat"] {
        let img = dir.path(&format!("{sub}.vmdk"));
        convert(&raw, sub, &img);
        let disk = open(&img, false).unwrap_or_else(|e| panic!("{sub}: {e}"));
        let info = disk.layer();
        assert_eq!(info.variant, sub);
        assert_eq!(info.details[0], ("extents".to_string(), "2".to_string()), "{info:?}");
        assert_same(&disk, &raw, sub);
    }
}

/// Random writes through a writable VmdkDisk, mirrored into `shadow`.
fn random_writes(disk: &VmdkDisk, shadow: &mut [u8], seed: u64, n: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let size = shadow.len();
    for i in 0..n {
        let len = rng.random_range(1..=256 * 1024usize);
        let off = rng.random_range(0..=size - len);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        disk.write_at(off as u64, &data).unwrap();
        shadow[off..off + len].copy_from_slice(&data);
        if i % 40 == 39 {
            disk.flush().unwrap();
        }
    }
    disk.flush().unwrap();
}

/// `qemu-img check` finds no errors and `qemu-img convert` to raw gives
/// `shadow`.
fn assert_qemu_agrees(dir: &Dir, img: &Path, shadow: &[u8], what: &str) {
    let out = run(Command::new(qemu_img()).args(["check", "-f", "vmdk"]).arg(img));
    assert!(out.contains("No errors"), "{what}: qemu-img check: {out}");
    let back = dir.path("back.raw");
    run(Command::new(qemu_img())
        .args(["convert", "-f", "vmdk", "-O", "raw"])
        .arg(img)
        .arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert_eq!(got.len(), shadow.len(), "{what}: size");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != shadow[i]) {
        panic!("{what}: qemu-img reads byte {i} differently from what was written");
    }
}

#[test]
fn writes_to_a_monolithic_sparse_image_pass_qemu_img_check() {
    let dir = Dir::new("wsparse");
    let raw = make_raw(&dir, None);
    let img = dir.path("s.vmdk");
    convert(&raw, "monolithicSparse", &img);
    let mut shadow = std::fs::read(&raw).unwrap();
    // A regular file's FileDevice grows, so the image takes new grains
    // through any device over it, or opened by path.
    let disk = open(&img, true).unwrap();
    random_writes(&disk, &mut shadow, 3, 150);
    drop(disk);
    let disk = VmdkDisk::open_path(&img, true, &NamedFiles::beside(&img, false)).unwrap();
    random_writes(&disk, &mut shadow, 4, 150);
    drop(disk);
    assert_qemu_agrees(&dir, &img, &shadow, "monolithicSparse");
    // And we read back what we wrote after reopening.
    std::fs::write(dir.path("shadow.raw"), &shadow).unwrap();
    assert_same(&open(&img, false).unwrap(), &dir.path("shadow.raw"), "reopened");
}

#[test]
fn writes_to_a_monolithic_flat_image_pass_qemu_img_check() {
    let dir = Dir::new("wflat");
    let raw = make_raw(&dir, None);
    let img = dir.path("f.vmdk");
    convert(&raw, "monolithicFlat", &img);
    let mut shadow = std::fs::read(&raw).unwrap();
    let disk = open(&img, true).unwrap();
    random_writes(&disk, &mut shadow, 4, 300);
    drop(disk);
    assert_qemu_agrees(&dir, &img, &shadow, "monolithicFlat");
}

#[test]
fn writes_across_two_gib_sparse_extents_match_qemu_img_compare() {
    let dir = Dir::new("wsplit");
    let raw = make_raw(&dir, Some(2100 * MIB));
    let img = dir.path("t.vmdk");
    convert(&raw, "twoGbMaxExtentSparse", &img);
    let disk = open(&img, true).unwrap();
    let shadow = std::fs::OpenOptions::new().write(true).open(&raw).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for i in 0..200u64 {
        // Half of them around the split between the two extent files.
        let len = rng.random_range(1..=200_000u64);
        let off = if i % 2 == 0 {
            rng.random_range(2048 * MIB - 300_000..2048 * MIB + 100_000)
        } else {
            rng.random_range(0..2100 * MIB - len)
        };
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        disk.write_at(off, &data).unwrap();
        shadow.write_all_at(&data, off).unwrap();
    }
    disk.flush().unwrap();
    drop(disk);
    let out = run(Command::new(qemu_img()).args(["check", "-f", "vmdk"]).arg(&img));
    assert!(out.contains("No errors"), "qemu-img check: {out}");
    let out = run(Command::new(qemu_img())
        .args(["compare", "-f", "raw", "-F", "vmdk"])
        .arg(&raw)
        .arg(&img));
    assert!(out.contains("identical"), "qemu-img compare: {out}");
}

#[test]
fn a_stream_optimized_image_opened_writable_is_refused() {
    let dir = Dir::new("wstream");
    let raw = make_raw(&dir, None);
    let img = dir.path("o.vmdk");
    convert(&raw, "streamOptimized", &img);
    for e in [
        open(&img, true).unwrap_err(),
        VmdkDisk::open_path(&img, true, &NamedFiles::beside(&img, false)).unwrap_err(),
    ] {
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
        assert!(e.to_string().contains("streamOptimized images are read-only"), "{e}");
    }
}
