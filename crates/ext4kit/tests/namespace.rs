//! Namespace changes — mkdir, rmdir, unlink, link, rename in every case —
//! checked three ways: against an in-memory model of the tree, by
//! `e2fsck -fn`, and by the kernel reading the image back (loop mount)
//! and seeing exactly the model's tree.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit::RenameFlags;
use ext4kit::{Cred, Errno, FileType, Fs, OpenOptions};

fn image(tag: &str, mkfs: &[&str], size: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("namespace");
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join(format!("{tag}.img"));
    let _ = std::fs::remove_file(&img);
    ext4kit_testkit::run_ok(
        Command::new("mke2fs").args(["-q", "-F"]).args(mkfs).arg(&img).arg(size),
        &[0],
    )
    .unwrap_or_else(|e| panic!("{e} (apt-get install e2fsprogs)"));
    img
}

fn fsck_clean(img: &Path) {
    ext4kit_testkit::e2fsck_clean(img).unwrap_or_else(|e| panic!("{e}"));
}

fn rw(img: &Path) -> std::sync::Arc<Fs> {
    Fs::open_image(
        img,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap()
}

/// What a tree entry looks like: type letter, link count, size, and the
/// file contents or link target.
type Tree = BTreeMap<String, (char, u64, u64, Vec<u8>)>;

fn letter(t: FileType) -> char {
    match t {
        FileType::Directory => 'd',
        FileType::Regular => 'f',
        FileType::Symlink => 'l',
        _ => 's',
    }
}

fn walk_ours(fs: &Fs, dir: &str, out: &mut Tree) {
    for e in fs.read_dir(dir.as_bytes()).unwrap() {
        if e.name == b"." || e.name == b".." || e.name == b"lost+found" {
            continue;
        }
        let p = format!("{}/{}", dir.trim_end_matches('/'), String::from_utf8_lossy(&e.name));
        let st = fs.lstat(p.as_bytes()).unwrap();
        let data = match st.ftype {
            FileType::Regular => {
                let f = fs.open(p.as_bytes(), Default::default()).unwrap();
                let mut b = vec![0u8; st.size as usize];
                assert_eq!(f.pread(fs, 0, &mut b).unwrap(), b.len());
                b
            }
            FileType::Symlink => fs.read_link(p.as_bytes()).unwrap(),
            _ => Vec::new(),
        };
        let size = if st.ftype == FileType::Directory { 0 } else { st.size };
        out.insert(p.clone(), (letter(st.ftype), st.nlink as u64, size, data));
        if st.ftype == FileType::Directory {
            walk_ours(fs, &p, out);
        }
    }
}

fn walk_kernel(root: &Path, dir: &Path, out: &mut Tree) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if dir == root && e.file_name() == "lost+found" {
            continue;
        }
        let p = e.path();
        let md = std::fs::symlink_metadata(&p).unwrap();
        let rel = format!("/{}", p.strip_prefix(root).unwrap().display());
        let ft = md.file_type();
        let (c, data) = if ft.is_dir() {
            ('d', Vec::new())
        } else if ft.is_symlink() {
            (
                'l',
                std::fs::read_link(&p).unwrap().into_os_string().into_encoded_bytes(),
            )
        } else if ft.is_file() {
            ('f', std::fs::read(&p).unwrap())
        } else {
            ('s', Vec::new())
        };
        let size = if c == 'd' { 0 } else { md.len() };
        out.insert(rel, (c, md.nlink(), size, data));
        if c == 'd' {
            walk_kernel(root, &p, out);
        }
    }
}

/// Check our view, e2fsck, and the kernel's view against `model`.
fn check_all(img: &Path, model: &Tree) {
    let fs = Fs::open_image(img, &OpenOptions::default()).unwrap();
    let mut ours = Tree::new();
    walk_ours(&fs, "/", &mut ours);
    drop(fs);
    assert_eq!(&ours, model, "our reading of {} differs from the model", img.display());
    fsck_clean(img);
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("the kernel cross-check needs a loop mount ({e}); CI runs as root");
    }
    let mnt = img.with_extension("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = ext4kit_testkit::LoopMount::mount(img, &mnt, "auto", true).unwrap();
    let mut k = Tree::new();
    walk_kernel(m.path(), m.path(), &mut k);
    m.unmount().unwrap();
    assert_eq!(
        &k,
        model,
        "the kernel's reading of {} differs from the model",
        img.display()
    );
}

