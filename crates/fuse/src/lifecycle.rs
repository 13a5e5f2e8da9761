//! Mounting, serving, stopping and unmounting.
//!
//! `mount` checks the image is not in use, takes its lock, opens it,
//! mounts (mount(2) as root, `fusermount3` otherwise — fuser chooses) and
//! completes the FUSE INIT handshake: when it returns, the mount works.
//! `Mounted::run` serves requests on N threads until the mount goes away
//! (external unmount) or a stop signal arrives (SIGINT/SIGTERM/SIGHUP:
//! unmount, lazily if busy), then flushes (`Fs::sync`) and releases the
//! lock. `run_detached` forks *before* any thread exists; the child mounts
//! and reports readiness (or the error) over a pipe, so the parent returns
//! only once the mount works or with the child's message.
//!
//! One server per filesystem: a mount of a filesystem that an ext4kit
//! server already serves (same image file, same partition or offset) is a
//! bind mount of that server's mount point ([`bind_existing`]), as the
//! kernel shares one superblock between the mounts of a device. `unmount`
//! of one of several mount points of a server returns at once; the server
//! stops (and `unmount` waits for it) when the last one goes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ext4kit::{Fs, Location, OpenOptions};
use fuser::{Config, MountOption, Session, SessionACL, Transport};

use crate::inuse::{
    lock_is_free, mount_points_of, mount_source, mounted_at, mounts, parse_source, served, ImageLock, Source, SUBTYPE,
};
use crate::server::{CacheMode, Ext4Fuse};
use crate::sys;

/// How requests travel between the kernel and the server (`-o
/// transport=`): see the crate documentation, "Transport".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportChoice {
    /// FUSE over io_uring when the kernel offers it, else `/dev/fuse`.
    #[default]
    Auto,
    /// FUSE over io_uring, or fail the mount saying why it cannot be used.
    Uring,
    /// `/dev/fuse` only.
    Dev,
}

impl TransportChoice {
    /// The environment variable that sets the default of `-o transport=`
    /// (how the test suites are run on either transport).
    pub const ENV: &'static str = "EXT4KIT_TRANSPORT";

    fn parse(v: &str) -> Option<Self> {
        match v {
            "auto" => Some(TransportChoice::Auto),
            "uring" | "io_uring" => Some(TransportChoice::Uring),
            "dev" | "dev_fuse" => Some(TransportChoice::Dev),
            _ => None,
        }
    }

    /// `$EXT4KIT_TRANSPORT` when it names one, else [`TransportChoice::Auto`].
    pub fn from_env() -> Self {
        std::env::var(Self::ENV)
            .ok()
            .and_then(|v| Self::parse(v.trim()))
            .unwrap_or_default()
    }
}

/// How to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// `-o ro`: read-only even when the image could be written.
    pub read_only: bool,
    /// `-o rw`: read-write, or fail with the reason it cannot be (without
    /// either, read-write when possible, else read-only with a warning:
    /// the engine's reason, `Fs::read_only_reason`).
    pub read_write: bool,
    /// How the kernel caches file data (`-o cache=...`).
    pub cache: CacheMode,
    /// Let every user use the mount (`allow_other`; non-root needs
    /// `user_allow_other` in /etc/fuse.conf).
    pub allow_other: bool,
    /// Let root use the mount too (`allow_root`).
    pub allow_root: bool,
    /// Kernel options passed through (nosuid, nodev, noexec, noatime, ...).
    pub kernel: Vec<MountOption>,
    /// Request threads.
    pub threads: usize,
    /// Engine cache budget in bytes.
    pub cache_budget: usize,
    /// How long one server thread spins after a request (`-o
    /// busy_poll=MICROSECONDS`, 0: never); see [`crate::busypoll`].
    pub busy_poll: Duration,
    /// Where the filesystem is in the image (`-o partition=N`, `-o
    /// offset=BYTES`; default the whole image).
    pub location: Location,
    /// `-o noload`: do not replay a journal that needs recovery; serve the
    /// home locations as they are (read-only, like the kernel's noload).
    pub no_replay: bool,
    /// `-o commit=SECONDS`: the journal's commit interval (the kernel's
    /// option; default 5).
    pub commit_interval: Option<Duration>,
    /// `-o no_open`: with write-through caching, let the kernel open and
    /// close files without asking (FUSE_NO_OPEN_SUPPORT): no round trip per
    /// open, but an open for writing of an immutable or append-only file
    /// then succeeds and its first write is refused instead (see
    /// [`crate::server`]).
    pub no_open: bool,
    /// `-o transport=auto|uring|dev` (default: `$EXT4KIT_TRANSPORT`, else
    /// auto).
    pub transport: TransportChoice,
    /// `-o readahead=KIB`: the mount's readahead window (root only; 0
    /// leaves the kernel's 128 KiB); see [`crate::readahead`].
    pub readahead_kib: u32,
    /// The image file's container format (`--format`); by content when
    /// `None`.
    pub disk_format: Option<ext4kit::device::DiskFormat>,
    /// Follow files the image names (backing files) anywhere
    /// (`--any-backing-path`).
    pub any_backing_path: bool,
    /// The LVM2 logical volume holding the filesystem (`IMAGE@VG/LV`).
    pub volume: Option<String>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            read_write: false,
            cache: CacheMode::default(),
            allow_other: false,
            allow_root: false,
            kernel: Vec::new(),
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            cache_budget: 256 << 20,
            busy_poll: crate::busypoll::DEFAULT_WINDOW,
            location: Location::Whole,
            no_replay: false,
            commit_interval: None,
            no_open: false,
            transport: TransportChoice::from_env(),
            readahead_kib: crate::readahead::DEFAULT_KIB,
            disk_format: None,
            any_backing_path: false,
            volume: None,
        }
    }
}

impl MountOptions {
    /// Whether the kernel option `o` (`sync` or `dirsync`) is in effect:
    /// the last of it and `async` given wins.
    pub fn kernel_flag(&self, o: MountOption) -> bool {
        self.kernel
            .iter()
            .rev()
            .find_map(|k| match (k, &o) {
                (MountOption::Sync, MountOption::Sync) | (MountOption::DirSync, MountOption::DirSync) => Some(true),
                (MountOption::Async, _) => Some(false),
                _ => None,
            })
            .unwrap_or(false)
    }

