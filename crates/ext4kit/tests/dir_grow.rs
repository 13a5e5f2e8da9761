//! Directories that grow, split and shrink (htree: no linear scan).
//!
//! Names are created through `Fs::create` until directories append blocks
//! (ext2 without dir_index), turn into htrees, split leaves, grow a second
//! index level (1 KiB blocks) and a third (large_dir); then half the names
//! are moved to another directory with `remove_link` + `add_link` at the
//! ext4 layer, two entries are swapped with `replace_link`, and a new
//! directory is made with `init_dir` and moved with `set_dotdot`. After each
//! phase `e2fsck -fn` must be clean (its pass 2 checks every htree: hash
//! ranges, limits, depth, checksums), a fresh open must find every name, and
//! the kernel (loop mount, as root) must list exactly the same names.

use ext4kit::NewInode;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

use ext4kit::ext4::dir_insert::{self, NewEntry};
use ext4kit::ext4::{dir, dir_delete, ialloc, inode, DirRef, Mapping};
use ext4kit::{Errno, FileType, Fs, OpenOptions};
use ext4kit_format::htree;

fn sh(cmd: &mut Command) {
    ext4kit_testkit::run_ok(cmd, &[0]).unwrap_or_else(|e| panic!("{e} (apt-get install e2fsprogs)"));
}

/// An image whose /d is an empty one-block linear directory and /moved
/// another one (mke2fs -d).
fn image(dir: &Path, tag: &str, mkfs: &[&str], size: &str) -> PathBuf {
    let src = dir.join(format!("src-{tag}"));
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::create_dir_all(src.join("moved")).unwrap();
    let img = dir.join(format!("{tag}.img"));
    sh(Command::new("mke2fs")
        .args(["-q", "-F"])
        .args(mkfs)
        .arg("-d")
        .arg(&src)
        .arg(&img)
        .arg(size));
    img
}

fn fsck_clean(img: &Path, phase: &str) {
    let out = Command::new("timeout")
        .args(["600", "e2fsck", "-fn"])
        .arg(img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn {} not clean after {phase}:\n{}",
        img.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

fn open(img: &Path) -> std::sync::Arc<Fs> {
    Fs::open_image(
        img,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap()
}

fn name(i: usize, long: bool) -> String {
    let short = format!("f{i:06}-{}", i.wrapping_mul(2654435761) % 1000);
    if long {
        // 255 bytes: three records per 1 KiB leaf, so trees get deep fast.
        format!("{short}-{}", "x".repeat(255 - short.len() - 1))
    } else {
        short
    }
}

/// Names in a directory as read by a fresh open, without "." and "..".
fn listing(fs: &Fs, dir: &[u8]) -> BTreeSet<Vec<u8>> {
    fs.read_dir(dir)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != b"." && n != b"..")
        .collect()
}

/// (INDEX flag, indirect levels) of a directory, read from its root.
fn shape(fs: &Fs, dir: &[u8]) -> (bool, u8) {
    let st = fs.stat(dir).unwrap();
    if st.flags & 0x1000 == 0 {
        return (false, 0);
    }
    let ci = fs.inode(st.ino).unwrap();
    let map = ci.block_map(fs.volume()).unwrap();
    let Mapping::Mapped { pblk, .. } = map.map(fs.volume(), 0).unwrap() else {
        panic!("root is a hole")
    };
    let b = fs.volume().buffer(pblk).unwrap();
    let root = htree::parse_root(&b.data, fs.volume().block_size(), true, None).unwrap();
    (true, root.info.indirect_levels)
}

/// What the kernel lists in `dir`, or None when it cannot mount here.
fn kernel_listing(img: &Path, tag: &str, dirs: &[&str]) -> Option<Vec<BTreeSet<Vec<u8>>>> {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        eprintln!("skipping the kernel read-back: {e}");
        return None;
    }
    let mnt = img.with_file_name(format!("mnt-{tag}"));
    let m = ext4kit_testkit::LoopMount::mount(img, &mnt, "ext4", true).unwrap();
    let out = dirs
        .iter()
        .map(|d| {
            std::fs::read_dir(m.path().join(d))
                .unwrap()
                .map(|e| {
                    use std::os::unix::ffi::OsStrExt;
                    e.unwrap().file_name().as_bytes().to_vec()
                })
                .collect()
        })
        .collect();
    m.unmount().unwrap();
    Some(out)
}

/// Run `f` on directory `path` at the ext4 layer inside one handle, then
/// write the directory's record back (as the vfs does) and commit.
fn with_dir<R>(
    fs: &Fs,
    path: &[u8],
    f: impl FnOnce(&mut ext4kit::ext4::transaction::Handle<'_>, DirRef<'_>, &mut ext4kit_format::inode::Inode) -> R,
) -> R {
    let st = fs.stat(path).unwrap();
    let ci = fs.inode(st.ino).unwrap();
    let map = ci.block_map(fs.volume()).unwrap();
    let mut rec = ci.disk.write();
    let mut new = rec.clone();
    let mut h = fs.volume().begin().unwrap();
    let r = {
        let dref = DirRef {
            ino: st.ino,
            inode: &rec,
            map: &map,
        };
        f(&mut h, dref, &mut new)
    };
    inode::write(fs.volume(), &mut h, st.ino, &new).unwrap();
    h.commit().unwrap();
    ci.size.store(new.size(), Ordering::Release);
    *rec = new;
    ci.reset_block_map();
    r
}

struct Case {
    tag: &'static str,
    mkfs: &'static [&'static str],
    size: &'static str,
    n: usize,
    long: bool,
    /// Expected (indexed, indirect levels) of /d after the creates.
    want: (bool, u8),
    /// The kernel can mount it (block size <= page size).
    kernel: bool,
}