fn file(model: &mut Tree, p: &str, data: &[u8], nlink: u64) {
    model.insert(p.into(), ('f', nlink, data.len() as u64, data.to_vec()));
}

fn dir(model: &mut Tree, p: &str, nlink: u64) {
    model.insert(p.into(), ('d', nlink, 0, Vec::new()));
}

fn errno<T: std::fmt::Debug>(r: ext4kit::Result<T>) -> Errno {
    r.unwrap_err().errno()
}

/// The scripted sequence: every rename case, links, removals.
fn exercise(img: &Path) {
    let root = Cred::root();
    let fs = rw(img);
    let mut m = Tree::new();
    fs.mkdir(b"/a", 0o755, &root).unwrap();
    fs.mkdir(b"/a/b", 0o750, &root).unwrap();
    fs.mkdir(b"/a/b/c", 0o700, &root).unwrap();
    fs.mkdir(b"/empty", 0o755, &root).unwrap();
    fs.mkdir(b"/empty2", 0o755, &root).unwrap();
    fs.write_file(b"/a/f1", b"one", 0o644, 0, 0).unwrap();
    fs.write_file(b"/a/b/f2", b"two two", 0o644, 0, 0).unwrap();
    fs.write_file(b"/top", b"top file", 0o644, 0, 0).unwrap();
    fs.write_file(b"/gone", b"to be removed", 0o644, 0, 0).unwrap();
    fs.symlink(b"a/f1", b"/sl", 0, 0).unwrap();
    // New directories are visible at once with the right link counts.
    assert_eq!(fs.stat(b"/a").unwrap().nlink, 3);
    assert_eq!(fs.stat(b"/a/b/c").unwrap().nlink, 2);
    assert_eq!(fs.stat(b"/").unwrap().nlink, 3 + 3); // ., .., lost+found, a, empty, empty2

    // Hard links.
    fs.link(b"/a/f1", b"/f1-link", &root).unwrap();
    fs.link(b"/a/f1", b"/a/b/f1-link2", &root).unwrap();
    assert_eq!(fs.stat(b"/a/f1").unwrap().nlink, 3);
    assert_eq!(errno(fs.link(b"/a", b"/a-link", &root)), Errno::EPERM);
    assert_eq!(errno(fs.link(b"/a/f1", b"/top", &root)), Errno::EEXIST);
    fs.unlink(b"/a/b/f1-link2", &root).unwrap();

    // Removals and their errors.
    fs.unlink(b"/gone", &root).unwrap();
    assert_eq!(errno(fs.stat(b"/gone")), Errno::ENOENT);
    assert_eq!(errno(fs.unlink(b"/gone", &root)), Errno::ENOENT);
    assert_eq!(errno(fs.unlink(b"/a", &root)), Errno::EISDIR);
    assert_eq!(errno(fs.rmdir(b"/top", &root)), Errno::ENOTDIR);
    assert_eq!(errno(fs.rmdir(b"/a", &root)), Errno::ENOTEMPTY);
    assert_eq!(errno(fs.rmdir(b"/a/.", &root)), Errno::EINVAL);
    fs.rmdir(b"/empty2", &root).unwrap();
    assert_eq!(errno(fs.mkdir(b"/a", 0o755, &root)), Errno::EEXIST);
    assert_eq!(
        errno(fs.mkdir(format!("/{}", "n".repeat(256)).as_bytes(), 0o755, &root)),
        Errno::ENAMETOOLONG
    );

    // Renames: file to a new name in the same directory, across directories.
    fs.rename(b"/top", b"/top-renamed", RenameFlags::default(), &root)
        .unwrap();
    fs.rename(b"/top-renamed", b"/a/b/top", RenameFlags::default(), &root)
        .unwrap();
    // File over file: the old target dies.
    fs.write_file(b"/victim", b"victim data", 0o644, 0, 0).unwrap();
    fs.write_file(b"/a/newer", b"newer data", 0o644, 0, 0).unwrap();
    fs.rename(b"/a/newer", b"/victim", RenameFlags::default(), &root)
        .unwrap();
    // NOREPLACE refuses an existing target.
    assert_eq!(
        errno(fs.rename(
            b"/victim",
            b"/f1-link",
            RenameFlags {
                noreplace: true,
                exchange: false
            },
            &root
        )),
        Errno::EEXIST
    );
    // Directory over an empty directory, across parents: link counts move.
    fs.mkdir(b"/a/b/c/moveme", 0o755, &root).unwrap();
    fs.write_file(b"/a/b/c/moveme/inside", b"inside", 0o600, 0, 0).unwrap();
    fs.rename(b"/a/b/c/moveme", b"/empty", RenameFlags::default(), &root)
        .unwrap();
    assert_eq!(fs.stat(b"/empty/inside").unwrap().size, 6);
    // Directory over a non-empty directory, dir over file, file over dir.
    assert_eq!(
        errno(fs.rename(b"/a/b/c", b"/a", RenameFlags::default(), &root)),
        Errno::ENOTEMPTY
    );
    assert_eq!(
        errno(fs.rename(b"/empty", b"/a", RenameFlags::default(), &root)),
        Errno::ENOTEMPTY
    );
    assert_eq!(
        errno(fs.rename(b"/empty", b"/victim", RenameFlags::default(), &root)),
        Errno::ENOTDIR
    );
    assert_eq!(
        errno(fs.rename(b"/victim", b"/empty", RenameFlags::default(), &root)),
        Errno::EISDIR
    );
    // Into its own subtree.
    assert_eq!(
        errno(fs.rename(b"/a", b"/a/b/c/x", RenameFlags::default(), &root)),
        Errno::EINVAL
    );
    assert_eq!(
        errno(fs.rename(b"/a/.", b"/zz", RenameFlags::default(), &root)),
        Errno::EBUSY
    );
    // Exchange a file and a directory across parents.
    let ex = RenameFlags {
        noreplace: false,
        exchange: true,
    };
    fs.rename(b"/victim", b"/a/b/c", ex, &root).unwrap();
    assert_eq!(fs.stat(b"/victim").unwrap().ftype, FileType::Directory);
    assert_eq!(fs.stat(b"/a/b/c").unwrap().ftype, FileType::Regular);
    assert_eq!(errno(fs.rename(b"/nothing", b"/a", ex, &root)), Errno::ENOENT);
    // Rename onto another name of the same inode: nothing happens.
    fs.rename(b"/f1-link", b"/a/f1", RenameFlags::default(), &root).unwrap();
    // A directory moved up: ".." must follow.
    fs.rename(b"/a/b", b"/b-up", RenameFlags::default(), &root).unwrap();
    assert_eq!(fs.stat(b"/b-up/..").unwrap().ino, 2);
    fs.sync().unwrap();
    drop(fs);

    dir(&mut m, "/a", 2);
    file(&mut m, "/a/f1", b"one", 2);
    file(&mut m, "/f1-link", b"one", 2);
    dir(&mut m, "/b-up", 2);
    file(&mut m, "/b-up/f2", b"two two", 1);
    file(&mut m, "/b-up/top", b"top file", 1);
    file(&mut m, "/b-up/c", b"newer data", 1);
    dir(&mut m, "/victim", 2);
    dir(&mut m, "/empty", 2);
    file(&mut m, "/empty/inside", b"inside", 1);
    m.insert("/sl".into(), ('l', 1, 4, b"a/f1".to_vec()));
    check_all(img, &m);
}