    /// The settings that belong to the server rather than to one mount
    /// point, as `key=value`: a bind mount of a running server cannot have
    /// its own, so they are recorded in the server's status file and a
    /// bind that asks for others is told ([`bind_existing`]).
    pub fn server_settings(&self) -> Vec<String> {
        let yes = |b: bool| if b { "yes" } else { "no" };
        let cache = match self.cache {
            CacheMode::WriteThrough => "writethrough",
            CacheMode::Writeback => "writeback",
            CacheMode::Direct => "direct",
        };
        let access = if self.allow_other {
            "allow_other"
        } else if self.allow_root {
            "allow_root"
        } else {
            "owner"
        };
        let transport = match self.transport {
            TransportChoice::Auto => "auto",
            TransportChoice::Uring => "uring",
            TransportChoice::Dev => "dev",
        };
        vec![
            format!("cache={cache}"),
            format!("no_open={}", yes(self.no_open)),
            format!("access={access}"),
            format!("busy_poll={}", self.busy_poll.as_micros()),
            format!("transport={transport}"),
            format!(
                "commit={}",
                self.commit_interval
                    .map_or("default".to_string(), |d| d.as_secs().to_string())
            ),
            format!("threads={}", self.threads),
            format!("cache_budget={}", self.cache_budget),
            format!("noload={}", yes(self.no_replay)),
            format!("sync={}", yes(self.kernel_flag(MountOption::Sync))),
            format!("dirsync={}", yes(self.kernel_flag(MountOption::DirSync))),
        ]
    }
}

/// Apply a comma-separated `-o` list to `opts`.
pub fn parse_options(list: &str, opts: &mut MountOptions) -> Result<(), String> {
    for o in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        match o {
            "ro" => {
                opts.read_only = true;
                opts.read_write = false;
            }
            "rw" => {
                opts.read_only = false;
                opts.read_write = true;
            }
            "cache=writethrough" => opts.cache = CacheMode::WriteThrough,
            "cache=writeback" => opts.cache = CacheMode::Writeback,
            "cache=direct" => opts.cache = CacheMode::Direct,
            "allow_other" => opts.allow_other = true,
            "allow_root" => opts.allow_root = true,
            "no_open" => opts.no_open = true,
            // The kernel's default atime rule for every mount (MS_RELATIME
            // unless strictatime): accepted, as mount(8) and xfstests pass it.
            "relatime" => {}
            // The kernel keeps no atime for FUSE inodes (S_NOATIME), so a
            // directory's atime is never updated either way, and no atime
            // rule (strictatime) or deferral (lazytime) changes anything:
            // accepted, as xfstests' cycle mounts pass them.
            "nodiratime" | "diratime" | "strictatime" | "lazytime" | "nolazytime" => {}
            // Always on (see the crate docs): accepted for familiarity.
            "default_permissions" => {}
            "nosuid" => opts.kernel.push(MountOption::NoSuid),
            "suid" => opts.kernel.push(MountOption::Suid),
            "nodev" => opts.kernel.push(MountOption::NoDev),
            "dev" => opts.kernel.push(MountOption::Dev),
            "noexec" => opts.kernel.push(MountOption::NoExec),
            "exec" => opts.kernel.push(MountOption::Exec),
            "noatime" => opts.kernel.push(MountOption::NoAtime),
            "atime" => opts.kernel.push(MountOption::Atime),
            "sync" => opts.kernel.push(MountOption::Sync),
            "async" => opts.kernel.push(MountOption::Async),
            "dirsync" => opts.kernel.push(MountOption::DirSync),
            // The kernel's ext4 spells it both ways.
            "noload" | "norecovery" => {
                opts.no_replay = true;
                opts.read_only = true;
            }
            _ if o.starts_with("offset=") => {
                let v = &o["offset=".len()..];
                let off = parse_bytes(v).ok_or_else(|| {
                    format!("`{o}`: offset takes a byte count (4096, or with a K, M, G or T suffix: 1M)")
                })?;
                opts.location = Location::Offset(off);
            }
            _ if o.starts_with("partition=") => {
                let n = o["partition=".len()..]
                    .parse::<u32>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("`{o}`: partition takes a partition number (1, 2, ...)"))?;
                opts.location = Location::Partition(n);
            }
            _ if o.starts_with("commit=") => {
                let secs: u64 = o["commit=".len()..]
                    .parse()
                    .map_err(|_| format!("`{o}`: commit takes seconds (0: the default, 5)"))?;
                opts.commit_interval = Some(Duration::from_secs(secs));
            }
            _ if o.starts_with("transport=") => {
                opts.transport = TransportChoice::parse(&o["transport=".len()..])
                    .ok_or_else(|| format!("`{o}`: transport takes auto, uring or dev"))?;
            }
            _ if o.starts_with("readahead=") => {
                opts.readahead_kib = o["readahead=".len()..]
                    .parse()
                    .map_err(|_| format!("`{o}`: readahead takes KiB (0 leaves the kernel's window)"))?;
            }
            _ if o.starts_with("busy_poll=") => {
                let us: u64 = o["busy_poll=".len()..]
                    .parse()
                    .map_err(|_| format!("`{o}`: busy_poll takes microseconds (0 turns spinning off)"))?;
                opts.busy_poll = Duration::from_micros(us);
            }
            other => {
                return Err(format!(
                    "unknown mount option `{other}` (known: ro, rw, cache=writethrough|writeback|direct, no_open, allow_other, allow_root, default_permissions, busy_poll=US, readahead=KIB, \
                     transport=auto|uring|dev, commit=SECONDS, partition=N, offset=BYTES, noload, [no]suid, [no]dev, [no]exec, [no]atime, relatime, strictatime, [no]lazytime, [no]diratime, sync, async, dirsync)"
                ))
            }
        }
    }
    if opts.no_replay && opts.read_write {
        return Err(
            "`noload` (no journal replay) mounts read-only: writing over a journal that was not replayed would let \
             a later replay undo the writes; it cannot be combined with `rw`"
                .into(),
        );
    }
    Ok(())
}

