//! The label sector and the physical volume header
//! (`lib/label/label.h`, `lib/format_text/layout.h`).
//!
//! On-disk rules relied on:
//! - The label is in one of the first four 512-byte sectors
//!   (`LABEL_SCAN_SECTORS`), starts with `"LABELONE"` and is one sector
//!   long: `id[8]`, `sector_xl` (u64, the sector it is in), `crc_xl` (u32,
//!   LVM's CRC of the sector from the next field to the sector's end),
//!   `offset_xl` (u32, where the PV header starts, from the sector's start)
//!   and `type[8]`, `"LVM2 001"` for the text format. All little-endian.
//! - The PV header (`struct pv_header`) is the 32-character PV uuid
//!   (without the dashes LVM prints), the device size in bytes when the PV
//!   was made, then two lists of `disk_locn` (offset, size: u64 bytes from
//!   the device's start), each ended by an entry whose offset is zero: the
//!   data areas (one; size 0 means "to the end of the device") and the
//!   metadata areas. LVM reads only the label sector, so both lists end
//!   inside it.

use std::io;

use super::crc::{calc_crc, INITIAL_CRC};
use super::{corrupt_lvm, unsupported_lvm};
use crate::BlockDevice;

/// LVM's sector size: every offset in metadata counts 512-byte sectors.
pub(crate) const SECTOR: u64 = 512;
/// `LABEL_SCAN_SECTORS`: the label is in one of sectors 0-3.
const LABEL_SCAN_SECTORS: u64 = 4;
/// `LABEL_ID`.
const LABEL_ID: &[u8; 8] = b"LABELONE";
/// `LVM2_LABEL`: the text format's label type.
const LVM2_LABEL: &[u8; 8] = b"LVM2 001";
/// `ID_LEN`: a uuid is 32 characters.
const ID_LEN: usize = 32;
/// Size of `struct label_header`.
const LABEL_HEADER_SIZE: usize = 32;
/// Size of `struct pv_header` before its lists.
const PV_HEADER_SIZE: usize = ID_LEN + 8;
/// Size of one `struct disk_locn`.
const DISK_LOCN_SIZE: usize = 16;

/// A byte range of a physical volume's device, as the PV header lists its
/// data and metadata areas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Area {
    offset: u64,
    size: u64,
}

impl Area {
    /// Where the area starts, in bytes from the start of the device.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Its length in bytes (for the data area, 0 means "to the end").
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// A device's LVM2 label: what makes it a physical volume, and where its
/// metadata is. Volume groups are assembled from these
/// ([`volume_groups`](super::volume_groups)); reading one alone tells a
/// caller whether a partition is LVM at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhysicalVolume {
    uuid: String,
    label_sector: u64,
    device_size: u64,
    data_area: Option<Area>,
    metadata_areas: Vec<Area>,
}

impl PhysicalVolume {
    /// The PV uuid as LVM prints it (`pvs -o pv_uuid`: groups of 6-4-4-4-
    /// 4-4-6 characters joined by dashes), the name the VG metadata uses.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// Which of sectors 0-3 holds the label.
    pub fn label_sector(&self) -> u64 {
        self.label_sector
    }

    /// The device's size in bytes when the PV was created.
    pub fn device_size(&self) -> u64 {
        self.device_size
    }

    /// The data area (where extents start), if the header lists one.
    pub fn data_area(&self) -> Option<Area> {
        self.data_area
    }

    /// The metadata areas: none (`pvcreate --metadatacopies 0`), one at
    /// the start, or a second at the end of the device.
    pub fn metadata_areas(&self) -> &[Area] {
        &self.metadata_areas
    }
}

