//! Opens by path racing renames over the same names, unlinks and
//! recreations, with caches small enough that dentries and inodes are
//! evicted throughout: every open reads a whole file (never a freed
//! inode's emptiness), an unlinked inode is freed at its last close and
//! never while open, and e2fsck agrees at the end. (Written for the lock-free
//! open path; it found that an open racing a rename over its name could
//! open the inode the rename had just freed.) Opens go through the
//! threads' pins (`vfs::pin`), so this is also the pins' stress test.

use std::path::{Path, PathBuf};

use ext4kit_testkit::mountpeer::mkfs_ext4;
use ext4kit_testkit::{env_u64, Scratch};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ext4kit::vfs::pin::open_files;
use ext4kit::{Cred, Errno, Fs, OpenFlags, OpenOptions, Process, RenameFlags};

/// A fresh 8,192-inode ext4 image of `size_mib` MiB in a scratch directory
/// (removed when the test passes).
fn image(tag: &str, size_mib: u64) -> (Scratch, PathBuf) {
    let dir = Scratch::dir(&format!("ext4kit-openrace-{tag}"));
    let path = dir.join("fs.img");
    mkfs_ext4(&path, size_mib, &["-N", "8192"]).unwrap_or_else(|e| panic!("{e} (apt-get install e2fsprogs)"));
    (dir, path)
}

