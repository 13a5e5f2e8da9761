//! Cross-linked blocks: a block two files claim is never freed
//! from under one of them, and a block a file claims is never handed out
//! again because the bitmap lies about it (`ext4::claims`). A damaged
//! group free count stays out of the superblock's total.
//!
//! The damage is made with the library itself (a block map edited through
//! a handle, so checksums stay right) or by editing an ext2 image's bytes.

use ext4kit::{NewInode, Target};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ext4kit::ext4::{bmap, inode};
use ext4kit::{Access, Cred, Fs, OpenFlags, OpenOptions};
use ext4kit_testkit::Scratch;

fn workdir(tag: &str) -> Scratch {
    Scratch::dir(&format!("ext4kit-xlink-{tag}"))
}

fn mkimg(dir: &Path, args: &[&str]) -> PathBuf {
    let img = dir.join("fs.img");
    ext4kit_testkit::run_ok(
        Command::new("mke2fs")
            .args(["-q", "-F"])
            .args(args)
            .arg(&img)
            .arg("16M"),
        &[0],
    )
    .unwrap_or_else(|e| panic!("{e} (apt-get install e2fsprogs)"));
    img
}

fn open_rw(img: &Path) -> Arc<Fs> {
    Fs::open_image(
        img,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap()
}

fn fsck(img: &Path) -> String {
    let out = Command::new("e2fsck").arg("-fn").arg(img).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn put(fs: &Fs, path: &str, blocks: usize) -> u32 {
    let data: Vec<u8> = (0..blocks * fs.volume().block_size())
        .map(|i| (i % 251) as u8)
        .collect();
    fs.write_file(&NewInode::file(path.as_bytes()).mode(0o644).owner(0, 0), &data)
        .unwrap()
        .ino
}

fn truncate(fs: &Fs, path: &str, len: u64) -> ext4kit::Result<()> {
    let f = fs.open(
        path.as_bytes(),
        OpenFlags {
            access: Access::WriteOnly,
            ..Default::default()
        },
    )?;
    let r = fs.truncate_inode(&f.inode, len, &ext4kit::Caller::root()).map(|_| ());
    fs.close_file(f)?;
    r
}

/// Point `ino`'s first mapped block at `target` (extent root or direct
/// pointer), through a handle.
fn cross_link(fs: &Fs, ino: u32, target: u64) {
    let vol = &fs.volume();
    let mut rec = inode::read(vol, ino).unwrap();
    let b = &mut rec.base.block;
    if rec.base.flags & ext4kit_format::inode::flags::EXTENTS != 0 {
        // Depth-0 root: the first leaf entry's ee_len (one block, so that
        // only the first is shared), ee_start_hi and ee_start_lo.
        assert_eq!(u16::from_le_bytes([b[6], b[7]]), 0, "a depth-0 tree");
        b[12 + 4..12 + 6].copy_from_slice(&1u16.to_le_bytes());
        b[12 + 6..12 + 8].copy_from_slice(&((target >> 32) as u16).to_le_bytes());
        b[12 + 8..12 + 12].copy_from_slice(&(target as u32).to_le_bytes());
    } else {
        b[0..4].copy_from_slice(&(target as u32).to_le_bytes());
    }
    let mut h = vol.begin().unwrap();
    inode::write(vol, &mut h, ino, &rec).unwrap();
    h.commit().unwrap();
}

fn first_block(fs: &Fs, ino: u32) -> u64 {
    let rec = inode::read(fs.volume(), ino).unwrap();
    match bmap::load(fs.volume(), ino, &rec).unwrap().map(fs.volume(), 0).unwrap() {
        ext4kit::ext4::Mapping::Mapped { pblk, .. } => pblk,
        m => panic!("inode {ino} block 0: {m:?}"),
    }
}

/// /b's first block is /a's: removing or truncating either away is
/// refused, naming the block and both inodes, and leaves the image as it
/// was; a truncate that keeps the shared block goes ahead and makes e2fsck
/// no worse.
fn cross_linked_blocks_are_never_freed(tag: &str, mkfs: &[&str]) {
    let dir = workdir(tag);
    let img = mkimg(&dir, mkfs);
    let (a, b, shared) = {
        let fs = open_rw(&img);
        let a = put(&fs, "/a", 3);
        let b = put(&fs, "/b", 3);
        put(&fs, "/c", 2);
        fs.sync().unwrap();
        let shared = first_block(&fs, a);
        cross_link(&fs, b, shared);
        fs.sync().unwrap();
        (a, b, shared)
    };
    let before_fsck = fsck(&img);
    assert!(
        before_fsck.contains("Multiply-claimed"),
        "the damage is there:\n{before_fsck}"
    );
    let before = std::fs::read(&img).unwrap();
    let root = Cred::root();
    for (what, r) in [
        ("rm /b", { open_rw(&img).unlink(b"/b", &root) }),
        ("rm /a", { open_rw(&img).unlink(b"/a", &root) }),
        ("truncate /b 0", truncate(&open_rw(&img), "/b", 0)),
        ("truncate /a 10", truncate(&open_rw(&img), "/a", 10)),
    ] {
        let e = r.expect_err(what).to_string();
        assert!(
            e.contains(&format!("block {shared}"))
                && e.contains("cross-linked")
                && e.contains(&format!("inode {a}"))
                && e.contains(&format!("inode {b}"))
                && e.contains("run e2fsck"),
            "{what}: {e}"
        );
        assert!(std::fs::read(&img).unwrap() == before, "{what} changed the image");
    }
    // Freeing /b's other blocks keeps the shared one: allowed. So is
    // removing a file that shares nothing.
    {
        let fs = open_rw(&img);
        truncate(&fs, "/b", fs.volume().block_size() as u64).unwrap();
        fs.unlink(b"/c", &root).unwrap();
        fs.sync().unwrap();
    }
    let after = fsck(&img);
    // The damage leaked /b's own first block ("-N", before and after);
    // nothing in use may be marked free ("+N").
    let marked_free = |out: &str| {
        out.lines()
            .filter(|l| l.starts_with("Block bitmap differences:"))
            .any(|l| l.contains('+'))
    };
    assert!(!marked_free(&before_fsck) && !marked_free(&after), "{after}");
    assert!(
        after.contains("Multiply-claimed"),
        "the cross-link is left for e2fsck:\n{after}"
    );
}

#[test]
fn cross_linked_blocks_are_never_freed_ext4() {
    cross_linked_blocks_are_never_freed("ext4", &["-t", "ext4", "-b", "4096"]);
}

#[test]
fn cross_linked_blocks_are_never_freed_ext2() {
    cross_linked_blocks_are_never_freed("ext2", &["-t", "ext2", "-b", "1024"]);
}

/// Bytes of ext2 structures (no checksums to keep right).
struct Ext2 {
    bs: usize,
    bitmap: u64,
    desc_off: usize,
}

impl Ext2 {
    fn of(fs: &Fs) -> Ext2 {
        let g = &fs.volume().groups()[0];
        Ext2 {
            bs: fs.volume().block_size(),
            bitmap: g.block_bitmap(),
            desc_off: g.desc_block() as usize * fs.volume().block_size() + g.desc_offset(),
        }
    }

    fn add_u16(img: &mut [u8], off: usize, d: i32) {
        let v = u16::from_le_bytes([img[off], img[off + 1]]) as i32 + d;
        img[off..off + 2].copy_from_slice(&(v as u16).to_le_bytes());
    }

    fn add_u32(img: &mut [u8], off: usize, d: i64) {
        let v = u32::from_le_bytes([img[off], img[off + 1], img[off + 2], img[off + 3]]) as i64 + d;
        img[off..off + 4].copy_from_slice(&(v as u32).to_le_bytes());
    }
}

/// A block of /a marked free in a bitmap whose count was made to agree
/// (so the allocators' own check passes): once the claim scan has run,
/// new files never get it.
#[test]
fn a_claimed_block_the_bitmap_calls_free_is_never_handed_out() {
    let dir = workdir("unmarked");
    let img = mkimg(&dir, &["-t", "ext2", "-b", "1024"]);
    let (a_blocks, lay) = {
        let fs = open_rw(&img);
        let a = put(&fs, "/a", 8);
        put(&fs, "/c", 1);
        fs.sync().unwrap();
        let rec = inode::read(fs.volume(), a).unwrap();
        let runs = bmap::load(fs.volume(), a, &rec)
            .unwrap()
            .runs(fs.volume(), u64::MAX)
            .unwrap();
        let blocks: Vec<u64> = runs.iter().flat_map(|&(_, p, n)| p..p + n).collect();
        (blocks, Ext2::of(&fs))
    };
    let mut bytes = std::fs::read(&img).unwrap();
    let first = 1u64; // first data block with 1 KiB blocks
    for &blk in &a_blocks {
        let bit = (blk - first) as usize;
        bytes[lay.bitmap as usize * lay.bs + bit / 8] &= !(1 << (bit % 8));
    }
    let n = a_blocks.len() as i32;
    Ext2::add_u16(&mut bytes, lay.desc_off + 0x0C, n);
    Ext2::add_u32(&mut bytes, 1024 + 0x0C, n as i64);
    std::fs::write(&img, &bytes).unwrap();
    let before = fsck(&img);
    assert!(before.contains("Block bitmap differences"), "{before}");
    {
        let fs = open_rw(&img);
        // The first free builds the claim set.
        fs.unlink(b"/c", &Cred::root()).unwrap();
        let set = fs.volume().owner_map().get().expect("the scan ran");
        assert_eq!(set.unmarked_blocks(), a_blocks);
        let d = put(&fs, "/d", 20);
        let rec = inode::read(fs.volume(), d).unwrap();
        for (_, p, n) in bmap::load(fs.volume(), d, &rec)
            .unwrap()
            .runs(fs.volume(), u64::MAX)
            .unwrap()
        {
            for blk in p..p + n {
                assert!(!a_blocks.contains(&blk), "block {blk} of /a was handed to /d");
            }
        }
        fs.sync().unwrap();
    }
    let after = fsck(&img);
    assert!(!after.contains("Multiply-claimed"), "{after}");
}

/// A group's free count made wrong (its bitmap and the superblock right):
/// writes of every kind leave the superblock's total right — summing the
/// groups, as the kernel does, would write the damage into it.
#[test]
fn a_damaged_group_count_stays_out_of_the_superblock() {
    let dir = workdir("count");
    let img = mkimg(&dir, &["-t", "ext2", "-b", "1024"]);
    let lay = Ext2::of(&open_rw(&img));
    let mut bytes = std::fs::read(&img).unwrap();
    Ext2::add_u16(&mut bytes, lay.desc_off + 0x0C, -64);
    std::fs::write(&img, &bytes).unwrap();
    let before = fsck(&img);
    assert!(before.contains("Free blocks count wrong for group #0"), "{before}");
    assert!(!before.contains("Free blocks count wrong ("), "{before}");
    {
        let fs = open_rw(&img);
        let root = Cred::root();
        fs.create(&NewInode::dir(b"/d").mode(0o755).cred(&root)).unwrap();
        put(&fs, "/d/f", 4);
        fs.setxattr(Target::path(b"/d").nofollow(), b"user.x", b"1", 0, &root)
            .unwrap();
        fs.sync().unwrap();
    }
    let after = fsck(&img);
    assert!(
        !after.contains("Free blocks count wrong ("),
        "the superblock's total:\n{after}"
    );
}

/// The scan runs while other threads allocate (files written and
/// fsync'd, so their blocks are allocated then): it finds nothing claimed
/// twice on a healthy image, every file can be removed afterwards, and
/// e2fsck is clean.
#[test]
fn the_scan_beside_concurrent_allocations_finds_nothing_wrong() {
    let dir = workdir("concurrent");
    let img = mkimg(&dir, &["-t", "ext4", "-b", "1024", "-N", "20000"]);
    {
        let fs = open_rw(&img);
        fs.create(&NewInode::dir(b"/pop").mode(0o755).cred(&Cred::root()))
            .unwrap();
        for i in 0..8000 {
            put(&fs, &format!("/pop/f{i}"), 1);
        }
        fs.sync().unwrap();
    }
    for round in 0..4 {
        let fs = open_rw(&img);
        let root = Cred::root();
        std::thread::scope(|s| {
            for t in 0..3 {
                let fs = &fs;
                s.spawn(move || {
                    for i in 0..40 {
                        let p = format!("/w{round}-{t}-{i}");
                        let data = vec![t as u8; 3 * fs.volume().block_size()];
                        fs.write_file(&NewInode::file(p.as_bytes()).mode(0o644).owner(0, 0), &data)
                            .unwrap();
                        let f = fs.open(p.as_bytes(), OpenFlags::default()).unwrap();
                        fs.fsync(&f).unwrap();
                        fs.close_file(f).unwrap();
                    }
                });
            }
            let fs = &fs;
            s.spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(2));
                // The first free of the session: the scan.
                fs.unlink(format!("/pop/f{round}").as_bytes(), &Cred::root()).unwrap();
            });
        });
        let set = fs.volume().owner_map().get().expect("the scan ran");
        assert!(
            set.multi_blocks().is_empty() && set.unmarked_blocks().is_empty(),
            "round {round}"
        );
        for t in 0..3 {
            for i in (0..40).step_by(2) {
                fs.unlink(format!("/w{round}-{t}-{i}").as_bytes(), &root).unwrap();
            }
        }
        fs.sync().unwrap();
    }
    let out = fsck(&img);
    assert!(!out.contains("Fix? no") && !out.contains("Multiply"), "{out}");
}
