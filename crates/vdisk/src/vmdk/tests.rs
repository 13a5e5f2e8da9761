//! Tests of the whole: layouts read back, writes against a shadow copy,
//! hostile images, descriptors naming files.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use ext4kit_blockdev::MemDevice;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

use super::file::{mem_file, ExtentFile};
use super::testimage::{build, sample_disk, Opts};
use super::*;

fn open_mem(img: Vec<u8>, writable: bool) -> io::Result<(VmdkDisk, Arc<MemDevice>)> {
    let (f, mem) = mem_file(img);
    let d = VmdkDisk::open_main(Arc::new(f), writable, &NamedFiles::none())?;
    Ok((d, mem))
}

fn read_all(d: &VmdkDisk, chunk: usize) -> Vec<u8> {
    let mut v = vec![0u8; d.size() as usize];
    for (i, c) in v.chunks_mut(chunk).enumerate() {
        d.read_at((i * chunk) as u64, c).unwrap();
    }
    v
}

fn layouts() -> Vec<Opts> {
    let mut v = Vec::new();
    for (grain, gtes) in [(1, 4), (8, 16), (128, 512), (8, 3)] {
        for rgd in [false, true] {
            v.push(Opts {
                grain,
                gtes,
                rgd,
                ..Opts::default()
            });
        }
    }
    v.push(Opts {
        zero_grain: true,
        lazy_gts: true,
        ..Opts::default()
    });
    v.push(Opts {
        stream: true,
        ..Opts::default()
    });
    v.push(Opts {
        stream: true,
        grain: 128,
        gtes: 512,
        descriptor: Some("# Disk DescriptorFile\ncreateType=\"streamOptimized\"\nRW 1000 SPARSE \"x.vmdk\"\n".into()),
        ..Opts::default()
    });
    v
}

#[test]
fn every_layout_reads_back_its_disk() {
    // 1000 sectors: not a whole number of grains or grain tables.
    let disk = sample_disk(1000, 7);
    for o in layouts() {
        let (img, _) = build(&disk, &o);
        let (d, _) = open_mem(img, false).unwrap();
        assert_eq!(d.size(), disk.len() as u64, "{o:?}");
        for chunk in [512, 4096, 3000, 1 << 20] {
            assert!(read_all(&d, chunk) == disk, "{o:?} chunk {chunk}");
        }
        let info = d.layer();
        let want = if o.stream {
            "streamOptimized"
        } else {
            "monolithicSparse"
        };
        assert_eq!(info.variant, want);
        assert!(info.details.iter().any(|(k, _)| k == "grain size"), "{info:?}");
    }
}

#[test]
fn writing_a_stream_is_refused_and_says_how_to_convert() {
    let (img, _) = build(
        &sample_disk(64, 1),
        &Opts {
            stream: true,
            ..Opts::default()
        },
    );
    let e = open_mem(img, true).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Unsupported);
    assert!(e.to_string().contains("streamOptimized images are read-only"), "{e}");
    assert!(e.to_string().contains("qemu-img convert"), "{e}");
}

#[test]
fn a_fixed_device_is_read_and_a_writable_sparse_on_it_is_refused_a_growable_one_written() {
    let disk = sample_disk(200, 3);
    let (img, _) = build(&disk, &Opts::default());
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_vec(img.clone()));
    let d = VmdkDisk::open(dev.clone(), false, &NamedFiles::none()).unwrap();
    assert!(read_all(&d, 4096) == disk);
    assert!(d.read_only());
    assert!(d.write_at(0, b"x").is_err());
    let e = VmdkDisk::open(dev, true, &NamedFiles::none()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Unsupported);
    assert!(e.to_string().contains("regular file"), "{e}");
    // A device that grows (BlockDevice::grows) takes new grains.
    let grows: Arc<dyn BlockDevice> = Arc::new(MemDevice::growable(img));
    let d = VmdkDisk::open(grows, true, &NamedFiles::none()).unwrap();
    d.write_at(4096 * 20, &[7u8; 4096]).unwrap();
    let mut back = [0u8; 4096];
    d.read_at(4096 * 20, &mut back).unwrap();
    assert_eq!(back, [7u8; 4096]);
}

