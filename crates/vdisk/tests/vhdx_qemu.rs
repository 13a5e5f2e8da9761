//! VHDX against qemu-img (Debian's qemu-utils): images qemu makes read as
//! the raw disk they came from; images we write pass `qemu-img check` and
//! convert back to exactly what we wrote; a log we build by hand per the
//! spec replays, read-only in memory and read-write into the file, to what
//! the spec says and to what qemu-img's own replay gives.
//!
//! qemu-img is required: without it these tests fail and say to install
//! qemu-utils (they never pass silently).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ext4kit_blockdev::{BlockDevice, FileDevice};
use ext4kit_vdisk::vhdx::VhdxDisk;
use ext4kit_vdisk::DiskImage;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;

fn tool(name: &str, package: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} not found: install {package} (apt-get install {package}) to run the VHDX interoperability tests");
}

fn qemu_img() -> PathBuf {
    tool("qemu-img", "qemu-utils")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed: {text}");
    text
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ext4kit-vhdx-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(d.join("src/sub")).unwrap();
    d
}

/// A 64 MiB ext4 raw image holding a few files of random bytes.
fn raw_image(dir: &Path) -> PathBuf {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    for (i, size) in [3_000_000usize, 700_000, 12_345, 5_000_000].into_iter().enumerate() {
        let data: Vec<u8> = (0..size).map(|_| rng.random()).collect();
        fs::write(dir.join(format!("src/sub/file{i}")), data).unwrap();
    }
    fs::write(dir.join("src/hello.txt"), b"hello vhdx\n").unwrap();
    let raw = dir.join("raw.img");
    run(Command::new(tool("mke2fs", "e2fsprogs"))
        .args(["-q", "-F", "-t", "ext4", "-d"])
        .arg(dir.join("src"))
        .arg(&raw)
        .arg("64M"));
    raw
}

fn convert_to_vhdx(raw: &Path, out: &Path, opts: &[&str]) {
    let mut c = Command::new(qemu_img());
    c.args(["convert", "-f", "raw", "-O", "vhdx"]);
    for o in opts {
        c.args(["-o", o]);
    }
    run(c.arg(raw).arg(out));
}

fn open(path: &Path, writable: bool) -> VhdxDisk {
    let f: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(path, writable).unwrap());
    VhdxDisk::open(f, writable).unwrap()
}

