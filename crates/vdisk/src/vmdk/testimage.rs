//! Test images made in memory: hosted sparse extents (with or without a
//! redundant GD, zeroed-grain GTEs, lazily allocated GTs) and
//! streamOptimized ones with the GD in the footer, so the reader can be
//! tested on layouts qemu-img does not write.

use flate2::{Compress, Compression, FlushCompress};

use super::header::{GD_AT_END, SECTOR};

/// How to lay the image out.
#[derive(Debug, Clone)]
pub(crate) struct Opts {
    pub(crate) grain: u64,
    pub(crate) gtes: u32,
    pub(crate) rgd: bool,
    pub(crate) zero_grain: bool,
    pub(crate) lazy_gts: bool,
    pub(crate) stream: bool,
    pub(crate) descriptor: Option<String>,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            grain: 8,
            gtes: 16,
            rgd: true,
            zero_grain: false,
            lazy_gts: false,
            stream: false,
            descriptor: None,
        }
    }
}

/// Where the builder put things, for tests that corrupt them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Layout {
    pub(crate) gd: u64,
    pub(crate) rgd: u64,
    /// GT sector by GD index (0 = none).
    pub(crate) gts: Vec<u64>,
    /// Grain sector by grain index (0 = none).
    pub(crate) grains: Vec<u64>,
}

fn put_u32(v: &mut [u8], at: usize, x: u32) {
    v[at..at + 4].copy_from_slice(&x.to_le_bytes());
}
fn put_u64(v: &mut [u8], at: usize, x: u64) {
    v[at..at + 8].copy_from_slice(&x.to_le_bytes());
}

#[allow(clippy::too_many_arguments)]
fn header(o: &Opts, capacity: u64, desc: (u64, u64), rgd: u64, gd: u64, overhead: u64) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..4].copy_from_slice(b"KDMV");
    put_u32(&mut h, 4, if o.stream { 3 } else { 1 });
    let mut flags = 1u32;
    if o.rgd {
        flags |= 2;
    }
    if o.zero_grain {
        flags |= 4;
    }
    if o.stream {
        flags |= (1 << 16) | (1 << 17);
        h[77] = 1;
    }
    put_u32(&mut h, 8, flags);
    put_u64(&mut h, 12, capacity);
    put_u64(&mut h, 20, o.grain);
    put_u64(&mut h, 28, desc.0);
    put_u64(&mut h, 36, desc.1);
    put_u32(&mut h, 44, o.gtes);
    put_u64(&mut h, 48, rgd);
    put_u64(&mut h, 56, gd);
    put_u64(&mut h, 64, overhead);
    h[73..77].copy_from_slice(b"\n \r\n");
    h
}

fn pad(v: &mut Vec<u8>) {
    v.resize(v.len().next_multiple_of(SECTOR as usize), 0);
}

fn sector_of(v: &[u8]) -> u64 {
    v.len() as u64 / SECTOR
}

