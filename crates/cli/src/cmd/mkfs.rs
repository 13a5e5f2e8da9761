//! `ext4kit mkfs [-t TYPE] [-b BLOCKSIZE] ... IMAGE SIZE`: make an empty
//! filesystem in an image file, mke2fs-style.
//!
//! A regular file is truncated and extended to SIZE as a sparse file (so the
//! engine may skip writing zeros); a block device is written in place and
//! must hold SIZE. `SOURCE_DATE_EPOCH` fixes every timestamp and, unless
//! `-E hash_seed=` is given, derives the directory hash seed from the UUID;
//! with a fixed `-U` as well, the image is byte-for-byte reproducible.
//!
//! With `--partition N` (`IMAGE@N`) the filesystem is made inside that
//! partition of an existing partitioned disk (SIZE defaults to the
//! partition's), and with `--offset BYTES` at that offset (mke2fs's `-E
//! offset=`; the file grows if needed, never shrinks): nothing outside the
//! chosen area is written. Over a whole disk that holds a partition table
//! mkfs refuses unless `-F` is given, as mke2fs asks first.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ext4kit::device::{open_location, partitions, probe_ext, BlockDevice, FileDevice, WindowDevice};
use ext4kit::mkfs::{dry_run, mkfs, FsType, MkfsOptions, MkfsReport};
use ext4kit::Location;
use ext4kit_populate::sizing::Extra;
use ext4kit_populate::{ImageBuilder, ImageSize, OutputFormat};

use super::Image;
use crate::image::ImageArgs;

/// Arguments of `ext4kit mkfs` (clap parses them straight into this).
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "EXAMPLES:
  ext4kit mkfs disk.img 256M                  an empty ext4 filesystem
  ext4kit mkfs -t ext2 -b 1024 small.img 8M
  ext4kit mkfs -d rootfs/ disk.img 256M       filled from a directory tree
  ext4kit mkfs -d rootfs.tar.gz --all-root disk.img 256M
                                              from a tar, every file root's
  ext4kit mkfs -d base.tar -d overlay/ disk.img 1G
                                              the directory over the tar
  ext4kit mkfs -d alpine-oci/ --platform linux/arm64 --all-root disk.img 64M
                                              an OCI image's layers, in order
  ext4kit mkfs -d rootfs.tar --all-root --free 10% disk.img
                                              the smallest image, 10% free
  ext4kit mkfs -d system/ --fs-config fs_config --file-contexts file_contexts \
      --output-format android-sparse system.img
                                              an Android sparse image

REPRODUCIBLE BUILDS:
  SOURCE_DATE_EPOCH=1700000000 ext4kit mkfs -U 01234567-89ab-cdef-0123-456789abcdef -d rootfs/ disk.img 256M

  With SOURCE_DATE_EPOCH set, every timestamp is that time and, unless
  -E hash_seed=UUID is given, the directory hash seed is derived from the
  UUID: the same tree, options and -U give a byte-identical image. (mke2fs
  needs -E hash_seed= as well.)")]
