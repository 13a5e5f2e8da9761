//! `ext4kit`: inspect and extract ext2/ext3/ext4 images without mounting
//! them and without root. A thin frontend over the `ext4kit` library: it
//! parses arguments, calls the engine, and formats results; every
//! filesystem rule lives in the library.

#![forbid(unsafe_code)]

mod bodyfile;
mod cmd;
mod failure;
mod fmt;
mod image;
mod json;

/// mimalloc, tuned (see `ext4kit_alloc` for why).
#[global_allocator]
static ALLOC: ext4kit_alloc::Allocator = ext4kit_alloc::Allocator;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use failure::Failure;

/// ext4kit — read and edit ext2/ext3/ext4 images from user space.
///
/// info, df, ls, cat, stat, get, getfattr, journal and timeline open IMAGE
/// read-only and never write to it; mkfs, put, mkdir, rm, mv, ln, chmod, chown, touch, truncate
/// and setfattr change it (no mount, no root needed). Paths
/// inside the image are absolute ("/etc/passwd"); a missing leading "/" is
/// allowed.
#[derive(Parser, Debug)]
#[command(
    name = "ext4kit",
    version,
    about,
    after_help = "EXAMPLES:\n  ext4kit demo                      show the engine on its built-in sample image\n  ext4kit info disk.img             features, sizes, free space, label, UUID\n  ext4kit ls -l disk.img /etc       list a directory\n  ext4kit cat disk.img /etc/hostname\n  ext4kit stat disk.img /bin/sh     inode details and block map\n  ext4kit get disk.img / out/       copy the whole tree out, preserving metadata\n  ext4kit mkfs -d rootfs/ disk.img 256M   build an image from a directory\n  ext4kit put site/ disk.img:/srv/www   copy a tree in\n  ext4kit mkdir -p disk.img /srv/www\n  ext4kit mv disk.img /srv/www /srv/site\n  ext4kit ln -s disk.img /srv/site /www\n  ext4kit rm -r disk.img /srv\n  ext4kit chown disk.img 1000:1000 /home/me\n  ext4kit setfattr disk.img -n user.note -v hello /etc/motd\n\nPARTITIONED DISKS (VM disks, whole-disk dumps; GPT or MBR):\n  ext4kit info vm.img               list the partitions (and summarise the ext one)\n  ext4kit ls vm.img@2 /etc          partition 2 (IMAGE@N when no file has that name)\n  ext4kit --partition 2 cat vm.img /etc/fstab\n  ext4kit ls vm.img /               a disk with exactly one ext partition: that one\n  ext4kit put --offset 1M motd disk.img:/etc/   a filesystem 1 MiB into the file\n  ext4kit mkfs -d rootfs/ vm.img@2  make a filesystem filling partition 2\n\nJOURNAL:\n  ext4kit ls --no-replay crashed.img /   the tree as the home locations hold it,\n                                    without replaying the journal (read-only)"
)]
struct Cli {
    /// Cache memory budget in MiB: metadata blocks and file pages share
    /// three quarters of it (each takes what the other leaves); inodes and
    /// dentries have the rest.
    #[arg(long, global = true, default_value_t = 256, value_name = "MIB")]
    cache_mib: usize,
    #[command(flatten)]
    image: image::ImageArgs,
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show the engine working on the sample image built into this binary:
    /// its summary, its whole tree, and one file's contents. Needs nothing
    /// but this executable.
    Demo,
    /// Summarise an image: features, block size, counts, groups, free
    /// space, label, UUID and state.
    #[command(after_help = "EXAMPLES:
  ext4kit info disk.img             the summary
  ext4kit info --compat disk.img    which boot loaders and kernels open it
  ext4kit info --json vm.qcow2      container, partitions, LVM and filesystem as JSON