#[test]
fn namespace_ext4() {
    exercise(&image("ext4", &["-t", "ext4"], "32M"));
}

#[test]
fn namespace_ext4_1k_blocks() {
    exercise(&image("ext4-1k", &["-t", "ext4", "-b", "1024"], "16M"));
}

#[test]
fn namespace_ext2_and_ext3_stay_themselves() {
    for (tag, t) in [("ext2", "ext2"), ("ext3", "ext3")] {
        let img = image(tag, &["-t", t], "16M");
        exercise(&img);
        let out = Command::new("dumpe2fs").arg("-h").arg(&img).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("extent"), "{tag} gained the extent feature:\n{text}");
    }
}

#[test]
fn permissions_and_sticky_bit() {
    let img = image("perm", &["-t", "ext4"], "16M");
    let root = Cred::root();
    let fs = rw(&img);
    let alice = Cred::user(1000, 1000);
    let bob = Cred::user(1001, 1001);
    fs.mkdir(b"/tmp", 0o1777, &root).unwrap();
    fs.mkdir(b"/private", 0o755, &root).unwrap();
    assert_eq!(errno(fs.mkdir(b"/private/x", 0o755, &alice)), Errno::EACCES);
    let st = fs.mkdir(b"/tmp/alice", 0o755, &alice).unwrap();
    assert_eq!((st.uid, st.gid), (1000, 1000));
    fs.mkdir(b"/tmp/alice/sub", 0o755, &alice).unwrap();
    // Sticky /tmp: bob may not remove or rename alice's directory.
    assert_eq!(errno(fs.rmdir(b"/tmp/alice/sub", &bob)), Errno::EACCES);
    fs.mkdir(b"/tmp/bob", 0o755, &bob).unwrap();
    assert_eq!(
        errno(fs.rename(b"/tmp/alice", b"/tmp/bob/x", RenameFlags::default(), &bob)),
        Errno::EPERM
    );
    fs.rmdir(b"/tmp/alice/sub", &alice).unwrap();
    fs.rmdir(b"/tmp/alice", &alice).unwrap();
    // Set-group-id directories pass their group (and the bit) down.
    fs.mkdir(b"/shared", 0o2777, &root).unwrap();
    let st = fs.mkdir(b"/shared/d", 0o755, &bob).unwrap();
    assert_eq!((st.uid, st.gid, st.mode & 0o2000), (1001, 0, 0o2000));
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
}

