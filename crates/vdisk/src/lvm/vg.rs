//! Volume groups: the text metadata interpreted and checked, and each VG
//! assembled from the physical volumes found among many devices.
//!
//! On-disk rules relied on (`lib/format_text/import_vsn1.c`):
//! - The metadata text has one top-level section, named for the VG, with
//!   `id`, `seqno` (raised by every change), `status`, `extent_size` (in
//!   512-byte sectors) and the sections `physical_volumes` (each PV:
//!   `id`, `device` as a hint only, `pe_start` in sectors, `pe_count`) and
//!   `logical_volumes` (each LV: `id`, `status` (with "VISIBLE" unless
//!   it is part of another LV), `segment_count`, and one subsection per
//!   segment: `start_extent`, `extent_count`, `type` (default "striped"),
//!   and for striped segments `stripe_count`, `stripe_size` (sectors;
//!   only with more than one stripe) and `stripes`: PV key, first extent,
//!   once per stripe; during a `pvmove` a stripe names an LV instead).
//! - Every PV with a metadata area holds a copy; the copy with the highest
//!   seqno is the VG, and two different copies may not share a seqno
//!   (LVM writes one text per seqno to every area).
//! - PVs are matched to devices by uuid, the label's and the metadata's.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io;
use std::sync::Arc;

use super::label::{physical_volume, PhysicalVolume, SECTOR};
use super::lv::{LogicalVolume, LvInfo, Segment};
use super::mda::read_metadata;
use super::metadata::{parse, Section, Value};
use super::{corrupt_lvm, unsupported_lvm};
use crate::BlockDevice;

/// The one segment type mapped here: linear (one stripe) and striped.
const STRIPED: &str = "striped";

/// One PV as the VG metadata lists it.
#[derive(Debug, Clone, PartialEq)]
struct PvMeta {
    key: String,
    id: String,
    device_hint: String,
    pe_start: u64,
    pe_count: u64,
}

/// One segment as the metadata lists it, extents checked.
#[derive(Debug, Clone, PartialEq)]
struct SegMeta {
    start_extent: u64,
    extent_count: u64,
    seg_type: String,
    /// Chunk size in sectors (striped, more than one stripe).
    stripe_size: u64,
    /// (index into the VG's PVs, first extent), for striped segments.
    stripes: Vec<(usize, u64)>,
    /// A snapshot segment's origin LV.
    origin: Option<String>,
    /// A striped segment whose stripes are LVs, not PVs: the moved LV of a
    /// `pvmove` in progress (stripes on the hidden `pvmove0` mirror).
    on_lv: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
struct LvMeta {
    name: String,
    id: String,
    status: Vec<String>,
    segments: Vec<SegMeta>,
    extents: u64,
}

/// One VG's metadata, as one metadata area holds it.
#[derive(Debug, Clone, PartialEq)]
struct VgMeta {
    name: String,
    id: String,
    seqno: u64,
    status: Vec<String>,
    extent_size: u64,
    pvs: Vec<PvMeta>,
    lvs: Vec<LvMeta>,
    /// The VG's section as parsed: two copies with one seqno must agree
    /// on all of it, not only on what is interpreted here.
    section: Section,
}

fn int(sec: &Section, key: &str, ctx: &dyn fmt::Display) -> io::Result<u64> {
    match sec.value(key) {
        Some(Value::Int(n)) => u64::try_from(*n).map_err(|_| corrupt_lvm(format!("{ctx}: {key} = {n} is negative"))),
        Some(_) => Err(corrupt_lvm(format!("{ctx}: {key} is not an integer"))),
        None => Err(corrupt_lvm(format!("{ctx}: no {key}"))),
    }
}

fn string(sec: &Section, key: &str, ctx: &dyn fmt::Display) -> io::Result<String> {
    match sec.value(key) {
        Some(Value::Str(s)) => Ok(s.clone()),
        Some(_) => Err(corrupt_lvm(format!("{ctx}: {key} is not a string"))),
        None => Err(corrupt_lvm(format!("{ctx}: no {key}"))),
    }
}

/// A list of flags (`status`); absent is empty.
fn flags(sec: &Section, key: &str, ctx: &dyn fmt::Display) -> io::Result<Vec<String>> {
    match sec.value(key) {
        None => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::Str(s) => Ok(s.clone()),
                _ => Err(corrupt_lvm(format!("{ctx}: {key} holds a non-string"))),
            })
            .collect(),
        Some(_) => Err(corrupt_lvm(format!("{ctx}: {key} is not a list"))),
    }
}

/// The uuid without dashes, for comparing the metadata's with a label's.
fn bare(uuid: &str) -> String {
    uuid.chars().filter(|c| *c != '-').collect()
}