fn rw(img: &Path, budget: usize) -> Arc<Fs> {
    Fs::open_image(
        img,
        &OpenOptions {
            read_only: false,
            cache_budget: budget,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The stress: openers read hot names by path while a renamer moves files
/// over them (freeing the inode it replaces, or orphaning it while open),
/// an unlinker removes and recreates them, and a walker stats thousands
/// of other files so the dentry and inode caches evict all the time. Every
/// read returns a whole, well-formed file (never bytes of a freed inode
/// reused by another); at the end every inode that has no name is free
/// (nothing leaked, nothing freed twice: `e2fsck -fn` agrees).
#[test]
fn opens_race_renames_unlinks_and_eviction() {
    let (_dir, img) = image("stress", 64);
    let root = Cred::root();
    // The caches' floors: 4,096 dentries, 1,024 inodes; the walker's
    // 3,000 files overflow the inode cache.
    let fs = rw(&img, 1 << 20);
    let free0 = fs.statfs().unwrap().files_free;
    fs.mkdir(b"/cold", 0o755, &root).unwrap();
    for i in 0..3000 {
        fs.write_file(format!("/cold/c{i}").as_bytes(), b"", 0o644, 0, 0)
            .unwrap();
    }
    fs.mkdir(b"/hot", 0o755, &root).unwrap();
    const HOT: u64 = 6;
    // A file's contents: "gen:<16 digits>" — a reader checks the shape.
    let gen = AtomicU64::new(0);
    let body = |g: u64| format!("gen:{g:016}").into_bytes();
    let put = |path: &[u8]| {
        let g = gen.fetch_add(1, Ordering::Relaxed);
        // Made under a temporary name and renamed in, so a reader never
        // sees it half written.
        let tmp = format!("/hot/tmp{g}");
        fs.write_file(tmp.as_bytes(), &body(g), 0o644, 0, 0).unwrap();
        fs.rename(tmp.as_bytes(), path, RenameFlags::default(), &root).unwrap();
    };
    for i in 0..HOT {
        put(format!("/hot/h{i}").as_bytes());
    }
    let stop = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..env_u64("EXT4KIT_STRESS_OPENERS", 3) {
            let (fs, stop, reads) = (fs.clone(), &stop, &reads);
            s.spawn(move || {
                let mut p = Process::new(fs.clone());
                let mut buf = [0u8; 64];
                let mut rng = ext4kit_testkit::TestRng::new(t);
                let mut held = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let k = rng.next_u64();
                    let path = format!("/hot/h{}", (k >> 33) % HOT);
                    match p.open(path.as_bytes(), OpenFlags::default()) {
                        Ok(fd) => {
                            let n = p.read(fd, &mut buf).unwrap();
                            assert_eq!(n, 20, "{path}: {:?}", String::from_utf8_lossy(&buf[..n]));
                            assert!(
                                buf.starts_with(b"gen:") && buf[4..20].iter().all(u8::is_ascii_digit),
                                "{path}: {:?}",
                                String::from_utf8_lossy(&buf[..n])
                            );
                            // Now and then keep a file open across the
                            // others' renames and unlinks.
                            if (k >> 20).is_multiple_of(16) {
                                held.push(fd);
                            } else {
                                p.close(fd).unwrap();
                            }
                            if held.len() > 4 {
                                let fd = held.remove(0);
                                let n = p.pread(fd, &mut buf, 0).unwrap();
                                assert!(n == 20 && buf.starts_with(b"gen:"));
                                p.close(fd).unwrap();
                            }
                            reads.fetch_add(1, Ordering::Relaxed);
                        }
                        // Between an unlink and its recreation.
                        Err(e) => assert_eq!(e.errno(), Errno::ENOENT, "{path}: {e}"),
                    }
                }
                for fd in held {
                    p.close(fd).unwrap();
                }
            });
        }
        // The renamer: a fresh file over a hot name (the old inode is freed,
        // or orphaned while someone has it open).
        s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                put(format!("/hot/h{}", i % HOT).as_bytes());
                i += 1;
            }
        });
        // The unlinker: a hot name disappears for a moment.
        s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let path = format!("/hot/h{}", (i * 7 + 3) % HOT);
                match fs.unlink(path.as_bytes(), &root) {
                    Ok(()) => put(path.as_bytes()),
                    // The renamer's temporary is between names, never a hot one.
                    Err(e) => panic!("unlink {path}: {e}"),
                }
                i += 1;
            }
        });
        // The walker: churns both caches, and builds the path of hot
        // dentries the renamer is moving (d_path under renames: always a
        // whole path, whichever side of a rename it saw).
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                fs.stat(format!("/cold/c{}", i % 3000).as_bytes()).unwrap();
                if let Ok(d) = fs.resolve(format!("/hot/h{}", i % HOT as usize).as_bytes(), true) {
                    let p = fs.d_path(&d);
                    let name = p.strip_prefix(b"/hot/").unwrap_or_else(|| panic!("{p:?}"));
                    assert!(
                        name.starts_with(b"h") || name.starts_with(b"tmp"),
                        "{:?}",
                        String::from_utf8_lossy(&p)
                    );
                }
                i += 1;
            }
        });
        std::thread::sleep(std::time::Duration::from_millis(env_u64("EXT4KIT_STRESS_MS", 2500)));
        stop.store(true, Ordering::Relaxed);
    });
    assert!(reads.load(Ordering::Relaxed) > 100, "the openers ran");
    // Every thread that pinned has exited; this one's pins go too
    // (`vfs::pin`: an idle pin never keeps an unlinked inode, but the
    // count below is exact only once none is left).
    ext4kit::vfs::pin::drop_cached();
    fs.sync().unwrap();
    // Two directories, 3,000 cold files, the hot ones: nothing else holds
    // an inode.
    assert_eq!(fs.statfs().unwrap().files_free, free0 - 2 - 3000 - HOT);
    drop(fs);
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
}

// The lock-free open path end to end: an open after the first on a thread
// takes no reference on the shared inode or dentry (it reuses the
// thread's pin, `vfs::pin`), and the exactness that needs — an unlinked
// inode freed at its last close, never while open, never kept by an idle
// pin — holds under threads that open, read and close while others
// rename over, unlink and recreate the same names, with caches small
// enough that dentries and inodes are evicted throughout.

fn read_path(p: &mut Process, path: &[u8], buf: &mut [u8]) -> ext4kit::Result<usize> {
    let fd = p.open(path, OpenFlags::default())?;
    let n = p.read(fd, buf);
    p.close(fd)?;
    n
}

