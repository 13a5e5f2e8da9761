//! The file I/O API end to end: open with creation flags, write / pwrite
//! through the page cache (delayed allocation), O_APPEND, O_TRUNC,
//! ftruncate, fallocate, fsync / fdatasync (fsync costs O(dirty): fdatasync writes no
//! inode when the size did not change), concurrent writers.
//!
//! Every test checks its data against an in-memory model, then syncs,
//! reopens a fresh `Fs` and compares again, runs `e2fsck -fn`, and (as
//! root) has the kernel read the same bytes from a loop mount.
//!
//! Sizes stay inside the interim block-map limits (extent root of four
//! extents, direct + single indirect): files are written so their blocks
//! form few runs. Larger layouts (many extents, double indirect) are left
//! for after the general map_blocks lands.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ext4kit::vfs::io::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};
use ext4kit::{Access, Cred, Errno, Fs, OpenFlags, OpenOptions, Process, Whence};

struct Img {
    dir: PathBuf,
    path: PathBuf,
}

impl Drop for Img {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn image(tag: &str, mkfs: &[&str]) -> Img {
    let dir = std::env::temp_dir().join(format!("ext4kit-fileio-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fs.img");
    ext4kit_testkit::run_ok(
        Command::new("mke2fs")
            .args(["-q", "-F"])
            .args(mkfs)
            .arg(&path)
            .arg("64M"),
        &[0],
    )
    .unwrap_or_else(|e| panic!("{e} (apt-get install e2fsprogs)"));
    Img { dir, path }
}

fn rw(img: &Path) -> Arc<Fs> {
    rw_budget(img, 256 << 20)
}

fn rw_budget(img: &Path, budget: usize) -> Arc<Fs> {
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

fn fsck_clean(img: &Path) {
    ext4kit_testkit::e2fsck_clean(img).unwrap_or_else(|e| panic!("{e}"));
}

fn flags(bits: i32) -> OpenFlags {
    OpenFlags::from_bits(bits)
}

use ext4kit::vfs::file::{O_APPEND, O_CREAT, O_EXCL, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY};

fn read_all(fs: &Fs, path: &str) -> Vec<u8> {
    let f = fs.open(path.as_bytes(), OpenFlags::default()).unwrap();
    let size = fs.stat(path.as_bytes()).unwrap().size as usize;
    let mut v = vec![0xAAu8; size + 100];
    let mut got = 0;
    loop {
        let n = f.pread(fs, got as u64, &mut v[got..]).unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    assert_eq!(got, size, "{path}: read {got} bytes of {size}");
    v.truncate(got);
    v
}

fn pattern(n: usize, salt: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    ext4kit_testkit::TestRng::new(salt).fill(&mut v);
    v
}

/// Sync, drop, fsck, reopen read-only and compare every file with its
/// model, then let the kernel read them too.
fn verify(fs: Arc<Fs>, img: &Path, files: &[(&str, &[u8])]) {
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(img);
    let fresh = Fs::open_image(img, &OpenOptions::default()).unwrap();
    for (p, want) in files {
        let got = read_all(&fresh, p);
        assert!(
            got == *want,
            "{p}: a fresh open reads different bytes (len {} vs {})",
            got.len(),
            want.len()
        );
    }
    drop(fresh);
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("the kernel cross-check needs a loop mount ({e}); CI runs as root");
    }
    let mnt = img.with_extension("mnt");
    let m = ext4kit_testkit::LoopMount::mount(img, &mnt, "ext4", true).unwrap();
    for (p, want) in files {
        let got = std::fs::read(m.path().join(p.trim_start_matches('/'))).unwrap();
        assert!(got == *want, "{p}: the kernel reads different bytes");
    }
    m.unmount().unwrap();
}

fn write_model(model: &mut Vec<u8>, off: usize, data: &[u8]) {
    if model.len() < off + data.len() {
        model.resize(off + data.len(), 0);
    }
    model[off..off + data.len()].copy_from_slice(data);
}

fn round_trips(tag: &str, mkfs: &[&str]) {
    let img = image(tag, mkfs);
    let fs = rw(&img.path);
    let f = fs.open(b"/f", flags(O_CREAT | O_RDWR)).unwrap();
    let mut model = Vec::new();
    // Fill 300 KiB sequentially in odd-sized pieces, then overwrite at odd
    // offsets, reading back through the cache at every step.
    let mut off = 0;
    let mut k = 0u64;
    while off < 300_000 {
        let n = [1usize, 7, 511, 1000, 4095, 4097, 12_345][k as usize % 7];
        let data = pattern(n, k);
        assert_eq!(f.write(&fs, &data).unwrap(), n);
        write_model(&mut model, off, &data);
        off += n;
        k += 1;
    }
    assert_eq!(f.position(), off as u64);
    assert_eq!(fs.stat(b"/f").unwrap().size, off as u64);
    assert!(read_all(&fs, "/f") == model);
    f.fsync(&fs).unwrap();
    for i in 0..200u64 {
        // Within the file: gaps past EOF would add extents (interim map limit).
        let o = (i * 7919 + 13) as usize % model.len();
        let n = (i as usize * 37) % 9000 + 1;
        let data = pattern(n, 1000 + i);
        assert_eq!(f.pwrite(&fs, o as u64, &data).unwrap(), n);
        write_model(&mut model, o, &data);
        if i % 50 == 0 {
            f.fdatasync(&fs).unwrap();
        }
        let mut buf = vec![0u8; n + 10];
        let got = f.pread(&fs, o as u64, &mut buf).unwrap();
        assert_eq!(&buf[..got], &model[o..(o + n + 10).min(model.len())]);
    }
    assert!(read_all(&fs, "/f") == model);
    // Reads at odd offsets and lengths, some straddling EOF.
    for (o, n) in [
        (0usize, 1usize),
        (4095, 2),
        (4096, 4096),
        (model.len() - 5, 100),
        (12_345, 70_000),
    ] {
        let mut buf = vec![0u8; n];
        let got = f.pread(&fs, o as u64, &mut buf).unwrap();
        assert_eq!(&buf[..got], &model[o..(o + n).min(model.len())]);
    }
    drop(f);
    verify(fs, &img.path, &[("/f", &model)]);
}

#[test]
fn write_read_round_trips_ext4_4k() {
    round_trips("rt4k", &["-t", "ext4", "-b", "4096"]);
}

#[test]
fn write_read_round_trips_ext4_1k() {
    round_trips("rt1k", &["-t", "ext4", "-b", "1024"]);
}

#[test]
fn write_read_round_trips_ext2_indirect() {
    // 4 KiB blocks: 12 + 1024 blocks fit in direct + single indirect.
    round_trips("rtext2", &["-t", "ext2", "-b", "4096"]);
}

#[test]
fn append_and_trunc() {
    let img = image("append", &["-t", "ext4", "-b", "1024"]);
    let fs = rw(&img.path);
    let a = fs.open(b"/log", flags(O_CREAT | O_WRONLY | O_APPEND)).unwrap();
    let b = fs.open(b"/log", flags(O_WRONLY | O_APPEND)).unwrap();
    let mut model = Vec::new();
    for i in 0..100u64 {
        let d = pattern(1 + (i as usize * 13) % 700, i);
        let f = if i % 2 == 0 { &a } else { &b };
        if i % 3 == 0 {
            // pwrite on an O_APPEND description appends too (Linux).
            f.pwrite(&fs, 0, &d).unwrap();
        } else {
            f.write(&fs, &d).unwrap();
        }
        model.extend_from_slice(&d);
    }
    assert!(b.position() <= model.len() as u64);
    assert!(read_all(&fs, "/log") == model);
    // Appending from several threads: every record lands whole.
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let fs = &fs;
            s.spawn(move || {
                let f = fs.open(b"/log", flags(O_WRONLY | O_APPEND)).unwrap();
                for _ in 0..50 {
                    f.write(fs, &[t + b'a'; 100]).unwrap();
                }
            });
        }
    });
    let got = read_all(&fs, "/log");
    assert_eq!(got.len(), model.len() + 4 * 50 * 100);
    assert!(got[..model.len()] == model[..]);
    for rec in got[model.len()..].chunks(100) {
        assert!(rec.iter().all(|&c| c == rec[0]), "an appended record was split");
    }
    model = got;
    drop((a, b));
    // O_TRUNC empties the file; O_CREAT|O_EXCL on it fails.
    let t = fs.open(b"/log2", flags(O_CREAT | O_WRONLY)).unwrap();
    t.write(&fs, &pattern(50_000, 9)).unwrap();
    t.fsync(&fs).unwrap();
    drop(t);
    let blocks_before = fs.stat(b"/log2").unwrap().blocks;
    assert!(blocks_before >= 98, "{blocks_before} sectors");
    let t = fs.open(b"/log2", flags(O_TRUNC | O_RDWR)).unwrap();
    assert_eq!(fs.stat(b"/log2").unwrap().size, 0);
    assert_eq!(fs.stat(b"/log2").unwrap().blocks, 0);
    t.write(&fs, b"fresh").unwrap();
    assert_eq!(
        fs.open(b"/log2", flags(O_CREAT | O_EXCL | O_RDWR)).unwrap_err().errno(),
        Errno::EEXIST
    );
    drop(t);
    verify(fs, &img.path, &[("/log", &model), ("/log2", b"fresh")]);
}

