//! The crash-state proof of the durability promises: workloads run
//! through the library over a recording device; the images a power cut
//! could leave — at every flush, and between flushes with unflushed writes
//! lost — are rebuilt and each one must replay (ext4kit read-write) to an
//! `e2fsck -fn`-clean image, `e2fsck -fy`'s own replay must reach the tree
//! ext4kit reads, and every fsync'd file, fsync'd directory and rename must
//! be as promised (`ext4kit_crash::model` states the rules).
//!
//! - `crash_states`: at least `EXT4KIT_CRASH_IMAGES` (default 5,000) crash
//!   images across the workloads and filesystems; seeds from
//!   `EXT4KIT_CRASH_SEED` (default 1). Every failure kind must be 0. The
//!   first failing image of each kind is kept under the target's tmp
//!   directory (`crash-failures/`), each with a one-line reproduction.
//! - The harness checked itself: a workload that only reads and one that
//!   only overwrites preallocated blocks pass; unhonoured flushes are
//!   caught as lost fsync'd bytes; damage done to a clean crash image
//!   (a changed fsync'd byte, a removed or added name, a changed xattr, an
//!   inode marked free) is caught as the kind it is.

use ext4kit::NewInode;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};

use ext4kit::{Cred, Fs, OpenOptions};
use ext4kit_blockdev::{CrashPoint, MemDevice};
use ext4kit_crash::campaign::{check_run, choose_cuts, Summary};
use ext4kit_crash::model::ObjKind;
use ext4kit_crash::{run, Checker, FailKind, FsVariant, Recorded, RunSpec, Workload};
use ext4kit_testkit::env_u64;

const REPRO: &str = "cargo run --profile ci -p ext4kit-crash -- check {}";

/// Workload × filesystem cells the CI run cycles through.
const CELLS: &[(Workload, FsVariant)] = &[
    (Workload::Mix, FsVariant::Ext4),
    (Workload::Mix, FsVariant::Ext4Small),
    (Workload::MixThreads, FsVariant::Ext4),
    (Workload::MixThreads, FsVariant::Ext4Small),
    (Workload::G455, FsVariant::Ext4),
    (Workload::G455, FsVariant::Ext4Small),
    (Workload::G457, FsVariant::Ext4),
    (Workload::G457, FsVariant::Ext4Small),
    (Workload::G482, FsVariant::Ext4),
    (Workload::G482, FsVariant::Ext4Small),
    (Workload::Overwrite, FsVariant::Ext4Small),
    (Workload::Mix, FsVariant::Ext3),
    (Workload::ReadOnly, FsVariant::Ext4Small),
];

fn keep_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("crash-failures")
}

/// Run `spec`, check up to `images` of its crash points on two threads.
fn check_spec(spec: &RunSpec, images: usize, keep: bool) -> Summary {
    let rec = run(spec).unwrap_or_else(|e| panic!("{}: {e}", spec.label()));
    let cuts = choose_cuts(&rec.log, images, spec.seed);
    let kd = keep_dir();
    check_run(&rec, &cuts, 2, keep.then_some(&kd), &Mutex::new(BTreeSet::new()), REPRO)
}

#[test]
fn crash_states() {
    let total = env_u64("EXT4KIT_CRASH_IMAGES", 5000) as usize;
    let seed = env_u64("EXT4KIT_CRASH_SEED", 1);
    let per_run = 250usize;
    if total == 0 {
        eprintln!("EXT4KIT_CRASH_IMAGES=0: skipped");
        return;
    }
    let _ = std::fs::remove_dir_all(keep_dir());
    let t0 = std::time::Instant::now();
    let saved = Mutex::new(BTreeSet::new());
    let mut sum = Summary::default();
    let mut i = 0;
    while sum.images < total {
        let (w, f) = CELLS[i % CELLS.len()];
        let spec = RunSpec::new(w, f, seed + i as u64);
        i += 1;
        let rec = match run(&spec) {
            Ok(r) => r,
            Err(e) => {
                sum.run_errors.push(format!("{}: {e}", spec.label()));
                continue;
            }
        };
        let cuts = choose_cuts(&rec.log, per_run.min(total - sum.images), spec.seed);
        let kd = keep_dir();
        let s = check_run(&rec, &cuts, 2, Some(&kd), &saved, REPRO);
        eprintln!(
            "{}: {} ops, {} entries, {} flushes: {} images, {} failing",
            spec.label(),
            rec.ops,
            rec.log.len(),
            rec.log.flushes(),
            s.images,
            s.failed_images
        );
        sum.add(&s);
        if i > 10 * (total / per_run + CELLS.len()) {
            break;
        }
    }
    sum.elapsed = t0.elapsed();
    eprintln!("{sum}");
    assert!(sum.images >= total, "only {} crash images could be made", sum.images);
    assert!(
        sum.clean(),
        "crash states: {} of {} crash images fail ({} e2fsck/replay, fsync'd bytes lost: {}, renames: {} neither + {} \
         both); the table above has the first of each kind, its image (kept under {}) and the command that checks it \
         again",
        sum.failed_images,
        sum.images,
        sum.consistency_failures(),
        sum.lost_bytes,
        sum.count(FailKind::RenameNeither),
        sum.count(FailKind::RenameBoth),
        keep_dir().display()
    );
}

