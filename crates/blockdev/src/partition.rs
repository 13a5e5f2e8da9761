//! Where the filesystem lives inside an image file: the whole file, one
//! partition of a partitioned disk (GPT or MBR), or a byte offset.
//!
//! VM disks and disks pulled from machines hold a partition table, not a
//! bare filesystem. [`partitions`] reads the table the way the Linux kernel
//! does (`block/partitions/efi.c` and `msdos.c`), so partition numbers are
//! the kernel's (`loop0p2`, `sda2`): GPT entries by their slot in the entry
//! array, MBR primaries 1-4 by slot and logical partitions from 5 in the
//! order of the extended partition's chain. [`open_location`] turns a
//! partition into a [`WindowDevice`] so the engine above never sees the
//! table.
//!
//! The table is read from disk bytes that may be hostile: every number in
//! it is checked before it is used (sizes and offsets with checked
//! arithmetic, entry counts bounded before anything is allocated, an EBR
//! chain bounded and cycle-checked), and a damaged table is an error that
//! names the structure and the sector, never a panic. That is why the GPT
//! header and entries and the MBR sectors are decoded with `gptman` and
//! `mbrman`'s record types but the walk over them is ours: the crates'
//! whole-table readers trust counts and offsets (an allocation sized by
//! the entry count, unchecked sector arithmetic, an alignment search that
//! unwraps) and are made for partitioning tools, not for untrusted images.
//!
//! A partition that runs past the end of the image, is empty, or is the
//! MBR's extended-partition container cannot be opened; one that overlaps
//! another partition or the table itself can be opened only read-only
//! (writing it would damage the other).

use std::collections::HashSet;
use std::fmt;
use std::io;
use std::sync::Arc;

use gptman::{GPTHeader, GPTPartitionEntry};
use mbrman::MBRHeader;

use crate::window::WindowDevice;
use crate::BlockDevice;

/// Where in an image file (or device) the filesystem starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Location {
    /// The filesystem is the whole file (what mke2fs makes).
    #[default]
    Whole,
    /// Partition `n` (1-based, as `fdisk -l` and the kernel's `loop0pN`
    /// number them) of a GPT or MBR partition table.
    Partition(u32),
    /// The filesystem starts this many bytes into the file and runs to its
    /// end (fuse2fs's `-o offset=`).
    Offset(u64),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Whole => write!(f, "the whole image"),
            Location::Partition(n) => write!(f, "partition {n}"),
            Location::Offset(o) => write!(f, "offset {o}"),
        }
    }
}

/// The device holding the filesystem at `loc` of `disk`.
///
/// For a partition, the table is read and checked; a partition that does
/// not exist, lies (partly) outside the image, is empty or is an extended
/// container is refused with a message naming it, and so is one that
/// overlaps something else when `disk` is writable.
pub fn open_location(disk: Arc<dyn BlockDevice>, loc: Location) -> io::Result<Arc<dyn BlockDevice>> {
    match loc {
        Location::Whole => Ok(disk),
        Location::Offset(off) => {
            let len = disk.size().checked_sub(off).ok_or_else(|| {
                invalid_input(format!(
                    "offset {off} is past the end of the image ({} bytes)",
                    disk.size()
                ))
            })?;
            Ok(Arc::new(WindowDevice::new(disk, off, len)?))
        }
        Location::Partition(n) => {
            let table = partitions(&*disk)?.ok_or_else(|| {
                invalid_input(format!(
                    "partition {n}: the image has no partition table (no MBR signature at byte 510, no GPT)"
                ))
            })?;
            let p = table.get(n).ok_or_else(|| {
                invalid_input(format!(
                    "partition {n} does not exist: the {} table has {}",
                    table.kind,
                    table.numbers()
                ))
            })?;
            if p.extended {
                return Err(invalid_input(format!(
                    "partition {n} is an MBR extended partition (a container for logical partitions 5 and up), \
                     not a filesystem"
                )));
            }
            if let Some(why) = &p.problem {
                return Err(invalid_input(format!("partition {n} cannot be opened: {why}")));
            }
            if !disk.read_only() {
                if let Some(why) = &p.write_conflict {
                    return Err(invalid_input(format!(
                        "partition {n} cannot be opened for writing: {why}; writing it could damage that \
                         (opening it read-only works)"
                    )));
                }
            }
            Ok(Arc::new(WindowDevice::new(disk, p.start, p.size)?))
        }
    }
}

/// Which kind of partition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableKind {
    /// GUID partition table (with its protective MBR).
    Gpt,
    /// DOS/MBR partition table (primary, extended and logical partitions).
    Mbr,
}

impl fmt::Display for TableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TableKind::Gpt => "GPT",
            TableKind::Mbr => "MBR",
        })
    }
}

/// A partition table as read from a disk image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionTable {
    /// GPT or MBR.
    pub kind: TableKind,
    /// Logical sector size the table counts in (512, or 4096 for a GPT
    /// written for 4 KiB-sector disks).
    pub sector_size: u64,
    /// The partitions in number order; unused slots are left out.
    pub partitions: Vec<Partition>,
    /// What a user should know about the table itself (a damaged primary
    /// GPT header read from its backup, an EBR chain cut short).
    pub notes: Vec<String>,
}

impl PartitionTable {
    /// Partition number `n`.
    pub fn get(&self, n: u32) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.number == n)
    }

    /// "partitions 1, 2 and 5", "partition 1", or "no partitions".
    pub fn numbers(&self) -> String {
        let n: Vec<String> = self.partitions.iter().map(|p| p.number.to_string()).collect();
        match n.len() {
            0 => "no partitions".to_string(),
            1 => format!("partition {}", n[0]),
            _ => format!("partitions {} and {}", n[..n.len() - 1].join(", "), n[n.len() - 1]),
        }
    }
}

