//! `ext4kit mount` and `ext4kit umount`: argument handling only; the
//! server and its lifecycle are the `ext4kit-fuse` crate.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use ext4kit::Location;

use crate::image::ImageArgs;

/// Mount an image with the ext4kit FUSE server.
#[derive(Args, Debug)]
#[command(after_help = "EXAMPLES:
  ext4kit mount disk.img /mnt/disk            mount read-write; returns once it works
  cp -a ~/photos /mnt/disk/ && ls -l /mnt/disk
  ext4kit umount /mnt/disk                    unmount: flush, mark the image clean,
                                              wait for the server to finish
  ext4kit mount -o ro disk.img /mnt/disk      read-only
  ext4kit mount -o allow_other disk.img /mnt/disk
                                              let every user use it (permissions are
                                              checked against the image's modes and
                                              owners; new files belong to their creator)
  ext4kit mount -o busy_poll=0 disk.img /mnt/disk
                                              never spin waiting for requests
                                              (slower round trips, no CPU
                                              spent between them)
  ext4kit mount -o cache=direct disk.img /mnt/disk
                                              no kernel page cache for file data
                                              (faster random writes, slower re-reads)
  ext4kit mount --foreground --threads 4 disk.img /mnt/disk
                                              stay in the terminal; Ctrl-C unmounts
  ext4kit mount -v disk.img /mnt/disk         say how requests travel, e.g.
                                              `requests through io_uring (2 CPU
                                              queues, 2 ring threads)`
  ext4kit mount -o transport=uring disk.img /mnt/disk
                                              FUSE over io_uring or fail saying why
  ext4kit mount --partition 2 vm.img /mnt/root
  ext4kit mount vm.img@2 /mnt/root            partition 2 of a partitioned disk (GPT
                                              or MBR; `ext4kit info vm.img` lists them);
                                              with one ext partition it is found alone
  ext4kit mount -o offset=1M disk.img /mnt/disk
                                              a filesystem 1 MiB into the file
  ext4kit mount -o noload crashed.img /mnt/disk
                                              read-only, without replaying the journal:
                                              what the crash left on disk

As root the mount is made with mount(2); other users mount through
fusermount3 (apt-get install fuse3) on a mount point they own.

A second mount of a filesystem that ext4kit already serves (the same
image file and the same partition or offset) becomes a bind mount of the
first mount point, as the kernel shares one superblock between mounts of
a device: both show the same files at once, served by the one server.
It takes its own ro and nosuid/nodev/noexec/noatime; -o rw is refused
when the server is read-only. Options that belong to the server (cache=,
threads, transport=, busy_poll=, commit=, allow_other, ...) stay as the
server has them; a note names the ones asked differently. Only root can
make the bind. `ext4kit umount` of one of them returns at once; the
server stops when the last one is unmounted. The mount table names the
source IMAGE, IMAGE@N (partition N) or IMAGE@offset=BYTES.

