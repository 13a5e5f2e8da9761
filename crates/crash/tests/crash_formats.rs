//! The crash harness under container formats: the recording device holds
//! a qcow2, VHDX, VHD or VMDK file, our format layer sits on it and the engine on the
//! format layer, so a power cut falls anywhere in the container's own
//! write sequence (data clusters, L2 tables, refcount blocks; payload
//! blocks, BAT entries; grains, grain tables). Every crash image is a
//! container file, and:
//!
//! - `qemu-img check` finds it clean, or with leaked clusters only
//!   (exit 3: "not an error"); corruption (exit 2) fails (qemu has no
//!   check for VHD: there the next point is the oracle);
//! - our format layer reads the guest disk `qemu-img convert -O raw`
//!   reads;
//! - ext4kit opens it through the container and replays into it; the
//!   container stays `qemu-img check`-clean and its guest disk
//!   `e2fsck -fn`-clean; `e2fsck -fy` on qemu's reading reaches ext4kit's
//!   tree;
//! - every fsync'd promise holds.
//!
//! Bounded for CI: `EXT4KIT_CRASH_FORMAT_IMAGES` crash images per format
//! (default 48) over a few workloads. Without qemu-img these tests fail:
//! install qemu-utils.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;

use ext4kit_crash::campaign::{check_run, choose_cuts, Summary};
use ext4kit_crash::container::require_qemu_img;
use ext4kit_crash::{run, Checker, Container, FailKind, FsVariant, RunSpec, Workload};
use ext4kit_testkit::env_u64;

const REPRO: &str = "cargo run --profile ci -p ext4kit-crash -- check {}";

/// The runs each format's campaign cycles through (images split evenly).
const CELLS: &[(Workload, FsVariant)] = &[
    (Workload::Mix, FsVariant::Ext4),
    (Workload::G455, FsVariant::Ext4Small),
    (Workload::Overwrite, FsVariant::Ext4Small),
];

fn keep_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("crash-format-failures")
}

fn qemu_img() {
    if let Err(e) = require_qemu_img() {
        panic!("{e}");
    }
}

/// A bounded campaign over `c`.
fn campaign(c: Container) -> Summary {
    qemu_img();
    let total = env_u64("EXT4KIT_CRASH_FORMAT_IMAGES", 48) as usize;
    let seed = env_u64("EXT4KIT_CRASH_SEED", 1);
    let per_run = total.div_ceil(CELLS.len());
    let t0 = std::time::Instant::now();
    let saved = Mutex::new(BTreeSet::new());
    let mut sum = Summary::default();
    for (i, &(w, f)) in CELLS.iter().enumerate() {
        let spec = RunSpec::new(w, f, seed + i as u64).in_container(Some(c));
        let rec = run(&spec).unwrap_or_else(|e| panic!("{}: {e}", spec.label()));
        let cuts = choose_cuts(&rec.log, per_run, spec.seed);
        let s = check_run(&rec, &cuts, 2, Some(&keep_dir()), &saved, REPRO);
        eprintln!(
            "{}: {} ops, {} entries, {} flushes, {} KiB written: {} images, {} failing, {} with leaks",
            spec.label(),
            rec.ops,
            rec.log.len(),
            rec.log.flushes(),
            rec.log.data_bytes() >> 10,
            s.images,
            s.failed_images,
            s.leaked_images
        );
        sum.add(&s);
    }
    sum.elapsed = t0.elapsed();
    eprintln!("{sum}");
    assert!(
        sum.images >= total.min(CELLS.len() * 4),
        "only {} crash images",
        sum.images
    );
    sum
}

fn assert_clean(c: Container, sum: &Summary) {
    assert!(
        sum.clean(),
        "crash states inside {c}: {} of {} crash images fail ({} container corrupt, {} read differently from qemu-img, \
         {} e2fsck/replay in all, fsync'd bytes lost: {}); the table above has the first of each kind, its image \
         (kept under {}) and the command that checks it again",
        sum.failed_images,
        sum.images,
        sum.count(FailKind::Container),
        sum.count(FailKind::ContainerRead),
        sum.consistency_failures(),
        sum.lost_bytes,
        keep_dir().display()
    );
}

#[test]
fn crash_states_in_qcow2() {
    let sum = campaign(Container::Qcow2);
    assert_clean(Container::Qcow2, &sum);
}

#[test]
fn crash_states_in_vhdx() {
    let sum = campaign(Container::Vhdx);
    assert_clean(Container::Vhdx, &sum);
}

#[test]
fn crash_states_in_vhd() {
    let sum = campaign(Container::Vhd);
    assert_clean(Container::Vhd, &sum);
}

#[test]
fn crash_states_in_vmdk() {
    let sum = campaign(Container::Vmdk);
    assert_clean(Container::Vmdk, &sum);
}

