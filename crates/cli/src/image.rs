//! Which filesystem a command works on: the image file, where in it the
//! filesystem lives, and whether its journal is replayed.
//!
//! Users hand us VM disks and disks pulled from machines as often as bare
//! filesystem images, so every command takes the same three global options
//! ([`ImageArgs`]): `--partition N` (or the short form `IMAGE@N`),
//! `--offset BYTES`, and `--no-replay`. They are resolved here once, for
//! every command, into an [`Image`]; the commands only open it.
//!
//! A disk whose start holds no ext superblock but a partition table is
//! resolved to its one ext2/3/4 partition (with a note on stderr), or
//! refused with the list of partitions when there are several or none: a
//! guess between two filesystems would be a guess about which one the user
//! meant to change.

use std::fmt;
use std::path::{Path, PathBuf};

use std::sync::{Arc, OnceLock};

use ext4kit::device::{partitions, probe_ext, DiskFormat, DiskRequest, Partition, PartitionTable};
use ext4kit::Location;

use crate::fmt::human;

/// The global options that choose the filesystem inside an image file.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ImageArgs {
    /// Use partition N of a partitioned disk image (GPT or MBR), numbered
    /// as `fdisk -l` and the kernel (loop0pN) number them; `info IMAGE`
    /// lists them. Short form: IMAGE@N (e.g. disk.img@2), used when no file
    /// of that exact name exists.
    #[arg(long, global = true, value_name = "N", conflicts_with = "offset",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub partition: Option<u32>,
    /// The filesystem starts BYTES into the image and runs to its end (as
    /// fuse2fs -o offset= and mke2fs -E offset=); K, M, G suffixes allowed.
    #[arg(long, global = true, value_name = "BYTES", value_parser = crate::parse_bytes)]
    pub offset: Option<u64>,
    /// Show the filesystem as its home locations hold it, without replaying
    /// a journal that needs recovery (the kernel's -o noload): what a crash
    /// left on disk. Read-only commands only: writing over an unreplayed
    /// journal would let a later replay undo the writes, so a command that
    /// writes refuses it.
    #[arg(long, global = true)]
    pub no_replay: bool,
    /// The image file's container format: raw, qcow2, vhdx, vmdk, vhd (or
    /// qemu's name vpc), android-sparse. Chosen by content (the format's
    /// magic) when left out, so a .img that is really qcow2 opens as
    /// qcow2; force it only for a file whose content misleads (a raw disk
    /// that happens to end in a VHD footer).
    #[arg(long = "format", global = true, value_name = "FORMAT")]
    pub format: Option<DiskFormat>,
    /// Follow a backing file (qcow2) or extent file (VMDK) that the image
    /// names anywhere on this machine. By default only names that resolve
    /// inside the image's own directory are followed: the name was chosen
    /// by whoever made the image. Device nodes and URLs are never followed.
    #[arg(long, global = true)]
    pub any_backing_path: bool,
    /// Use LVM2 logical volume VG/LV (as /dev/VG/LV names it), found on
    /// the disk or any of its partitions; `info IMAGE` lists the volume
    /// groups. Short form: IMAGE@VG/LV (e.g. disk.qcow2@rhel/root). Linear
    /// and striped volumes are read and written; the volume must not be
    /// active in a kernel at the same time.
    #[arg(long = "lv", global = true, value_name = "VG/LV", conflicts_with_all = ["partition", "offset"])]
    pub volume: Option<String>,
}

impl ImageArgs {
    /// Whether any option was given (for commands that take no image).
    pub fn any(&self) -> bool {
        self.partition.is_some()
            || self.offset.is_some()
            || self.no_replay
            || self.format.is_some()
            || self.any_backing_path
            || self.volume.is_some()
    }

    /// The image named `arg` on the command line, with these options and
    /// the `IMAGE@N` short form applied.
    pub fn image(&self, arg: impl Into<PathBuf>) -> Result<Image, String> {
        let arg: PathBuf = arg.into();
        if let Some((path, spec)) = volume_short_form(&arg) {
            if self.partition.is_some() || self.offset.is_some() {
                return Err(format!(
                    "{}: names a logical volume, which is found on its own; leave out --partition and --offset",
                    arg.display()
                ));
            }
            if self.volume.as_ref().is_some_and(|v| *v != spec) {
                return Err(format!(
                    "{}: names {spec}, but --lv {} was given",
                    arg.display(),
                    self.volume.as_deref().unwrap_or("")
                ));
            }
            let mut image = Image::new(path, Location::Whole, self.no_replay);
            image.format = self.format;
            image.any_backing_path = self.any_backing_path;
            image.set_volume(Some(spec));
            return Ok(image);
        }
        let short = short_form(&arg);
        let (path, from_short) = match short {
            Some((p, n)) => (p, Some(n)),
            None => (arg.clone(), None),
        };
        let loc = match (from_short, self.partition, self.offset) {
            (Some(a), Some(b), _) if a != b => {
                return Err(format!(
                    "{}: names partition {a}, but --partition {b} was given",
                    arg.display()
                ))
            }
            (Some(_), _, Some(_)) => {
                return Err(format!(
                    "{}: names a partition, but --offset was given too; use one",
                    arg.display()
                ))
            }
            (Some(n), _, _) | (None, Some(n), _) => Location::Partition(n),
            (None, None, Some(off)) => Location::Offset(off),
            (None, None, None) => Location::Whole,
        };
        let mut image = Image::new(path, loc, self.no_replay);
        image.format = self.format;
        image.any_backing_path = self.any_backing_path;
        image.set_volume(self.volume.clone());
        Ok(image)
    }
}

