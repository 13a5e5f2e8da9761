//! A logical volume as a block device: its segments mapped onto the PVs
//! (the kernel's dm-linear and dm-stripe targets, which `vgchange -ay`
//! loads for "striped" segments).
//!
//! On-disk rules relied on (checked when the VG is assembled, see
//! [`vg`](super::vg)):
//! - An LV is a run of segments that tile its extents from 0 with no gap
//!   or overlap. Each "striped" segment has `stripe_count` areas, each a PV
//!   and a first physical extent, every area `extent_count / stripe_count`
//!   extents long. PV extent `e` starts at byte `pe_start + e * extent_size`
//!   of the PV's device (both in 512-byte sectors in the metadata).
//! - One stripe is a linear mapping. With more, the segment is cut into
//!   chunks of `stripe_size` sectors dealt round the areas in turn:
//!   chunk `c` lives in area `c % stripe_count`, as that area's chunk
//!   `c / stripe_count` (dm-stripe's `stripe_map_sector`).

use std::fmt;
use std::io;
use std::sync::Arc;

use crate::BlockDevice;

/// What `info` shows for an LV: where it is, how big, and how it is laid
/// out, so a user can see why an LV cannot be opened before trying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LvInfo {
    pub(crate) vg: String,
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) size: u64,
    pub(crate) segment_types: Vec<String>,
    pub(crate) max_stripes: u64,
    pub(crate) visible: bool,
}

impl LvInfo {
    /// The volume group's name.
    pub fn vg(&self) -> &str {
        &self.vg
    }

    /// The LV's name (`/dev/VG/NAME`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The LV's uuid.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The distinct segment types in the LV's order: `["striped"]` for a
    /// linear or striped LV; anything else cannot be opened.
    pub fn segment_types(&self) -> &[String] {
        &self.segment_types
    }

    /// The most stripes any segment has: 1 for a linear LV.
    pub fn stripes(&self) -> u64 {
        self.max_stripes
    }

    /// Whether LVM shows the LV (`lvs`): hidden LVs are parts of others
    /// (a thin pool's data, a RAID image, a cache's origin) and not
    /// filesystems of their own.
    pub fn visible(&self) -> bool {
        self.visible
    }
}

impl fmt::Display for LvInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} ({} bytes, {}",
            self.vg,
            self.name,
            self.size,
            self.segment_types.join("+")
        )?;
        if self.segment_types == ["striped"] {
            if self.max_stripes == 1 {
                write!(f, ", linear")?;
            } else {
                write!(f, ", {} stripes", self.max_stripes)?;
            }
        }
        if !self.visible {
            write!(f, ", hidden")?;
        }
        write!(f, ")")
    }
}

/// One segment, in bytes: `len` bytes of the LV from `start`, dealt in
/// `chunk`-byte pieces round `areas` (device, byte offset of the area's
/// first extent). A linear segment has one area and `chunk == len`.
pub(crate) struct Segment {
    pub(crate) start: u64,
    pub(crate) len: u64,
    pub(crate) chunk: u64,
    pub(crate) areas: Vec<(Arc<dyn BlockDevice>, u64)>,
}

impl Segment {
    /// Where LV byte `start + rel` is: the area's device, the byte on it,
    /// and how many bytes from there stay in that area's run.
    fn map(&self, rel: u64) -> (&Arc<dyn BlockDevice>, u64, u64) {
        let n = self.areas.len() as u64;
        let (area, at, run) = if n <= 1 {
            (0, rel, self.len - rel)
        } else {
            let c = rel / self.chunk;
            let within = rel % self.chunk;
            ((c % n) as usize, (c / n) * self.chunk + within, self.chunk - within)
        };
        let (dev, base) = &self.areas[area];
        (dev, base + at, run.min(self.len - rel))
    }
}

/// An LVM2 logical volume (linear or striped) presented as a device.
///
/// Reads and writes go to the PVs' devices at the extents the VG metadata
/// gives; [`flush`](BlockDevice::flush) flushes every PV the LV uses. Made
/// by [`VolumeGroup::open`](super::VolumeGroup::open), which has checked
/// the mapping against each device.
pub struct LogicalVolume {
    info: LvInfo,
    segments: Vec<Segment>,
    devices: Vec<Arc<dyn BlockDevice>>,
    writable: bool,
}

impl fmt::Debug for LogicalVolume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogicalVolume")
            .field("info", &self.info)
            .field("segments", &self.segments.len())
            .field("writable", &self.writable)
            .finish()
    }
}

impl LogicalVolume {
    /// `segments` tile `0..info.size` in order (the VG assembly checked).
    pub(crate) fn new(info: LvInfo, segments: Vec<Segment>, writable: bool) -> Self {
        let mut devices: Vec<Arc<dyn BlockDevice>> = Vec::new();
        for (d, _) in segments.iter().flat_map(|s| s.areas.iter()) {
            if !devices.iter().any(|e| Arc::ptr_eq(e, d)) {
                devices.push(d.clone());
            }
        }
        LogicalVolume {
            info,
            segments,
            devices,
            writable,
        }
    }

    /// The LV's description: VG, name, size, segment types — what a
    /// `DiskImage` layer would say, for `info` (an LV is not a container
    /// format, so it has no [`DiskFormat`](crate::DiskFormat)).
    pub fn describe(&self) -> LvInfo {
        self.info.clone()
    }

