//! Refusing an image that something else is using.
//!
//! Two mounts of one image (two ext4kit servers, or ext4kit and the kernel,
//! or ext4kit and fuse2fs) would each cache metadata the other changes and
//! corrupt the filesystem. Two checks, both done before the image is
//! opened:
//!
//! 1. An advisory lock (`flock(LOCK_EX)`) on the image file, held for the
//!    whole life of the mount: a second ext4kit server (or `ext4kit`
//!    library user taking the same lock) fails at once, and `ext4kit
//!    umount` waits on it to know the server has finished flushing.
//! 2. The kernel's mount table: the image mounted directly (a block
//!    device, or one of its partitions), through a loop device
//!    (`/sys/block/loopN/loop/backing_file` names our file; a partition of
//!    one, `loopNpM` after `losetup -P`, is found through its parent disk),
//!    or by another FUSE server that names it as its source (fuse2fs
//!    does), is refused with the mount point in the message.
//!
//! Both checks are about the whole image file, whichever partition is to
//! be mounted: two mounts of different partitions of one disk are refused
//! too. That is stricter than needed (their bytes are disjoint), but the
//! lock is also how `ext4kit umount` knows the server is done.
//!
//! A second mount of the *same* filesystem (same image file, same
//! partition or offset) is not refused: it becomes a bind mount of the
//! running server's mount point ([`served`], used by
//! [`crate::lifecycle`]), as the kernel shares one superblock between
//! mounts of one device. For that the mount table's source says where the
//! filesystem is, not just which file: `IMAGE`, `IMAGE@N` (partition N,
//! the command line's short form), `IMAGE@offset=BYTES` or `IMAGE@VG/LV`
//! (an LVM2 logical volume) ([`mount_source`], [`parse_source`]).

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The FUSE subtype: our mounts show as `fuse.ext4kit` in /proc/mounts,
/// which is how a mount-table entry is recognised as ours.
pub const SUBTYPE: &str = "ext4kit";

use ext4kit::Location;
use rustix::fs::{flock, FlockOperation};

/// The lock held for the mount's life; released on drop (or process exit,
/// including kill -9).
#[derive(Debug)]
pub struct ImageLock {
    /// `None` for an image that is not a local file (a URL, read-only).
    _file: Option<File>,
}

impl ImageLock {
    /// No lock: for a remote image, which no one else can write through us.
    pub fn none() -> ImageLock {
        ImageLock { _file: None }
    }

    /// Take the exclusive lock or explain who holds it.
    pub fn acquire(image: &Path) -> Result<Self, String> {
        Self::try_acquire(image)?.ok_or_else(|| {
            format!(
                "{}: the image is in use: another ext4kit mount (or a program holding a lock on it) has it open; \
                 unmount that first",
                image.display()
            )
        })
    }

    /// Take the exclusive lock if nobody holds it (`None` if somebody
    /// does); an error only when the image cannot be opened or locked.
    pub fn try_acquire(image: &Path) -> Result<Option<Self>, String> {
        let file = File::open(image).map_err(|e| format!("{}: {e}", image.display()))?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(ImageLock { _file: Some(file) })),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(None),
            Err(e) => Err(format!("{}: cannot lock the image: {e}", image.display())),
        }
    }
}

/// Whether nobody holds the image lock (a shared lock can be taken now).
pub fn lock_is_free(image: &Path) -> bool {
    match File::open(image) {
        Ok(f) => flock(&f, FlockOperation::NonBlockingLockShared).is_ok(),
        Err(_) => true,
    }
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Filesystem type ("ext4", "fuse.ext4kit", ...).
    pub fstype: String,
    /// Source ("/dev/loop0", an image path, ...).
    pub source: String,
    /// The superblock's device number (`st_dev` of every file under the
    /// mount): every mount point of one FUSE connection has the same one.
    pub dev: u64,
    /// Which directory of the filesystem is mounted there ("/" unless it is
    /// a bind mount of a subdirectory).
    pub root: PathBuf,
    /// The superblock is read-only (a read-only server), whatever this
    /// mount point's own flag says.
    pub super_ro: bool,
}

