//! Opening a filesystem, in the order of the kernel's `ext4_fill_super`:
//! journal recovery, then fast-commit replay, then the caches, then orphan
//! cleanup. The overlay is frozen before the read-only `Fs` opens on it,
//! so its reads take no lock.
//!
//! Recovery is the ext4 layer's (`ext4::journal`): it replays the jbd2 log
//! on disk for a read-write open, or into an in-memory overlay for a
//! read-only one. Fast commits and orphans are recovered by the ext4 code
//! that writes the filesystem, so they need a writable filesystem: for a
//! read-only open that is a throwaway read-write `Fs` over the overlay,
//! whose writes stay in memory, after which the caller's read-only `Fs`
//! opens on the result. If that step fails (a damaged image the write
//! paths refuse), the read-only open still succeeds on what the jbd2
//! replay gave, with a warning: reading must not be lost to an optional
//! cleanup.

use std::path::Path;
use std::sync::Arc;

use ext4kit_blockdev::{BlockDevice, OverlayDevice};
use ext4kit_format::fast_commit::Record;
use ext4kit_format::inode::FileType;

use super::super_block::SuperBlock;
use super::{evict, mount, write, writeback};
use crate::error::{Errno, Error, Result};
use crate::ext4::journal::{self, has_orphans};
use crate::ext4::write_access::{self, Access};
use crate::ext4::{inode, OpenOptions, Volume, ROOT_INO};

/// If `dev` holds no ext superblock at its start but a partition table, the
/// error saying so (which partitions hold ext2/3/4), instead of the
/// superblock's "bad magic" that opening it whole would give.
fn partitioned_disk(dev: &dyn BlockDevice) -> Option<Error> {
    use ext4kit_blockdev::partition::{partitions, probe_ext};
    if probe_ext(dev, 0).is_some() {
        return None;
    }
    let t = match partitions(dev) {
        Ok(Some(t)) => t,
        Ok(None) => return None,
        Err(e) => {
            return Some(Error::posix(
                Errno::EUCLEAN,
                format!("no filesystem at the start of the image, and its partition table cannot be read: {e}"),
            ))
        }
    };
    let ext: Vec<String> = t
        .partitions
        .iter()
        .filter(|p| p.problem.is_none() && !p.extended)
        .filter_map(|p| probe_ext(dev, p.start).map(|x| format!("{} ({})", p.number, x.kind)))
        .collect();
    Some(Error::posix(
        Errno::EINVAL,
        format!(
            "a partitioned disk ({} table with {}; ext2/3/4 in {}), not a filesystem: open one partition \
             (Location::Partition(N))",
            t.kind,
            t.numbers(),
            if ext.is_empty() {
                "none".to_string()
            } else {
                ext.join(", ")
            }
        ),
    ))
}

/// The kernel's checks of the root inode at mount (`ext4_fill_super`,
/// `ext4_iget`): it must be allocated ("root inode unallocated"), a
/// directory, and not empty ("corrupt root inode, run e2fsck"). Without
/// them a deleted root opened "fine" and every path, the mount point
/// itself included, answered ENOENT.
fn check_root(vol: &Volume) -> Result<()> {
    let loc = "inode 2 (the root directory)";
    let root = inode::read(vol, ROOT_INO).map_err(|e| match e {
        Error::Corrupt { location, source } => Error::Corrupt {
            location: format!("{loc}: {location}"),
            source,
        },
        e => e,
    })?;
    let why = if root.base.links_count == 0 || root.base.mode == 0 {
        Some(format!(
            "unallocated (i_links_count {}, i_mode {:o}, i_dtime {})",
            root.base.links_count, root.base.mode, root.base.dtime
        ))
    } else if root.file_type() != Some(FileType::Directory) {
        Some(format!("not a directory (i_mode {:o})", root.base.mode))
    } else if root.size() == 0 || (!root.has_inline_data() && root.base.blocks() == 0) {
        Some(format!(
            "an empty directory record (i_size {}, i_blocks {})",
            root.size(),
            root.base.blocks_lo
        ))
    } else {
        None
    };
    match why {
        Some(w) => Err(Error::corrupt_msg(loc, "root inode", format!("the root inode is {w}"))),
        None => Ok(()),
    }
}

/// What the steps before the volume's open found, for the `Fs`.
#[derive(Debug, Default)]
struct Opened {
    /// Recovery's and the mode decision's warnings, first in the list.
    warnings: Vec<String>,
    /// Why a read-write open became read-only.
    read_only_reason: Option<String>,
}

/// Open an image file (or the partition or offset of it that
/// `opts.location` names): [`Fs::open_image`](super::Fs::open_image).
pub(crate) fn open_image(path: &Path, opts: &OpenOptions) -> Result<SuperBlock> {
    both_places(path, opts)?;
    let req = ext4kit_vdisk::DiskRequest {
        writable: !opts.read_only,
        format: opts.disk_format,
        any_backing_path: opts.any_backing_path,
        volume: opts.volume.clone(),
    };
    let disk = crate::device::open_disk(path, &req).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    place(disk.into_device(), path, opts, opts.volume.is_none())
}