#[test]
fn many_renames_across_directories_stay_consistent() {
    // Several threads renaming files between two directories while others
    // create and remove: e2fsck must stay clean and every file must end
    // in exactly one place.
    let img = image("rename-storm", &["-t", "ext4", "-b", "1024"], "32M");
    let root = Cred::root();
    let fs = rw(&img);
    fs.mkdir(b"/x", 0o755, &root).unwrap();
    fs.mkdir(b"/y", 0o755, &root).unwrap();
    for i in 0..200 {
        fs.write_file(
            format!("/x/f{i}").as_bytes(),
            format!("file {i}").as_bytes(),
            0o644,
            0,
            0,
        )
        .unwrap();
    }
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let fs = &fs;
            let root = &root;
            s.spawn(move || {
                for round in 0..3 {
                    for i in (t as usize..200).step_by(4) {
                        let (a, b) = if round % 2 == 0 { ("x", "y") } else { ("y", "x") };
                        fs.rename(
                            format!("/{a}/f{i}").as_bytes(),
                            format!("/{b}/f{i}").as_bytes(),
                            RenameFlags::default(),
                            root,
                        )
                        .unwrap();
                    }
                }
                for i in 0..50 {
                    let p = format!("/x/tmp-{t}-{i}");
                    fs.mkdir(p.as_bytes(), 0o755, root).unwrap();
                    fs.rmdir(p.as_bytes(), root).unwrap();
                }
            });
        }
    });
    fs.sync().unwrap();
    drop(fs);
    let mut m = Tree::new();
    dir(&mut m, "/x", 2);
    dir(&mut m, "/y", 2);
    for i in 0..200 {
        file(&mut m, &format!("/y/f{i}"), format!("file {i}").as_bytes(), 1);
    }
    check_all(&img, &m);
}

fn rw_flags() -> ext4kit::OpenFlags {
    ext4kit::OpenFlags {
        access: ext4kit::vfs::file::Access::ReadWrite,
        create: true,
        ..Default::default()
    }
}

#[test]
fn unlinked_open_file_lives_until_last_close() {
    let img = image("orphan", &["-t", "ext4"], "16M");
    let root = Cred::root();
    let fs = rw(&img);
    let free0 = fs.statfs().unwrap();
    let mut p = ext4kit::Process::new(fs.clone());
    let fd = p.open_as(b"/doomed", rw_flags(), 0o644, &root).unwrap();
    let data = vec![0xabu8; 200_000];
    assert_eq!(p.write(fd, &data).unwrap(), data.len());
    p.fsync(fd).unwrap();
    let fd2 = p.dup(fd).unwrap();
    fs.unlink(b"/doomed", &root).unwrap();
    assert_eq!(fs.stat(b"/doomed").unwrap_err().errno(), Errno::ENOENT);
    // Still readable and writable through the open descriptors.
    let mut back = vec![0u8; data.len()];
    assert_eq!(p.pread(fd, &mut back, 0).unwrap(), data.len());
    assert!(back == data);
    p.pwrite(fd2, b"more", 200_000).unwrap();
    // Its blocks are still in use while it is open.
    assert!(fs.statfs().unwrap().blocks_free < free0.blocks_free);
    p.close(fd).unwrap();
    assert!(
        fs.statfs().unwrap().blocks_free < free0.blocks_free,
        "freed before the last close"
    );
    p.close(fd2).unwrap();
    fs.sync().unwrap();
    let free1 = fs.statfs().unwrap();
    assert_eq!(
        (free1.blocks_free, free1.files_free),
        (free0.blocks_free, free0.files_free),
        "the last close frees blocks and inode"
    );
    drop(p);
    drop(fs);
    fsck_clean(&img);
}