/// A sparse (or stream) extent holding `disk` (a whole number of sectors).
pub(crate) fn build(disk: &[u8], o: &Opts) -> (Vec<u8>, Layout) {
    assert_eq!(disk.len() % 512, 0);
    let capacity = disk.len() as u64 / SECTOR;
    let gb = (o.grain * SECTOR) as usize;
    let n_grains = capacity.div_ceil(o.grain) as usize;
    let gtes = o.gtes as usize;
    let n_gts = n_grains.div_ceil(gtes);
    let gt_sectors = (gtes as u64 * 4).div_ceil(SECTOR);
    let gd_sectors = (n_gts as u64 * 4).div_ceil(SECTOR);
    let grain_data = |i: usize| {
        let mut g = vec![0u8; gb];
        let end = ((i + 1) * gb).min(disk.len());
        g[..end - i * gb].copy_from_slice(&disk[i * gb..end]);
        g
    };
    let nonzero = |i: usize| grain_data(i).iter().any(|&b| b != 0);
    let gt_used = |t: usize| (t * gtes..((t + 1) * gtes).min(n_grains)).any(nonzero);

    let mut v = vec![0u8; 512];
    let desc = match &o.descriptor {
        Some(text) => {
            let at = sector_of(&v);
            v.extend_from_slice(text.as_bytes());
            pad(&mut v);
            (at, sector_of(&v) - at)
        }
        None => (0, 0),
    };
    let mut lay = Layout {
        gts: vec![0; n_gts],
        grains: vec![0; n_grains],
        ..Layout::default()
    };
    if o.stream {
        // Grains behind markers, then GTs, GD and the footer.
        let overhead = sector_of(&v);
        for i in 0..n_grains {
            if !nonzero(i) {
                continue;
            }
            lay.grains[i] = sector_of(&v);
            let mut c = Compress::new(Compression::fast(), true);
            let mut z = Vec::with_capacity(gb + 64);
            c.compress_vec(&grain_data(i), &mut z, FlushCompress::Finish).unwrap();
            v.extend_from_slice(&(i as u64 * o.grain).to_le_bytes());
            v.extend_from_slice(&(z.len() as u32).to_le_bytes());
            v.extend_from_slice(&z);
            pad(&mut v);
        }
        let marker = |v: &mut Vec<u8>, val: u64, ty: u32| {
            let mut m = [0u8; 512];
            put_u64(&mut m, 0, val);
            put_u32(&mut m, 12, ty);
            v.extend_from_slice(&m);
        };
        for t in 0..n_gts {
            marker(&mut v, gt_sectors, 1);
            lay.gts[t] = sector_of(&v);
            let mut gt = vec![0u8; (gt_sectors * SECTOR) as usize];
            for j in 0..gtes.min(n_grains - t * gtes) {
                put_u32(&mut gt, j * 4, lay.grains[t * gtes + j] as u32);
            }
            v.extend_from_slice(&gt);
        }
        marker(&mut v, gd_sectors, 2);
        lay.gd = sector_of(&v);
        let mut gd = vec![0u8; (gd_sectors * SECTOR) as usize];
        for t in 0..n_gts {
            put_u32(&mut gd, t * 4, lay.gts[t] as u32);
        }
        v.extend_from_slice(&gd);
        marker(&mut v, 1, 3);
        v.extend_from_slice(&header(o, capacity, desc, 0, lay.gd, overhead));
        marker(&mut v, 0, 0);
        v[..512].copy_from_slice(&header(o, capacity, desc, 0, GD_AT_END, overhead));
        return (v, lay);
    }
    let tables = |v: &mut Vec<u8>| {
        let dir = sector_of(v);
        v.resize(v.len() + (gd_sectors * SECTOR) as usize, 0);
        let mut gts = vec![0u64; n_gts];
        for (t, slot) in gts.iter_mut().enumerate() {
            if o.lazy_gts && !gt_used(t) {
                continue;
            }
            *slot = sector_of(v);
            put_u32(v, (dir * SECTOR) as usize + t * 4, *slot as u32);
            v.resize(v.len() + (gt_sectors * SECTOR) as usize, 0);
        }
        (dir, gts)
    };
    let (rgd, rgts) = if o.rgd { tables(&mut v) } else { (0, vec![0; n_gts]) };
    let (gd, gts) = tables(&mut v);
    v.resize(v.len().next_multiple_of(gb), 0);
    let overhead = sector_of(&v);
    for i in 0..n_grains {
        let t = i / gtes;
        if gts[t] == 0 {
            continue;
        }
        let gte = if nonzero(i) {
            lay.grains[i] = sector_of(&v);
            v.extend_from_slice(&grain_data(i));
            lay.grains[i] as u32
        } else if o.zero_grain {
            1
        } else {
            0
        };
        for table in [gts[t], rgts[t]] {
            if table != 0 {
                put_u32(&mut v, (table * SECTOR) as usize + (i % gtes) * 4, gte);
            }
        }
    }
    v[..512].copy_from_slice(&header(o, capacity, desc, rgd, gd, overhead));
    lay.gd = gd;
    lay.rgd = rgd;
    lay.gts = gts;
    (v, lay)
}

/// A disk of `sectors` with recognisable data in some grains and zeros in
/// others.
pub(crate) fn sample_disk(sectors: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; sectors * 512];
    let mut x = seed | 1;
    for (i, chunk) in v.chunks_mut(4096).enumerate() {
        if i % 3 == 1 {
            continue;
        }
        for b in chunk.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    v
}