/// One partition of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// The kernel's number for it (1-based).
    pub number: u32,
    /// First byte, from the start of the disk.
    pub start: u64,
    /// Length in bytes.
    pub size: u64,
    /// The type as the table records it: a GPT type GUID, or "0x83".
    pub type_id: String,
    /// The type's usual name ("Linux filesystem", "EFI System"), or
    /// "unknown".
    pub type_name: &'static str,
    /// The GPT partition name ("" for MBR).
    pub name: String,
    /// An MBR extended partition: a container, not a filesystem.
    pub extended: bool,
    /// Why the partition cannot be opened at all (past the end of the
    /// image, empty), if it cannot.
    pub problem: Option<String>,
    /// Why it must not be written (it overlaps another partition or the
    /// partition table), if so.
    pub write_conflict: Option<String>,
}

impl Partition {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.size)
    }
}

/// What an ext2/3/4 superblock at a place says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtProbe {
    /// "ext2", "ext3", "ext4", or "jbd" (an external journal device),
    /// decided from the feature flags as blkid does.
    pub kind: &'static str,
    /// The volume label ("" if none).
    pub label: String,
}

/// Whether `dev` holds an ext2/3/4 superblock (magic 0xEF53) at `start`
/// (the superblock is at `start + 1024`), and which kind. Reads 1 KiB; a
/// read error or a window too small is "no".
pub fn probe_ext(dev: &dyn BlockDevice, start: u64) -> Option<ExtProbe> {
    let mut sb = [0u8; 1024];
    dev.read_at(start.checked_add(1024)?, &mut sb).ok()?;
    if u16::from_le_bytes([sb[56], sb[57]]) != 0xEF53 {
        return None;
    }
    let le32 = |o: usize| u32::from_le_bytes([sb[o], sb[o + 1], sb[o + 2], sb[o + 3]]);
    let (compat, incompat, ro_compat) = (le32(92), le32(96), le32(100));
    // The features ext3 knows (filetype, needs_recovery, meta_bg; sparse_super,
    // large_file, btree_dir): anything else is ext4's (blkid's rule).
    const EXT3_INCOMPAT: u32 = 0x0002 | 0x0004 | 0x0010;
    const EXT3_RO_COMPAT: u32 = 0x0001 | 0x0002 | 0x0004;
    const INCOMPAT_JOURNAL_DEV: u32 = 0x0008;
    const COMPAT_HAS_JOURNAL: u32 = 0x0004;
    let kind = if incompat & INCOMPAT_JOURNAL_DEV != 0 {
        "jbd"
    } else if incompat & !EXT3_INCOMPAT != 0 || ro_compat & !EXT3_RO_COMPAT != 0 {
        "ext4"
    } else if compat & COMPAT_HAS_JOURNAL != 0 {
        "ext3"
    } else {
        "ext2"
    };
    let name = &sb[120..136];
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Some(ExtProbe {
        kind,
        label: String::from_utf8_lossy(&name[..len]).into_owned(),
    })
}

/// The partition table of `dev`, if it has one: `Ok(None)` when sector 0
/// is not an MBR (no 0x55AA signature, or boot flags that are neither 0
/// nor 0x80: a filesystem's boot sector, as the kernel decides); an error
/// when the table is there but cannot be read (a protective MBR without a
/// valid GPT header, primary or backup).
pub fn partitions(dev: &dyn BlockDevice) -> io::Result<Option<PartitionTable>> {
    if dev.size() < 512 {
        return Ok(None);
    }
    let mut s0 = [0u8; 512];
    read(dev, 0, &mut s0, "the MBR (sector 0)")?;
    if s0[510..512] != [0x55, 0xAA] {
        return Ok(None);
    }
    let Ok(mbr) = MBRHeader::read_from(&mut io::Cursor::new(&s0[..])) else {
        // Boot flags other than 0x00/0x80: not a partition table.
        return Ok(None);
    };
    let mut table = if mbr.iter().any(|(_, e)| e.sys == 0xEE) {
        read_gpt(dev)?
    } else {
        read_mbr(dev, &mbr)?
    };
    check_placement(&mut table, dev.size());
    Ok(Some(table))
}