    fn check(&self, off: u64, n: usize) -> io::Result<()> {
        match off.checked_add(n as u64) {
            Some(e) if e <= self.info.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "access of {n} bytes at offset {off} past the end of logical volume {}/{} ({} bytes)",
                    self.info.vg, self.info.name, self.info.size
                ),
            )),
        }
    }

    /// Call `f(device, device offset, range of the buffer)` for each
    /// piece of `off .. off + n` in order.
    fn each_piece(
        &self,
        off: u64,
        n: usize,
        mut f: impl FnMut(&Arc<dyn BlockDevice>, u64, std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        self.check(off, n)?;
        let mut done = 0usize;
        // The segment holding `off`: the last one starting at or before it.
        let mut i = self.segments.partition_point(|s| s.start <= off).saturating_sub(1);
        while done < n {
            let pos = off + done as u64;
            while i < self.segments.len() && self.segments[i].start + self.segments[i].len <= pos {
                i += 1;
            }
            let Some(seg) = self.segments.get(i) else {
                // Unreachable while the segments tile the LV; an error, not a panic.
                return Err(io::Error::other(format!("lvm2: no segment maps byte {pos}")));
            };
            let (dev, at, run) = seg.map(pos - seg.start);
            let take = run.min((n - done) as u64) as usize;
            f(dev, at, done..done + take)?;
            done += take;
        }
        Ok(())
    }
}

impl BlockDevice for LogicalVolume {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.each_piece(off, buf.len(), |dev, at, r| dev.read_at(at, &mut buf[r]))
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "logical volume opened read-only",
            ));
        }
        self.each_piece(off, buf.len(), |dev, at, r| dev.write_at(at, &buf[r]))
    }

    fn flush(&self) -> io::Result<()> {
        if !self.writable {
            return Ok(());
        }
        for d in &self.devices {
            d.flush()?;
        }
        Ok(())
    }

    fn size(&self) -> u64 {
        self.info.size
    }

    fn read_only(&self) -> bool {
        !self.writable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_blockdev::MemDevice;

    fn info(size: u64) -> LvInfo {
        LvInfo {
            vg: "vg".into(),
            name: "lv".into(),
            id: "x".into(),
            size,
            segment_types: vec!["striped".into()],
            max_stripes: 2,
            visible: true,
        }
    }

    /// A segment for the reference: start, length, chunk, (device, base) per area.
    type Layout = Vec<(u64, u64, u64, Vec<(usize, u64)>)>;

    /// dm-stripe's rule computed sector by sector, to check the mapping.
    fn reference(segs: &Layout, off: u64) -> (usize, u64) {
        for (start, len, chunk, areas) in segs {
            if off >= *start && off < start + len {
                let rel = off - start;
                if areas.len() == 1 {
                    return (areas[0].0, areas[0].1 + rel);
                }
                let c = rel / chunk;
                let (d, b) = areas[(c % areas.len() as u64) as usize];
                return (d, b + (c / areas.len() as u64) * chunk + rel % chunk);
            }
        }
        unreachable!()
    }

    #[test]
    fn linear_and_striped_segments_map_like_device_mapper() {
        let devs: Vec<Arc<dyn BlockDevice>> = (0..3).map(|_| Arc::new(MemDevice::new(1 << 20)) as _).collect();
        // 64 KiB linear on dev 0 at 512 KiB; 96 KiB in 3 stripes of 8 KiB
        // chunks; 16 KiB linear on dev 2.
        let layout: Layout = vec![
            (0, 65536, 65536, vec![(0, 524288)]),
            (65536, 98304, 8192, vec![(1, 0), (2, 65536), (0, 0)]),
            (163840, 16384, 16384, vec![(2, 4096)]),
        ];
        let segs = layout
            .iter()
            .map(|(start, len, chunk, areas)| Segment {
                start: *start,
                len: *len,
                chunk: *chunk,
                areas: areas.iter().map(|(d, b)| (devs[*d].clone(), *b)).collect(),
            })
            .collect();
        let lv = LogicalVolume::new(info(180224), segs, true);
        assert_eq!(lv.devices.len(), 3);
        // Write a pattern across everything in odd-sized pieces, then check
        // every sector landed where the reference mapping says.
        let data: Vec<u8> = (0..180224u32).map(|i| (i / 512 * 7 + i) as u8).collect();
        let mut off = 0usize;
        for piece in [1usize, 511, 5000, 70000, 3, 100000].iter().cycle() {
            let end = (off + piece).min(data.len());
            lv.write_at(off as u64, &data[off..end]).unwrap();
            off = end;
            if off == data.len() {
                break;
            }
        }
        for s in (0..180224u64).step_by(512) {
            let (d, at) = reference(&layout, s);
            let mut b = [0u8; 512];
            devs[d].read_at(at, &mut b).unwrap();
            assert_eq!(&b[..], &data[s as usize..s as usize + 512], "sector at {s}");
        }
        let mut back = vec![0u8; data.len()];
        lv.read_at(0, &mut back).unwrap();
        assert_eq!(back, data);
        let mut b = vec![0u8; 9000];
        lv.read_at(60000, &mut b).unwrap();
        assert_eq!(&b[..], &data[60000..69000]);
        lv.flush().unwrap();

        // Past the end, and overflowing offsets.
        assert_eq!(
            lv.read_at(180224 - 1, &mut [0u8; 2]).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert!(lv.read_at(u64::MAX, &mut [0u8; 2]).is_err());
        assert!(lv.write_at(180224, b"x").is_err());
        lv.read_at(180224, &mut []).unwrap();
    }

    #[test]
    fn read_only_refuses_writes() {
        let d: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4096));
        let seg = Segment {
            start: 0,
            len: 4096,
            chunk: 4096,
            areas: vec![(d, 0)],
        };
        let lv = LogicalVolume::new(info(4096), vec![seg], false);
        assert!(lv.read_only());
        assert_eq!(
            lv.write_at(0, b"x").unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        assert!(lv
            .describe()
            .to_string()
            .starts_with("vg/lv (4096 bytes, striped, 2 stripes"));
    }
}