/// `disk.qcow2@rhel/root` → (`disk.qcow2`, `rhel/root`), when no file is
/// named that itself and the part after the last `@` is VG/LV (LVM names:
/// letters, digits and `+_.-`).
fn volume_short_form(arg: &Path) -> Option<(PathBuf, String)> {
    if arg.exists() {
        return None;
    }
    let s = arg.to_str()?;
    let (base, spec) = s.rsplit_once('@')?;
    let (vg, lv) = spec.split_once('/')?;
    let name = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"+_.-".contains(&b));
    (!base.is_empty() && name(vg) && name(lv)).then(|| (PathBuf::from(base), spec.to_string()))
}

/// `disk.img@2` → (`disk.img`, 2), when no file is named `disk.img@2`
/// itself and the part after the last `@` is a partition number.
fn short_form(arg: &Path) -> Option<(PathBuf, u32)> {
    if arg.exists() {
        return None;
    }
    let s = arg.to_str()?;
    let (base, n) = s.rsplit_once('@')?;
    if base.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u32 = n.parse().ok().filter(|&n| n > 0)?;
    Some((PathBuf::from(base), n))
}

/// An image file and where in it the filesystem is.
#[derive(Debug, Clone)]
pub struct Image {
    /// The file (or block device).
    pub path: PathBuf,
    /// Where the user said the filesystem is (`Whole` when they said
    /// nothing: [`Image::resolve`] then looks for a partition table).
    pub loc: Location,
    /// `--no-replay`.
    pub no_replay: bool,
    /// `--format`: the container format, when forced.
    format: Option<DiskFormat>,
    /// `--any-backing-path`.
    any_backing_path: bool,
    /// `--lv VG/LV`: the logical volume holding the filesystem; set with
    /// `set_volume`, which keeps `shown` saying it.
    volume: Option<String>,
    shown: String,
    /// The disk opened read-only once and shared by every probe of this
    /// image and of the same image at another location (`at`): a remote
    /// image's open is a HEAD request and its first blocks fetched again,
    /// a qcow2's its header and tables parsed again (`info` of a URL made
    /// five opens before).
    disk: Arc<OnceLock<Result<Arc<ext4kit::device::Disk>, String>>>,
}

impl Image {
    /// An image at an explicit location.
    pub fn new(path: PathBuf, loc: Location, no_replay: bool) -> Self {
        let shown = match loc {
            Location::Whole => path.display().to_string(),
            Location::Partition(n) => format!("{}@{n}", path.display()),
            Location::Offset(o) => format!("{} (offset {o})", path.display()),
        };
        Image {
            path,
            loc,
            no_replay,
            format: None,
            any_backing_path: false,
            volume: None,
            shown,
            disk: Arc::default(),
        }
    }

    /// `--format`: the container format, when forced.
    pub fn format(&self) -> Option<DiskFormat> {
        self.format
    }

    /// `--any-backing-path`.
    pub fn any_backing_path(&self) -> bool {
        self.any_backing_path
    }

    /// `--lv VG/LV` (or `IMAGE@VG/LV`): the logical volume holding the
    /// filesystem.
    pub fn volume(&self) -> Option<&str> {
        self.volume.as_deref()
    }

    /// Choose the logical volume (and say so in messages: `disk.img@vg/lv`).
    fn set_volume(&mut self, volume: Option<String>) {
        if let Some(v) = &volume {
            self.shown = format!("{}@{v}", self.path.display());
        }
        self.volume = volume;
    }

    /// How messages name it: `disk.img`, `disk.img@2`, `disk.img (offset 1048576)`.
    pub fn display(&self) -> &str {
        &self.shown
    }

    /// Refuse `--no-replay` for a command that writes.
    pub fn check_writable(&self) -> Result<(), String> {
        if self.no_replay {
            return Err(format!(
                "{}: --no-replay is for reading only: writing over a journal that was not replayed would let a \
                 later replay undo the writes (leave --no-replay out to replay it first)",
                self.display()
            ));
        }
        Ok(())
    }

