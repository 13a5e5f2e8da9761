//! Copying host files, trees and tar archives into an image: `ext4kit put
//! SRC... IMAGE:DEST` and `ext4kit mkfs -d SOURCE`.
//!
//! The reading of sources and the writing into the image are the
//! `ext4kit-populate` crate's (what is copied and how: its docs); this
//! module places each source as `cp -a` would, draws the progress, and
//! turns the owner options into its rule.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ext4kit::{FileType, Fs};
use ext4kit_populate::file_contexts::FileContexts;
use ext4kit_populate::fs_config::FsConfig;
use ext4kit_populate::source::{self, dir::DirSource};
use ext4kit_populate::{IdMap, Owners, Placement, Populator, Progress, Rules, Source};
use indicatif::{ProgressBar, ProgressStyle};

/// Who owns the copied files in the image.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct OwnerArgs {
    /// Every file owned by root (uid 0, gid 0), whoever owns it in the
    /// source: a rootless build of a root filesystem.
    #[arg(long, conflicts_with_all = ["uid_map", "gid_map"])]
    pub all_root: bool,
    /// Map source uids to image uids, as a user namespace's uid_map reads:
    /// IMAGE_ID:SOURCE_ID:COUNT (repeatable). With a map given, a uid no
    /// range covers is an error.
    #[arg(long, value_name = "IMAGE:SOURCE:COUNT")]
    pub uid_map: Vec<String>,
    /// The same for gids.
    #[arg(long, value_name = "IMAGE:SOURCE:COUNT")]
    pub gid_map: Vec<String>,
    /// Owners, modes and capabilities of the paths an Android fs_config
    /// file lists (`path uid gid mode [capabilities=0xMASK]`), over the
    /// rules above.
    #[arg(long, value_name = "FILE")]
    pub fs_config: Option<PathBuf>,
    /// SELinux labels from a file_contexts file, matched as libselinux
    /// (matchpathcon, restorecon) matches it; a path it gives no label
    /// (or `<<none>>`) gets none.
    #[arg(long, value_name = "FILE")]
    pub file_contexts: Option<PathBuf>,
}

impl OwnerArgs {
    /// The rules these options give, their files read and checked.
    pub fn rules(&self) -> Result<Rules, String> {
        let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
        let file_contexts = match &self.file_contexts {
            None => None,
            Some(p) => Some(FileContexts::parse(&read(p)?, &p.display().to_string())?),
        };
        let fs_config = match &self.fs_config {
            None => None,
            Some(p) => Some(FsConfig::parse(&read(p)?, &p.display().to_string())?),
        };
        Ok(Rules {
            owners: self.owners()?,
            file_contexts,
            fs_config,
        })
    }

    /// The owner rule these options give.
    fn owners(&self) -> Result<Owners, String> {
        if self.all_root {
            return Ok(Owners::all_root());
        }
        let (mut u, mut g) = (IdMap::default(), IdMap::default());
        for s in &self.uid_map {
            u.push(s).map_err(|e| format!("--uid-map {e}"))?;
        }
        for s in &self.gid_map {
            g.push(s).map_err(|e| format!("--gid-map {e}"))?;
        }
        Ok(Owners::mapped(u, g))
    }
}

/// Arguments of `ext4kit put`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "EXAMPLES:
  ext4kit put notes.txt disk.img:/root/        into an existing directory
  ext4kit put site disk.img:/srv/www            a tree, as cp -a site /srv/www
  ext4kit put site/. disk.img:/srv/www          the tree's contents into /srv/www
  ext4kit put rootfs.tar.zst disk.img:/         a tar's members into /
  ext4kit put --all-root build/. disk.img:/opt  owned by root in the image")]
pub struct Args {
    /// Files or directories on the host, or tar archives (plain, gzip,
    /// zstd or xz, told apart by their contents) whose members go into
    /// DEST, which must then be an existing directory.
    #[arg(required = true)]
    pub srcs: Vec<PathBuf>,
    /// IMAGE:DEST, e.g. disk.img:/srv.
    pub target: String,
    #[command(flatten)]
    pub owners: OwnerArgs,
}

