//! Write operations on damaged images (nothing on disk is made worse): each
//! of the corpus' operations, through the library and the `ext4kit` binary,
//! on one image per (damage kind × base) — 76 images, about 1,700 cases —
//! must succeed with `e2fsck -fn` no worse than before, or refuse and leave
//! the image byte-identical (apart from the superblock's error record),
//! blaming damage only with "run e2fsck". See `ext4kit_fuzz::damaged`.
//!
//! `EXT4KIT_DAMAGED_COUNT` / `EXT4KIT_DAMAGED_START` change the seeds;
//! the `ext4kit-damaged` binary runs bigger campaigns.
//!
//! Cross-linked blocks (made by the corpus directly or by a flipped map
//! pointer) are no exception: freeing a block another inode also claims is
//! refused (`ext4kit_ext4::claims`), so such a case fails like any other.

use std::time::{Duration, Instant};

use ext4kit_fuzz::damaged::check::{find_cli, run_corpus, CorpusConfig, Frontend, Outcome};
use ext4kit_fuzz::damaged::ops::OPS;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

#[test]
fn write_operations_on_damaged_images_never_make_them_worse() {
    if let Err(e) = ext4kit_fuzz::check_tools() {
        panic!("cannot run the damaged-image corpus: {e}");
    }
    let cli = find_cli().unwrap_or_else(|e| panic!("the damaged-image corpus needs the ext4kit binary: {e}"));
    let start = env_u64("EXT4KIT_DAMAGED_START", 0);
    let count = env_u64("EXT4KIT_DAMAGED_COUNT", 76);
    let cfg = CorpusConfig {
        seeds: (start..start + count).collect(),
        ops: OPS.to_vec(),
        frontends: vec![Frontend::Library, Frontend::Cli(cli)],
        cli_every: 3,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        limit: Duration::from_secs(60),
        verbose: false,
    };
    let t = Instant::now();
    let report = run_corpus(&cfg).unwrap_or_else(|e| panic!("damaged-image corpus: {e}"));
    eprintln!(
        "{} images, {} cases in {:.0} s\n{}",
        report.images,
        report.cases.len(),
        t.elapsed().as_secs_f64(),
        report.table()
    );
    assert_eq!(report.uncheckable, 0, "e2fsck could not check some damaged images in time");
    assert!(report.cases.len() as u64 >= count * OPS.len() as u64, "too few cases ran");
    let refused = report.cases.iter().filter(|c| matches!(c.outcome, Outcome::Refused { .. })).count();
    let succeeded = report.cases.iter().filter(|c| c.outcome == Outcome::Succeeded).count();
    assert!(refused > 0 && succeeded > 0, "the corpus should both refuse and allow operations");
    let failures = report.failures();
    assert!(failures.is_empty(), "{} cases broke the rule:\n{}", failures.len(), report.failure_lines());
}

/// Shapes of the seeded corpus's failures, rebuilt with the library and
/// debugfs.
mod corpus_shapes {
    use std::path::Path;
    use std::process::Command;
    use std::sync::Arc;

    use ext4kit::{Cred, Fs, NewInode, OpenOptions};
    use ext4kit_fuzz::damaged::fsck::Fsck;
    use ext4kit_testkit::Scratch;

    fn open_rw(img: &Path) -> Arc<Fs> {
        Fs::open_image(img, &OpenOptions { read_only: false, ..Default::default() }).unwrap()
    }