#[test]
fn orphans_left_open_are_freed_at_the_next_open_and_by_the_kernel() {
    for who in ["ext4kit", "kernel"] {
        let img = image(&format!("orphan-recovery-{who}"), &["-t", "ext4"], "16M");
        let root = Cred::root();
        let fs = rw(&img);
        let free0 = fs.statfs().unwrap();
        let mut p = ext4kit::Process::new(fs.clone());
        let fd = p.open_as(b"/kept-open", rw_flags(), 0o644, &root).unwrap();
        p.write(fd, &vec![7u8; 100_000]).unwrap();
        fs.unlink(b"/kept-open", &root).unwrap();
        fs.sync().unwrap();
        // The process "dies" with the file open: no close.
        std::mem::forget(p);
        drop(fs);
        if who == "ext4kit" {
            let fs = rw(&img);
            let free1 = fs.statfs().unwrap();
            assert_eq!(
                (free1.blocks_free, free1.files_free),
                (free0.blocks_free, free0.files_free)
            );
            drop(fs);
        } else {
            ext4kit_testkit::kernel_available().expect("the kernel check needs a loop mount; CI runs as root");
            let mnt = img.with_extension("mnt");
            std::fs::create_dir_all(&mnt).unwrap();
            let m = ext4kit_testkit::LoopMount::mount(&img, &mnt, "ext4", false).unwrap();
            m.unmount().unwrap();
        }
        fsck_clean(&img);
    }
}

/// Several unlinked-but-open files make a chain; closing one in the middle
/// rewrites its predecessor's link on disk while that predecessor is still
/// open and gets written back again (its cached record holds the old
/// link). The chain must stay intact: later closes find their orphans, and
/// a "crash" with orphans still open leaves a chain recovery can follow.
/// (The FUSE stress run found "an orphan is not on the superblock's orphan
/// chain" and leaked blocks when writeback wrote the stale link.)
#[test]
fn orphan_chain_survives_writeback_of_an_open_orphan() {
    for crash in [false, true] {
        let img = image(&format!("orphan-chain-{crash}"), &["-t", "ext4"], "16M");
        let root = Cred::root();
        let fs = rw(&img);
        let free0 = fs.statfs().unwrap();
        let mut p = ext4kit::Process::new(fs.clone());
        let fds: Vec<_> = (0..4)
            .map(|i| {
                let fd = p
                    .open_as(format!("/o{i}").as_bytes(), rw_flags(), 0o644, &root)
                    .unwrap();
                p.write(fd, &vec![i as u8; 10_000]).unwrap();
                fs.unlink(format!("/o{i}").as_bytes(), &root).unwrap();
                fd
            })
            .collect();
        // Chain: o3 -> o2 -> o1 -> o0. Close o1 and o2 (the middle).
        p.close(fds[1]).unwrap();
        p.close(fds[2]).unwrap();
        // o3, whose cached link still names o2, is written back.
        p.pwrite(fds[3], b"later", 50_000).unwrap();
        p.fsync(fds[3]).unwrap();
        p.pwrite(fds[0], b"later", 70_000).unwrap();
        p.fsync(fds[0]).unwrap();
        if crash {
            fs.sync().unwrap();
            std::mem::forget(p);
            drop(fs);
            // (e2fsck -n cannot judge this image: it would have to process
            // the orphan list, as a mount or e2fsck -p does, to call it
            // clean. Our next open is the recovery; e2fsck runs after it.)
            let fs = rw(&img);
            let free1 = fs.statfs().unwrap();
            assert_eq!(
                (free1.blocks_free, free1.files_free),
                (free0.blocks_free, free0.files_free),
                "recovery freed every orphan on the chain"
            );
            drop(fs);
        } else {
            p.close(fds[0]).unwrap();
            p.close(fds[3]).unwrap();
            fs.sync().unwrap();
            let free1 = fs.statfs().unwrap();
            assert_eq!(
                (free1.blocks_free, free1.files_free),
                (free0.blocks_free, free0.files_free)
            );
            drop(p);
            drop(fs);
        }
        fsck_clean(&img);
    }
}

