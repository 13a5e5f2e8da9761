//! The mount's transports: FUSE over io_uring when the kernel offers it
//! (the fuse module's `enable_uring` = Y), `/dev/fuse` otherwise, and the
//! fallbacks between them.
//!
//! The tests here set `/sys/module/fuse/parameters/enable_uring` as they
//! need it and put back the value they found when they end (it only
//! matters to servers that ask for io_uring at their FUSE_INIT). On a
//! kernel without FUSE over io_uring (no such parameter: before 6.14, or
//! built without CONFIG_FUSE_IO_URING) the io_uring tests say loudly that
//! they were skipped; the `/dev/fuse` ones still run.
//!
//! The other mount suites run on either transport: `EXT4KIT_TRANSPORT=uring`
//! (or `dev`) sets the default of `-o transport=` (see
//! `scripts/test-transports`).
//!
//! Needs /dev/fuse and root; fails loudly otherwise.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ext4kit_fuse::{MountOptions, Transport, TransportChoice};

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// The tests of this file change a machine-wide parameter: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// `enable_uring` set to a value for the life of the guard, then restored.
struct EnableUring {
    old: String,
    _serial: MutexGuard<'static, ()>,
}

impl EnableUring {
    /// `None` (after saying so on stderr) when this kernel has no FUSE over
    /// io_uring.
    fn set(on: bool, test: &str) -> Option<EnableUring> {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(old) = fs::read_to_string(PARAM) else {
            eprintln!(
                "\n*** SKIPPED {test}: this kernel has no FUSE over io_uring ({PARAM} does not exist; it needs \
                 Linux 6.14+ with CONFIG_FUSE_IO_URING) ***\n"
            );
            return None;
        };
        fs::write(PARAM, if on { "Y" } else { "N" }).unwrap_or_else(|e| panic!("writing {PARAM}: {e}"));
        Some(EnableUring {
            old: old.trim().to_string(),
            _serial: serial,
        })
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        if let Err(e) = fs::write(PARAM, &self.old) {
            eprintln!("restoring {PARAM} to {}: {e}", self.old);
        }
    }
}

fn require_fuse() {
    ext4kit_testkit::require_root_and_fuse("mount(2), enable_uring");
}

struct Work {
    dir: PathBuf,
    img: PathBuf,
    mnt: PathBuf,
}

impl Work {
    fn new(tag: &str) -> Work {
        require_fuse();
        let dir = std::env::temp_dir().join(format!("ext4kit-fuse-uring-{tag}-{}", std::process::id()));
        let _ = Command::new("umount").arg("-l").arg(dir.join("mnt")).output();
        let _ = fs::remove_dir_all(&dir);
        let src = dir.join("src");
        for d in 0..4 {
            fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
            for f in 0..30 {
                fs::write(src.join(format!("d{d}/f{f}")), format!("{d}/{f}")).unwrap();
            }
        }
        let img = dir.join("img");
        let o = Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-b", "4096", "-d"])
            .arg(&src)
            .arg(&img)
            .arg("64M")
            .output()
            .unwrap();
        assert!(o.status.success(), "mke2fs: {}", String::from_utf8_lossy(&o.stderr));
        let mnt = dir.join("mnt");
        fs::create_dir_all(&mnt).unwrap();
        Work { dir, img, mnt }
    }