fn read_all(d: &VhdxDisk) -> Vec<u8> {
    let mut v = vec![0u8; d.size() as usize];
    for (i, c) in v.chunks_mut(MIB as usize).enumerate() {
        d.read_at(i as u64 * MIB, c).unwrap();
    }
    v
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Random writes through a writable open, mirrored in `shadow`:
/// unaligned, partial sectors, across blocks, into unallocated blocks.
fn random_writes(path: &Path, shadow: &mut [u8], seed: u64) {
    let d = open(path, true);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let size = shadow.len() as u64;
    for i in 0..150 {
        let len = match i % 3 {
            0 => rng.random_range(1..600),
            1 => rng.random_range(1..70_000),
            _ => rng.random_range(1..3 * MIB as usize),
        };
        let off = rng.random_range(0..size - len as u64);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        d.write_at(off, &data).unwrap();
        shadow[off as usize..off as usize + len].copy_from_slice(&data);
        if i % 40 == 0 {
            d.flush().unwrap();
        }
    }
    // Every byte reads back before the flush, too.
    assert_eq!(first_difference(&read_all(&d), shadow), None);
    d.flush().unwrap();
}

fn qemu_check_clean(path: &Path) {
    let out = run(Command::new(qemu_img()).args(["check", "-f", "vhdx"]).arg(path));
    assert!(out.contains("No errors"), "qemu-img check: {out}");
}

fn qemu_to_raw(path: &Path, out: &Path) -> Vec<u8> {
    run(Command::new(qemu_img())
        .args(["convert", "-f", "vhdx", "-O", "raw"])
        .arg(path)
        .arg(out));
    fs::read(out).unwrap()
}

fn round_trip(tag: &str, opts: &[&str], variant: &str) {
    let dir = tmpdir(tag);
    let raw = raw_image(&dir);
    let want = fs::read(&raw).unwrap();
    let vhdx = dir.join("disk.vhdx");
    convert_to_vhdx(&raw, &vhdx, opts);

    let d = open(&vhdx, false);
    assert_eq!(d.size(), want.len() as u64);
    assert_eq!(d.layer().variant, variant, "{:?}", d.layer());
    assert_eq!(
        first_difference(&read_all(&d), &want),
        None,
        "{tag}: reads differ from raw.img"
    );
    // Unaligned reads, across block boundaries.
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for _ in 0..200 {
        let len = rng.random_range(1..200_000);
        let off = rng.random_range(0..want.len() - len);
        let mut b = vec![0u8; len];
        d.read_at(off as u64, &mut b).unwrap();
        assert!(b == want[off..off + len], "{tag}: read at {off}+{len}");
    }
    drop(d);

    let mut shadow = want.clone();
    let before = fs::metadata(&vhdx).unwrap().len();
    let allocated = |d: &VhdxDisk| {
        d.layer()
            .details
            .into_iter()
            .find(|(k, _)| k == "allocated blocks")
            .unwrap()
            .1
    };
    let blocks_before = allocated(&open(&vhdx, false));
    random_writes(&vhdx, &mut shadow, 7);
    let after = fs::metadata(&vhdx).unwrap().len();
    let blocks_after = allocated(&open(&vhdx, false));
    eprintln!("{tag}: allocated blocks {blocks_before} -> {blocks_after}, file {before} -> {after} bytes");
    // Writes to mapped blocks go in place (a fixed VHDX's file does not
    // grow for them); each newly mapped block adds one block to the file.
    let count = |s: &str| s.split(' ').next().unwrap().parse::<u64>().unwrap();
    let new_blocks = count(&blocks_after) - count(&blocks_before);
    let bs = open(&vhdx, false)
        .layer()
        .details
        .into_iter()
        .find(|(k, _)| k == "block size")
        .unwrap()
        .1;
    let bs = count(&bs) * MIB;
    assert!(new_blocks > 0, "the writes allocated no block");
    assert_eq!(
        after - before,
        new_blocks * bs,
        "the file grew by other than its new blocks"
    );
    qemu_check_clean(&vhdx);
    let back = qemu_to_raw(&vhdx, &dir.join("back.raw"));
    assert_eq!(
        first_difference(&back, &shadow),
        None,
        "{tag}: qemu-img reads differ from our writes"
    );
    // And we read our own writes after reopening.
    assert_eq!(first_difference(&read_all(&open(&vhdx, false)), &shadow), None);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn qemu_dynamic_vhdx_reads_and_writes() {
    round_trip("dynamic", &[], "dynamic");
}

#[test]
fn qemu_fixed_vhdx_reads_and_writes() {
    round_trip("fixed", &["subformat=fixed"], "fixed");
}

#[test]
fn qemu_dynamic_vhdx_with_1m_blocks_reads_and_writes() {
    round_trip("block1m", &["block_size=1M"], "dynamic");
}

// ---- a hand-built log entry (MS-VHDX 2.3.1), independent of the crate ----

fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}
fn crc_sealed(b: &mut [u8]) {
    b[4..8].fill(0);
    let c = crc32c::crc32c(b);
    b[4..8].copy_from_slice(&c.to_le_bytes());
}

enum Desc {
    Data(u64, Vec<u8>),
    Zero(u64, u64),
}

/// Entry layout per 2.3.1: header (64 bytes) and 32-byte descriptors
/// filling 4 KiB sectors, then one data sector ("data", SequenceHigh, 4084
/// bytes, SequenceLow) per data descriptor; a data descriptor holds the
/// sector's first 8 bytes (LeadingBytes) and last 4 (TrailingBytes).
fn log_entry(guid: [u8; 16], seq: u64, file_size: u64, descs: &[Desc]) -> Vec<u8> {
    let desc_sectors = (descs.len() + 2).div_ceil(128);
    let n_data = descs.iter().filter(|d| matches!(d, Desc::Data(..))).count();
    let len = (desc_sectors + n_data) * 4096;
    let mut e = vec![0u8; len];
    e[..4].copy_from_slice(b"loge");
    e[8..12].copy_from_slice(&(len as u32).to_le_bytes());
    e[12..16].copy_from_slice(&0u32.to_le_bytes()); // Tail: this entry
    e[16..24].copy_from_slice(&seq.to_le_bytes());
    e[24..28].copy_from_slice(&(descs.len() as u32).to_le_bytes());
    e[32..48].copy_from_slice(&guid);
    e[48..56].copy_from_slice(&file_size.to_le_bytes()); // FlushedFileOffset
    e[56..64].copy_from_slice(&file_size.to_le_bytes()); // LastFileOffset
    let mut k = desc_sectors * 4096;
    for (i, d) in descs.iter().enumerate() {
        let p = 64 + 32 * i;
        match d {
            Desc::Zero(off, n) => {
                e[p..p + 4].copy_from_slice(b"zero");
                e[p + 8..p + 16].copy_from_slice(&n.to_le_bytes());
                e[p + 16..p + 24].copy_from_slice(&off.to_le_bytes());
            }
            Desc::Data(off, s) => {
                e[p..p + 4].copy_from_slice(b"desc");
                e[p + 4..p + 8].copy_from_slice(&s[4092..]);
                e[p + 8..p + 16].copy_from_slice(&s[..8]);
                e[p + 16..p + 24].copy_from_slice(&off.to_le_bytes());
                e[k..k + 4].copy_from_slice(b"data");
                e[k + 4..k + 8].copy_from_slice(&((seq >> 32) as u32).to_le_bytes());
                e[k + 8..k + 4092].copy_from_slice(&s[8..4092]);
                e[k + 4092..k + 4096].copy_from_slice(&(seq as u32).to_le_bytes());
                k += 4096;
            }
        }
        e[p + 24..p + 32].copy_from_slice(&seq.to_le_bytes());
    }
    crc_sealed(&mut e);
    e
}

/// What the test needs of a VHDX's layout, read by hand (2.2.2, 2.2.3).
struct Layout {
    log_offset: u64,
    bat_offset: u64,
    block_size: u64,
}

fn layout(img: &[u8]) -> Layout {
    let h = [64 * 1024usize, 128 * 1024]
        .into_iter()
        .max_by_key(|&o| le64(img, o + 8))
        .unwrap();
    let rt = 192 * 1024;
    let bat_guid = [
        0x66, 0x77, 0xC2, 0x2D, 0x23, 0xF6, 0x00, 0x42, 0x9D, 0x64, 0x11, 0x5E, 0x9B, 0xFD, 0x4A, 0x08,
    ];
    let n = le32(img, rt + 8) as usize;
    let bat_offset = (0..n)
        .map(|i| rt + 16 + 32 * i)
        .find(|&e| img[e..e + 16] == bat_guid)
        .map(|e| le64(img, e + 16))
        .unwrap();
    Layout {
        log_offset: le64(img, h + 72),
        bat_offset,
        block_size: MIB, // the test makes its image with block_size=1M
    }
}

/// Set LogGuid in both headers (sequence numbers kept, checksums redone).
fn set_log_guid(img: &mut [u8], guid: [u8; 16]) {
    for o in [64 * 1024usize, 128 * 1024] {
        img[o + 48..o + 64].copy_from_slice(&guid);
        crc_sealed(&mut img[o..o + 4096]);
    }
}

#[test]
fn a_hand_built_log_replays_as_the_spec_says_and_as_qemu_does() {
    let dir = tmpdir("log");
    let raw = raw_image(&dir);
    let mut want = fs::read(&raw).unwrap();
    let clean = dir.join("clean.vhdx");
    convert_to_vhdx(&raw, &clean, &["block_size=1M"]);
    let mut img = fs::read(&clean).unwrap();
    let l = layout(&img);
    let entry = |b: usize| le64(&img, (l.bat_offset + 8 * b as u64) as usize);
    // A block qemu left unallocated, and two it allocated.
    let blocks = (want.len() as u64 / l.block_size) as usize;
    let free = (0..blocks)
        .rev()
        .find(|&b| entry(b) & 7 != 6)
        .expect("an unallocated block");
    let mut used = (0..blocks).filter(|&b| entry(b) & 7 == 6);
    let (u1, u2) = (used.next().unwrap(), used.nth(1).unwrap());
    let u1_file = entry(u1) & !(MIB - 1);
    let u2_file = entry(u2) & !(MIB - 1);

    // 1. New payload for `free` appended at the 1 MiB-aligned end, as an
    //    allocation would leave it before its BAT update was replayed.
    let new_at = (img.len() as u64).next_multiple_of(MIB);
    img.resize(new_at as usize, 0);
    let pattern: Vec<u8> = (0..l.block_size).map(|i| (i % 251) as u8 ^ 0xA5).collect();
    img.extend_from_slice(&pattern);
    // 2. The log entry: the BAT sector with `free` pointing there; one 4 KiB
    //    sector of new data inside block u1; 8 KiB of zeros inside block u2.
    let bat_sector_at = (l.bat_offset + 8 * free as u64) / 4096 * 4096;
    let mut bat_sector = img[bat_sector_at as usize..bat_sector_at as usize + 4096].to_vec();
    let within = (l.bat_offset + 8 * free as u64 - bat_sector_at) as usize;
    bat_sector[within..within + 8].copy_from_slice(&(new_at | 6).to_le_bytes());
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 256) as u8).collect();
    let guid = *b"ext4kit-log-test";
    let e = log_entry(
        guid,
        1,
        img.len() as u64,
        &[
            Desc::Data(bat_sector_at, bat_sector),
            Desc::Data(u1_file + 8192, data.clone()),
            Desc::Zero(u2_file + 4096, 8192),
        ],
    );
    let lo = l.log_offset as usize;
    img[lo..lo + e.len()].copy_from_slice(&e);
    set_log_guid(&mut img, guid);
    // What the spec says the disk holds after replay.
    let bs = l.block_size as usize;
    want[free * bs..(free + 1) * bs].copy_from_slice(&pattern);
    want[u1 * bs + 8192..u1 * bs + 8192 + 4096].copy_from_slice(&data);
    want[u2 * bs + 4096..u2 * bs + 4096 + 8192].fill(0);

    // Read-only: replayed in memory, the file untouched.
    let dirty = dir.join("dirty.vhdx");
    fs::write(&dirty, &img).unwrap();
    let d = open(&dirty, false);
    let log = d.layer().details.into_iter().find(|(k, _)| k == "log");
    assert!(
        log.as_ref().is_some_and(|(_, v)| v.contains("in memory only")),
        "{log:?}"
    );
    assert_eq!(first_difference(&read_all(&d), &want), None, "read-only replay");
    drop(d);
    assert!(fs::read(&dirty).unwrap() == img, "a read-only open wrote the file");

    // qemu-img's own replay (check -r all opens read-write and replays).
    let theirs = dir.join("theirs.vhdx");
    fs::write(&theirs, &img).unwrap();
    run(Command::new(qemu_img())
        .args(["check", "-r", "all", "-f", "vhdx"])
        .arg(&theirs));
    let qemu_raw = qemu_to_raw(&theirs, &dir.join("theirs.raw"));
    assert_eq!(
        first_difference(&qemu_raw, &want),
        None,
        "qemu's replay differs from the spec's"
    );

    // Read-write: replayed into the file, log GUID cleared; qemu agrees.
    let ours = dir.join("ours.vhdx");
    fs::write(&ours, &img).unwrap();
    let d = open(&ours, true);
    assert_eq!(first_difference(&read_all(&d), &want), None, "read-write replay");
    drop(d);
    let after = fs::read(&ours).unwrap();
    let h = [64 * 1024usize, 128 * 1024]
        .into_iter()
        .max_by_key(|&o| le64(&after, o + 8))
        .unwrap();
    assert!(after[h + 48..h + 64].iter().all(|&b| b == 0), "log GUID not cleared");
    qemu_check_clean(&ours);
    assert_eq!(
        first_difference(&qemu_to_raw(&ours, &dir.join("ours.raw")), &want),
        None
    );
    fs::remove_dir_all(&dir).unwrap();
}
