//! The read-write mount, through the kernel's FUSE driver: every write
//! request exercised from ordinary programs (std::fs, rustix, coreutils),
//! then the image checked by the external oracles — `e2fsck -fn` clean and
//! the kernel's ext4 (loop mount) reading back exactly the tree the mount
//! showed. Also: permissions and ownership as an unprivileged user, and an
//! unlinked-but-open file freed at its last close.
//!
//! Needs /dev/fuse, root (mount(2), loop mounts, setpriv) and e2fsprogs;
//! fails loudly, never skips, when they are missing.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ext4kit::ext4::inode;
use ext4kit_testkit::{build_source_tree, compare_trees, e2fsck_clean, CompareOpts, LoopMount, TreeOpts};
use rustix::fs::{FallocateFlags, RenameFlags};

fn require_fuse() {
    ext4kit_testkit::require_root_and_fuse("mount(2), loop mounts, setpriv");
}

/// A fresh ext4 image mounted read-write by a server in a child process.
///
/// The child is this test binary run again with `EXT4KIT_TEST_SERVE` set
/// (see [`serve_when_asked`]): a server in the test process itself would
/// turn any crash of the test into an unkillable hang (the dying process
/// waits in munmap for write-back its own dead server threads should
/// answer — the FUSE self-deadlock).
struct Rw {
    work: PathBuf,
    img: PathBuf,
    mnt: PathBuf,
    server: Option<std::process::Child>,
}

const SERVE_ENV: &str = "EXT4KIT_TEST_SERVE";

/// The server side of [`Rw`]: runs only in the child, in the foreground.
#[test]
fn serve_when_asked() {
    let Ok(spec) = std::env::var(SERVE_ENV) else {
        return;
    };
    let (img, mnt) = spec.split_once('\n').unwrap();
    let opts = ext4kit_fuse::MountOptions {
        allow_other: true,
        threads: 2,
        cache_budget: 64 << 20,
        cache: match std::env::var("EXT4KIT_TEST_CACHE").as_deref() {
            Ok("direct") => ext4kit_fuse::CacheMode::Direct,
            Ok("writeback") => ext4kit_fuse::CacheMode::Writeback,
            _ => ext4kit_fuse::CacheMode::WriteThrough,
        },
        ..Default::default()
    };
    let m = ext4kit_fuse::mount(Path::new(img), Path::new(mnt), &opts).unwrap();
    assert!(!m.read_only(), "a writable ext4 image mounts read-write by default");
    m.run().unwrap();
}

fn is_mounted(dir: &Path) -> bool {
    let t = fs::read_to_string("/proc/self/mountinfo").unwrap();
    t.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|p| Path::new(p) == dir))
}

impl Rw {
    fn new(tag: &str, size: &str, extra_mkfs: &[&str]) -> Rw {
        require_fuse();
        let work = std::env::temp_dir().join(format!("ext4kit-fuse-rw-{tag}-{}", std::process::id()));
        let _ = Command::new("umount").arg("-l").arg(work.join("mnt")).output();
        let _ = fs::remove_dir_all(&work);
        fs::create_dir_all(work.join("mnt")).unwrap();
        fs::set_permissions(&work, fs::Permissions::from_mode(0o755)).unwrap();
        let img = work.join("img");
        let o = Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-b", "4096"])
            .args(extra_mkfs)
            .arg(&img)
            .arg(size)
            .output()
            .unwrap();
        assert!(o.status.success(), "mke2fs: {}", String::from_utf8_lossy(&o.stderr));
        let mnt = work.join("mnt");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "serve_when_asked", "--nocapture", "--test-threads=1"])
            .env(SERVE_ENV, format!("{}\n{}", img.display(), mnt.display()))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while !is_mounted(&mnt) {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("the server exited before mounting: {st}");
            }
            assert!(t.elapsed() < Duration::from_secs(30), "the server did not mount");
            std::thread::sleep(Duration::from_millis(20));
        }
        Rw {
            work,
            img,
            mnt,
            server: Some(child),
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Unmount, wait for the server (which flushes and writes the
    /// superblock clean, then exits 0), and check the image with e2fsck.
    fn unmount(&mut self) {
        ext4kit_fuse::unmount(&self.mnt, Duration::from_secs(60)).unwrap();
        let st = self.server.take().unwrap().wait().unwrap();
        assert!(st.success(), "the server exited with {st}");
        e2fsck_clean(&self.img).unwrap();
        let o = Command::new("dumpe2fs").arg("-h").arg(&self.img).output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.lines()
                .any(|l| l.starts_with("Filesystem state:") && l.trim_end().ends_with("clean")),
            "the superblock is marked clean after unmount:\n{text}"
        );
    }
}