/// Create `n` names in /d through `Fs::create`; returns the set.
fn create_all(img: &Path, c: &Case) -> BTreeSet<Vec<u8>> {
    let fs = open(img);
    let mut names = BTreeSet::new();
    for i in 0..c.n {
        let nm = name(i, c.long);
        fs.create(&NewInode::file(format!("/d/{nm}").as_bytes()).mode(0o644).owner(0, 0))
            .unwrap_or_else(|e| panic!("{}: create #{i}: {e}", c.tag));
        names.insert(nm.into_bytes());
    }
    fs.sync().unwrap();
    names
}

fn run_case(c: &Case) {
    let tmp = tempdir(c.tag);
    let img = image(&tmp, c.tag, c.mkfs, c.size);
    let names = create_all(&img, c);
    fsck_clean(&img, "creates");

    // A fresh open finds every name by lookup and exactly the set by readdir.
    let fs = open(&img);
    assert_eq!(shape(&fs, b"/d"), c.want, "{}: shape of /d", c.tag);
    for nm in &names {
        let mut p = b"/d/".to_vec();
        p.extend_from_slice(nm);
        assert_eq!(fs.stat(&p).unwrap().ftype, FileType::Regular);
    }
    assert!(fs.stat(b"/d/absent").is_err());
    assert_eq!(listing(&fs, b"/d"), names, "{}: readdir", c.tag);
    drop(fs);
    if let Some(k) = c.kernel.then(|| kernel_listing(&img, c.tag, &["d"])).flatten() {
        assert_eq!(k[0], names, "{}: kernel listing", c.tag);
    }

    // Move every other name to /moved at the ext4 layer; swap two entries.
    let fs = open(&img);
    let moved_ino = fs.stat(b"/moved").unwrap().ino;
    let d_ino = fs.stat(b"/d").unwrap().ino;
    let all: Vec<Vec<u8>> = names.iter().cloned().collect();
    let mut kept = BTreeSet::new();
    let mut moved = BTreeSet::new();
    let mut taken = Vec::new();
    with_dir(&fs, b"/d", |h, d, _new| {
        for (i, nm) in all.iter().enumerate() {
            if i % 2 == 1 {
                let (ino, ft) = dir_delete::remove_link(fs.volume(), h, d, nm).unwrap();
                assert_eq!(ft, Some(FileType::Regular));
                taken.push((nm.clone(), ino));
                moved.insert(nm.clone());
            } else {
                kept.insert(nm.clone());
            }
        }
        // A record that no longer matches the DirRef is refused untouched.
        let mut stale = d.inode.clone();
        stale.base.size_lo += fs.volume().block_size() as u32;
        let e = dir_insert::add_link(
            fs.volume(),
            h,
            d,
            &mut stale,
            NewEntry::new(b"stale", 5, FileType::Regular),
        )
        .unwrap_err();
        assert_eq!(e.errno(), Errno::EINVAL);
        let e = dir_delete::remove_link(fs.volume(), h, d, &all[1]).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOENT);
        assert!(!dir::is_empty(fs.volume(), d).unwrap());
        // Swap the first two kept names' inodes.
        let (a, b) = (&all[0], &all[2]);
        let ia = dir::lookup(fs.volume(), d, a).unwrap().unwrap().0;
        let ib = dir::lookup(fs.volume(), d, b).unwrap().unwrap().0;
        assert_eq!(
            dir_delete::replace_link(fs.volume(), h, d, a, ib, FileType::Regular).unwrap(),
            ia
        );
        assert_eq!(
            dir_delete::replace_link(fs.volume(), h, d, b, ia, FileType::Regular).unwrap(),
            ib
        );
        assert_eq!(dir::lookup(fs.volume(), d, a).unwrap().unwrap().0, ib);
        assert_eq!(
            dir_delete::replace_link(fs.volume(), h, d, b"absent", 5, FileType::Regular)
                .unwrap_err()
                .errno(),
            Errno::ENOENT
        );
    });
    let reads0 = fs.volume().stats().dir_block_reads();
    for (nm, ino) in &taken {
        with_dir(&fs, b"/moved", |h, d, new| {
            let grew =
                dir_insert::add_link(fs.volume(), h, d, new, NewEntry::new(nm, *ino, FileType::Regular)).unwrap();
            // Room in the leaf: exactly one block changes. A split or a new
            // block: the leaves, the index path and the allocator's blocks.
            let touched = h.dirty_blocks().count();
            assert!(
                if grew { touched <= 12 } else { touched == 1 },
                "{touched} blocks for one add_link"
            );
        });
    }
    let per_move = (fs.volume().stats().dir_block_reads() - reads0) as f64 / taken.len().max(1) as f64;
    eprintln!(
        "{}: {per_move:.1} directory blocks read per add_link into /moved",
        c.tag
    );
    // A new directory made at the ext4 layer inside /d, then moved to /moved.
    let sub_ino = with_dir(&fs, b"/d", |h, d, new| {
        let ino = ialloc::new_inode(fs.volume(), h, d_ino, FileType::Directory).unwrap();
        let mut rec = ialloc::new_record(
            fs.volume(),
            &ialloc::NewInode {
                ftype: FileType::Directory,
                perm: 0o755,
                uid: 0,
                gid: 0,
                now: ext4kit::Timestamp { sec: 1, nsec: 0 },
                parent: (0, 0),
            },
        );
        dir_insert::init_dir(fs.volume(), h, ino, &mut rec, d_ino).unwrap();
        inode::write(fs.volume(), h, ino, &rec).unwrap();
        dir_insert::add_link(
            fs.volume(),
            h,
            d,
            new,
            NewEntry::new(b"subdir", ino, FileType::Directory),
        )
        .unwrap();
        new.base.links_count += 1;
        ino
    });
    // Fill the new directory past one block (an htree where dir_index is
    // on), then empty it again: still valid, and empty.
    let sub = b"/d/subdir";
    let n_sub = fs.volume().block_size() / 16 + 100;
    for i in 0..n_sub {
        with_dir(&fs, sub, |h, d, new| {
            let nm = format!("tmp-{i}-{}", "y".repeat(i % 40));
            dir_insert::add_link(
                fs.volume(),
                h,
                d,
                new,
                NewEntry::new(nm.as_bytes(), d_ino, FileType::Directory),
            )
            .unwrap();
        });
    }
    assert_eq!(listing(&fs, sub).len(), n_sub);
    for i in (0..n_sub).rev() {
        with_dir(&fs, sub, |h, d, _new| {
            let nm = format!("tmp-{i}-{}", "y".repeat(i % 40));
            assert_eq!(
                dir_delete::remove_link(fs.volume(), h, d, nm.as_bytes()).unwrap().0,
                d_ino
            );
            assert_eq!(dir::is_empty(fs.volume(), d).unwrap(), i == 0);
        });
    }
    assert!(
        fs.stat(sub).unwrap().size > fs.volume().block_size() as u64,
        "the subdirectory grew"
    );
    drop(fs);
    fsck_clean(&img, "moves, swap and mkdir");
    let fs = open(&img);
    assert_eq!(listing(&fs, b"/d").len(), kept.len() + 1);
    assert!(fs.read_dir(sub_ino).unwrap().len() == 2);
    with_dir(&fs, b"/d", |h, d, new| {
        assert_eq!(
            dir_delete::remove_link(fs.volume(), h, d, b"subdir").unwrap(),
            (sub_ino, Some(FileType::Directory))
        );
        new.base.links_count -= 1;
    });
    with_dir(&fs, b"/moved", |h, d, new| {
        dir_insert::add_link(
            fs.volume(),
            h,
            d,
            new,
            NewEntry::new(b"subdir", sub_ino, FileType::Directory),
        )
        .unwrap();
        new.base.links_count += 1;
    });
    {
        let ci = fs.inode(sub_ino).unwrap();
        let map = ci.block_map(fs.volume()).unwrap();
        let rec = ci.disk.read();
        let d = DirRef {
            ino: sub_ino,
            inode: &rec,
            map: &map,
        };
        assert!(dir::is_empty(fs.volume(), d).unwrap());
        let mut h = fs.volume().begin().unwrap();
        dir_insert::set_dotdot(fs.volume(), &mut h, d, moved_ino).unwrap();
        h.commit().unwrap();
    }
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img, "moving a directory");

    let fs = open(&img);
    moved.insert(b"subdir".to_vec());
    assert_eq!(listing(&fs, b"/d"), kept, "{}: /d after removals", c.tag);
    assert_eq!(listing(&fs, b"/moved"), moved, "{}: /moved", c.tag);
    let dd: Vec<_> = fs.read_dir(b"/moved/subdir").unwrap();
    assert!(dd.iter().any(|e| e.name == b".." && e.ino == moved_ino));
    let mut a = b"/d/".to_vec();
    a.extend_from_slice(&all[0]);
    let mut b = b"/d/".to_vec();
    b.extend_from_slice(&all[2]);
    assert_ne!(fs.stat(&a).unwrap().ino, fs.stat(&b).unwrap().ino);
    drop(fs);
    if !c.kernel {
        return;
    }
    if let Some(k) = kernel_listing(&img, c.tag, &["d", "moved"]) {
        assert_eq!(k[0], kept, "{}: kernel /d", c.tag);
        assert_eq!(k[1], moved, "{}: kernel /moved", c.tag);
        kernel_then_us(&img, c.tag, &mut kept);
    }
}