pub struct Args {
    /// Filesystem type: ext2, ext3 or ext4.
    #[arg(short = 't', default_value = "ext4", value_name = "TYPE")]
    pub fs_type: String,
    /// Block size in bytes (1024..65536); default 1024 below 512 MiB, else 4096.
    #[arg(short = 'b', value_name = "BLOCKSIZE")]
    pub block_size: Option<u32>,
    /// Volume label (at most 16 bytes).
    #[arg(short = 'L', value_name = "LABEL")]
    pub label: Option<String>,
    /// Filesystem UUID, or "random", "time", "clear". With
    /// SOURCE_DATE_EPOCH set, a fixed UUID makes the image reproducible.
    #[arg(short = 'U', value_name = "UUID")]
    pub uuid: Option<String>,
    /// Number of inodes (default: from the size, as mke2fs).
    #[arg(short = 'N', value_name = "INODES")]
    pub inodes: Option<u64>,
    /// Inode size in bytes (default 256).
    #[arg(short = 'I', value_name = "INODE_SIZE")]
    pub inode_size: Option<u16>,
    /// Feature edits, e.g. "^has_journal,metadata_csum_seed" (repeatable).
    #[arg(short = 'O', value_name = "FEATURES")]
    pub features: Vec<String>,
    /// Build for a program that must open the image: u-boot (reading and
    /// writing), u-boot-read, grub (2.06), grub-2.12, android, or
    /// linux-X.Y (e.g. linux-4.19). Default features it lacks are left
    /// out (each named in a note); an -O feature it lacks is an error.
    /// Repeatable: every reader given must open the image. Example:
    /// `--compat grub --compat linux-4.19`. `ext4kit info --compat IMAGE`
    /// judges an existing image; README.md's "Readers" table says who
    /// supports what.
    #[arg(long = "compat", value_name = "READER", value_parser = ext4kit::readers::Reader::parse)]
    pub compat: Vec<ext4kit::readers::Reader>,
    /// Extended options: hash_seed=UUID (default random; derived from the
    /// UUID when SOURCE_DATE_EPOCH is set), offset=BYTES (as --offset)
    /// (repeatable).
    #[arg(short = 'E', value_name = "OPTIONS")]
    pub extended: Vec<String>,
    /// Percentage of blocks reserved for root (default 5).
    #[arg(short = 'm', value_name = "PERCENT")]
    pub reserved_percent: Option<f64>,
    /// Populate from a directory tree, a tar archive (plain, gzip, zstd or
    /// xz) or an OCI image (a layout directory, an oci-archive or `docker
    /// save` tar), told apart by content: modes, owners, times, symlinks,
    /// hard links, device nodes, xattrs, holes; an image's layers with
    /// their whiteouts. Repeatable: later sources overlay earlier ones.
    #[arg(short = 'd', value_name = "SOURCE")]
    pub sources: Vec<PathBuf>,
    #[command(flatten)]
    pub owners: super::put::OwnerArgs,
    /// With an OCI image as SOURCE holding several: the one of this name
    /// (NAME[:TAG], or only TAG).
    #[arg(long = "image", value_name = "NAME[:TAG]")]
    pub oci_image: Option<String>,
    /// Without SIZE (or SIZE "min"): free space to leave beyond what the
    /// sources need, as a size (64M) or a percentage of the image (10%).
    #[arg(long, value_name = "SIZE|PCT", default_value = "0")]
    pub free: String,
    /// Without SIZE (or SIZE "min"): inodes to leave free, as a count or a
    /// percentage of what the sources use.
    #[arg(long, value_name = "N|PCT", default_value = "0")]
    pub free_inodes: String,
    /// With an OCI image index offering several platforms: this one
    /// (default: linux and this machine's architecture).
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    pub platform: Option<String>,
    /// How IMAGE is written: raw (the filesystem byte for byte, a sparse
    /// file); android-sparse (what img2simg writes and fastboot flashes,
    /// written from the blocks the filesystem holds, without a raw image
    /// first; its size is a multiple of 4 KiB); or a VM disk, qcow2, vhdx
    /// or vhd (qemu's vpc), whose whole disk is the filesystem, written
    /// straight through the format (no raw image, no qemu-img convert).
    #[arg(long, value_name = "FORMAT", default_value = "raw")]
    pub output_format: String,
    /// Print nothing on success.
    #[arg(short = 'q')]
    pub quiet: bool,
    /// Make the filesystem over the whole IMAGE even though it holds a
    /// partition table (which is lost).
    #[arg(short = 'F')]
    pub force: bool,
    /// The image file (or block device) to write; IMAGE@N for partition N
    /// of a partitioned disk (or --partition N, --offset BYTES).
    pub image: PathBuf,
    /// Size: 64M, 1G, 4096K, 8s (sectors); a bare number counts -b blocks,
    /// else KiB. Optional with --partition (default: the whole partition)
    /// and --offset (default: to the end of the image), and with -d: then
    /// (or with "min") the smallest image that holds the sources plus
    /// --free and --free-inodes, computed before anything is written (4
    /// KiB blocks unless -b says otherwise; no root reserve unless -m).
    pub size: Option<String>,
}

