//! Write operations on damaged images (nothing on disk is made worse): each
//! of the corpus' operations, through the library and the `ext4kit` binary,
//! on one image per (damage kind × base) — 76 images, about 1,700 cases —
//! must succeed with `e2fsck -fn` no worse than before, or refuse and leave
//! the image byte-identical (apart from the superblock's error record),
//! blaming damage only with "run e2fsck". See `ext4kit_fuzz::damaged`.
//!
//! `EXT4KIT_DAMAGED_COUNT` / `EXT4KIT_DAMAGED_START` change the seeds;
//! the `ext4kit-damaged` binary runs bigger campaigns.
//!
//! Cross-linked blocks (made by the corpus directly or by a flipped map
//! pointer) are no exception: freeing a block another inode also claims is
//! refused (`ext4kit_ext4::claims`), so such a case fails like any other.

use std::time::{Duration, Instant};

use ext4kit_fuzz::damaged::check::{find_cli, run_corpus, CorpusConfig, Frontend, Outcome};
use ext4kit_fuzz::damaged::ops::OPS;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
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
    let failures = report.failures();
    assert!(failures.is_empty(), "{} cases broke the rule:\n{}", failures.len(), report.failure_lines());
}