/// The PV uuid with LVM's dashes (`id_write_format`): 6-4-4-4-4-4-6.
pub(crate) fn format_uuid(raw: &str) -> String {
    const GROUPS: [usize; 7] = [6, 4, 4, 4, 4, 4, 6];
    let mut out = String::with_capacity(ID_LEN + 6);
    let mut rest = raw;
    for (i, n) in GROUPS.iter().enumerate() {
        let (group, tail) = rest.split_at((*n).min(rest.len()));
        if i > 0 {
            out.push('-');
        }
        out.push_str(group);
        rest = tail;
    }
    out
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// The physical volume on `dev`, if it carries an LVM2 label in sectors
/// 0-3. `None` when no sector starts with `LABELONE` (or the only one names
/// another sector, as LVM ignores it); an error when a label is there but
/// damaged, since a half-readable PV should not pass for an unused disk.
pub fn physical_volume(dev: &dyn BlockDevice) -> io::Result<Option<PhysicalVolume>> {
    let sectors = (dev.size() / SECTOR).min(LABEL_SCAN_SECTORS);
    for n in 0..sectors {
        let mut sector = [0u8; SECTOR as usize];
        dev.read_at(n * SECTOR, &mut sector)?;
        if &sector[..8] != LABEL_ID {
            continue;
        }
        let stored = le32(&sector, 16);
        let computed = calc_crc(INITIAL_CRC, &sector[20..]);
        if stored != computed {
            return Err(corrupt_lvm(format!(
                "label in sector {n}: checksum {stored:#010x}, computed {computed:#010x}"
            )));
        }
        if le64(&sector, 8) != n {
            // A label copied from elsewhere (LVM: "sector mismatch").
            continue;
        }
        if &sector[24..32] != LVM2_LABEL {
            return Err(unsupported_lvm(format!(
                "label in sector {n} has type {:?}, not \"LVM2 001\" (LVM1 and pool formats are not read)",
                String::from_utf8_lossy(&sector[24..32])
            )));
        }
        return parse_pv_header(&sector, n, dev.size()).map(Some);
    }
    Ok(None)
}

fn parse_pv_header(sector: &[u8; SECTOR as usize], n: u64, dev_size: u64) -> io::Result<PhysicalVolume> {
    let off = le32(sector, 20) as usize;
    if off < LABEL_HEADER_SIZE || off.checked_add(PV_HEADER_SIZE).is_none_or(|e| e > sector.len()) {
        return Err(corrupt_lvm(format!(
            "label in sector {n}: PV header offset {off} is outside the label sector"
        )));
    }
    let raw_uuid = &sector[off..off + ID_LEN];
    if !raw_uuid.iter().all(|b| b.is_ascii_alphanumeric()) {
        return Err(corrupt_lvm(format!("label in sector {n}: PV uuid is not alphanumeric")));
    }
    let uuid = format_uuid(&String::from_utf8_lossy(raw_uuid));
    let device_size = le64(sector, off + ID_LEN);
    let mut at = off + PV_HEADER_SIZE;
    let data = read_locn_list(sector, &mut at, n, "data")?;
    let metadata = read_locn_list(sector, &mut at, n, "metadata")?;
    if data.len() > 1 {
        return Err(unsupported_lvm(format!(
            "PV {uuid}: {} data areas (LVM writes one)",
            data.len()
        )));
    }
    for a in data.iter() {
        if a.offset > dev_size || a.offset.checked_add(a.size).is_none_or(|e| e > dev_size) {
            return Err(corrupt_lvm(format!(
                "PV {uuid}: data area at byte {} ({} bytes) is past the end of the device ({dev_size} bytes)",
                a.offset, a.size
            )));
        }
    }
    for a in metadata.iter() {
        if a.offset.checked_add(a.size).is_none_or(|e| e > dev_size) {
            return Err(corrupt_lvm(format!(
                "PV {uuid}: metadata area at byte {} ({} bytes) is past the end of the device ({dev_size} bytes)",
                a.offset, a.size
            )));
        }
    }
    Ok(PhysicalVolume {
        uuid,
        label_sector: n,
        device_size,
        data_area: data.first().copied(),
        metadata_areas: metadata,
    })
}

/// One list of `disk_locn` ended by a zero offset, all inside the sector.
fn read_locn_list(sector: &[u8], at: &mut usize, n: u64, what: &str) -> io::Result<Vec<Area>> {
    let mut out = Vec::new();
    loop {
        if at.checked_add(DISK_LOCN_SIZE).is_none_or(|e| e > sector.len()) {
            return Err(corrupt_lvm(format!(
                "label in sector {n}: the {what} area list runs past the label sector"
            )));
        }
        let offset = le64(sector, *at);
        let size = le64(sector, *at + 8);
        *at += DISK_LOCN_SIZE;
        if offset == 0 {
            return Ok(out);
        }
        out.push(Area { offset, size });
    }
}

/// Test support: a label sector describing a PV, checksummed as LVM does.
#[cfg(test)]
pub(crate) fn build_label(
    sector_no: u64,
    raw_uuid: &str,
    dev_size: u64,
    data: &[(u64, u64)],
    mdas: &[(u64, u64)],
) -> Vec<u8> {
    let mut s = vec![0u8; SECTOR as usize];
    s[..8].copy_from_slice(LABEL_ID);
    s[8..16].copy_from_slice(&sector_no.to_le_bytes());
    s[20..24].copy_from_slice(&32u32.to_le_bytes());
    s[24..32].copy_from_slice(LVM2_LABEL);
    s[32..64].copy_from_slice(raw_uuid.as_bytes());
    s[64..72].copy_from_slice(&dev_size.to_le_bytes());
    let mut at = 72;
    for list in [data, mdas] {
        for (o, z) in list.iter().chain(std::iter::once(&(0, 0))) {
            s[at..at + 8].copy_from_slice(&o.to_le_bytes());
            s[at + 8..at + 16].copy_from_slice(&z.to_le_bytes());
            at += 16;
        }
    }
    let crc = calc_crc(INITIAL_CRC, &s[20..]);
    s[16..20].copy_from_slice(&crc.to_le_bytes());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_blockdev::MemDevice;

    const UUID: &str = "UuS4C4QRYkIOoXWr6FW1spdJrdPSaERv";

    fn dev_with(sector_no: u64, label: &[u8]) -> MemDevice {
        let d = MemDevice::new(1 << 20);
        d.write_at(sector_no * SECTOR, label).unwrap();
        d
    }

    #[test]
    fn reads_a_label_like_pvcreate_writes() {
        let l = build_label(1, UUID, 1 << 20, &[(1 << 19, 0)], &[(4096, 4096)]);
        let pv = physical_volume(&dev_with(1, &l)).unwrap().unwrap();
        assert_eq!(pv.uuid(), "UuS4C4-QRYk-IOoX-Wr6F-W1sp-dJrd-PSaERv");
        assert_eq!(pv.label_sector(), 1);
        assert_eq!(pv.data_area().unwrap().offset(), 1 << 19);
        assert_eq!(
            pv.metadata_areas(),
            &[Area {
                offset: 4096,
                size: 4096
            }]
        );
    }

    #[test]
    fn no_label_is_none_and_a_moved_label_is_ignored() {
        assert!(physical_volume(&MemDevice::new(4096)).unwrap().is_none());
        assert!(physical_volume(&MemDevice::new(100)).unwrap().is_none());
        let l = build_label(0, UUID, 1 << 20, &[(1 << 19, 0)], &[]);
        assert!(physical_volume(&dev_with(2, &l)).unwrap().is_none());
    }

    #[test]
    fn damaged_labels_are_errors() {
        let mut l = build_label(0, UUID, 1 << 20, &[(1 << 19, 0)], &[]);
        l[100] ^= 1;
        let e = physical_volume(&dev_with(0, &l)).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");

        // Areas past the device.
        let l = build_label(0, UUID, 1 << 20, &[(1 << 19, 0)], &[(4096, u64::MAX)]);
        let e = physical_volume(&dev_with(0, &l)).unwrap_err();
        assert!(e.to_string().contains("past the end"), "{e}");
        let l = build_label(0, UUID, 1 << 20, &[(1 << 40, 0)], &[]);
        assert!(physical_volume(&dev_with(0, &l)).is_err());

        // A PV header offset outside the sector, then a list with no end.
        let mut l = build_label(0, UUID, 1 << 20, &[], &[]);
        l[20..24].copy_from_slice(&500u32.to_le_bytes());
        let crc = calc_crc(INITIAL_CRC, &l[20..]);
        l[16..20].copy_from_slice(&crc.to_le_bytes());
        let e = physical_volume(&dev_with(0, &l)).unwrap_err();
        assert!(e.to_string().contains("outside the label sector"), "{e}");
        let mut l = build_label(0, UUID, 1 << 20, &[], &[]);
        for b in l[72..].iter_mut() {
            *b = 0x11;
        }
        let crc = calc_crc(INITIAL_CRC, &l[20..]);
        l[16..20].copy_from_slice(&crc.to_le_bytes());
        let e = physical_volume(&dev_with(0, &l)).unwrap_err();
        assert!(e.to_string().contains("runs past"), "{e}");
    }

    proptest::proptest! {
        /// Any label sector with a valid checksum: a PV or an error, never a panic.
        #[test]
        fn any_checksummed_label_never_panics(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 480), small in proptest::prelude::any::<bool>()) {
            let mut l = build_label(0, UUID, 1 << 20, &[(1 << 19, 0)], &[(4096, 4096)]);
            l[32..].copy_from_slice(&body);
            if small {
                // A valid uuid and lists that end, so the area checks are reached.
                l[20..24].copy_from_slice(&32u32.to_le_bytes());
                for b in l[32..64].iter_mut() {
                    *b = b'a' + *b % 26;
                }
                // End the data list after 0-2 entries, the metadata list 0-2 later.
                let n1 = 72 + 16 * (body[1] % 3) as usize;
                let n2 = n1 + 16 + 16 * (body[2] % 3) as usize;
                l[n1..n1 + 8].fill(0);
                l[n2..n2 + 8].fill(0);
            }
            let crc = calc_crc(INITIAL_CRC, &l[20..]);
            l[16..20].copy_from_slice(&crc.to_le_bytes());
            let _ = physical_volume(&dev_with(0, &l));
        }
    }
}