/// Interpret a parsed metadata text. Checks everything that needs no
/// device: numbers, references between sections, extent arithmetic.
fn interpret(top: &Section) -> io::Result<VgMeta> {
    let mut vgs = top.sections();
    let (name, vg) = vgs
        .next()
        .ok_or_else(|| corrupt_lvm("metadata text has no volume group section"))?;
    if let Some((other, _)) = vgs.next() {
        return Err(corrupt_lvm(format!(
            "metadata text has two volume group sections, {name:?} and {other:?}"
        )));
    }
    let ctx = format!("volume group {name}");
    let id = string(vg, "id", &ctx)?;
    let seqno = int(vg, "seqno", &ctx)?;
    let status = flags(vg, "status", &ctx)?;
    let extent_size = int(vg, "extent_size", &ctx)?;
    if extent_size == 0 {
        return Err(corrupt_lvm(format!("{ctx}: extent_size is 0")));
    }
    let extent_bytes = extent_size
        .checked_mul(SECTOR)
        .ok_or_else(|| corrupt_lvm(format!("{ctx}: extent_size {extent_size} overflows")))?;

    let mut pvs = Vec::new();
    // PV keys and uuids seen: lookups stay linear in a hostile text's size.
    let mut keys: HashMap<String, usize> = HashMap::new();
    let mut ids = HashSet::new();
    if let Some(pvsec) = vg.section("physical_volumes") {
        for (key, pv) in pvsec.sections() {
            let pctx = format!("{ctx}, physical volume {key}");
            let id = string(pv, "id", &pctx)?;
            let pe_start = int(pv, "pe_start", &pctx)?;
            let pe_count = int(pv, "pe_count", &pctx)?;
            pe_start
                .checked_mul(SECTOR)
                .and_then(|s| pe_count.checked_mul(extent_bytes).and_then(|e| s.checked_add(e)))
                .ok_or_else(|| corrupt_lvm(format!("{pctx}: pe_start {pe_start} + {pe_count} extents overflows")))?;
            if !ids.insert(bare(&id)) {
                return Err(corrupt_lvm(format!("{ctx}: PV {id} is listed twice")));
            }
            let device_hint = match pv.value("device") {
                Some(Value::Str(s)) => s.clone(),
                _ => String::new(),
            };
            keys.insert(key.to_string(), pvs.len());
            pvs.push(PvMeta {
                key: key.to_string(),
                id,
                device_hint,
                pe_start,
                pe_count,
            });
        }
    }

    let mut lvs = Vec::new();
    if let Some(lvsec) = vg.section("logical_volumes") {
        let names: HashSet<&str> = lvsec.sections().map(|(n, _)| n).collect();
        let refs = Refs {
            pvs: &pvs,
            keys: &keys,
            lvs: &names,
        };
        for (lvname, lv) in lvsec.sections() {
            lvs.push(interpret_lv(&ctx, lvname, lv, &refs, extent_bytes)?);
        }
    }
    check_no_shared_extents(&ctx, &pvs, &lvs)?;
    Ok(VgMeta {
        name: name.to_string(),
        id,
        seqno,
        status,
        extent_size,
        pvs,
        lvs,
        section: vg.clone(),
    })
}

/// What a segment's stripes may name: the VG's PVs (by key) and its LVs.
struct Refs<'a> {
    pvs: &'a [PvMeta],
    keys: &'a HashMap<String, usize>,
    lvs: &'a HashSet<&'a str>,
}

fn interpret_lv(vgctx: &str, name: &str, lv: &Section, refs: &Refs, extent_bytes: u64) -> io::Result<LvMeta> {
    let ctx = format!("{vgctx}, logical volume {name}");
    let id = string(lv, "id", &ctx)?;
    let status = flags(lv, "status", &ctx)?;
    let mut segments = Vec::new();
    for (sname, seg) in lv.sections() {
        segments.push(interpret_segment(&format!("{ctx}, {sname}"), seg, refs, extent_bytes)?);
    }
    let count = int(lv, "segment_count", &ctx)?;
    if count != segments.len() as u64 {
        return Err(corrupt_lvm(format!(
            "{ctx}: segment_count is {count} but {} segments are listed",
            segments.len()
        )));
    }
    // The segments must tile the LV's extents from 0: no gap, no overlap.
    segments.sort_by_key(|s| s.start_extent);
    let mut next = 0u64;
    for s in &segments {
        if s.start_extent != next {
            let what = if s.start_extent > next {
                "a gap"
            } else {
                "overlapping segments"
            };
            return Err(corrupt_lvm(format!(
                "{ctx}: {what} at extent {} (the segment before ends at {next})",
                s.start_extent.min(next)
            )));
        }
        next = s
            .start_extent
            .checked_add(s.extent_count)
            .ok_or_else(|| corrupt_lvm(format!("{ctx}: segment extents overflow")))?;
    }
    next.checked_mul(extent_bytes)
        .ok_or_else(|| corrupt_lvm(format!("{ctx}: {next} extents overflow")))?;
    Ok(LvMeta {
        name: name.to_string(),
        id,
        status,
        segments,
        extents: next,
    })
}

