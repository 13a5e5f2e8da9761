//! Mutations of the texts formats parse: a VMDK descriptor, LVM2
//! metadata, a qcow2 backing file name.
//!
//! Text parsers break on numbers out of range (sector counts past 2^64,
//! negative extents), names that escape the image's directory or point
//! back at the image itself, unbalanced or deeply nested braces, missing
//! or repeated lines, and cut-off input; those are what is produced here.

use crate::prng::Rng;

/// Numbers that break range checks.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999",
    "0x10",
    "",
];

/// Names that escape the directory, name the image itself or nothing.
const NAMES: &[&str] = &[
    "",
    "disk.vmdk",
    "disk-flat.vmdk",
    "overlay.qcow2",
    "base.qcow2",
    "../../../../etc/hostname",
    "/etc/hostname",
    "/dev/zero",
    "/proc/self/mem",
    "missing.img",
    ".",
    "fuzzvg",
    "lv",
    "pv0",
];

/// Words a parser dispatches on (extent types, segment types, access).
const WORDS: &[&str] = &[
    "RW",
    "RDONLY",
    "NOACCESS",
    "FLAT",
    "SPARSE",
    "ZERO",
    "VMFS",
    "VMFSSPARSE",
    "SESPARSE",
    "monolithicSparse",
    "streamOptimized",
    "twoGbMaxExtentSparse",
    "linear",
    "striped",
    "thin",
    "mirror",
    "raid1",
    "ffffffff",
    "READ",
    "WRITE",
    "VISIBLE",
    "stripes",
    "stripe_count",
    "extent_count",
    "start_extent",
    "pe_start",
    "pe_count",
];

fn spans(t: &[u8], pred: impl Fn(u8) -> bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if pred(t[i]) {
            let s = i;
            while i < t.len() && pred(t[i]) {
                i += 1;
            }
            out.push((s, i));
        } else {
            i += 1;
        }
    }
    out
}

fn quoted(t: &[u8]) -> Vec<(usize, usize)> {
    let q: Vec<usize> = t.iter().enumerate().filter(|(_, &c)| c == b'"').map(|(i, _)| i).collect();
    q.chunks_exact(2).map(|p| (p[0] + 1, p[1])).collect()
}

fn lines(t: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut s = 0;
    for (i, &c) in t.iter().enumerate() {
        if c == b'\n' {
            out.push((s, i + 1));
            s = i + 1;
        }
    }
    if s < t.len() {
        out.push((s, t.len()));
    }
    out
}

fn splice(t: &mut Vec<u8>, (s, e): (usize, usize), with: &[u8]) {
    t.splice(s..e, with.iter().copied());
}

/// Mutate `t` once; returns what was done.
pub fn mutate(rng: &mut Rng, t: &mut Vec<u8>) -> String {
    let show = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        if s.len() > 60 {
            format!("{:?}...", &s[..s.char_indices().nth(60).map_or(s.len(), |c| c.0)])
        } else {
            format!("{s:?}")
        }
    };
    match rng.weighted(&[35, 15, 8, 8, 8, 8, 6, 6, 6]) {
        0 => {
            let nums = spans(t, |c| c.is_ascii_digit());
            if nums.is_empty() {
                return mutate_bytes(rng, t);
            }
            let span = *rng.pick(&nums);
            let old = t[span.0..span.1].to_vec();
            let v: u128 = std::str::from_utf8(&old).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
            let new = match rng.index(4) {
                0 => (v + 1 + rng.below(4) as u128).to_string(),
                1 => v.saturating_sub(1).to_string(),
                2 => (v * (1 << (1 + rng.below(40)))).to_string(),
                _ => rng.pick(NUMBERS).to_string(),
            };
            splice(t, span, new.as_bytes());
            format!("number {} at {} -> {new:?}", show(&old), span.0)
        }
        1 => {
            let qs = quoted(t);
            if qs.is_empty() {
                return mutate_bytes(rng, t);
            }
            let span = *rng.pick(&qs);
            let old = t[span.0..span.1].to_vec();
            let new = if rng.chance(1, 8) { "A".repeat(1 + rng.index(8000)) } else { rng.pick(NAMES).to_string() };
            splice(t, span, new.as_bytes());
            format!("string {} -> {}", show(&old), show(new.as_bytes()))
        }
        2 => {
            let ls = lines(t);
            if ls.is_empty() {
                return mutate_bytes(rng, t);
            }
            let l = *rng.pick(&ls);
            let old = t[l.0..l.1].to_vec();
            splice(t, l, b"");
            format!("delete line {}", show(&old))
        }
        3 => {
            let ls = lines(t);
            if ls.is_empty() {
                return mutate_bytes(rng, t);
            }
            let l = *rng.pick(&ls);
            let line = t[l.0..l.1].to_vec();
            let times = if rng.chance(1, 4) { 1 + rng.index(2000) } else { 1 };
            let rep = line.repeat(times + 1);
            splice(t, l, &rep);
            format!("repeat line {} x{times}", show(&line))
        }
        4 => {
            let words = spans(t, |c| c.is_ascii_alphabetic() || c == b'_');
            if words.is_empty() {
                return mutate_bytes(rng, t);
            }
            let span = *rng.pick(&words);
            let old = t[span.0..span.1].to_vec();
            let new = rng.pick(WORDS);
            splice(t, span, new.as_bytes());
            format!("word {} -> {new}", show(&old))
        }
        5 => {
            let syms: Vec<usize> =
                t.iter().enumerate().filter(|(_, &c)| b"{}[]\"=,#\n".contains(&c)).map(|(i, _)| i).collect();
            if syms.is_empty() {
                return mutate_bytes(rng, t);
            }
            let at = *rng.pick(&syms);
            let c = t.remove(at);
            format!("delete {:?} at {at}", c as char)
        }
        6 => {
            let at = rng.index(t.len() + 1);
            let depth = 1 + rng.index(20_000);
            let open = if rng.chance(1, 2) { "a {\n" } else { "a = [" };
            let ins = open.repeat(depth);
            t.splice(at..at, ins.bytes());
            format!("insert {depth} x {open:?} at {at}")
        }
        7 => {
            let at = rng.index(t.len() + 1);
            t.truncate(at);
            format!("cut text at {at}")
        }
        _ => mutate_bytes(rng, t),
    }
}

fn mutate_bytes(rng: &mut Rng, t: &mut Vec<u8>) -> String {
    if t.is_empty() {
        t.push(b'{');
        return "text was empty: insert '{'".into();
    }
    let at = rng.index(t.len());
    let v = match rng.index(4) {
        0 => 0,
        1 => b'\n',
        2 => 0xff,
        _ => rng.next_u64() as u8,
    };
    let old = t[at];
    t[at] = v;
    format!("text byte {at}: {old:#04x} -> {v:#04x}")
}
