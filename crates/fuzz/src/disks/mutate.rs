//! The container mutator: a case is a pure function of (family, seed).
//!
//! A case picks one of the family's seeds (seeds rotate), applies one to
//! eight steps — a header or table field set to a hostile value, a text
//! rewritten, two table entries made to alias, a format-specific trap
//! (a qcow2 backing chain that cycles, a VHDX log that replays), random
//! bytes, a truncation — then, three times in four, re-seals the format's
//! checksums so the damage reaches the parsers behind them. Each step is
//! recorded in words; `skip` (a bit per step) replays a case without some
//! steps, which is how a failure is minimized.

use super::map::{get, map_seed, put, DiskMap, Field, Kind};
use super::seal;
use super::seeds::{Family, Seed};
use super::text;
use crate::prng::Rng;

/// One mutated image, ready to be written out and opened.
#[derive(Debug, Clone)]
pub struct DiskCase {
    /// The case's seed.
    pub seed: u64,
    /// The family.
    pub family: Family,
    /// The seed image it came from.
    pub seed_name: &'static str,
    /// Files, the first being the one opened.
    pub files: Vec<(String, Vec<u8>)>,
    /// Steps in words (skipped ones marked).
    pub steps: Vec<String>,
}

impl DiskCase {
    /// The steps, one a line.
    pub fn describe(&self) -> String {
        let mut s = format!("{} seed {} (from {})", self.family.name(), self.seed, self.seed_name);
        for (i, st) in self.steps.iter().enumerate() {
            s.push_str(&format!("\n  step {i}: {st}"));
        }
        s
    }
}

/// The case for `seed` over `seeds` (all of one family), without the
/// steps whose bits are set in `skip`.
pub fn generate(seeds: &[Seed], seed: u64, skip: u64) -> DiskCase {
    let s = &seeds[(seed % seeds.len() as u64) as usize];
    let map = map_seed(s.name, &s.files);
    let mut rng = Rng::new(seed ^ 0xD15C_0000);
    let mut files = s.files.clone();
    let n = match rng.weighted(&[50, 20, 10, 20]) {
        0 => 1,
        1 => 2,
        2 => 3,
        _ => 4 + rng.index(5),
    };
    let mut steps = Vec::new();
    for i in 0..n {
        // Every step draws from its own generator, so skipping one leaves
        // the others' choices unchanged.
        let mut r = Rng::new(rng.next_u64());
        let mut scratch = files.clone();
        let what = step(&mut r, s, &map, &mut scratch);
        if skip & (1 << i) == 0 {
            files = scratch;
            steps.push(what);
        } else {
            steps.push(format!("(skipped) {what}"));
        }
    }
    if rng.chance(3, 4) {
        for &sl in &map.seals {
            seal::apply(&mut files[0].1, sl);
        }
        steps.push("checksums re-sealed".into());
    }
    DiskCase { seed, family: s.family, seed_name: s.name, files, steps }
}

fn step(r: &mut Rng, s: &Seed, map: &DiskMap, files: &mut [(String, Vec<u8>)]) -> String {
    let special = matches!(s.name, "qcow2-backing" | "qcow2-zstd-backing" | "vhdx-dynamic" | "vhdx-fixed");
    let weights = [
        if map.fields.is_empty() { 0 } else { 60 },
        if map.texts.is_empty() { 0 } else { 20 },
        if map.fields.is_empty() { 0 } else { 6 },
        if special { 8 } else { 0 },
        8,
        4,
    ];
    match r.weighted(&weights) {
        0 => {
            let f = r.pick(&map.fields).clone();
            field(r, map, &f, files)
        }
        1 => {
            let t = r.pick(&map.texts).clone();
            rewrite_text(r, &t, files)
        }
        2 => alias(r, map, files),
        3 => match s.name {
            "qcow2-backing" | "qcow2-zstd-backing" => qcow2_cycle(r, files),
            _ => super::vhdx_log::synthesize(r, map, &mut files[0].1),
        },
        4 => flip(r, map, files),
        _ => {
            let fi = r.index(files.len());
            let len = files[fi].1.len();
            let to = match r.index(3) {
                0 => r.index(len),
                1 => r.index(len / 512 + 1) * 512,
                _ => len.saturating_sub(1 + r.index(4096)),
            };
            files[fi].1.truncate(to);
            format!("truncate {} from {len} to {to} bytes", files[fi].0)
        }
    }
}

fn mask(width: usize) -> u64 {
    if width >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * width)) - 1
    }
}