    /// Seed 881: an htree directory whose extent tree lost entries, so the
    /// leaves the index names are holes. A name going in (mkdir, create)
    /// would meet the hole only after its inode was allocated, and without
    /// a journal that half-made create stayed on disk. Refused first,
    /// naming the hole, with the image as it was; a lookup still answers.
    #[test]
    fn a_name_bound_for_a_hole_leaf_is_refused_before_anything_changes() {
        let dir = Scratch::dir("ext4kit-shape-htree-hole");
        let img = dir.join("fs.img");
        ext4kit_testkit::run_ok(
            Command::new("mke2fs")
                .args(["-q", "-F", "-t", "ext4", "-b", "1024", "-O", "^has_journal"])
                .arg(&img)
                .arg("8M"),
            &[0],
        )
        .unwrap_or_else(|e| panic!("{e} (apt-get install e2fsprogs)"));
        let root = Cred::root();
        let nblocks = {
            let fs = open_rw(&img);
            fs.create(&NewInode::dir(b"/big").mode(0o755).cred(&root)).unwrap();
            for i in 0..200 {
                let name = format!("/big/a-rather-long-file-name-to-fill-leaves-{i:04}");
                fs.write_file(&NewInode::file(name.as_bytes()).mode(0o644).owner(0, 0), &[]).unwrap();
            }
            fs.sync().unwrap();
            fs.stat(b"/big").unwrap().size / 1024
        };
        assert!(nblocks >= 3, "an htree with several leaves: {nblocks} blocks");
        let out = ext4kit_testkit::run_ok(
            Command::new("debugfs").args(["-w", "-R", &format!("punch /big 1 {}", nblocks - 1)]).arg(&img),
            &[0],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success());
        let f = Fsck::run(&img).unwrap();
        assert!(f.code != 0, "the damage is not there:\n{}", f.raw);
        let before = std::fs::read(&img).unwrap();
        let fs = open_rw(&img);
        for (what, r) in [
            ("mkdir", fs.create(&NewInode::dir(b"/big/newdir").mode(0o755).cred(&root)).map(|_| ())),
            ("create", fs.write_file(&NewInode::file(b"/big/newfile").mode(0o644).owner(0, 0), b"x").map(|_| ())),
        ] {
            let e = r.expect_err("the leaf is a hole").to_string();
            assert!(e.contains("is a hole") && e.contains("run e2fsck"), "{what}: {e}");
        }
        assert!(fs.stat(b"/big/no-such-name").is_err());
        fs.sync().unwrap();
        drop(fs);
        assert!(std::fs::read(&img).unwrap() == before, "a refusal changed the image");
    }
}

/// The shapes of e2fsprogs' corrupt test images that writes made worse
/// (`ext4kit-damaged --e2fsprogs`), rebuilt here with mke2fs and debugfs:
/// CI uses nothing fetched. Each writes through the library and compares
/// `e2fsck -fn` before and after, as the campaign does.
mod e2fsprogs_shapes {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::Arc;

    use ext4kit::{Cred, Fs, NewInode, OpenOptions, Target};
    use ext4kit_fuzz::damaged::fsck::Fsck;
    use ext4kit_testkit::Scratch;

    /// `mke2fs -q -F ARGS DIR/fs.img SIZE`.
    fn mke2fs(dir: &Path, args: &[&str], size: &str) -> PathBuf {
        let img = dir.join("fs.img");
        ext4kit_testkit::run_ok(Command::new("mke2fs").args(["-q", "-F"]).args(args).arg(&img).arg(size), &[0])
            .unwrap_or_else(|e| panic!("{e} (apt-get install e2fsprogs)"));
        img
    }