impl Drop for Rw {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            // A failed test: end the server, then detach its mount.
            let _ = c.kill();
            let _ = c.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).output();
        } else {
            let _ = fs::remove_dir_all(&self.work);
        }
    }
}

fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.unwrap_err().raw_os_error().unwrap()
}

fn rerrno<T: std::fmt::Debug>(r: rustix::io::Result<T>) -> i32 {
    r.unwrap_err().raw_os_error()
}

/// statfs free blocks of the mount.
fn free_blocks(p: &Path) -> u64 {
    rustix::fs::statfs(p).unwrap().f_bfree
}

/// Copy `from` (a mounted tree) to the host with everything (cp -a).
fn snapshot(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    let o = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .output()
        .unwrap();
    assert!(o.status.success(), "cp -a: {}", String::from_utf8_lossy(&o.stderr));
}

/// The kernel's ext4 reads the image as the tree `expected`.
fn kernel_reads(img: &Path, work: &Path, expected: &Path, opts: &CompareOpts) {
    let kmnt = work.join("kmnt");
    fs::create_dir_all(&kmnt).unwrap();
    let lm = LoopMount::mount(img, &kmnt, "ext4", true).unwrap();
    let diffs = compare_trees(expected, &kmnt, opts);
    lm.unmount().unwrap();
    let diffs = diffs.unwrap();
    assert!(diffs.is_empty(), "the kernel reads a different tree:\n{diffs:#?}");
}

#[test]
fn a_tree_copied_in_with_cp_reads_back_identically_through_the_kernel() {
    let mut m = Rw::new("cp", "128M", &[]);
    let src = m.work.join("src");
    let manifest = build_source_tree(&src, &TreeOpts::small()).unwrap();
    assert!(!manifest.sparse_files.is_empty());
    // cp -a: create, write (sparse files via SEEK_DATA/SEEK_HOLE or
    // copy_file_range), mknod, symlink, link, chown, chmod, utimensat,
    // setxattr, mkdir — every kind of object the fixture holds.
    snapshot(&src, &m.mnt);
    let opts = CompareOpts {
        ignore_lost_found: true,
        ignore_root_attrs: true,
        ..CompareOpts::default()
    };
    let d = compare_trees(&src, &m.mnt, &opts).unwrap();
    assert!(
        d.is_empty(),
        "the mount differs from the source right after cp -a:\n{d:#?}"
    );
    m.unmount();
    kernel_reads(&m.img, &m.work, &src, &opts);
}