/// The kernel adds and removes names in the tree we built (its dx_probe
/// and do_split run on our index), then we add more on top of its changes.
fn kernel_then_us(img: &Path, tag: &str, kept: &mut BTreeSet<Vec<u8>>) {
    let mnt = img.with_file_name(format!("mnt-rw-{tag}"));
    let m = ext4kit_testkit::LoopMount::mount(img, &mnt, "ext4", false).unwrap();
    let d = m.path().join("d");
    for i in 0..400 {
        let nm = format!("kernel-made-{i}");
        std::fs::File::create(d.join(&nm)).unwrap();
        kept.insert(nm.into_bytes());
    }
    let victims: Vec<Vec<u8>> = kept.iter().step_by(7).take(100).cloned().collect();
    for v in &victims {
        use std::os::unix::ffi::OsStrExt;
        std::fs::remove_file(d.join(std::ffi::OsStr::from_bytes(v))).unwrap();
        kept.remove(v);
    }
    m.unmount().unwrap();
    fsck_clean(img, "kernel changes on our tree");
    let fs = open(img);
    assert_eq!(&listing(&fs, b"/d"), kept, "{tag}: our view of the kernel's changes");
    for i in 0..400 {
        let nm = format!("ours-again-{i}");
        fs.create(&NewInode::file(format!("/d/{nm}").as_bytes()).mode(0o644).owner(0, 0))
            .unwrap();
        kept.insert(nm.into_bytes());
    }
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(img, "our changes on the kernel's tree");
    let k = kernel_listing(img, &format!("{tag}-2"), &["d"]).unwrap();
    assert_eq!(&k[0], kept, "{tag}: kernel view at the end");
}