#[test]
fn ftruncate_shrink_and_grow() {
    let img = image("trunc", &["-t", "ext4", "-b", "1024"]);
    let fs = rw(&img.path);
    let f = fs.open(b"/t", flags(O_CREAT | O_RDWR)).unwrap();
    let mut model = pattern(100_000, 5);
    f.write(&fs, &model).unwrap();
    f.fsync(&fs).unwrap();
    let st0 = fs.stat(b"/t").unwrap();
    // Shrink to a partial block, with the tail block cached and dirty.
    f.pwrite(&fs, 40_000, &[1u8; 3000]).unwrap();
    write_model(&mut model, 40_000, &[1u8; 3000]);
    f.ftruncate(&fs, 41_500).unwrap();
    model.truncate(41_500);
    assert_eq!(fs.stat(b"/t").unwrap().size, 41_500);
    assert!(fs.stat(b"/t").unwrap().blocks < st0.blocks);
    assert!(read_all(&fs, "/t") == model);
    // Grow: the new range reads as zeros, including the old last block's tail.
    f.ftruncate(&fs, 70_000).unwrap();
    model.resize(70_000, 0);
    assert!(read_all(&fs, "/t") == model);
    f.fsync(&fs).unwrap();
    // Shrink with the tail block not cached (fresh Fs), then grow by a write.
    drop(f);
    fs.sync().unwrap();
    drop(fs);
    let fs = rw(&img.path);
    let f = fs.open(b"/t", flags(O_RDWR)).unwrap();
    f.ftruncate(&fs, 30_001).unwrap();
    model.truncate(30_001);
    f.pwrite(&fs, 50_000, b"end").unwrap();
    model.resize(50_000, 0);
    model.extend_from_slice(b"end");
    assert!(read_all(&fs, "/t") == model);
    // Truncate to zero and to the same size.
    let g = fs.open(b"/z", flags(O_CREAT | O_RDWR)).unwrap();
    g.write(&fs, &pattern(5000, 1)).unwrap();
    g.ftruncate(&fs, 0).unwrap();
    g.ftruncate(&fs, 0).unwrap();
    assert_eq!(fs.stat(b"/z").unwrap().size, 0);
    // Read-only descriptions cannot truncate (EINVAL, as Linux).
    let r = fs.open(b"/t", flags(O_RDONLY)).unwrap();
    assert_eq!(r.ftruncate(&fs, 0).unwrap_err().errno(), Errno::EINVAL);
    drop((f, g, r));
    verify(fs, &img.path, &[("/t", &model), ("/z", b"")]);
}