/// A hostile value for `f`, whose current value is `v`.
fn value(r: &mut Rng, map: &DiskMap, f: &Field, v: u64, file_len: u64) -> u64 {
    let m = mask(f.width);
    let generic = |r: &mut Rng| match r.index(10) {
        0 => 0,
        1 => 1,
        2 => m,
        3 => m - 1,
        4 => 1 << (8 * f.width - 1),
        5 => v ^ (1 << r.below(8 * f.width as u64)),
        6 => v.wrapping_add(1 + r.below(16)),
        7 => v.wrapping_sub(1 + r.below(16)),
        8 => v.wrapping_mul(2 + r.below(1000)),
        _ => r.next_u64(),
    };
    let landmark = |r: &mut Rng| if map.landmarks.is_empty() { 0 } else { *r.pick(&map.landmarks) };
    let x = match f.kind {
        Kind::Plain => generic(r),
        Kind::Count => match r.index(6) {
            0 => v.wrapping_add(1),
            1 => v.wrapping_mul(1 << (1 + r.below(20))),
            2 => 1 << (8 + r.below(24)),
            3 => file_len,
            _ => generic(r),
        },
        Kind::Offset(unit) => match r.index(8) {
            0 => file_len / unit,
            1 => (file_len / unit).wrapping_sub(1),
            2 => file_len / unit + 1 + r.below(64),
            3 => landmark(r) / unit,
            4 if unit == 1 => v.wrapping_add(1 + r.below(511)),
            5 => (file_len * 2 + (1 << 40) * r.below(2)) / unit,
            _ => generic(r),
        },
        Kind::Qcow2Entry => {
            let flags = v & !0x00ff_ffff_ffff_fe00;
            let cs = map.cluster;
            let off = match r.index(9) {
                0 => 0,
                1 => landmark(r),
                2 => file_len.div_ceil(cs) * cs,
                3 => (file_len.div_ceil(cs) + 1 + r.below(8)) * cs,
                4 => (v & 0x00ff_ffff_ffff_fe00) + 512,
                5 => 1 << (40 + r.below(15)),
                6 => return v ^ (1 << 63),
                7 => return v ^ (1 << 62) ^ (r.below(2) << 63),
                _ => return generic(r),
            };
            (off & 0x00ff_ffff_ffff_fe00) | flags
        }
        Kind::VhdxBat => {
            let state = if r.chance(1, 3) { r.below(8) } else { v & 7 };
            let mb = match r.index(7) {
                0 => 0,
                1 => 1,
                2 => file_len >> 20,
                3 => (file_len >> 20) + 1 + r.below(16),
                4 => landmark(r) >> 20,
                5 => (1 << 44) - 1,
                _ => return generic(r),
            };
            (mb << 20) | state
        }
    };
    x & m
}

fn field(r: &mut Rng, map: &DiskMap, f: &Field, files: &mut [(String, Vec<u8>)]) -> String {
    let img = &mut files[f.file].1;
    let Some(v) = get(img, f.off, f.width, f.be) else { return format!("{} (gone)", f.name) };
    let new = value(r, map, f, v, img.len() as u64);
    put(img, f.off, f.width, f.be, new);
    format!("{} @{:#x}: {v:#x} -> {new:#x}", f.name, f.off)
}

/// Make one table entry (or field) hold another's value: two L2 tables
/// sharing a cluster, a grain table pointing at the directory, a loop.
fn alias(r: &mut Rng, map: &DiskMap, files: &mut [(String, Vec<u8>)]) -> String {
    let a = r.pick(&map.fields).clone();
    let same: Vec<&Field> = map.fields.iter().filter(|f| f.kind == a.kind && f.width == a.width).collect();
    let b = (*r.pick(&same)).clone();
    let Some(v) = get(&files[b.file].1, b.off, b.width, b.be) else { return "alias (gone)".into() };
    put(&mut files[a.file].1, a.off, a.width, a.be, v);
    format!("alias: {} := {} ({v:#x})", a.name, b.name)
}

fn rewrite_text(r: &mut Rng, t: &super::map::TextRegion, files: &mut [(String, Vec<u8>)]) -> String {
    let img = &mut files[t.file].1;
    let Some(old) = img.get(t.off..t.off + t.len) else { return format!("{} (gone)", t.name) };
    let mut new = old.to_vec();
    let what = text::mutate(r, &mut new);
    let n = if t.whole_file {
        // A descriptor file: the file is the text.
        *img = new;
        img.len()
    } else {
        let room_end = (t.off + t.room).min(img.len());
        let n = new.len().min(room_end - t.off);
        img[t.off..t.off + n].copy_from_slice(&new[..n]);
        let clear_end = (t.off + t.len).min(room_end).max(t.off + n);
        img[t.off + n..clear_end].fill(0);
        n
    };
    if let Some(rl) = t.rlocn {
        put(img, rl + 8, 8, false, n as u64);
    }
    if t.qcow2_backing {
        put(img, 16, 4, true, n as u64);
    }
    format!("{}: {what}", t.name)
}

/// qcow2 backing chains that cycle: the base names the overlay, or the
/// overlay names itself. The name goes in unused space of cluster 0.
fn qcow2_cycle(r: &mut Rng, files: &mut [(String, Vec<u8>)]) -> String {
    let (fi, name) = if r.chance(1, 2) { (1, "overlay.qcow2") } else { (0, "overlay.qcow2") };
    let img = &mut files[fi].1;
    let at = 4096 - 64;
    if img.len() < 4096 {
        return "backing cycle (file too short)".into();
    }
    img[at..at + name.len()].copy_from_slice(name.as_bytes());
    put(img, 8, 8, true, at as u64);
    put(img, 16, 4, true, name.len() as u64);
    format!("{} names {name} as its backing file (a cycle)", files[fi].0)
}

/// A few random bytes, near a structure or anywhere.
fn flip(r: &mut Rng, map: &DiskMap, files: &mut [(String, Vec<u8>)]) -> String {
    let fi = r.index(files.len());
    let img = &mut files[fi].1;
    if img.is_empty() {
        return "flip (empty file)".into();
    }
    let base = if fi == 0 && r.chance(2, 3) && !map.landmarks.is_empty() {
        *r.pick(&map.landmarks) as usize + r.index(512)
    } else {
        r.index(img.len())
    };
    let n = 1 + r.index(8);
    let mut out = Vec::new();
    for k in 0..n {
        let at = (base + k * (1 + r.index(16))) % img.len();
        let v = r.next_u64() as u8;
        out.push(format!("{at:#x}:{:#04x}->{v:#04x}", img[at]));
        img[at] = v;
    }
    format!("{}: bytes {}", files[fi].0, out.join(" "))
}