/// Undo the kernel's octal escapes of space, tab, newline and backslash.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The current mount table.
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text.lines().filter_map(parse_mountinfo_line).collect())
}

/// `36 35 98:0 /root /mnt opts [optional fields] - fstype source super_opts`
/// (proc(5)).
fn parse_mountinfo_line(l: &str) -> Option<MountEntry> {
    let (left, right) = l.split_once(" - ")?;
    let mut f = left.split(' ');
    let (maj, min) = f.nth(2)?.split_once(':')?;
    let root = f.next()?;
    let mount_point = f.next()?;
    let mut r = right.split(' ');
    let fstype = r.next()?;
    let source = r.next()?;
    let super_ro = r.next().is_some_and(|o| o.split(',').any(|o| o == "ro"));
    Some(MountEntry {
        mount_point: PathBuf::from(unescape(mount_point)),
        fstype: unescape(fstype),
        source: unescape(source),
        dev: rustix::fs::makedev(maj.parse().ok()?, min.parse().ok()?),
        root: PathBuf::from(unescape(root)),
        super_ro,
    })
}

/// Where a mounted filesystem is: the image file, and the place in it
/// (a partition or offset, or an LVM2 logical volume "VG/LV"). Two mounts
/// are of the same filesystem only when all three agree: two logical
/// volumes of one disk are two filesystems at the same `Location::Whole`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    image: PathBuf,
    location: Location,
    volume: Option<String>,
}

impl Source {
    /// The filesystem at `location` (or in logical volume `volume`) of
    /// `image`.
    pub fn new(image: impl Into<PathBuf>, location: Location, volume: Option<&str>) -> Source {
        Source {
            image: image.into(),
            location,
            volume: volume.map(str::to_string),
        }
    }

    /// The image file.
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// The partition or offset (`Whole` for a logical volume).
    pub fn location(&self) -> Location {
        self.location
    }

    /// The logical volume, "VG/LV".
    pub fn volume(&self) -> Option<&str> {
        self.volume.as_deref()
    }

    /// Where in the image, as a message says it.
    pub fn place(&self) -> String {
        match &self.volume {
            Some(v) => format!("logical volume {v}"),
            None => self.location.to_string(),
        }
    }

    /// Whether this is the filesystem `other` names, the image compared by
    /// identity (`me` is this image's metadata).
    fn same_as(&self, me: &std::fs::Metadata, other: &Source) -> bool {
        self.location == other.location && self.volume == other.volume && same_file(me, &other.image)
    }
}

/// An LVM2 name (a VG or an LV): LVM's own characters, so "VG/LV" after
/// the last `@` cannot be mistaken for anything else.
fn lvm_name(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"+_.-".contains(&b))
}

/// The mount source an ext4kit server gives the filesystem `src` names
/// (its image an absolute path): `IMAGE`, `IMAGE@N`,
/// `IMAGE@offset=BYTES` or `IMAGE@VG/LV`. `None` when the table could not
/// say it unambiguously: a path with a comma (it cannot pass through the
/// option string) or a located source that names an existing file itself
/// (`disk.img@2` beside `disk.img`); such mounts show "ext4kit" and are
/// never bound to.
pub fn mount_source(src: &Source) -> Option<String> {
    let path = src.image.to_str()?;
    if path.contains(',') {
        return None;
    }
    let s = match (&src.volume, src.location) {
        (Some(v), _) => format!("{path}@{v}"),
        (None, Location::Whole) => return Some(path.to_string()),
        (None, Location::Partition(n)) => format!("{path}@{n}"),
        (None, Location::Offset(o)) => format!("{path}@offset={o}"),
    };
    (!Path::new(&s).exists()).then_some(s)
}