#[test]
fn holes_and_delayed_allocation() {
    let img = image("holes", &["-t", "ext4", "-b", "4096"]);
    let fs = rw(&img.path);
    let f = fs.open(b"/sparse", flags(O_CREAT | O_RDWR)).unwrap();
    // Data far out, nothing allocated yet: reads see the dirty pages even
    // though the block map is still all hole.
    let far = 10 << 20;
    f.pwrite(&fs, far, b"far away").unwrap();
    f.pwrite(&fs, 5000, b"near").unwrap();
    let ino = fs.stat(b"/sparse").unwrap().ino;
    assert!(
        fs.data_layout(ino).unwrap().runs.is_empty(),
        "allocation must be delayed"
    );
    let mut model = vec![0u8; far as usize];
    write_model(&mut model, 5000, b"near");
    model.extend_from_slice(b"far away");
    assert!(read_all(&fs, "/sparse") == model);
    // SEEK_DATA / SEEK_HOLE see the data (they write back first).
    assert_eq!(f.lseek(&fs, 0, Whence::Data).unwrap(), 4096);
    assert_eq!(f.lseek(&fs, 4096, Whence::Hole).unwrap(), 8192);
    assert_eq!(f.lseek(&fs, 8192, Whence::Data).unwrap(), far / 4096 * 4096);
    // Before the start of the file there is nothing to find: ENXIO, as
    // at or past its end (iomap_seek_data; xfstests generic/448).
    for w in [Whence::Data, Whence::Hole] {
        assert_eq!(f.lseek(&fs, -1, w).unwrap_err().errno(), ext4kit::Errno::ENXIO);
    }
    let runs = fs.data_layout(ino).unwrap().runs;
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(fs.stat(b"/sparse").unwrap().blocks, 2 * 8);
    // A contiguous dirty range becomes one contiguous allocation.
    let g = fs.open(b"/dense", flags(O_CREAT | O_RDWR)).unwrap();
    for i in 0..64u64 {
        g.pwrite(&fs, (63 - i) * 4096, &pattern(4096, i)).unwrap();
    }
    g.fsync(&fs).unwrap();
    let dense: Vec<u8> = (0..64u64).flat_map(|b| pattern(4096, 63 - b)).collect();
    assert!(read_all(&fs, "/dense") == dense);
    let gino = fs.stat(b"/dense").unwrap().ino;
    let runs = fs.data_layout(gino).unwrap().runs;
    assert_eq!(runs.len(), 1, "delayed allocation should give one run: {runs:?}");
    assert_eq!(runs[0].len, 64);
    drop((f, g));
    verify(fs, &img.path, &[("/sparse", &model), ("/dense", &dense)]);
}