fn tempdir(tag: &str) -> ext4kit_testkit::Scratch {
    ext4kit_testkit::Scratch::dir(&format!("ext4kit-dir-grow-{tag}"))
}

#[test]
fn ext4_4k_small() {
    run_case(&Case {
        tag: "ext4-4k",
        mkfs: &["-t", "ext4", "-N", "2000"],
        size: "32M",
        n: 300,
        long: false,
        want: (true, 0),
        kernel: true,
    });
}

#[test]
fn ext4_1k_two_levels() {
    run_case(&Case {
        tag: "ext4-1k",
        mkfs: &["-t", "ext4", "-b", "1024", "-N", "32000"],
        size: "128M",
        n: 30_000,
        long: false,
        want: (true, 1),
        kernel: true,
    });
}

#[test]
fn ext2_linear_growth() {
    run_case(&Case {
        tag: "ext2",
        mkfs: &["-t", "ext2", "-O", "^dir_index", "-N", "2000"],
        size: "32M",
        n: 300,
        long: false,
        want: (false, 0),
        kernel: true,
    });
}

#[test]
fn ext3_small() {
    run_case(&Case {
        tag: "ext3",
        mkfs: &["-t", "ext3", "-N", "2000"],
        size: "32M",
        n: 300,
        long: false,
        want: (true, 0),
        kernel: true,
    });
}