/// Open the filesystem on a disk already opened through its container:
/// [`Fs::open_on_disk`](super::Fs::open_on_disk).
pub(crate) fn open_on_disk(disk: Arc<dyn BlockDevice>, name: &Path, opts: &OpenOptions) -> Result<SuperBlock> {
    both_places(name, opts)?;
    let disk = match &opts.volume {
        None => disk,
        Some(spec) => Arc::new(
            ext4kit_vdisk::lvm::open_on_disk(&disk, spec, !opts.read_only)
                .map_err(|e| Error::io(format!("opening {}", name.display()), e))?,
        ),
    };
    place(disk, name, opts, opts.volume.is_none())
}

/// Open the filesystem an image's bytes hold when they come from a device
/// rather than a path (an image in memory, a program's own storage):
/// [`Fs::open_image_device`](super::Fs::open_image_device). The container
/// format is found by content as for a file; no file the image names (a
/// backing file) is followed, since a device has no directory to find
/// it beside.
pub(crate) fn open_image_device(image: Arc<dyn BlockDevice>, opts: &OpenOptions) -> Result<SuperBlock> {
    let name = Path::new("the image");
    both_places(name, opts)?;
    let req = ext4kit_vdisk::DiskRequest {
        writable: !opts.read_only,
        format: opts.disk_format,
        any_backing_path: false,
        volume: opts.volume.clone(),
    };
    let dev = ext4kit_vdisk::open_device(image, None, &req)
        .map_err(|e| Error::io("opening the image", e))?
        .into_device();
    place(dev, name, opts, opts.volume.is_none())
}

/// A logical volume is found on its own: a location beside it is a
/// contradiction, not a choice.
fn both_places(name: &Path, opts: &OpenOptions) -> Result<()> {
    if opts.volume.is_some() && opts.location != ext4kit_blockdev::Location::Whole {
        return Err(Error::posix(
            Errno::EINVAL,
            format!(
                "{}: both {} and logical volume {} were given; a logical volume is found on its own",
                name.display(),
                opts.location,
                opts.volume.as_deref().unwrap_or_default()
            ),
        ));
    }
    Ok(())
}

/// The filesystem at `opts.location` of `disk` (the guest's disk, or the
/// logical volume asked for); a partitioned disk opened whole is refused
/// with its partitions listed when `whole_disk` says `disk` is the disk.
fn place(disk: Arc<dyn BlockDevice>, name: &Path, opts: &OpenOptions, whole_disk: bool) -> Result<SuperBlock> {
    if whole_disk && opts.location == ext4kit_blockdev::Location::Whole {
        if let Some(e) = partitioned_disk(&*disk) {
            return Err(e);
        }
    }
    let dev = ext4kit_blockdev::open_location(disk, opts.location).map_err(|e| match e.kind() {
        // The table or the choice is wrong, not the device.
        std::io::ErrorKind::InvalidInput => Error::posix(Errno::EINVAL, e.to_string()),
        std::io::ErrorKind::InvalidData => Error::posix(Errno::EUCLEAN, e.to_string()),
        _ => Error::io(format!("finding the filesystem in {}", name.display()), e),
    })?;
    open_device(dev, opts)
}