    /// `debugfs -w -R CMD IMG` for each command.
    fn debugfs_w(img: &Path, cmds: &[&str]) {
        for c in cmds {
            let out = ext4kit_testkit::run_ok(Command::new("debugfs").args(["-w", "-R", c]).arg(img), &[0])
                .unwrap_or_else(|e| panic!("{e}"));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!err.lines().skip(1).any(|l| !l.trim().is_empty()), "debugfs -R {c:?}: {err}");
        }
    }

    fn open_rw(img: &Path) -> Arc<Fs> {
        Fs::open_image(img, &OpenOptions { read_only: false, ..Default::default() }).unwrap()
    }

    fn fsck(img: &Path) -> Fsck {
        Fsck::run(img).unwrap()
    }

    /// e2fsck after `f` finds nothing it did not find before (and before,
    /// it finds `damage`).
    fn no_worse(img: &Path, damage: &str, f: impl FnOnce(&Fs)) {
        let before = fsck(img);
        assert!(before.raw.contains(damage), "the damage is not there:\n{}", before.raw);
        {
            let fs = open_rw(img);
            f(&fs);
            fs.sync().unwrap();
        }
        let after = fsck(img);
        if let Some(w) = before.worse(&after) {
            panic!("made worse: {w}\n--- before\n{}\n--- after\n{}", before.raw, after.raw);
        }
    }

    fn put(fs: &Fs, path: &str, bytes: usize) -> u32 {
        let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
        fs.write_file(&NewInode::file(path.as_bytes()).mode(0o644).owner(0, 0), &data).unwrap().ino
    }

    /// `debugfs -R CMD IMG`'s standard output.
    fn debugfs_out(img: &Path, cmd: &str) -> String {
        let out = ext4kit_testkit::run_ok(Command::new("debugfs").args(["-R", cmd]).arg(img), &[0])
            .unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// An image holding `/a`, a file of `blocks` KiB written by debugfs.
    fn image_with_file(dir: &Path, args: &[&str], blocks: usize) -> (PathBuf, Vec<u64>) {
        let img = mke2fs(dir, args, "8M");
        let host = dir.join("a.src");
        std::fs::write(&host, vec![0x5a; blocks * 1024]).unwrap();
        debugfs_w(&img, &[&format!("write {} a", host.display())]);
        let list: Vec<u64> = debugfs_out(&img, "blocks /a").split_whitespace().map(|b| b.parse().unwrap()).collect();
        assert!(!list.is_empty());
        (img, list)
    }

    /// The first number after `label` in `dumpe2fs IMG` (group 0's line
    /// for "free blocks,", the superblock's for "Free blocks:").
    fn dumpe2fs_number(img: &Path, label: &str) -> u64 {
        let out = ext4kit_testkit::run_ok(Command::new("dumpe2fs").arg(img), &[0]).unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.contains(label)).unwrap_or_else(|| panic!("no {label:?} in dumpe2fs"));
        let t = line.trim_start().trim_start_matches(label).trim_start();
        t.split(|c: char| !c.is_ascii_digit()).find(|w| !w.is_empty()).unwrap().parse().unwrap()
    }

    /// f_ind_inode_collision, f_invalid_bad_inode: blocks a live file uses
    /// marked free in a bitmap whose group count was made to agree (so the
    /// allocators' own check passes). The first allocation of the session
    /// must already know them (the owner scan), not only the first free.
    #[test]
    fn blocks_a_file_uses_are_not_handed_out_before_the_first_free() {
        let dir = Scratch::dir("ext4kit-shape-freeb");
        let (img, a_blocks) = image_with_file(&dir, &["-t", "ext2", "-b", "1024"], 12);
        let n = a_blocks.len() as u64;
        let group = dumpe2fs_number(&img, "free blocks,") + n;
        let total = dumpe2fs_number(&img, "Free blocks:") + n;
        debugfs_w(
            &img,
            &[
                &format!("freeb {} {n}", a_blocks[0]),
                &format!("set_bg 0 free_blocks_count {group}"),
                &format!("ssv free_blocks_count {total}"),
            ],
        );
        assert_eq!(a_blocks, (a_blocks[0]..a_blocks[0] + n).collect::<Vec<_>>(), "one run");
        no_worse(&img, "Block bitmap differences", |fs| {
            fs.create(&NewInode::dir(b"/d").mode(0o755).cred(&Cred::root())).unwrap();
            let b = put(fs, "/d/b", 40 * 1024);
            let rec = ext4kit::ext4::inode::read(fs.volume(), b).unwrap();
            for (_, p, n) in
                ext4kit::ext4::bmap::load(fs.volume(), b, &rec).unwrap().runs(fs.volume(), u64::MAX).unwrap()
            {
                assert!((p..p + n).all(|x| !a_blocks.contains(&x)), "/a's blocks handed to /d/b: {p}+{n}");
            }
        });
    }

    /// Group 0's inode-table block holding inodes 17..24 (128-byte
    /// inodes, 1 KiB blocks: 8 a block): the next ones handed out after
    /// the first few.
    fn table_block_of_inode_17(img: &Path) -> u64 {
        dumpe2fs_number(img, "Inode table at") + 2
    }

    /// A mkdir and six files: inodes 12..18, past the table block that
    /// holds 17..24.
    fn seven_new_inodes(fs: &Fs) {
        fs.create(&NewInode::dir(b"/d").mode(0o755).cred(&Cred::root())).unwrap();
        for i in 0..6 {
            put(fs, &format!("/d/f{i}"), 3000);
        }
    }

    /// f_badtable: the bad-blocks inode lists an inode-table block. e2fsck's
    /// inode scan skips it and counts its inodes in use; a name pointing
    /// there is "located in a bad block" (PR_2_BB_INODE). No inode of that
    /// block is handed out.
    #[test]
    fn no_inode_is_taken_from_a_table_block_the_bad_blocks_inode_lists() {
        let dir = Scratch::dir("ext4kit-shape-badtable");
        let img = mke2fs(&dir, &["-t", "ext2", "-b", "1024", "-I", "128"], "8M");
        let bad = table_block_of_inode_17(&img);
        debugfs_w(&img, &[&format!("sif <1> block[0] {bad}"), "sif <1> blocks 2", "sif <1> size 1024"]);
        no_worse(&img, "Inode bitmap differences", seven_new_inodes);
    }

    /// f_itable_collision, f_ind_inode_collision: a file's indirect block
    /// is an inode-table block (e2fsck: "conflicts with critical
    /// metadata"), so e2fsck reads the records there as block pointers. A
    /// new inode written there would change that file's map.
    #[test]
    fn no_inode_is_taken_from_a_table_block_a_file_map_names() {
        let dir = Scratch::dir("ext4kit-shape-itable");
        let (img, _) = image_with_file(&dir, &["-t", "ext2", "-b", "1024", "-I", "128"], 20);
        let t = table_block_of_inode_17(&img);
        debugfs_w(&img, &[&format!("sif /a block[IND] {t}")]);
        no_worse(&img, "conflicts with critical metadata", seven_new_inodes);
    }

    /// f_ind_inode_collision: a file's indirect block is the inode-table
    /// block that holds the root's record. A mkdir in / would rewrite the
    /// root's record, and with it that file's map as e2fsck reads it: the
    /// block is cross-linked, so it is refused, naming the damage, before
    /// anything changes. Elsewhere the filesystem is still usable.
    #[test]
    fn no_record_is_rewritten_in_a_table_block_a_file_map_names() {
        let dir = Scratch::dir("ext4kit-shape-rootblock");
        let (img, _) = image_with_file(&dir, &["-t", "ext2", "-b", "1024", "-I", "128"], 20);
        debugfs_w(&img, &["mkdir /sub"]);
        let t = dumpe2fs_number(&img, "Inode table at");
        debugfs_w(&img, &[&format!("sif /a block[IND] {t}")]);
        let before = std::fs::read(&img).unwrap();
        let e = open_rw(&img)
            .create(&NewInode::dir(b"/d").mode(0o755).cred(&Cred::root()))
            .expect_err("the root's record is cross-linked");
        let msg = e.to_string();
        assert!(msg.contains("inode 2") && msg.contains("cross-linked") && msg.contains("run e2fsck"), "{msg}");
        assert!(std::fs::read(&img).unwrap() == before, "the refused mkdir changed the image");
        no_worse(&img, "conflicts with critical metadata", |fs| {
            fs.create(&NewInode::dir(b"/sub/d").mode(0o755).cred(&Cred::root())).unwrap();
            put(fs, "/sub/d/f", 3000);
        });
    }

    /// The same for a truncate and a setxattr of a file whose own record
    /// lies in that table block: refused before the handle begins (no
    /// error record: nothing was met half-way).
    #[test]
    fn truncate_and_setxattr_refuse_a_record_in_a_cross_linked_table_block_first() {
        let dir = Scratch::dir("ext4kit-shape-rec-trunc");
        let (img, _) = image_with_file(&dir, &["-t", "ext2", "-b", "1024", "-I", "128"], 20);
        let host = dir.join("z.src");
        std::fs::write(&host, vec![0x7a; 3000]).unwrap();
        debugfs_w(&img, &[&format!("write {} z", host.display())]);
        // /a is inode 12 and /z 13: both in the table's second block.
        let t = dumpe2fs_number(&img, "Inode table at") + 1;
        debugfs_w(&img, &[&format!("sif /a block[IND] {t}")]);
        let before = std::fs::read(&img).unwrap();
        for what in ["truncate", "setxattr"] {
            let fs = open_rw(&img);
            let e = if what == "truncate" {
                let ino = fs.stat(b"/z").unwrap().ino;
                fs.truncate_inode(&fs.inode(ino).unwrap(), 0, &ext4kit::Caller::root()).map(|_| ())
            } else {
                fs.setxattr(Target::path(b"/z").nofollow(), b"user.x", b"1", 0, &Cred::root())
            }
            .expect_err("the record of /z is cross-linked")
            .to_string();
            drop(fs);
            assert!(e.contains("inode 13") && e.contains("cross-linked") && e.contains("run e2fsck"), "{what}: {e}");
            assert!(std::fs::read(&img).unwrap() == before, "{what}: the refusal changed the image");
        }
    }

    /// f_cloneblock_alloc_error, f_jnl_etb_alloc_fail: no free block left
    /// (inodes left) on a filesystem without a journal that keeps
    /// `bg_itable_unused`. mkdir's ENOSPC must come before its inode is
    /// allocated: freed again, the inode still lowers the high-water mark.
    #[test]
    fn mkdir_on_a_full_filesystem_refuses_before_changing_anything() {
        let dir = Scratch::dir("ext4kit-shape-full");
        let img = mke2fs(&dir, &["-t", "ext4", "-b", "1024", "-O", "^has_journal", "-m", "0"], "4M");
        {
            let fs = open_rw(&img);
            let bs = fs.volume().block_size();
            let mut n = fs.volume().reservations().available(ext4kit::ext4::reservation::Reserver::User) as usize;
            let data = vec![7u8; n * bs];
            loop {
                match fs.write_file(&NewInode::file(b"/fill").mode(0o644).owner(0, 0), &data[..n * bs]) {
                    Ok(_) => break,
                    Err(e) if e.errno() == ext4kit::Errno::ENOSPC && n > 1 => n -= 1,
                    Err(e) => panic!("filling: {e}"),
                }
            }
            fs.sync().unwrap();
            assert_eq!(fs.volume().reservations().available(ext4kit::ext4::reservation::Reserver::User), 0);
        }
        let before = std::fs::read(&img).unwrap();
        let e =
            open_rw(&img).create(&NewInode::dir(b"/d").mode(0o755).cred(&Cred::root())).expect_err("no block for /d");
        assert_eq!(e.errno(), ext4kit::Errno::ENOSPC, "{e}");
        assert!(std::fs::read(&img).unwrap() == before, "the refused mkdir changed the image");
    }

    /// j_recover_csum2_*: group 0's bitmap (flex_bg: it holds every
    /// group's bitmaps and inode tables) says group 1's block bitmap is
    /// free. While group 1 is BLOCK_UNINIT e2fsprogs marks its metadata
    /// itself; initialising it would leave only group 0's lying bitmap to
    /// speak for them. Group 1 is not allocated from.
    #[test]
    fn an_uninit_group_whose_metadata_its_home_bitmap_calls_free_is_not_initialised() {
        let dir = Scratch::dir("ext4kit-shape-uninit-home");
        let img = mke2fs(&dir, &["-t", "ext4", "-b", "1024", "-O", "^has_journal"], "32M");
        let out = ext4kit_testkit::run_ok(Command::new("dumpe2fs").arg(&img), &[0]).unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let g1 = &text[text.find("Group 1:").expect("a second group")..];
        assert!(g1.lines().next().unwrap_or("").contains("BLOCK_UNINIT"), "{g1}");
        let bb: u64 = {
            let t = &g1[g1.find("Block bitmap at ").unwrap() + "Block bitmap at ".len()..];
            t[..t.find(|c: char| !c.is_ascii_digit()).unwrap()].parse().unwrap()
        };
        assert!(bb < 8193, "flex_bg puts group 1's bitmap in group 0: {bb}");
        debugfs_w(&img, &[&format!("freeb {bb}")]);
        no_worse(&img, "Block bitmap differences", |fs| {
            fs.create(&NewInode::dir(b"/d").mode(0o755).cred(&Cred::root())).unwrap();
            put(fs, "/d/f", 20_000);
        });
    }

    /// f_uninit_disable: `bg_itable_unused` left set on a filesystem
    /// without gdt_csum ("Group descriptor 0 marked uninitialized without
    /// feature set", unrepaired). e2fsck's pass 2 still checks names
    /// against it, so new inodes must lower it.
    #[test]
    fn new_inodes_leave_the_unused_area_even_without_gdt_csum() {
        let dir = Scratch::dir("ext4kit-shape-uninit-disable");
        let img = mke2fs(&dir, &["-t", "ext2", "-b", "1024", "-N", "2048"], "8M");
        debugfs_w(&img, &["set_bg 0 itable_unused 2037"]);
        no_worse(&img, "marked uninitialized without feature set", |fs| {
            fs.create(&NewInode::dir(b"/d").mode(0o755).cred(&Cred::root())).unwrap();
            put(fs, "/d/f", 5000);
        });
    }
}