#[test]
fn fallocate_modes() {
    let img = image("falloc", &["-t", "ext4", "-b", "4096"]);
    let fs = rw(&img.path);
    let f = fs.open(b"/fa", flags(O_CREAT | O_RDWR)).unwrap();
    // Default mode: size grows, range reads as zeros, blocks allocated
    // unwritten (SEEK_DATA treats them as a hole, like reads do).
    f.fallocate(&fs, 0, 0, 1 << 20).unwrap();
    let st = fs.stat(b"/fa").unwrap();
    assert_eq!(st.size, 1 << 20);
    assert_eq!(st.blocks, (1 << 20) / 512);
    let mut model = vec![0u8; 1 << 20];
    assert!(read_all(&fs, "/fa") == model);
    assert!(fs.data_layout(st.ino).unwrap().runs.iter().all(|r| r.uninit));
    assert_eq!(f.lseek(&fs, 0, Whence::Hole).unwrap(), 0);
    // KEEP_SIZE past EOF: blocks but no size.
    f.fallocate(&fs, FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20).unwrap();
    let st = fs.stat(b"/fa").unwrap();
    assert_eq!(st.size, 1 << 20);
    assert_eq!(st.blocks, (2 << 20) / 512);
    // Writing into unwritten extents converts them at writeback.
    f.pwrite(&fs, 10_000, &pattern(20_000, 1)).unwrap();
    write_model(&mut model, 10_000, &pattern(20_000, 1));
    f.fsync(&fs).unwrap();
    assert!(read_all(&fs, "/fa") == model);
    assert_eq!(f.lseek(&fs, 0, Whence::Data).unwrap(), 8192);
    // Punch a hole across the written data: zeros, fewer blocks.
    f.fallocate(&fs, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 12_000, 10_000)
        .unwrap();
    model[12_000..22_000].fill(0);
    assert!(read_all(&fs, "/fa") == model);
    assert_eq!(
        fs.stat(b"/fa").unwrap().blocks,
        (2 << 20) / 512 - 16 /* blocks 3 and 4 */
    );
    // Zero a range with data in it (a second file: the first already has
    // four extents, the interim map limit).
    let z = fs.open(b"/fz", flags(O_CREAT | O_RDWR)).unwrap();
    let mut zmodel = pattern(150_000, 2);
    z.write(&fs, &zmodel).unwrap();
    z.fsync(&fs).unwrap();
    let zblocks = fs.stat(b"/fz").unwrap().blocks;
    z.fallocate(&fs, FALLOC_FL_ZERO_RANGE, 110_000, 30_000).unwrap();
    zmodel[110_000..140_000].fill(0);
    assert!(read_all(&fs, "/fz") == zmodel);
    assert_eq!(
        fs.stat(b"/fz").unwrap().blocks,
        zblocks,
        "ZERO_RANGE keeps the blocks allocated"
    );
    // Past EOF ZERO_RANGE without KEEP_SIZE extends the size.
    z.fallocate(&fs, FALLOC_FL_ZERO_RANGE, 149_000, 5000).unwrap();
    zmodel[149_000..].fill(0);
    zmodel.resize(154_000, 0);
    assert_eq!(fs.stat(b"/fz").unwrap().size, 154_000);
    assert!(read_all(&fs, "/fz") == zmodel);
    drop(z);
    // Bad modes and ranges.
    let e = |r: ext4kit::Result<()>| r.unwrap_err().errno();
    assert_eq!(e(f.fallocate(&fs, 0, 0, 0)), Errno::EINVAL);
    assert_eq!(e(f.fallocate(&fs, FALLOC_FL_PUNCH_HOLE, 0, 10)), Errno::EOPNOTSUPP);
    assert_eq!(
        e(f.fallocate(
            &fs,
            FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
            0,
            10
        )),
        Errno::EOPNOTSUPP
    );
    assert_eq!(e(f.fallocate(&fs, 0x8, 0, 10)), Errno::EOPNOTSUPP);
    assert_eq!(e(f.fallocate(&fs, 0, u64::MAX - 5, 10)), Errno::EFBIG);
    let r = fs.open(b"/fa", OpenFlags::default()).unwrap();
    assert_eq!(e(r.fallocate(&fs, 0, 0, 10)), Errno::EBADF);
    drop((f, r));
    verify(fs, &img.path, &[("/fa", &model), ("/fz", &zmodel)]);
}

#[test]
fn fallocate_on_indirect_files() {
    let img = image("falloc2", &["-t", "ext2", "-b", "4096"]);
    let fs = rw(&img.path);
    let f = fs.open(b"/ind", flags(O_CREAT | O_RDWR)).unwrap();
    f.write(&fs, &pattern(10_000, 3)).unwrap();
    let mut model = pattern(10_000, 3);
    // Default mode: blocks written with zeros (no unwritten state).
    f.fallocate(&fs, 0, 0, 200_000).unwrap();
    model.resize(200_000, 0);
    assert_eq!(fs.stat(b"/ind").unwrap().size, 200_000);
    assert!(read_all(&fs, "/ind") == model);
    assert_eq!(
        f.fallocate(&fs, FALLOC_FL_ZERO_RANGE, 0, 100).unwrap_err().errno(),
        Errno::EOPNOTSUPP
    );
    f.fallocate(&fs, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 8192)
        .unwrap();
    model[4096..12288].fill(0);
    assert!(read_all(&fs, "/ind") == model);
    drop(f);
    verify(fs, &img.path, &[("/ind", &model)]);
}

#[test]
fn fdatasync_writes_no_inode_when_size_is_unchanged() {
    let img = image("fsync", &["-t", "ext4", "-b", "2048"]);
    let fs = rw(&img.path);
    let f = fs.open(b"/db", flags(O_CREAT | O_RDWR)).unwrap();
    let mut model = pattern(64 * 2048, 7);
    f.write(&fs, &model).unwrap();
    f.fsync(&fs).unwrap();
    let w = || fs.stats().inode_writes;
    let before = w();
    for i in 0..20u64 {
        let d = pattern(100, i);
        let o = (i * 6151) as usize % (model.len() - 100);
        f.pwrite(&fs, o as u64, &d).unwrap();
        write_model(&mut model, o, &d);
        f.fdatasync(&fs).unwrap();
    }
    assert_eq!(w(), before, "fdatasync wrote the inode although only times changed");
    // The times are still dirty: fsync writes the record once.
    f.fsync(&fs).unwrap();
    assert_eq!(w(), before + 1);
    // fsync with nothing dirty writes nothing.
    f.fsync(&fs).unwrap();
    assert_eq!(w(), before + 1);
    // Every fsync after a write writes it (timestamps changed).
    for i in 0..5u64 {
        f.pwrite(&fs, i * 3000, b"x").unwrap();
        model[i as usize * 3000] = b'x';
        f.fsync(&fs).unwrap();
    }
    assert_eq!(w(), before + 6);
    // Growing the file is data-relevant: fdatasync must write the inode.
    f.write(&fs, b"grow").unwrap();
    let pos = f.position() as usize;
    write_model(&mut model, pos - 4, b"grow");
    f.fdatasync(&fs).unwrap();
    assert_eq!(w(), before + 7);
    // A fresh Fs sees the size fdatasync made durable.
    let fresh = Fs::open_image(&img.path, &OpenOptions::default()).unwrap();
    assert_eq!(fresh.stat(b"/db").unwrap().size, model.len() as u64);
    drop(fresh);
    drop(f);
    verify(fs, &img.path, &[("/db", &model)]);
}