/// Open the filesystem on any block device, recovering what a crash left
/// (journal, fast commits, orphans) as the module doc describes:
/// [`Fs::open_device`](super::Fs::open_device).
pub(crate) fn open_device(dev: Arc<dyn BlockDevice>, opts: &OpenOptions) -> Result<SuperBlock> {
    let why = if opts.read_only {
        None
    } else if dev.read_only() {
        Some("the device is read-only".to_string())
    } else {
        // Errors reading the superblock are left to the open below,
        // which reports them with their context.
        match journal::read_superblock(&*dev).map(|sb| write_access::access(&sb)) {
            Ok(Access::ReadOnly(why)) => Some(why),
            _ => None,
        }
    };
    let read_only = opts.read_only || why.is_some();
    let opts = OpenOptions {
        read_only,
        ..opts.clone()
    };
    let rec = journal::recover(dev, &opts)?;
    let mut warnings = rec.warnings;
    if let Some(w) = &why {
        warnings.insert(0, format!("opened read-only: {w}"));
    }
    let opened = Opened {
        warnings,
        read_only_reason: why,
    };
    if !read_only {
        let mut sb = open_on(rec.dev, &opts, opened)?;
        let recovered = (|| {
            if !rec.fast_commits.is_empty() {
                replay_fast_commits(&sb, &rec.fast_commits)?;
            }
            // Orphans come after the fast commits, as in ext4_fill_super
            // (fast-commit replay runs inside journal recovery).
            evict::recover_orphans(&sb)?;
            if rec.replayed {
                write::sync(&sb)?;
            }
            Ok(())
        })();
        return match recovered {
            Ok(()) => Ok(sb),
            Err(e) => {
                // Closed as a dropped `Fs` is: what was done is written back.
                mount::close(&mut sb);
                Err(e)
            }
        };
    }
    let disk_sb = journal::read_superblock(&*rec.dev)?;
    let pending = !rec.fast_commits.is_empty() || (has_orphans(&disk_sb) && !opts.no_replay);
    if !pending {
        if let Some(o) = &rec.overlay {
            o.freeze();
        }
        return open_on(rec.dev, &opts, opened);
    }
    let overlay = match rec.overlay {
        Some(o) => o,
        None => Arc::new(OverlayDevice::new(rec.dev.clone(), disk_sb.block_size() as u64)),
    };
    let before = Arc::new(overlay.fork());
    match recover_in_memory(&overlay, &opts, &rec.fast_commits) {
        Ok(()) => {
            overlay.freeze();
            open_on(overlay, &opts, opened)
        }
        Err(e) => {
            let mut opened = opened;
            opened.warnings.push(format!(
                "{} could not be applied in memory ({e}); showing the filesystem without them; run e2fsck",
                if rec.fast_commits.is_empty() {
                    "orphan cleanup"
                } else {
                    "fast commits and orphan cleanup"
                }
            ));
            before.freeze();
            open_on(before, &opts, opened)
        }
    }
}

/// Fast-commit replay and orphan cleanup on a writable filesystem over the
/// overlay; everything it writes stays in the overlay.
fn recover_in_memory(overlay: &Arc<OverlayDevice>, opts: &OpenOptions, fast_commits: &[Record]) -> Result<()> {
    let rw = OpenOptions {
        read_only: false,
        no_replay: false,
        ..opts.clone()
    };
    let dev: Arc<dyn BlockDevice> = overlay.clone();
    let mut sb = open_on(dev, &rw, Opened::default())?;
    let r = (|| {
        if !fast_commits.is_empty() {
            replay_fast_commits(&sb, fast_commits)?;
        }
        evict::recover_orphans(&sb)?;
        write::sync(&sb)
    })();
    mount::close(&mut sb);
    r
}

/// Fast-commit records, applied by the ext4 layer, then the caches are
/// told nothing: this runs before anything is cached.
fn replay_fast_commits(sb: &SuperBlock, recs: &[Record]) -> Result<()> {
    crate::ext4::fc_replay::replay(sb.vol(), recs)
}

/// The caches and the background worker over a recovered device.
fn open_on(dev: Arc<dyn BlockDevice>, opts: &OpenOptions, opened: Opened) -> Result<SuperBlock> {
    let mut vol = journal::open_volume(dev, opts)?;
    vol.prepend_warnings(opened.warnings);
    check_root(&vol)?;
    let mut sb = SuperBlock::new(vol, opts, opened.read_only_reason);
    let flusher = spawn_flusher(&sb);
    sb.set_flusher(flusher);
    Ok(sb)
}

/// The background worker: checkpoint first (a written block can then
/// be evicted), then the three caches' sweeps. It holds the caches,
/// never the `Fs`, so the last `Fs` handle is always dropped by a
/// caller, whose drop stops the worker before the final write-back.
fn spawn_flusher(sb: &SuperBlock) -> Option<ext4kit_cache::flusher::Flusher> {
    let (vol, icache, dcache) = (sb.vol(), sb.icache(), sb.dcache());
    let (v, i, d, p) = (vol.clone(), icache.clone(), dcache.clone(), sb.pages().clone());
    // With a journal the worker also wakes once a second to write back
    // file data dirty for longer than the commit interval and to commit
    // a running transaction older than it (none under a fixed clock:
    // reproducible images allocate at sync).
    let expire = vol.jbd().commit_interval();
    let tick = vol.jbd().is_journaled().then(|| std::time::Duration::from_secs(1));
    let f = ext4kit_cache::flusher::Flusher::spawn_ticking("ext4kit-flush", tick, move || {
        if let Some(e) = expire {
            writeback::write_back_expired(&v, &i, &p, e);
        }
        v.commit_if_due();
        v.checkpoint_if_over();
        i.reclaim();
        d.reclaim();
        v.bcache().reclaim();
    });
    match f {
        Ok(f) => {
            for slot in [
                &vol.bcache().trigger.worker,
                &icache.trigger.worker,
                &dcache.trigger.worker,
            ] {
                let _ = slot.set(f.signal().clone());
            }
            let signal = f.signal().clone();
            vol.jbd().set_worker(Box::new(move || signal.kick()));
            Some(f)
        }
        Err(e) => {
            eprintln!("ext4kit: no background worker ({e}); caches reclaim inline");
            None
        }
    }
}
