//! A full disk through the library: every byte write()
//! accepted survives, and so does everything written before; ENOSPC comes
//! at write time, never at writeback. Buffered writes claim their blocks
//! (`ext4::reserve`), so an ordinary user stops at the root reserve while
//! root may fill it, and `statfs` counts what is claimed as used. An I/O
//! error at writeback (a device that refuses writes to the free blocks)
//! reaches fsync and the close, and costs nothing that was already
//! committed. Oracles: `e2fsck -fn`, a fresh open reading the files back
//! byte for byte, and debugfs.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ext4kit::{Cred, Errno, Fs, OpenFlags, OpenOptions};
use ext4kit_blockdev::{BlockDevice, FileDevice};

fn workdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ext4kit-fulldisk-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The image: `mke2fs -t ext4 e.img 64M` (1 KiB blocks, 5 % for root).
fn mkfs(dir: &Path) -> PathBuf {
    let img = dir.join("e.img");
    ext4kit_testkit::run_ok(
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4"])
            .arg(&img)
            .arg("64M"),
        &[0],
    )
    .unwrap_or_else(|e| panic!("{e} (these tests need e2fsprogs: apt-get install e2fsprogs)"));
    img
}

fn rw() -> OpenOptions {
    OpenOptions {
        read_only: false,
        cache_budget: 32 << 20,
        ..Default::default()
    }
}

fn fsck_clean(img: &Path) {
    ext4kit_testkit::e2fsck_clean(img).unwrap_or_else(|e| panic!("{e}"));
}

/// The byte at offset `k` of test file `salt`.
fn pattern(salt: u64, k: u64) -> u8 {
    (k.wrapping_mul(0x9E37_79B9).wrapping_add(salt * 131) >> 7) as u8
}

fn chunk(salt: u64, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|k| pattern(salt, off + k)).collect()
}

fn wflags() -> OpenFlags {
    OpenFlags::from_bits(libc_o::O_WRONLY | libc_o::O_CREAT)
}

mod libc_o {
    pub const O_WRONLY: i32 = 0o1;
    pub const O_CREAT: i32 = 0o100;
}

/// Write `salt`'s pattern to `path` as `cred` in 64 KiB writes until one
/// fails; returns (bytes accepted, the error). A short write counts what
/// it took and the next write must then fail.
fn fill(fs: &Fs, path: &[u8], salt: u64, cred: &Cred) -> (u64, ext4kit::Error) {
    let f = fs.open_as(path, wflags(), 0o666, cred).unwrap();
    let mut done = 0u64;
    loop {
        let data = chunk(salt, done, 64 << 10);
        match f.write(fs, &data) {
            Ok(0) => panic!("write returned 0 at {done}"),
            Ok(n) => done += n as u64,
            Err(e) => return (done, e),
        }
        assert!(done < 1 << 30, "no ENOSPC after 1 GiB on a 64 MiB filesystem");
    }
}

/// Read `path` back and check it is `len` bytes of `salt`'s pattern.
fn check_file(fs: &Fs, path: &[u8], salt: u64, len: u64) {
    let st = fs.stat(path).unwrap();
    assert_eq!(st.size, len, "{}: size", String::from_utf8_lossy(path));
    let f = fs.open(path, OpenFlags::default()).unwrap();
    let mut off = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while off < len {
        let n = f.pread(fs, off, &mut buf).unwrap();
        assert!(n > 0, "short file at {off}");
        if buf[..n] != chunk(salt, off, n)[..] {
            let i = (0..n).find(|&i| buf[i] != pattern(salt, off + i as u64)).unwrap_or(0);
            panic!("{}: byte {} differs", String::from_utf8_lossy(path), off + i as u64);
        }
        off += n as u64;
    }
}