/// Parse a UUID written as 32 hex digits with optional dashes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|&c| c != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let txt = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(txt, 16).ok()?;
    }
    Some(out)
}

/// Parse SIZE the way mke2fs does: a number with a suffix `K`, `M`, `G`,
/// `T` (binary units) or `s` (512-byte sectors); without a suffix, a count
/// of `-b` blocks if given, else of KiB.
pub fn parse_size(s: &str, block_size: Option<u32>) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        (i, 's') => (&s[..i], 512),
        _ => (s, block_size.map_or(1024, u64::from)),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// Make the filesystem and print a short summary.
pub fn run(a: &Args, sel: &ImageArgs) -> Result<(), String> {
    let image = sel.image(&a.image)?;
    image.check_writable()?;
    let img = image.display().to_string();
    let fail = |m: String| format!("{img}: {m}");
    // Check the sources and the owner options before the image is touched.
    let rules = a.owners.rules()?;
    let mut sources = Vec::new();
    let choice = ext4kit_populate::source::oci::ImageChoice {
        image: a.oci_image.clone(),
        platform: a.platform.clone(),
    };
    for d in &a.sources {
        sources.push(ext4kit_populate::source::open(d, &choice).map_err(|e| e.to_string())?);
    }
    let fs_type = FsType::parse(&a.fs_type).ok_or_else(|| {
        fail(format!(
            "unknown filesystem type \"{}\" (ext2, ext3 or ext4)",
            a.fs_type
        ))
    })?;
    let size = match a.size.as_deref() {
        None | Some("min") => None,
        Some(s) => Some(
            parse_size(s, a.block_size)
                .filter(|&s| s > 0)
                .ok_or_else(|| fail(format!("invalid size \"{s}\" (examples: 64M, 1G, 4096K)")))?,
        ),
    };
    let mut o = MkfsOptions {
        fs_type,
        block_size: a.block_size,
        inodes: a.inodes,
        label: a.label.clone().unwrap_or_default(),
        features: a.features.clone(),
        readers: a.compat.clone(),
        ..MkfsOptions::default()
    };
    if let Some(i) = a.inode_size {
        o.inode_size = i;
    }
    if let Some(m) = a.reserved_percent {
        o.reserved_percent = m;
    }
    match a.uuid.as_deref() {
        None | Some("random") | Some("time") => {}
        Some("clear") => o.uuid = Some([0; 16]),
        Some(u) => o.uuid = Some(parse_uuid(u).ok_or_else(|| fail(format!("invalid UUID \"{u}\"")))?),
    }
    let mut image = image;
    for e in a.extended.iter().flat_map(|s| s.split(',')) {
        match e.split_once('=') {
            Some(("hash_seed", v)) => {
                o.hash_seed = Some(parse_uuid(v).ok_or_else(|| fail(format!("invalid hash_seed \"{v}\"")))?);
            }
            // mke2fs's spelling of --offset.
            Some(("offset", v)) => {
                let off = crate::parse_bytes(v).map_err(fail)?;
                match image.loc {
                    Location::Whole => image = image.at(Location::Offset(off)),
                    Location::Offset(o) if o == off => {}
                    other => return Err(fail(format!("-E offset={v} conflicts with {other}"))),
                }
            }
            _ => {
                return Err(fail(format!(
                    "unknown extended option \"{e}\" (supported: hash_seed=UUID, offset=BYTES)"
                )))
            }
        }
    }
    let img = image.display().to_string();
    let fail = |m: String| format!("{img}: {m}");
    o.clock = ext4kit::Clock::from_source_date_epoch().map_err(fail)?;
    let format = OutputFormat::parse(&a.output_format).map_err(fail)?;
    if a.size.as_deref() == Some("min") && sources.is_empty() {
        return Err(fail("SIZE \"min\" needs -d SOURCE".into()));
    }
    if !sources.is_empty() || format != OutputFormat::Raw {
        let req = BuildRequest {
            mkfs: o,
            size,
            sources,
            rules,
            format,
        };
        return build(a, &image, req);
    }
    let (dev, size) = place(a, &image, size, &mut o)?;
    let r = mkfs(&*dev, size, &o).map_err(|e| fail(e.to_string()))?;
    if !a.quiet {
        print_made(a, &img, &r);
    }
    Ok(())
}

