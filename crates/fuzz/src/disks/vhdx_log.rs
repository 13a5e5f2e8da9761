//! A VHDX log to replay (MS-VHDX 2.3): qemu-img writes an empty log, so
//! the campaign writes one — an entry with data and zero descriptors
//! aimed at the headers, the tables, the end of the file and far past it
//! — names it in both headers, and seals it. Sometimes a field is broken
//! after sealing, so both the validation and the replay are exercised.

use super::map::{put, DiskMap};
use super::seal::vhdx_crc;
use crate::prng::Rng;

const SECTOR: u64 = 4096;

/// Write a log entry into `img`'s log region; returns what was done.
pub fn synthesize(r: &mut Rng, map: &DiskMap, img: &mut [u8]) -> String {
    let Some((lo, ll)) = map.vhdx_log else { return "vhdx log (no log region)".into() };
    let (lo, ll) = (lo as usize, ll as usize);
    let len = img.len() as u64;
    let data_descs = r.index(3);
    let zero_descs = r.index(3);
    let entry_len = (1 + data_descs) * SECTOR as usize;
    if ll < entry_len || img.len() < lo + entry_len {
        return "vhdx log (region too small)".into();
    }
    let seq = 1 + r.below(1 << 20);
    let guid = [r.next_u64(), r.next_u64()];
    let target = |r: &mut Rng| -> u64 {
        match r.index(7) {
            0 => *r.pick(&map.landmarks),
            1 => len.div_ceil(SECTOR) * SECTOR,
            2 => (len.div_ceil(SECTOR) + 1 + r.below(256)) * SECTOR,
            3 => 1 << (40 + r.below(20)),
            4 => *r.pick(&map.landmarks) + 1,
            5 => 0,
            _ => r.below(len / SECTOR) * SECTOR,
        }
    };
    let e = &mut img[lo..lo + entry_len];
    e.fill(0);
    e[..4].copy_from_slice(b"loge");
    put(e, 8, 4, false, entry_len as u64);
    put(e, 12, 4, false, 0);
    put(e, 16, 8, false, seq);
    put(e, 24, 4, false, (data_descs + zero_descs) as u64);
    put(e, 32, 8, false, guid[0]);
    put(e, 40, 8, false, guid[1]);
    let flushed = if r.chance(3, 4) { len } else { target(r) };
    let last = if r.chance(1, 2) { len } else { target(r) };
    put(e, 48, 8, false, flushed);
    put(e, 56, 8, false, last);
    let mut what = vec![format!("vhdx log entry seq {seq} flushed {flushed:#x} last {last:#x}")];
    for d in 0..data_descs + zero_descs {
        let at = 64 + 32 * d;
        let off = target(r);
        if d < data_descs {
            e[at..at + 4].copy_from_slice(b"desc");
            put(e, at + 16, 8, false, off);
            put(e, at + 24, 8, false, seq);
            let s = (1 + d) * SECTOR as usize;
            e[s..s + 4].copy_from_slice(b"data");
            put(e, s + 4, 4, false, seq >> 32);
            put(e, s + 4092, 4, false, seq & 0xffff_ffff);
            r.fill(&mut e[s + 8..s + 4092]);
            what.push(format!("data -> {off:#x}"));
        } else {
            let zl = match r.index(4) {
                0 => SECTOR,
                1 => 1 << 20,
                2 => 1 << (30 + r.below(30)),
                _ => 1 + r.below(SECTOR),
            };
            e[at..at + 4].copy_from_slice(b"zero");
            put(e, at + 8, 8, false, zl);
            put(e, at + 16, 8, false, off);
            put(e, at + 24, 8, false, seq);
            what.push(format!("zero {zl:#x} at {off:#x}"));
        }
    }
    vhdx_crc(img, lo, entry_len);
    // Break one field after sealing, a quarter of the time.
    if r.chance(1, 4) {
        let (field, width) = *r.pick(&[(8usize, 4usize), (12, 4), (16, 8), (24, 4), (48, 8), (56, 8)]);
        let v = match r.index(3) {
            0 => 0,
            1 => u64::MAX,
            _ => r.next_u64(),
        };
        put(img, lo + field, width, false, v);
        what.push(format!("then entry field @{field} := {v:#x}"));
    }
    for h in [64usize << 10, 128 << 10] {
        put(img, h + 48, 8, false, guid[0]);
        put(img, h + 56, 8, false, guid[1]);
        vhdx_crc(img, h, 4096);
    }
    what.join(", ")
}
