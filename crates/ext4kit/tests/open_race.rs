//! Opens by path racing renames over the same names, unlinks and
//! recreations, with caches small enough that dentries and inodes are
//! evicted throughout: every open reads a whole file (never a freed
//! inode's emptiness), an unlinked inode is freed at its last close and
//! never while open, and e2fsck agrees at the end. (Written for seed 001's
//! open path; it found that an open racing a rename over its name could
//! open the inode the rename had just freed.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ext4kit::{Cred, Errno, Fs, OpenFlags, OpenOptions, Process, RenameFlags};

struct Img {
    dir: PathBuf,
    path: PathBuf,
}

impl Drop for Img {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn image(tag: &str, size: &str) -> Img {
    let dir = std::env::temp_dir().join(format!("ext4kit-openrace-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fs.img");
    ext4kit_testkit::run_ok(
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-N", "8192"])
            .arg(&path)
            .arg(size),
        &[0],
    )
    .unwrap_or_else(|e| panic!("{e} (apt-get install e2fsprogs)"));
    Img { dir, path }
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

/// A knob of the stress below from the environment: `EXT4KIT_STRESS_MS`
/// (how long it runs, default 2,500 ms) and `EXT4KIT_STRESS_OPENERS`
/// (opener threads, default 3) — longer and busier runs for hunting races.
fn stress_knob(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
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
    let img = image("stress", "64M");
    let root = Cred::root();
    // The caches' floors: 4,096 dentries, 1,024 inodes; the walker's
    // 3,000 files overflow the inode cache.
    let fs = rw(&img.path, 1 << 20);
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
        for t in 0..stress_knob("EXT4KIT_STRESS_OPENERS", 3) {
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
        std::thread::sleep(std::time::Duration::from_millis(stress_knob("EXT4KIT_STRESS_MS", 2500)));
        stop.store(true, Ordering::Relaxed);
    });
    assert!(reads.load(Ordering::Relaxed) > 100, "the openers ran");
    fs.sync().unwrap();
    // Two directories, 3,000 cold files, the hot ones: nothing else holds
    // an inode.
    assert_eq!(fs.statfs().unwrap().files_free, free0 - 2 - 3000 - HOT);
    drop(fs);
    ext4kit_testkit::e2fsck_clean(&img.path).unwrap_or_else(|e| panic!("{e}"));
}