/// The device a filesystem of `size` (given, or the partition's, or to
/// the end of the image) is made on at `image`'s location, checked with
/// mkfs's dry run before anything is touched; `o.device_zeroed` says
/// whether it reads as zeros. A whole regular file is created (or
/// truncated) as a sparse file of SIZE.
fn place(
    a: &Args,
    image: &Image,
    size: Option<u64>,
    o: &mut MkfsOptions,
) -> Result<(Arc<dyn BlockDevice>, u64), String> {
    let img = image.display().to_string();
    let fail = |m: String| format!("{img}: {m}");
    if let Some(volume) = image.volume() {
        // An LVM2 logical volume: the disk's container (qcow2, ...) and
        // its GPT are opened as for any other command, and the filesystem
        // fills the volume (or SIZE of it).
        let req = ext4kit::device::DiskRequest {
            writable: true,
            format: image.format(),
            any_backing_path: image.any_backing_path(),
            volume: Some(volume.to_string()),
        };
        let dev = ext4kit::device::open_disk(&image.path, &req)
            .map_err(|e| fail(e.to_string()))?
            .into_device();
        let size = within(size, dev.size(), "logical volume").map_err(fail)?;
        dry_run(size, o).map_err(|e| fail(e.to_string()))?;
        return Ok((dev, size));
    }
    match image.loc {
        Location::Whole => {
            let size = size.ok_or_else(|| fail("SIZE is needed (e.g. 64M)".into()))?;
            // Every option and size check happens before the image is touched.
            dry_run(size, o).map_err(|e| fail(e.to_string()))?;
            if !a.force {
                refuse_partitioned(image)?;
            }
            if !is_block_device(&image.path) {
                create_sparse(&image.path, size).map_err(|e| fail(e.to_string()))?;
                o.device_zeroed = true;
            }
            let dev: Arc<dyn BlockDevice> =
                Arc::new(FileDevice::open(&image.path, true).map_err(|e| fail(e.to_string()))?);
            Ok((dev, size))
        }
        Location::Partition(_) => {
            let disk = FileDevice::open(&image.path, true).map_err(|e| fail(e.to_string()))?;
            let dev = open_location(Arc::new(disk), image.loc).map_err(|e| fail(e.to_string()))?;
            let size = within(size, dev.size(), "partition").map_err(fail)?;
            dry_run(size, o).map_err(|e| fail(e.to_string()))?;
            Ok((dev, size))
        }
        Location::Offset(off) => {
            let meta = std::fs::metadata(&image.path).ok();
            let old_len = meta.as_ref().map_or(0, |m| m.len());
            let is_file = meta.as_ref().is_none_or(|m| m.is_file());
            let size = match size {
                Some(s) => s,
                None => old_len
                    .checked_sub(off)
                    .filter(|&s| s > 0)
                    .ok_or_else(|| fail(format!("SIZE is needed: the image ends before offset {off}")))?,
            };
            let end = off
                .checked_add(size)
                .ok_or_else(|| fail(format!("offset {off} + size {size} is too large")))?;
            dry_run(size, o).map_err(|e| fail(e.to_string()))?;
            if is_file && end > old_len {
                // Grow (never truncate) the file: what lies before the
                // offset stays as it was.
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&image.path)
                    .map_err(|e| fail(e.to_string()))?;
                f.set_len(end).map_err(|e| fail(e.to_string()))?;
            }
            // Space the file did not have before reads as zeros.
            o.device_zeroed = is_file && old_len <= off;
            let disk: Arc<dyn BlockDevice> =
                Arc::new(FileDevice::open(&image.path, true).map_err(|e| fail(e.to_string()))?);
            let dev: Arc<dyn BlockDevice> =
                Arc::new(WindowDevice::new(disk, off, size).map_err(|e| fail(e.to_string()))?);
            Ok((dev, size))
        }
    }
}