/// Only reads: the images are the base image and whatever the open and
/// close wrote. Nothing may fail.
#[test]
fn read_only_workload_passes() {
    for fs in [FsVariant::Ext4, FsVariant::Ext4Small] {
        let s = check_spec(&RunSpec::new(Workload::ReadOnly, fs, 1), 50, false);
        assert!(s.images >= 1, "{s}");
        assert!(s.clean(), "{s}");
    }
}

/// Overwrites of blocks mke2fs allocated and wrote, each fsync'd: every
/// crash point keeps the filesystem consistent and every fsync'd byte,
/// with or without a journal. Then the same run with one flush in two
/// unhonoured: the harness must find fsync'd bytes lost — it is sharp
/// enough to see a flush missing.
#[test]
fn in_place_overwrites_pass_and_a_dropped_flush_is_caught() {
    let spec = RunSpec::new(Workload::Overwrite, FsVariant::Ext4Small, 5);
    let s = check_spec(&spec, 300, false);
    assert!(s.images >= 250, "{s}");
    assert!(s.clean(), "{s}");
    let faulty = RunSpec {
        drop_flushes: 2,
        ..spec
    };
    let s = check_spec(&faulty, 300, false);
    let lost = s.count(FailKind::FsyncData) + s.count(FailKind::FsyncLost);
    assert!(
        lost > 0 && s.lost_bytes > 0,
        "no fsync'd byte lost with half the flushes unhonoured:\n{s}"
    );
}

/// A short mix run, its last flush cut (the final sync: every object is
/// promised exactly), and that image.
fn final_image() -> (Recorded, CrashPoint, Vec<u8>) {
    let spec = RunSpec {
        ops: 150,
        ..RunSpec::new(Workload::Mix, FsVariant::Ext4Small, 11)
    };
    let rec = run(&spec).expect("mix run");
    let cut = *rec.log.flush_cuts().last().expect("the run flushed");
    // The final sync's flush is the last flush of the workload; the close
    // writes after it nothing that matters here.
    let img = rec.log.image(&rec.base, &cut).expect("image");
    (rec, cut, img)
}

/// `img` changed by `f` through ext4kit (read-write, then closed).
fn damaged(img: &[u8], f: impl FnOnce(&Fs)) -> Vec<u8> {
    let mem = Arc::new(MemDevice::from_vec(img.to_vec()));
    let fs = Fs::open_device(
        mem.clone(),
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .expect("open the clean image");
    f(&fs);
    fs.sync().expect("sync");
    drop(fs);
    mem.to_vec()
}

fn kinds(rec: &Recorded, cut: &CrashPoint, img: &[u8]) -> BTreeSet<FailKind> {
    let c = Checker::new("damage").expect("scratch");
    c.check(rec, cut, img).into_iter().map(|f| f.kind).collect()
}

#[test]
fn damage_is_caught() {
    let (rec, cut, img) = final_image();
    let clean = kinds(&rec, &cut, &img);
    assert!(clean.is_empty(), "the final sync's image fails: {clean:?}");
    // What thread 0 promised at the final sync.
    let marks = &rec.histories[1].ops.last().expect("final sync").marks;
    let file = marks
        .iter()
        .find(|m| m.kind == ObjKind::File && m.content.as_ref().is_some_and(|c| c.len() > 10) && m.paths.len() == 1)
        .expect("a file with contents");
    let dir = marks
        .iter()
        .find(|m| m.kind == ObjKind::Dir && m.entries.as_ref().is_some_and(|e| !e.is_empty()))
        .expect("a directory with entries");
    let fpath = file.paths[0].clone();
    let dpath = dir.paths[0].clone();
    let root = Cred::root();

    // One fsync'd byte changed.
    let bad = damaged(&img, |fs| {
        let f = fs
            .open(
                fpath.as_bytes(),
                ext4kit::OpenFlags {
                    access: ext4kit::Access::ReadWrite,
                    ..Default::default()
                },
            )
            .unwrap();
        let b = file.content.as_ref().unwrap().get(5).unwrap();
        fs.pwrite(&f, 5, &[b ^ 0x55]).unwrap();
    });
    assert!(kinds(&rec, &cut, &bad).contains(&FailKind::FsyncData));

    // A promised name removed.
    let bad = damaged(&img, |fs| fs.unlink(fpath.as_bytes(), &root).unwrap());
    let k = kinds(&rec, &cut, &bad);
    assert!(
        k.contains(&FailKind::FsyncLost) && k.contains(&FailKind::DirEntryLost),
        "{k:?}"
    );

    // A name the directory did not hold at its last promise.
    let name = format!("{dpath}/t0_stale");
    let bad = damaged(&img, |fs| {
        fs.write_file(&NewInode::file(name.as_bytes()).mode(0o644).owner(0, 0), b"")
            .unwrap();
    });
    assert_eq!(kinds(&rec, &cut, &bad), [FailKind::DirEntryStale].into());

    // An xattr that was not there.
    let bad = damaged(&img, |fs| {
        fs.setxattr(fpath.as_bytes(), b"user.intruder", b"x", 0, &root).unwrap()
    });
    assert_eq!(kinds(&rec, &cut, &bad), [FailKind::FsyncXattr].into());

    // An inode in use marked free: e2fsck must complain after our replay.
    let path = std::env::temp_dir().join(format!("ext4kit-crash-damage-{}.img", std::process::id()));
    std::fs::write(&path, &img).unwrap();
    let out = Command::new("debugfs")
        .args(["-w", "-R", &format!("freei <{}>", file.ino)])
        .arg(&path)
        .output()
        .expect("debugfs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bad = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(kinds(&rec, &cut, &bad).contains(&FailKind::Fsck));
}
