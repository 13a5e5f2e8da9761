//! `ext4kit`: inspect and extract ext2/ext3/ext4 images without mounting
//! them and without root. A thin frontend over the `ext4kit` library: it
//! parses arguments, calls the engine, and formats results; every
//! filesystem rule lives in the library.

#![forbid(unsafe_code)]

mod cmd;
mod fmt;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// ext4kit — read ext2/ext3/ext4 images from user space.
///
/// Every command but `mkfs` opens IMAGE read-only and never writes to it.
/// Paths inside the image are absolute ("/etc/passwd"); a missing leading
/// "/" is allowed.
#[derive(Parser, Debug)]
#[command(name = "ext4kit", version, about, long_about = None, after_help = "EXAMPLES:\n  ext4kit demo                      show the engine on its built-in sample image\n  ext4kit info disk.img             features, sizes, free space, label, UUID\n  ext4kit ls -l disk.img /etc       list a directory\n  ext4kit cat disk.img /etc/hostname\n  ext4kit stat disk.img /bin/sh     inode details and block map\n  ext4kit get disk.img / out/       copy the whole tree out, preserving metadata")]
struct Cli {
    /// Cache memory budget in MiB (inodes, dentries, pages).
    #[arg(long, global = true, default_value_t = 256, value_name = "MIB")]
    cache_mib: usize,
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
    Info {
        /// The image file (or block device).
        image: PathBuf,
    },
    /// List a directory, like ls(1).
    Ls {
        /// Long format: mode, links, owner, group, size, mtime, name.
        #[arg(short, long)]
        long: bool,
        /// Show entries whose names begin with "." (including . and ..).
        #[arg(short, long)]
        all: bool,
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
    Stat {
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
    /// Make a new, empty ext2/ext3/ext4 filesystem in IMAGE (mke2fs-style
    /// defaults). This is the one command that writes: a regular file is
    /// created or truncated and extended to SIZE as a sparse file.
    /// SOURCE_DATE_EPOCH fixes all timestamps; with -U and -E hash_seed= the
    /// image is reproducible byte for byte.
    Mkfs(cmd::mkfs::Args),
    /// Mount an image with the ext4kit FUSE server (read-only for now);
    /// detaches once the mount works.
    Mount(cmd::mount::MountArgs),
    /// Unmount an ext4kit mount and wait for its server to finish.
    Umount(cmd::mount::UmountArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let budget = cli.cache_mib.max(8) << 20;
    let r = match cli.cmd {
        Command::Demo => cmd::demo::run(budget),
        Command::Info { image } => cmd::info::run(&image, budget),
        Command::Ls { long, all, image, path } => cmd::ls::run(&image, &path, long, all, budget),
        Command::Cat { image, path } => cmd::cat::run(&image, &path, budget),
        Command::Stat { image, path } => cmd::stat::run(&image, &path, budget),
        Command::Get { image, path, dest } => cmd::get::run(&image, &path, &dest, budget),
        Command::Mkfs(args) => cmd::mkfs::run(&args),
        Command::Mount(args) => cmd::mount::run(&args, budget),
        Command::Umount(args) => cmd::mount::umount(&args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("ext4kit: {msg}");
            ExitCode::FAILURE
        }
    }
}