#[test]
fn reads_past_the_end_are_eof() {
    let (img, _) = build(&sample_disk(16, 3), &Opts::default());
    let (d, _) = open_mem(img, false).unwrap();
    let mut b = [0u8; 10];
    assert_eq!(
        d.read_at(16 * 512 - 5, &mut b).unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
    assert_eq!(
        d.read_at(u64::MAX - 3, &mut b).unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
}

/// Random writes, flushes and reads against a shadow copy; then the file
/// reopened (and, through its redundant GD, reopened again) holds the
/// shadow.
fn writes_match_shadow(seed: u64, o: &Opts, ops: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sectors = 700;
    let mut shadow = sample_disk(sectors, seed);
    let (img, lay) = build(&shadow, o);
    let (d, f) = open_mem(img, true).unwrap();
    let size = shadow.len();
    for _ in 0..ops {
        let len = rng.random_range(1..=9000usize).min(size);
        let off = rng.random_range(0..=size - len);
        if rng.random_bool(0.7) {
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            d.write_at(off as u64, &data).unwrap();
            shadow[off..off + len].copy_from_slice(&data);
        } else {
            let mut b = vec![0u8; len];
            d.read_at(off as u64, &mut b).unwrap();
            assert!(b == shadow[off..off + len], "read at {off}+{len}");
        }
        if rng.random_bool(0.1) {
            d.flush().unwrap();
        }
    }
    d.flush().unwrap();
    assert!(read_all(&d, 4096) == shadow);
    drop(d);
    let bytes = f.to_vec();
    let (again, _) = open_mem(bytes.clone(), false).unwrap();
    assert!(read_all(&again, 8192) == shadow, "reopened");
    if o.rgd {
        // The redundant GD and GTs were kept in step: read through them.
        let mut swapped = bytes;
        swapped[56..64].copy_from_slice(&lay.rgd.to_le_bytes());
        let (r, _) = open_mem(swapped, false).unwrap();
        assert!(read_all(&r, 8192) == shadow, "through the redundant GD");
    }
}

#[test]
fn random_writes_match_a_shadow_in_every_writable_layout() {
    for (i, o) in layouts().into_iter().filter(|o| !o.stream).enumerate() {
        writes_match_shadow(i as u64 + 11, &o, 150);
    }
    // Grain tables allocated as grains are first written (GDE 0).
    writes_match_shadow(
        99,
        &Opts {
            lazy_gts: true,
            zero_grain: true,
            rgd: true,
            ..Opts::default()
        },
        150,
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn prop_random_writes_match_a_shadow(seed in any::<u64>(), lazy in any::<bool>(), rgd in any::<bool>(), gtes in 1u32..40) {
        writes_match_shadow(seed, &Opts { lazy_gts: lazy, rgd, gtes, zero_grain: lazy, ..Opts::default() }, 60);
    }
}

#[test]
fn table_entries_reach_the_file_only_at_flush() {
    let (img, _) = build(&vec![0u8; 64 * 512], &Opts::default());
    let (d, f) = open_mem(img, true).unwrap();
    d.write_at(5000, b"hello").unwrap();
    let mut b = [0u8; 5];
    d.read_at(5000, &mut b).unwrap();
    assert_eq!(&b, b"hello");
    // Before the flush the file's tables still say "never written": a
    // crash now loses the write but never shows garbage.
    let (before, _) = open_mem(f.to_vec(), false).unwrap();
    before.read_at(5000, &mut b).unwrap();
    assert_eq!(b, [0; 5]);
    d.flush().unwrap();
    let (after, _) = open_mem(f.to_vec(), false).unwrap();
    after.read_at(5000, &mut b).unwrap();
    assert_eq!(&b, b"hello");
}

#[test]
fn threads_write_and_read_at_once() {
    let sectors = 2048;
    let (img, _) = build(
        &vec![0u8; sectors * 512],
        &Opts {
            lazy_gts: true,
            ..Opts::default()
        },
    );
    let (d, f) = open_mem(img, true).unwrap();
    let d = Arc::new(d);
    let per = sectors * 512 / 4;
    std::thread::scope(|s| {
        for t in 0..4usize {
            let d = d.clone();
            s.spawn(move || {
                for i in 0..per / 1000 {
                    let off = (t * per + i * 1000) as u64;
                    let data = vec![(t * 31 + i) as u8 | 1; 1000];
                    d.write_at(off, &data).unwrap();
                    let mut b = vec![0u8; 1000];
                    d.read_at(off, &mut b).unwrap();
                    assert_eq!(b, data);
                    if i % 50 == 0 {
                        d.flush().unwrap();
                    }
                }
            });
        }
    });
    d.flush().unwrap();
    let (again, _) = open_mem(f.to_vec(), false).unwrap();
    for t in 0..4usize {
        for i in 0..per / 1000 {
            let mut b = vec![0u8; 1000];
            again.read_at((t * per + i * 1000) as u64, &mut b).unwrap();
            assert!(b.iter().all(|&x| x == (t * 31 + i) as u8 | 1), "thread {t} write {i}");
        }
    }
}

fn read_everything(d: &VmdkDisk) -> io::Result<()> {
    let mut b = vec![0u8; 4096];
    let mut off = 0;
    while off < d.size() {
        let n = (d.size() - off).min(4096) as usize;
        d.read_at(off, &mut b[..n])?;
        off += n as u64;
    }
    Ok(())
}

fn expect_corrupt(img: Vec<u8>, want: &str) {
    let r = open_mem(img, false).and_then(|(d, _)| read_everything(&d));
    let e = r.expect_err(want);
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{want}: {e}");
    assert!(e.to_string().contains(want), "{want}: {e}");
    assert!(e.to_string().starts_with("vmdk: "), "{e}");
}

#[test]
fn corrupt_tables_are_clear_errors() {
    let disk = sample_disk(256, 5);
    let o = Opts::default();
    let (img, lay) = build(&disk, &o);
    let gd = (lay.gd * 512) as usize;
    let gt = (lay.gts[0] * 512) as usize;
    let len = img.len() as u32;

    let mut v = img.clone();
    v[gd..gd + 4].copy_from_slice(&(len / 512 + 10).to_le_bytes());
    expect_corrupt(v, "past the end of the file");
    let mut v = img.clone();
    v[gd..gd + 4].copy_from_slice(&(lay.gd as u32).to_le_bytes());
    expect_corrupt(v, "inside a grain directory");
    let mut v = img.clone();
    v[gt..gt + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    expect_corrupt(v, "past the end of the file");
    // A grain in the header sector (GTE 1 without the zeroed-grain flag).
    let (zimg, zlay) = build(
        &disk,
        &Opts {
            rgd: false,
            ..o.clone()
        },
    );
    let mut v = zimg;
    let zgt = (zlay.gts[0] * 512) as usize;
    v[zgt..zgt + 4].copy_from_slice(&0u32.to_le_bytes());
    v[zgt + 4..zgt + 8].copy_from_slice(&1u32.to_le_bytes());
    open_mem(v, false).and_then(|(d, _)| read_everything(&d)).unwrap();

    // Truncated anywhere: an error, or (past the last table) a read error.
    for cut in [
        0,
        100,
        511,
        512,
        1024,
        gd,
        gd + 2,
        gt + 100,
        img.len() - 1000,
        img.len() - 1,
    ] {
        let r = open_mem(img[..cut].to_vec(), false).and_then(|(d, _)| read_everything(&d));
        let e = r.expect_err("truncated");
        assert!(
            matches!(e.kind(), io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof),
            "cut {cut}: {e}"
        );
    }
}

#[test]
fn corrupt_streams_are_clear_errors() {
    let disk = sample_disk(256, 9);
    let o = Opts {
        stream: true,
        ..Opts::default()
    };
    let (img, lay) = build(&disk, &o);
    let n = img.len();
    let mut v = img.clone();
    v[n - 1024 + 56..n - 1024 + 64].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_corrupt(v, "GD_AT_END too");
    let mut v = img.clone();
    v[n - 512 + 12] = 9;
    expect_corrupt(v, "end-of-stream");
    let mut v = img.clone();
    v[n - 1536 + 12] = 1;
    expect_corrupt(v, "footer marker");
    let g = (lay.grains[0] * 512) as usize;
    let mut v = img.clone();
    v[g + 8..g + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    expect_corrupt(v, "absurd");
    let mut v = img.clone();
    v[g..g + 8].copy_from_slice(&12345u64.to_le_bytes());
    expect_corrupt(v, "marker says");
    let mut v = img.clone();
    v[g + 14..g + 40].fill(0xaa);
    expect_corrupt(v, "compressed grain");
}

#[test]
fn random_damage_never_panics_or_hangs() {
    let disk = sample_disk(300, 13);
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    for o in layouts() {
        let (img, _) = build(&disk, &o);
        for _ in 0..60 {
            let mut v = img.clone();
            for _ in 0..rng.random_range(1..8) {
                // Mostly the header and tables, sometimes anywhere.
                let at = if rng.random_bool(0.7) {
                    rng.random_range(0..v.len().min(16 * 512))
                } else {
                    rng.random_range(0..v.len())
                };
                v[at] = rng.random();
            }
            if rng.random_bool(0.2) {
                let cut = rng.random_range(0..v.len());
                v.truncate(cut);
            }
            if let Ok((d, _)) = open_mem(v, false) {
                let _ = read_everything(&d);
            }
        }
    }
}

// Descriptor files naming extents on disk.

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ext4kit-vmdk-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn open_desc(dir: &std::path::Path, name: &str, text: &str, writable: bool) -> io::Result<VmdkDisk> {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    VmdkDisk::open_path(&p, writable, &NamedFiles::beside(&p, false))
}

#[test]
fn a_descriptor_of_sparse_flat_and_zero_extents() {
    let dir = tmpdir("mixed");
    let a = sample_disk(100, 1);
    let b = sample_disk(50, 2);
    std::fs::write(dir.join("a.vmdk"), build(&a, &Opts::default()).0).unwrap();
    let mut flat = vec![0xeeu8; 10 * 512];
    flat.extend_from_slice(&b);
    std::fs::write(dir.join("b-flat.vmdk"), &flat).unwrap();
    let text = "# Disk DescriptorFile\nversion=1\nCID=1\nparentCID=ffffffff\ncreateType=\"custom\"\n\
        RW 100 SPARSE \"a.vmdk\"\nRW 50 FLAT \"b-flat.vmdk\" 10\nRW 0 ZERO\nRDONLY 30 ZERO\n";
    let d = open_desc(&dir, "d.vmdk", text, false).unwrap();
    let mut want = a.clone();
    want.extend_from_slice(&b);
    want.extend_from_slice(&[0u8; 30 * 512]);
    assert_eq!(d.size(), want.len() as u64);
    assert!(read_all(&d, 3000) == want);
    let info = d.layer();
    assert_eq!(info.variant, "custom");
    assert_eq!(info.details[0], ("extents".to_string(), "3".to_string()));
    // A ZERO or RDONLY extent cannot take writes.
    let e = open_desc(&dir, "d.vmdk", text, true).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
    // Without them, the disk is writable: sparse grains and flat in place.
    let text =
        "# Disk DescriptorFile\ncreateType=\"custom\"\nRW 100 SPARSE \"a.vmdk\"\nRW 50 FLAT \"b-flat.vmdk\" 10\n";
    let d = open_desc(&dir, "w.vmdk", text, true).unwrap();
    let data = vec![0x5au8; 20_000];
    d.write_at(100 * 512 - 10_000, &data).unwrap();
    d.flush().unwrap();
    drop(d);
    let d = open_desc(&dir, "w.vmdk", text, false).unwrap();
    let mut got = vec![0u8; 20_000];
    d.read_at(100 * 512 - 10_000, &mut got).unwrap();
    assert_eq!(got, data);
    let flat_now = std::fs::read(dir.join("b-flat.vmdk")).unwrap();
    assert!(
        flat_now[..10 * 512].iter().all(|&x| x == 0xee),
        "the bytes before the offset are untouched"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn descriptors_that_name_themselves_each_other_or_a_file_twice_are_refused() {
    let dir = tmpdir("cycles");
    std::fs::write(dir.join("s.vmdk"), build(&sample_disk(64, 1), &Opts::default()).0).unwrap();
    std::fs::write(dir.join("f.raw"), vec![0u8; 64 * 512]).unwrap();
    let head = "# Disk DescriptorFile\ncreateType=\"custom\"\n";
    let cases = [
        ("self.vmdk", format!("{head}RW 1 FLAT \"self.vmdk\"\n"), "descriptor"),
        (
            "selfs.vmdk",
            format!("{head}RW 1 SPARSE \"selfs.vmdk\"\n"),
            "no sparse extent magic",
        ),
        (
            "twice.vmdk",
            format!("{head}RW 64 SPARSE \"s.vmdk\"\nRW 64 SPARSE \"./s.vmdk\"\n"),
            "both use",
        ),
        (
            "overlap.vmdk",
            format!("{head}RW 40 FLAT \"f.raw\" 0\nRW 40 FLAT \"f.raw\" 20\n"),
            "both use",
        ),
        ("big.vmdk", format!("{head}RW 65 SPARSE \"s.vmdk\"\n"), "capacity"),
        ("short.vmdk", format!("{head}RW 64 FLAT \"f.raw\" 1\n"), "the file has"),
        ("huge.vmdk", format!("{head}RW 18446744073709551615 ZERO\n"), "absurd"),
        (
            "sum.vmdk",
            format!("{head}RW 18014398509481983 ZERO\nRW 18014398509481983 ZERO\n"),
            "overflows",
        ),
        ("none.vmdk", head.to_string(), "no extents"),
        (
            "notype.vmdk",
            "# Disk DescriptorFile\nRW 1 ZERO\n".to_string(),
            "no createType",
        ),
    ];
    for (name, text, want) in cases {
        let e = open_desc(&dir, name, &text, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{name}: {e}");
        assert!(e.to_string().contains(want), "{name}: {e}");
    }
    // Two descriptors naming each other: each is refused as data.
    std::fs::write(dir.join("b.vmdk"), format!("{head}RW 1 FLAT \"a.vmdk\"\n")).unwrap();
    let e = open_desc(&dir, "a.vmdk", &format!("{head}RW 1 FLAT \"b.vmdk\"\n"), false).unwrap_err();
    assert!(e.to_string().contains("descriptor"), "{e}");
    // Non-overlapping runs of one flat file are fine.
    let ok = open_desc(
        &dir,
        "ok.vmdk",
        &format!("{head}RW 20 FLAT \"f.raw\" 0\nRW 20 FLAT \"f.raw\" 20\n"),
        false,
    );
    assert_eq!(ok.unwrap().size(), 40 * 512);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn names_outside_the_directory_devices_parents_and_raw_devices_are_refused() {
    let dir = tmpdir("policy");
    let head = "# Disk DescriptorFile\ncreateType=\"custom\"\n";
    for (text, kind) in [
        (
            format!("{head}RW 1 FLAT \"/dev/zero\"\n"),
            io::ErrorKind::PermissionDenied,
        ),
        (
            format!("{head}RW 1 FLAT \"/etc/hostname\"\n"),
            io::ErrorKind::PermissionDenied,
        ),
        // A name that cannot exist (not "../x": a /tmp/x someone made would
        // turn this into a refusal for being outside the directory).
        (
            format!("{head}RW 1 FLAT \"../ext4kit-no-such-extent-{}\"\n", std::process::id()),
            io::ErrorKind::NotFound,
        ),
        (
            format!("{head}RW 1 FLAT \"nbd:host:1\"\n"),
            io::ErrorKind::PermissionDenied,
        ),
        (
            format!("{head}RW 1 VMFSRDM \"x-rdm.vmdk\"\n"),
            io::ErrorKind::Unsupported,
        ),
        (
            format!("{head}RW 1 SESPARSE \"x-sesparse.vmdk\"\n"),
            io::ErrorKind::Unsupported,
        ),
        (
            format!("{head}parentCID=12345678\nRW 1 ZERO\n"),
            io::ErrorKind::Unsupported,
        ),
        (
            "# Disk DescriptorFile\ncreateType=\"fullDevice\"\nRW 1 FLAT \"/dev/sda\" 0\n".into(),
            io::ErrorKind::Unsupported,
        ),
    ] {
        let e = open_desc(&dir, "p.vmdk", &text, false).unwrap_err();
        assert_eq!(e.kind(), kind, "{text}: {e}");
    }
    // The embedded descriptor of a delta disk is honoured too.
    let (img, _) = build(
        &sample_disk(64, 1),
        &Opts {
            descriptor: Some("# Disk DescriptorFile\nparentCID=abcdef01\ncreateType=\"monolithicSparse\"\n".into()),
            ..Opts::default()
        },
    );
    assert_eq!(open_mem(img, false).unwrap_err().kind(), io::ErrorKind::Unsupported);
    // A file that is neither a sparse extent nor a descriptor.
    let e = open_mem(vec![0u8; 4096], false).unwrap_err();
    assert!(e.to_string().contains("neither"), "{e}");
    let e = open_mem(Vec::new(), false).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_descriptor_megabytes_long_is_refused_without_reading_it() {
    let mut text = b"# Disk DescriptorFile\ncreateType=\"".to_vec();
    text.resize(3 << 20, b'x');
    let e = open_mem(text, false).unwrap_err();
    assert!(e.to_string().contains("larger than"), "{e}");
}

#[test]
fn the_extent_file_len_grows_with_appends() {
    let (f, _) = mem_file(vec![0; 512]);
    f.write_at(1024, b"abc").unwrap();
    assert_eq!(f.len(), 1027);
}

#[test]
fn a_cowd_extent_reads_and_refuses_writes() {
    // COWDisk_Header: 64 sectors of 1-sector grains; GD at sector 1 (one
    // GDE), its GT of 4096 entries at sector 2, grains from sector 34.
    let mut v = vec![0u8; 34 * 512];
    v[..4].copy_from_slice(b"COWD");
    v[4..8].copy_from_slice(&1u32.to_le_bytes());
    v[12..16].copy_from_slice(&64u32.to_le_bytes());
    v[16..20].copy_from_slice(&1u32.to_le_bytes());
    v[20..24].copy_from_slice(&1u32.to_le_bytes());
    v[24..28].copy_from_slice(&1u32.to_le_bytes());
    v[512..516].copy_from_slice(&2u32.to_le_bytes());
    let mut want = vec![0u8; 64 * 512];
    for (k, grain) in [3usize, 10, 63].into_iter().enumerate() {
        let sector = 34 + k as u32;
        v[1024 + grain * 4..1024 + grain * 4 + 4].copy_from_slice(&sector.to_le_bytes());
        v.extend_from_slice(&[grain as u8 + 1; 512]);
        want[grain * 512..(grain + 1) * 512].fill(grain as u8 + 1);
    }
    let (d, _) = open_mem(v.clone(), false).unwrap();
    assert_eq!(d.layer().variant, "vmfsSparse");
    assert!(read_all(&d, 1536) == want);
    assert_eq!(open_mem(v, true).unwrap_err().kind(), io::ErrorKind::Unsupported);
}

#[test]
fn a_grain_inside_the_tables_is_read_but_never_written() {
    let disk = sample_disk(64, 21);
    let (mut img, lay) = build(&disk, &Opts::default());
    // GTE 0 (and its redundant copy) point at sector 2: the tables.
    let gt = (lay.gts[0] * 512) as usize;
    img[gt..gt + 4].copy_from_slice(&2u32.to_le_bytes());
    let (d, f) = open_mem(img, true).unwrap();
    let mut b = [0u8; 16];
    d.read_at(0, &mut b).unwrap();
    let before = f.to_vec();
    let e = d.write_at(100, b"overwrite the tables").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    assert!(e.to_string().contains("lies in the header or the tables"), "{e}");
    assert!(f.to_vec() == before, "nothing was written");
}