#[test]
fn concurrent_writers_to_different_files() {
    let img = image("conc", &["-t", "ext4", "-b", "1024"]);
    let fs = rw(&img.path);
    let models: Vec<Vec<u8>> = (0..4u64).map(|t| pattern(150_000 + t as usize * 777, t)).collect();
    std::thread::scope(|s| {
        for (t, m) in models.iter().enumerate() {
            let fs = &fs;
            s.spawn(move || {
                let mut p = Process::new(fs.clone());
                let fd = p
                    .open_as(
                        format!("/w{t}"),
                        flags(O_CREAT | O_EXCL | O_WRONLY),
                        0o600,
                        &Cred::root(),
                    )
                    .unwrap();
                let mut off = 0;
                let mut k = 0;
                while off < m.len() {
                    let n = (1000 + k * 331) % 7000 + 1;
                    let n = n.min(m.len() - off);
                    assert_eq!(p.write(fd, &m[off..off + n]).unwrap(), n);
                    off += n;
                    k += 1;
                    // No intermediate syncs: interleaved allocations of four
                    // files would need more than the interim four extents.
                }
                p.fsync(fd).unwrap();
                p.close(fd).unwrap();
            });
        }
    });
    let names: Vec<String> = (0..4).map(|t| format!("/w{t}")).collect();
    let files: Vec<(&str, &[u8])> = names
        .iter()
        .zip(&models)
        .map(|(n, m)| (n.as_str(), m.as_slice()))
        .collect();
    for (n, m) in &files {
        assert!(read_all(&fs, n) == *m);
    }
    verify(fs, &img.path, &files);
}

#[test]
fn dirty_budget_forces_writeback() {
    let img = image("budget", &["-t", "ext4", "-b", "4096"]);
    // 1 MiB for all caches: 512 KiB of pages, 128 KiB may be dirty.
    let fs = rw_budget(&img.path, 1 << 20);
    let f = fs.open(b"/big", flags(O_CREAT | O_WRONLY)).unwrap();
    let data = pattern(4 << 20, 11);
    for c in data.chunks(100_000) {
        f.write(&fs, c).unwrap();
        assert!(
            fs.stats().dirty_page_bytes <= 256 << 10,
            "{}",
            fs.stats().dirty_page_bytes
        );
    }
    assert!(fs.stats().cached_page_bytes <= 1 << 20);
    let ino = fs.stat(b"/big").unwrap().ino;
    assert!(fs.data_layout(ino).unwrap().runs.len() <= 4);
    assert!(read_all(&fs, "/big") == data);
    drop(f);
    verify(fs, &img.path, &[("/big", &data)]);
}

#[test]
fn errno_semantics() {
    let img = image("errno", &["-t", "ext4", "-b", "1024"]);
    let fs = rw(&img.path);
    let e = |r: ext4kit::Result<usize>| r.unwrap_err().errno();
    let f = fs.open(b"/e", flags(O_CREAT | O_WRONLY)).unwrap();
    f.write(&fs, b"data").unwrap();
    assert_eq!(f.read(&fs, &mut [0u8; 4]).unwrap_err().errno(), Errno::EBADF);
    let r = fs.open(b"/e", flags(O_RDONLY)).unwrap();
    assert_eq!(e(r.write(&fs, b"x")), Errno::EBADF);
    assert_eq!(e(r.pwrite(&fs, 0, b"x")), Errno::EBADF);
    assert_eq!(fs.open(b"/", flags(O_RDWR)).unwrap_err().errno(), Errno::EISDIR);
    assert_eq!(
        fs.open(b"/", flags(O_WRONLY | O_TRUNC)).unwrap_err().errno(),
        Errno::EISDIR
    );
    assert_eq!(e(f.pwrite(&fs, 1 << 50, b"x")), Errno::EFBIG);
    assert_eq!(
        fs.open(b"/nope/x", flags(O_CREAT | O_RDWR)).unwrap_err().errno(),
        Errno::ENOENT
    );
    // Permissions: owner-only file, another user.
    let user = Cred::user(1000, 1000);
    let other = Cred::user(1001, 1001);
    fs.create(b"/mine", 0o600, 1000, 1000).unwrap();
    assert_eq!(fs.stat(b"/mine").unwrap().uid, 1000);
    assert_eq!(
        fs.open_as(b"/mine", flags(O_RDONLY), 0, &other).unwrap_err().errno(),
        Errno::EACCES
    );
    fs.open_as(b"/mine", flags(O_RDWR), 0, &user).unwrap();
    // Creating in root-owned / (mode 755) as a user is refused.
    assert_eq!(fs.stat(b"/").unwrap().mode & 0o777, 0o755);
    assert_eq!(
        fs.open_as(b"/x", flags(O_CREAT | O_RDWR), 0o644, &other)
            .unwrap_err()
            .errno(),
        Errno::EACCES
    );
    // A new file is opened with the requested access even if its mode denies it.
    let w = fs
        .open_as(b"/mine-ro", flags(O_CREAT | O_RDWR), 0o400, &Cred::root())
        .unwrap();
    w.write(&fs, b"ok").unwrap();
    assert_eq!(w.flags.access, Access::ReadWrite);
    // Read-only filesystem.
    drop((f, r, w));
    fs.sync().unwrap();
    drop(fs);
    let ro = Fs::open_image(&img.path, &OpenOptions::default()).unwrap();
    assert_eq!(ro.open(b"/e", flags(O_RDWR)).unwrap_err().errno(), Errno::EROFS);
    drop(ro);
    fsck_clean(&img.path);
}