fn invalid_input(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn invalid_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read(dev: &dyn BlockDevice, off: u64, buf: &mut [u8], what: &str) -> io::Result<()> {
    dev.read_at(off, buf)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {what} at byte {off}: {e}")))
}

// ---------------------------------------------------------------- GPT

/// Entries at most in a GPT entry array we accept (4 MiB of entries; tools
/// write 128). Bounds the allocation before the count is trusted.
const GPT_MAX_ENTRIES: u32 = 32768;
/// The only entry size the kernel accepts (`sizeof(gpt_entry)`).
const GPT_ENTRY_SIZE: u32 = 128;

/// Why a GPT could not be read at one sector size.
enum GptMiss {
    /// No "EFI PART" signature where a header would be: try another sector size.
    Absent,
    /// A header is there but damaged.
    Bad(String),
}

fn read_gpt(dev: &dyn BlockDevice) -> io::Result<PartitionTable> {
    let mut why = Vec::new();
    for ss in [512u64, 4096] {
        match read_gpt_sized(dev, ss) {
            Ok(t) => return Ok(t),
            Err(GptMiss::Absent) => {}
            Err(GptMiss::Bad(e)) => why.push(e),
        }
    }
    Err(invalid_data(if why.is_empty() {
        "the MBR is a GPT protective MBR (type 0xEE), but there is no GPT header (no \"EFI PART\" at sector 1 \
         or the last sector, for 512- or 4096-byte sectors)"
            .to_string()
    } else {
        format!("the GPT is damaged: {}", why.join("; "))
    }))
}

/// The GPT with `ss`-byte sectors: the primary header at sector 1, or if
/// that is damaged the backup in the last sector (as the kernel does).
fn read_gpt_sized(dev: &dyn BlockDevice, ss: u64) -> Result<PartitionTable, GptMiss> {
    let sectors = dev.size() / ss;
    if sectors < 3 {
        return Err(GptMiss::Absent);
    }
    let primary = read_gpt_at(dev, ss, 1);
    let (header, entries, notes) = match primary {
        Ok((h, e)) => (h, e, Vec::new()),
        Err(primary_miss) => match (primary_miss, read_gpt_at(dev, ss, sectors - 1)) {
            (GptMiss::Absent, Err(GptMiss::Absent)) => return Err(GptMiss::Absent),
            (p, Ok((h, e))) => {
                let why = match p {
                    GptMiss::Absent => "missing".to_string(),
                    GptMiss::Bad(w) => w,
                };
                let note = format!(
                    "the primary GPT header is damaged ({why}); read the backup at sector {} instead",
                    sectors - 1
                );
                (h, e, vec![note])
            }
            (p, Err(b)) => {
                let text = |m: GptMiss, what: &str| match m {
                    GptMiss::Absent => format!("no {what}"),
                    GptMiss::Bad(w) => w,
                };
                return Err(GptMiss::Bad(format!(
                    "{}; {}",
                    text(p, &format!("primary header at sector 1 ({ss}-byte sectors)")),
                    text(b, &format!("backup header at sector {}", sectors - 1))
                )));
            }
        },
    };
    let mut partitions = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.is_unused() {
            continue;
        }
        let number = i as u32 + 1;
        let type_id = guid_string(&e.partition_type_guid);
        let (start, size, problem) = if e.ending_lba < e.starting_lba {
            (
                e.starting_lba.saturating_mul(ss),
                0,
                Some(format!(
                    "its last sector ({}) is before its first ({})",
                    e.ending_lba, e.starting_lba
                )),
            )
        } else {
            let start = e.starting_lba.checked_mul(ss);
            let size = (e.ending_lba - e.starting_lba)
                .checked_add(1)
                .and_then(|n| n.checked_mul(ss));
            match (start, size) {
                (Some(s), Some(z)) if s.checked_add(z).is_some() => (s, z, None),
                _ => (
                    u64::MAX,
                    0,
                    Some(format!(
                        "sectors {}..={} are beyond any possible disk",
                        e.starting_lba, e.ending_lba
                    )),
                ),
            }
        };
        let mut p = Partition {
            number,
            start,
            size,
            type_name: gpt_type_name(&type_id),
            type_id,
            name: e.partition_name.as_str().to_string(),
            extended: false,
            problem,
            write_conflict: None,
        };
        if p.problem.is_none() && (e.starting_lba < header.first_usable_lba || e.ending_lba > header.last_usable_lba) {
            p.write_conflict = Some(format!(
                "sectors {}..={} reach outside the usable area {}..={} the GPT header declares (into the \
                 partition table itself)",
                e.starting_lba, e.ending_lba, header.first_usable_lba, header.last_usable_lba
            ));
        }
        partitions.push(p);
    }
    Ok(PartitionTable {
        kind: TableKind::Gpt,
        sector_size: ss,
        partitions,
        notes,
    })
}

/// Read and check the GPT header in sector `lba` and its entry array.
fn read_gpt_at(dev: &dyn BlockDevice, ss: u64, lba: u64) -> Result<(GPTHeader, Vec<GPTPartitionEntry>), GptMiss> {
    let at = format!("GPT header at sector {lba} ({ss}-byte sectors)");
    let bad = |m: String| GptMiss::Bad(format!("{at}: {m}"));
    let mut raw = [0u8; 92];
    if dev.read_at(lba * ss, &mut raw).is_err() {
        return Err(GptMiss::Absent);
    }
    if &raw[..8] != b"EFI PART" {
        return Err(GptMiss::Absent);
    }
    let h = decode(&raw, |c| GPTHeader::read_from(c)).map_err(|e| bad(e.to_string()))?;
    if h.primary_lba != lba {
        return Err(bad(format!("it says it is at sector {}", h.primary_lba)));
    }
    let sectors = dev.size() / ss;
    if h.first_usable_lba > h.last_usable_lba || h.last_usable_lba >= sectors {
        return Err(bad(format!(
            "usable sectors {}..={} do not fit the disk ({sectors} sectors)",
            h.first_usable_lba, h.last_usable_lba
        )));
    }
    if h.size_of_partition_entry != GPT_ENTRY_SIZE {
        return Err(bad(format!(
            "entries of {} bytes (only {GPT_ENTRY_SIZE} is valid)",
            h.size_of_partition_entry
        )));
    }
    let n = h.number_of_partition_entries;
    if n == 0 || n > GPT_MAX_ENTRIES {
        return Err(bad(format!("{n} partition entries (1 to {GPT_MAX_ENTRIES} accepted)")));
    }
    let array_len = u64::from(n) * u64::from(GPT_ENTRY_SIZE);
    let array_at = h
        .partition_entry_lba
        .checked_mul(ss)
        .filter(|&a| a.checked_add(array_len).is_some_and(|e| e <= dev.size()))
        .ok_or_else(|| {
            bad(format!(
                "its entry array ({n} entries at sector {}) lies outside the disk",
                h.partition_entry_lba
            ))
        })?;
    let mut array = vec![0u8; array_len as usize];
    dev.read_at(array_at, &mut array)
        .map_err(|e| bad(format!("reading the entry array: {e}")))?;
    let mut entries = Vec::with_capacity(n as usize);
    for chunk in array.chunks_exact(GPT_ENTRY_SIZE as usize) {
        let e = decode(chunk, |c| GPTPartitionEntry::read_from(c)).map_err(|e| bad(format!("an entry: {e}")))?;
        entries.push(e);
    }
    // The entry size is 128 (checked above), so gptman's checksum (which
    // asserts entries * 128 == count * size) cannot fail its assertion.
    let crc = h.generate_partition_entry_array_crc32(&entries);
    if crc != h.partition_entry_array_crc32 {
        return Err(bad(format!(
            "the entry array's checksum is {crc:#010x}, the header says {:#010x}",
            h.partition_entry_array_crc32
        )));
    }
    Ok((h, entries))
}