/// Cross-linked blocks — one block named by two inodes' maps — made with
/// debugfs (`sif /b block[N]`) on images our library wrote. Every path
/// that would free or rewrite the shared block for one of its owners
/// refuses, naming the block and "run e2fsck", before anything changes:
/// rm of either owner, truncate, hole punch, rename over an owner, rmdir,
/// removing or rewriting an xattr block, and rm through the mount. The
/// shared block is an extent-tree node, an indirect block, an xattr block
/// or a directory block, and the other owner's data.
mod cross_linked {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::Arc;

    use ext4kit::vfs::io::FALLOC_FL_PUNCH_HOLE;
    use ext4kit::Fallocate;
    use ext4kit::{Cred, Fs, NewInode, OpenOptions, RenameFlags, Target, WriteRequest};
    use ext4kit_fuzz::damaged::check::{compare_images, find_cli};
    use ext4kit_fuzz::damaged::fsck::Fsck;
    use ext4kit_testkit::Scratch;

    fn run(cmd: &mut Command) -> String {
        let out = ext4kit_testkit::run_ok(cmd, &[0]).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn open_rw(img: &Path) -> Arc<Fs> {
        Fs::open_image(img, &OpenOptions { read_only: false, ..Default::default() }).unwrap()
    }

    /// The image: `/a` (ext4: twelve one-block extents, so a depth-1 tree
    /// with a leaf node; ext2: 20 blocks, so an indirect block), `/b` and
    /// `/c` (one block each), `/x` (an xattr too big for the inode: an
    /// xattr block), `/d` (an empty directory).
    fn base(dir: &Path, ext2: bool) -> PathBuf {
        let img = dir.join("base.img");
        let t = if ext2 { "ext2" } else { "ext4" };
        run(Command::new("mke2fs").args(["-q", "-F", "-t", t, "-b", "1024", "-I", "256"]).arg(&img).arg("8M"));
        let fs = open_rw(&img);
        let root = Cred::root();
        let bs = 1024u64;
        let a = fs.write_file(&NewInode::file(b"/a").mode(0o644).owner(0, 0), &[]).unwrap().ino;
        let ia = fs.inode(a).unwrap();
        let blocks: &[u64] = if ext2 { &[0] } else { &[0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22] };
        for &k in blocks {
            let len = if ext2 { 20 * bs } else { bs } as usize;
            fs.write_inode(&ia, &WriteRequest::at(k * bs, &vec![0xa5; len])).unwrap();
        }
        drop(ia);
        fs.write_file(&NewInode::file(b"/b").mode(0o644).owner(0, 0), &[0xb6; 1024]).unwrap();
        fs.write_file(&NewInode::file(b"/c").mode(0o644).owner(0, 0), &[0xc7; 1024]).unwrap();
        fs.write_file(&NewInode::file(b"/x").mode(0o644).owner(0, 0), b"x").unwrap();
        fs.setxattr(Target::path(b"/x").nofollow(), b"user.big", &[0x78; 700], 0, &root).unwrap();
        fs.create(&NewInode::dir(b"/d").mode(0o755).cred(&root)).unwrap();
        fs.sync().unwrap();
        drop(fs);
        img
    }

    /// `debugfs -R 'stat PATH'`.
    fn stat(img: &Path, path: &str) -> String {
        run(Command::new("debugfs").args(["-R", &format!("stat {path}")]).arg(img))
    }

    /// The number after `key` in debugfs' stat of `path` ("(ETB0):",
    /// "(IND):", "File ACL: ").
    fn stat_number(img: &Path, path: &str, key: &str) -> u64 {
        let s = stat(img, path);
        let at = s.find(key).unwrap_or_else(|| panic!("no {key:?} in stat {path}:\n{s}")) + key.len();
        let t = s[at..].trim_start();
        t[..t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len())].parse().unwrap()
    }