/// What a copy did.
#[derive(Debug, Default)]
pub struct Summary {
    /// Entries created (directories, files, links, ...).
    pub entries: u64,
    /// File bytes written.
    pub bytes: u64,
}

/// Count entries and bytes below host path `src` (for the progress bar).
fn measure(src: &Path) -> (u64, u64) {
    let (mut n, mut bytes) = (0u64, 0u64);
    let mut stack = vec![src.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        n += 1;
        if md.is_file() {
            bytes += md.len();
        } else if md.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    (n, bytes)
}

/// A progress bar over the bytes of the host trees among `srcs` (an
/// archive's size is not known before it is read: the bar then counts).
pub(crate) fn progress_bar(srcs: &[&Path]) -> ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        // Nobody sees it: do not walk the trees twice to draw it.
        return ProgressBar::hidden();
    }
    let trees: Vec<&&Path> = srcs.iter().filter(|p| p.is_dir()).collect();
    let (entries, bytes) = trees
        .iter()
        .map(|s| measure(s))
        .fold((0, 0), |(n, b), (n2, b2)| (n + n2, b + b2));
    if trees.len() == srcs.len() {
        let bar = ProgressBar::new(bytes);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, {eta}) {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(format!("of {entries} entries"));
        bar
    } else {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bytes} ({bytes_per_sec}) {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar
    }
}

/// One build's copying: the populator and its progress bar.
pub struct Copy<'a> {
    pop: Populator<'a>,
    bar: ProgressBar,
}

impl<'a> Copy<'a> {
    /// A copy into `fs` of `srcs` (measured up front for the progress
    /// bar). One copy serves every source of a command, so that names of
    /// one file given as different sources become hard links of one inode,
    /// as with `cp -a A B DEST/`.
    pub fn new(fs: &'a Fs, srcs: &[&Path], rules: Rules) -> Self {
        let bar = progress_bar(srcs);
        let mut pop = Populator::new(fs, rules);
        let b = bar.clone();
        pop.on_progress(move |p: Progress| {
            b.set_position(p.bytes);
            if b.length().is_none() {
                b.set_message(format!("{} entries", p.entries));
            }
        });
        Copy { pop, bar }
    }

    /// Copy `src` in at `placement`.
    pub fn add(&mut self, src: &mut dyn Source, placement: Placement<'_>) -> Result<(), String> {
        let r = self.pop.add(src, placement);
        r.map_err(|e| {
            self.bar.finish_and_clear();
            e.to_string()
        })
    }

    /// Set the directories' times; what was copied.
    pub fn finish(self) -> Result<Summary, String> {
        self.bar.finish_and_clear();
        let p = self.pop.finish().map_err(|e| e.to_string())?;
        Ok(Summary {
            entries: p.entries,
            bytes: p.bytes,
        })
    }
}

/// Whether the last component of `p` as written is "." or ".." (`DIR/.`,
/// `.`, `DIR/./`): `cp -a DIR/. DEST` copies DIR's contents into DEST.
/// (`Path::file_name` would drop the "." and say "DIR".)
fn ends_in_dot(p: &Path) -> bool {
    matches!(last_component(p), b"." | b"..")
}

/// The last component of `p` as written, trailing slashes ignored.
fn last_component(p: &Path) -> &[u8] {
    let b = p.as_os_str().as_bytes();
    let mut end = b.len();
    while end > 1 && b[end - 1] == b'/' {
        end -= 1;
    }
    let b = &b[..end];
    match b.iter().rposition(|&c| c == b'/') {
        Some(i) => &b[i + 1..],
        None => b,
    }
}

