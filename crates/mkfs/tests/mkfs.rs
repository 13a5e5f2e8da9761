//! `mkfs` against its oracles: `e2fsck -fn` finds nothing to fix for ext2,
//! ext3 and ext4 at every block size and several sizes (including a partial
//! last group and a 1 GiB sparse image); our own reader opens the result and
//! sees lost+found; `dumpe2fs -h` reports the features asked for; the kernel
//! mounts it, takes a new file, and leaves it e2fsck-clean; the option
//! variants (-O, -N, -I, -m) are as clean, over fresh and over old bytes;
//! fixed UUID, hash seed and time give identical bytes, and mke2fs's but
//! for `s_kbytes_written` and the journal superblock's feature bits.
//!
//! Needs e2fsprogs (`e2fsck`, `dumpe2fs`); the mount test needs root and a
//! loop device and fails loudly without them.

use std::path::Path;
use std::process::Command;

use ext4kit::{Fs, OpenOptions};
use ext4kit_blockdev::FileDevice;
use ext4kit_mkfs::{dry_run, mkfs, FsType, MkfsOptions, MkfsReport};

const UUID: [u8; 16] = [
    0x6c, 0x1f, 0x2b, 0x4a, 0x88, 0x01, 0x4e, 0x3d, 0x9a, 0x7b, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66,
];
const SEED: [u8; 16] = [
    0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2, 0xe1, 0xf0,
];

/// A scratch file (or mount point) of its own for each image a test makes,
/// removed when the test passes (the tests of this binary run at once).
fn tmp(name: &str) -> ext4kit_testkit::Scratch {
    let p = std::env::temp_dir().join(format!("ext4kit-mkfs-test-{}-{name}", std::process::id()));
    ext4kit_testkit::Scratch::adopt(p)
}

fn opts(t: FsType, bs: Option<u32>) -> MkfsOptions {
    MkfsOptions {
        fs_type: t,
        block_size: bs,
        uuid: Some(UUID),
        hash_seed: Some(SEED),
        clock: ext4kit_format::time::Clock::fixed(1_700_000_000),
        label: "ext4kit-test".into(),
        device_zeroed: true,
        ..Default::default()
    }
}

/// Create a fresh sparse file of `size` bytes and make a filesystem on it.
fn make(path: &Path, size: u64, o: &MkfsOptions) -> MkfsReport {
    let _ = std::fs::remove_file(path);
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    drop(f);
    let dev = FileDevice::open(path, true).unwrap();
    mkfs(&dev, size, o).unwrap_or_else(|e| panic!("mkfs {}: {e}", path.display()))
}

/// `e2fsck -fn` must exit 0 with nothing to report.
fn fsck_clean(path: &Path) {
    ext4kit_testkit::e2fsck_clean(path).unwrap_or_else(|e| panic!("{e}"));
}

fn dumpe2fs_h(path: &Path) -> String {
    let out = Command::new("dumpe2fs").arg("-h").arg(path).output().expect("dumpe2fs");
    assert!(out.status.success(), "dumpe2fs -h {}", path.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn field<'a>(dump: &'a str, name: &str) -> &'a str {
    dump.lines()
        .find_map(|l| l.strip_prefix(name).map(|r| r.trim_start_matches(':').trim()))
        .unwrap_or_else(|| panic!("dumpe2fs has no {name}:\n{dump}"))
}

fn reads_back(path: &Path) {
    let fs = Fs::open_image(path, &OpenOptions::default()).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let names: Vec<Vec<u8>> = fs.read_dir(b"/").unwrap().into_iter().map(|e| e.name).collect();
    assert!(
        names.iter().any(|n| n == b"lost+found"),
        "{}: root holds {names:?}",
        path.display()
    );
    let lpf: Vec<Vec<u8>> = fs
        .read_dir(b"/lost+found")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(lpf.iter().all(|n| n == b"." || n == b".."), "lost+found holds {lpf:?}");
}

const EXT4_FEATURES: &str = "has_journal ext_attr resize_inode dir_index filetype extent 64bit flex_bg sparse_super large_file huge_file dir_nlink extra_isize metadata_csum";

#[test]
fn e2fsck_clean_matrix() {
    let sizes: &[(u64, &str)] = &[
        (4 << 20, "4M"),
        (64 << 20, "64M"),
        // 1 KiB blocks: 9 full groups and a partial one of 6000 blocks.
        ((8192 * 9 + 6001) << 10, "partial"),
        (1 << 30, "1G"),
    ];
    for t in [FsType::Ext2, FsType::Ext3, FsType::Ext4] {
        for bs in [1024u32, 2048, 4096, 65536] {
            for &(size, label) in sizes {
                let p = tmp(&format!("{t:?}-{bs}-{label}.img"));
                let r = make(&p, size, &opts(t, Some(bs)));
                fsck_clean(&p);
                reads_back(&p);
                let d = dumpe2fs_h(&p);
                assert_eq!(field(&d, "Block size"), bs.to_string());
                assert_eq!(field(&d, "Block count"), r.blocks_count.to_string());
                assert_eq!(field(&d, "Free blocks"), r.free_blocks.to_string());
                let _ = std::fs::remove_file(&p);
            }
        }
    }
}