#[test]
fn opens_are_counted() {
    let img = image("opens", &["-t", "ext4", "-b", "1024"]);
    let fs = rw(&img.path);
    let a = fs.open(b"/c", flags(O_CREAT | O_RDWR)).unwrap();
    let ino = fs.stat(b"/c").unwrap().ino;
    let i = fs.inode(ino).unwrap();
    // Open files, summed over the inode's pins (`opens` itself counts pins).
    let n = || ext4kit::vfs::pin::open_files(&i);
    assert_eq!(n(), 1);
    let mut p = Process::new(fs.clone());
    let fd = p.open("/c", OpenFlags::default()).unwrap();
    let fd2 = p.dup(fd).unwrap();
    assert_eq!(n(), 2);
    p.close(fd).unwrap();
    assert_eq!(n(), 2, "the duplicate still holds the description");
    p.close(fd2).unwrap();
    assert_eq!(n(), 1);
    drop(a);
    assert_eq!(n(), 0);
}

/// Readers racing a writer that rewrites the whole file, syncs, and (with a
/// tiny cache) has its pages evicted: every block a reader sees is one
/// whole generation, and per block a reader never goes back to an older
/// generation (a stale page cached from a read that raced writeback would).
/// It failed about once in 100 runs while page-cache inserts were lock-free
/// papaya `compute`s (a clean page older than the disk stayed cached); 0 in
/// 500 since every change to a page map holds its mutex. Hunt with
/// `EXT4KIT_RACE_GENS=250` and a shell loop.
#[test]
fn readers_never_see_stale_or_torn_blocks() {
    let img = image("race", &["-t", "ext4", "-b", "4096"]);
    let fs = rw_budget(&img.path, 1 << 20);
    const BLOCKS: usize = 256;
    let f = fs.open(b"/r", flags(O_CREAT | O_RDWR)).unwrap();
    f.write(&fs, &vec![1u8; BLOCKS * 4096]).unwrap();
    f.fsync(&fs).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (fs, done) = (&fs, &done);
            s.spawn(move || {
                let r = fs.open(b"/r", OpenFlags::default()).unwrap();
                let mut seen = vec![0u8; BLOCKS];
                let mut buf = vec![0u8; 3 * 4096];
                let mut rng = ext4kit_testkit::TestRng::new(12345 + t);
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) || reads < 100 {
                    let b = rng.below((BLOCKS - 2) as u64) as usize;
                    assert_eq!(r.pread(fs, (b * 4096) as u64, &mut buf).unwrap(), buf.len());
                    for k in 0..3 {
                        let blk = &buf[k * 4096..(k + 1) * 4096];
                        assert!(blk.iter().all(|&c| c == blk[0]), "block {} torn", b + k);
                        if blk[0] < seen[b + k] {
                            // Diagnose before failing: what the cache, a
                            // fresh map and the disk say about this block.
                            let l = (b + k) as u64;
                            let page = r.inode.pages.get(l).map(|p| (p.data[0], p.is_dirty()));
                            let layout = fs.data_layout(r.inode.ino).unwrap();
                            let pblk = layout
                                .runs
                                .iter()
                                .find(|x| x.logical <= l && l < x.logical + x.len)
                                .map(|x| x.physical + (l - x.logical));
                            let disk = pblk.map(|p| {
                                let mut d = vec![0u8; 4096];
                                fs.volume().disk().read_raw(p, &mut d).unwrap();
                                d[0]
                            });
                            let mut again = vec![0u8; 4096];
                            r.pread(fs, l * 4096, &mut again).unwrap();
                            panic!(
                                "block {l} went back from {} to {}: cached page {page:?}, pblk {pblk:?}, disk {disk:?}, \
                                 read again {}, runs {:?}",
                                seen[b + k], blk[0], again[0], layout.runs
                            );
                        }
                        seen[b + k] = blk[0];
                    }
                    reads += 1;
                }
            });
        }
        // Readers stop even if the writer panics (else the scope would
        // wait for them forever and the test would hang, not fail).
        struct Done<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let _done = Done(&done);
        // EXT4KIT_RACE_GENS (up to 255) makes the run longer, to hunt the race.
        let gens: u8 = std::env::var("EXT4KIT_RACE_GENS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40);
        for g in 2..=gens {
            for c in 0..BLOCKS / 16 {
                f.pwrite(&fs, (c * 16 * 4096) as u64, &vec![g; 16 * 4096]).unwrap();
            }
            if g % 3 == 0 {
                f.fsync(&fs).unwrap();
            }
        }
    });
    drop(f);
    let gens: u8 = std::env::var("EXT4KIT_RACE_GENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    verify(fs, &img.path, &[("/r", &vec![gens; BLOCKS * 4096])]);
}