/// `ext4kit put SRC... IMAGE:DEST`: copy host files, trees or archives
/// into the image, with `cp -a`'s rules for where each lands. When DEST is
/// an existing directory, each SRC goes into it under its own name —
/// except a SRC written as `DIR/.` (or `.`), whose contents go into DEST
/// itself, and an archive, whose members do; otherwise (one SRC) DEST is
/// the name of the copy. Sources that are hard links of one file become
/// one inode with several names.
pub fn run(a: &Args, sel: &crate::image::ImageArgs, budget: usize) -> Result<(), String> {
    let rules = a.owners.rules()?;
    let (image, dest) = split_target(&a.target)?;
    let image = &sel.image(image)?;
    // Every source is looked at before the image is opened.
    let mut sources: Vec<(Box<dyn Source>, &PathBuf, bool)> = Vec::new();
    for src in &a.srcs {
        let md = std::fs::symlink_metadata(src).map_err(|e| format!("{}: {e}", src.display()))?;
        let archive = md.is_file() && !ends_in_dot(src) && source::is_archive(src);
        let s: Box<dyn Source> = if archive {
            source::open(src, &Default::default()).map_err(|e| e.to_string())?
        } else {
            Box::new(DirSource::entry(src, ends_in_dot(src)))
        };
        sources.push((s, src, archive));
    }
    let fs = super::edit::open_rw(image, budget)?;
    let dest = if dest.starts_with('/') {
        dest.to_string()
    } else {
        format!("/{dest}")
    };
    let dest_dir = fs
        .stat(dest.as_bytes())
        .ok()
        .filter(|st| st.ftype == FileType::Directory);
    if (a.srcs.len() > 1 || sources.iter().any(|s| s.2)) && dest_dir.is_none() {
        return Err(format!(
            "{}: {dest}: not an existing directory (several sources, or an archive)",
            image.display()
        ));
    }
    for (_, src, archive) in &sources {
        if dest_dir.is_some() && !archive && !ends_in_dot(src) && last_component(src).is_empty() {
            return Err(format!("{}: has no file name to copy under", src.display()));
        }
    }
    let paths: Vec<&Path> = a.srcs.iter().map(|p| p.as_path()).collect();
    let mut c = Copy::new(&fs, &paths, rules);
    let fail = |e: String| format!("{}: {e}", image.display());
    for (s, src, archive) in &mut sources {
        match &dest_dir {
            Some(d) if *archive || ends_in_dot(src) => c
                .add(
                    &mut **s,
                    Placement::Into {
                        dir: d.ino,
                        path: dest.as_bytes(),
                    },
                )
                .map_err(fail)?,
            Some(d) => {
                let name = last_component(src).to_vec();
                c.add(
                    &mut **s,
                    Placement::Named {
                        parent: d.ino,
                        parent_path: dest.as_bytes(),
                        name: &name,
                    },
                )
                .map_err(fail)?;
            }
            None => {
                let trimmed = dest.trim_end_matches('/');
                let (pp, n) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
                let pp = if pp.is_empty() { "/" } else { pp };
                let pst = fs.stat(pp.as_bytes()).map_err(|e| super::err(image, pp, e))?;
                c.add(
                    &mut **s,
                    Placement::Named {
                        parent: pst.ino,
                        parent_path: pp.as_bytes(),
                        name: n.as_bytes(),
                    },
                )
                .map_err(fail)?;
            }
        }
    }
    let total = c.finish().map_err(fail)?;
    fs.sync()
        .map_err(|e| format!("{}: writing back: {e}", image.display()))?;
    eprintln!(
        "ext4kit: {}: copied {} entries, {} bytes",
        image.display(),
        total.entries,
        total.bytes
    );
    Ok(())
}

/// Split "IMAGE:/path" (the first ":/"; or the last ":" for a relative DEST).
fn split_target(t: &str) -> Result<(&str, &str), String> {
    if let Some(i) = t.find(":/") {
        return Ok((&t[..i], &t[i + 1..]));
    }
    match t.rsplit_once(':') {
        Some((img, dest)) if !img.is_empty() => Ok((img, if dest.is_empty() { "/" } else { dest })),
        _ => Err(format!(
            "\"{t}\": the last argument must be IMAGE:DEST (for example disk.img:/srv)"
        )),
    }
}