/// The filesystem a mount source names (the inverse of [`mount_source`];
/// a plain absolute path, as fuse2fs gives, is the whole file). A source
/// that names an existing file is that file, as the command line's
/// `IMAGE@N` is only a partition when no file has that name.
pub fn parse_source(source: &str) -> Option<Source> {
    let p = Path::new(source);
    if !p.is_absolute() {
        return None;
    }
    if !p.exists() {
        if let Some((base, at)) = source.rsplit_once('@') {
            if let Some((vg, lv)) = at.split_once('/').filter(|(vg, lv)| lvm_name(vg) && lvm_name(lv)) {
                return Some(Source::new(base, Location::Whole, Some(&format!("{vg}/{lv}"))));
            }
            let loc = if let Some(off) = at.strip_prefix("offset=") {
                off.parse().ok().map(Location::Offset)
            } else if !at.is_empty() && at.bytes().all(|b| b.is_ascii_digit()) {
                at.parse().ok().filter(|&n| n > 0).map(Location::Partition)
            } else {
                None
            };
            if let Some(loc) = loc {
                return Some(Source::new(base, loc, None));
            }
        }
    }
    Some(Source::new(p, Location::Whole, None))
}

/// The ext4kit mount (of the whole filesystem, not of a subdirectory) that
/// serves the filesystem `src` names, if any: a second mount of it is a
/// bind mount of this one.
pub fn served(src: &Source) -> Option<MountEntry> {
    let me = std::fs::metadata(&src.image).ok()?;
    let ours = format!("fuse.{SUBTYPE}");
    mounts().ok()?.into_iter().find(|m| {
        m.fstype == ours
            && m.root == Path::new("/")
            && parse_source(&m.source).is_some_and(|other| src.same_as(&me, &other))
    })
}

/// The ext4kit mount points whose filesystem is the FUSE connection with
/// device number `dev` (a server's own mount point and its bind mounts).
pub fn mount_points_of(dev: u64) -> Vec<PathBuf> {
    let ours = format!("fuse.{SUBTYPE}");
    mounts()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.dev == dev && m.fstype == ours)
        .map(|m| m.mount_point)
        .collect()
}

/// Whether two paths name the same file (same device and inode).
fn same_file(a: &std::fs::Metadata, b: &Path) -> bool {
    std::fs::metadata(b).is_ok_and(|m| m.dev() == a.dev() && m.ino() == a.ino())
}

/// The device number of the disk a partition device belongs to (`None`
/// for a device that is not a partition).
fn parent_disk(rdev: u64) -> Option<u64> {
    let sys = format!("/sys/dev/block/{}:{}", rustix::fs::major(rdev), rustix::fs::minor(rdev));
    if !Path::new(&format!("{sys}/partition")).exists() {
        return None;
    }
    let text = std::fs::read_to_string(format!("{sys}/../dev")).ok()?;
    let (maj, min) = text.trim().split_once(':')?;
    Some(rustix::fs::makedev(maj.parse().ok()?, min.parse().ok()?))
}

/// If the kernel has `image` mounted (directly, through a loop device, or
/// as the source of a FUSE mount), a message naming where.
pub fn kernel_user(image: &Path) -> Option<String> {
    mounted_at(image).map(|m| {
        format!(
            "{} is already mounted at {} ({} from {}); unmount it first",
            image.display(),
            m.mount_point.display(),
            m.fstype,
            m.source
        )
    })
}