/// Decode a gptman record from its on-disk bytes. gptman's readers take
/// `size_of` the Rust struct from the reader (more than the record's 92 or
/// 128 bytes: padding, a `String`) and decode the record from the front,
/// so the bytes are handed over with zeros behind them.
fn decode<T>(bytes: &[u8], f: impl FnOnce(&mut io::Cursor<&[u8]>) -> gptman::Result<T>) -> gptman::Result<T> {
    const _: () = assert!(size_of::<GPTHeader>() <= 1024 && size_of::<GPTPartitionEntry>() <= 1024);
    let mut padded = [0u8; 1024];
    let n = bytes.len().min(padded.len());
    padded[..n].copy_from_slice(&bytes[..n]);
    f(&mut io::Cursor::new(&padded[..]))
}

/// "0FC63DAF-8483-4772-8E79-3D69D8477DE4" from the on-disk bytes (the
/// first three fields little-endian).
fn guid_string(g: &[u8; 16]) -> String {
    format!(
        "{:02X}{:02X}{:02X}{:02X}-{:02X}{:02X}-{:02X}{:02X}-{:02X}{:02X}-{:02X}{:02X}{:02X}{:02X}{:02X}{:02X}",
        g[3], g[2], g[1], g[0], g[5], g[4], g[7], g[6], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]
    )
}

fn gpt_type_name(guid: &str) -> &'static str {
    match guid {
        "0FC63DAF-8483-4772-8E79-3D69D8477DE4" => "Linux filesystem",
        "C12A7328-F81F-11D2-BA4B-00A0C93EC93B" => "EFI System",
        "21686148-6449-6E6F-744E-656564454649" => "BIOS boot",
        "0657FD6D-A4AB-43C4-84E5-0933C84B4F4F" => "Linux swap",
        "E6D6D379-F507-44C2-A23C-238F2A3DF928" => "Linux LVM",
        "A19D880F-05FC-4D3B-A006-743F0F84911E" => "Linux RAID",
        "933AC7E1-2EB4-4F13-B844-0E14E2AEF915" => "Linux home",
        "3B8F8425-20E0-4F3B-907F-1A25A76F98E8" => "Linux server data",
        "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709" => "Linux root (x86-64)",
        "44479540-F297-41B2-9AF7-D131D5F0458A" => "Linux root (x86)",
        "B921B045-1DF0-41C3-AF44-4C6F280D3FAE" => "Linux root (ARM-64)",
        "69DAD710-2CE4-4E3C-B16C-21A1D49ABED3" => "Linux root (ARM)",
        "4D21B016-B534-45C2-A9FB-5C16E091FD2D" => "Linux variable data",
        "7EC6F557-3BC5-4ACA-B293-16EF5DF639D1" => "Linux temporary data",
        "BC13C2FF-59E6-4262-A352-B275FD6F7172" => "Linux extended boot",
        "CA7D7CCB-63ED-4C53-861C-1742536059CC" => "Linux LUKS",
        "8DA63339-0007-60C0-C436-083AC8230908" => "Linux reserved",
        "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7" => "Microsoft basic data",
        "E3C9E316-0B5C-4DB8-817D-F92DF00215AE" => "Microsoft reserved",
        "DE94BBA4-06D1-4D40-A16A-BFD50179D6AC" => "Windows recovery",
        "48465300-0000-11AA-AA11-00306543ECAC" => "Apple HFS+",
        "7C3457EF-0000-11AA-AA11-00306543ECAC" => "Apple APFS",
        _ => "unknown",
    }
}

// ---------------------------------------------------------------- MBR

/// Logical partitions at most in one extended partition (the kernel's
/// `DISK_MAX_PARTS` bounds its walk the same way).
const MBR_MAX_LOGICAL: usize = 256;

fn mbr_type_name(sys: u8) -> &'static str {
    match sys {
        0x01 => "FAT12",
        0x04 | 0x06 | 0x0e => "FAT16",
        0x0b | 0x0c => "W95 FAT32",
        0x07 => "HPFS/NTFS/exFAT",
        0x05 | 0x0f | 0x85 => "Extended",
        0x82 => "Linux swap",
        0x83 => "Linux",
        0x8e => "Linux LVM",
        0xa5 => "FreeBSD",
        0xa6 => "OpenBSD",
        0xa9 => "NetBSD",
        0xda => "Non-FS data",
        0xef => "EFI (FAT-12/16/32)",
        0xfd => "Linux raid autodetect",
        _ => "unknown",
    }
}

/// Extended-partition types the kernel follows (`is_extended_partition`:
/// DOS, Win98 LBA and Linux extended).
fn is_extended(sys: u8) -> bool {
    matches!(sys, 0x05 | 0x0f | 0x85)
}

fn mbr_partition(number: u32, sys: u8, first_lba: u64, sectors: u64) -> Partition {
    Partition {
        number,
        start: first_lba * 512,
        size: sectors * 512,
        type_id: format!("0x{sys:02x}"),
        type_name: mbr_type_name(sys),
        name: String::new(),
        extended: is_extended(sys),
        problem: None,
        write_conflict: None,
    }
}

fn read_mbr(dev: &dyn BlockDevice, mbr: &MBRHeader) -> io::Result<PartitionTable> {
    let mut partitions = Vec::new();
    let mut notes = Vec::new();
    let mut next_logical = 5u32;
    for (slot, e) in mbr.iter() {
        if e.sys == 0 {
            continue;
        }
        // Slots are 1..=4.
        partitions.push(mbr_partition(
            slot as u32,
            e.sys,
            u64::from(e.starting_lba),
            u64::from(e.sectors),
        ));
        if is_extended(e.sys) && e.sectors > 0 {
            walk_ebrs(
                dev,
                u64::from(e.starting_lba),
                &mut next_logical,
                &mut partitions,
                &mut notes,
            );
        }
    }
    Ok(PartitionTable {
        kind: TableKind::Mbr,
        sector_size: 512,
        partitions,
        notes,
    })
}