/// A byte count with an optional binary suffix (K, M, G, T).
fn parse_bytes(s: &str) -> Option<u64> {
    let (num, shift) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 10),
        b'm' | b'M' => (&s[..s.len() - 1], 20),
        b'g' | b'G' => (&s[..s.len() - 1], 30),
        b't' | b'T' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// A working mount, not yet serving requests beyond INIT.
pub struct Mounted {
    session: Session<Ext4Fuse>,
    fs: Arc<Fs>,
    mount_point: PathBuf,
    lock: ImageLock,
    /// Mounted by fusermount3 (unmount through it too).
    via_fusermount: bool,
    nodes: Arc<crate::nodes::Nodes>,
    /// Read-write: the superblock state to restore at a clean unmount.
    state: Option<ext4kit::MountRecord>,
    read_only: bool,
    /// Where the final status goes for `ext4kit umount` ([`status_path`]).
    status: Option<PathBuf>,
    /// Refused write-backs of the kernel's cache (`cache=writeback`).
    lost: Arc<crate::server::LostWriteback>,
    /// How requests travel (settled by FUSE_INIT).
    transport: Transport,
    /// Why io_uring is not used when it was wanted.
    transport_note: Option<String>,
    /// The FUSE connection's device number (`None` if the mount table did
    /// not show the mount): the signal handler unmounts every mount point
    /// that has it (bind mounts made by later `mount`s included).
    dev: Option<u64>,
    /// [`MountOptions::server_settings`], for the status file.
    settings: String,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted")
            .field("mount_point", &self.mount_point)
            .finish()
    }
}

/// How long a mount waits for an earlier ext4kit mount of the same image
/// that is going away: umount(2) of a FUSE mount returns before its server
/// has written everything back and let go of the image, and a script that
/// unmounts and mounts again (xfstests generic/604: the unmount in the
/// background, the mount 10 ms later) must not be refused. The kernel's
/// ext4 waits for the old superblock the same way.
const HANDOVER_WAIT: Duration = Duration::from_secs(10);

/// How long a mount that is still listed may take to leave the mount table
/// before a new mount of its image is refused (umount(8) under way).
const UNMOUNT_WAIT: Duration = Duration::from_secs(2);

