//! Tests of the disk as a whole: reads, writes and allocation against a
//! shadow copy, reopening, concurrency, log replay, hostile images.

use std::io;
use std::sync::Arc;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};

use super::bat::FULLY_PRESENT;
use super::bytes::{put_u64, u64_at};
use super::guid::Guid;
use super::header;
use super::testimg::{log_entry, LogDesc, Spec, BAT_AT, LOG_AT};
use super::{VhdxDisk, MIB};
use crate::{BlockDevice, DiskImage};
use ext4kit_blockdev::MemDevice;

fn open(img: Vec<u8>, writable: bool) -> (Arc<MemDevice>, io::Result<VhdxDisk>) {
    let dev = Arc::new(MemDevice::growable(img));
    let d = VhdxDisk::open(dev.clone(), writable);
    (dev, d)
}

fn read_all(d: &VhdxDisk) -> Vec<u8> {
    let mut v = vec![0u8; d.size() as usize];
    d.read_at(0, &mut v).unwrap();
    v
}

#[test]
fn a_fresh_dynamic_disk_reads_as_zeros_and_says_what_it_is() {
    let (_, d) = open(Spec::dynamic(8 * MIB).build(), false);
    let d = d.unwrap();
    assert_eq!(d.size(), 8 * MIB);
    assert!(read_all(&d).iter().all(|&b| b == 0));
    let l = d.layer();
    assert_eq!(l.variant, "dynamic");
    assert_eq!(l.virtual_size, 8 * MIB);
    assert!(l.details.contains(&("block size".into(), "1 MiB".into())), "{l:?}");
    let mut b = [0u8; 2];
    assert_eq!(
        d.read_at(8 * MIB - 1, &mut b).unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
    assert_eq!(d.write_at(0, b"x").unwrap_err().kind(), io::ErrorKind::PermissionDenied);
}

#[test]
fn writes_allocate_at_the_end_and_survive_reopen() {
    let (dev, d) = open(Spec::dynamic(8 * MIB).build(), true);
    let d = d.unwrap();
    let end0 = dev.size();
    d.write_at(3 * MIB + 100, b"hello").unwrap();
    assert_eq!(dev.size(), end0.next_multiple_of(MIB) + MIB, "one 1 MiB block appended");
    let mut b = [0u8; 5];
    d.read_at(3 * MIB + 100, &mut b).unwrap();
    assert_eq!(&b, b"hello");
    // Not yet flushed: the file's BAT does not point at the block.
    let idx = BAT_AT as usize + 3 * 8;
    assert_eq!(u64_at(&dev.to_vec(), idx), 0);
    d.flush().unwrap();
    let raw = u64_at(&dev.to_vec(), idx);
    assert_eq!(raw & 7, FULLY_PRESENT);
    assert_eq!(raw & !(MIB - 1), end0.next_multiple_of(MIB));
    // The session changed the write GUIDs and the sequence number.
    let h = header::read_current(&*dev).unwrap().header;
    assert_ne!(h.data_write_guid, Guid::new(0x2222, 2, 2, [2; 8]));
    assert_eq!(h.sequence, 4);
    drop(d);
    let d = VhdxDisk::open(dev.clone(), false).unwrap();
    d.read_at(3 * MIB + 100, &mut b).unwrap();
    assert_eq!(&b, b"hello");
    assert!(d
        .layer()
        .details
        .contains(&("allocated blocks".into(), "1 of 8".into())));
}

#[test]
fn a_fixed_disk_writes_in_place() {
    let mut s = Spec::dynamic(4 * MIB);
    s.fixed = true;
    let (dev, d) = open(s.build(), true);
    let d = d.unwrap();
    assert_eq!(d.layer().variant, "fixed");
    let size = dev.size();
    d.write_at(MIB + 7, &[9u8; 3000]).unwrap();
    d.flush().unwrap();
    assert_eq!(dev.size(), size);
    assert_eq!(dev.to_vec()[(s.payload_at() + MIB + 7) as usize], 9);
}

#[test]
fn dropping_without_flush_still_writes_the_bat() {
    let (dev, d) = open(Spec::dynamic(4 * MIB).build(), true);
    d.unwrap().write_at(0, b"abc").unwrap();
    let d = VhdxDisk::open(dev, false).unwrap();
    let mut b = [0u8; 3];
    d.read_at(0, &mut b).unwrap();
    assert_eq!(&b, b"abc");
}

#[test]
fn threads_writing_and_reading_at_once_agree_with_a_shadow() {
    let mut s = Spec::dynamic(16 * MIB);
    s.logical_sector = 4096;
    let (dev, d) = open(s.build(), true);
    let d = Arc::new(d.unwrap());
    let handles: Vec<_> = (0..4u8)
        .map(|t| {
            let d = d.clone();
            std::thread::spawn(move || {
                // Thread t owns every 4th 64 KiB stripe; stripes share blocks.
                for i in 0..64u64 {
                    let stripe = i * 4 + u64::from(t);
                    d.write_at(stripe * 65536, &vec![t + 1; 65536]).unwrap();
                    let mut back = vec![0u8; 65536];
                    d.read_at(stripe * 65536, &mut back).unwrap();
                    assert!(back.iter().all(|&b| b == t + 1));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    d.flush().unwrap();
    drop(d);
    let d = VhdxDisk::open(dev, false).unwrap();
    let all = read_all(&d);
    for (stripe, chunk) in all.chunks(65536).enumerate() {
        assert!(chunk.iter().all(|&b| b == (stripe % 4) as u8 + 1), "stripe {stripe}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_writes_match_a_shadow(
        ops in prop::collection::vec((0u64..(6 * MIB), 1usize..300_000, any::<u8>(), any::<bool>()), 1..25),
        block_mb in prop::sample::select(vec![1u64, 2]),
    ) {
        let size = 6 * MIB + 512 * 3; // a short last block
        let mut s = Spec::dynamic(size);
        s.block_size = block_mb * MIB;
        let (dev, d) = open(s.build(), true);
        let d = d.unwrap();
        let mut shadow = vec![0u8; size as usize];
        for (off, len, fill, flush) in ops {
            let len = len.min((size - off) as usize);
            let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
            d.write_at(off, &data).unwrap();
            shadow[off as usize..off as usize + len].copy_from_slice(&data);
            if flush {
                d.flush().unwrap();
            }
        }
        prop_assert!(read_all(&d) == shadow);
        drop(d);
        let d = VhdxDisk::open(dev, false).unwrap();
        prop_assert!(read_all(&d) == shadow);
    }
}

/// An image with a dirty log: one entry writing `sector` at `target`.
fn dirty(target: u64, sector: &[u8]) -> Vec<u8> {
    let g = Guid::new(0xABC, 1, 2, [3; 8]);
    let mut s = Spec::dynamic(8 * MIB);
    s.log_guid = g;
    let mut img = s.build();
    let e = log_entry(g, 1, 0, &[LogDesc::Data(target, sector.to_vec())]);
    img[LOG_AT as usize..LOG_AT as usize + e.len()].copy_from_slice(&e);
    img
}

/// The first 4 KiB of the BAT with payload block 2 at `at`.
fn bat_sector_with_block2_at(img: &[u8], at: u64) -> Vec<u8> {
    let mut sec = img[BAT_AT as usize..BAT_AT as usize + 4096].to_vec();
    put_u64(&mut sec, 16, at | FULLY_PRESENT);
    sec
}

#[test]
fn a_read_only_open_replays_the_log_in_memory_only() {
    // The log maps block 2 to a place in the file holding 0x77s.
    let clean = Spec::dynamic(8 * MIB).build();
    let data_at = clean.len() as u64;
    let mut img = dirty(BAT_AT, &bat_sector_with_block2_at(&clean, data_at));
    img.extend(std::iter::repeat_n(0x77u8, MIB as usize));
    let before = img.clone();
    let dev = Arc::new(MemDevice::from_vec_read_only(img));
    let d = VhdxDisk::open(dev.clone(), false).unwrap();
    let mut b = [0u8; 4];
    d.read_at(2 * MIB + 10, &mut b).unwrap();
    assert_eq!(b, [0x77; 4]);
    assert_eq!(dev.to_vec(), before, "the file is untouched");
    let note = d.layer().details.into_iter().find(|(k, _)| k == "log").unwrap().1;
    assert!(note.contains("in memory only"), "{note}");
    // A writable open needs a writable file.
    assert_eq!(
        VhdxDisk::open(dev, true).unwrap_err().kind(),
        io::ErrorKind::PermissionDenied
    );
}

#[test]
fn a_writable_open_replays_into_the_file_and_clears_the_log_guid() {
    let clean = Spec::dynamic(8 * MIB).build();
    let data_at = clean.len() as u64;
    let mut img = dirty(BAT_AT, &bat_sector_with_block2_at(&clean, data_at));
    img.extend(std::iter::repeat_n(0x77u8, MIB as usize));
    let (dev, d) = open(img, true);
    let d = d.unwrap();
    let note = d.layer().details.into_iter().find(|(k, _)| k == "log").unwrap().1;
    assert!(note.starts_with("replayed at open"), "{note}");
    drop(d);
    let h = header::read_current(&*dev).unwrap().header;
    assert!(h.log_guid.is_zero());
    assert_eq!(u64_at(&dev.to_vec(), BAT_AT as usize + 16), data_at | FULLY_PRESENT);
    let d = VhdxDisk::open(dev, false).unwrap();
    assert!(d.layer().details.iter().all(|(k, _)| k != "log"));
    let mut b = [0u8; 4];
    d.read_at(2 * MIB, &mut b).unwrap();
    assert_eq!(b, [0x77; 4]);
}

#[test]
fn hostile_bat_entries_are_refused() {
    let s = Spec::dynamic(8 * MIB);
    let cases: [(u64, &str); 4] = [
        (0, "overlaps the header section"),
        (BAT_AT, "overlaps"),
        (1 << 40, "past the end of the file"),
        (LOG_AT, "overlaps"),
    ];
    for (at, want) in cases {
        let mut img = s.build();
        put_u64(&mut img, BAT_AT as usize + 8, at | FULLY_PRESENT);
        let e = open(img, false).1.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
    // Two blocks at one place.
    let mut img = s.build();
    let at = img.len() as u64;
    img.resize(img.len() + MIB as usize, 0);
    put_u64(&mut img, BAT_AT as usize, at | FULLY_PRESENT);
    put_u64(&mut img, BAT_AT as usize + 8, at | FULLY_PRESENT);
    let e = open(img, false).1.unwrap_err();
    assert!(e.to_string().contains("payload block"), "{e}");
    // PARTIALLY_PRESENT in a disk without a parent.
    let mut img = s.build();
    put_u64(&mut img, BAT_AT as usize, 7);
    assert!(open(img, false).1.is_err());
}

#[test]
fn a_truncated_image_is_an_error_at_every_cut() {
    let mut s = Spec::dynamic(8 * MIB);
    s.fixed = true;
    let img = s.build();
    for cut in [
        0,
        7,
        100,
        64 * 1024 + 10,
        200 * 1024,
        MIB as usize,
        2 * MIB as usize + 5,
        img.len() - 1,
    ] {
        let e = open(img[..cut].to_vec(), false).1.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "cut {cut}: {e}");
    }
}

#[test]
fn random_damage_never_panics() {
    let mut s = Spec::dynamic(8 * MIB);
    s.fixed = true;
    let base = s.build();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..300 {
        let mut img = base.clone();
        for _ in 0..rng.random_range(1..20) {
            // Damage the structures (first 4 MiB), mostly where fields are.
            let region = [
                0usize,
                64 * 1024,
                128 * 1024,
                192 * 1024,
                256 * 1024,
                2 * MIB as usize,
                3 * MIB as usize,
            ];
            let at = region[rng.random_range(0..region.len())] + rng.random_range(0..128);
            img[at] = rng.random();
        }
        // Re-seal some checksums so damage gets past them.
        if rng.random_bool(0.7) {
            for off in [64 * 1024usize, 128 * 1024] {
                super::bytes::seal(&mut img[off..off + 4096], 4);
            }
            for off in [192 * 1024usize, 256 * 1024] {
                super::bytes::seal(&mut img[off..off + 65536], 4);
            }
        }
        let (_, d) = open(img, true);
        if let Ok(d) = d {
            let mut b = vec![0u8; 4096];
            let _ = d.read_at(0, &mut b);
            let _ = d.write_at(d.size().saturating_sub(4096), &b);
            let _ = d.flush();
        }
    }
}

#[test]
fn a_zero_block_reuses_its_reserved_space_only_when_it_is_safe() {
    // A fixed disk whose block 1 is ZERO at its preallocated place (as
    // qemu leaves untouched blocks), and block 2 ZERO "at" the BAT.
    let mut s = Spec::dynamic(4 * MIB);
    s.fixed = true;
    let mut img = s.build();
    let b1 = u64_at(&img, BAT_AT as usize + 8) & !(MIB - 1);
    put_u64(&mut img, BAT_AT as usize + 8, b1 | super::bat::ZERO);
    put_u64(&mut img, BAT_AT as usize + 16, BAT_AT | super::bat::ZERO);
    img[b1 as usize..(b1 + MIB) as usize].fill(0xEE); // stale bytes
    let (dev, d) = open(img, true);
    let d = d.unwrap();
    let size = dev.size();
    let mut b = vec![1u8; 10];
    d.read_at(MIB, &mut b).unwrap();
    assert_eq!(b, [0; 10], "a ZERO block reads as zeros whatever its space holds");
    d.write_at(MIB + 5, b"in place").unwrap();
    assert_eq!(dev.size(), size, "block 1 reused its reserved space");
    d.write_at(2 * MIB, b"elsewhere").unwrap();
    assert!(dev.size() > size, "block 2's reservation overlaps the BAT: a new block");
    d.flush().unwrap();
    let img = dev.to_vec();
    assert_eq!(u64_at(&img, BAT_AT as usize + 8), b1 | FULLY_PRESENT);
    assert_ne!(u64_at(&img, BAT_AT as usize + 16) & !(MIB - 1), BAT_AT);
    let mut all = vec![0u8; MIB as usize];
    d.read_at(MIB, &mut all).unwrap();
    assert_eq!(&all[5..13], b"in place");
    all[5..13].fill(0);
    assert!(all.iter().all(|&x| x == 0), "the rest of the reused block was zeroed");
}