/// Follow the chain of extended boot records from the extended partition
/// at sector `first` (the kernel's `parse_extended`): each EBR holds data
/// partitions (start relative to that EBR) and a link to the next EBR
/// (start relative to the extended partition). A damaged EBR ends the
/// walk with a note; the chain is bounded and may not revisit an EBR.
fn walk_ebrs(dev: &dyn BlockDevice, first: u64, next: &mut u32, out: &mut Vec<Partition>, notes: &mut Vec<String>) {
    let mut this = first;
    let mut seen = HashSet::new();
    loop {
        if !seen.insert(this) {
            notes.push(format!(
                "the extended partition's chain of EBRs loops back to sector {this}; stopped there"
            ));
            return;
        }
        if seen.len() > MBR_MAX_LOGICAL {
            notes.push(format!(
                "the extended partition's chain of EBRs is longer than {MBR_MAX_LOGICAL}; stopped at sector {this}"
            ));
            return;
        }
        let mut sector = [0u8; 512];
        let read_ok = this
            .checked_mul(512)
            .is_some_and(|off| dev.read_at(off, &mut sector).is_ok());
        if !read_ok {
            notes.push(format!(
                "the EBR at sector {this} is past the end of the image; logical partitions from {next} on are missing"
            ));
            return;
        }
        if sector[510..512] != [0x55, 0xAA] {
            // An empty extended partition has no EBR; a later one without
            // the signature ends the chain (the kernel does the same).
            if this != first {
                notes.push(format!(
                    "the EBR at sector {this} has no 0x55AA signature; logical partitions from {next} on are missing"
                ));
            }
            return;
        }
        let ebr = match MBRHeader::read_from(&mut io::Cursor::new(&sector[..])) {
            Ok(h) => h,
            Err(e) => {
                notes.push(format!(
                    "the EBR at sector {this} is damaged ({e}); logical partitions from {next} on are missing"
                ));
                return;
            }
        };
        for (_, e) in ebr.iter() {
            if e.sys == 0 || e.sectors == 0 || is_extended(e.sys) {
                continue;
            }
            out.push(mbr_partition(
                *next,
                e.sys,
                this + u64::from(e.starting_lba),
                u64::from(e.sectors),
            ));
            *next += 1;
        }
        let link = ebr
            .iter()
            .find(|(_, e)| is_extended(e.sys) && e.sectors > 0)
            .map(|(_, e)| e.starting_lba);
        match link {
            Some(rel) => this = first + u64::from(rel),
            None => return,
        }
    }
}

// ---------------------------------------------------------------- checks