    /// What is at the start of the image, when no location was given.
    pub fn probe(&self) -> Result<Probe, String> {
        if self.loc != Location::Whole || self.volume.is_some() {
            return Ok(Probe::Filesystem);
        }
        let dev = match self.disk() {
            Ok(d) => d.device().clone(),
            // Let the real open report it, with the engine's context.
            Err(_) => return Ok(Probe::Filesystem),
        };
        if probe_ext(&*dev, 0).is_some() {
            return Ok(Probe::Filesystem);
        }
        match partitions(&*dev) {
            Ok(Some(table)) => {
                let parts = table
                    .partitions
                    .iter()
                    .map(|p| {
                        let fs = if p.extended || p.problem.is_some() {
                            None
                        } else {
                            probe_ext(&*dev, p.start)
                        };
                        PartInfo {
                            part: p.clone(),
                            fs: fs.map(|f| (f.kind, f.label)),
                        }
                    })
                    .collect();
                Ok(Probe::Table(Disk { table, parts }))
            }
            // No table: the engine's "bad magic" says what is wrong.
            Ok(None) => Ok(Probe::Filesystem),
            Err(e) => Err(format!(
                "{}: no ext2/3/4 filesystem at its start, and its partition table cannot be read: {e}",
                self.display()
            )),
        }
    }

    /// Where to open: the location given, or for a partitioned disk its
    /// one ext2/3/4 partition (a note on stderr says so); several or none
    /// is an error listing the partitions.
    pub fn resolve(&self) -> Result<Location, String> {
        if self.volume.is_some() {
            return Ok(Location::Whole);
        }
        match self.probe()? {
            Probe::Filesystem if self.loc == Location::Whole => Ok(self.loc),
            Probe::Filesystem => {
                self.check_magic()?;
                Ok(self.loc)
            }
            Probe::Table(disk) => match disk.only_ext() {
                Some(p) => {
                    eprintln!(
                        "ext4kit: note: {}: a partitioned disk ({}); using partition {}, the only one holding \
                         ext2/3/4 (choose with --partition N)",
                        self.display(),
                        disk.table.kind,
                        p.part.number
                    );
                    Ok(Location::Partition(p.part.number))
                }
                None => Err(format!(
                    "{}: a partitioned disk, not a filesystem: {}; choose one with --partition N (or {}@N){}",
                    self.display(),
                    disk.summary(),
                    self.path.display(),
                    self.volume_hint()
                )),
            },
        }
    }

    /// For a partition or offset the user chose, an error that says so
    /// when no ext2/3/4 superblock is there (rather than the engine's "bad
    /// magic", which reads as if a filesystem had been damaged). Problems
    /// opening the image or the partition are left to the real open.
    fn check_magic(&self) -> Result<(), String> {
        let Ok(disk) = self.disk() else {
            return Ok(());
        };
        let Ok(dev) = ext4kit::device::open_location(disk.device().clone(), self.loc) else {
            return Ok(());
        };
        if probe_ext(&*dev, 0).is_some() {
            return Ok(());
        }
        let what = match self.loc {
            Location::Partition(n) => {
                let ty = self
                    .disk()
                    .ok()
                    .and_then(|d| partitions(&**d.device()).ok().flatten())
                    .and_then(|t| t.get(n).map(|p| p.type_name))
                    .unwrap_or("unknown");
                format!("partition {n} (type {ty})")
            }
            _ => format!("{}", self.loc),
        };
        Err(format!(
            "{}: {what} holds no ext2/3/4 filesystem (no superblock magic 0xEF53 at byte 1080 of it); \
             `ext4kit info {}` lists the partitions",
            self.display(),
            self.path.display()
        ))
    }