#[test]
fn every_write_request_behaves_like_linux() {
    let mut m = Rw::new("ops", "64M", &[]);
    let before = free_blocks(&m.mnt);

    // write, read, O_APPEND, O_TRUNC, O_EXCL
    fs::write(m.p("f"), b"hello").unwrap();
    {
        let mut f = OpenOptions::new().append(true).open(m.p("f")).unwrap();
        f.write_all(b" world").unwrap();
        // Appends go to the end whatever the position says.
        f.seek(SeekFrom::Start(0)).unwrap();
        f.write_all(b"!").unwrap();
    }
    assert_eq!(fs::read(m.p("f")).unwrap(), b"hello world!");
    assert_eq!(
        errno_of(OpenOptions::new().write(true).create_new(true).open(m.p("f"))),
        libc::EEXIST
    );
    OpenOptions::new().write(true).truncate(true).open(m.p("f")).unwrap();
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 0);
    // A file created with a mode that denies its creator still opens.
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(m.p("ro-file"))
        .unwrap();
    drop(f);
    assert_eq!(fs::metadata(m.p("ro-file")).unwrap().mode() & 0o777, 0o444);

    // setattr: size (grow, shrink), mode, owner, times (UTIME_NOW, OMIT)
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(m.p("t"))
        .unwrap();
    f.write_all_at_helper(b"0123456789", 0);
    f.set_len(100_000).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 100_000);
    f.set_len(4).unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("t")).unwrap(), b"0123");
    fs::set_permissions(m.p("t"), fs::Permissions::from_mode(0o4751)).unwrap();
    assert_eq!(fs::metadata(m.p("t")).unwrap().mode() & 0o7777, 0o4751);
    std::os::unix::fs::chown(m.p("t"), Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(m.p("t")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    // chown clears setuid (notify_change / the engine's setattr rules).
    assert_eq!(md.mode() & 0o7777, 0o751);
    let ts = |s, ns| rustix::fs::Timespec { tv_sec: s, tv_nsec: ns };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        m.p("t"),
        &rustix::fs::Timestamps {
            last_access: ts(1_000_000_000, 123_456_789),
            last_modification: ts(1_500_000_000, 987_654_321),
        },
        rustix::fs::AtFlags::empty(),
    )
    .unwrap();
    let md = fs::metadata(m.p("t")).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_500_000_000, 987_654_321));
    let ctime_before = (md.ctime(), md.ctime_nsec());
    rustix::fs::utimensat(
        rustix::fs::CWD,
        m.p("t"),
        &rustix::fs::Timestamps {
            last_access: ts(0, rustix::fs::UTIME_OMIT),
            last_modification: ts(0, rustix::fs::UTIME_NOW),
        },
        rustix::fs::AtFlags::empty(),
    )
    .unwrap();
    let md = fs::metadata(m.p("t")).unwrap();
    assert_eq!(
        (md.atime(), md.atime_nsec()),
        (1_000_000_000, 123_456_789),
        "UTIME_OMIT"
    );
    assert!(md.mtime() > 1_600_000_000, "UTIME_NOW");
    assert!((md.ctime(), md.ctime_nsec()) >= ctime_before, "ctime moves forward");

    // mknod: fifo, character device; mkdir, rmdir, unlink
    rustix::fs::mknodat(
        rustix::fs::CWD,
        m.p("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        m.p("null"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .unwrap();
    let md = fs::symlink_metadata(m.p("null")).unwrap();
    assert_eq!(md.rdev(), rustix::fs::makedev(1, 3));
    assert!(fs::symlink_metadata(m.p("fifo")).unwrap().file_type().is_fifo_helper());
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/x"), b"x").unwrap();
    assert_eq!(errno_of(fs::remove_dir(m.p("d"))), libc::ENOTEMPTY);
    fs::remove_file(m.p("d/x")).unwrap();
    fs::remove_dir(m.p("d")).unwrap();
    assert_eq!(errno_of(fs::metadata(m.p("d"))), libc::ENOENT);
    assert_eq!(errno_of(fs::remove_file(m.p("nope"))), libc::ENOENT);

    // symlink, readlink, link
    std::os::unix::fs::symlink("t", m.p("sl")).unwrap();
    assert_eq!(fs::read_link(m.p("sl")).unwrap(), Path::new("t"));
    let long = "L".repeat(200);
    std::os::unix::fs::symlink(&long, m.p("sl-long")).unwrap();
    assert_eq!(fs::read_link(m.p("sl-long")).unwrap(), Path::new(&long));
    fs::hard_link(m.p("t"), m.p("t2")).unwrap();
    assert_eq!(fs::metadata(m.p("t")).unwrap().nlink(), 2);
    assert_eq!(fs::read(m.p("t2")).unwrap(), b"0123");

    // rename: plain, over a file, NOREPLACE, EXCHANGE (WHITEOUT: tests/posix_gaps.rs in the cli crate)
    fs::write(m.p("a"), b"A").unwrap();
    fs::write(m.p("b"), b"B").unwrap();
    fs::create_dir(m.p("dir")).unwrap();
    fs::rename(m.p("a"), m.p("dir/a")).unwrap();
    let cwd = rustix::fs::CWD;
    assert_eq!(
        rerrno(rustix::fs::renameat_with(
            cwd,
            m.p("dir/a"),
            cwd,
            m.p("b"),
            RenameFlags::NOREPLACE
        )),
        libc::EEXIST
    );
    rustix::fs::renameat_with(cwd, m.p("dir/a"), cwd, m.p("b"), RenameFlags::EXCHANGE).unwrap();
    assert_eq!(fs::read(m.p("b")).unwrap(), b"A");
    assert_eq!(fs::read(m.p("dir/a")).unwrap(), b"B");
    rustix::fs::renameat_with(cwd, m.p("dir/a"), cwd, m.p("c"), RenameFlags::NOREPLACE).unwrap();
    assert_eq!(fs::read(m.p("c")).unwrap(), b"B");
    assert_eq!(
        rerrno(rustix::fs::renameat_with(
            cwd,
            m.p("c"),
            cwd,
            m.p("nonexistent"),
            RenameFlags::EXCHANGE
        )),
        libc::ENOENT
    );
    fs::rename(m.p("c"), m.p("b")).unwrap(); // replaces
    assert_eq!(fs::read(m.p("b")).unwrap(), b"B");
    assert_eq!(errno_of(fs::metadata(m.p("c"))), libc::ENOENT);

    // xattrs
    rustix::fs::setxattr(m.p("b"), "user.k", b"v1", rustix::fs::XattrFlags::CREATE).unwrap();
    assert_eq!(
        rerrno(rustix::fs::setxattr(
            m.p("b"),
            "user.k",
            b"v2",
            rustix::fs::XattrFlags::CREATE
        )),
        libc::EEXIST
    );
    assert_eq!(
        rerrno(rustix::fs::setxattr(
            m.p("b"),
            "user.none",
            b"v",
            rustix::fs::XattrFlags::REPLACE
        )),
        libc::ENODATA
    );
    rustix::fs::setxattr(m.p("b"), "user.k", &[7u8; 3000], rustix::fs::XattrFlags::REPLACE).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::getxattr(m.p("b"), "user.k", &mut buf).unwrap();
    assert_eq!(&buf[..n], &[7u8; 3000][..]);
    let n = rustix::fs::listxattr(m.p("b"), &mut buf).unwrap();
    assert_eq!(&buf[..n], b"user.k\0");
    rustix::fs::removexattr(m.p("b"), "user.k").unwrap();
    assert_eq!(
        rerrno(rustix::fs::getxattr(m.p("b"), "user.k", &mut buf)),
        libc::ENODATA
    );
    rustix::fs::setxattr(m.p("b"), "trusted.t", b"root only", rustix::fs::XattrFlags::empty()).unwrap();

    // fallocate: allocate (grows), KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(m.p("fa"))
        .unwrap();
    rustix::fs::fallocate(f.as_fd(), FallocateFlags::empty(), 0, 1 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    assert!(f.metadata().unwrap().blocks() >= 2048);
    rustix::fs::fallocate(f.as_fd(), FallocateFlags::KEEP_SIZE, 1 << 20, 1 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    assert!(f.metadata().unwrap().blocks() >= 4096);
    f.write_all_at_helper(&[0xaa; 1 << 20], 0);
    f.sync_all().unwrap();
    rustix::fs::fallocate(
        f.as_fd(),
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        4096,
        8192,
    )
    .unwrap();
    rustix::fs::fallocate(f.as_fd(), FallocateFlags::ZERO_RANGE, 65536, 100).unwrap();
    let data = fs::read(m.p("fa")).unwrap();
    assert_eq!(data.len(), 1 << 20);
    assert!(data[..4096].iter().all(|&b| b == 0xaa));
    assert!(data[4096..12288].iter().all(|&b| b == 0), "punched range reads zeros");
    assert!(data[12288..65536].iter().all(|&b| b == 0xaa));
    assert!(data[65536..65636].iter().all(|&b| b == 0), "zeroed range reads zeros");
    assert!(data[65636..].iter().all(|&b| b == 0xaa));
    assert_eq!(
        rerrno(rustix::fs::fallocate(f.as_fd(), FallocateFlags::PUNCH_HOLE, 0, 4096)),
        libc::EOPNOTSUPP,
        "PUNCH_HOLE without KEEP_SIZE"
    );
    if std::env::var("EXT4KIT_TEST_CACHE").as_deref() == Ok("writeback") {
        // With write-back caching the kernel keeps a regular file's mtime
        // to itself (`fuse_get_cache_mask`) and stamps none for a punch or
        // an in-size zero range (`fuse_file_fallocate`), while the engine
        // stamps them as ext4 does: the image is newer than the mount's
        // view until the inode is dropped. Settle it so the trees compare.
        f.set_modified(std::time::SystemTime::now()).unwrap();
    }
    drop(f);

    // SEEK_DATA / SEEK_HOLE on a sparse file (data at 0, a hole, data at 1 MiB)
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(m.p("sparse"))
        .unwrap();
    f.write_all_at_helper(&[1u8; 4096], 0);
    f.write_all_at_helper(&[2u8; 4096], 1 << 20);
    use rustix::fs::SeekFrom as S;
    let end = (1 << 20) + 4096;
    if std::env::var("EXT4KIT_TEST_CACHE").as_deref() == Ok("writeback") {
        // The kernel holds the written pages; the server answers LSEEK
        // ENOSYS and the kernel's generic answer is "all data" (never a
        // hole where dirty data is).
        assert_eq!(rustix::fs::seek(&f, S::Data(0)).unwrap(), 0);
        assert_eq!(rustix::fs::seek(&f, S::Hole(0)).unwrap(), end);
        assert_eq!(rustix::fs::seek(&f, S::Data(4096)).unwrap(), 4096);
    } else {
        assert_eq!(rustix::fs::seek(&f, S::Data(0)).unwrap(), 0);
        assert_eq!(rustix::fs::seek(&f, S::Hole(0)).unwrap(), 4096);
        assert_eq!(rustix::fs::seek(&f, S::Data(4096)).unwrap(), 1 << 20);
        assert_eq!(rustix::fs::seek(&f, S::Hole(1 << 20)).unwrap(), end);
    }
    assert_eq!(rerrno(rustix::fs::seek(&f, S::Data(end))), libc::ENXIO);

    // copy_file_range
    let g = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(m.p("copy"))
        .unwrap();
    let (mut oi, mut oo) = (1u64 << 20, 10u64);
    let n = rustix::fs::copy_file_range(&f, Some(&mut oi), &g, Some(&mut oo), 4096).unwrap();
    assert_eq!(n, 4096);
    drop(f);
    let c = fs::read(m.p("copy")).unwrap();
    assert_eq!(c.len(), 10 + 4096);
    assert!(c[..10].iter().all(|&b| b == 0) && c[10..].iter().all(|&b| b == 2));

    // fsync, fdatasync, fsyncdir
    g.sync_all().unwrap();
    g.sync_data().unwrap();
    drop(g);
    File::open(&m.mnt).unwrap().sync_all().unwrap();

    // mmap: a shared writable mapping, written and read back
    mmap_write(&m.p("mapped"), 3 * 4096 + 100);
    let d = fs::read(m.p("mapped")).unwrap();
    assert_eq!(d.len(), 3 * 4096 + 100);
    assert!(
        d.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8),
        "mmap writes read back"
    );

    // statfs follows allocation
    assert!(free_blocks(&m.mnt) < before, "writes used blocks");

    // Everything the mount shows is what the kernel reads after unmount.
    let snap = m.work.join("snap");
    snapshot(&m.mnt, &snap);
    m.unmount();
    let opts = CompareOpts {
        ignore_lost_found: true,
        ignore_root_attrs: true,
        ..CompareOpts::default()
    };
    kernel_reads(&m.img, &m.work, &snap, &opts);
}

trait AtHelper {
    fn write_all_at_helper(&self, b: &[u8], off: u64);
}

impl AtHelper for File {
    fn write_all_at_helper(&self, b: &[u8], off: u64) {
        std::os::unix::fs::FileExt::write_all_at(self, b, off).unwrap();
    }
}

trait FifoHelper {
    fn is_fifo_helper(&self) -> bool;
}

impl FifoHelper for fs::FileType {
    fn is_fifo_helper(&self) -> bool {
        std::os::unix::fs::FileTypeExt::is_fifo(self)
    }
}

/// Create `p` of `len` bytes and fill it through a shared mapping.
fn mmap_write(p: &Path, len: usize) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(p)
        .unwrap();
    f.set_len(len as u64).unwrap();
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    f.set_modified(old).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of a file we hold open, unmapped
    // below; nothing else aliases it.
    unsafe {
        let a = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(a, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let s = std::slice::from_raw_parts_mut(a.cast::<u8>(), len);
        for (i, b) in s.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        assert_eq!(libc::msync(a, len, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(a, len), 0);
    }
    // A write through a mapping moves mtime (xfstests generic/080): the
    // kernel's page_mkwrite with write-back caching, the write-back WRITE
    // of the page otherwise.
    assert!(
        fs::metadata(p).unwrap().modified().unwrap() > old + std::time::Duration::from_secs(600_000_000),
        "mtime after an mmap write"
    );
}

/// A directory opened, changed, then read: later listings show the
/// change. The server used to take the listing at OPENDIR (no lock held)
/// and send it at the first READDIR; the kernel cached that listing, which
/// lacked the name created in between, as valid for the directory's
/// version at the READDIR, and served it to every later `ls` until the
/// directory changed again (the stress test `directory_readers_...` lost
/// names this way, under CPU load). Each step is checked through a fresh
/// opendir, which the kernel answers from its cache when it can.
/// A truncating open of a running program is refused with ETXTBSY and
/// leaves the program whole, as on ext4. With FUSE_ATOMIC_O_TRUNC the
/// kernel handed O_TRUNC to OPEN before its ETXTBSY check, so the server
/// emptied the file and the open then failed (or even succeeded, once the
/// program had died of SIGBUS): pjdfstest open::etxtbsy, 11 runs in 30.
#[test]
fn a_truncating_open_of_a_running_program_is_refused_and_truncates_nothing() {
    let mut rw = Rw::new("etxtbsy", "64M", &[]);
    let bin = fs::read("/usr/bin/sleep").unwrap();
    for i in 0..5 {
        let p = rw.p(&format!("sleep{i}"));
        fs::write(&p, &bin).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = Command::new(&p).arg("10").spawn().unwrap();
        // spawn returns once the exec went through: the file is denied
        // writers from here on.
        for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
            let r = OpenOptions::new()
                .read(flags & libc::O_ACCMODE != libc::O_WRONLY)
                .write(flags & libc::O_ACCMODE != libc::O_RDONLY)
                .custom_flags(flags & libc::O_TRUNC)
                .open(&p);
            assert_eq!(errno_of(r), libc::ETXTBSY, "open({flags:#o}) of a running program");
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the program died: its file was damaged"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(fs::read(&p).unwrap() == bin, "the running program's file changed");
    }
    rw.unmount();
}

/// The mount widens its readahead window to one 1 MiB request (the
/// kernel's 128 KiB made a cold read eight round trips per MiB), and a
/// file read cold through the wide window reads back exactly.
#[test]
fn the_readahead_window_is_one_request_and_reads_back_exactly() {
    let mut rw = Rw::new("readahead", "64M", &[]);
    // The server widens the window right after mount(2), before serving.
    let t = std::time::Instant::now();
    loop {
        let kib = ext4kit_fuse::readahead::current(&rw.mnt).unwrap();
        if kib == ext4kit_fuse::readahead::DEFAULT_KIB {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the readahead window stayed {kib} KiB"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let data: Vec<u8> = (0..12u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let p = rw.p("big");
    fs::write(&p, &data).unwrap();
    File::open(&p).unwrap().sync_all().unwrap();
    // Drop the kernel's cached pages of the file so the read goes through
    // readahead to the server.
    let f = File::open(&p).unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    drop(f);
    assert!(
        fs::read(&p).unwrap() == data,
        "a cold read through the 1 MiB window differs"
    );
    rw.unmount();
}

#[test]
fn a_listing_read_after_a_change_since_opendir_is_current() {
    let mut m = Rw::new("opendir", "32M", &[]);
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/old"), b"x").unwrap();
    let names = |p: &Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&m.p("d")), ["old"]);
    for round in 0..3 {
        // opendir(3) opens now; the first getdents comes at the first next().
        let mut open = fs::read_dir(m.p("d")).unwrap();
        let new = format!("new-{round}");
        fs::write(m.p(&format!("d/{new}")), b"y").unwrap();
        if round == 2 {
            fs::remove_file(m.p("d/old")).unwrap();
        }
        // As `ls` and Python's listdir do: a stat of the directory (the
        // kernel then knows its new mtime) before the first read. Without
        // it the kernel's cache check differs and the stale listing was
        // not kept.
        fs::metadata(m.p("d")).unwrap();
        let first: Vec<String> = open
            .by_ref()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        drop(open);
        let mut want: Vec<String> = (0..=round).map(|r| format!("new-{r}")).collect();
        if round < 2 {
            want.push("old".into());
        }
        want.sort();
        let mut first = first;
        first.sort();
        assert_eq!(first, want, "round {round}: the first read after the change");
        assert_eq!(names(&m.p("d")), want, "round {round}: a later listing");
    }
    m.unmount();
}

#[test]
fn an_unlinked_open_file_is_freed_at_its_last_close() {
    let mut m = Rw::new("orphan", "64M", &[]);
    let before = free_blocks(&m.mnt);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(m.p("victim"))
        .unwrap();
    f.write_all(&vec![0x5a; 8 << 20]).unwrap();
    f.sync_all().unwrap();
    fs::remove_file(m.p("victim")).unwrap();
    assert_eq!(errno_of(fs::metadata(m.p("victim"))), libc::ENOENT);
    // Still open: the data is still there and still allocated.
    let mut back = vec![0u8; 8 << 20];
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(&mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    let held = free_blocks(&m.mnt);
    assert!(before - held >= 2048, "8 MiB held while open: {before} -> {held}");
    let ino = f.metadata().unwrap().ino() as u32;
    drop(f);
    // RELEASE is sent after close(2) returns: wait for the blocks.
    let t = std::time::Instant::now();
    while free_blocks(&m.mnt) < before {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the unlinked file's blocks were not freed at close: {} < {before}",
            free_blocks(&m.mnt)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    m.unmount();
    // The inode is free too (dtime set, no links, off the orphan list).
    let fs = ext4kit::Fs::open_image(
        &m.img,
        &ext4kit::OpenOptions {
            read_only: true,
            cache_budget: 16 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    let rec = inode::read(fs.volume(), ino).unwrap();
    assert_eq!(rec.base.links_count, 0);
    assert_ne!(rec.base.dtime, 0);
    assert_eq!(fs.volume().sb().read().last_orphan, 0, "orphan list empty");
}

/// Run `script` with sh as uid/gid 65534 (nobody), supplementary group 4242.
fn as_nobody(script: &str) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--groups=4242", "sh", "-c", script])
        .output()
        .unwrap()
}

fn denied(o: &Output, what: &str, msg: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{what}: should fail as nobody");
    assert!(err.contains(msg), "{what}: expected `{msg}`, got: {err}");
}

fn allowed(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: failed as nobody: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn an_unprivileged_user_gets_linux_permissions_and_owns_what_it_creates() {
    let mut m = Rw::new("perm", "64M", &[]);
    let q = |p: &str| format!("'{}'", m.p(p).display());
    fs::write(m.p("rootfile"), b"secret").unwrap();
    fs::set_permissions(m.p("rootfile"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::create_dir(m.p("tmp")).unwrap();
    fs::set_permissions(m.p("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(m.p("tmp/roots"), b"r").unwrap();
    fs::set_permissions(m.p("tmp/roots"), fs::Permissions::from_mode(0o666)).unwrap();
    fs::create_dir(m.p("sgid")).unwrap();
    std::os::unix::fs::chown(m.p("sgid"), None, Some(4242)).unwrap();
    fs::set_permissions(m.p("sgid"), fs::Permissions::from_mode(0o2777)).unwrap();
    fs::write(m.p("suid"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(m.p("suid"), fs::Permissions::from_mode(0o4777)).unwrap();

    // Denials: the kernel checks mode bits (default_permissions) and the
    // engine the rules it cannot see.
    denied(
        &as_nobody(&format!("cat {}", q("rootfile"))),
        "read 0600 root file",
        "Permission denied",
    );
    denied(
        &as_nobody(&format!("touch {}", q("newfile"))),
        "create in a 0755 root dir",
        "Permission denied",
    );
    denied(
        &as_nobody(&format!("rm -f {}", q("tmp/roots"))),
        "delete root's file in a sticky dir",
        "Operation not permitted",
    );
    denied(
        &as_nobody(&format!("chmod 777 {}", q("rootfile"))),
        "chmod someone else's file",
        "Operation not permitted",
    );
    denied(
        &as_nobody(&format!("mkdir {}", q("d"))),
        "mkdir in a 0755 root dir",
        "Permission denied",
    );
    denied(
        &as_nobody(&format!("setfattr -n trusted.x -v 1 {}", q("tmp"))),
        "trusted.* xattr as non-root",
        "Operation not permitted",
    );

    // Ownership of what nobody creates, and what it may change.
    allowed(
        &as_nobody(&format!(
            "echo hi > {} && mkdir {} && ln -s x {}",
            q("tmp/mine"),
            q("tmp/mydir"),
            q("tmp/mylink")
        )),
        "create in a sticky 1777 dir",
    );
    for p in ["tmp/mine", "tmp/mydir", "tmp/mylink"] {
        let md = fs::symlink_metadata(m.p(p)).unwrap();
        assert_eq!((md.uid(), md.gid()), (65534, 65534), "{p} belongs to its creator");
    }
    denied(
        &as_nobody(&format!("chown 0 {}", q("tmp/mine"))),
        "give a file to root",
        "Operation not permitted",
    );
    allowed(
        &as_nobody(&format!("chgrp 4242 {} && chmod 640 {}", q("tmp/mine"), q("tmp/mine"))),
        "chgrp to own group, chmod own file",
    );
    let md = fs::metadata(m.p("tmp/mine")).unwrap();
    assert_eq!((md.gid(), md.mode() & 0o7777), (4242, 0o640));
    allowed(
        &as_nobody(&format!("touch -d 2000-01-01 {}", q("tmp/mine"))),
        "explicit times on own file",
    );
    assert_eq!(fs::metadata(m.p("tmp/mine")).unwrap().mtime(), 946_684_800);
    denied(
        &as_nobody(&format!("touch -d 2000-01-01 {}", q("tmp/roots"))),
        "explicit times on root's file",
        "Operation not permitted",
    );

    // A set-group-id directory hands its group (and to directories its
    // S_ISGID bit) to what nobody creates in it.
    allowed(
        &as_nobody(&format!("touch {} && mkdir {}", q("sgid/f"), q("sgid/d"))),
        "create in a setgid dir",
    );
    let f = fs::metadata(m.p("sgid/f")).unwrap();
    assert_eq!((f.uid(), f.gid()), (65534, 4242));
    let d = fs::metadata(m.p("sgid/d")).unwrap();
    assert_eq!((d.gid(), d.mode() & 0o2000), (4242, 0o2000));

    // A write by a non-owner clears setuid (file_remove_privs).
    allowed(&as_nobody(&format!("echo x >> {}", q("suid"))), "append to a 0777 file");
    assert_eq!(
        fs::metadata(m.p("suid")).unwrap().mode() & 0o7777,
        0o777,
        "setuid cleared by the write"
    );
    assert_eq!(fs::read(m.p("suid")).unwrap(), b"#!/bin/sh\nx\n");

    // So does a truncation, by size or O_TRUNC (should_remove_suid).
    for (how, cmd) in [("truncate", "truncate -s 1"), ("O_TRUNC", ": >")] {
        fs::set_permissions(m.p("suid"), fs::Permissions::from_mode(0o6777)).unwrap();
        allowed(&as_nobody(&format!("{cmd} {}", q("suid"))), how);
        assert_eq!(
            fs::metadata(m.p("suid")).unwrap().mode() & 0o7777,
            0o777,
            "{how}: setuid and setgid (group-executable) cleared"
        );
    }
    // Root's writes keep them (CAP_FSETID).
    fs::set_permissions(m.p("suid"), fs::Permissions::from_mode(0o4777)).unwrap();
    OpenOptions::new()
        .append(true)
        .open(m.p("suid"))
        .unwrap()
        .write_all(b"y")
        .unwrap();
    fs::File::create(m.p("suid")).unwrap();
    assert_eq!(fs::metadata(m.p("suid")).unwrap().mode() & 0o7777, 0o4777);

    // Unlinking its own file from the sticky dir is fine.
    allowed(
        &as_nobody(&format!("rm {}", q("tmp/mine"))),
        "delete own file in a sticky dir",
    );
    m.unmount();
}

/// Map `f` (length `len` > 0) shared and run `op` on the bytes; munmap
/// writes dirty pages back (the kernel's fuse_vma_close).
fn with_map(f: &File, len: usize, op: impl FnOnce(&mut [u8])) {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of an open file, unmapped before
    // returning; the slice does not outlive it.
    unsafe {
        let a = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(a, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        op(std::slice::from_raw_parts_mut(a.cast::<u8>(), len));
        assert_eq!(libc::munmap(a, len), 0);
    }
}

#[test]
fn fsx_style_random_operations_match_a_model() {
    use std::os::unix::fs::FileExt;
    let mut m = Rw::new("fsx", "64M", &[]);
    let mut rng = ext4kit_testkit::TestRng::new(0xf5c_2026);
    let path = m.p("fsx");
    let mut model: Vec<u8> = Vec::new();
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap()
    };
    let mut f = open();
    const MAX: u64 = 3 << 20;
    let ops = 20_000;
    for step in 0..ops {
        let op = rng.below(100);
        let size = model.len() as u64;
        let ctx = |what: &str| format!("step {step}: {what} (size {size})");
        match op {
            0..=29 => {
                let off = rng.below(MAX - 1);
                let len = 1 + rng.below(128 << 10).min(MAX - off - 1);
                let mut buf = vec![0u8; len as usize];
                rng.fill(&mut buf);
                f.write_all_at(&buf, off).unwrap();
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&buf);
            }
            30..=49 if size > 0 => {
                let off = rng.below(size);
                let len = 1 + rng.below((size - off).min(200 << 10));
                let mut buf = vec![0u8; len as usize];
                f.read_exact_at(&mut buf, off).unwrap();
                assert!(
                    buf == model[off as usize..(off + len) as usize],
                    "{}",
                    ctx(&format!("read {off}+{len} differs"))
                );
            }
            50..=59 => {
                let len = rng.below(MAX);
                f.set_len(len).unwrap();
                model.resize(len as usize, 0);
            }
            60..=69 if size > 0 => {
                let off = rng.below(size) as usize;
                let len = 1 + rng.below((size as usize - off).min(64 << 10) as u64) as usize;
                let mut buf = vec![0u8; len];
                rng.fill(&mut buf);
                with_map(&f, size as usize, |s| s[off..off + len].copy_from_slice(&buf));
                model[off..off + len].copy_from_slice(&buf);
            }
            70..=77 if size > 0 => {
                let off = rng.below(size) as usize;
                let len = 1 + rng.below((size as usize - off).min(64 << 10) as u64) as usize;
                let mut got = vec![0u8; len];
                with_map(&f, size as usize, |s| got.copy_from_slice(&s[off..off + len]));
                assert!(
                    got == model[off..off + len],
                    "{}",
                    ctx(&format!("mmap read {off}+{len} differs"))
                );
            }
            78..=83 if size > 0 => {
                let off = rng.below(size);
                let len = 1 + rng.below((size - off).min(256 << 10));
                let mode = if rng.below(2) == 0 {
                    FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE
                } else {
                    FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE
                };
                rustix::fs::fallocate(f.as_fd(), mode, off, len).unwrap();
                model[off as usize..(off + len) as usize].fill(0);
            }
            84..=87 => {
                // Grow by allocation (mode 0 extends the size).
                let off = rng.below(MAX / 2);
                let len = 1 + rng.below(256 << 10);
                rustix::fs::fallocate(f.as_fd(), FallocateFlags::empty(), off, len).unwrap();
                if model.len() < (off + len) as usize {
                    model.resize((off + len) as usize, 0);
                }
            }
            88..=91 => f.sync_all().unwrap(),
            92..=95 => {
                // A fresh open: the kernel keeps its cache (KEEP_CACHE);
                // it must still agree with the engine.
                drop(f);
                f = open();
            }
            _ => {
                assert_eq!(f.metadata().unwrap().len(), size, "{}", ctx("stat size"));
            }
        }
    }
    drop(f);
    assert!(
        fs::read(&path).unwrap() == model,
        "the whole file differs from the model"
    );
    m.unmount();
    let kmnt = m.work.join("kmnt");
    fs::create_dir_all(&kmnt).unwrap();
    let lm = LoopMount::mount(&m.img, &kmnt, "ext4", true).unwrap();
    let back = fs::read(kmnt.join("fsx"));
    lm.unmount().unwrap();
    assert!(back.unwrap() == model, "the kernel reads a different file");
}
