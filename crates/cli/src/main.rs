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

/// ext4kit — read and edit ext2/ext3/ext4 images from user space.
///
/// info, ls, cat, stat and get open IMAGE read-only and never write to it;
/// mkfs, mkdir, rm, mv and ln change it (no mount, no root needed). Paths
/// inside the image are absolute ("/etc/passwd"); a missing leading "/" is
/// allowed.
#[derive(Parser, Debug)]
#[command(name = "ext4kit", version, about, long_about = None, after_help = "EXAMPLES:\n  ext4kit demo                      show the engine on its built-in sample image\n  ext4kit info disk.img             features, sizes, free space, label, UUID\n  ext4kit ls -l disk.img /etc       list a directory\n  ext4kit cat disk.img /etc/hostname\n  ext4kit stat disk.img /bin/sh     inode details and block map\n  ext4kit get disk.img / out/       copy the whole tree out, preserving metadata\n  ext4kit mkdir -p disk.img /srv/www\n  ext4kit mv disk.img /srv/www /srv/site\n  ext4kit ln -s disk.img /srv/site /www\n  ext4kit rm -r disk.img /srv")]
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
}

/// Parse an octal mode like "755" or "0644".
fn parse_mode(s: &str) -> Result<u16, String> {
    u16::from_str_radix(s, 8)
        .ok()
        .filter(|&m| m <= 0o7777)
        .ok_or_else(|| format!("\"{s}\" is not an octal mode (0 to 7777)"))
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
        Command::Mkdir {
            parents,
            mode,
            image,
            paths,
        } => cmd::edit::mkdir(&image, &paths, parents, mode, budget),
        Command::Rm {
            recursive,
            force,
            image,
            paths,
        } => cmd::edit::rm(&image, &paths, recursive, force, budget),
        Command::Mv {
            no_clobber,
            image,
            src,
            dest,
        } => cmd::edit::mv(&image, &src, &dest, no_clobber, budget),
        Command::Ln {
            symbolic,
            image,
            target,
            link,
        } => cmd::edit::ln(&image, &target, &link, symbolic, budget),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("ext4kit: {msg}");
            ExitCode::FAILURE
        }
    }
}