fn interpret_segment(ctx: &str, seg: &Section, refs: &Refs, extent_bytes: u64) -> io::Result<SegMeta> {
    let start_extent = int(seg, "start_extent", &ctx)?;
    let extent_count = int(seg, "extent_count", &ctx)?;
    if extent_count == 0 {
        return Err(corrupt_lvm(format!("{ctx}: extent_count is 0")));
    }
    let seg_type = match seg.value("type") {
        None => STRIPED.to_string(),
        Some(Value::Str(s)) => s.clone(),
        Some(_) => return Err(corrupt_lvm(format!("{ctx}: type is not a string"))),
    };
    let mut out = SegMeta {
        start_extent,
        extent_count,
        seg_type,
        stripe_size: 0,
        stripes: Vec::new(),
        origin: None,
        on_lv: None,
    };
    if out.seg_type == "snapshot" {
        out.origin = Some(string(seg, "origin", &ctx)?);
    }
    if out.seg_type != STRIPED {
        // Other types map through sub-LVs; they are refused when opened.
        return Ok(out);
    }
    let stripe_count = int(seg, "stripe_count", &ctx)?;
    let list = match seg.value("stripes") {
        Some(Value::Array(a)) => a,
        _ => return Err(corrupt_lvm(format!("{ctx}: no stripes list"))),
    };
    if stripe_count == 0 || list.len() as u64 != stripe_count.saturating_mul(2) {
        return Err(corrupt_lvm(format!(
            "{ctx}: stripe_count {stripe_count} but the stripes list has {} entries",
            list.len()
        )));
    }
    if extent_count % stripe_count != 0 {
        return Err(corrupt_lvm(format!(
            "{ctx}: {extent_count} extents do not divide into {stripe_count} stripes"
        )));
    }
    let per_stripe = extent_count / stripe_count;
    if stripe_count > 1 {
        out.stripe_size = int(seg, "stripe_size", &ctx)?;
        // dm-stripe refuses a table whose per-stripe length is not a whole
        // number of chunks; so do we.
        let area_bytes = per_stripe.checked_mul(extent_bytes);
        let chunk = out.stripe_size.checked_mul(SECTOR);
        let whole = match (area_bytes, chunk) {
            (Some(a), Some(c)) if c > 0 => a % c == 0,
            _ => false,
        };
        if !whole {
            return Err(corrupt_lvm(format!(
                "{ctx}: stripe_size {} sectors does not divide the {per_stripe}-extent stripes",
                out.stripe_size
            )));
        }
    }
    for pair in list.chunks(2) {
        let (Value::Str(key), Value::Int(first)) = (&pair[0], &pair[1]) else {
            return Err(corrupt_lvm(format!(
                "{ctx}: stripes must be pairs of PV name and extent"
            )));
        };
        let Some(&idx) = refs.keys.get(key) else {
            if refs.lvs.contains(key.as_str()) {
                out.on_lv = Some(key.clone());
                out.stripes.clear();
                return Ok(out);
            }
            return Err(corrupt_lvm(format!(
                "{ctx}: stripe on {key:?}, which is not a PV of the VG"
            )));
        };
        let first = u64::try_from(*first).map_err(|_| corrupt_lvm(format!("{ctx}: negative extent {first}")))?;
        let pe_count = refs.pvs[idx].pe_count;
        if first.checked_add(per_stripe).is_none_or(|e| e > pe_count) {
            return Err(corrupt_lvm(format!(
                "{ctx}: extents {first}..+{per_stripe} of {key} are past its {pe_count} extents"
            )));
        }
        out.stripes.push((idx, first));
    }
    Ok(out)
}

/// No PV extent may belong to two LVs (or twice to one): a write to one
/// would change the other.
fn check_no_shared_extents(ctx: &str, pvs: &[PvMeta], lvs: &[LvMeta]) -> io::Result<()> {
    let mut used: Vec<(usize, u64, u64, &str)> = Vec::new();
    for lv in lvs {
        for s in &lv.segments {
            let per = s.extent_count / (s.stripes.len().max(1) as u64);
            for &(pv, first) in &s.stripes {
                used.push((pv, first, first + per, &lv.name));
            }
        }
    }
    used.sort();
    for w in used.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if a.0 == b.0 && b.1 < a.2 {
            return Err(corrupt_lvm(format!(
                "{ctx}: extent {} of PV {} belongs to both {} and {}",
                b.1, pvs[a.0].key, a.3, b.3
            )));
        }
    }
    Ok(())
}

/// A PV of the VG and the device that holds it, if one was given.
struct PvSlot {
    meta: PvMeta,
    device: Option<(String, Arc<dyn BlockDevice>)>,
}

/// A volume group assembled from its PVs: the newest metadata, and which
/// device holds each PV. Listing works even with PVs missing, so a user
/// sees what is there; [`open`](VolumeGroup::open) refuses an LV that
/// needs a missing one.
pub struct VolumeGroup {
    meta: VgMeta,
    pvs: Vec<PvSlot>,
    lvs: Vec<LvInfo>,
}

impl fmt::Debug for VolumeGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VolumeGroup")
            .field("name", &self.meta.name)
            .field("seqno", &self.meta.seqno)
            .field("lvs", &self.lvs)
            .finish()
    }
}

impl VolumeGroup {
    /// The VG's name (`/dev/NAME/...`). Two VGs may share a name (two
    /// cloned disks); [`id`](Self::id) tells them apart.
    pub fn name(&self) -> &str {
        &self.meta.name
    }

    /// The VG's uuid.
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    /// The metadata's sequence number: which copy was used.
    pub fn seqno(&self) -> u64 {
        self.meta.seqno
    }