/// The log is the container file's: replayed whole it is the file the run
/// left, which qemu-img reads as the disk the engine wrote; the file grew
/// (clusters and blocks appended) and the crash images grow with it.
#[test]
fn the_log_is_the_container_files() {
    qemu_img();
    for c in Container::ALL {
        let spec = RunSpec {
            ops: 60,
            ..RunSpec::new(Workload::Mix, FsVariant::Ext4Small, 3)
        }
        .in_container(Some(c));
        let rec = run(&spec).unwrap_or_else(|e| panic!("{}: {e}", spec.label()));
        let end = rec.log.replay(&rec.base).unwrap();
        assert!(end.len() > rec.base.len(), "{c}: the container file did not grow");
        // Our format reads a guest disk of the filesystem's size from it.
        let disk = c.read_disk(&end).unwrap();
        assert_eq!(disk.len() as u64, FsVariant::Ext4Small.size(), "{c}");
        assert_eq!(
            &disk[1024 + 56..1024 + 58],
            &[0x53, 0xef],
            "{c}: no ext4 superblock magic"
        );
        // The last flush cut checks clean.
        let cut = *rec.log.flush_cuts().last().unwrap();
        let img = rec.log.image(&rec.base, &cut).unwrap();
        let fails = Checker::new("formats-final").unwrap().check(&rec, &cut, &img);
        assert!(fails.is_empty(), "{c}: {fails:?}");
    }
}

/// The container checks are sharp: a crash image whose format tables are
/// damaged is caught as `container-corrupt`, and unhonoured flushes lose
/// fsync'd bytes inside a container too.
#[test]
fn container_damage_and_dropped_flushes_are_caught() {
    qemu_img();
    let spec = RunSpec {
        ops: 60,
        ..RunSpec::new(Workload::Mix, FsVariant::Ext4Small, 5)
    }
    .in_container(Some(Container::Qcow2));
    let rec = run(&spec).unwrap();
    let cut = *rec.log.flush_cuts().last().unwrap();
    let img = rec.log.image(&rec.base, &cut).unwrap();
    let checker = Checker::new("formats-damage").unwrap();
    let kinds =
        |img: &[u8]| -> BTreeSet<FailKind> { checker.check(&rec, &cut, img).into_iter().map(|f| f.kind).collect() };
    assert!(kinds(&img).is_empty());

    // qcow2 header (QCowHeader, big-endian): refcount_table_offset at 48,
    // l1_table_offset at 40. Point the first L1 entry's L2 table at an
    // unaligned offset: qemu-img check calls it corruption.
    let be64 = |b: &[u8], at: usize| u64::from_be_bytes(b[at..at + 8].try_into().unwrap());
    let l1 = be64(&img, 40) as usize;
    let mut bad = img.clone();
    let entry = be64(&bad, l1);
    assert_ne!(entry, 0, "the first L1 entry maps nothing");
    bad[l1..l1 + 8].copy_from_slice(&(entry | 0x200).to_be_bytes());
    assert!(
        kinds(&bad).contains(&FailKind::Container),
        "a bad L1 entry is not caught"
    );

    // One refcount dropped to 0 for a cluster in use: corruption for
    // qemu-img (a cluster referenced but free would be reused).
    let rt = be64(&img, 48) as usize;
    let rb = be64(&img, rt) as usize;
    let mut bad = img.clone();
    bad[rb..rb + 2].copy_from_slice(&0u16.to_be_bytes());
    assert!(
        kinds(&bad).contains(&FailKind::Container),
        "a zeroed refcount is not caught"
    );

    // Half the flushes unhonoured, inside the container.
    let faulty = RunSpec {
        drop_flushes: 2,
        ..RunSpec::new(Workload::Overwrite, FsVariant::Ext4Small, 5).in_container(Some(Container::Vhdx))
    };
    let rec = run(&faulty).unwrap();
    let cuts = choose_cuts(&rec.log, 60, 5);
    let s = check_run(&rec, &cuts, 2, None, &Mutex::new(BTreeSet::new()), REPRO);
    assert!(
        s.lost_bytes > 0,
        "no fsync'd byte lost inside VHDX with half the flushes unhonoured:\n{s}"
    );
}

/// The qcow2 flush ordering rule, checked on the log itself: a refcount
/// block and an L2 table are each synced before the next metadata write,
/// so no crash image holds an L2 entry whose cluster's refcount update
/// was lost (imago writes them back to back; our storage adapter adds the
/// barrier qemu has). Found by this harness: without the barrier a cut
/// between the two writes left `l2_entry=8000000000170000 refcount=0`.
#[test]
fn qcow2_tables_are_each_synced_before_the_next() {
    qemu_img();
    let spec = RunSpec {
        ops: 80,
        ..RunSpec::new(Workload::Overwrite, FsVariant::Ext4, 6)
    }
    .in_container(Some(Container::Qcow2));
    let rec = run(&spec).unwrap_or_else(|e| panic!("{}: {e}", spec.label()));
    let end = rec.log.replay(&rec.base).unwrap();
    // QCowHeader (big-endian): l1_table_offset at 40, refcount_table_offset at 48.
    let be64 = |at: usize| u64::from_be_bytes(end[at..at + 8].try_into().unwrap());
    let offset = |entry: u64| entry & 0x00ff_ffff_ffff_fe00;
    let l2 = offset(be64(be64(40) as usize));
    let refblock = offset(be64(be64(48) as usize));
    assert!(l2 != 0 && refblock != 0, "no L2 table or refcount block");
    let entries = rec.log.entries();
    let mut tables = 0;
    for (i, e) in entries.iter().enumerate() {
        if e.is_write() && (e.offset == l2 || e.offset == refblock) {
            tables += 1;
            assert!(
                entries.get(i + 1).is_some_and(|n| n.is_flush()),
                "log entry {i}: the {} at {} is not synced before the next write",
                if e.offset == l2 { "L2 table" } else { "refcount block" },
                e.offset
            );
        }
    }
    assert!(tables >= 2, "only {tables} table writes logged");
}