/// The image lock, once nobody else uses the image: refused at once when
/// the kernel (or a loop device) has it mounted; an ext4kit mount still
/// listed is given [`UNMOUNT_WAIT`] to go, and a server still writing back
/// after its unmount (or a program holding the lock) [`HANDOVER_WAIT`].
/// (A live ext4kit mount of the same filesystem never gets here: the
/// callers bind to it first, [`bind_existing`]. One listed here is going
/// away, serves another partition of the file, or is a subdirectory's
/// bind.)
fn take_over(src: &Source) -> Result<ImageLock, String> {
    let image = src.image();
    if ext4kit::device::is_remote(image) {
        // A remote image is only ever read: nothing to serialize with.
        return Ok(ImageLock::none());
    }
    let start = Instant::now();
    let mut said = false;
    loop {
        if let Some(m) = mounted_at(image) {
            if m.fstype != format!("fuse.{SUBTYPE}") || start.elapsed() >= UNMOUNT_WAIT {
                // Another filesystem of the same file (another partition):
                // the lock is on the whole file, one server per file.
                let other = parse_source(&m.source)
                    .filter(|other| {
                        m.fstype == format!("fuse.{SUBTYPE}")
                            && (other.location() != src.location() || other.volume() != src.volume())
                    })
                    .map_or(String::new(), |other| {
                        format!(
                            "; that is {} of it, this mount asks for {}: one ext4kit server per image file at a \
                             time",
                            other.place(),
                            src.place()
                        )
                    });
                return Err(format!(
                    "{} is already mounted at {} ({} from {}){other}; unmount it first",
                    image.display(),
                    m.mount_point.display(),
                    m.fstype,
                    m.source
                ));
            }
        } else if let Some(lock) = ImageLock::try_acquire(image)? {
            return Ok(lock);
        } else if start.elapsed() >= HANDOVER_WAIT {
            return ImageLock::acquire(image);
        } else if !said && start.elapsed() >= Duration::from_secs(1) {
            eprintln!(
                "ext4kit: {}: waiting (up to {} s) for the program holding it, an earlier server still writing \
                 it back or another ext4kit command, to let go",
                image.display(),
                HANDOVER_WAIT.as_secs()
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The image as the mount names it: a local file by its absolute path
/// (a detached server changes directory to "/"), a URL as given.
fn image_name(image: &Path) -> Result<PathBuf, String> {
    if ext4kit::device::is_remote(image) {
        return Ok(image.to_path_buf());
    }
    std::fs::canonicalize(image).map_err(|e| format!("{}: {e}", image.display()))
}

/// Mount `image` at `mount_point`. Blocks SIGINT/SIGTERM/SIGHUP in the
/// calling thread first (the server threads inherit the mask and
/// [`Mounted::run`] waits for them on a thread of its own).
pub fn mount(image: &Path, mount_point: &Path, opts: &MountOptions) -> Result<Mounted, String> {
    let image = image_name(image)?;
    let mount_point = std::fs::canonicalize(mount_point).map_err(|e| format!("{}: {e}", mount_point.display()))?;
    if !mount_point.is_dir() {
        return Err(format!("{}: not a directory", mount_point.display()));
    }
    if !Path::new("/dev/fuse").exists() {
        return Err(
            "/dev/fuse does not exist: load the fuse module (modprobe fuse) or give the container the device".into(),
        );
    }
    let source = Source::new(&image, opts.location, opts.volume.as_deref());
    let lock = take_over(&source)?;
    // A status left by an earlier server of this image is not ours.
    if let Some(p) = status_path(&image) {
        let _ = std::fs::remove_file(p);
    }
    sys::block_stop_signals().map_err(|e| format!("blocking signals: {e}"))?;
    let (fs, read_only) = open_for_mount(&image, opts)?;
    // The engine's reason for opening read-only is this mount's reason for
    // mounting so.
    let ro_note = fs.read_only_reason().map(|why| format!("opened read-only: {why}"));
    for w in fs.warnings() {
        match (&ro_note, fs.read_only_reason()) {
            (Some(n), Some(why)) if n == w => {
                eprintln!("ext4kit: warning: {}: mounting read-only: {why}", image.display())
            }
            _ => eprintln!("ext4kit: warning: {}: {w}", image.display()),
        }
    }
    // The image path (with the partition or offset) as the source: what
    // `ext4kit umount`, the in-use check and a second mount (bound to this
    // one) read back from the mount table. Sources that cannot say it
    // unambiguously show "ext4kit" (see `mount_source`).
    let fsname = mount_source(&source).unwrap_or_else(|| SUBTYPE.to_string());
    let acl = if opts.allow_other {
        SessionACL::All
    } else if opts.allow_root {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    let mut config = Config::default();
    config.acl = acl;
    config.n_threads = Some(opts.threads.max(1));
    // Cloned descriptors need /dev/fuse to be openable by us (it is 0600
    // root on many systems: unprivileged servers share one descriptor).
    config.clone_fd = opts.threads > 1 && sys::can_read_write(Path::new("/dev/fuse"));
    config.io_uring = opts.transport != TransportChoice::Dev;
    let mut server = Ext4Fuse::new(fs.clone(), read_only, opts.cache);
    server.set_busy_poll(opts.busy_poll);
    server.set_no_open(opts.no_open);
    let busy = server.busy_poll();
    let nodes = server.nodes();
    let inval = server.invalidator();
    let lost = server.lost_writeback();
    let fail = |e: &dyn std::fmt::Display| format!("mounting {} at {}: {e}", image.display(), mount_point.display());
    let (session, via_fusermount) = if sys::is_root() {
        let mut mount_options = vec![
            MountOption::FSName(fsname),
            // fuser's mount(2) path does not pass `Subtype` to the kernel;
            // the fuse driver accepts `subtype=` itself (type fuse.ext4kit).
            MountOption::CUSTOM(format!("subtype={SUBTYPE}")),
            if read_only { MountOption::RO } else { MountOption::RW },
            MountOption::DefaultPermissions,
        ];
        mount_options.extend(opts.kernel.iter().cloned());
        config.mount_options = mount_options;
        (
            Session::new(server, &mount_point, &config).map_err(|e| fail(&e))?,
            false,
        )
    } else {
        let mut o = vec![
            format!("fsname={fsname}"),
            format!("subtype={SUBTYPE}"),
            if read_only { "ro" } else { "rw" }.to_string(),
            "default_permissions".to_string(),
            "nosuid".to_string(),
            "nodev".to_string(),
        ];
        if opts.allow_other || opts.allow_root {
            o.push("allow_other".into());
        }
        o.extend(opts.kernel.iter().map(kernel_option_name).filter(|s| !s.is_empty()));
        let fd = crate::fusermount::mount(&mount_point, &o.join(",")).map_err(|e| fail(&e))?;
        let config2 = config.clone();
        match Session::from_fd(server, fd, acl, config2) {
            Ok(s) => (s, true),
            Err(e) => {
                let _ = fusermount(&["-u"], &mount_point);
                return Err(fail(&e));
            }
        }
    };
    let transport = session.transport();
    let transport_note = session.transport_note().map(str::to_string);
    if opts.transport == TransportChoice::Uring && !matches!(transport, Transport::IoUring { .. }) {
        drop(session);
        if via_fusermount {
            let _ = fusermount(&["-u"], &mount_point);
        } else {
            let _ = lazy_unmount(&mount_point);
        }
        return Err(format!(
            "{}: -o transport=uring: {}",
            mount_point.display(),
            transport_note
                .as_deref()
                .unwrap_or("FUSE over io_uring is not available")
        ));
    }
    // fuser's last thread reads the session's own descriptor: it is the
    // one that spins while the mount is busy. Not with io_uring: requests
    // then come on the ring of the caller's own CPU, whose thread is woken
    // there (no wake-up of another CPU to avoid), and the descriptor
    // carries only FORGET and INTERRUPT.
    if matches!(transport, Transport::DevFuse { .. }) {
        busy.attach(std::os::fd::AsFd::as_fd(&session));
    }
    // Readahead as large as one READ may be (root only: an unprivileged
    // mount keeps the kernel's 128 KiB window and works the same).
    if sys::is_root() {
        if let Err(e) = crate::readahead::widen(&mount_point, opts.readahead_kib) {
            eprintln!(
                "ext4kit: warning: {}: readahead window not widened: {e}",
                mount_point.display()
            );
        }
    }
    // Attribute invalidations for changes no reply carries (crate::killpriv).
    inval.attach(session.notifier());
    // The mount works: record it in the superblock (read-write only).
    let state = if read_only {
        None
    } else {
        match fs.record_mount(mount_point.as_os_str().as_encoded_bytes()) {
            Ok((st, warnings)) => {
                for w in warnings {
                    eprintln!("ext4kit: warning: {}: {w}", image.display());
                }
                Some(st)
            }
            Err(e) => {
                drop(session);
                let _ = lazy_unmount(&mount_point);
                return Err(format!(
                    "{}: recording the mount in the superblock: {e}",
                    image.display()
                ));
            }
        }
    };
    let dev = mounts().ok().and_then(|t| {
        t.into_iter()
            .rev()
            .find(|m| m.mount_point == mount_point)
            .map(|m| m.dev)
    });
    let status = status_path(&image);
    let settings = opts.server_settings().join(",");
    // Written before the mount is reported ready: a second mount of the
    // image (a bind of this one) compares its options with these.
    if let Some(p) = &status {
        if let Err(e) = write_status(p, None, &transport.to_string(), &settings) {
            eprintln!("ext4kit: recording the mount status in {}: {e}", p.display());
        }
    }
    Ok(Mounted {
        session,
        fs,
        mount_point,
        lock,
        via_fusermount,
        nodes,
        state,
        read_only,
        status,
        lost,
        transport,
        transport_note,
        dev,
        settings,
    })
}

/// Where the server of `image` leaves its final status for `ext4kit
/// umount`: the detached server is nobody's child, so its exit status
/// cannot be waited for; the file, named by the image's device and inode
/// numbers, says whether everything was written back. Root's go to
/// `/run/ext4kit`, other users' to `$XDG_RUNTIME_DIR/ext4kit` (or a
/// per-user directory under the temporary directory).
pub fn status_path(image: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(image).ok()?;
    let dir = if sys::is_root() {
        PathBuf::from("/run/ext4kit")
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(x).join("ext4kit")
    } else {
        std::env::temp_dir().join(format!("ext4kit-{}", rustix::process::geteuid().as_raw()))
    };
    Some(dir.join(format!("{:x}-{:x}.status", md.dev(), md.ino())))
}

/// "running" while the server serves, then "ok", or "error" and the
/// message on the next line; then a line saying how requests travelled
/// ("transport: ...") and one with the server's settings ("options: ...",
/// [`MountOptions::server_settings`]).
fn write_status(
    path: &Path,
    result: Option<&Result<(), String>>,
    transport: &str,
    settings: &str,
) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tail = format!("transport: {transport}\noptions: {settings}\n");
    let text = match result {
        None => format!("running\n{tail}"),
        Some(Ok(())) => format!("ok\n{tail}"),
        Some(Err(m)) => format!("error\n{m}\n{tail}"),
    };
    std::fs::write(path, text)
}

/// The settings a running server of `image` recorded in its status file.
fn server_settings_of(image: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(status_path(image)?).ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("options: "))?;
    Some(line.split(',').map(str::to_string).collect())
}

/// The status a server left for `image` (and remove it): `Err` with the
/// server's message when it failed, `Ok` when it succeeded or left none
/// (a server killed outright, or one older than this protocol).
fn take_status(image: &Path) -> Result<(), String> {
    let Some(p) = status_path(image) else { return Ok(()) };
    let Ok(text) = std::fs::read_to_string(&p) else {
        return Ok(());
    };
    let _ = std::fs::remove_file(&p);
    match text.split_once('\n') {
        Some(("error", rest)) => {
            let msg = rest
                .lines()
                .filter(|l| !l.starts_with("transport: ") && !l.starts_with("options: "))
                .collect::<Vec<_>>();
            Err(msg.join("\n").trim().to_string())
        }
        _ => Ok(()),
    }
}

/// Open the image read-write when allowed and possible, else read-only.
/// Whether it may be written is the engine's decision (a feature it
/// cannot write, `mmp`, a read-only device: `Fs::read_only_reason`), made
/// before it writes anything; the mount's policy is what to do then: a
/// mount without `-o rw` serves it read-only with a warning naming the
/// reason, `-o rw` is refused with it. An image file that cannot be
/// opened for writing is a reason too. Returns the filesystem and whether
/// it is read-only.
fn open_for_mount(image: &Path, opts: &MountOptions) -> Result<(Arc<Fs>, bool), String> {
    let open = |read_only| {
        Fs::open_image(
            image,
            &OpenOptions {
                read_only,
                cache_budget: opts.cache_budget,
                no_replay: opts.no_replay,
                location: opts.location,
                commit_interval: opts.commit_interval,
                // `-o sync` / `-o dirsync`: the engine makes changes durable
                // before it answers, as ext4 does (the kernel's FUSE does not
                // for directory changes; it follows synchronous writes with
                // an FSYNC, which then finds nothing left to do).
                sync: opts.kernel_flag(MountOption::Sync),
                dirsync: opts.kernel_flag(MountOption::DirSync),
                disk_format: opts.disk_format,
                any_backing_path: opts.any_backing_path,
                volume: opts.volume.clone(),
                ..OpenOptions::default()
            },
        )
        .map_err(|e| format!("{}: {e}", image.display()))
    };
    if opts.no_replay && opts.read_write {
        return Err(format!(
            "{}: cannot mount read-write without replaying the journal (noload): a later replay would undo the writes",
            image.display()
        ));
    }
    if opts.read_only || opts.no_replay {
        return Ok((open(true)?, true));
    }
    let refuse_or_warn = |why: String| -> Result<(Arc<Fs>, bool), String> {
        if opts.read_write {
            Err(format!(
                "{}: cannot mount read-write: {why}; mount read-only with -o ro",
                image.display()
            ))
        } else {
            eprintln!("ext4kit: warning: {}: mounting read-only: {why}", image.display());
            Ok((open(true)?, true))
        }
    };
    match open(false) {
        Ok(fs) if fs.read_only() => {
            // The engine opened it read-only on its own; it says why.
            let why = match fs.read_only_reason() {
                Some(w) => w.to_string(),
                None => fs.warnings().join("; "),
            };
            if opts.read_write {
                drop(fs);
                return refuse_or_warn(why);
            }
            // The engine's warning says why (see `mount`).
            Ok((fs, true))
        }
        Ok(fs) => Ok((fs, false)),
        // The image file cannot be opened for writing (permissions, a
        // read-only filesystem under it).
        Err(e) if std::fs::OpenOptions::new().write(true).open(image).is_err() => {
            refuse_or_warn(format!("the image cannot be opened for writing ({e})"))
        }
        Err(e) => Err(e),
    }
}

impl Mounted {
    /// Where it is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// The kernel's lookup counts (inodes it holds), live.
    pub fn kernel_refs(&self) -> Arc<crate::nodes::Nodes> {
        self.nodes.clone()
    }

    /// The engine behind the mount.
    pub fn fs(&self) -> &Arc<Fs> {
        &self.fs
    }

    /// Whether the mount is read-only.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// How requests travel between the kernel and this server.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Why FUSE over io_uring is not used although it was wanted (`-o
    /// transport=auto` on a kernel that does not offer it, or whose rings
    /// could not be set up).
    pub fn transport_note(&self) -> Option<&str> {
        self.transport_note.as_deref()
    }

    /// One line for people: where, how, and why not io_uring if so.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} {}; requests through {}",
            self.mount_point.display(),
            if self.read_only { "read-only" } else { "read-write" },
            self.transport
        );
        if let Some(n) = &self.transport_note {
            s.push_str(&format!("; io_uring not used: {n}"));
        }
        s
    }

    /// Serve until unmounted or signalled; flush; write the superblock
    /// clean (read-write); release the image.
    pub fn run(mut self) -> Result<(), String> {
        // Every thread's panic goes to stderr with a backtrace and the first
        // is named in the result (see `crate::panics` for what a panic does
        // to a serving process).
        crate::panics::install();
        let transport = self.transport.to_string();
        let mut unmounter = self.session.unmount_callable();
        let mp = self.mount_point.clone();
        let via_fusermount = self.via_fusermount;
        let dev = self.dev;
        std::thread::Builder::new()
            .name("ext4kit-signals".into())
            .spawn(move || {
                if sys::wait_stop_signal().is_ok() {
                    // A stop signal stops the server: every mount point of
                    // its connection goes (bind mounts that later mounts
                    // of the image made too, newest first), else the
                    // session would go on serving them. A busy mount (open
                    // files, a shell inside) cannot be unmounted at once:
                    // detach it; the kernel ends the session when the last
                    // user leaves.
                    let mut others = dev.map(mount_points_of).unwrap_or_default();
                    others.retain(|p| *p != mp);
                    for p in others.iter().rev() {
                        let done = if via_fusermount {
                            fusermount(&["-u"], p).is_ok()
                        } else {
                            sys::umount(p, false).is_ok()
                        };
                        if !done {
                            let _ = lazy_unmount(p);
                        }
                    }
                    let done = if via_fusermount {
                        fusermount(&["-u"], &mp).is_ok()
                    } else {
                        unmounter.unmount().is_ok()
                    };
                    if !done {
                        let _ = lazy_unmount(&mp);
                    }
                }
            })
            .map_err(|e| format!("starting the signal thread: {e}"))?;
        // Returns after DESTROY, with every handle closed (unlinked open
        // files freed) and the server dropped.
        let served = self.session.run();
        // DESTROY released them already; a session that ended without one
        // (the device went away) must not leave held unlinked inodes on the
        // orphan list.
        self.nodes.release_all(&self.fs);
        let synced = match self.state {
            Some(st) => self.fs.record_unmount(st),
            None => self.fs.sync(),
        };
        // A panic in a request thread ends the session with "event loop
        // thread panicked": the first panic says where. One in a thread the
        // session does not join (the engine's background worker) leaves
        // `served` Ok; it is a failure of the server all the same, and the
        // exit status says so.
        let served = match (served, crate::panics::first()) {
            (Ok(()), None) => Ok(()),
            (Ok(()), Some(p)) => Err(format!("a server thread failed ({p})")),
            (Err(e), None) => Err(e.to_string()),
            (Err(e), Some(p)) => Err(format!("{e} ({p})")),
        };
        let result = served
            .map_err(|e| format!("serving {}: {e}", self.mount_point.display()))
            .and(synced.map_err(|e| {
                format!(
                    "writing back at unmount failed, data written to the mount may be lost (everything else was \
                     committed): {e}"
                )
            }))
            .and(self.lost.summary().map_or(Ok(()), Err));
        // Written before the lock goes: `unmount` reads it once the lock
        // is free (the detached server's exit status reaches nobody).
        if let Some(p) = &self.status {
            if let Err(e) = write_status(p, Some(&result), &transport, &self.settings) {
                eprintln!("ext4kit: recording the unmount status in {}: {e}", p.display());
            }
        }
        drop(self.lock);
        result
    }
}

/// The fusermount3 spelling of a kernel option.
fn kernel_option_name(o: &MountOption) -> String {
    match o {
        MountOption::NoSuid => "nosuid",
        MountOption::Suid => "suid",
        MountOption::NoDev => "nodev",
        MountOption::Dev => "dev",
        MountOption::NoExec => "noexec",
        MountOption::Exec => "exec",
        MountOption::NoAtime => "noatime",
        MountOption::Atime => "atime",
        MountOption::Sync => "sync",
        MountOption::Async => "async",
        MountOption::DirSync => "dirsync",
        MountOption::RO => "ro",
        MountOption::RW => "rw",
        _ => "",
    }
    .to_string()
}

fn lazy_unmount(mp: &Path) -> Result<(), String> {
    if sys::is_root() {
        sys::umount(mp, true).map_err(|e| format!("{}: {e}", mp.display()))
    } else {
        fusermount(&["-u", "-z"], mp)
    }
}

fn fusermount(args: &[&str], mp: &Path) -> Result<(), String> {
    let out = std::process::Command::new("fusermount3")
        .args(args)
        .arg(mp)
        .output()
        .map_err(|e| format!("running fusermount3: {e} (apt-get install fuse3)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// A second mount of a filesystem that an ext4kit server already serves:
/// a bind mount of that server's mount point, with this mount's own
/// read-only flag and per-mount-point options (nosuid, nodev, noexec,
/// noatime). `Ok(None)` when no server serves it (mount as usual);
/// `Ok(Some(line))` describing the new mount point once it works.
///
/// Why a bind and not a second server: two servers of one image would each
/// cache what the other changes (see [`crate::inuse`]); the kernel shares
/// one superblock between the mounts of a device, and a bind mount is
/// exactly that for a FUSE connection. Refused: a read-write mount (`-o
/// rw`) of a filesystem served read-only (its superblock is read-only;
/// without `rw` the bind is made read-only with a warning) and users other than root
/// (bind mounts need CAP_SYS_ADMIN). Options that belong to the server
/// (caching, threads, transport, ...: [`MountOptions::server_settings`])
/// stay as the server has them; a note names the ones asked differently.
/// A mount where the server's own mount point already is is left to the
/// usual path (it waits for an unmount in progress, else refuses).
pub fn bind_existing(image: &Path, mount_point: &Path, opts: &MountOptions) -> Result<Option<String>, String> {
    let image = image_name(image)?;
    let mp = std::fs::canonicalize(mount_point).map_err(|e| format!("{}: {e}", mount_point.display()))?;
    let source = Source::new(&image, opts.location, opts.volume.as_deref());
    let Some(server) = served(&source) else {
        return Ok(None);
    };
    let shown = match mount_source(&source) {
        Some(s) => s,
        None => format!("{} ({})", image.display(), source.place()),
    };
    let table = mounts().map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    if table.iter().any(|m| m.mount_point == mp && m.dev == server.dev) {
        // Mounted here already: not a bind. Either it is being unmounted
        // (xfstests generic/604 mounts while the unmount runs: the usual
        // path waits for it to go, `take_over`) or it stays, and the usual
        // path refuses, as mount(8) does.
        return Ok(None);
    }
    if !mp.is_dir() {
        return Err(format!("{}: not a directory", mp.display()));
    }
    if !sys::is_root() {
        return Err(format!(
            "{shown} is already mounted at {} by ext4kit; a second mount point of it is a bind mount of that \
                 one, which only root can make (as root: ext4kit mount, or mount --bind {} {}); or use {}",
            server.mount_point.display(),
            server.mount_point.display(),
            mp.display(),
            server.mount_point.display()
        ));
    }
    let read_only = if server.super_ro {
        if opts.read_write {
            return Err(format!(
                "{shown}: cannot mount read-write: it is already mounted read-only at {} and a second mount \
                 shares that server; mount with -o ro, or unmount {} first",
                server.mount_point.display(),
                server.mount_point.display()
            ));
        }
        if !opts.read_only {
            eprintln!(
                "ext4kit: warning: {shown}: mounting read-only: it is already mounted read-only at {}",
                server.mount_point.display()
            );
        }
        true
    } else {
        opts.read_only
    };
    // Per-mount-point flags: nosuid and nodev unless suid / dev are given,
    // as for a server's own mount (fuser's defaults); the rest as asked,
    // in order (the last of nosuid / suid wins, as in mount(8)).
    let mut flags: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV | if read_only { libc::MS_RDONLY } else { 0 };
    for k in &opts.kernel {
        match k {
            MountOption::NoSuid => flags |= libc::MS_NOSUID,
            MountOption::Suid => flags &= !libc::MS_NOSUID,
            MountOption::NoDev => flags |= libc::MS_NODEV,
            MountOption::Dev => flags &= !libc::MS_NODEV,
            MountOption::NoExec => flags |= libc::MS_NOEXEC,
            MountOption::Exec => flags &= !libc::MS_NOEXEC,
            MountOption::NoAtime => flags = (flags & !libc::MS_RELATIME) | libc::MS_NOATIME,
            MountOption::Atime => flags = (flags & !libc::MS_NOATIME) | libc::MS_RELATIME,
            _ => {}
        }
    }
    if let Some(theirs) = server_settings_of(&image) {
        let differ: Vec<String> = opts
            .server_settings()
            .into_iter()
            .filter(|o| !theirs.contains(o))
            .map(|o| {
                let key = o.split('=').next().unwrap_or_default();
                match theirs.iter().find(|t| t.split('=').next() == Some(key)) {
                    Some(t) => format!("{o} (it has {t})"),
                    None => o,
                }
            })
            .collect();
        if !differ.is_empty() {
            eprintln!(
                "ext4kit: note: {shown} is already served at {}; {} becomes a bind mount of it, and these \
                 options stay as that server has them: {}",
                server.mount_point.display(),
                mp.display(),
                differ.join(", ")
            );
        }
    }
    sys::mount_bind(&server.mount_point, &mp)
        .map_err(|e| format!("binding {} to {}: {e}", server.mount_point.display(), mp.display()))?;
    // The server's mount point may have been unmounted between reading the
    // table and the bind (an unmount under way, xfstests generic/604): then
    // the bind is of the directory underneath, not of the filesystem. Undo
    // it and mount as usual (waiting for that server to let go).
    let bound = mounts()
        .ok()
        .and_then(|t| t.into_iter().rev().find(|m| m.mount_point == mp))
        .is_some_and(|m| m.dev == server.dev);
    if !bound {
        sys::umount(&mp, true).map_err(|e| {
            format!(
                "{}: undoing a bind of {} whose filesystem went away: {e}",
                mp.display(),
                server.mount_point.display()
            )
        })?;
        return Ok(None);
    }
    if let Err(e) = sys::remount_bind(&mp, flags) {
        let _ = sys::umount(&mp, true);
        return Err(format!(
            "{}: setting the options of the bind mount of {}: {e}",
            mp.display(),
            server.mount_point.display()
        ));
    }
    Ok(Some(format!(
        "{} {}; a bind mount of {} (served by its server)",
        mp.display(),
        if read_only { "read-only" } else { "read-write" },
        server.mount_point.display()
    )))
}

/// Mount in a detached child process: returns (in the parent) once the
/// mount works, with [`Mounted::describe`]'s line, or with the child's
/// error. Must be called while the process has a single thread: it forks
/// first.
pub fn run_detached(image: &Path, mount_point: &Path, opts: &MountOptions) -> Result<String, String> {
    // Absolute paths: the child changes directory to "/".
    let image = image_name(image)?;
    let mount_point = std::fs::canonicalize(mount_point).map_err(|e| format!("{}: {e}", mount_point.display()))?;
    // Served already: a bind mount, no new server (and no fork).
    if let Some(line) = bind_existing(&image, &mount_point, opts)? {
        return Ok(line);
    }
    let (r, w) = sys::pipe().map_err(|e| format!("pipe: {e}"))?;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    match sys::fork().map_err(|e| format!("fork: {e}"))? {
        sys::Forked::Child => {
            drop(r);
            let mut w = std::fs::File::from(w);
            let _ = sys::setsid();
            let code = match mount(&image, &mount_point, opts) {
                Err(msg) => {
                    let _ = w.write_all(msg.as_bytes());
                    1
                }
                Ok(m) => {
                    let mut ready = vec![0];
                    ready.extend_from_slice(m.describe().as_bytes());
                    let _ = w.write_all(&ready);
                    drop(w);
                    let _ = std::env::set_current_dir("/");
                    let _ = sys::stdio_to_devnull();
                    match m.run() {
                        Ok(()) => 0,
                        Err(_) => 1,
                    }
                }
            };
            std::process::exit(code);
        }
        sys::Forked::Parent(pid) => {
            drop(w);
            let mut msg = Vec::new();
            let _ = std::fs::File::from(r).read_to_end(&mut msg);
            match msg.first() {
                Some(0) => Ok(String::from_utf8_lossy(&msg[1..]).into_owned()),
                Some(_) => {
                    let _ = sys::wait_child(pid);
                    Err(String::from_utf8_lossy(&msg).into_owned())
                }
                None => {
                    let st = sys::wait_child(pid).unwrap_or(-1);
                    Err(format!(
                        "the mount server exited (status {st}) before the mount was ready"
                    ))
                }
            }
        }
    }
}

/// Serve in the foreground: mount, call `ready` with
/// [`Mounted::describe`]'s line, run until unmounted or signalled. A
/// filesystem that a server already serves is bound instead
/// ([`bind_existing`]); this returns at once then (nothing to serve),
/// saying so.
pub fn run_foreground(
    image: &Path,
    mount_point: &Path,
    opts: &MountOptions,
    ready: impl FnOnce(&str),
) -> Result<(), String> {
    if let Some(line) = bind_existing(image, mount_point, opts)? {
        eprintln!("ext4kit: {line}; nothing to serve in the foreground: `ext4kit umount` it as any mount");
        return Ok(());
    }
    let m = mount(image, mount_point, opts)?;
    ready(&m.describe());
    m.run()
}

/// Unmount an ext4kit mount and wait (up to `wait`) until its server has
/// flushed and released the image. When another mount point of the same
/// server remains (a bind mount: the same FUSE connection, the same device
/// number in the mount table), only this one goes and this returns at
/// once: the server keeps serving the others.
pub fn unmount(mount_point: &Path, wait: Duration) -> Result<(), String> {
    let mp = std::fs::canonicalize(mount_point).map_err(|e| format!("{}: {e}", mount_point.display()))?;
    let table = mounts().map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    let Some(entry) = table.iter().rev().find(|m| m.mount_point == mp) else {
        return Err(format!("{}: not a mount point", mp.display()));
    };
    if entry.fstype != format!("fuse.{SUBTYPE}") {
        return Err(format!(
            "{}: not an ext4kit mount (it is {} from {}); use umount(8)",
            mp.display(),
            entry.fstype,
            entry.source
        ));
    }
    if sys::is_root() {
        // A reference that is on its way out still makes the mount busy: a
        // child some other thread of the caller forked holds copies of its
        // descriptors until its exec closes them (O_CLOEXEC), and a process
        // that just exited may not have released its files yet. On a loaded
        // machine that window is long enough to be met (the test suites
        // did), so a busy mount is retried for a short while before it is
        // reported.
        let patience = Instant::now();
        let mut r = sys::umount(&mp, false);
        while r.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::EBUSY))
            && patience.elapsed() < Duration::from_secs(3)
        {
            std::thread::sleep(Duration::from_millis(50));
            r = sys::umount(&mp, false);
        }
        r.map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                format!(
                    "{}: busy (a process has files open or its working directory there); close them, or detach \
                     now with `umount -l {}`",
                    mp.display(),
                    mp.display()
                )
            } else {
                format!("{}: {e}", mp.display())
            }
        })?;
    } else {
        fusermount(&["-u"], &mp).map_err(|e| format!("{}: {e}", mp.display()))?;
    }
    if !mount_points_of(entry.dev).is_empty() {
        return Ok(());
    }
    let Some(source) = parse_source(&entry.source) else {
        return Ok(());
    };
    let image = source.image();
    let start = Instant::now();
    while !lock_is_free(image) {
        if start.elapsed() > wait {
            return Err(format!(
                "{}: unmounted, but the server still holds {} after {:?}",
                mp.display(),
                image.display(),
                wait
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    take_status(image).map_err(|msg| format!("{}: unmounted, but the server failed: {msg}", mp.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_bad_ones_are_named() {
        let mut o = MountOptions::default();
        assert_eq!(o.busy_poll, crate::busypoll::DEFAULT_WINDOW);
        parse_options("ro,cache=direct,busy_poll=0,noatime", &mut o).unwrap();
        assert!(o.read_only && !o.read_write);
        assert_eq!(o.cache, CacheMode::Direct);
        assert_eq!(o.busy_poll, Duration::ZERO);
        assert_eq!(o.kernel, vec![MountOption::NoAtime]);
        parse_options("relatime,nodiratime,diratime,strictatime,lazytime,nolazytime", &mut o).unwrap();
        assert_eq!(o.kernel, vec![MountOption::NoAtime], "accepted, nothing passed on");
        parse_options("partition=2", &mut o).unwrap();
        assert_eq!(o.location, Location::Partition(2));
        parse_options("offset=1M", &mut o).unwrap();
        assert_eq!(o.location, Location::Offset(1 << 20));
        for bad in ["offset=x", "partition=0", "partition=-1"] {
            let e = parse_options(bad, &mut o).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        let mut n = MountOptions::default();
        parse_options("noload", &mut n).unwrap();
        assert!(n.no_replay && n.read_only);
        let e = parse_options("noload,rw", &mut MountOptions::default()).unwrap_err();
        assert!(e.contains("noload") && e.contains("rw"), "{e}");
        let e = parse_options("rw,norecovery", &mut MountOptions::default()).unwrap_err();
        assert!(e.contains("noload"), "{e}");
        parse_options("commit=30", &mut o).unwrap();
        assert_eq!(o.commit_interval, Some(Duration::from_secs(30)));
        assert!(parse_options("commit=soon", &mut o).unwrap_err().contains("seconds"));
        parse_options("rw,busy_poll=500", &mut o).unwrap();
        assert!(o.read_write && !o.read_only);
        assert_eq!(o.busy_poll, Duration::from_micros(500));
        let e = parse_options("busy_poll=soon", &mut o).unwrap_err();
        assert!(e.contains("busy_poll=soon") && e.contains("microseconds"), "{e}");
        let e = parse_options("rw,bogus", &mut o).unwrap_err();
        assert!(e.contains("`bogus`") && e.contains("busy_poll"), "{e}");
    }
}