    /// "; or a logical volume: ..." when the disk holds LVM2 volumes.
    fn volume_hint(&self) -> String {
        let lvs = self.logical_volumes();
        if lvs.is_empty() {
            return String::new();
        }
        format!(
            "; or a logical volume with --lv VG/LV (or {}@VG/LV): {}",
            self.path.display(),
            lvs.iter()
                .map(|l| format!("{}/{}", l.vg(), l.name()))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// The visible LVM2 logical volumes of the disk (none when it has no
    /// PV, or its volume groups cannot be read: opening one reports why).
    pub fn logical_volumes(&self) -> Vec<ext4kit::device::vdisk::lvm::LvInfo> {
        let Ok(disk) = self.disk() else { return Vec::new() };
        ext4kit::device::vdisk::lvm::disk_volume_groups(disk.device())
            .map(|gs| {
                gs.iter()
                    .flat_map(|g| g.logical_volumes().iter().filter(|l| l.visible()).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The same image at `loc`.
    pub fn at(&self, loc: Location) -> Image {
        let mut at = Image::new(self.path.clone(), loc, self.no_replay);
        at.format = self.format;
        at.any_backing_path = self.any_backing_path;
        at.set_volume(self.volume.clone());
        // The container does not depend on the location: one open serves both.
        at.disk = self.disk.clone();
        at
    }

    /// The disk the image file holds, read-only, through its container
    /// format (qcow2, VHDX, ...; the file itself when raw).
    /// Opened once per image (see the `disk` field); the error is the
    /// open's, as text.
    pub fn disk(&self) -> Result<Arc<ext4kit::device::Disk>, String> {
        self.disk
            .get_or_init(|| {
                let req = DiskRequest {
                    writable: false,
                    format: self.format,
                    any_backing_path: self.any_backing_path,
                    volume: None,
                };
                ext4kit::device::open_disk(&self.path, &req)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }
}

impl fmt::Display for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

/// What the start of an image holds.
#[derive(Debug)]
pub enum Probe {
    /// A filesystem (or nothing we know: the open will say), or a location
    /// was given.
    Filesystem,
    /// A partition table and no filesystem.
    Table(Disk),
}

/// A partitioned disk: its table and what each partition holds.
#[derive(Debug)]
pub struct Disk {
    /// The table.
    pub table: PartitionTable,
    /// Each partition with the ext filesystem in it, if any.
    pub parts: Vec<PartInfo>,
}

/// One partition and the ext filesystem found in it.
#[derive(Debug)]
pub struct PartInfo {
    /// The partition.
    pub part: Partition,
    /// ("ext4", label) when it holds ext2/3/4 (or "jbd", an external journal).
    pub fs: Option<(&'static str, String)>,
}

impl PartInfo {
    /// Holds a filesystem we can open (not an external journal).
    pub fn holds_ext(&self) -> bool {
        self.fs.as_ref().is_some_and(|(k, _)| *k != "jbd")
    }

    /// "ext4 \"root\"", "ext3", "-".
    pub fn fs_text(&self) -> String {
        match &self.fs {
            Some((k, l)) if l.is_empty() => k.to_string(),
            Some((k, l)) => format!("{k} \"{l}\""),
            None => "-".to_string(),
        }
    }
}

impl Disk {
    /// The one partition holding ext2/3/4, if exactly one does.
    pub fn only_ext(&self) -> Option<&PartInfo> {
        let mut it = self.parts.iter().filter(|p| p.holds_ext());
        match (it.next(), it.next()) {
            (Some(p), None) => Some(p),
            _ => None,
        }
    }

    /// One line: "GPT table with partition 1 (EFI System, 16.0 MiB), 2
    /// (Linux filesystem, 64.0 MiB, ext4 "root")".
    pub fn summary(&self) -> String {
        if self.parts.is_empty() {
            return format!("{} table with no partitions", self.table.kind);
        }
        let list: Vec<String> = self
            .parts
            .iter()
            .map(|p| {
                let mut s = format!("{} ({}, {}", p.part.number, p.part.type_name, human(p.part.size));
                if p.fs.is_some() {
                    s.push_str(", ");
                    s.push_str(&p.fs_text());
                }
                if p.part.problem.is_some() {
                    s.push_str(", damaged");
                }
                s.push(')');
                s
            })
            .collect();
        format!(
            "{} table with partition{} {}",
            self.table.kind,
            if list.len() == 1 { "" } else { "s" },
            list.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_short_form_applies_only_when_no_such_file_exists() {
        let d = std::env::temp_dir().join(format!("ext4kit-image-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let args = ImageArgs::default();
        let p = d.join("disk.img@2");
        let i = args.image(&p).unwrap();
        assert_eq!(i.loc, Location::Partition(2));
        assert_eq!(i.path, d.join("disk.img"));
        assert!(i.display().ends_with("disk.img@2"));
        std::fs::write(&p, b"x").unwrap();
        let i = args.image(&p).unwrap();
        assert_eq!((i.loc, i.path.clone()), (Location::Whole, p.clone()));
        std::fs::remove_dir_all(&d).unwrap();
        for not_short in ["a@", "@3", "a@x", "a@0", "a@-1", "a@99999999999"] {
            assert_eq!(args.image(not_short).unwrap().loc, Location::Whole, "{not_short}");
        }
        let both = ImageArgs {
            partition: Some(3),
            ..Default::default()
        };
        assert!(both.image("nonexistent.img@2").unwrap_err().contains("--partition 3"));
        assert_eq!(both.image("nonexistent.img@3").unwrap().loc, Location::Partition(3));
        let off = ImageArgs {
            offset: Some(1 << 20),
            ..Default::default()
        };
        assert_eq!(off.image("x.img").unwrap().loc, Location::Offset(1 << 20));
        assert!(off.image("nonexistent.img@1").is_err());
    }
}