    fn dir_block(img: &Path, path: &str) -> u64 {
        run(Command::new("debugfs").args(["-R", &format!("blocks {path}")]).arg(img))
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// Point `/b`'s only block at `target` (ext4: its extent's
    /// `ee_start_lo`, i_block[5]; ext2: its first direct pointer).
    fn cross_link_b(img: &Path, ext2: bool, target: u64) {
        let slot = if ext2 { 0 } else { 5 };
        run(Command::new("debugfs").args(["-w", "-R", &format!("sif /b block[{slot}] {target}")]).arg(img));
    }

    /// `op` on a fresh copy of `img` is refused naming block `shared` and
    /// "run e2fsck", and the copy is as it was (apart from the superblock's
    /// error record).
    fn refused(img: &Path, what: &str, shared: u64, op: impl FnOnce(&Fs) -> ext4kit::Result<()>) {
        let work = img.with_file_name("work.img");
        std::fs::copy(img, &work).unwrap();
        let before = std::fs::read(&work).unwrap();
        let r = {
            let fs = open_rw(&work);
            let r = op(&fs);
            let _ = fs.sync();
            r
        };
        let e = r.err().unwrap_or_else(|| panic!("{what}: not refused")).to_string();
        assert!(
            e.contains(&format!("block {shared}")) && e.contains("cross-linked") && e.contains("run e2fsck"),
            "{what}: {e}"
        );
        let after = std::fs::read(&work).unwrap();
        assert!(compare_images(&before, &after).is_some(), "{what}: refused ({e}) but changed the image");
    }

    fn truncate(fs: &Fs, path: &str, len: u64) -> ext4kit::Result<()> {
        let ino = fs.stat(path.as_bytes())?.ino;
        fs.truncate_inode(&*fs.inode(ino)?, len, &ext4kit::Caller::root()).map(|_| ())
    }

    /// The paths that free or rewrite a shared block of each kind.
    fn every_path_refuses(ext2: bool) {
        let tag = if ext2 { "ext2" } else { "ext4" };
        let dir = Scratch::dir(&format!("ext4kit-xlinked-{tag}"));
        let clean = base(&dir, ext2);
        let root = Cred::root();
        let node_key = if ext2 { "(IND):" } else { "(ETB0):" };
        let kinds = [
            ("map block of /a", stat_number(&clean, "/a", node_key)),
            ("xattr block of /x", stat_number(&clean, "/x", "File ACL: ")),
            ("directory block of /d", dir_block(&clean, "/d")),
        ];
        for (kind, shared) in kinds {
            let img = dir.join(format!("xlinked-{}.img", kind.split(' ').next().unwrap_or("k")));
            std::fs::copy(&clean, &img).unwrap();
            cross_link_b(&img, ext2, shared);
            let f = Fsck::run(&img).unwrap();
            assert!(f.raw.contains("Multiply-claimed"), "{kind}: the damage is not there:\n{}", f.raw);
            let what = |op: &str| format!("{tag}, {kind} shared with /b's data: {op}");
            refused(&img, &what("rm /b"), shared, |fs| fs.unlink(b"/b", &root));
            refused(&img, &what("truncate /b 0"), shared, |fs| truncate(fs, "/b", 0));
            refused(&img, &what("mv /c /b"), shared, |fs| fs.rename(b"/c", b"/b", RenameFlags::default(), &root));
            match kind.split(' ').next() {
                Some("map") => {
                    refused(&img, &what("rm /a"), shared, |fs| fs.unlink(b"/a", &root));
                    refused(&img, &what("truncate /a 0"), shared, |fs| truncate(fs, "/a", 0));
                    refused(&img, &what("truncate /a 3 KiB"), shared, |fs| truncate(fs, "/a", 3072));
                    refused(&img, &what("punch /a 4-8 KiB"), shared, |fs| {
                        let ino = fs.stat(b"/a")?.ino;
                        fs.fallocate_inode(
                            &*fs.inode(ino)?,
                            Fallocate { mode: FALLOC_FL_PUNCH_HOLE | 1, off: 4096, len: 4096 },
                            &ext4kit::Caller::root(),
                        )
                        .map(|_| ())
                    });
                }
                Some("xattr") => {
                    refused(&img, &what("rm /x"), shared, |fs| fs.unlink(b"/x", &root));
                    refused(&img, &what("setfattr -x user.big /x"), shared, |fs| {
                        let ino = fs.stat(b"/x")?.ino;
                        fs.removexattr(ino, b"user.big", &root)
                    });
                    refused(&img, &what("setfattr -n user.big /x (rewrite)"), shared, |fs| {
                        fs.setxattr(Target::path(b"/x").nofollow(), b"user.big", &[0x79; 700], 0, &root)
                    });
                }
                _ => {
                    refused(&img, &what("rmdir /d"), shared, |fs| fs.rmdir(b"/d", &root));
                }
            }
        }
    }

    #[test]
    fn every_path_that_frees_a_cross_linked_block_refuses_ext4() {
        every_path_refuses(false);
    }

    #[test]
    fn every_path_that_frees_a_cross_linked_block_refuses_ext2() {
        every_path_refuses(true);
    }

    /// A block of the journal that a file's map names too (a flipped
    /// pointer into the log: the corpus's seed 864 has the resize inode's
    /// doubly-indirect block naming one). The log is written round and
    /// round, so any commit may overwrite what the file holds — e2fsck
    /// then reads new "illegal blocks" in it. Every write is refused,
    /// naming the block, with the image as it was: those that run the
    /// owner scan first at their handle's start, and one that allocates
    /// and frees nothing (chmod: its handle begins before any scan) at its
    /// commit.
    #[test]
    fn a_journal_block_a_file_names_stops_every_write() {
        let dir = Scratch::dir("ext4kit-xlinked-journal");
        let img = base(&dir, false);
        // The journal's tenth block: the first commits write it.
        let shared: u64 = run(Command::new("debugfs").args(["-R", "blocks <8>"]).arg(&img))
            .split_whitespace()
            .nth(9)
            .unwrap()
            .parse()
            .unwrap();
        cross_link_b(&img, false, shared);
        let f = Fsck::run(&img).unwrap();
        assert!(f.raw.contains("Multiply-claimed"), "the damage is not there:\n{}", f.raw);
        let root = Cred::root();
        refused(&img, "mkdir /new", shared, |fs| {
            fs.create(&NewInode::dir(b"/new").mode(0o755).cred(&root)).map(|_| ())
        });
        refused(&img, "put /new", shared, |fs| {
            fs.write_file(&NewInode::file(b"/new").mode(0o644).owner(0, 0), b"x").map(|_| ())
        });
        refused(&img, "rm /c", shared, |fs| fs.unlink(b"/c", &root));
        let work = img.with_file_name("work.img");
        std::fs::copy(&img, &work).unwrap();
        let before = std::fs::read(&work).unwrap();
        {
            let fs = open_rw(&work);
            fs.chmod(b"/c", 0o600, &root).unwrap();
            let e = fs
                .create(&NewInode::dir(b"/new").mode(0o755).cred(&root))
                .expect_err("the scan found the journal cross-linked")
                .to_string();
            assert!(e.contains(&format!("block {shared}")) && e.contains("run e2fsck"), "{e}");
            let e = fs.sync().expect_err("chmod's commit is refused").to_string();
            assert!(e.contains(&format!("block {shared}")) && e.contains("cross-linked"), "{e}");
        }
        let after = std::fs::read(&work).unwrap();
        assert!(compare_images(&before, &after) == Some(false), "the refused commit changed the image");
    }

    /// An orphan (an open, unlinked file at the crash: links 0, on the
    /// superblock's orphan list, bitmap bit set) whose block is also
    /// /a's: the release at open would free /a's block, so it is refused.
    /// A read-write open then refuses writes with the cross-link named,
    /// leaving the image as it was; a read-only one shows the tree with a
    /// warning. (e2fsck -n counts the orphan as deleted, not as a second
    /// owner; its own orphan release, with -y, would free the block and
    /// then mark it used again for /a in pass 5.)
    #[test]
    fn a_cross_linked_orphan_is_not_released() {
        let dir = Scratch::dir("ext4kit-xlinked-orphan");
        let img = base(&dir, false);
        let a_block = stat_number(&img, "/a", "(0):");
        let b = stat_number(&img, "/b", "Inode: ");
        cross_link_b(&img, false, a_block);
        for c in ["unlink /b".to_string(), format!("sif <{b}> links_count 0"), format!("ssv last_orphan {b}")] {
            run(Command::new("debugfs").args(["-w", "-R", &c]).arg(&img));
        }
        let before = std::fs::read(&img).unwrap();
        let e = match Fs::open_image(&img, &OpenOptions { read_only: false, ..Default::default() }) {
            Err(e) => e.to_string(),
            Ok(fs) => fs
                .create(&NewInode::dir(b"/new").mode(0o755).cred(&Cred::root()))
                .expect_err("writes are refused")
                .to_string(),
        };
        assert!(
            e.contains(&format!("block {a_block}")) && e.contains("cross-linked") && e.contains("run e2fsck"),
            "{e}"
        );
        assert!(compare_images(&before, &std::fs::read(&img).unwrap()).is_some(), "the image changed");
        let ro = Fs::open_image(&img, &OpenOptions { read_only: true, ..Default::default() }).unwrap();
        assert!(ro.warnings().iter().any(|w| w.contains("cross-linked")), "{:?}", ro.warnings());
        assert_eq!(ro.stat(b"/a").unwrap().size, 23 * 1024);
    }

    /// The same through `ext4kit mount`: rm of either owner fails, both
    /// files stay whole, and after the unmount e2fsck finds nothing new.
    #[test]
    fn rm_through_the_mount_never_frees_a_cross_linked_block() {
        let cli = find_cli().unwrap_or_else(|e| panic!("this test needs the ext4kit binary: {e}"));
        let dir = Scratch::dir("ext4kit-xlinked-mount");
        let img = base(&dir, false);
        let node = stat_number(&img, "/a", "(ETB0):");
        cross_link_b(&img, false, node);
        let before = Fsck::run(&img).unwrap();
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        run(Command::new("timeout").arg("60").arg(&cli).arg("mount").arg(&img).arg(&mnt));
        let ra = std::fs::remove_file(mnt.join("a"));
        let rb = std::fs::remove_file(mnt.join("b"));
        let a_len = std::fs::metadata(mnt.join("a")).map(|m| m.len());
        let b_len = std::fs::metadata(mnt.join("b")).map(|m| m.len());
        run(Command::new("timeout").arg("60").arg(&cli).arg("umount").arg(&mnt));
        assert!(ra.is_err() && rb.is_err(), "rm through the mount: /a {ra:?}, /b {rb:?}");
        assert_eq!((a_len.ok(), b_len.ok()), (Some(23 * 1024), Some(1024)), "both files are still there");
        let after = Fsck::run(&img).unwrap();
        if let Some(w) = before.worse(&after) {
            panic!("made worse through the mount: {w}\n{}", after.raw);
        }
    }
}