    /// The extent size in bytes: the unit LVs are allocated in.
    pub fn extent_size(&self) -> u64 {
        self.meta.extent_size * SECTOR
    }

    /// The LVs, hidden ones included (see [`LvInfo::visible`]), in the
    /// metadata's order.
    pub fn logical_volumes(&self) -> &[LvInfo] {
        &self.lvs
    }

    /// The uuids of the VG's PVs that no given device holds, each with the
    /// device name LVM last saw it on (a hint only).
    pub fn missing_physical_volumes(&self) -> Vec<(&str, &str)> {
        self.pvs
            .iter()
            .filter(|p| p.device.is_none())
            .map(|p| (p.meta.id.as_str(), p.meta.device_hint.as_str()))
            .collect()
    }

    /// Open the LV named `lv` as a device.
    ///
    /// Refused (`Unsupported`): LVs with segments other than linear or
    /// striped (thin, RAID, mirror, cache, VDO, snapshots: the error names
    /// the type; a type with LVM's "+FLAG" suffix is refused too, since the
    /// flag changes its meaning), striped segments laid on another LV
    /// instead of PVs (a `pvmove` in progress), hidden LVs (parts of
    /// another LV), and writing a
    /// snapshot's origin (the snapshot would silently change with it) or
    /// an LV or VG without LVM's WRITE permission. `NotFound` for an LV
    /// not in the VG or one on a PV that no device holds (the error names
    /// its uuid). Writing needs every PV device the LV uses writable.
    pub fn open(&self, lv: &str, writable: bool) -> io::Result<LogicalVolume> {
        let vg = &self.meta.name;
        let Some(idx) = self.meta.lvs.iter().position(|l| l.name == lv) else {
            let names: Vec<&str> = self.lvs.iter().filter(|l| l.visible).map(|l| l.name.as_str()).collect();
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "lvm2: volume group {vg} has no logical volume {lv:?} (it has: {})",
                    names.join(", ")
                ),
            ));
        };
        let meta = &self.meta.lvs[idx];
        let info = self.lvs[idx].clone();
        if !info.visible {
            return Err(unsupported_lvm(format!(
                "{vg}/{lv} is a hidden part of another logical volume (thin pool data, RAID image, cache origin and the like), not a volume of its own"
            )));
        }
        for (n, s) in meta.segments.iter().enumerate() {
            if s.seg_type != STRIPED {
                return Err(unsupported_lvm(format!(
                    "{vg}/{lv}: segment {} has type {:?}; only linear and striped logical volumes are read",
                    n + 1,
                    s.seg_type
                )));
            }
            if let Some(other) = &s.on_lv {
                return Err(unsupported_lvm(format!(
                    "{vg}/{lv}: segment {} is mapped onto logical volume {other} (a pvmove in progress?), not onto physical volumes",
                    n + 1
                )));
            }
        }
        if writable {
            if !self.meta.status.iter().any(|s| s == "WRITE") || !meta.status.iter().any(|s| s == "WRITE") {
                return Err(unsupported_lvm(format!("{vg}/{lv} is read-only in the LVM metadata")));
            }
            let snapshot = self
                .meta
                .lvs
                .iter()
                .find(|other| other.segments.iter().any(|s| s.origin.as_deref() == Some(lv)));
            if let Some(snap) = snapshot {
                return Err(unsupported_lvm(format!(
                    "{vg}/{lv} is the origin of snapshot {}; writing it here would change the snapshot too (open it read-only)",
                    snap.name
                )));
            }
        }
        let extent = self.extent_size();
        let mut segments = Vec::with_capacity(meta.segments.len());
        for s in &meta.segments {
            let mut areas = Vec::with_capacity(s.stripes.len());
            for &(pv, first) in &s.stripes {
                let slot = &self.pvs[pv];
                let Some((dev_name, dev)) = &slot.device else {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!(
                            "lvm2: {vg}/{lv} needs physical volume {} (last seen as {:?}), which none of the devices given holds",
                            slot.meta.id, slot.meta.device_hint
                        ),
                    ));
                };
                if writable && dev.read_only() {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("lvm2: {vg}/{lv} cannot be written: {dev_name} is read-only"),
                    ));
                }
                // In range: checked against the device when the VG was assembled.
                areas.push((dev.clone(), slot.meta.pe_start * SECTOR + first * extent));
            }
            let len = s.extent_count * extent;
            let chunk = if areas.len() > 1 { s.stripe_size * SECTOR } else { len };
            segments.push(Segment {
                start: s.start_extent * extent,
                len,
                chunk,
                areas,
            });
        }
        Ok(LogicalVolume::new(info, segments, writable))
    }
}

/// A copy of a VG's metadata and where it came from.
struct Copy {
    meta: VgMeta,
    source: String,
}

/// Name an error with the device it came from, keeping its kind.
fn on(dev: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{dev}: {e}"))
}

