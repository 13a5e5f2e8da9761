//! Write operations on damaged images (issue 19): each of the corpus'
//! operations, through the library and the `ext4kit` binary, on one image
//! per (damage kind × base) — 76 images, about 1,700 cases — must succeed
//! with `e2fsck -fn` no worse than before, or refuse and leave the image
//! byte-identical (apart from the superblock's error record), blaming
//! damage only with "run e2fsck". See `ext4kit_fuzz::damaged`.
//!
//! `EXT4KIT_DAMAGED_COUNT` / `EXT4KIT_DAMAGED_START` change the seeds;
//! the `ext4kit-damaged` binary runs bigger campaigns.
//!
//! One gap is known and reported, not failed: freeing a block another
//! file also claims (a cross-link, made by the corpus directly or by a
//! flipped map pointer) marks the other file's block free. Finding the
//! second owner needs a reverse block map (e2fsck's pass 1); the kernel
//! does not look either. Such cases are printed as KNOWN GAP and must
//! show nothing but "+N" block bitmap differences.

use std::time::{Duration, Instant};

use ext4kit_fuzz::damaged::check::{find_cli, run_corpus, CaseRecord, CorpusConfig, Frontend, Outcome};
use ext4kit_fuzz::damaged::corpus::Kind;
use ext4kit_fuzz::damaged::ops::{Op, OPS};

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// The known gap (see the module doc): a block-freeing operation on map
/// damage whose only new problems are blocks in use marked free.
fn known_cross_link_gap(c: &CaseRecord) -> bool {
    let map_damage =
        matches!(c.kind, Kind::CrossLinked | Kind::FlipIndirect | Kind::FlipExtentRoot | Kind::FlipExtentNode);
    let frees = matches!(c.op, Op::Unlink(_) | Op::Truncate(..));
    let Outcome::Worse(w) = &c.outcome else { return false };
    map_damage && frees && w.split("; ").all(|p| p.starts_with("block bitmap difference +"))
}

#[test]
fn write_operations_on_damaged_images_never_make_them_worse() {
    if let Err(e) = ext4kit_fuzz::check_tools() {
        panic!("cannot run the damaged-image corpus: {e}");
    }
    let cli = find_cli().unwrap_or_else(|e| panic!("the damaged-image corpus needs the ext4kit binary: {e}"));
    let start = env_u64("EXT4KIT_DAMAGED_START", 0);
    let count = env_u64("EXT4KIT_DAMAGED_COUNT", 76);
    let cfg = CorpusConfig {
        seeds: start..start + count,
        ops: OPS.to_vec(),
        frontends: vec![Frontend::Library, Frontend::Cli(cli)],
        cli_every: 3,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        limit: Duration::from_secs(60),
        verbose: false,
    };
    let t = Instant::now();
    let report = run_corpus(&cfg).unwrap_or_else(|e| panic!("damaged-image corpus: {e}"));
    eprintln!(
        "{} images, {} cases in {:.0} s\n{}",
        report.images,
        report.cases.len(),
        t.elapsed().as_secs_f64(),
        report.table()
    );
    assert_eq!(report.uncheckable, 0, "e2fsck could not check some damaged images in time");
    assert!(report.cases.len() as u64 >= count * OPS.len() as u64, "too few cases ran");
    let refused = report.cases.iter().filter(|c| matches!(c.outcome, Outcome::Refused { .. })).count();
    let succeeded = report.cases.iter().filter(|c| c.outcome == Outcome::Succeeded).count();
    assert!(refused > 0 && succeeded > 0, "the corpus should both refuse and allow operations");
    let (gap, real): (Vec<&CaseRecord>, Vec<&CaseRecord>) =
        report.failures().into_iter().partition(|c| known_cross_link_gap(c));
    for c in &gap {
        eprintln!("KNOWN GAP [{}] {} :: {} -> {:?}", c.frontend, c.damage, c.op.label(), c.outcome);
    }
    assert!(real.is_empty(), "{} cases broke the rule:\n{}", real.len(), report.failure_lines());
}
