//! qcow2 and VHD against qemu-img, the reference implementation: images
//! qemu-img converts from one raw ext4 image read back byte for byte as
//! the raw image (zlib and zstd compressed clusters included, in backing
//! chains too); what we write, qemu-img checks clean and converts back
//! to exactly our bytes; a backing file never changes; names an image
//! holds are followed only as allowed.
//!
//! Needs qemu-img and qemu-io (Debian qemu-utils) and mke2fs; without them the tests
//! fail and say so.

use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit_vdisk::{open_file, BlockDevice, DiskFormat, DiskRequest};
use rand::{Rng, SeedableRng};

const MIB: usize = 1 << 20;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {cmd:?}: {e} (install qemu-utils and e2fsprogs: apt-get install qemu-utils e2fsprogs)")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn qemu_img(args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let mut c = Command::new("qemu-img");
    for a in args {
        c.arg(a);
    }
    run(&mut c)
}

/// A scratch directory with a 64 MiB raw ext4 image holding a few files.
struct Work {
    dir: PathBuf,
    raw: PathBuf,
}

impl Work {
    fn new(tag: &str) -> Work {
        let dir = std::env::temp_dir().join(format!("ext4kit-vdisk-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("tree/sub")).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for i in 0..20 {
            let len = rng.random_range(0..300_000);
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            std::fs::write(dir.join(format!("tree/sub/f{i}")), data).unwrap();
        }
        let raw = dir.join("raw.img");
        run(Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-d"])
            .arg(dir.join("tree"))
            .arg(&raw)
            .arg("64M"));
        Work { dir, raw }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read_all(dev: &dyn BlockDevice) -> Vec<u8> {
    let mut v = vec![0u8; dev.size() as usize];
    for (k, chunk) in v.chunks_mut(4 * MIB).enumerate() {
        dev.read_at((k * 4 * MIB) as u64, chunk).unwrap();
    }
    v
}

/// `disk` holds `raw` and, past its end (a VHD's size rounds up to its
/// geometry), only zeros.
fn assert_same_disk(what: &str, disk: &[u8], raw: &[u8]) {
    assert!(
        disk.len() >= raw.len(),
        "{what}: {} bytes, the raw image {}",
        disk.len(),
        raw.len()
    );
    if let Some(i) = disk.iter().zip(raw).position(|(a, b)| a != b) {
        panic!("{what}: differs from the raw image first at byte {i}");
    }
    assert!(
        disk[raw.len()..].iter().all(|&b| b == 0),
        "{what}: nonzero bytes past the raw image's end"
    );
}

fn open(path: &Path, writable: bool) -> ext4kit_vdisk::Disk {
    open_file(
        path,
        &DiskRequest {
            writable,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_conversion_reads_as_the_raw_image() {
    let w = Work::new("read");
    let raw = std::fs::read(&w.raw).unwrap();
    let zstd = ["-c", "-O", "qcow2", "-o", "compression_type=zstd"];
    let cases: [(&str, &[&str], DiskFormat, &str); 10] = [
        ("v3.qcow2", &["-O", "qcow2"], DiskFormat::Qcow2, "v3"),
        (
            "v2.qcow2",
            &["-O", "qcow2", "-o", "compat=0.10"],
            DiskFormat::Qcow2,
            "v2",
        ),
        ("zlib.qcow2", &["-O", "qcow2", "-c"], DiskFormat::Qcow2, "v3"),
        ("zstd.qcow2", &zstd, DiskFormat::Qcow2, "v3"),
        // The compressed cluster descriptor's split moves with cluster_bits.
        (
            "zstd-512.qcow2",
            &["-c", "-O", "qcow2", "-o", "compression_type=zstd,cluster_size=512"],
            DiskFormat::Qcow2,
            "v3",
        ),
        (
            "zstd-4k.qcow2",
            &["-c", "-O", "qcow2", "-o", "compression_type=zstd,cluster_size=4096"],
            DiskFormat::Qcow2,
            "v3",
        ),
        (
            "zstd-2m.qcow2",
            &["-c", "-O", "qcow2", "-o", "compression_type=zstd,cluster_size=2M"],
            DiskFormat::Qcow2,
            "v3",
        ),
        (
            "small-clusters.qcow2",
            &["-O", "qcow2", "-o", "cluster_size=4096"],
            DiskFormat::Qcow2,
            "v3",
        ),
        ("dynamic.vhd", &["-O", "vpc"], DiskFormat::Vhd, "dynamic"),
        (
            "fixed.vhd",
            &["-O", "vpc", "-o", "subformat=fixed"],
            DiskFormat::Vhd,
            "fixed",
        ),
    ];
    for (name, args, format, variant) in cases {
        let out = w.path(name);
        let mut c = Command::new("qemu-img");
        c.arg("convert").args(args).arg(&w.raw).arg(&out);
        run(&mut c);
        let d = open(&out, false);
        assert_eq!(d.format(), format, "{name}");
        assert_eq!(d.layer().unwrap().variant, variant, "{name}");
        assert_same_disk(name, &read_all(&**d.device()), &raw);
        // qemu's own idea of the virtual size.
        // -f: qemu probes a fixed VHD (no footer copy in sector 0) as raw.
        let fmt = if format == DiskFormat::Vhd { "vpc" } else { "qcow2" };
        let info = qemu_img(&[&"info", &"-f", &fmt, &"--output=json", &out]);
        let vsize: u64 = info
            .split("\"virtual-size\":")
            .nth(1)
            .and_then(|s| s.trim_start().split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no virtual-size in {info}"));
        assert_eq!(d.device().size(), vsize, "{name}: our size vs qemu-img info");
    }
}

/// `path`'s layer facts hold `key` = `value`.
fn assert_fact(path: &Path, key: &str, value: &str) {
    let facts = open(path, false).layer().unwrap().details.clone();
    assert!(
        facts.iter().any(|(k, v)| k == key && v == value),
        "{}: no {key} = {value} in {facts:?}",
        path.display()
    );
}

#[test]
fn zstd_images_read_but_refuse_to_open_writable() {
    let w = Work::new("zstd");
    let raw = std::fs::read(&w.raw).unwrap();
    let out = w.path("z.qcow2");
    run(Command::new("qemu-img")
        .args(["convert", "-c", "-O", "qcow2", "-o", "compression_type=zstd"])
        .arg(&w.raw)
        .arg(&out));
    assert_fact(&out, "compression", "zstd");
    assert_same_disk("z.qcow2", &read_all(&**open(&out, false).device()), &raw);
    let before = std::fs::read(&out).unwrap();
    let e = open_file(
        &out,
        &DiskRequest {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("zstd") && text.contains("read-only") && text.contains("z.qcow2"),
        "{text}"
    );
    assert!(std::fs::read(&out).unwrap() == before, "the refused image changed");
}

/// Make `path` a zstd qcow2 over `backing` (format `fmt`) holding, per
/// `changes`, three kinds of cluster written by qemu-io: compressed (2 MiB
/// of text at 1 MiB), plain (1 MiB of noise 5 MiB before the end) and
/// zero (64 KiB at `changes.zero_at`); the rest is the backing file's.
fn zstd_overlay(w: &Work, path: &Path, backing: &str, fmt: &str, changes: &Changes) {
    qemu_img(&[
        &"create",
        &"-q",
        &"-f",
        &"qcow2",
        &"-o",
        &"compression_type=zstd",
        &"-b",
        &backing,
        &"-F",
        &fmt,
        &path,
    ]);
    let text = w.path("text.bin");
    let noise = w.path("noise.bin");
    std::fs::write(&text, &changes.text).unwrap();
    std::fs::write(&noise, &changes.noise).unwrap();
    run(Command::new("qemu-io")
        .args(["-f", "qcow2"])
        .arg("-c")
        .arg(format!(
            "write -q -c -s {} {} {}",
            text.display(),
            MIB,
            changes.text.len()
        ))
        .arg("-c")
        .arg(format!(
            "write -q -s {} {} {}",
            noise.display(),
            changes.noise_at,
            changes.noise.len()
        ))
        .arg("-c")
        .arg(format!("write -q -z {} 65536", changes.zero_at))
        .arg(path));
}

/// What [`zstd_overlay`] writes over the raw image.
struct Changes {
    text: Vec<u8>,
    noise: Vec<u8>,
    noise_at: usize,
    zero_at: usize,
}

impl Changes {
    fn new(raw: &[u8]) -> Changes {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let text = (0..2 * MIB).map(|i| b"qcow2 zstd chain\n"[i % 17]).collect();
        let mut noise = vec![0u8; MIB];
        rng.fill(&mut noise[..]);
        // A cluster the raw image has data in, so reading zeros there is
        // the zero flag's doing.
        let zero_at = (64..raw.len() / 65536 - 80)
            .map(|c| c * 65536)
            .find(|&o| raw[o..o + 65536].iter().any(|&b| b != 0))
            .expect("the raw image has data past 4 MiB");
        Changes {
            text,
            noise,
            noise_at: raw.len() - 5 * MIB,
            zero_at,
        }
    }

    fn apply(&self, raw: &[u8]) -> Vec<u8> {
        let mut v = raw.to_vec();
        v[MIB..3 * MIB].copy_from_slice(&self.text);
        v[self.noise_at..self.noise_at + MIB].copy_from_slice(&self.noise);
        v[self.zero_at..self.zero_at + 65536].fill(0);
        v
    }
}

#[test]
fn zstd_images_in_backing_chains_read_as_qemu_reads_them() {
    let w = Work::new("zstd-chain");
    let raw = std::fs::read(&w.raw).unwrap();
    let changes = Changes::new(&raw);
    let changed = changes.apply(&raw);
    // base (zstd) <- mid (zstd, only the changes) <- top (zlib, empty),
    // and a zstd image over a raw backing file.
    let base = w.path("base.qcow2");
    let mid = w.path("mid.qcow2");
    let top = w.path("top.qcow2");
    let over_raw = w.path("over-raw.qcow2");
    qemu_img(&[
        &"convert",
        &"-c",
        &"-O",
        &"qcow2",
        &"-o",
        &"compression_type=zstd",
        &w.raw,
        &base,
    ]);
    zstd_overlay(&w, &mid, "base.qcow2", "qcow2", &changes);
    zstd_overlay(&w, &over_raw, "raw.img", "raw", &changes);
    qemu_img(&[
        &"create",
        &"-q",
        &"-f",
        &"qcow2",
        &"-b",
        &"mid.qcow2",
        &"-F",
        &"qcow2",
        &top,
    ]);
    assert_fact(&mid, "backing file", "base.qcow2");
    assert_fact(&mid, "compression", "zstd");
    for (name, path) in [("mid.qcow2", &mid), ("top.qcow2", &top), ("over-raw.qcow2", &over_raw)] {
        // qemu-img's own reading of the chain is the expected disk.
        let theirs = w.path(&format!("{name}.raw"));
        qemu_img(&[&"convert", &"-O", &"raw", path, &theirs]);
        assert!(
            std::fs::read(&theirs).unwrap() == changed,
            "{name}: qemu-img reads another disk"
        );
        std::fs::remove_file(&theirs).unwrap();
        assert_same_disk(name, &read_all(&**open(path, false).device()), &changed);
    }
    // The zlib top over zstd files is writable: writes land in the top.
    let (base_before, mid_before) = (std::fs::read(&base).unwrap(), std::fs::read(&mid).unwrap());
    write_and_check("top.qcow2", &top, &changed, "qcow2", 5);
    assert!(std::fs::read(&base).unwrap() == base_before, "base.qcow2 changed");
    assert!(std::fs::read(&mid).unwrap() == mid_before, "mid.qcow2 changed");
    // Names a zstd image holds pass the same gate as imago's.
    let inner = w.path("inner");
    std::fs::create_dir_all(&inner).unwrap();
    let up = inner.join("up.qcow2");
    zstd_overlay(&w, &up, "../base.qcow2", "qcow2", &changes);
    let e = open_file(&up, &DiskRequest::default()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    let any = DiskRequest {
        any_backing_path: true,
        ..Default::default()
    };
    let d = open_file(&up, &any).unwrap();
    assert_same_disk("inner/up.qcow2", &read_all(&**d.device()), &changed);
}

/// Random writes through our device, mirrored in a shadow copy; then
/// qemu-img check and qemu-img's conversion back to raw must agree.
fn write_and_check(name: &str, path: &Path, raw: &[u8], fmt: &str, seed: u64) {
    let mut shadow = raw.to_vec();
    {
        let d = open(path, true);
        let dev = d.device();
        shadow.resize(dev.size() as usize, 0);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for k in 0..200 {
            let off = rng.random_range(0..shadow.len());
            let len = rng.random_range(1..=(shadow.len() - off).min(if k % 10 == 0 { 3 * MIB } else { 70_000 }));
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            dev.write_at(off as u64, &data).unwrap();
            shadow[off..off + len].copy_from_slice(&data);
            if k % 40 == 0 {
                dev.flush().unwrap();
            }
        }
        dev.flush().unwrap();
        assert!(
            read_all(&**dev) == shadow,
            "{name}: reads back differently before close"
        );
    }
    // qemu-img checks qcow2; it has no check for vpc.
    if fmt == "qcow2" {
        let out = Command::new("qemu-img")
            .args(["check", "-f", fmt])
            .arg(path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: qemu-img check: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let back = path.with_extension("back.raw");
    qemu_img(&[&"convert", &"-f", &fmt, &"-O", &"raw", &path, &back]);
    let theirs = std::fs::read(&back).unwrap();
    assert_eq!(theirs.len(), shadow.len(), "{name}: qemu-img's raw size");
    if let Some(i) = theirs.iter().zip(&shadow).position(|(a, b)| a != b) {
        panic!("{name}: qemu-img reads our writes differently, first at byte {i}");
    }
}

#[test]
fn our_writes_check_clean_and_convert_back_exactly() {
    let w = Work::new("write");
    let raw = std::fs::read(&w.raw).unwrap();
    for (k, (name, args, fmt)) in [
        ("w.qcow2", &["-O", "qcow2"][..], "qcow2"),
        (
            "w-small.qcow2",
            &["-O", "qcow2", "-o", "cluster_size=4096"][..],
            "qcow2",
        ),
        ("w-zlib.qcow2", &["-O", "qcow2", "-c"][..], "qcow2"),
        ("w-dynamic.vhd", &["-O", "vpc"][..], "vpc"),
        ("w-fixed.vhd", &["-O", "vpc", "-o", "subformat=fixed"][..], "vpc"),
    ]
    .into_iter()
    .enumerate()
    {
        let out = w.path(name);
        run(Command::new("qemu-img").arg("convert").args(args).arg(&w.raw).arg(&out));
        write_and_check(name, &out, &raw, fmt, k as u64);
    }
}

#[test]
fn writes_land_in_the_top_file_and_the_backing_file_is_untouched() {
    let w = Work::new("backing");
    let raw = std::fs::read(&w.raw).unwrap();
    let base = w.path("base.qcow2");
    let top = w.path("top.qcow2");
    qemu_img(&[&"convert", &"-O", &"qcow2", &w.raw, &base]);
    qemu_img(&[
        &"create",
        &"-q",
        &"-f",
        &"qcow2",
        &"-b",
        &"base.qcow2",
        &"-F",
        &"qcow2",
        &top,
    ]);
    let before = std::fs::read(&base).unwrap();
    {
        let d = open(&top, false);
        assert_same_disk("top over base", &read_all(&**d.device()), &raw);
        let facts = &d.layer().unwrap().details;
        assert!(
            facts.iter().any(|(k, v)| k == "backing file" && v == "base.qcow2"),
            "{facts:?}"
        );
    }
    write_and_check("top.qcow2", &top, &raw, "qcow2", 99);
    assert!(std::fs::read(&base).unwrap() == before, "the backing file changed");
}

#[test]
fn backing_names_outside_the_directory_or_devices_are_refused() {
    let w = Work::new("hostile-backing");
    std::fs::create_dir_all(w.path("inner")).unwrap();
    qemu_img(&[&"convert", &"-O", &"qcow2", &w.raw, &w.path("outside.qcow2")]);
    for (name, backing, fmt) in [
        ("shadow.qcow2", "/etc/shadow", "raw"),
        ("dev.qcow2", "/dev/null", "raw"),
        ("up.qcow2", "../outside.qcow2", "qcow2"),
    ] {
        let p = w.path("inner").join(name);
        // -u: write the name without opening it.
        qemu_img(&[
            &"create", &"-q", &"-f", &"qcow2", &"-u", &"-b", &backing, &"-F", &fmt, &p, &"64M",
        ]);
        let e = open_file(&p, &DiskRequest::default()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{name}: {e}");
        assert!(e.to_string().contains(backing), "{name}: {e}");
    }
    // Allowed when the user says so: the file outside (never a device).
    let up = w.path("inner/up.qcow2");
    let any = DiskRequest {
        any_backing_path: true,
        ..Default::default()
    };
    assert!(open_file(&up, &any).is_ok());
    assert!(open_file(&w.path("inner/dev.qcow2"), &any).is_err());
}

#[test]
fn a_backing_chain_that_cycles_is_an_error() {
    let w = Work::new("cycle");
    let a = w.path("a.qcow2");
    let b = w.path("b.qcow2");
    qemu_img(&[&"create", &"-q", &"-f", &"qcow2", &a, &"64M"]);
    qemu_img(&[
        &"create", &"-q", &"-f", &"qcow2", &"-u", &"-b", &"a.qcow2", &"-F", &"qcow2", &b, &"64M",
    ]);
    qemu_img(&[
        &"rebase", &"-q", &"-u", &"-f", &"qcow2", &"-b", &"b.qcow2", &"-F", &"qcow2", &a,
    ]);
    let t = std::time::Instant::now();
    let e = open_file(&b, &DiskRequest::default()).unwrap_err();
    assert!(t.elapsed().as_secs() < 10);
    assert!(e.to_string().contains("comes back"), "{e}");
}

#[test]
fn a_backing_chain_longer_than_64_files_is_an_error() {
    let w = Work::new("long-chain");
    qemu_img(&[&"create", &"-q", &"-f", &"qcow2", &w.path("c0.qcow2"), &"1M"]);
    for i in 1..=65 {
        let base = format!("c{}.qcow2", i - 1);
        let top = w.path(&format!("c{i}.qcow2"));
        qemu_img(&[
            &"create", &"-q", &"-f", &"qcow2", &"-u", &"-b", &base, &"-F", &"qcow2", &top, &"1M",
        ]);
    }
    // 64 files in all (c63 over c0) open; 65 (c64) and more do not.
    assert!(open_file(&w.path("c63.qcow2"), &DiskRequest::default()).is_ok());
    let e = open_file(&w.path("c64.qcow2"), &DiskRequest::default()).unwrap_err();
    assert!(e.to_string().contains("longer than 64"), "{e}");
}
