use std::path::PathBuf;

use ext4kit_blockdev::{FileDevice, MemDevice};
use rand::{Rng, SeedableRng};

use super::dynamic::tests::header;
use super::footer::tests::footer;
use super::*;

const MIB: u64 = 1 << 20;

fn tmp(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ext4kit-vdisk-vhd-{tag}-{}", std::process::id()))
}

/// An empty dynamic VHD as qemu lays one out: footer copy, header at 512,
/// BAT at 1536 (padded to a sector), footer.
fn empty_dynamic(size: u64, block: u32) -> Vec<u8> {
    let entries = size.div_ceil(block as u64) as u32;
    let f = footer(3, 512, size, (0, 0, 0), b"win ");
    let mut v = f.to_vec();
    v.extend(header(1536, entries, block));
    let bat_len = (entries as usize * 4).next_multiple_of(512);
    v.extend(std::iter::repeat_n(0xFFu8, bat_len));
    v.extend(f);
    v
}

fn open_file(path: &PathBuf, writable: bool) -> io::Result<VhdDisk> {
    VhdDisk::open(Arc::new(FileDevice::open(path, writable)?), writable)
}

#[test]
fn random_writes_read_back_and_survive_a_reopen() {
    let p = tmp("random");
    let size = 9 * MIB + 4096;
    std::fs::write(&p, empty_dynamic(size, 1 << 20)).unwrap();
    let mut shadow = vec![0u8; size as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    {
        let d = open_file(&p, true).unwrap();
        assert_eq!(d.size(), size);
        for round in 0..300 {
            let off = rng.random_range(0..size) as usize;
            let len = rng.random_range(1..=(size as usize - off).min(3 << 20));
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            d.write_at(off as u64, &data).unwrap();
            shadow[off..off + len].copy_from_slice(&data);
            if round % 50 == 0 {
                d.flush().unwrap();
            }
            let (o, l) = (rng.random_range(0..size as usize), 5000usize);
            let l = l.min(size as usize - o);
            let mut buf = vec![0u8; l];
            d.read_at(o as u64, &mut buf).unwrap();
            assert_eq!(buf, shadow[o..o + l]);
        }
        d.flush().unwrap();
    }
    let d = open_file(&p, false).unwrap();
    let mut all = vec![0u8; size as usize];
    d.read_at(0, &mut all).unwrap();
    assert!(all == shadow, "the reopened disk differs");
    let li = d.layer();
    assert_eq!(li.variant, "dynamic");
    assert_eq!(li.virtual_size, size);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn an_unflushed_block_is_unreachable_after_reopen_and_the_footer_copy_opens_a_cut_file() {
    let p = tmp("unflushed");
    std::fs::write(&p, empty_dynamic(4 * MIB, 1 << 20)).unwrap();
    {
        let d = open_file(&p, true).unwrap();
        d.write_at(MIB, &[7u8; 4096]).unwrap();
        // Forget the BAT update, as a power cut before the flush would.
        d.dynamic.as_ref().unwrap().bat.take_dirty();
        std::mem::forget(d);
    }
    // Cut the footer off the end: the copy at sector 0 still opens it.
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 512).unwrap();
    let d = open_file(&p, true).unwrap();
    let mut b = [1u8; 4096];
    d.read_at(MIB, &mut b).unwrap();
    assert_eq!(
        b, [0u8; 4096],
        "a block no flushed entry points to reads as never written"
    );
    d.write_at(0, &[3u8; 512]).unwrap();
    d.flush().unwrap();
    drop(d);
    let d = open_file(&p, false).unwrap();
    let mut b = [0u8; 512];
    d.read_at(0, &mut b).unwrap();
    assert_eq!(b, [3u8; 512]);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn a_fixed_disk_is_its_bytes_and_reads_past_the_end_fail() {
    let mut v: Vec<u8> = (0..(MIB as usize)).map(|i| (i % 251) as u8).collect();
    v.extend(footer(2, u64::MAX, MIB, (0, 0, 0), b"win "));
    let d = VhdDisk::open(Arc::new(MemDevice::from_vec(v.clone())), true).unwrap();
    let mut b = vec![0u8; 1000];
    d.read_at(5000, &mut b).unwrap();
    assert_eq!(b, v[5000..6000]);
    d.write_at(10, &[9, 9]).unwrap();
    d.read_at(0, &mut b[..12]).unwrap();
    assert_eq!(&b[10..12], &[9, 9]);
    assert_eq!(
        d.read_at(MIB - 1, &mut b[..2]).unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
    assert_eq!(d.layer().variant, "fixed");
}

/// A change that damages an image.
type Damage = Box<dyn Fn(&mut Vec<u8>)>;

#[test]
fn hostile_tables_are_named_errors() {
    let good = empty_dynamic(4 * MIB, 1 << 20);
    let set_entry = |v: &mut Vec<u8>, i: usize, s: u32| v[1536 + 4 * i..][..4].copy_from_slice(&s.to_be_bytes());
    let cases: Vec<(&str, Damage)> = vec![
        ("entry past the end", Box::new(move |v| set_entry(v, 0, 1 << 20))),
        ("entry into the header", Box::new(move |v| set_entry(v, 1, 1))),
        (
            "entry beyond the disk",
            Box::new(move |v| {
                v[512..1536].copy_from_slice(&header(1536, 8, 1 << 20));
                v.extend(vec![0u8; 3 << 20]);
                set_entry(v, 6, 8)
            }),
        ),
        (
            "overlapping entries",
            Box::new(move |v| {
                v.extend(vec![0u8; 3 << 20]);
                set_entry(v, 0, 8);
                set_entry(v, 1, 9)
            }),
        ),
        (
            "huge table",
            Box::new(|v| {
                let h = header(1536, u32::MAX, 1 << 20);
                v[512..1536].copy_from_slice(&h);
            }),
        ),
        (
            "header offset outside",
            Box::new(|v| {
                let f = footer(3, 1 << 40, 4 * MIB, (0, 0, 0), b"win ");
                let n = v.len();
                v[n - 512..].copy_from_slice(&f);
            }),
        ),
        (
            "table too small for the size",
            Box::new(|v| {
                let h = header(1536, 2, 1 << 20);
                v[512..1536].copy_from_slice(&h);
            }),
        ),
        (
            "bad block size",
            Box::new(|v| {
                let h = header(1536, 4, 1000);
                v[512..1536].copy_from_slice(&h);
            }),
        ),
        (
            "no footer anywhere",
            Box::new(|v| {
                v[0] = 0;
                let n = v.len();
                v[n - 512] = 0;
            }),
        ),
    ];
    for (what, damage) in cases {
        let mut v = good.clone();
        damage(&mut v);
        let e = VhdDisk::open(Arc::new(MemDevice::from_vec(v)), false).expect_err(what);
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{what}: {e}");
        assert!(e.to_string().starts_with("vhd: "), "{what}: {e}");
    }
    let mut diff = good.clone();
    let f = footer(4, 512, 4 * MIB, (0, 0, 0), b"win ");
    let n = diff.len();
    diff[n - 512..].copy_from_slice(&f);
    let e = VhdDisk::open(Arc::new(MemDevice::from_vec(diff)), false).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("differencing"), "{e}");
}