#[test]
fn ext4_1k_no_csum() {
    run_case(&Case {
        tag: "ext4-1k-nocsum",
        mkfs: &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum", "-N", "4000"],
        size: "64M",
        n: 3000,
        long: true,
        want: (true, 1),
        kernel: true,
    });
}

/// Hard links to /target named by `name(i, true)` added to /d at the ext4
/// layer until `stop(levels)` says so or the index is full (ENOSPC, which
/// must leave nothing changed). Returns (links added, hit ENOSPC).
fn fill_with_links(fs: &Fs, stop: impl Fn(u8) -> bool) -> (usize, bool) {
    let target = fs
        .create(&NewInode::file(b"/target").mode(0o644).owner(0, 0))
        .unwrap()
        .ino;
    let mut added = 0usize;
    let mut full = false;
    loop {
        if added.is_multiple_of(200) && stop(shape(fs, b"/d").1) {
            break;
        }
        let nm = name(added, true);
        let r = with_dir(fs, b"/d", |h, d, new| {
            let before = new.clone();
            let r = dir_insert::add_link(
                fs.volume(),
                h,
                d,
                new,
                NewEntry::new(nm.as_bytes(), target, FileType::Regular),
            );
            if r.is_err() {
                assert_eq!(h.dirty_blocks().count(), 0, "a failed add_link changed blocks");
                assert_eq!(new.size(), before.size());
                assert_eq!(new.base.blocks_lo, before.base.blocks_lo);
            }
            r
        });
        match r {
            Ok(_) => added += 1,
            Err(e) => {
                assert_eq!(e.errno(), Errno::ENOSPC, "{e}");
                full = true;
                break;
            }
        }
    }
    let ci = fs.inode(target).unwrap();
    let mut rec = ci.disk.write();
    rec.base.links_count = 1 + added as u16;
    let mut h = fs.volume().begin().unwrap();
    inode::write(fs.volume(), &mut h, target, &rec).unwrap();
    h.commit().unwrap();
    drop(rec);
    fs.sync().unwrap();
    (added, full)
}

/// Without large_dir a two-level tree is the limit: once the root and the
/// path's node and leaf are full, add_link answers ENOSPC (as the kernel
/// does) and changes nothing.
#[test]
fn ext4_1k_full_two_level_tree_is_enospc() {
    let tmp = tempdir("enospc");
    let img = image(&tmp, "enospc", &["-t", "ext4", "-b", "1024", "-N", "2000"], "96M");
    let fs = open(&img);
    let (added, full) = fill_with_links(&fs, |_| false);
    assert!(full, "never hit ENOSPC after {added} links");
    assert!(added > 10_000, "ENOSPC too early: {added}");
    assert_eq!(shape(&fs, b"/d"), (true, 1));
    eprintln!("two-level 1 KiB tree full at {added} names of 255 bytes");
    drop(fs);
    fsck_clean(&img, "filling a two-level tree");
    let fs = open(&img);
    assert_eq!(listing(&fs, b"/d").len(), added);
    drop(fs);
    if let Some(k) = kernel_listing(&img, "enospc", &["d"]) {
        assert_eq!(k[0].len(), added);
    }
}