/// Mark partitions that cannot be opened (outside the image, empty) and
/// those that must not be written (overlapping another, or the table).
fn check_placement(t: &mut PartitionTable, disk_size: u64) {
    for p in &mut t.partitions {
        if p.problem.is_some() {
            continue;
        }
        if p.size == 0 {
            p.problem = Some("it is empty (zero sectors)".to_string());
        } else if p.start >= disk_size {
            p.problem = Some(format!(
                "it starts at byte {}, past the end of the image ({disk_size} bytes)",
                p.start
            ));
        } else if p.end() > disk_size {
            p.problem = Some(format!(
                "it runs to byte {} ({} bytes from byte {}), past the end of the image ({disk_size} bytes): \
                 the image is truncated or the table is wrong",
                p.end(),
                p.size,
                p.start
            ));
        } else if t.kind == TableKind::Mbr && p.start < 512 {
            p.write_conflict = Some("it starts in sector 0, which holds the partition table".to_string());
        }
    }
    // Overlaps between partitions that hold data (an extended container
    // overlaps its logical partitions by design). Sorted by start, each
    // partition is compared with the ones starting before its end.
    let mut order: Vec<usize> = (0..t.partitions.len())
        .filter(|&i| !t.partitions[i].extended && t.partitions[i].problem.is_none())
        .collect();
    order.sort_by_key(|&i| t.partitions[i].start);
    let mut conflicts: Vec<(usize, String)> = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        let a = &t.partitions[i];
        for &j in &order[k + 1..] {
            let b = &t.partitions[j];
            if b.start >= a.end() {
                break;
            }
            let msg = |o: &Partition| format!("it overlaps partition {} (bytes {}..{})", o.number, o.start, o.end());
            conflicts.push((i, msg(b)));
            conflicts.push((j, msg(a)));
        }
    }
    for (i, msg) in conflicts {
        let p = &mut t.partitions[i];
        if p.write_conflict.is_none() {
            p.write_conflict = Some(msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;
    use gptman::GPT;
    use mbrman::{MBRPartitionEntry, BOOT_INACTIVE, CHS, MBR};

    const LINUX_FS: [u8; 16] = [
        0xAF, 0x3D, 0xC6, 0x0F, 0x83, 0x84, 0x72, 0x47, 0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47, 0x7D, 0xE4,
    ];
    const EFI: [u8; 16] = [
        0x28, 0x73, 0x2A, 0xC1, 0x1F, 0xF8, 0xD2, 0x11, 0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E, 0xC9, 0x3B,
    ];

    fn gpt_entry(ty: [u8; 16], id: u8, first: u64, last: u64, name: &str) -> GPTPartitionEntry {
        GPTPartitionEntry {
            partition_type_guid: ty,
            unique_partition_guid: [id; 16],
            starting_lba: first,
            ending_lba: last,
            attribute_bits: 0,
            partition_name: name.into(),
        }
    }

    /// A GPT disk of `sectors` sectors of `ss` bytes, written by gptman.
    fn gpt_disk(ss: u64, sectors: u64, entries: &[(u32, GPTPartitionEntry)]) -> Vec<u8> {
        let mut cur = io::Cursor::new(vec![0u8; (ss * sectors) as usize]);
        let mut gpt = GPT::new_from(&mut cur, ss, [7; 16]).unwrap();
        for (n, e) in entries {
            gpt[*n] = e.clone();
        }
        gpt.write_into(&mut cur).unwrap();
        GPT::write_protective_mbr_into(&mut cur, ss).unwrap();
        cur.into_inner()
    }

    fn mbr_entry(sys: u8, first: u32, sectors: u32) -> MBRPartitionEntry {
        MBRPartitionEntry {
            boot: BOOT_INACTIVE,
            first_chs: CHS::empty(),
            sys,
            last_chs: CHS::empty(),
            starting_lba: first,
            sectors,
        }
    }

    fn open_err(r: io::Result<Arc<dyn BlockDevice>>) -> String {
        match r {
            Ok(_) => panic!("opened, but should have failed"),
            Err(e) => e.to_string(),
        }
    }

    fn dev(bytes: Vec<u8>) -> Arc<dyn BlockDevice> {
        Arc::new(MemDevice::from_vec(bytes))
    }

    /// Put an ext superblock magic (and a label) at byte `start`.
    fn put_ext_magic(bytes: &mut [u8], start: usize, label: &str) {
        bytes[start + 1024 + 56..start + 1024 + 58].copy_from_slice(&0xEF53u16.to_le_bytes());
        // extents (incompat 0x40): ext4.
        bytes[start + 1024 + 96] = 0x40;
        bytes[start + 1024 + 120..start + 1024 + 120 + label.len()].copy_from_slice(label.as_bytes());
    }

    #[test]
    fn gpt_partitions_are_listed_and_opened() {
        let mut bytes = gpt_disk(
            512,
            8192,
            &[
                (1, gpt_entry(EFI, 1, 2048, 4095, "esp")),
                (3, gpt_entry(LINUX_FS, 3, 4096, 8158, "root")),
            ],
        );
        put_ext_magic(&mut bytes, 4096 * 512, "rootfs");
        let d = dev(bytes);
        let t = partitions(&*d).unwrap().unwrap();
        assert_eq!(t.kind, TableKind::Gpt);
        assert_eq!(t.sector_size, 512);
        assert!(t.notes.is_empty(), "{:?}", t.notes);
        assert_eq!(t.partitions.len(), 2);
        let root = t.get(3).unwrap();
        assert_eq!((root.start, root.size), (4096 * 512, (8159 - 4096) * 512));
        assert_eq!(root.type_name, "Linux filesystem");
        assert_eq!(root.type_id, "0FC63DAF-8483-4772-8E79-3D69D8477DE4");
        assert_eq!(root.name, "root");
        assert_eq!(t.get(1).unwrap().type_name, "EFI System");
        assert!(t.get(2).is_none());
        assert_eq!(t.numbers(), "partitions 1 and 3");
        let probe = probe_ext(&*d, root.start).unwrap();
        assert_eq!((probe.kind, probe.label.as_str()), ("ext4", "rootfs"));
        assert!(probe_ext(&*d, t.get(1).unwrap().start).is_none());

        let w = open_location(d.clone(), Location::Partition(3)).unwrap();
        assert_eq!(w.size(), root.size);
        let mut m = [0u8; 2];
        w.read_at(1024 + 56, &mut m).unwrap();
        assert_eq!(u16::from_le_bytes(m), 0xEF53);
        let e = open_err(open_location(d.clone(), Location::Partition(2)));
        assert!(
            e.contains("partition 2 does not exist") && e.contains("partitions 1 and 3"),
            "{e}"
        );
    }

    #[test]
    fn gpt_with_4096_byte_sectors() {
        let bytes = gpt_disk(4096, 1024, &[(1, gpt_entry(LINUX_FS, 1, 256, 1000, "data"))]);
        let t = partitions(&*dev(bytes)).unwrap().unwrap();
        assert_eq!(t.sector_size, 4096);
        assert_eq!(t.get(1).unwrap().start, 256 * 4096);
        assert_eq!(t.get(1).unwrap().size, 745 * 4096);
    }

    #[test]
    fn a_damaged_primary_gpt_header_falls_back_to_the_backup() {
        let mut bytes = gpt_disk(512, 4096, &[(1, gpt_entry(LINUX_FS, 1, 2048, 4000, "x"))]);
        bytes[512 + 40] ^= 0xff; // first_usable_lba: the header checksum fails
        let t = partitions(&*dev(bytes.clone())).unwrap().unwrap();
        assert_eq!(t.get(1).unwrap().start, 2048 * 512);
        assert!(t.notes[0].contains("primary GPT header is damaged"), "{:?}", t.notes);
        // Both damaged: an error naming both, not a panic.
        let last = bytes.len() - 512;
        bytes[last + 40] ^= 0xff;
        let e = partitions(&*dev(bytes)).unwrap_err().to_string();
        assert!(
            e.contains("sector 1") && e.contains("sector 4095") && e.contains("checksum"),
            "{e}"
        );
    }

    #[test]
    fn hostile_gpt_headers_are_errors() {
        let base = gpt_disk(512, 4096, &[(1, gpt_entry(LINUX_FS, 1, 2048, 4000, "x"))]);
        // Rewrite a header field (primary and backup) and fix the checksum,
        // so the field itself is what is judged.
        let with = |off: usize, val: &[u8]| {
            let mut b = base.clone();
            for h in [512usize, base.len() - 512] {
                b[h + off..h + off + val.len()].copy_from_slice(val);
                b[h + 16..h + 20].copy_from_slice(&[0; 4]);
                let crc = crc32(&b[h..h + 92]);
                b[h + 16..h + 20].copy_from_slice(&crc.to_le_bytes());
            }
            b
        };
        for (what, bytes, needle) in [
            (
                "huge entry count",
                with(80, &u32::MAX.to_le_bytes()),
                "partition entries",
            ),
            ("entry size", with(84, &256u32.to_le_bytes()), "entries of 256 bytes"),
            (
                "entries past the end",
                with(72, &(u64::MAX / 2).to_le_bytes()),
                "outside the disk",
            ),
            ("usable area", with(48, &u64::MAX.to_le_bytes()), "usable sectors"),
        ] {
            let e = partitions(&*dev(bytes)).expect_err(what).to_string();
            assert!(e.contains(needle), "{what}: {e}");
        }
        // Garbage where the header should be, and no backup: "no GPT".
        let mut b = base.clone();
        b[512..1024].fill(0x33);
        let last = b.len() - 512;
        b[last..].fill(0x33);
        let e = partitions(&*dev(b)).unwrap_err().to_string();
        assert!(e.contains("no GPT header"), "{e}");
        // A damaged entry array (checksum).
        let mut b = base.clone();
        b[1024 + 32] ^= 1;
        let l = b.len();
        b[l - 512 - 32 * 512 + 32] ^= 1;
        let e = partitions(&*dev(b)).unwrap_err().to_string();
        assert!(e.contains("entry array's checksum"), "{e}");
    }

    /// CRC-32 (ISO-HDLC), for forging headers in tests.
    fn crc32(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
            }
        }
        !c
    }

    /// Write entries `(number, first, last)` (Linux filesystem type) into
    /// both entry arrays of a gptman-made disk and fix every checksum: the
    /// tables gptman refuses to write.
    fn forge(mut b: Vec<u8>, entries: &[(u32, u64, u64)]) -> Vec<u8> {
        for h in [512usize, b.len() - 512] {
            let arr = u64::from_le_bytes(b[h + 72..h + 80].try_into().unwrap()) as usize * 512;
            for &(n, first, last) in entries {
                let e = arr + (n as usize - 1) * 128;
                b[e..e + 16].copy_from_slice(&LINUX_FS);
                b[e + 16..e + 32].copy_from_slice(&[n as u8; 16]);
                b[e + 32..e + 40].copy_from_slice(&first.to_le_bytes());
                b[e + 40..e + 48].copy_from_slice(&last.to_le_bytes());
            }
            let crc = crc32(&b[arr..arr + 128 * 128]);
            b[h + 88..h + 92].copy_from_slice(&crc.to_le_bytes());
            b[h + 16..h + 20].copy_from_slice(&[0; 4]);
            let crc = crc32(&b[h..h + 92]);
            b[h + 16..h + 20].copy_from_slice(&crc.to_le_bytes());
        }
        b
    }

    #[test]
    fn hostile_gpt_entries_are_listed_with_their_problem() {
        let base = gpt_disk(512, 4096, &[(1, gpt_entry(LINUX_FS, 1, 2048, 3000, "a"))]);
        let bytes = forge(base.clone(), &[(2, 2900, 4000)]);
        let d = dev(bytes.clone());
        let t = partitions(&*d).unwrap().unwrap();
        assert!(t
            .get(1)
            .unwrap()
            .write_conflict
            .as_deref()
            .unwrap()
            .contains("partition 2"));
        assert!(t
            .get(2)
            .unwrap()
            .write_conflict
            .as_deref()
            .unwrap()
            .contains("partition 1"));
        let e = open_err(open_location(d, Location::Partition(2)));
        assert!(e.contains("overlaps partition 1") && e.contains("read-only"), "{e}");
        // Read-only, an overlapping partition opens.
        let ro: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_vec_read_only(bytes));
        assert!(open_location(ro, Location::Partition(2)).is_ok());

        // Past the end, reversed, inside the table area, beyond u64 bytes.
        let d = dev(forge(
            base,
            &[
                (2, 3100, 99_999),
                (3, 3500, 3400),
                (4, 1, 40),
                (5, u64::MAX - 1, u64::MAX),
            ],
        ));
        let t = partitions(&*d).unwrap().unwrap();
        let problem = |n| t.get(n).unwrap().problem.clone().unwrap_or_default();
        assert!(problem(2).contains("past the end of the image"), "{}", problem(2));
        assert!(problem(3).contains("before its first"), "{}", problem(3));
        assert!(problem(5).contains("beyond any possible disk"), "{}", problem(5));
        assert!(t
            .get(4)
            .unwrap()
            .write_conflict
            .as_deref()
            .unwrap()
            .contains("partition table"));
        for n in [2, 3, 5] {
            let e = open_err(open_location(d.clone(), Location::Partition(n)));
            assert!(e.contains(&format!("partition {n} cannot be opened")), "{e}");
        }
        assert!(open_location(d.clone(), Location::Partition(4)).is_err());
        assert!(open_location(d, Location::Partition(1)).is_ok());
    }

    #[test]
    fn mbr_primary_and_logical_partitions() {
        let mut cur = io::Cursor::new(vec![0u8; 512 * 20000]);
        let mut mbr = MBR::new_from(&mut cur, 512, [1, 2, 3, 4]).unwrap();
        mbr[1] = mbr_entry(0x83, 2048, 4096);
        mbr[2] = mbr_entry(0x05, 8192, 10000);
        // Each push puts an EBR at the given sector and the partition one
        // alignment unit (2048 sectors) after it.
        mbr.push(0x83, 8192, 4096).unwrap();
        mbr.push(0x82, 12288, 4096).unwrap();
        mbr.write_into(&mut cur).unwrap();
        let mut bytes = cur.into_inner();
        put_ext_magic(&mut bytes, (8192 + 2048) * 512, "logical");
        let d = dev(bytes);
        let t = partitions(&*d).unwrap().unwrap();
        assert_eq!(t.kind, TableKind::Mbr);
        assert!(t.notes.is_empty(), "{:?}", t.notes);
        let nums: Vec<u32> = t.partitions.iter().map(|p| p.number).collect();
        assert_eq!(nums, vec![1, 2, 5, 6]);
        assert!(t.get(2).unwrap().extended);
        assert_eq!(t.get(5).unwrap().start, (8192 + 2048) * 512);
        assert_eq!(t.get(6).unwrap().start, (12288 + 2048) * 512);
        assert_eq!(t.get(5).unwrap().type_name, "Linux");
        assert_eq!(t.get(6).unwrap().type_name, "Linux swap");
        assert!(t
            .partitions
            .iter()
            .all(|p| p.problem.is_none() && p.write_conflict.is_none()));
        let w = open_location(d.clone(), Location::Partition(5)).unwrap();
        assert_eq!(probe_ext(&*w, 0).unwrap().label, "logical");
        let e = open_err(open_location(d, Location::Partition(2)));
        assert!(e.contains("extended partition"), "{e}");
    }

    fn raw_mbr(entries: &[(u8, u32, u32)]) -> Vec<u8> {
        let mut b = vec![0u8; 512 * 4096];
        for (i, &(sys, first, n)) in entries.iter().enumerate() {
            let e = 446 + 16 * i;
            b[e + 4] = sys;
            b[e + 8..e + 12].copy_from_slice(&first.to_le_bytes());
            b[e + 12..e + 16].copy_from_slice(&n.to_le_bytes());
        }
        b[510] = 0x55;
        b[511] = 0xAA;
        b
    }

    #[test]
    fn hostile_mbr_tables() {
        // Past the end, zero size, overlapping, starting in sector 0, and
        // one at the very end of the 32-bit range.
        let d = dev(raw_mbr(&[
            (0x83, 2048, 100_000),
            (0x83, 100, 0),
            (0x83, 0, 200),
            (0x83, u32::MAX, u32::MAX),
        ]));
        let t = partitions(&*d).unwrap().unwrap();
        assert!(t.get(1).unwrap().problem.as_deref().unwrap().contains("past the end"));
        assert!(t.get(2).unwrap().problem.as_deref().unwrap().contains("empty"));
        assert!(t
            .get(3)
            .unwrap()
            .write_conflict
            .as_deref()
            .unwrap()
            .contains("sector 0"));
        assert!(t.get(4).unwrap().problem.as_deref().unwrap().contains("past the end"));
        let e = open_err(open_location(d.clone(), Location::Partition(1)));
        assert!(
            e.contains("partition 1 cannot be opened") && e.contains("2097152 bytes"),
            "{e}"
        );

        // An EBR chain that loops back on itself ends with a note.
        let mut b = raw_mbr(&[(0x05, 1000, 3000)]);
        for (ebr, data, link) in [(1000u64, 10u32, 500u32), (1500, 10, 0)] {
            let o = ebr as usize * 512;
            let e = o + 446;
            b[e + 4] = 0x83;
            b[e + 8..e + 12].copy_from_slice(&data.to_le_bytes());
            b[e + 12..e + 16].copy_from_slice(&100u32.to_le_bytes());
            b[e + 16 + 4] = 0x05;
            b[e + 16 + 8..e + 16 + 12].copy_from_slice(&link.to_le_bytes());
            b[e + 16 + 12..e + 16 + 16].copy_from_slice(&100u32.to_le_bytes());
            b[o + 510] = 0x55;
            b[o + 511] = 0xAA;
        }
        let t = partitions(&*dev(b.clone())).unwrap().unwrap();
        let nums: Vec<u32> = t.partitions.iter().map(|p| p.number).collect();
        assert_eq!(nums, vec![1, 5, 6]);
        assert!(t.notes[0].contains("loops back"), "{:?}", t.notes);
        // A link far past the end of the image.
        let o = 1000 * 512 + 446 + 16 + 8;
        b[o..o + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let t = partitions(&*dev(b)).unwrap().unwrap();
        assert!(t.notes[0].contains("past the end"), "{:?}", t.notes);

        // Boot flags other than 0/0x80: not a partition table (a boot sector).
        let mut b = raw_mbr(&[(0x83, 2048, 100)]);
        b[446] = 0x12;
        assert!(partitions(&*dev(b)).unwrap().is_none());
        // No signature, or a tiny image: no table.
        assert!(partitions(&*dev(vec![0; 4096])).unwrap().is_none());
        assert!(partitions(&*dev(vec![0; 10])).unwrap().is_none());
        let e = open_err(open_location(dev(vec![0; 4096]), Location::Partition(1)));
        assert!(e.contains("no partition table"), "{e}");
    }

    #[test]
    fn random_bytes_never_panic() {
        // Random sectors behind a valid MBR signature and random GPT
        // headers behind a protective MBR: errors or tables, never a panic.
        use rand::{RngCore, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x9E37_79B9_7F4A_7C15);
        let mut rnd = || rng.next_u64();
        for round in 0..300 {
            let mut b = vec![0u8; 512 * 64];
            for c in b.chunks_mut(8) {
                let r = rnd().to_le_bytes();
                c.copy_from_slice(&r[..c.len()]);
            }
            for i in 0..4 {
                b[446 + 16 * i] = 0;
            }
            b[510] = 0x55;
            b[511] = 0xAA;
            if round % 2 == 0 {
                // A header that passes the signature, revision, size and
                // checksum tests, with random placement and counts (small
                // ones half the time, so the entry array is reached).
                b[446 + 4] = 0xEE;
                b[512..520].copy_from_slice(b"EFI PART");
                b[520..524].copy_from_slice(&[0, 0, 1, 0]);
                b[524..528].copy_from_slice(&92u32.to_le_bytes());
                b[536..544].copy_from_slice(&1u64.to_le_bytes());
                if round % 4 == 0 {
                    b[552..560].copy_from_slice(&(rnd() % 70).to_le_bytes());
                    b[584..592].copy_from_slice(&(rnd() % 70).to_le_bytes());
                    b[592..596].copy_from_slice(&((rnd() % 200) as u32).to_le_bytes());
                    b[596..600].copy_from_slice(&128u32.to_le_bytes());
                }
                b[528..532].copy_from_slice(&[0; 4]);
                let crc = crc32(&b[512..604]);
                b[528..532].copy_from_slice(&crc.to_le_bytes());
            } else {
                b[446 + 4] = 0x05;
                b[446 + 8..446 + 12].copy_from_slice(&((rnd() % 64) as u32).to_le_bytes());
            }
            let d = dev(b);
            if let Ok(Some(t)) = partitions(&*d) {
                for p in &t.partitions {
                    let _ = open_location(d.clone(), Location::Partition(p.number));
                }
            }
        }
    }

    #[test]
    fn offsets() {
        let d = dev(vec![0; 8192]);
        assert_eq!(open_location(d.clone(), Location::Offset(4096)).unwrap().size(), 4096);
        let e = open_err(open_location(d, Location::Offset(9000)));
        assert!(e.contains("past the end"), "{e}");
    }
}
