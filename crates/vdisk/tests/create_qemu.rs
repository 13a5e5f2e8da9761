//! Images `ext4kit_vdisk::create` makes, against qemu-img (Debian's
//! qemu-utils): for qcow2, VHD (both sizings) and VHDX, at 1 MiB,
//! 64 MiB + 512 and 3 GiB (sparse), `qemu-img check` finds nothing wrong
//! (where qemu checks the format), `qemu-img info` reports the size our
//! device has (at least the size asked for), and after random writes
//! through our device, `qemu-img convert -O raw` gives back exactly what
//! was written.
//!
//! qemu-img is required: without it these tests fail and say to install
//! qemu-utils (they never pass silently).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ext4kit_blockdev::{BlockDevice, FileDevice};
use ext4kit_vdisk::{create, CreateRequest, DiskFormat, VhdSizing};
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;
/// The shadow copy's unit: written chunks are kept, the rest is zeros.
const CHUNK: u64 = MIB;

fn qemu_img() -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/bin"] {
        let p = Path::new(dir).join("qemu-img");
        if p.exists() {
            return p;
        }
    }
    panic!("qemu-img not found: install qemu-utils (apt-get install qemu-utils) to run the image creation tests");
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
    let d = std::env::temp_dir().join(format!("ext4kit-create-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// qemu's name for the format.
fn qemu_name(f: DiskFormat) -> &'static str {
    match f {
        DiskFormat::Qcow2 => "qcow2",
        DiskFormat::Vhd => "vpc",
        DiskFormat::Vhdx => "vhdx",
        other => panic!("{other} is not created"),
    }
}

/// The disk as written so far: chunks touched, the rest zeros.
struct Shadow {
    size: u64,
    chunks: BTreeMap<u64, Vec<u8>>,
}

impl Shadow {
    fn write(&mut self, off: u64, data: &[u8]) {
        let mut done = 0usize;
        while done < data.len() {
            let pos = off + done as u64;
            let (i, within) = (pos / CHUNK, (pos % CHUNK) as usize);
            let len = CHUNK.min(self.size - i * CHUNK) as usize;
            let chunk = self.chunks.entry(i).or_insert_with(|| vec![0; len]);
            let n = (len - within).min(data.len() - done);
            chunk[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }
}

/// Writes that cross qcow2 clusters, VHD and VHDX blocks, start and end
/// off sector boundaries, and touch the first and last bytes of the disk.
fn writes(size: u64, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut data = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.random()).collect() };
    let mut w = vec![(0, data(4096)), (size - 1000, data(1000)), (size - 1, data(1))];
    for boundary in [64 << 10, 2 * MIB, 32 * MIB] {
        if boundary + 3000 < size {
            w.push((boundary - 1234, data(5000)));
        }
    }
    // Random writes in three 64 MiB windows (start, middle, end), so a
    // 3 GiB disk of 32 MiB VHDX blocks allocates a few blocks, not all.
    let window = (64 * MIB).min(size);
    let starts = [0, (size - window) / 2, size - window];
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    for k in 0..24 {
        let len = rng.random_range(1..300_000u64).min(window);
        let off = starts[k % 3] + rng.random_range(0..=window - len);
        let bytes = (0..len).map(|_| rng.random()).collect();
        w.push((off, bytes));
    }
    w
}

fn virtual_size(info: &str) -> u64 {
    let key = "\"virtual-size\":";
    let at = info.find(key).unwrap_or_else(|| panic!("no virtual-size in {info}")) + key.len();
    info[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `raw` (qemu's conversion) holds exactly what `shadow` says.
fn assert_same(raw: &Path, shadow: &Shadow, what: &str) {
    let mut f = fs::File::open(raw).unwrap();
    assert_eq!(f.metadata().unwrap().len(), shadow.size, "{what}: converted size");
    let zeros = vec![0u8; CHUNK as usize];
    let mut buf = vec![0u8; CHUNK as usize];
    for i in 0..shadow.size.div_ceil(CHUNK) {
        let len = CHUNK.min(shadow.size - i * CHUNK) as usize;
        f.read_exact(&mut buf[..len]).unwrap();
        let want = shadow.chunks.get(&i).map_or(&zeros[..len], |c| &c[..]);
        if buf[..len] != *want {
            let k = (0..len).find(|&k| buf[k] != want[k]).unwrap();
            panic!(
                "{what}: qemu reads byte {} as {:#04x}, we wrote {:#04x}",
                i * CHUNK + k as u64,
                buf[k],
                want[k]
            );
        }
    }
}

/// Create, check, write, convert: the whole round trip for one image.
fn round_trip(format: DiskFormat, sizing: VhdSizing, size: u64) {
    let what = format!("{format} ({sizing:?}) of {size} bytes");
    let dir = tmpdir(&format!("{}-{size}-{sizing:?}", format.name()));
    let path = dir.join("disk.img");
    fs::File::create(&path).unwrap();
    let file: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&path, true).unwrap());
    let mut req = CreateRequest::new(format, size);
    req.vhd_sizing = sizing;
    let disk = create(file, &req).unwrap_or_else(|e| panic!("{what}: {e}"));
    let created = disk.size();
    assert!(created >= size, "{what}: created {created} bytes");
    assert_eq!(disk.layer().virtual_size, created);

    let fmt = qemu_name(format);
    let check = |when: &str| {
        // qemu checks qcow2 and VHDX; its vpc driver has no check.
        if format != DiskFormat::Vhd {
            let out = run(Command::new(qemu_img()).args(["check", "-f", fmt]).arg(&path));
            assert!(out.contains("No errors"), "{what} {when}: qemu-img check: {out}");
        }
    };
    disk.flush().unwrap();
    check("as created");
    let info = run(Command::new(qemu_img())
        .args(["info", "-f", fmt, "--output=json"])
        .arg(&path));
    assert_eq!(virtual_size(&info), created, "{what}: qemu-img info: {info}");
    // qemu also recognizes the format by content.
    let probed = run(Command::new(qemu_img()).args(["info", "--output=json"]).arg(&path));
    assert!(probed.contains(&format!("\"format\": \"{fmt}\"")), "{what}: {probed}");

    let mut shadow = Shadow {
        size: created,
        chunks: BTreeMap::new(),
    };
    for (off, data) in writes(created, size) {
        disk.write_at(off, &data)
            .unwrap_or_else(|e| panic!("{what}: write at {off}: {e}"));
        shadow.write(off, &data);
    }
    disk.flush().unwrap();
    // Read back through our own device before qemu looks.
    for (&i, chunk) in &shadow.chunks {
        let mut b = vec![0u8; chunk.len()];
        disk.read_at(i * CHUNK, &mut b).unwrap();
        assert!(b == *chunk, "{what}: our read of chunk {i} differs from what we wrote");
    }
    drop(disk);
    check("after writes");
    let raw = dir.join("out.raw");
    run(Command::new(qemu_img())
        .args(["convert", "-f", fmt, "-O", "raw"])
        .arg(&path)
        .arg(&raw));
    assert_same(&raw, &shadow, &what);

    // And our own stack detects and reopens it, the same size.
    let again = ext4kit_vdisk::open_file(&path, &Default::default()).unwrap();
    assert_eq!(again.format(), format);
    assert_eq!(again.device().size(), created);
    fs::remove_dir_all(&dir).unwrap();
}

const SIZES: [u64; 3] = [MIB, 64 * MIB + 512, 3 << 30];

#[test]
fn qcow2_round_trips_through_qemu() {
    for size in SIZES {
        round_trip(DiskFormat::Qcow2, VhdSizing::default(), size);
    }
}

#[test]
fn vhd_by_geometry_round_trips_through_qemu() {
    for size in SIZES {
        round_trip(DiskFormat::Vhd, VhdSizing::Geometry, size);
    }
}

#[test]
fn vhd_of_exact_size_round_trips_through_qemu() {
    for size in SIZES {
        round_trip(DiskFormat::Vhd, VhdSizing::Exact, size);
    }
}

#[test]
fn vhdx_round_trips_through_qemu() {
    for size in SIZES {
        round_trip(DiskFormat::Vhdx, VhdSizing::default(), size);
    }
}

/// The VHD sizes qemu-img create picks are the sizes we pick: creating
/// the same request both ways gives the same virtual size.
#[test]
fn vhd_sizes_match_qemu_img_create() {
    let dir = tmpdir("vhd-sizes");
    for size in [MIB, 64 * MIB + 512, 3 << 30, 10_000 * MIB + 512, 200 << 30] {
        for (sizing, opt) in [
            (VhdSizing::Geometry, "force_size=off"),
            (VhdSizing::Exact, "force_size=on"),
        ] {
            let theirs = dir.join("theirs.vhd");
            let _ = fs::remove_file(&theirs);
            run(Command::new(qemu_img())
                .args(["create", "-q", "-f", "vpc", "-o", opt])
                .arg(&theirs)
                .arg(size.to_string()));
            let info = run(Command::new(qemu_img())
                .args(["info", "-f", "vpc", "--output=json"])
                .arg(&theirs));
            let ours = dir.join("ours.vhd");
            let _ = fs::remove_file(&ours);
            fs::File::create(&ours).unwrap();
            let mut req = CreateRequest::new(DiskFormat::Vhd, size);
            req.vhd_sizing = sizing;
            let disk = create(Arc::new(FileDevice::open(&ours, true).unwrap()), &req).unwrap();
            assert_eq!(disk.size(), virtual_size(&info), "{size} bytes, {opt}");
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn zero_and_oversized_disks_are_refused_before_anything_is_written() {
    let dir = tmpdir("refused");
    let path = dir.join("disk.img");
    for (format, too_big) in [
        (DiskFormat::Qcow2, (1u64 << 51) + 512),
        (DiskFormat::Vhd, 2040 * (1 << 30) + 512),
        (DiskFormat::Vhdx, (64u64 << 40) + 512),
    ] {
        for size in [0, too_big, u64::MAX] {
            fs::File::create(&path).unwrap();
            let file = Arc::new(FileDevice::open(&path, true).unwrap());
            let e = match create(file, &CreateRequest::new(format, size)) {
                Ok(_) => panic!("{format}: a disk of {size} bytes was created"),
                Err(e) => e,
            };
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{format} {size}: {e}");
            assert!(e.to_string().starts_with(format.name()), "{e}");
            assert_eq!(
                fs::metadata(&path).unwrap().len(),
                0,
                "{format} {size}: the file was written"
            );
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}