#[test]
fn one_gib_defaults_match_mke2fs() {
    let p = tmp("1g.img");
    let r = make(&p, 1 << 30, &opts(FsType::Ext4, None));
    fsck_clean(&p);
    reads_back(&p);
    let d = dumpe2fs_h(&p);
    assert_eq!(field(&d, "Filesystem features"), EXT4_FEATURES);
    // The numbers mke2fs 1.47 prints for `mke2fs -t ext4` on 1 GiB.
    assert_eq!(field(&d, "Block size"), "4096");
    assert_eq!(field(&d, "Inode count"), "65536");
    assert_eq!(field(&d, "Block count"), "262144");
    assert_eq!(field(&d, "Reserved block count"), "13107");
    assert_eq!(field(&d, "Reserved GDT blocks"), "127");
    assert_eq!(field(&d, "Inodes per group"), "8192");
    assert_eq!(field(&d, "Flex block group size"), "16");
    assert_eq!(field(&d, "Total journal blocks"), "8192");
    assert_eq!(field(&d, "Overhead clusters"), "12949");
    assert_eq!(field(&d, "Free blocks"), r.free_blocks.to_string());
    assert_eq!(field(&d, "Filesystem volume name"), "ext4kit-test");
    assert_eq!(field(&d, "Filesystem UUID"), "6c1f2b4a-8801-4e3d-9a7b-112233445566");
    assert_eq!(field(&d, "Directory Hash Seed"), "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
    assert_eq!(field(&d, "Default directory hash"), "half_md4");
    let _ = std::fs::remove_file(&p);
}

#[test]
fn feature_sets_per_type() {
    let want = [
        (
            FsType::Ext2,
            "ext_attr resize_inode dir_index filetype sparse_super large_file",
        ),
        (
            FsType::Ext3,
            "has_journal ext_attr resize_inode dir_index filetype sparse_super large_file",
        ),
        (FsType::Ext4, EXT4_FEATURES),
    ];
    for (t, f) in want {
        let p = tmp(&format!("features-{t:?}.img"));
        make(&p, 32 << 20, &opts(t, None));
        assert_eq!(field(&dumpe2fs_h(&p), "Filesystem features"), f, "{t:?}");
        let _ = std::fs::remove_file(&p);
    }
    // -O edits: drop the journal and resize inode, add metadata_csum_seed.
    let p = tmp("features-edit.img");
    let mut o = opts(FsType::Ext4, None);
    o.features = vec!["^has_journal,^resize_inode".into(), "metadata_csum_seed".into()];
    make(&p, 32 << 20, &o);
    fsck_clean(&p);
    let d = dumpe2fs_h(&p);
    let feats = field(&d, "Filesystem features");
    assert!(
        !feats.contains("has_journal") && !feats.contains("resize_inode"),
        "{feats}"
    );
    assert!(feats.contains("metadata_csum_seed"), "{feats}");
    // ext4 with crc16 descriptors instead of metadata_csum.
    let mut o = opts(FsType::Ext4, None);
    o.features = vec!["^metadata_csum,uninit_bg".into()];
    make(&p, 32 << 20, &o);
    fsck_clean(&p);
    assert!(field(&dumpe2fs_h(&p), "Filesystem features").contains("uninit_bg"));
    let _ = std::fs::remove_file(&p);
}

#[test]
fn writes_over_old_contents() {
    // Not a fresh file: inode tables and journal must be zeroed by mkfs.
    let p = tmp("dirty.img");
    std::fs::write(&p, vec![0xa5u8; 8 << 20]).unwrap();
    let dev = FileDevice::open(&p, true).unwrap();
    let mut o = opts(FsType::Ext4, None);
    o.device_zeroed = false;
    mkfs(&dev, 8 << 20, &o).unwrap();
    drop(dev);
    fsck_clean(&p);
    reads_back(&p);
    let _ = std::fs::remove_file(&p);
}

/// The option variants beyond the type defaults, each over a fresh
/// (sparse, zero-reading) file and over one full of old bytes: e2fsck
/// finds nothing to fix, our reader sees lost+found, and `dry_run`
/// reports what `mkfs` made.
#[test]
fn option_variants_e2fsck_clean() {
    /// (type, size, block size, -O items, name)
    type Variant = (FsType, u64, Option<u32>, &'static [&'static str], &'static str);
    let variants: &[Variant] = &[
        (FsType::Ext4, 64 << 20, None, &["^flex_bg"], "noflex"),
        (FsType::Ext4, 64 << 20, None, &["^64bit"], "no64"),
        (
            FsType::Ext4,
            64 << 20,
            Some(4096),
            &["^metadata_csum,uninit_bg"],
            "crc16",
        ),
        (FsType::Ext4, 64 << 20, None, &["^metadata_csum"], "nocsum"),
        (FsType::Ext4, 64 << 20, None, &["^sparse_super"], "nosparse"),
        (
            FsType::Ext4,
            64 << 20,
            Some(2048),
            &["^resize_inode", "metadata_csum_seed"],
            "seed",
        ),
        (FsType::Ext4, 64 << 20, None, &["^flex_bg,^64bit,^extent"], "ext3like"),
        (FsType::Ext3, 64 << 20, Some(4096), &["extent"], "ext3extent"),
        (FsType::Ext2, 64 << 20, None, &["uninit_bg"], "ext2crc16"),
        (FsType::Ext4, 3 << 20, None, &[], "floppy"),
    ];
    for &(t, size, bs, feats, label) in variants {
        let mut o = opts(t, bs);
        o.features = feats.iter().map(|f| f.to_string()).collect();
        for old_bytes in [false, true] {
            let p = tmp(&format!("variant-{label}-{old_bytes}.img"));
            let r = if old_bytes {
                std::fs::write(&p, vec![0xa5u8; size as usize]).unwrap();
                let dev = FileDevice::open(&p, true).unwrap();
                let o = MkfsOptions {
                    device_zeroed: false,
                    ..o.clone()
                };
                mkfs(&dev, size, &o).unwrap_or_else(|e| panic!("mkfs {label}: {e}"))
            } else {
                make(&p, size, &o)
            };
            assert_eq!(dry_run(size, &o).unwrap(), r, "{label}: dry_run differs");
            fsck_clean(&p);
            reads_back(&p);
            let _ = std::fs::remove_file(&p);
        }
    }
    // -N, -I and -m as mke2fs takes them.
    for (inodes, inode_size, reserved, label) in [
        (Some(100), 256, 0.0, "n100"),
        (Some(50_000), 128, 10.0, "n50k-i128"),
        (None, 1024, 2.5, "i1024"),
    ] {
        let mut o = opts(FsType::Ext4, None);
        o.inodes = inodes;
        o.inode_size = inode_size;
        o.reserved_percent = reserved;
        let p = tmp(&format!("variant-{label}.img"));
        let r = make(&p, 64 << 20, &o);
        fsck_clean(&p);
        reads_back(&p);
        let d = dumpe2fs_h(&p);
        assert_eq!(field(&d, "Inode size"), inode_size.to_string(), "{label}");
        assert_eq!(field(&d, "Inode count"), r.inodes_count.to_string(), "{label}");
        assert_eq!(
            field(&d, "Reserved block count"),
            ((r.blocks_count as f64 * reserved / 100.0) as u64).to_string(),
            "{label}"
        );
        let _ = std::fs::remove_file(&p);
    }
}

#[test]
fn deterministic_bytes() {
    let a = tmp("det-a.img");
    let b = tmp("det-b.img");
    for t in [FsType::Ext3, FsType::Ext4] {
        make(&a, 16 << 20, &opts(t, None));
        make(&b, 16 << 20, &opts(t, None));
        assert!(
            std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
            "{t:?} differs between runs"
        );
    }
    let _ = std::fs::remove_file(&a);
    let _ = std::fs::remove_file(&b);
}

fn is_root() -> bool {
    ext4kit_testkit::kernel_available().is_ok()
}

/// Unmount, retrying while something (a scanner, udev) briefly holds it.
fn umount(m: &Path) {
    let mut last = String::new();
    for _ in 0..20 {
        let out = Command::new("umount").arg(m).output().unwrap();
        if out.status.success() {
            return;
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    panic!("umount {}: {last}", m.display());
}

#[test]
fn kernel_mounts_and_writes() {
    assert!(
        is_root(),
        "this test needs root: it loop-mounts the images with the kernel's ext2/ext3/ext4 drivers"
    );
    // 64 KiB blocks are skipped: this kernel cannot mount them.
    for t in [FsType::Ext2, FsType::Ext3, FsType::Ext4] {
        for bs in [1024u32, 2048, 4096] {
            let p = tmp(&format!("mount-{t:?}-{bs}.img"));
            let m = tmp(&format!("mnt-{t:?}-{bs}"));
            std::fs::create_dir_all(&m).unwrap();
            make(&p, 64 << 20, &opts(t, Some(bs)));
            let fstype = match t {
                FsType::Ext2 => "ext2",
                FsType::Ext3 => "ext3",
                FsType::Ext4 => "ext4",
            };
            let st = Command::new("mount")
                .args(["-t", fstype, "-o", "loop"])
                .arg(&p)
                .arg(&m)
                .status()
                .unwrap();
            assert!(st.success(), "kernel refused to mount {} as {fstype}", p.display());
            let wrote = std::fs::write(m.join("hello.txt"), b"hello from the kernel\n");
            let made_dir = std::fs::create_dir(m.join("dir"));
            let lpf = std::fs::read_dir(m.join("lost+found")).map(|d| d.count());
            umount(&m);
            wrote.unwrap();
            made_dir.unwrap();
            assert_eq!(lpf.unwrap(), 0);
            fsck_clean(&p);
            let fs = Fs::open_image(&p, &OpenOptions::default()).unwrap();
            let names: Vec<Vec<u8>> = fs.read_dir(b"/").unwrap().into_iter().map(|e| e.name).collect();
            assert!(names.iter().any(|n| n == b"hello.txt"), "{names:?}");
            let _ = std::fs::remove_file(&p);
            let _ = std::fs::remove_dir(&m);
        }
    }
}

/// With the same UUID, hash seed and clock, our image equals mke2fs 1.47's
/// block for block, except `s_kbytes_written` and the superblock checksum
/// in every superblock copy, and (ext4) the journal superblock's feature
/// bits and checksum, which we set as the kernel would at first mount.
#[test]
fn same_bytes_as_mke2fs() {
    let cases: &[(&str, u64, Option<u32>)] = &[
        ("ext4", 64 << 20, None),
        ("ext4", 1 << 30, None),
        ("ext4", 300 << 20, Some(2048)),
        ("ext4", (8192 * 9 + 6001) << 10, None),
        ("ext3", 64 << 20, None),
        ("ext3", 20 << 20, Some(2048)),
        ("ext2", 4 << 20, None),
        ("ext2", 200 << 20, Some(4096)),
    ];
    for &(t, size, bs) in cases {
        let theirs = tmp(&format!("mke2fs-{t}-{size}.img"));
        let ours = tmp(&format!("ours-{t}-{size}.img"));
        let f = std::fs::File::create(&theirs).unwrap();
        f.set_len(size).unwrap();
        drop(f);
        let mut cmd = Command::new("mke2fs");
        cmd.env("E2FSPROGS_FAKE_TIME", "1700000000")
            .args(["-q", "-F", "-t", t, "-L", "ext4kit-test"])
            .args(["-U", "6c1f2b4a-8801-4e3d-9a7b-112233445566"])
            .args(["-E", "hash_seed=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"]);
        if let Some(b) = bs {
            cmd.args(["-b", &b.to_string()]);
        }
        let st = cmd.arg(&theirs).status().expect("mke2fs");
        assert!(st.success(), "mke2fs {t} {size}");
        let fs_type = FsType::parse(t).unwrap();
        let r = make(&ours, size, &opts(fs_type, bs));
        let a = std::fs::read(&ours).unwrap();
        let b = std::fs::read(&theirs).unwrap();
        assert_eq!(a.len(), b.len());
        let bsz = r.block_size as usize;
        // Where the journal superblock is, from our s_jnl_blocks copy of i_block.
        let jblock = journal_first_block(&ours);
        for (n, (x, y)) in a.chunks(bsz).zip(b.chunks(bsz)).enumerate() {
            if x == y {
                continue;
            }
            let diff: Vec<usize> = (0..bsz).filter(|&i| x[i] != y[i]).collect();
            let sb_at = if n == 0 && bsz > 1024 { 1024 } else { 0 };
            let is_sb = diff.iter().all(|&i| {
                let o = i.wrapping_sub(sb_at);
                (0x178..0x180).contains(&o) || (0x3fc..0x400).contains(&o)
            });
            let is_jsb = Some(n as u64) == jblock
                && diff
                    .iter()
                    .all(|&i| (0x28..0x2c).contains(&i) || i == 0x50 || (0xfc..0x100).contains(&i));
            assert!(
                is_sb || is_jsb,
                "{t} {size} bs {bsz}: block {n} differs from mke2fs at bytes {:x?}",
                &diff[..diff.len().min(16)]
            );
        }
        let _ = std::fs::remove_file(&ours);
        let _ = std::fs::remove_file(&theirs);
    }
}

/// The first physical block of the journal (debugfs `bmap <8> 0`).
fn journal_first_block(img: &Path) -> Option<u64> {
    let out = Command::new("debugfs")
        .args(["-R", "bmap <8> 0"])
        .arg(img)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}