/// With large_dir the root grows a third level.
#[test]
fn ext4_1k_largedir_three_levels() {
    let tmp = tempdir("largedir");
    let img = image(
        &tmp,
        "largedir",
        &["-t", "ext4", "-b", "1024", "-O", "large_dir", "-N", "2000"],
        "128M",
    );
    let fs = open(&img);
    let (added, full) = fill_with_links(&fs, |levels| levels >= 2);
    assert!(!full, "ENOSPC with large_dir after {added}");
    assert_eq!(shape(&fs, b"/d"), (true, 2));
    // Some more after the third level appeared.
    let mut more = BTreeSet::new();
    for i in 0..300 {
        let nm = format!("after-{i}");
        fs.create(&NewInode::file(format!("/d/{nm}").as_bytes()).mode(0o600).owner(0, 0))
            .unwrap();
        more.insert(nm.into_bytes());
    }
    fs.sync().unwrap();
    eprintln!("three levels at {added} names of 255 bytes");
    drop(fs);
    fsck_clean(&img, "growing a third level");
    let fs = open(&img);
    let l = listing(&fs, b"/d");
    assert_eq!(l.len(), added + 300);
    assert!(more.is_subset(&l));
    for i in (0..added).step_by(97) {
        let p = format!("/d/{}", name(i, true));
        assert!(fs.stat(p.as_bytes()).is_ok(), "{p}");
    }
    drop(fs);
    if let Some(k) = kernel_listing(&img, "largedir", &["d"]) {
        assert_eq!(k[0], l);
    }
}