/// SIZE, if given, no larger than the `what` it goes in (`room` bytes);
/// else all of it.
fn within(size: Option<u64>, room: u64, what: &str) -> Result<u64, String> {
    match size {
        Some(s) if s > room => Err(format!("SIZE {s} is larger than the {what} ({room} bytes)")),
        Some(s) => Ok(s),
        None => Ok(room),
    }
}

fn is_block_device(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false)
}

/// mkfs's summary (and its notes on stderr).
fn print_made(a: &Args, img: &str, r: &MkfsReport) {
    for n in &r.notes {
        eprintln!("ext4kit: note: {img}: {n}");
    }
    let u = &r.uuid;
    println!(
        "Created {} on {img}: {} blocks of {} bytes, {} inodes, {} groups, journal {} blocks",
        a.fs_type, r.blocks_count, r.block_size, r.inodes_count, r.groups, r.journal_blocks
    );
    println!(
        "UUID {:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]
    );
    println!("Features: {}", r.features.join(" "));
}

/// `-d SOURCE...` (or an output format other than raw): the library's
/// image builder makes the filesystem and copies each source in, later
/// sources over earlier ones. Into a whole regular file the build is made
/// under a temporary name beside IMAGE and renamed over it once written
/// back, so a build that dies half way leaves IMAGE as it was; on a
/// device, a partition or at an offset it is made in place, and a failed
/// build clears the superblock's magic.
/// What `run` hands `build`: the checked options and the opened sources.
struct BuildRequest {
    mkfs: MkfsOptions,
    /// SIZE, when given.
    size: Option<u64>,
    sources: Vec<Box<dyn ext4kit_populate::Source>>,
    rules: ext4kit_populate::Rules,
    format: OutputFormat,
}

/// Where `build` writes: a whole regular file, made under a temporary
/// name and renamed into place, or a device, partition or range of a
/// file of this size, in place.
enum Target {
    File(ImageSize),
    Device(Arc<dyn BlockDevice>, u64),
}