/// `keep`, `dir` and then one file as root until ENOSPC: write() stops
/// at the space there is (root may take the reserve), statfs shows the
/// disk full while the data is still only in the page cache, and after
/// close everything accepted is on disk, e2fsck-clean.
#[test]
fn full_disk_keeps_every_accepted_byte() {
    let dir = workdir("root");
    let img = mkfs(&dir);
    let root = Cred::root();
    let free_before;
    let accepted;
    {
        let fs = Fs::open_image(&img, &rw()).unwrap();
        fs.write_file(b"/keep", b"keep\n", 0o644, 0, 0).unwrap();
        fs.mkdir(b"/dir", 0o755, &root).unwrap();
        fs.sync().unwrap();
        free_before = fs.statfs().unwrap().blocks_free;
        let (n, e) = fill(&fs, b"/big", 1, &root);
        assert_eq!(e.errno(), Errno::ENOSPC, "{e}");
        accepted = n;
        // Still delayed (no sync yet), but statfs already counts it.
        let s = fs.statfs().unwrap();
        assert!(
            s.blocks_free < free_before / 50,
            "statfs after the disk filled: {} of {free_before} still free",
            s.blocks_free
        );
        assert_eq!(s.blocks_avail, 0, "nothing left for ordinary users");
        // Most of the free space went to data (the rest was claimed for
        // the extent tree and given back at writeback).
        assert!(
            accepted > free_before * 1024 * 95 / 100,
            "only {accepted} bytes accepted of {free_before} free blocks"
        );
    }
    fsck_clean(&img);
    let fs = Fs::open_image(&img, &OpenOptions::default()).unwrap();
    assert_eq!(fs.stat(b"/dir").unwrap().ftype, ext4kit::FileType::Directory);
    let f = fs.open(b"/keep", OpenFlags::default()).unwrap();
    let mut b = [0u8; 16];
    let n = f.pread(&fs, 0, &mut b).unwrap();
    assert_eq!(&b[..n], b"keep\n");
    check_file(&fs, b"/big", 1, accepted);
    // Once written back, what is free is what the claims did not use.
    let s = fs.statfs().unwrap();
    assert!(
        s.blocks_free < 64,
        "{} blocks free after the disk was filled",
        s.blocks_free
    );
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An ordinary user's writes stop where only the root reserve is left
/// (ENOSPC at write time); root then still writes about the reserve's
/// worth; both files survive whole.
#[test]
fn the_root_reserve_is_roots_alone() {
    let dir = workdir("reserve");
    let img = mkfs(&dir);
    let root = Cred::root();
    let user = Cred::user(1000, 1000);
    let (u_bytes, r_bytes, reserve);
    {
        let fs = Fs::open_image(&img, &rw()).unwrap();
        fs.mkdir(b"/pub", 0o777, &root).unwrap();
        reserve = fs.volume().reservations().r_blocks();
        assert!(reserve > 3000, "mke2fs reserves 5 %: {reserve}");
        let (n, e) = fill(&fs, b"/pub/user", 2, &user);
        assert_eq!(e.errno(), Errno::ENOSPC, "{e}");
        assert!(e.to_string().contains("reserved for root"), "{e}");
        u_bytes = n;
        let s = fs.statfs().unwrap();
        assert_eq!(s.blocks_avail, 0);
        assert!(s.blocks_free >= reserve, "{} free, reserve {reserve}", s.blocks_free);
        // The user cannot even create a directory in what is left...
        let e = fs.mkdir(b"/pub/d", 0o755, &user);
        assert!(e.as_ref().is_err_and(|e| e.errno() == Errno::ENOSPC), "{e:?}");
        // ...while root may use the reserve.
        let (n, e) = fill(&fs, b"/rootfile", 3, &root);
        assert_eq!(e.errno(), Errno::ENOSPC, "{e}");
        r_bytes = n;
        assert!(
            r_bytes > reserve * 1024 * 9 / 10,
            "root got {r_bytes} bytes of a {reserve}-block reserve"
        );
        fs.sync().unwrap();
    }
    fsck_clean(&img);
    let fs = Fs::open_image(&img, &OpenOptions::default()).unwrap();
    check_file(&fs, b"/pub/user", 2, u_bytes);
    check_file(&fs, b"/rootfile", 3, r_bytes);
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Truncating or unlinking a file with delayed pages gives its claims
/// back: the space is writable again at once, without a sync.
#[test]
fn truncate_and_unlink_release_claims() {
    let dir = workdir("release");
    let img = mkfs(&dir);
    let root = Cred::root();
    {
        let fs = Fs::open_image(&img, &rw()).unwrap();
        let free = fs.statfs().unwrap().blocks_free;
        let f = fs.open_as(b"/a", wflags(), 0o644, &root).unwrap();
        // 2 MiB: under the dirty budget (4 MiB here), so none of it is
        // written back before the truncate.
        f.write(&fs, &chunk(4, 0, 2 << 20)).unwrap();
        let claimed = fs.volume().reservations().dirty();
        assert!(claimed >= 2048, "2 MiB of 1 KiB blocks claimed: {claimed}");
        assert_eq!(fs.statfs().unwrap().blocks_free, free - claimed);
        f.ftruncate(&fs, 256 << 10).unwrap();
        let after = fs.volume().reservations().dirty();
        assert!(
            after <= claimed - 1792,
            "truncate to 256 KiB left {after} of {claimed} claimed"
        );
        drop(f);
        fs.unlink(b"/a", &root).unwrap();
        assert_eq!(fs.volume().reservations().dirty(), 0, "unlink gave every claim back");
        assert_eq!(fs.statfs().unwrap().blocks_free, free);
        // The space is usable: a second fill gets as far as the first would.
        let (n, e) = fill(&fs, b"/b", 5, &root);
        assert_eq!(e.errno(), Errno::ENOSPC, "{e}");
        assert!(n > free * 1024 * 95 / 100, "{n} bytes after release of {free} blocks");
        assert!(
            fs.volume().reservations().dirty() > 0,
            "the claims of /b are still held before writeback"
        );
    }
    fsck_clean(&img);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Refuses writes to blocks in `bad` once armed (an image file on a full
/// host filesystem, a failing disk).
struct FailingDevice {
    inner: FileDevice,
    bad: Vec<(u64, u64)>,
    armed: AtomicBool,
    block: u64,
}

impl BlockDevice for FailingDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if self.armed.load(Ordering::SeqCst) {
            let (a, b) = (off / self.block, (off + buf.len() as u64).div_ceil(self.block));
            if self.bad.iter().any(|&(s, e)| a <= e && s < b) {
                return Err(io::Error::other("injected write failure"));
            }
        }
        self.inner.write_at(off, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_only(&self) -> bool {
        false
    }
}

/// The free block ranges of a closed image, as dumpe2fs lists them.
fn free_ranges(img: &Path) -> Vec<(u64, u64)> {
    let out = ext4kit_testkit::run_ok(Command::new("dumpe2fs").arg(img), &[0]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v = Vec::new();
    // The per-group lines (indented); the header's total is not a range.
    for l in text.lines().filter_map(|l| l.strip_prefix("  Free blocks: ")) {
        for r in l.split(", ").map(str::trim).filter(|r| !r.is_empty()) {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            v.push((a.parse().unwrap(), b.parse().unwrap()));
        }
    }
    assert!(!v.is_empty(), "dumpe2fs listed no free blocks");
    v
}

/// Writeback cannot write a file's data (the device refuses the free
/// blocks): fsync reports EIO, the failed blocks are not left in the map,
/// the close reports it too, and the other files — committed before and
/// after — survive; e2fsck is clean.
#[test]
fn writeback_io_error_reaches_fsync_and_costs_nothing_else() {
    let dir = workdir("eio");
    let img = mkfs(&dir);
    let root = Cred::root();
    {
        let fs = Fs::open_image(&img, &rw()).unwrap();
        fs.write_file(b"/keep", b"keep\n", 0o644, 0, 0).unwrap();
        fs.mkdir(b"/dir", 0o755, &root).unwrap();
        fs.write_file(b"/dir/f", &chunk(6, 0, 3000), 0o644, 0, 0).unwrap();
        fs.create(b"/big", 0o644, 0, 0).unwrap();
        fs.create(b"/later", 0o644, 0, 0).unwrap();
    }
    let bad = free_ranges(&img);
    let dev = Arc::new(FailingDevice {
        inner: FileDevice::open(&img, true).unwrap(),
        bad,
        armed: AtomicBool::new(false),
        block: 1024,
    });
    {
        let fs = Fs::open_device(dev.clone(), &rw()).unwrap();
        dev.armed.store(true, Ordering::SeqCst);
        let f = fs.open(b"/big", OpenFlags::from_bits(libc_o::O_WRONLY)).unwrap();
        let n = f.write(&fs, &chunk(7, 0, 2 << 20)).unwrap();
        assert_eq!(n, 2 << 20, "the write is accepted: there is room");
        let e = f.fsync(&fs).unwrap_err();
        assert_eq!(e.errno(), Errno::EIO, "{e}");
        assert!(e.to_string().contains("injected"), "{e}");
        // No block of the failed write stays mapped (it would show
        // whatever the block held before).
        let ino = fs.stat(b"/big").unwrap().ino;
        let layout = fs.data_layout(ino).unwrap();
        assert!(layout.runs.is_empty(), "{:?}", layout.runs);
        // A writer that goes on is stopped once the dirty budget (4 MiB
        // of this 32 MiB cache) is full of data that cannot be written:
        // memory stays bounded, and the writer hears why.
        let mut more = 0u64;
        let err = loop {
            let at = (2 << 20) + more;
            match f.pwrite(&fs, at, &chunk(7, at, 64 << 10)) {
                Ok(n) => more += n as u64,
                Err(e) => break e,
            }
            assert!(more < 32 << 20, "32 MiB more accepted by a device that writes nothing");
        };
        assert_eq!(err.errno(), Errno::EIO, "{err}");
        let dirty = fs.stats().dirty_page_bytes;
        assert!(dirty <= 5 << 20, "{dirty} bytes dirty past a 4 MiB budget");
        // Another file's metadata still commits.
        fs.chmod(b"/later", 0o600, &root).unwrap();
        // The close reports it as well (sync: every file is tried).
        let e = fs.sync().unwrap_err();
        assert_eq!(e.errno(), Errno::EIO, "{e}");
        drop(f);
    }
    dev.armed.store(false, Ordering::SeqCst);
    fsck_clean(&img);
    let fs = Fs::open_image(&img, &OpenOptions::default()).unwrap();
    let k = fs.open(b"/keep", OpenFlags::default()).unwrap();
    let mut b = [0u8; 16];
    let n = k.pread(&fs, 0, &mut b).unwrap();
    assert_eq!(&b[..n], b"keep\n");
    check_file(&fs, b"/dir/f", 6, 3000);
    assert_eq!(
        fs.stat(b"/later").unwrap().mode & 0o777,
        0o600,
        "committed after the failure"
    );
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// sync(2) and syncfs(2) never reach a FUSE server, so the commit interval
/// must cover file data too: data dirty for longer than the interval is
/// written back and committed by the background worker. A copy of the
/// image taken while it is still open (what a crash leaves) holds it.
#[test]
fn dirty_data_older_than_the_commit_interval_is_written_back() {
    let dir = workdir("expire");
    let img = mkfs(&dir);
    let fs = Fs::open_image(
        &img,
        &OpenOptions {
            commit_interval: Some(std::time::Duration::from_secs(1)),
            ..rw()
        },
    )
    .unwrap();
    if fs.volume().jbd().commit_interval().is_none() {
        panic!("no commit interval (SOURCE_DATE_EPOCH set?): this test needs one");
    }
    let f = fs.open(b"/late", wflags()).unwrap();
    f.write(&fs, &chunk(8, 0, 300_000)).unwrap();
    assert!(fs.stats().dirty_page_bytes > 0, "the write is buffered");
    let t = std::time::Instant::now();
    while fs.stats().dirty_page_bytes > 0 || !fs.volume().jbd().running_is_empty() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "dirty data not written back and committed within 20 s of a 1 s interval"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The crash: copy the image while the filesystem is still open.
    let crashed = dir.join("crashed.img");
    std::fs::copy(&img, &crashed).unwrap();
    let after = Fs::open_image(&crashed, &OpenOptions::default()).unwrap();
    check_file(&after, b"/late", 8, 300_000);
    drop(after);
    drop(f);
    drop(fs);
    fsck_clean(&img);
    let _ = std::fs::remove_dir_all(&dir);
}