/// The mount-table entry through which the kernel has `image` mounted, if
/// any (see [`kernel_user`]).
pub fn mounted_at(image: &Path) -> Option<MountEntry> {
    let me = std::fs::metadata(image).ok()?;
    let table = mounts().ok()?;
    for m in &table {
        let src = Path::new(&m.source);
        let hit = if me.file_type().is_block_device() {
            // The device itself, or one of its partitions.
            std::fs::metadata(src).is_ok_and(|s| {
                s.file_type().is_block_device() && (s.rdev() == me.rdev() || parent_disk(s.rdev()) == Some(me.rdev()))
            })
        } else if let Some(dev) = m.source.strip_prefix("/dev/") {
            // A loop device over the file (`losetup`, `mount -o loop`,
            // with or without an offset), or a partition of one
            // (`losetup -P`: /dev/loop0p2, whose disk is the parent
            // directory in sysfs).
            [
                format!("/sys/class/block/{dev}/loop/backing_file"),
                format!("/sys/class/block/{dev}/../loop/backing_file"),
            ]
            .iter()
            .filter_map(|b| std::fs::read_to_string(b).ok())
            .any(|b| same_file(&me, Path::new(b.trim_end().trim_end_matches(" (deleted)"))))
        } else {
            // A FUSE server's image (`IMAGE@N` for a partition of it).
            parse_source(&m.source).is_some_and(|other| same_file(&me, other.image()))
        };
        if hit {
            return Some(m.clone());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_escapes() {
        let l = "36 35 98:0 / /mnt/my\\040dir rw,noatime master:1 - fuse.ext4kit /tmp/a\\040b.img ro,user_id=0";
        let e = parse_mountinfo_line(l).unwrap();
        assert_eq!(e.mount_point, PathBuf::from("/mnt/my dir"));
        assert_eq!(e.fstype, "fuse.ext4kit");
        assert_eq!(e.source, "/tmp/a b.img");
        assert_eq!(e.dev, rustix::fs::makedev(98, 0));
        assert_eq!(e.root, PathBuf::from("/"));
        assert!(e.super_ro);
        let l = "40 35 0:52 /sub /mnt/b rw shared:3 - fuse.ext4kit /x.img rw,user_id=0";
        let e = parse_mountinfo_line(l).unwrap();
        assert_eq!((e.root, e.super_ro), (PathBuf::from("/sub"), false));
        assert!(parse_mountinfo_line("garbage").is_none());
    }

    #[test]
    fn mount_sources_carry_the_location_and_read_back() {
        let dir = std::env::temp_dir().join(format!("ext4kit-fuse-src-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("disk.img");
        std::fs::write(&img, b"x").unwrap();
        let at = |loc| Source::new(&img, loc, None);
        for loc in [Location::Whole, Location::Partition(2), Location::Offset(1 << 20)] {
            let s = mount_source(&at(loc)).unwrap();
            assert_eq!(parse_source(&s), Some(at(loc)), "{s}");
        }
        assert_eq!(
            mount_source(&at(Location::Partition(3))).unwrap(),
            format!("{}@3", img.display())
        );
        // A logical volume is its own place: two LVs of one disk are two
        // filesystems, both at Location::Whole.
        let lv = Source::new(&img, Location::Whole, Some("vg0/root"));
        let s = mount_source(&lv).unwrap();
        assert_eq!(s, format!("{}@vg0/root", img.display()));
        assert_eq!(parse_source(&s), Some(lv.clone()));
        assert_ne!(
            parse_source(&s),
            Some(Source::new(&img, Location::Whole, Some("vg0/home")))
        );
        assert_ne!(parse_source(&s), Some(at(Location::Whole)));
        let me = std::fs::metadata(&img).unwrap();
        assert!(lv.same_as(&me, &lv));
        assert!(!lv.same_as(&me, &at(Location::Whole)));
        // A file that is itself named like a located source is that file;
        // a located source that would read as it is not given.
        let odd = dir.join("disk.img@3");
        std::fs::write(&odd, b"x").unwrap();
        assert_eq!(
            parse_source(odd.to_str().unwrap()),
            Some(Source::new(&odd, Location::Whole, None))
        );
        assert_eq!(mount_source(&at(Location::Partition(3))), None);
        assert_eq!(mount_source(&Source::new("/a,b.img", Location::Whole, None)), None);
        assert_eq!(parse_source("ext4kit"), None);
        assert_eq!(
            parse_source("/x.img@0"),
            Some(Source::new("/x.img@0", Location::Whole, None))
        );
        assert_eq!(
            parse_source("/x.img@vg/lv/extra"),
            Some(Source::new("/x.img@vg/lv/extra", Location::Whole, None))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let p = std::env::temp_dir().join(format!("ext4kit-fuse-lock-{}", std::process::id()));
        std::fs::write(&p, b"x").unwrap();
        let a = ImageLock::acquire(&p).unwrap();
        assert!(!lock_is_free(&p));
        let e = ImageLock::acquire(&p).unwrap_err();
        assert!(e.contains("in use"), "{e}");
        drop(a);
        assert!(lock_is_free(&p));
        ImageLock::acquire(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
    }
}