/// htree: directory blocks read per create stay flat from 10k to 50k
/// (and 100k) entries on a 4 KiB htree; 100,000 creates must all be found.
#[test]
fn ext4_4k_100k_creates_stay_flat() {
    let tmp = tempdir("100k");
    let img = image(&tmp, "100k", &["-t", "ext4", "-N", "100500"], "512M");
    let fs = open(&img);
    let mut per_create = Vec::new();
    let mut names = BTreeSet::new();
    let n = 100_000;
    let mut reads = fs.volume().stats().dir_block_reads();
    let mut t = std::time::Instant::now();
    for i in 0..n {
        let nm = name(i, false);
        fs.create(&NewInode::file(format!("/d/{nm}").as_bytes()).mode(0o644).owner(0, 0))
            .unwrap();
        names.insert(nm.into_bytes());
        if (i + 1) % 10_000 == 0 {
            let r = fs.volume().stats().dir_block_reads();
            let per = (r - reads) as f64 / 10_000.0;
            let rate = 10_000.0 / t.elapsed().as_secs_f64();
            eprintln!("{:>6} entries: {per:.2} dir blocks/create, {rate:.0} creates/s", i + 1);
            per_create.push(per);
            reads = r;
            t = std::time::Instant::now();
        }
    }
    fs.sync().unwrap();
    // Windows 0..=4 cover 0..50k: a one-level tree (a 4 KiB root holds 507
    // leaves), the cost must be flat. By 100k the root has grown a level:
    // the lookup and the insert each read one more index block, no more.
    let flat = &per_create[..5];
    let (lo, hi) = flat.iter().fold((f64::MAX, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
    assert!(
        hi - lo < 0.5,
        "blocks per create not flat from 10k to 50k: {per_create:?}"
    );
    assert_eq!(shape(&fs, b"/d"), (true, 1));
    assert!(per_create[9] <= hi + 2.0 + 0.01, "{per_create:?}");
    drop(fs);
    fsck_clean(&img, "100k creates");
    let fs = open(&img);
    assert!(shape(&fs, b"/d").0);
    assert_eq!(listing(&fs, b"/d"), names);
    // Renames and unlinks in the big tree: every 5th name renamed within
    // the directory, every 7th moved to another directory, then every
    // even-numbered name that is left unlinked. Each is a hash lookup plus
    // an edit of one leaf; the tree keeps its shape.
    let root = ext4kit::Cred::root();
    fs.create(&NewInode::dir(b"/e").mode(0o755).cred(&root)).unwrap();
    let mut moved = BTreeSet::new();
    for i in 0..n {
        let nm = name(i, false);
        let to = if i % 5 == 0 {
            format!("/d/r-{nm}")
        } else if i % 7 == 0 {
            format!("/e/{nm}")
        } else {
            continue;
        };
        fs.rename(
            format!("/d/{nm}").as_bytes(),
            to.as_bytes(),
            ext4kit::RenameFlags::default(),
            &root,
        )
        .unwrap();
        names.remove(nm.as_bytes());
        let new_name = to.rsplit('/').next().unwrap().as_bytes().to_vec();
        if i % 5 == 0 {
            names.insert(new_name)
        } else {
            moved.insert(new_name)
        };
    }
    for i in (0..n).step_by(2) {
        let nm = name(i, false);
        if names.remove(nm.as_bytes()) {
            fs.unlink(format!("/d/{nm}").as_bytes(), &root).unwrap();
        }
    }
    assert_eq!(listing(&fs, b"/d"), names);
    assert_eq!(listing(&fs, b"/e"), moved);
    // A name that was renamed away is gone; its new name resolves.
    assert_eq!(
        fs.stat(format!("/d/{}", name(5, false)).as_bytes())
            .unwrap_err()
            .errno(),
        ext4kit::Errno::ENOENT
    );
    fs.stat(format!("/d/r-{}", name(5, false)).as_bytes()).unwrap();
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img, "100k renames and unlinks");
    let fs = open(&img);
    assert_eq!(listing(&fs, b"/d"), names);
    assert_eq!(listing(&fs, b"/e"), moved);
    drop(fs);
    if let Some(k) = kernel_listing(&img, "100k", &["d", "e"]) {
        assert_eq!(k[0], names);
        assert_eq!(k[1], moved);
    }
}

/// 64 KiB blocks: rec_len 65536 is stored as 65535 (or 0); leaves and
/// index geometry at the largest size. The kernel cannot mount it on a
/// 4 KiB-page machine, so e2fsck and a fresh open are the oracles.
#[test]
fn ext4_64k_blocks() {
    run_case(&Case {
        tag: "ext4-64k",
        mkfs: &["-t", "ext4", "-b", "65536", "-N", "8000"],
        size: "256M",
        n: 6000,
        long: false,
        want: (true, 0),
        kernel: false,
    });
}

#[test]
fn ext4_64k_blocks_no_csum() {
    run_case(&Case {
        tag: "ext4-64k-nocsum",
        mkfs: &["-t", "ext4", "-b", "65536", "-O", "^metadata_csum", "-N", "8000"],
        size: "256M",
        n: 6000,
        long: false,
        want: (true, 0),
        kernel: false,
    });
}

/// Walk /d's index and count entries carrying the collision bit.
fn collision_bits(fs: &Fs, dir: &[u8]) -> usize {
    let st = fs.stat(dir).unwrap();
    let ci = fs.inode(st.ino).unwrap();
    let map = ci.block_map(fs.volume()).unwrap();
    let block = |l: u64| {
        let Mapping::Mapped { pblk, .. } = map.map(fs.volume(), l).unwrap() else {
            panic!("hole at {l}")
        };
        fs.volume().buffer(pblk).unwrap()
    };
    let bs = fs.volume().block_size();
    let root = htree::parse_root(&block(0).data, bs, true, None).unwrap();
    let mut level = vec![root.index];
    for _ in 0..root.info.indirect_levels {
        level = level
            .iter()
            .flat_map(|i| i.entries.iter().map(|e| e.block as u64).collect::<Vec<_>>())
            .map(|b| htree::parse_node(&block(b).data, bs, None).unwrap())
            .collect();
    }
    level
        .iter()
        .flat_map(|i| i.entries.iter())
        .filter(|e| e.hash & htree::HASH_COLLISION_BIT != 0)
        .count()
}

/// Names whose hashes collide, split across leaves: the new leaf's index
/// entry carries the collision bit, lookups and removals follow the chain,
/// e2fsck and the kernel agree. The hash seed is fixed so the collisions
/// (found by a birthday search over 255-byte names) are the same each run.
#[test]
fn hash_collisions_span_leaves() {
    use ext4kit_format::hash::{dx_hash, HashVersion};
    use std::collections::HashMap;
    let tmp = tempdir("collide");
    let img = image(
        &tmp,
        "collide",
        &[
            "-t",
            "ext4",
            "-b",
            "1024",
            "-N",
            "6000",
            "-U",
            "6b1f0a5e-3c1d-4e8a-9f00-2d4c6e8a0b1c",
            "-E",
            "hash_seed=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
        ],
        "64M",
    );
    let fs = open(&img);
    let def = fs.volume().sb().read().def_hash_version;
    let version = HashVersion {
        unsigned: fs.volume().geo().unsigned_hash(),
        ..HashVersion::from_disk(def).unwrap()
    };
    let long = |s: String| format!("{s}-{}", "z".repeat(254 - s.len()));
    let mut seen: HashMap<u32, String> = HashMap::new();
    let mut pairs = Vec::new();
    for i in 0..400_000 {
        let nm = long(format!("c{i:07}"));
        let h = dx_hash(nm.as_bytes(), version, fs.volume().geo().hash_seed()).0;
        if let Some(other) = seen.insert(h, nm.clone()) {
            pairs.push((other, nm));
            if pairs.len() == 30 {
                break;
            }
        }
    }
    assert!(pairs.len() >= 10, "birthday search found only {} pairs", pairs.len());
    let mut names = BTreeSet::new();
    let mut create = |nm: &str| {
        fs.create(&NewInode::file(format!("/d/{nm}").as_bytes()).mode(0o644).owner(0, 0))
            .unwrap();
        names.insert(nm.as_bytes().to_vec());
    };
    for (a, b) in &pairs {
        create(a);
        create(b);
    }
    for i in 0..3000 {
        create(&long(format!("filler{i}")));
    }
    fs.sync().unwrap();
    let bits = collision_bits(&fs, b"/d");
    eprintln!(
        "{} colliding pairs, {bits} index entries with the collision bit",
        pairs.len()
    );
    assert!(bits > 0, "no collision run was split across leaves");
    // Creating any of them again must find it, wherever its chain put it
    // (a create's lookup walks the chain past the first leaf).
    for nm in pairs.iter().flat_map(|(a, b)| [a, b]) {
        match fs.create(&NewInode::file(format!("/d/{nm}").as_bytes()).mode(0o644).owner(0, 0)) {
            Err(e) if e.errno() == Errno::EEXIST => {}
            other => panic!("creating {nm} again: {other:?}"),
        }
    }
    drop(fs);
    fsck_clean(&img, "collision splits");
    let fs = open(&img);
    for (a, b) in &pairs {
        let ia = fs.stat(format!("/d/{a}").as_bytes()).unwrap().ino;
        let ib = fs.stat(format!("/d/{b}").as_bytes()).unwrap().ino;
        assert_ne!(ia, ib);
    }
    assert_eq!(listing(&fs, b"/d"), names);
    if ext4kit_testkit::kernel_available().is_ok() {
        let m = ext4kit_testkit::LoopMount::mount(&img, &tmp.join("mnt-collide"), "ext4", true).unwrap();
        for (a, b) in &pairs {
            assert!(m.path().join("d").join(a).exists(), "kernel lookup of {a}");
            assert!(m.path().join("d").join(b).exists(), "kernel lookup of {b}");
        }
        m.unmount().unwrap();
    }
    // Move every colliding name to /moved: removal follows the chain.
    let mut moved = BTreeSet::new();
    for (a, b) in &pairs {
        for nm in [b, a] {
            let (ino, _) = with_dir(&fs, b"/d", |h, d, _| {
                dir_delete::remove_link(fs.volume(), h, d, nm.as_bytes()).unwrap()
            });
            with_dir(&fs, b"/moved", |h, d, new| {
                dir_insert::add_link(
                    fs.volume(),
                    h,
                    d,
                    new,
                    NewEntry::new(nm.as_bytes(), ino, FileType::Regular),
                )
                .unwrap()
            });
            names.remove(nm.as_bytes());
            moved.insert(nm.as_bytes().to_vec());
        }
    }
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img, "removing colliding names");
    let fs = open(&img);
    assert_eq!(listing(&fs, b"/d"), names);
    assert_eq!(listing(&fs, b"/moved"), moved);
    drop(fs);
    if let Some(k) = kernel_listing(&img, "collide", &["d", "moved"]) {
        assert_eq!(k[0], names);
        assert_eq!(k[1], moved);
    }
}