  With --compat, each reader (u-boot-read, u-boot, grub, grub-2.12,
  android, and Linux 3.10 to 6.1) is judged from the superblock's feature
  words: opens, read-only (e.g. Linux meeting an ro_compat feature it
  lacks, U-Boot meeting metadata_csum) or cannot open, with the features
  responsible and the reader's rule. The table behind it is README.md's
  \"Readers\" section; build for a reader with mkfs --compat READER.")]
    Info {
        /// Instead of the summary, say for each boot loader and kernel
        /// whether it can open the image and which features stop it.
        #[arg(long)]
        compat: bool,
        /// The whole stack (container format, partition table, LVM2
        /// volume groups, filesystem with every fact of the summary) as
        /// one JSON document, for scripts.
        #[arg(long, conflicts_with = "compat")]
        json: bool,
        /// The image file (or block device).
        image: PathBuf,
    },
    /// List a directory, like ls(1).
    #[command(after_help = "EXAMPLES:
  ext4kit ls -l disk.img /etc           the long format
  ext4kit ls -R disk.img /srv           /srv and every directory under it
  ext4kit ls -lR --json disk.img / | jq -r 'select(.size > 1000000) | .path'
                                        files over 1 MB, by a script

  --json prints JSON Lines: one object per entry, each on its own line
  (also for one file or a small directory), so a script reads any listing
  the same way, a line at a time. Each has name, path, ino and type; with
  -l also mode, nlink, uid, gid, size, blocks, atime, mtime, ctime,
  crtime (each {\"sec\", \"nsec\"}; crtime null on 128-byte inodes), rdev
  and target. A name that is not UTF-8 is given lossily in name, and
  exactly, in hex, in name_bytes (path and path_bytes likewise).
  README.md's \"JSON output\" lists every field.")]
    Ls {
        /// Long format: mode, links, owner, group, size, mtime, name.
        #[arg(short, long)]
        long: bool,
        /// Show entries whose names begin with "." (including . and ..).
        #[arg(short, long)]
        all: bool,
        /// List the directories under PATH too, depth first in name order
        /// (each headed by its path, like ls -R).
        #[arg(short = 'R', long)]
        recursive: bool,
        /// JSON Lines: one object per entry per line (see below).
        #[arg(long)]
        json: bool,
        /// The image file.
        image: PathBuf,
        /// Directory (or file) inside the image.
        #[arg(default_value = "/")]
        path: String,
    },
    /// Write a file's contents to standard output (symlinks are followed).
    Cat {
        /// The image file.
        image: PathBuf,
        /// File inside the image.
        path: String,
    },
    /// Show an inode: number, type, mode, owner, size, links, times, flags,
    /// xattrs and where its data lives (extents or block map).
    #[command(after_help = "EXAMPLES:
  ext4kit stat disk.img /bin/sh
  ext4kit stat --json disk.img /etc/passwd | jq .mtime

  --json prints one document: path, ino, type, mode (st_mode as an
  integer), nlink, uid, gid, size, blocks, atime, mtime, ctime and crtime
  (each {\"sec\", \"nsec\"}; crtime null when the inode has no room for it),
  rdev, target, flags, generation, xattr_block, xattrs (name and size of
  each) and data (the map's kind and every run: logical, physical, len,
  unwritten).")]
    Stat {
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// The image file.
        image: PathBuf,
        /// Path inside the image (a final symlink is not followed).
        path: String,
    },
    /// Copy a file or a whole tree out of the image into DEST, preserving
    /// type, mode, times, symlinks, hard links, device nodes, xattrs and
    /// (when run as root) owners. Sparse files stay sparse. DEST must not
    /// exist, or be an empty directory; names in the image can never make
    /// it write outside DEST.
    Get {
        /// The image file.
        image: PathBuf,
        /// What to copy ("/" for everything).
        path: String,
        /// Where to put it.
        dest: PathBuf,
    },
    /// Make a new ext2/ext3/ext4 filesystem in IMAGE (mke2fs-style
    /// defaults), optionally filled from a directory tree (-d). A regular
    /// file is created or truncated and extended to SIZE as a sparse file.
    /// SOURCE_DATE_EPOCH fixes all timestamps; with -U and -E hash_seed= the
    /// image is reproducible byte for byte.
    Mkfs(Box<cmd::mkfs::Args>),
    /// Mount an image with the ext4kit FUSE server (read-write when the
    /// image allows); detaches once the mount works.
    Mount(cmd::mount::MountArgs),
    /// Unmount an ext4kit mount and wait for its server to finish.
    Umount(cmd::mount::UmountArgs),
    /// Copy host files, directory trees or tar archives into the image,
    /// preserving type, mode, owner, times (ns), symlinks, hard links,
    /// device nodes, xattrs and ACLs; sparse files stay sparse. With one
    /// SRC, DEST may be a new name; otherwise DEST must be an existing
    /// directory.
    Put(cmd::put::Args),
    /// Make directories in the image.
    Mkdir {
        /// Make missing parents too; an existing directory is not an error.
        #[arg(short, long)]
        parents: bool,
        /// Permission bits, in octal.
        #[arg(short, long, default_value = "755", value_parser = parse_mode)]
        mode: u16,
        /// The image file.
        image: PathBuf,
        /// Directories to make.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Remove files (and with -r, directories and everything in them).
    Rm {
        /// Remove directories and their contents.
        #[arg(short, long)]
        recursive: bool,
        /// A missing path is not an error.
        #[arg(short, long)]
        force: bool,
        /// The image file.
        image: PathBuf,
        /// What to remove.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Rename or move a file or directory within the image (into DEST when
    /// DEST is an existing directory). Replaces an existing DEST file or
    /// empty directory, like rename(2).
    Mv {
        /// Do not replace an existing DEST.
        #[arg(short = 'n', long)]
        no_clobber: bool,
        /// The image file.
        image: PathBuf,
        /// What to move.
        src: String,
        /// New name or target directory.
        dest: String,
    },
    /// Make a hard link (or with -s, a symbolic link) in the image.
    Ln {
        /// Make a symbolic link whose contents are TARGET (any text).
        #[arg(short, long)]
        symbolic: bool,
        /// The image file.
        image: PathBuf,
        /// Existing file (hard link) or link text (symbolic).
        target: String,
        /// The new name.
        link: String,
    },
    /// Change permission bits.
    Chmod {
        /// The image file.
        image: PathBuf,
        /// New mode, in octal (e.g. 644, 4755).
        #[arg(value_parser = parse_mode)]
        mode: u16,
        /// Files to change.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Change owner and/or group (numeric ids: UID, UID:GID or :GID).
    Chown {
        /// Change a symlink itself, not what it points to.
        #[arg(short = 'H', long = "no-dereference")]
        no_dereference: bool,
        /// The image file.
        image: PathBuf,
        /// UID[:GID] or :GID.
        owner: String,
        /// Files to change.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Set access and modification times (to now, or -d), creating missing
    /// files unless -c.
    Touch {
        /// Do not create missing files.
        #[arg(short = 'c', long)]
        no_create: bool,
        /// Time to set: seconds since 1970, optionally with .nanoseconds.
        #[arg(short = 'd', long = "date", value_parser = cmd::edit::parse_time)]
        date: Option<ext4kit::Timestamp>,
        /// The image file.
        image: PathBuf,
        /// Files to touch.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Set file sizes: shrinking frees blocks, growing leaves a hole.
    Truncate {
        /// New size: bytes, or with a K, M, G or T suffix.
        #[arg(short = 's', long, value_parser = parse_bytes)]
        size: u64,
        /// Do not create missing files.
        #[arg(short = 'c', long)]
        no_create: bool,
        /// The image file.
        image: PathBuf,
        /// Files to resize.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Set (or with -x remove) an extended attribute, like setfattr(1).
    Setfattr {
        /// Attribute name, with its namespace: user.x, trusted.x,
        /// security.x, system.posix_acl_access.
        #[arg(short = 'n', long)]
        name: String,
        /// Value: text, "quoted text", or 0x followed by hex bytes.
        #[arg(short = 'v', long, conflicts_with = "remove")]
        value: Option<String>,
        /// Remove the attribute instead.
        #[arg(short = 'x', long)]
        remove: bool,
        /// The image file.
        image: PathBuf,
        /// Files to change.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Print extended attributes, like getfattr -d (read-only).
    #[command(after_help = "EXAMPLES:
  ext4kit getfattr disk.img /etc/motd
  ext4kit getfattr -n security.selinux disk.img /bin/sh
  ext4kit getfattr --json disk.img /a /b

  --json prints one document: {\"files\": [{\"path\", \"xattrs\": [{\"name\",
  \"value\"}]}]}. A value (or name) that is not UTF-8 is given lossily in
  value and exactly, in hex, in value_bytes (name_bytes).")]
    Getfattr {
        /// Only this attribute.
        #[arg(short = 'n', long)]
        name: Option<String>,
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// The image file.
        image: PathBuf,
        /// Files to show.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Show what the journal holds and what replaying it would do: the
    /// journal superblock, every transaction from the log start (each
    /// logged block with the filesystem block it belongs to, revoke
    /// records, the commit block and its time), the fast-commit area, and
    /// recovery's verdict (which transactions replay, which blocks are
    /// written home, what fails and why). The walk lists what `debugfs -R
    /// 'logdump -a'` lists, without e2fsprogs. Never writes.
    #[command(
        after_help = "EXAMPLES:\n  ext4kit journal snapshot.img          the log, transaction by transaction\n  ext4kit journal --json snapshot.img   the same as JSON, for scripts"
    )]
    Journal {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// The image file.
        image: PathBuf,
    },
    /// Show size, used and available space and inodes, like df(1).
    #[command(after_help = "EXAMPLES:
  ext4kit df disk.img
  ext4kit df --json disk.img | jq .kib_available

  --json prints one document: image, block_size, blocks, blocks_free,
  blocks_available (statfs's f_blocks, f_bfree, f_bavail), kib_total,
  kib_used, kib_available, use_percent (the table's columns), inodes,
  inodes_used, inodes_free, name_max.")]
    Df {
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// The image file.
        image: PathBuf,
    },
    /// A timeline of every inode's times for forensics: a bodyfile (the
    /// Sleuth Kit 3.x format `mactime -b FILE` reads) or JSON Lines.
    Timeline(cmd::timeline::Args),
    /// Benchmark: every workload on the library, the ext4kit mount,
    /// fuse2fs and the kernel's ext4, with a report and charts (runs
    /// ext4kit-bench, built on its own: `cargo build --release -p
    /// ext4kit-bench`).
    ///
    /// Every workload (the experiments behind the five design principles, and the standard ones)
    /// on the library, the ext4kit mount, fuse2fs and the kernel's ext4,
    /// with a report, JSON, CSV and SVG charts. Run as root for the
    /// mounts; `ext4kit bench --help` lists the workloads and peers.
    ///
    /// The suite is the program ext4kit-bench, found beside this binary or
    /// on PATH, built on its own so that this binary carries no benchmark
    /// instrumentation: `cargo build --release -p ext4kit-bench`, in a
    /// cargo command of its own (built in one command with ext4kit-cli,
    /// cargo would compile the library's shared-write counting into this
    /// binary too).
    Bench(cmd::bench::Args),
    /// Print a shell completion script for ext4kit's subcommands and
    /// options to standard output.
    #[command(after_help = "EXAMPLES:
  source <(ext4kit completions bash)          completion in this bash session
  ext4kit completions bash > ~/.local/share/bash-completion/completions/ext4kit
  ext4kit completions zsh > ~/.zfunc/_ext4kit  (with fpath+=~/.zfunc in ~/.zshrc)
  ext4kit completions fish > ~/.config/fish/completions/ext4kit.fish

  The Debian package installs the bash, zsh and fish scripts already.")]
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

/// Parse a byte count with an optional binary suffix (K, M, G, T).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let bad = || format!("\"{s}\" is not a size (e.g. 4096, 10M, 2G)");
    let (num, shift) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 30),
        Some(b't' | b'T') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(bad)
}

/// Parse an octal mode like "755" or "0644".
fn parse_mode(s: &str) -> Result<u16, String> {
    u16::from_str_radix(s, 8)
        .ok()
        .filter(|&m| m <= 0o7777)
        .ok_or_else(|| format!("\"{s}\" is not an octal mode (0 to 7777)"))
}

fn main() -> ExitCode {
    ext4kit_alloc::tune();
    let matches = Cli::command().subcommand(cmd::manpages::command()).get_matches();
    if let Some((cmd::manpages::NAME, m)) = matches.subcommand() {
        let args = cmd::manpages::Args::from_arg_matches(m).unwrap_or_else(|e| e.exit());
        let sel = image::ImageArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        let r = if sel.any() {
            Err(NO_IMAGE.to_string())
        } else {
            cmd::manpages::run(&args.dir, Cli::command())
        };
        return report(r.map_err(Failure::from), false);
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // A command that only prints (`ext4kit ls img / | head`) ends quietly
    // when its reader goes away, as coreutils do: Rust ignores SIGPIPE, so
    // println! would panic on EPIPE instead. Commands that write an image
    // keep ignoring it: a closed stdout must not stop them halfway.
    if matches!(
        cli.cmd,
        Command::Demo
            | Command::Info { .. }
            | Command::Ls { .. }
            | Command::Cat { .. }
            | Command::Stat { .. }
            | Command::Getfattr { .. }
            | Command::Df { .. }
            | Command::Journal { .. }
            | Command::Timeline(_)
            | Command::Completions { .. }
    ) {
        sigpipe::reset();
    }
    // Failures print as JSON when the command was asked for JSON.
    let json = match &cli.cmd {
        Command::Info { json, .. }
        | Command::Ls { json, .. }
        | Command::Stat { json, .. }
        | Command::Df { json, .. }
        | Command::Getfattr { json, .. }
        | Command::Journal { json, .. } => *json,
        Command::Timeline(a) => a.json,
        _ => false,
    };
    let budget = cli.cache_mib.max(8) << 20;
    let sel = &cli.image;
    // The image argument with the global --partition/--offset/--no-replay
    // and the IMAGE@N short form applied.
    let img = |p: PathBuf| sel.image(p);
    let r: Result<(), Failure> = match cli.cmd {
        Command::Demo | Command::Umount(_) | Command::Bench(_) | Command::Completions { .. } if sel.any() => {
            Err(Failure::from(NO_IMAGE.to_string()))
        }
        Command::Completions { shell } => cmd::completions::run(shell, Cli::command()).map_err(Failure::from),
        Command::Demo => cmd::demo::run(budget).map_err(Failure::from),
        Command::Info {
            image, compat: true, ..
        } => img(image).and_then(|i| cmd::info::readers(&i)).map_err(Failure::from),
        Command::Info { image, json: true, .. } => img(image)
            .and_then(|i| cmd::info_json::run(&i, budget))
            .map_err(Failure::from),
        Command::Info { image, .. } => img(image)
            .and_then(|i| cmd::info::run(&i, budget))
            .map_err(Failure::from),
        Command::Ls {
            long,
            all,
            recursive,
            json,
            image,
            path,
        } => img(image).map_err(Failure::from).and_then(|i| {
            let req = cmd::ls::Listing {
                path: &path,
                long,
                all,
                recursive,
                json,
            };
            cmd::ls::run(&i, &req, budget)
        }),
        Command::Cat { image, path } => img(image)
            .and_then(|i| cmd::cat::run(&i, &path, budget))
            .map_err(Failure::from),
        Command::Stat { json, image, path } => img(image)
            .map_err(Failure::from)
            .and_then(|i| cmd::stat::run(&i, &path, json, budget)),
        Command::Get { image, path, dest } => img(image)
            .and_then(|i| cmd::get::run(&i, &path, &dest, budget))
            .map_err(Failure::from),
        Command::Mkfs(args) => cmd::mkfs::run(&args, sel).map_err(Failure::from),
        Command::Mount(args) => cmd::mount::run(&args, sel, budget).map_err(Failure::from),
        Command::Umount(args) => cmd::mount::umount(&args).map_err(Failure::from),
        Command::Bench(args) => {
            let given = matches.value_source("cache_mib") == Some(clap::parser::ValueSource::CommandLine);
            cmd::bench::run(&args, given.then_some(cli.cache_mib)).map_err(Failure::from)
        }
        Command::Put(args) => cmd::put::run(&args, sel, budget).map_err(Failure::from),
        Command::Mkdir {
            parents,
            mode,
            image,
            paths,
        } => img(image)
            .and_then(|i| cmd::edit::mkdir(&i, &paths, parents, mode, budget))
            .map_err(Failure::from),
        Command::Rm {
            recursive,
            force,
            image,
            paths,
        } => img(image)
            .and_then(|i| cmd::edit::rm(&i, &paths, recursive, force, budget))
            .map_err(Failure::from),
        Command::Mv {
            no_clobber,
            image,
            src,
            dest,
        } => img(image)
            .and_then(|i| cmd::edit::mv(&i, &src, &dest, no_clobber, budget))
            .map_err(Failure::from),
        Command::Ln {
            symbolic,
            image,
            target,
            link,
        } => img(image)
            .and_then(|i| cmd::edit::ln(&i, &target, &link, symbolic, budget))
            .map_err(Failure::from),
        Command::Chmod { image, mode, paths } => img(image)
            .and_then(|i| cmd::edit::chmod(&i, mode, &paths, budget))
            .map_err(Failure::from),
        Command::Chown {
            no_dereference,
            image,
            owner,
            paths,
        } => img(image)
            .and_then(|i| {
                cmd::edit::parse_owner(&owner).and_then(|o| cmd::edit::chown(&i, o, no_dereference, &paths, budget))
            })
            .map_err(Failure::from),
        Command::Touch {
            no_create,
            date,
            image,
            paths,
        } => img(image)
            .and_then(|i| cmd::edit::touch(&i, no_create, date, &paths, budget))
            .map_err(Failure::from),
        Command::Setfattr {
            name,
            value,
            remove,
            image,
            paths,
        } => img(image)
            .and_then(|i| cmd::edit::setfattr(&i, &name, value.as_deref(), remove, &paths, budget))
            .map_err(Failure::from),
        Command::Getfattr {
            name,
            json,
            image,
            paths,
        } => img(image).map_err(Failure::from).and_then(|i| {
            let req = cmd::getfattr::Request {
                name: name.as_deref(),
                paths: &paths,
                json,
            };
            cmd::getfattr::run(&i, &req, budget)
        }),
        Command::Df { json, image } => img(image)
            .map_err(Failure::from)
            .and_then(|i| cmd::df::run(&i, json, budget)),
        Command::Timeline(args) => cmd::timeline::run(&args, sel, budget),
        // The log itself: no replay is ever made, so --no-replay changes nothing.
        Command::Journal { json, image } => img(image)
            .and_then(|i| i.resolve().and_then(|loc| cmd::journal::run(&i.path, loc, json)))
            .map_err(Failure::from),
        Command::Truncate {
            size,
            no_create,
            image,
            paths,
        } => img(image)
            .and_then(|i| cmd::edit::truncate(&i, size, no_create, &paths, budget))
            .map_err(Failure::from),
    };
    report(r, json)
}

/// The refusal of the global image options by a command that opens no image.
const NO_IMAGE: &str =
    "--partition, --offset and --no-replay choose the filesystem in an image; this command takes none";

/// A command's outcome as the exit status, its error as one line on
/// stderr (a JSON object when the command was asked for JSON).
fn report(r: Result<(), Failure>, json: bool) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if !f.was_reported() {
                f.report(json);
            }
            ExitCode::FAILURE
        }
    }
}