/// After the first open on a thread, open/read/close leaves the shared
/// counts alone: the inode's `Arc` count, its unit count, the dentry's
/// `Arc` count — and an open file adds nothing to them either (it holds
/// the thread's pin, not the inode). With `count-shared`, the counted
/// shared writes of such an open are zero.
#[test]
fn a_thread_reopening_a_file_writes_no_shared_count() {
    let (_dir, img) = image("counts", 16);
    let fs = rw(&img, 64 << 20);
    fs.write_file(b"/f", b"hello", 0o644, 0, 0).unwrap();
    let mut p = Process::new(fs.clone());
    let mut buf = [0u8; 16];
    assert_eq!(read_path(&mut p, b"/f", &mut buf).unwrap(), 5);
    let inode = fs.inode(fs.stat(b"/f").unwrap().ino).unwrap();
    let dentry = fs.resolve(b"/f", true).unwrap();
    let counts = || {
        (
            Arc::strong_count(&inode),
            inode.opens.load(Ordering::Relaxed),
            Arc::strong_count(&dentry),
        )
    };
    let before = counts();
    let shared = ext4kit::vfs::shared::count();
    for _ in 0..1000 {
        assert_eq!(read_path(&mut p, b"/f", &mut buf).unwrap(), 5);
    }
    let fd = p.open(b"/f", OpenFlags::default()).unwrap();
    assert_eq!(
        counts(),
        before,
        "an open file holds no count of its own on the inode or dentry"
    );
    assert_eq!(open_files(&inode), 1);
    p.close(fd).unwrap();
    if let (Some(a), Some(b)) = (shared, ext4kit::vfs::shared::count()) {
        assert_eq!(b - a, 0, "counted shared writes over 1,001 reopens");
    }
    assert_eq!(counts(), before);
    assert_eq!(open_files(&inode), 0);
    assert_eq!(&buf[..5], b"hello");
    // This thread's pin outlives the filesystem handle (until the thread
    // opens other files or exits); the pages it would keep do not.
    assert_eq!(inode.pages.len(), 1);
    drop(p);
    drop(dentry);
    drop(fs);
    assert!(Arc::strong_count(&inode) > 1, "the pin still holds the inode");
    assert_eq!(inode.pages.len(), 0, "pages freed when the Fs was dropped");
}

/// A thread that opened and closed a file keeps an idle pin on it; an
/// unlink elsewhere must still free the inode at once (the pin gives its
/// unit back), and an open file moved to another thread and closed there
/// frees its unlinked inode at that close.
#[test]
fn idle_pins_never_keep_an_unlinked_inode() {
    let (_dir, img) = image("idle", 16);
    let fs = rw(&img, 64 << 20);
    let root = Cred::root();
    let free0 = fs.statfs().unwrap().files_free;
    fs.write_file(b"/a", b"aaaa", 0o644, 0, 0).unwrap();
    fs.write_file(b"/b", b"bbbb", 0o644, 0, 0).unwrap();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (sent, got) = std::sync::mpsc::channel::<Arc<ext4kit::File>>();
    let t = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let mut p = Process::new(fs.clone());
            let mut buf = [0u8; 8];
            // An idle pin on /a, and an open file on /b handed away.
            assert_eq!(read_path(&mut p, b"/a", &mut buf).unwrap(), 4);
            sent.send(fs.open(b"/b", OpenFlags::default()).unwrap()).unwrap();
            // Stay alive (with the pins cached) until told.
            wait.recv().unwrap();
        })
    };
    let fb = got.recv().unwrap();
    fs.unlink(b"/a", &root).unwrap();
    assert_eq!(
        fs.statfs().unwrap().files_free,
        free0 - 1,
        "/a freed at its unlink although another thread's idle pin was on it"
    );
    fs.unlink(b"/b", &root).unwrap();
    assert_eq!(fs.statfs().unwrap().files_free, free0 - 1, "/b is open: kept");
    let mut buf = [0u8; 8];
    assert_eq!(fb.pread(&fs, 0, &mut buf).unwrap(), 4);
    fs.close_file(fb).unwrap();
    assert_eq!(fs.statfs().unwrap().files_free, free0, "/b freed at its last close");
    go.send(()).unwrap();
    t.join().unwrap();
    drop(fs);
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
}