/// The volume groups whose PVs are among `devs` (say, a disk and each of
/// its partitions; each with a name for messages).
///
/// Each device's label is read; each PV's metadata areas give copies of its
/// VG's metadata, and the copy with the highest seqno wins. A damaged label
/// is an error; a damaged metadata area is an error only when its PV has no
/// good copy (LVM, too, reads the other). Devices with no label are
/// skipped. Two devices with one PV uuid (a cloned disk given twice) and
/// two different copies with one seqno are errors: which one is meant
/// would be a guess.
pub fn volume_groups(devs: &[(String, Arc<dyn BlockDevice>)]) -> io::Result<Vec<VolumeGroup>> {
    let mut labelled: Vec<(&String, &Arc<dyn BlockDevice>, PhysicalVolume)> = Vec::new();
    for (name, dev) in devs {
        if let Some(pv) = physical_volume(dev.as_ref()).map_err(|e| on(name, e))? {
            if let Some((other, _, _)) = labelled.iter().find(|(_, _, p)| p.uuid() == pv.uuid()) {
                return Err(corrupt_lvm(format!(
                    "physical volume {} is on both {other} and {name} (a copied disk?)",
                    pv.uuid()
                )));
            }
            labelled.push((name, dev, pv));
        }
    }

    let mut copies: Vec<Copy> = Vec::new();
    for (name, dev, pv) in &labelled {
        let mut first_err = None;
        let mut good = false;
        for (i, area) in pv.metadata_areas().iter().enumerate() {
            let got = read_metadata(dev.as_ref(), *area).and_then(|t| match t {
                None => Ok(None),
                Some(text) => interpret(&parse(&text)?).map(Some),
            });
            match got {
                Ok(Some(meta)) => {
                    good = true;
                    copies.push(Copy {
                        meta,
                        source: format!("{name} (metadata area {})", i + 1),
                    });
                }
                Ok(None) => good = true,
                Err(e) => {
                    first_err.get_or_insert(on(name, e));
                }
            }
        }
        if let (false, Some(e)) = (good, first_err) {
            return Err(e);
        }
    }

    // The newest copy of each VG, by uuid.
    let mut newest: HashMap<String, usize> = HashMap::new();
    let mut order = Vec::new();
    for (i, c) in copies.iter().enumerate() {
        let key = bare(&c.meta.id);
        match newest.get(&key) {
            None => {
                newest.insert(key.clone(), i);
                order.push(key);
            }
            Some(&j) => {
                let best = &copies[j];
                if c.meta.seqno > best.meta.seqno {
                    newest.insert(key, i);
                } else if c.meta.seqno == best.meta.seqno && c.meta != best.meta {
                    return Err(corrupt_lvm(format!(
                        "volume group {}: {} and {} hold different metadata with the same seqno {}",
                        c.meta.name, best.source, c.source, c.meta.seqno
                    )));
                }
            }
        }
    }

    let mut out = Vec::new();
    for key in order {
        let meta = copies[newest[&key]].meta.clone();
        out.push(assemble(meta, &labelled)?);
    }
    Ok(out)
}