An image that is mounted otherwise (by the kernel, fuse2fs, or ext4kit
serving another partition of the same file) is refused; right after an
unmount of it the mount waits (a few seconds) for the old server to
finish writing the image back. Images that must not be written (read-only features, mmp, an
image file you cannot write) mount read-only with a warning saying why;
with -o rw they are refused instead. An image whose journal needs
recovery (a snapshot, a crashed machine's disk) is replayed first: on
disk for a read-write mount, in memory for -o ro (the image file is not
touched); -o noload mounts it read-only without replaying.

Requests travel through FUSE over io_uring when the kernel offers it
(Linux 6.14+, and the fuse module's enable_uring parameter is Y: as root,
echo Y > /sys/module/fuse/parameters/enable_uring; ext4kit never changes
it): per-CPU queues, the server thread of the caller's CPU answers, no
read()/write() per request. Otherwise, and with -o transport=dev, they
travel through read()/write() on /dev/fuse. -o transport=uring refuses
to mount without io_uring, naming the reason. `-v` (and --foreground)
print which one the mount uses; the server's status file
(/run/ext4kit/*.status for root) says it too. EXT4KIT_TRANSPORT=auto|uring|dev
in the environment sets the default of -o transport=.")]
pub struct MountArgs {
    /// Mount options, comma-separated (repeatable): rw (default when
    /// possible; refuse otherwise), ro, cache=writethrough (default),
    /// cache=direct, cache=writeback, allow_other, allow_root,
    /// default_permissions (always on), busy_poll=MICROSECONDS (on
    /// /dev/fuse: how long the server keeps a CPU spinning after a request
    /// so the next one needs no wake-up on another CPU: 2000 by default, 0
    /// never; it costs one CPU while requests keep coming, nothing when
    /// idle; not used over io_uring), readahead=KIB (the mount's
    /// readahead window: 1024 by default, one 1 MiB READ per round trip
    /// where the kernel's 128 KiB took eight; root only, 0 leaves the
    /// kernel's),
    /// partition=N (as --partition), offset=BYTES (as --offset; K, M, G
    /// suffixes), noload or norecovery (as --no-replay: read-only, the
    /// journal is not replayed), commit=SECONDS (the journal's commit
    /// interval, as the kernel's: everything older than it survives a
    /// crash; 5 by default), no_open (write-through only: files open and
    /// close without a round trip to the server; an immutable or
    /// append-only file's first write is refused instead of its open),
    /// transport=auto|uring|dev (how requests
    /// travel: FUSE over io_uring when the kernel offers it, else
    /// /dev/fuse (auto, the default); io_uring or fail (uring); /dev/fuse
    /// only (dev)), nosuid, nodev, noexec, noatime, relatime, ...
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Serve in this process instead of detaching (Ctrl-C unmounts).
    #[arg(short = 'f', long)]
    foreground: bool,
    /// Request-serving threads (default: number of CPUs; with io_uring at
    /// least one per CPU queue).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Print where and how the image is mounted (read-write or read-only,
    /// and whether requests travel through io_uring or /dev/fuse).
    #[arg(short = 'v', long)]
    verbose: bool,
    /// The image file (or block device); IMAGE@N for partition N.
    image: PathBuf,
    /// An existing, empty directory.
    mountpoint: PathBuf,
}

/// Unmount an ext4kit mount.
#[derive(Args, Debug)]
#[command(after_help = "EXAMPLES:
  ext4kit umount /mnt/disk     unmount; returns when the server has flushed and exited
                               (at once when another mount point of the same
                               server remains: a second mount of the image)

Works for the user who mounted it (through fusermount3) and for root.")]
pub struct UmountArgs {
    /// Seconds to wait for the server to finish after the unmount.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    timeout: u64,
    /// The mount point.
    mountpoint: PathBuf,
}

/// `ext4kit mount`.
pub fn run(a: &MountArgs, sel: &ImageArgs, budget: usize) -> Result<(), String> {
    // A server's resident size should be its budget, not its address
    // space rounded up to huge pages (see the function's measurements).
    ext4kit_alloc::tune_server();
    let mut opts = ext4kit_fuse::MountOptions {
        cache_budget: budget,
        ..Default::default()
    };
    for o in &a.options {
        ext4kit_fuse::parse_options(o, &mut opts)?;
    }
    // --partition/--offset/IMAGE@N and -o partition=/offset= name the same
    // thing: either may be used, both only if they agree.
    let image = sel.image(&a.image)?;
    if ext4kit::device::is_remote(&image.path) {
        if opts.read_write {
            return Err(format!(
                "{}: a remote image is read-only; mount it without -o rw, or download it to change it",
                image.display()
            ));
        }
        // Served read-only, without the warning a read-only file gets.
        opts.read_only = true;
    }
    let location = match (image.loc, opts.location) {
        (l, Location::Whole) | (Location::Whole, l) => l,
        (l, o) if l == o => l,
        (l, o) => {
            return Err(format!(
                "{}: {l} was chosen, but the mount options say {o}; give one",
                image.display()
            ))
        }
    };
    if sel.no_replay {
        if opts.read_write {
            return Err(format!(
                "{}: --no-replay mounts read-only (a later replay would undo writes); it cannot be combined with -o rw",
                image.display()
            ));
        }
        // --no-replay is -o noload.
        ext4kit_fuse::parse_options("noload", &mut opts)?;
    }
    let image = image.at(location);
    opts.location = image.resolve()?;
    opts.disk_format = image.format();
    opts.any_backing_path = image.any_backing_path();
    opts.volume = image.volume().map(str::to_string);
    if let Some(n) = a.threads {
        if n == 0 {
            return Err("--threads must be at least 1".into());
        }
        opts.threads = n;
    }
    if a.foreground {
        ext4kit_fuse::run_foreground(&image.path, &a.mountpoint, &opts, |line| {
            eprintln!("ext4kit: serving {}: {line}", image.display())
        })
    } else {
        let line = ext4kit_fuse::run_detached(&image.path, &a.mountpoint, &opts)?;
        if a.verbose {
            eprintln!("ext4kit: mounted {}: {line}", image.display());
        }
        Ok(())
    }
}

/// `ext4kit umount`.
pub fn umount(a: &UmountArgs) -> Result<(), String> {
    ext4kit_fuse::unmount(&a.mountpoint, Duration::from_secs(a.timeout))
}