/// The descriptor-table wrappers reach the same operations.
#[test]
fn process_wrappers() {
    let img = image("proc", &["-t", "ext4", "-b", "4096"]);
    let fs = rw(&img.path);
    let mut p = Process::new(fs.clone());
    let fd = p.open_as("/p", flags(O_CREAT | O_RDWR), 0o640, &Cred::root()).unwrap();
    assert_eq!(p.write(fd, b"hello world").unwrap(), 11);
    assert_eq!(p.pwrite(fd, b"W", 6).unwrap(), 1);
    p.ftruncate(fd, 9).unwrap();
    p.fallocate(fd, 0, 0, 20_000).unwrap();
    p.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 2, 3)
        .unwrap();
    p.fdatasync(fd).unwrap();
    p.fsync(fd).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(p.pread(fd, &mut b, 0).unwrap(), 16);
    assert_eq!(&b[..11], b"he\0\0\0 Wor\0\0");
    assert_eq!(fs.stat(b"/p").unwrap().mode & 0o777, 0o640);
    let mut model = b"he\0\0\0 Wor".to_vec();
    model.resize(20_000, 0);
    p.close(fd).unwrap();
    assert_eq!(p.write(fd, b"x").unwrap_err().errno(), Errno::EBADF);
    assert_eq!(p.fsync(fd).unwrap_err().errno(), Errno::EBADF);
    drop(p);
    verify(fs, &img.path, &[("/p", &model)]);
}

/// Immutable and append-only inodes (set with debugfs, as chattr would).
#[test]
fn immutable_and_append_only_inodes() {
    let img = image("iflags", &["-t", "ext4", "-b", "4096"]);
    let fs = rw(&img.path);
    for p in ["/imm", "/app"] {
        let f = fs.open(p.as_bytes(), flags(O_CREAT | O_WRONLY)).unwrap();
        f.write(&fs, b"base").unwrap();
    }
    fs.sync().unwrap();
    drop(fs);
    for (p, fl) in [("/imm", "0x80010"), ("/app", "0x80020")] {
        ext4kit_testkit::run_ok(
            Command::new("debugfs")
                .arg("-w")
                .arg("-R")
                .arg(format!("set_inode_field {p} flags {fl}"))
                .arg(&img.path),
            &[0],
        )
        .unwrap();
    }
    let fs = rw(&img.path);
    let eperm = |r: ext4kit::Result<Arc<ext4kit::File>>| r.unwrap_err().errno();
    assert_eq!(eperm(fs.open(b"/imm", flags(O_WRONLY))), Errno::EPERM);
    assert_eq!(eperm(fs.open(b"/imm", flags(O_WRONLY | O_APPEND))), Errno::EPERM);
    assert_eq!(eperm(fs.open(b"/app", flags(O_WRONLY))), Errno::EPERM);
    assert_eq!(
        eperm(fs.open(b"/app", flags(O_WRONLY | O_APPEND | O_TRUNC))),
        Errno::EPERM
    );
    fs.open(b"/imm", flags(O_RDONLY)).unwrap();
    let a = fs.open(b"/app", flags(O_WRONLY | O_APPEND)).unwrap();
    a.pwrite(&fs, 0, b"+more").unwrap();
    assert_eq!(a.ftruncate(&fs, 0).unwrap_err().errno(), Errno::EPERM);
    assert_eq!(
        a.fallocate(&fs, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 2)
            .unwrap_err()
            .errno(),
        Errno::EPERM
    );
    a.fallocate(&fs, FALLOC_FL_KEEP_SIZE, 0, 100_000).unwrap();
    drop(a);
    verify(fs, &img.path, &[("/imm", b"base"), ("/app", b"base+more")]);
}

/// Writes by an unprivileged opener clear setuid (and setgid with group
/// execute); root's writes keep them.
#[test]
fn unprivileged_writes_clear_setuid() {
    let img = image("suid", &["-t", "ext4", "-b", "4096"]);
    let fs = rw(&img.path);
    let user = Cred::user(1000, 1000);
    fs.create(b"/s", 0o6755, 1000, 1000).unwrap();
    fs.create(b"/g", 0o2644, 1000, 1000).unwrap();
    fs.create(b"/r", 0o6755, 1000, 1000).unwrap();
    let mode = |p: &[u8]| fs.stat(p).unwrap().mode & 0o7777;
    fs.open_as(b"/s", flags(O_WRONLY), 0, &user)
        .unwrap()
        .write(&fs, b"x")
        .unwrap();
    assert_eq!(mode(b"/s"), 0o755);
    fs.open_as(b"/g", flags(O_WRONLY), 0, &user)
        .unwrap()
        .write(&fs, b"x")
        .unwrap();
    assert_eq!(mode(b"/g"), 0o2644, "setgid without group exec is not a privilege");
    fs.open_as(b"/r", flags(O_WRONLY), 0, &Cred::root())
        .unwrap()
        .write(&fs, b"x")
        .unwrap();
    assert_eq!(mode(b"/r"), 0o6755);
    verify(fs, &img.path, &[("/s", b"x"), ("/g", b"x"), ("/r", b"x")]);
    let fresh = Fs::open_image(&img.path, &OpenOptions::default()).unwrap();
    assert_eq!(fresh.stat(b"/s").unwrap().mode & 0o7777, 0o755);
}