fn build(a: &Args, image: &Image, req: BuildRequest) -> Result<(), String> {
    let BuildRequest {
        mkfs: mut o,
        size,
        sources,
        rules,
        format,
    } = req;
    let img = image.display().to_string();
    let into_file = image.loc == Location::Whole && image.volume().is_none() && !is_block_device(&image.path);
    if into_file && !a.force {
        refuse_partitioned(image)?;
    }
    if !into_file && format != OutputFormat::Raw {
        return Err(format!(
            "{img}: an Android sparse image or a VM disk is a file of its own: it cannot be written onto a \
             device, a partition, a logical volume or at an offset (write it to a file, then flash or copy that)"
        ));
    }
    // Into a file: SIZE, or without it the smallest image that holds the
    // sources, with no root reserve unless -m asks for one (its free space
    // is what --free says), 4 KiB blocks unless -b. Elsewhere: SIZE, or
    // the partition's, or to the end of the image (`place`).
    let target = if into_file {
        let rule = match size {
            Some(b) => ImageSize::Bytes(b),
            None => {
                let free = Extra::parse(&a.free, crate::parse_bytes).map_err(|e| format!("--free {e}"))?;
                let count = |s: &str| s.parse::<u64>().map_err(|_| format!("\"{s}\" is not a count"));
                let free_inodes = Extra::parse(&a.free_inodes, count).map_err(|e| format!("--free-inodes {e}"))?;
                if a.reserved_percent.is_none() {
                    o.reserved_percent = 0.0;
                }
                ImageSize::Smallest { free, free_inodes }
            }
        };
        Target::File(rule)
    } else {
        let (dev, size) = place(a, image, size, &mut o)?;
        Target::Device(dev, size)
    };
    let refs: Vec<&Path> = a.sources.iter().map(|p| p.as_path()).collect();
    let bar = super::put::progress_bar(&refs);
    let b = bar.clone();
    let zeroed = o.device_zeroed;
    let mut builder = ImageBuilder::new(o).rules(rules).format(format).on_progress(move |p| {
        b.set_position(p.bytes);
        if b.length().is_none() {
            b.set_message(format!("{} entries", p.entries));
        }
    });
    for s in sources {
        builder = builder.source(s);
    }
    let r = match target {
        Target::File(rule) => builder
            .size(rule)
            .build(&image.path)
            .map_err(|e| format!("{e}\n{img}: left as it was (the build stopped before the image was complete)")),
        Target::Device(dev, size) => builder.size(ImageSize::Bytes(size)).build_on(dev, zeroed).map_err(|e| {
            format!("{e}\n{img}: the unfinished filesystem's superblock magic is cleared: nothing takes it for one")
        }),
    };
    bar.finish_and_clear();
    let r = r?;
    if !a.quiet {
        if let Some(n) = &r.needs {
            eprintln!(
                "ext4kit: {img}: the sources need {} inodes and {} blocks of {} bytes ({} bytes of data): size {} bytes",
                n.inodes, n.blocks, r.mkfs.block_size, n.data_bytes, r.size
            );
        }
        print_made(a, &img, &r.mkfs);
        if !a.sources.is_empty() {
            eprintln!(
                "ext4kit: {img}: copied {} entries, {} bytes",
                r.copied.entries, r.copied.bytes
            );
        }
        if let Some(sp) = &r.sparse {
            eprintln!(
                "ext4kit: {img}: Android sparse image of {} blocks of 4096 bytes: {} bytes in {} raw, {} fill and {} don't-care chunks",
                sp.blocks, sp.bytes, sp.raw_chunks, sp.fill_chunks, sp.dont_care_chunks
            );
        }
    }
    Ok(())
}

/// Refuse to make a filesystem over a whole disk that holds a partition
/// table (mke2fs asks first; -F goes ahead).
fn refuse_partitioned(image: &Image) -> Result<(), String> {
    let Ok(dev) = FileDevice::open(&image.path, false) else {
        return Ok(());
    };
    if probe_ext(&dev, 0).is_some() {
        return Ok(());
    }
    match partitions(&dev) {
        Ok(Some(t)) => Err(format!(
            "{}: holds a {} partition table ({}): a filesystem over the whole disk would destroy it; make it in \
             one partition with --partition N (or {}@N), or pass -F to replace the whole disk",
            image.display(),
            t.kind,
            t.numbers(),
            image.path.display()
        )),
        _ => Ok(()),
    }
}
/// Create (or truncate) `path` and extend it to `size` bytes without
/// writing data, so every block reads as zeros.
fn create_sparse(path: &Path, size: u64) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    f.set_len(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M", None), Some(64 << 20));
        assert_eq!(parse_size("1G", None), Some(1 << 30));
        assert_eq!(parse_size("4096K", None), Some(4 << 20));
        assert_eq!(parse_size("100", None), Some(100 << 10));
        assert_eq!(parse_size("100", Some(4096)), Some(409600));
        assert_eq!(parse_size("8s", None), Some(4096));
        assert_eq!(parse_size("x", None), None);
        assert_eq!(parse_size("", None), None);
        assert_eq!(parse_size("99999999999999T", None), None);
    }

    #[test]
    fn uuids() {
        assert_eq!(
            parse_uuid("01234567-89ab-cdef-0123-456789abcdef"),
            Some([0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef])
        );
        assert_eq!(parse_uuid("0123"), None);
        assert_eq!(parse_uuid("zz234567-89ab-cdef-0123-456789abcdef"), None);
    }
}