/// A held inode (FUSE's lookup count) outlives its last name like an open
/// file: its number is not reused until the hold is dropped, and dropping
/// it frees the inode.
#[test]
fn a_held_inode_is_not_freed_until_its_hold_is_dropped() {
    let img = image("hold", &["-t", "ext4"], "16M");
    let root = Cred::root();
    let fs = rw(&img);
    let free0 = fs.statfs().unwrap();
    let st = fs.write_file(b"/held", &[1u8; 20_000], 0o644, 0, 0).unwrap();
    let inode = fs.inode(st.ino).unwrap();
    fs.hold_inode(&inode).unwrap();
    fs.hold_inode(&inode).unwrap();
    fs.unlink(b"/held", &root).unwrap();
    // Its number is not handed out again while held.
    for i in 0..50 {
        let s = fs.write_file(format!("/n{i}").as_bytes(), b"x", 0o644, 0, 0).unwrap();
        assert_ne!(s.ino, st.ino, "a held inode number was reused");
    }
    fs.drop_hold(&inode).unwrap();
    assert_eq!(fs.stat_ino(st.ino).unwrap().nlink, 0, "still there with one hold left");
    fs.drop_hold(&inode).unwrap();
    assert_eq!(
        fs.hold_inode(&inode).unwrap_err().errno(),
        Errno::ENOENT,
        "a freed inode cannot be held again"
    );
    drop(inode);
    for i in 0..50 {
        fs.unlink(format!("/n{i}").as_bytes(), &root).unwrap();
    }
    fs.sync().unwrap();
    let free1 = fs.statfs().unwrap();
    assert_eq!(
        (free1.blocks_free, free1.files_free),
        (free0.blocks_free, free0.files_free),
        "the last hold freed the inode and its blocks"
    );
    drop(fs);
    fsck_clean(&img);
}

/// Path walks that miss the dentry cache race a writer changing the same
/// names: the dentry a walk inserts must never be older than the
/// directory. The writer checks after every step that a walk sees what it
/// just did — a name it created exists, a name it removed is gone even
/// when its inode number went to another file. (A walk that inserted its
/// lookup's result after dropping the directory's lock could cache a name
/// an unlink had removed, pointing at an inode the next create reused: on
/// 2 cores this test caught that in 2 of 20 runs of 3,000 rounds.)
#[test]
fn walks_racing_creates_and_unlinks_never_cache_a_stale_name() {
    let img = image("walk-race", &["-t", "ext4"], "32M");
    let root = Cred::root();
    let fs = rw(&img);
    fs.mkdir(b"/d", 0o755, &root).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for n in [&b"/d/x"[..], b"/d/y"] {
                        let _ = fs.stat(n);
                    }
                }
            });
        }
        let writer = s.spawn(|| {
            let r = (|| -> Result<(), String> {
                for i in 0..3000 {
                    let x = fs
                        .create(b"/d/x", 0o644, 0, 0)
                        .map_err(|e| format!("round {i}: create x: {e}"))?;
                    match fs.stat(b"/d/x") {
                        Ok(st) if st.ino == x.ino => {}
                        other => {
                            return Err(format!(
                                "round {i}: x was just made as inode {}, a walk says {other:?}",
                                x.ino
                            ))
                        }
                    }
                    fs.unlink(b"/d/x", &root)
                        .map_err(|e| format!("round {i}: unlink x: {e}"))?;
                    let y = fs
                        .create(b"/d/y", 0o644, 0, 0)
                        .map_err(|e| format!("round {i}: create y: {e}"))?;
                    if let Ok(st) = fs.stat(b"/d/x") {
                        return Err(format!(
                            "round {i}: x was unlinked, yet a walk finds inode {} (y is inode {})",
                            st.ino, y.ino
                        ));
                    }
                    fs.unlink(b"/d/y", &root)
                        .map_err(|e| format!("round {i}: unlink y: {e}"))?;
                }
                Ok(())
            })();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            r
        });
        writer.join().unwrap().unwrap();
    });
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
}