    fn opts(&self, transport: TransportChoice) -> MountOptions {
        MountOptions {
            transport,
            threads: 2,
            cache_budget: 32 << 20,
            ..MountOptions::default()
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).output();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Voluntary context switches of this process's threads whose name starts
/// with `prefix`: a server thread sleeps once per request it waits for.
fn switches(prefix: &str) -> (usize, u64) {
    let mut n = 0;
    let mut total = 0;
    for t in fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.trim().starts_with(prefix) {
            continue;
        }
        n += 1;
        let status = fs::read_to_string(t.path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    (n, total)
}

/// `n` requests that each reach the server (a missing xattr is never
/// cached by the kernel).
fn round_trips(mnt: &Path, n: usize) {
    let f = mnt.join("d0/f0");
    for _ in 0..n {
        let e = rustix::fs::getxattr(&f, "user.missing", &mut [0u8; 16]).unwrap_err();
        assert_eq!(e, rustix::io::Errno::NODATA);
    }
}

#[test]
fn io_uring_serves_the_mount_when_the_kernel_offers_it() {
    let w = Work::new("used");
    let Some(_on) = EnableUring::set(true, "io_uring_serves_the_mount_when_the_kernel_offers_it") else {
        return;
    };
    let m = ext4kit_fuse::mount(&w.img, &w.mnt, &w.opts(TransportChoice::Uring)).unwrap();
    let Transport::IoUring { queues, threads } = m.transport() else {
        panic!("io_uring was asked for and offered, the mount uses {}", m.transport());
    };
    let cpus = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    assert!(
        queues >= 1 && threads >= queues,
        "{queues} queues, {threads} threads ({cpus})"
    );
    assert!(m.describe().contains("io_uring"), "{}", m.describe());
    assert_eq!(m.transport_note(), None);
    let refs = m.kernel_refs();
    let server = std::thread::spawn(move || m.run());

    // The ring threads answer the requests, the /dev/fuse thread does not.
    round_trips(&w.mnt, 10);
    let (rings, before) = switches("fuser-uring");
    let (devs, dev_before) = switches("fuser-0");
    assert_eq!(rings, threads, "one thread per ring");
    assert_eq!(devs, 1, "one /dev/fuse thread for FORGET and INTERRUPT");
    round_trips(&w.mnt, 400);
    let (_, after) = switches("fuser-uring");
    let (_, dev_after) = switches("fuser-0");
    assert!(
        after - before >= 200,
        "400 requests woke the ring threads {} times",
        after - before
    );
    assert!(
        dev_after - dev_before < 40,
        "400 requests woke the /dev/fuse thread {} times",
        dev_after - dev_before
    );

    // Every kind of request, its data through the ring entries.
    let big: Vec<u8> = (0..3 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(w.mnt.join("big"), &big).unwrap();
    fs::create_dir(w.mnt.join("new")).unwrap();
    fs::rename(w.mnt.join("big"), w.mnt.join("new/big")).unwrap();
    rustix::fs::setxattr(
        w.mnt.join("new/big"),
        "user.k",
        b"value",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let mut v = [0u8; 16];
    let n = rustix::fs::getxattr(w.mnt.join("new/big"), "user.k", &mut v).unwrap();
    assert_eq!(&v[..n], b"value");
    // Read back without the kernel's page cache: READs through the ring.
    fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    assert!(
        fs::read(w.mnt.join("new/big")).unwrap() == big,
        "3 MiB read back differ"
    );
    let names: Vec<_> = fs::read_dir(w.mnt.join("d3"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 30);
    fs::remove_file(w.mnt.join("d3/f7")).unwrap();
    assert!(!w.mnt.join("d3/f7").exists());

    // FORGET still comes through /dev/fuse.
    ext4kit_testkit::drop_kernel_caches_until(
        Duration::from_secs(20),
        || refs.is_empty(),
        || format!("the kernel still holds {} inodes after dropping its caches", refs.len()),
    );

    ext4kit_fuse::unmount(&w.mnt, Duration::from_secs(30)).unwrap();
    server.join().unwrap().unwrap();
    assert_eq!(switches("fuser-uring").0, 0, "every ring thread ended with the mount");
    let o = Command::new("e2fsck").args(["-fn"]).arg(&w.img).output().unwrap();
    assert!(o.status.success(), "e2fsck: {}", String::from_utf8_lossy(&o.stdout));
}

/// A request interrupted by a signal: the kernel sends FUSE_INTERRUPT
/// through /dev/fuse (not the ring) while the ring serves the request
/// itself; nothing hangs and the mount keeps working.
#[test]
fn signals_during_requests_leave_the_io_uring_mount_working() {
    let w = Work::new("signals");
    let Some(_on) = EnableUring::set(true, "signals_during_requests_leave_the_io_uring_mount_working") else {
        return;
    };
    // The server in a child process: a client killed while its server is
    // in the same process is the FUSE self-deadlock.
    let mut server = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "serve_when_asked", "--nocapture", "--test-threads=1"])
        .env(SERVE_ENV, format!("{}\n{}", w.img.display(), w.mnt.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !is_mounted(&w.mnt) {
        if let Some(st) = server.try_wait().unwrap() {
            panic!("the server exited before mounting: {st}");
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the server did not mount");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (i, sig) in ["INT", "TERM", "KILL", "USR1"].iter().enumerate() {
        let mut dd = Command::new("dd")
            .args(["if=/dev/zero", "bs=1M", "count=12", "conv=fsync", "status=none"])
            .arg(format!("of={}", w.mnt.join(format!("w{i}")).display()))
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(30 + 20 * i as u64));
        let _ = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(dd.id().to_string())
            .status();
        let t = Instant::now();
        loop {
            if dd.try_wait().unwrap().is_some() {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "dd hangs after SIG{sig}");
            std::thread::sleep(Duration::from_millis(20));
        }
        round_trips(&w.mnt, 20);
        let _ = fs::remove_file(w.mnt.join(format!("w{i}")));
        fs::write(w.mnt.join("after"), sig.as_bytes()).unwrap();
        assert_eq!(fs::read(w.mnt.join("after")).unwrap(), sig.as_bytes());
    }
    ext4kit_fuse::unmount(&w.mnt, Duration::from_secs(60)).unwrap();
    let t = Instant::now();
    let st = loop {
        if let Some(st) = server.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the server does not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success(), "the server exited with {st}");
}

const SERVE_ENV: &str = "EXT4KIT_TEST_SERVE";

/// The server of [`signals_during_requests_leave_the_io_uring_mount_working`]:
/// runs only in the child (this test binary run again with
/// `EXT4KIT_TEST_SERVE` set).
#[test]
fn serve_when_asked() {
    let Ok(spec) = std::env::var(SERVE_ENV) else {
        return;
    };
    let (img, mnt) = spec.split_once('\n').unwrap();
    let opts = MountOptions {
        transport: TransportChoice::Uring,
        threads: 2,
        cache_budget: 32 << 20,
        ..MountOptions::default()
    };
    let m = ext4kit_fuse::mount(Path::new(img), Path::new(mnt), &opts).unwrap();
    m.run().unwrap();
}

fn is_mounted(dir: &Path) -> bool {
    let t = fs::read_to_string("/proc/self/mountinfo").unwrap();
    t.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|p| Path::new(p) == dir))
}

#[test]
fn transport_dev_uses_dev_fuse_even_when_io_uring_is_offered() {
    let w = Work::new("dev");
    let Some(_on) = EnableUring::set(true, "transport_dev_uses_dev_fuse_even_when_io_uring_is_offered") else {
        return;
    };
    let m = ext4kit_fuse::mount(&w.img, &w.mnt, &w.opts(TransportChoice::Dev)).unwrap();
    assert_eq!(m.transport(), Transport::DevFuse { threads: 2 });
    assert_eq!(m.transport_note(), None, "not asked for, so nothing to explain");
    let server = std::thread::spawn(move || m.run());
    round_trips(&w.mnt, 20);
    assert_eq!(switches("fuser-uring").0, 0);
    ext4kit_fuse::unmount(&w.mnt, Duration::from_secs(30)).unwrap();
    server.join().unwrap().unwrap();
}

#[test]
fn without_enable_uring_auto_uses_dev_fuse_and_uring_is_refused() {
    let w = Work::new("off");
    let Some(_off) = EnableUring::set(false, "without_enable_uring_auto_uses_dev_fuse_and_uring_is_refused") else {
        // No io_uring in this kernel at all: auto must still mount.
        let m = ext4kit_fuse::mount(&w.img, &w.mnt, &w.opts(TransportChoice::Auto)).unwrap();
        assert!(matches!(m.transport(), Transport::DevFuse { .. }));
        assert!(m.transport_note().unwrap().contains("6.14"), "{:?}", m.transport_note());
        let server = std::thread::spawn(move || m.run());
        ext4kit_fuse::unmount(&w.mnt, Duration::from_secs(30)).unwrap();
        server.join().unwrap().unwrap();
        return;
    };
    let m = ext4kit_fuse::mount(&w.img, &w.mnt, &w.opts(TransportChoice::Auto)).unwrap();
    assert_eq!(m.transport(), Transport::DevFuse { threads: 2 });
    let note = m.transport_note().unwrap().to_string();
    assert!(note.contains("enable_uring is N"), "{note}");
    let server = std::thread::spawn(move || m.run());
    round_trips(&w.mnt, 20);
    ext4kit_fuse::unmount(&w.mnt, Duration::from_secs(30)).unwrap();
    server.join().unwrap().unwrap();

    let e = ext4kit_fuse::mount(&w.img, &w.mnt, &w.opts(TransportChoice::Uring)).unwrap_err();
    assert!(e.contains("transport=uring") && e.contains("enable_uring"), "{e}");
    assert!(!is_mounted(&w.mnt), "a refused mount is not left behind");
}

/// A REGISTER the kernel refuses (injected: `FUSER_URING_TEST_FAIL_QUEUE`,
/// debug builds) on the first queue registered or on the last one, which
/// would have made the ring ready: the kernel falls back to /dev/fuse, the
/// mount works and says why.
#[test]
fn a_failed_registration_falls_back_to_dev_fuse() {
    if !cfg!(debug_assertions) {
        eprintln!("\n*** SKIPPED a_failed_registration_falls_back_to_dev_fuse: the failure is injected in debug builds only ***\n");
        return;
    }
    let cpus = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let queues = cpus
        .trim()
        .split(',')
        .map(|p| match p.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum::<usize>();
    for fail in [0, queues - 1] {
        let w = Work::new(&format!("fail{fail}"));
        let Some(_on) = EnableUring::set(true, "a_failed_registration_falls_back_to_dev_fuse") else {
            return;
        };
        // The ring threads read it when they register (this process's own
        // environment; the tests of this file run one at a time).
        std::env::set_var("FUSER_URING_TEST_FAIL_QUEUE", fail.to_string());
        let m = ext4kit_fuse::mount(&w.img, &w.mnt, &w.opts(TransportChoice::Auto));
        std::env::remove_var("FUSER_URING_TEST_FAIL_QUEUE");
        let m = m.unwrap();
        assert!(matches!(m.transport(), Transport::DevFuse { .. }), "{}", m.transport());
        let note = m.transport_note().unwrap().to_string();
        assert!(
            note.contains(&format!("queue {fail}")) && note.contains("/dev/fuse"),
            "{note}"
        );
        let server = std::thread::spawn(move || m.run());
        // Served (through /dev/fuse), not held back for a ring never ready.
        let (tx, rx) = std::sync::mpsc::channel();
        let mnt = w.mnt.clone();
        std::thread::spawn(move || {
            round_trips(&mnt, 20);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("requests hang after a failed io_uring registration");
        ext4kit_fuse::unmount(&w.mnt, Duration::from_secs(30)).unwrap();
        server.join().unwrap().unwrap();
    }
}