/// Fragmented layouts: many extents (writes with gaps, synced often;
/// concurrent writers syncing as they go, so their blocks interleave) and
/// double-indirect ext2 files.
#[test]
fn fragmented_and_large_layouts() {
    for (tag, mkfs) in [
        ("frag-ext4", &["-t", "ext4", "-b", "1024"][..]),
        ("frag-ext2", &["-t", "ext2", "-b", "1024"][..]),
    ] {
        let img = image(tag, mkfs);
        let fs = rw(&img.path);
        let f = fs.open(b"/holes", flags(O_CREAT | O_RDWR)).unwrap();
        let mut model = Vec::new();
        for i in 0..300u64 {
            // Every other 3 KiB stretch written: a hole between each run.
            let o = (i * 6144) as usize;
            let d = pattern(3072, i);
            f.pwrite(&fs, o as u64, &d).unwrap();
            write_model(&mut model, o, &d);
            if i % 7 == 0 {
                f.fdatasync(&fs).unwrap();
            }
        }
        // Past single indirect on 1 KiB ext2 (12 + 256 blocks).
        let big = pattern(3 << 20, 77);
        let g = fs.open(b"/big", flags(O_CREAT | O_RDWR)).unwrap();
        g.write(&fs, &big).unwrap();
        g.fsync(&fs).unwrap();
        g.ftruncate(&fs, 1 << 20).unwrap();
        let models: Vec<Vec<u8>> = (0..4u64).map(|t| pattern(200_000, t)).collect();
        std::thread::scope(|s| {
            for (t, m) in models.iter().enumerate() {
                let fs = &fs;
                s.spawn(move || {
                    let f = fs.open(format!("/c{t}").as_bytes(), flags(O_CREAT | O_WRONLY)).unwrap();
                    for (k, c) in m.chunks(3000).enumerate() {
                        f.write(fs, c).unwrap();
                        if k % 5 == 0 {
                            f.fdatasync(fs).unwrap();
                        }
                    }
                });
            }
        });
        drop((f, g));
        let names: Vec<String> = (0..4).map(|t| format!("/c{t}")).collect();
        let mut files: Vec<(&str, &[u8])> = vec![("/holes", &model), ("/big", &big[..1 << 20])];
        files.extend(names.iter().zip(&models).map(|(n, m)| (n.as_str(), m.as_slice())));
        verify(fs, &img.path, &files);
    }
}

/// Files past 4 GiB and sparse files whose extents are far apart (5 GiB,
/// 1 TiB): sizes, holes and data read back by us and the kernel, on ext4
/// and (within its triple-indirect limit) ext3.
#[test]
fn files_past_4_gib_with_far_apart_extents() {
    for (tag, mkfs, offsets) in [
        (
            "huge-ext4",
            &["-t", "ext4"][..],
            &[0u64, 5 << 30, (1 << 40) + 12345][..],
        ),
        (
            "huge-ext3",
            &["-t", "ext3"][..],
            &[0u64, 5 << 30, (8u64 << 30) - 4096][..],
        ),
    ] {
        let img = image(tag, mkfs);
        let fs = rw(&img.path);
        let f = fs.open(b"/sparse", flags(O_CREAT | O_RDWR)).unwrap();
        for (k, &o) in offsets.iter().enumerate() {
            f.pwrite(&fs, o, &pattern(100_000, k as u64)).unwrap();
        }
        f.fsync(&fs).unwrap();
        let size = offsets.last().unwrap() + 100_000;
        assert_eq!(fs.stat(b"/sparse").unwrap().size, size);
        // Only the written blocks are allocated.
        assert!(fs.stat(b"/sparse").unwrap().blocks < 3 * 110_000 / 512 + 64);
        drop(f);
        fs.sync().unwrap();
        drop(fs);
        fsck_clean(&img.path);
        let fresh = Fs::open_image(&img.path, &OpenOptions::default()).unwrap();
        let f = fresh.open(b"/sparse", OpenFlags::default()).unwrap();
        for (k, &o) in offsets.iter().enumerate() {
            let mut b = vec![0u8; 100_000];
            assert_eq!(f.pread(&fresh, o, &mut b).unwrap(), b.len());
            assert!(b == pattern(100_000, k as u64), "{tag}: data at {o}");
            let mut z = vec![1u8; 4096];
            if o > 4096 {
                f.pread(&fresh, o - 4096, &mut z).unwrap();
                assert!(z.iter().all(|&x| x == 0), "{tag}: hole before {o}");
            }
        }
        drop(f);
        drop(fresh);
        ext4kit_testkit::kernel_available().expect("the kernel check needs a loop mount; CI runs as root");
        let mnt = img.dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let m = ext4kit_testkit::LoopMount::mount(&img.path, &mnt, "auto", true).unwrap();
        let kf = std::fs::File::open(m.path().join("sparse")).unwrap();
        assert_eq!(kf.metadata().unwrap().len(), size);
        for (k, &o) in offsets.iter().enumerate() {
            let mut b = vec![0u8; 100_000];
            std::os::unix::fs::FileExt::read_exact_at(&kf, &mut b, o).unwrap();
            assert!(b == pattern(100_000, k as u64), "{tag}: kernel reads other data at {o}");
        }
        drop(kf);
        m.unmount().unwrap();
    }
}