/// Match the VG's PVs to devices and check each PV's extents fit its device.
fn assemble(meta: VgMeta, labelled: &[(&String, &Arc<dyn BlockDevice>, PhysicalVolume)]) -> io::Result<VolumeGroup> {
    let extent = meta.extent_size * SECTOR;
    let mut pvs = Vec::with_capacity(meta.pvs.len());
    for p in &meta.pvs {
        let want = bare(&p.id);
        let device = labelled
            .iter()
            .find(|(_, _, pv)| bare(pv.uuid()) == want)
            .map(|(n, d, _)| ((*n).clone(), (*d).clone()));
        if let Some((name, dev)) = &device {
            // Overflow was ruled out when the metadata was interpreted.
            let end = p.pe_start * SECTOR + p.pe_count * extent;
            if end > dev.size() {
                return Err(corrupt_lvm(format!(
                    "volume group {}: PV {} ({name}) has {} extents from sector {}, ending at byte {end}, past the device's {} bytes",
                    meta.name,
                    p.id,
                    p.pe_count,
                    p.pe_start,
                    dev.size()
                )));
            }
        }
        pvs.push(PvSlot {
            meta: p.clone(),
            device,
        });
    }
    let lvs = meta
        .lvs
        .iter()
        .map(|l| {
            let mut seen = HashSet::new();
            let mut types: Vec<String> = Vec::new();
            for s in &l.segments {
                if seen.insert(s.seg_type.as_str()) {
                    types.push(s.seg_type.clone());
                }
            }
            LvInfo {
                vg: meta.name.clone(),
                name: l.name.clone(),
                id: l.id.clone(),
                size: l.extents * extent,
                segment_types: types,
                max_stripes: l.segments.iter().map(|s| s.stripes.len() as u64).max().unwrap_or(0),
                visible: l.status.iter().any(|s| s == "VISIBLE"),
            }
        })
        .collect();
    Ok(VolumeGroup { meta, pvs, lvs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lvm::label::build_label;
    use crate::lvm::mda::write_mda;
    use ext4kit_blockdev::MemDevice;

    /// The metadata text LVM 2.03 wrote for a VG of two 24 MiB PVs with a
    /// two-segment linear LV "lin" and a two-stripe LV "str".
    const TEXT: &str = include_str!("testdata/mda_text.txt");
    const PV0: &str = "UuS4C4QRYkIOoXWr6FW1spdJrdPSaERv";
    const PV1: &str = "dCJaNyCle5d4OS9LQZWnc5AcIMictzdo";
    const MIB: u64 = 1 << 20;

    /// A 24 MiB PV laid out as pvcreate does: label in sector 1, a metadata
    /// area from 4 KiB to 1 MiB, extents from 1 MiB.
    fn pv(uuid: &str, text: Option<&str>) -> Arc<dyn BlockDevice> {
        let d = MemDevice::new(24 * MIB as usize);
        let mdas: &[(u64, u64)] = if text.is_some() { &[(4096, MIB - 4096)] } else { &[] };
        d.write_at(512, &build_label(1, uuid, 24 * MIB, &[(MIB, 0)], mdas))
            .unwrap();
        if let Some(t) = text {
            write_mda(&d, 4096, MIB - 4096, 0x1600, t.as_bytes());
        }
        Arc::new(d)
    }

    fn devs(list: Vec<Arc<dyn BlockDevice>>) -> Vec<(String, Arc<dyn BlockDevice>)> {
        list.into_iter()
            .enumerate()
            .map(|(i, d)| (format!("dev{i}"), d))
            .collect()
    }

    fn one_vg(text: &str) -> io::Result<VolumeGroup> {
        let mut v = volume_groups(&devs(vec![pv(PV0, Some(text)), pv(PV1, Some(text))]))?;
        assert_eq!(v.len(), 1);
        Ok(v.remove(0))
    }

    fn err_of(text: &str) -> String {
        let e = one_vg(text).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        e.to_string()
    }

    #[test]
    fn assembles_what_lvm_wrote_and_maps_extents() {
        let d = devs(vec![
            pv(PV0, Some(TEXT)),
            pv(PV1, Some(TEXT)),
            Arc::new(MemDevice::new(4096)),
        ]);
        let vgs = volume_groups(&d).unwrap();
        assert_eq!(vgs.len(), 1);
        let vg = &vgs[0];
        assert_eq!(vg.name(), "ext4kit_probe");
        assert_eq!(vg.seqno(), 4);
        assert_eq!(vg.extent_size(), 4 * MIB);
        assert!(vg.missing_physical_volumes().is_empty());
        let names: Vec<_> = vg
            .logical_volumes()
            .iter()
            .map(|l| (l.name(), l.size(), l.stripes()))
            .collect();
        assert_eq!(names, [("lin", 16 * MIB, 1), ("str", 8 * MIB, 2)]);

        // lin: extents 0-1 at PV0 extents 0-1, extents 2-3 at PV0 extents 3-4.
        let lin = vg.open("lin", true).unwrap();
        assert_eq!(lin.size(), 16 * MIB);
        lin.write_at(8 * MIB - 3, b"abcdef").unwrap();
        lin.flush().unwrap();
        let mut b = [0u8; 3];
        d[0].1.read_at(MIB + 8 * MIB - 3, &mut b).unwrap();
        assert_eq!(&b, b"abc");
        d[0].1.read_at(MIB + 12 * MIB, &mut b).unwrap();
        assert_eq!(&b, b"def");

        // str: 64 KiB chunks alternating PV0 extent 2 and PV1 extent 0.
        let st = vg.open("str", true).unwrap();
        st.write_at(64 * 1024 - 1, b"xy").unwrap();
        st.write_at(3 * 64 * 1024, b"z").unwrap();
        let mut one = [0u8; 1];
        d[0].1.read_at(MIB + 8 * MIB + 64 * 1024 - 1, &mut one).unwrap();
        assert_eq!(&one, b"x");
        d[1].1.read_at(MIB, &mut one).unwrap();
        assert_eq!(&one, b"y");
        d[1].1.read_at(MIB + 64 * 1024, &mut one).unwrap();
        assert_eq!(&one, b"z");
        let info = st.describe();
        assert_eq!(
            (info.vg(), info.name(), info.segment_types()),
            ("ext4kit_probe", "str", &["striped".to_string()][..])
        );

        let e = vg.open("nope", false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("it has: lin, str"), "{e}");
    }

    #[test]
    fn a_pv_without_metadata_is_found_by_uuid_and_a_missing_one_is_named() {
        let vgs = volume_groups(&devs(vec![pv(PV0, Some(TEXT)), pv(PV1, None)])).unwrap();
        assert!(vgs[0].open("str", false).is_ok());

        let vgs = volume_groups(&devs(vec![pv(PV0, Some(TEXT))])).unwrap();
        let vg = &vgs[0];
        assert_eq!(
            vg.missing_physical_volumes(),
            [("dCJaNy-Cle5-d4OS-9LQZ-Wnc5-AcIM-ictzdo", "/dev/loop0p2")]
        );
        assert!(vg.open("lin", true).is_ok());
        let e = vg.open("str", false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("dCJaNy-Cle5-d4OS-9LQZ-Wnc5-AcIM-ictzdo"), "{e}");
    }

    #[test]
    fn the_newest_seqno_wins_and_ties_must_agree() {
        // PV1's copy is newer and moves lin's second segment to PV1.
        let newer = TEXT
            .replace("seqno = 4", "seqno = 5")
            .replace("\"pv0\", 3", "\"pv1\", 1");
        assert_ne!(newer, TEXT);
        for order in [[TEXT, newer.as_str()], [newer.as_str(), TEXT]] {
            let d = devs(vec![pv(PV0, Some(order[0])), pv(PV1, Some(order[1]))]);
            let vgs = volume_groups(&d).unwrap();
            assert_eq!(vgs[0].seqno(), 5);
            vgs[0].open("lin", true).unwrap().write_at(8 * MIB, b"new").unwrap();
            let mut b = [0u8; 3];
            d[1].1.read_at(MIB + 4 * MIB, &mut b).unwrap();
            assert_eq!(&b, b"new");
        }

        let other = TEXT.replace("creation_time = 1795894123", "creation_time = 1");
        assert_ne!(other, TEXT);
        let e = volume_groups(&devs(vec![pv(PV0, Some(TEXT)), pv(PV1, Some(&other))])).unwrap_err();
        assert!(
            e.to_string().contains("different metadata with the same seqno 4"),
            "{e}"
        );
    }

    #[test]
    fn a_copied_pv_is_refused() {
        let e = volume_groups(&devs(vec![pv(PV0, Some(TEXT)), pv(PV0, Some(TEXT))])).unwrap_err();
        assert!(e.to_string().contains("is on both dev0 and dev1"), "{e}");
    }

    #[test]
    fn damaged_metadata_is_refused_unless_another_copy_is_good() {
        let d0 = pv(PV0, Some(TEXT));
        d0.write_at(4096 + 0x1600 + 10, b"!").unwrap();
        let e = volume_groups(&devs(vec![d0.clone(), pv(PV1, None)])).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("dev0: lvm2: metadata area at byte 4096: metadata text checksum"),
            "{e}"
        );
    }

    #[test]
    fn hostile_extents_are_refused() {
        // Past the PV's extents.
        assert!(err_of(&TEXT.replace("\"pv0\", 3", "\"pv0\", 4")).contains("past its 5 extents"));
        assert!(err_of(&TEXT.replace("\"pv0\", 3", "\"pv0\", 9223372036854775807")).contains("past its 5 extents"));
        assert!(err_of(&TEXT.replace("\"pv0\", 3", "\"pv0\", -1")).contains("negative"));
        // More extents than the device holds.
        assert!(err_of(&TEXT.replacen("pe_count = 5", "pe_count = 6", 1)).contains("past the device's"));
        assert!(err_of(&TEXT.replacen("pe_count = 5", "pe_count = 9223372036854775807", 1)).contains("overflows"));
        assert!(err_of(&TEXT.replace("extent_size = 8192", "extent_size = 0")).contains("extent_size is 0"));
        assert!(err_of(&TEXT.replace("extent_size = 8192", "extent_size = 9223372036854775807")).contains("overflows"));
        // Segments with a gap, overlapping, overflowing.
        assert!(err_of(&TEXT.replace("start_extent = 2", "start_extent = 3")).contains("a gap at extent 2"));
        assert!(err_of(&TEXT.replace("start_extent = 2", "start_extent = 1")).contains("overlapping segments"));
        assert!(
            err_of(&TEXT.replace("start_extent = 2", "start_extent = 18446744073709551615"))
                .contains("not a 64-bit integer")
        );
        assert!(err_of(&TEXT.replace("segment_count = 2", "segment_count = 3")).contains("segment_count is 3"));
        // Stripes that do not match their count, or an unknown PV.
        assert!(err_of(&TEXT.replace("stripe_count = 2", "stripe_count = 3")).contains("stripes list has 4"));
        assert!(err_of(&TEXT.replace("\"pv1\", 0", "\"pv7\", 0")).contains("not a PV of the VG"));
        assert!(err_of(&TEXT.replace("stripe_size = 128", "stripe_size = 0")).contains("does not divide"));
        assert!(err_of(&TEXT.replace("stripe_size = 128", "stripe_size = 3")).contains("does not divide"));
        // Two LVs on one extent.
        assert!(err_of(&TEXT.replace("\"pv0\", 3", "\"pv0\", 2")).contains("extent 2 of PV pv0 belongs to both"));
        // Two VG sections, none, a missing field.
        assert!(err_of(&format!("{TEXT}\nvg2 {{\n}}\n")).contains("two volume group sections"));
        assert!(err_of("contents = \"Text Format Volume Group\"").contains("no volume group section"));
        assert!(err_of(&TEXT.replace("seqno = 4", "")).contains("no seqno"));
    }

    #[test]
    fn unsupported_layouts_are_named() {
        let thin = TEXT.replace(
            "type = \"striped\"\nstripe_count = 2\nstripe_size = 128\n\nstripes = [\n\"pv0\", 2,\n\"pv1\", 0\n]",
            "type = \"thin\"\nthin_pool = \"pool\"\ntransaction_id = 1",
        );
        assert_ne!(thin, TEXT);
        let vg = one_vg(&thin).unwrap();
        assert_eq!(vg.logical_volumes()[1].segment_types(), ["thin"]);
        let e = vg.open("str", false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("type \"thin\""), "{e}");

        // A pvmove in progress: lin's first segment is on the hidden pvmove0.
        let moving = TEXT.replace("\"pv0\", 0\n]", "\"str\", 0\n]");
        assert_ne!(moving, TEXT);
        let e = one_vg(&moving).unwrap().open("lin", false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("mapped onto logical volume str"), "{e}");

        let hidden = TEXT.replacen(
            "status = [\"READ\", \"WRITE\", \"VISIBLE\"]",
            "status = [\"READ\", \"WRITE\"]",
            1,
        );
        let e = one_vg(&hidden).unwrap().open("lin", false).unwrap_err();
        assert!(e.to_string().contains("hidden part"), "{e}");

        let ro = TEXT.replacen(
            "status = [\"READ\", \"WRITE\", \"VISIBLE\"]",
            "status = [\"READ\", \"VISIBLE\"]",
            1,
        );
        let vg = one_vg(&ro).unwrap();
        assert!(vg.open("lin", false).is_ok());
        assert!(vg
            .open("lin", true)
            .unwrap_err()
            .to_string()
            .contains("read-only in the LVM metadata"));

        let snap = thin.replace(
            "type = \"thin\"\nthin_pool = \"pool\"",
            "type = \"snapshot\"\norigin = \"lin\"\ncow_store = \"c\"\nchunk_size = 8",
        );
        let vg = one_vg(&snap).unwrap();
        assert!(vg.open("lin", false).is_ok());
        let e = vg.open("lin", true).unwrap_err();
        assert!(e.to_string().contains("origin of snapshot str"), "{e}");
        assert!(vg.open("str", false).unwrap_err().to_string().contains("\"snapshot\""));
    }

    #[test]
    fn writing_needs_writable_devices() {
        let ro: Arc<dyn BlockDevice> = {
            let d = pv(PV0, Some(TEXT));
            let mut v = vec![0u8; d.size() as usize];
            d.read_at(0, &mut v).unwrap();
            Arc::new(MemDevice::from_vec_read_only(v))
        };
        let vgs = volume_groups(&devs(vec![ro, pv(PV1, Some(TEXT))])).unwrap();
        let e = vgs[0].open("lin", true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(vgs[0].open("lin", false).unwrap().read_only());
    }

    #[test]
    fn a_huge_vg_is_interpreted_in_linear_time() {
        // 50k PVs and one LV of 100k segments: half striped, each on its
        // own PV, half of a distinct unsupported type.
        const N: usize = 50_000;
        let mut t = String::from("big {\nid = \"x\"\nseqno = 1\nextent_size = 8\nphysical_volumes {\n");
        for i in 0..N {
            t += &format!("pv{i} {{\nid = \"id{i}\"\npe_start = 0\npe_count = 1\n}}\n");
        }
        t += &format!(
            "}}\nlogical_volumes {{\nlv {{\nid = \"l\"\nstatus = [\"VISIBLE\"]\nsegment_count = {}\n",
            2 * N
        );
        for i in 0..N {
            t += &format!(
                "s{i} {{\nstart_extent = {i}\nextent_count = 1\nstripe_count = 1\nstripes = [\"pv{i}\", 0]\n}}\n"
            );
            t += &format!(
                "u{i} {{\nstart_extent = {}\nextent_count = 1\ntype = \"t{i}\"\n}}\n",
                N + i
            );
        }
        t += "}\n}\n}\n";
        let start = std::time::Instant::now();
        let vg = assemble(interpret(&parse(t.as_bytes()).unwrap()).unwrap(), &[]).unwrap();
        assert_eq!(vg.logical_volumes()[0].segment_types().len(), N + 1);
        assert_eq!(vg.missing_physical_volumes().len(), N);
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// Metadata text damaged anywhere (bytes replaced, the text cut
        /// short), with valid checksums so the parser and the checks see
        /// it: an error or a VG whose LVs read within their devices, never
        /// a panic.
        #[test]
        fn damaged_text_never_panics(
            edits in proptest::collection::vec((0usize..TEXT.len(), proptest::prelude::any::<u8>()), 1..8),
            cut in proptest::option::of(0usize..TEXT.len()),
        ) {
            let mut t = TEXT.as_bytes().to_vec();
            for (at, b) in edits {
                t[at] = b;
            }
            if let Some(c) = cut {
                t.truncate(c);
            }
            let text = String::from_utf8_lossy(&t).into_owned();
            if let Ok(vgs) = volume_groups(&devs(vec![pv(PV0, Some(&text)), pv(PV1, Some(&text))])) {
                for vg in &vgs {
                    for info in vg.logical_volumes() {
                        if let Ok(lv) = vg.open(info.name(), true) {
                            let mut b = [0u8; 512];
                            if lv.size() >= 512 {
                                lv.read_at(0, &mut b).unwrap();
                                lv.read_at(lv.size() - 512, &mut b).unwrap();
                                lv.write_at(lv.size() / 2 / 512 * 512, &b).unwrap();
                            }
                        }
                    }
                }
            }
        }
    }
}
