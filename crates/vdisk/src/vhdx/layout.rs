//! The file's layout: which byte ranges belong to which structure.
//!
//! MS-VHDX 2.1: the header section is the first 1 MiB; the log, the BAT,
//! the metadata region and every allocated payload block each occupy their
//! own 1 MiB-aligned range, and "no two objects overlap". A hostile image
//! that points a payload block at the BAT (or two blocks at one place)
//! would turn a write of guest data into a write of the table that maps
//! it, so every range is checked against the file's end and against every
//! other before the first read or write follows one.

use std::collections::HashSet;
use std::io;

use super::bat::{Bat, Geometry};
use super::region::Region;
use super::{bad, MIB};

/// Check that the header section, `log` (if any), `bat_region`,
/// `metadata`, and every present payload block of `bat` lie inside the
/// file (`file_size` bytes) and do not overlap. Returns the blocks whose
/// reserved space ([`Bat::reserved`]) lies inside the file and overlaps
/// nothing, so a write may use it; other reservations are ignored (a
/// write allocates anew).
pub(crate) fn check(
    file_size: u64,
    log: Option<Region>,
    bat_region: Region,
    metadata: Region,
    bat: &Bat,
    geo: &Geometry,
) -> io::Result<HashSet<u64>> {
    let mut ranges: Vec<(u64, u64, String)> = vec![
        (0, MIB, "the header section".into()),
        (bat_region.offset, bat_region.end(), "the BAT".into()),
        (metadata.offset, metadata.end(), "the metadata region".into()),
    ];
    if let Some(l) = log {
        ranges.push((l.offset, l.end(), "the log".into()));
    }
    for (block, off) in bat.present() {
        let end = off
            .checked_add(geo.block_len(block))
            .filter(|&e| e <= file_size)
            .ok_or_else(|| {
                bad(format!(
                    "BAT entry of payload block {block} points at {off}, past the end of the file ({file_size} bytes)"
                ))
            })?;
        ranges.push((off, end, format!("payload block {block}")));
    }
    ranges.sort_unstable_by_key(|r| (r.0, r.1));
    let mut widest: Option<&(u64, u64, String)> = None;
    for r in &ranges {
        if let Some(w) = widest {
            if r.0 < w.1 {
                return Err(bad(format!(
                    "{} (at {}) overlaps {} (at {}..{})",
                    r.2, r.0, w.2, w.0, w.1
                )));
            }
        }
        if widest.is_none_or(|w| r.1 > w.1) {
            widest = Some(r);
        }
    }
    // Reservations: each must fit the file and touch no range above and
    // no other reservation.
    let mut soft: Vec<(u64, u64, u64)> = (0..geo.data_blocks)
        .filter_map(|b| {
            let off = bat.reserved(b)?;
            let end = off.checked_add(geo.block_size).filter(|&e| e <= file_size)?;
            Some((off, end, b))
        })
        .collect();
    soft.sort_unstable();
    let overlaps_fixed = |s: u64, e: u64| {
        // `ranges` is sorted and disjoint: only the last range starting
        // before `e` can overlap.
        let i = ranges.partition_point(|r| r.0 < e);
        i > 0 && ranges[i - 1].1 > s
    };
    let mut ok = HashSet::new();
    for (i, &(s, e, b)) in soft.iter().enumerate() {
        let clash_prev = i > 0 && soft[i - 1].1 > s;
        let clash_next = soft.get(i + 1).is_some_and(|n| n.0 < e);
        if !clash_prev && !clash_next && !overlaps_fixed(s, e) {
            ok.insert(b);
        }
    }
    Ok(ok)
}
