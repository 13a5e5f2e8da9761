//! `ext4kit timeline [--json] IMAGE [PATH]`: every inode's four times, for
//! a forensic timeline — as a body file for `mactime`, or as JSON Lines.
//!
//! Three sources, in this order of output:
//! 1. the tree: every name under PATH (default "/"), PATH itself first,
//!    depth first in name order; a file with several hard links has a line
//!    per name;
//! 2. removed names a directory block of the tree still holds (the
//!    library's `Fs::deleted_entries`, best effort: recent kernels wipe
//!    them), each with the record of the inode it names;
//! 3. the inode tables (`Fs::inode_table`): inodes the bitmap calls free
//!    whose records still look intact (a deleted file's, typically), and
//!    inodes in use that no name reached (reserved inodes, orphans). These
//!    have no path, so a PATH leaves them out.
//!
//! Nothing is written to the image. The tree is read through the engine
//! (a journal needing recovery is replayed in memory first, unless
//! `--no-replay`); the tables are read record by record, a bounded chunk
//! at a time.

use std::collections::{HashMap, HashSet};
use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use ext4kit::{FileType, Fs, Stat, TableInode, Timestamp};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};

use super::edit::abs;
use super::{Failure, Image};
use crate::bodyfile;
use crate::image::ImageArgs;
use crate::json;

/// `ext4kit timeline` arguments.
#[derive(clap::Args, Debug)]
#[command(after_help = "EXAMPLES:
  ext4kit timeline disk.img > body.txt
  mactime -b body.txt -d > timeline.csv     the Sleuth Kit's timeline of it
  ext4kit timeline disk.img /home           names under /home only
  ext4kit timeline --json disk.img | jq -c 'select(.allocated == false)'
                                            what deleted files left behind

WHAT IS LISTED
  Every name under PATH (default /), PATH itself included, with its
  inode's access, modification, change and creation (birth) times; a file
  with several hard links appears once per name. Then, without PATH, the
  inodes no name reaches: those the inode bitmap calls free whose records
  still look intact (a file type, a change time, a valid checksum on
  metadata_csum filesystems) — typically deleted files: Linux keeps a
  deleted file's mode, owner, atime and crtime in its record, sets its
  size to 0 and its mtime, ctime and dtime to the deletion — and inodes in
  use that have no name (reserved inodes, open-but-unlinked orphans).

  Removed names: a directory block may still hold a removed entry in the
  slack of the entry before it, as e2fsprogs and Linux before 5.13 leave
  them. Such a name is shown with the inode it names. This is best effort:
  Linux 5.13 and later (and ext4kit itself) wipe a removed entry, so the
  files they delete show without a name; and a name's inode may since
  have been reused by another file.

BODY FILE (the default)
  The Sleuth Kit 3.x format mactime reads:
    MD5|name|inode|mode_as_string|UID|GID|size|atime|mtime|ctime|crtime
  MD5 is 0 (not computed); mode is TSK's (r/rrw-r--r--); times are
  seconds since 1970, with the nanoseconds as a fraction when there are
  any (1700000000.123456789: mactime accepts it and shows the second);
  a missing crtime is 0. Names carrying | % or control characters, or
  bytes that are not UTF-8, have them as %XX, which mactime decodes.
  Names: /path for a name in the tree; \"/path (deleted)\" for a removed
  name whose inode is free, \"/path (deleted-realloc)\" when the inode is in
  use again (by then it holds another file's times); \"<unallocated inode
  N>\" for a free inode with no name; \"<unnamed inode N>\" for an inode in
  use that no name reaches.

JSON LINES (--json)
  One object per line, for the same lines: name (the path, null for an
  inode with no name; name_bytes, hex, when not UTF-8), name_deleted
  (true for a removed name), allocated (the inode bitmap's verdict), ino,
  type, mode, nlink, uid, gid, size, blocks, atime, mtime, ctime, crtime
  (each {\"sec\", \"nsec\"}; crtime null on 128-byte inodes), dtime
  ({\"sec\", \"nsec\"} for a freed inode that records one, else null), rdev,
  target (a symlink's contents, for names in the tree).

A progress line is shown on stderr when it is a terminal.")]
pub struct Args {
    /// JSON Lines instead of a body file.
    #[arg(long)]
    pub json: bool,
    /// The image file.
    pub image: PathBuf,
    /// Only names under this path (its subtree); inodes with no name are
    /// then left out.
    pub path: Option<String>,
}

/// Write the timeline of the image `args` names.
pub fn run(args: &Args, sel: &ImageArgs, budget: usize) -> Result<(), Failure> {
    let image = sel.image(args.image.clone())?;
    let fs = super::open_fs(&image, budget, args.json)?;
    let top = abs(args.path.as_deref().unwrap_or("/"));
    let st = fs.lstat(top.as_bytes()).map_err(|e| Failure::engine(&image, &top, e))?;
    let mut t = Timeline {
        fs: &fs,
        image: &image,
        json: args.json,
        out: BufWriter::new(std::io::stdout().lock()),
        closed: false,
        failed: None,
        named: HashSet::new(),
        removed: HashMap::new(),
        progress: progress(),
        lines: 0,
    };
    t.walk(top.into_bytes(), st);
    // Without PATH every inode matters; with one, only the records of
    // removed names under it.
    if args.path.is_none() || !t.removed.is_empty() {
        t.scan_tables(args.path.is_none())?;
    }
    t.progress.finish_and_clear();
    let _ = t.out.flush();
    t.failed.map_or(Ok(()), Err)
}

/// A spinner with counts on stderr, drawn only when stderr is a terminal.
fn progress() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// The run's state: where lines go and what has been seen.
struct Timeline<'a, W: Write> {
    fs: &'a Fs,
    image: &'a Image,
    json: bool,
    out: W,
    closed: bool,
    failed: Option<Failure>,
    /// Inodes some name of the tree reached.
    named: HashSet<u32>,
    /// Removed names found in directory blocks, by the inode they name.
    removed: HashMap<u32, Vec<Vec<u8>>>,
    progress: ProgressBar,
    lines: u64,
}

/// What one line says besides the inode's attributes.
struct Line<'n> {
    /// The path, or `None` for an inode no name reaches.
    name: Option<&'n [u8]>,
    name_deleted: bool,
    allocated: bool,
    /// `i_dtime` of a freed inode (0: none).
    dtime: u32,
}

impl<W: Write> Timeline<'_, W> {
    /// The tree under `top` (whose attributes are `st`): a line per name,
    /// depth first in name order, and the removed names of each directory.
    fn walk(&mut self, top: Vec<u8>, st: Stat) {
        self.named.insert(st.ino);
        self.emit_named(&top, &st);
        if st.ftype != FileType::Directory {
            return;
        }
        let mut seen = HashSet::new();
        let mut stack = vec![(top, st.ino)];
        while let Some((dir, ino)) = stack.pop() {
            if self.closed {
                return;
            }
            // A directory met twice (a damaged image's loop) is read once.
            if !seen.insert(ino) {
                continue;
            }
            let mut entries = match self.fs.read_dir(ino) {
                Ok(v) => v,
                Err(e) => {
                    self.fail(Failure::engine(self.image, &String::from_utf8_lossy(&dir), e));
                    continue;
                }
            };
            entries.retain(|e| e.name != b"." && e.name != b"..");
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            let mut subdirs = Vec::new();
            for e in entries {
                let path = super::child_path(&dir, &e.name);
                match self.fs.lstat(e.ino) {
                    Ok(s) => {
                        self.named.insert(e.ino);
                        self.emit_named(&path, &s);
                        if s.ftype == FileType::Directory {
                            subdirs.push((path, e.ino));
                        }
                    }
                    Err(err) => self.fail(Failure::engine(self.image, &String::from_utf8_lossy(&path), err)),
                }
            }
            match self.fs.deleted_entries(ino) {
                Ok(v) => {
                    for e in v {
                        self.removed
                            .entry(e.ino)
                            .or_default()
                            .push(super::child_path(&dir, &e.name));
                    }
                }
                Err(e) => self.fail(Failure::engine(self.image, &String::from_utf8_lossy(&dir), e)),
            }
            stack.extend(subdirs.into_iter().rev());
        }
    }

    /// A name of the tree.
    fn emit_named(&mut self, path: &[u8], s: &Stat) {
        let target = if s.ftype == FileType::Symlink {
            self.fs.read_link(s.ino).ok()
        } else {
            None
        };
        let line = Line {
            name: Some(path),
            name_deleted: false,
            allocated: true,
            dtime: 0,
        };
        self.emit(&line, s, target.as_deref());
    }

    /// The inode tables: the records of removed names, and with `unnamed`
    /// the inodes no name reached.
    fn scan_tables(&mut self, unnamed: bool) -> Result<(), Failure> {
        let fs = self.fs;
        let total = fs.info().inodes;
        for (n, r) in fs.inode_table().enumerate() {
            if self.closed {
                break;
            }
            let r = r.map_err(|e| Failure::image(self.image, e))?;
            if n.is_multiple_of(4096) {
                self.progress.set_message(format!(
                    "{} lines; inode table: inode {} of {total}",
                    self.lines,
                    r.ino()
                ));
            }
            let allocated = r.in_use().unwrap_or(r.stat().nlink > 0);
            if !allocated && !r.looks_intact() {
                continue;
            }
            if let Some(names) = self.removed.remove(&r.ino()) {
                for n in names {
                    let mut shown = n.clone();
                    shown.extend_from_slice(if allocated {
                        b" (deleted-realloc)"
                    } else {
                        b" (deleted)"
                    });
                    self.emit_record(&r, Some(if self.json { &n } else { &shown }), true, allocated);
                }
            } else if unnamed && !self.named.contains(&r.ino()) && r.looks_intact() {
                let shown = if allocated {
                    format!("<unnamed inode {}>", r.ino())
                } else {
                    format!("<unallocated inode {}>", r.ino())
                };
                let name = (!self.json).then_some(shown.as_bytes());
                self.emit_record(&r, name, false, allocated);
            }
        }
        Ok(())
    }

    fn emit_record(&mut self, r: &TableInode, name: Option<&[u8]>, name_deleted: bool, allocated: bool) {
        let line = Line {
            name,
            name_deleted,
            allocated,
            dtime: if allocated { 0 } else { r.dtime() },
        };
        self.emit(&line, r.stat(), None);
    }

    /// Write one line: a body-file line, or a JSON object.
    fn emit(&mut self, l: &Line<'_>, s: &Stat, target: Option<&[u8]>) {
        if self.closed {
            return;
        }
        let ok = if self.json {
            let mut m = Map::new();
            match l.name {
                Some(n) => json::put_bytes(&mut m, "name", n),
                None => {
                    m.insert("name".into(), Value::Null);
                }
            }
            m.insert("name_deleted".into(), l.name_deleted.into());
            m.insert("allocated".into(), l.allocated.into());
            json::put_inode(&mut m, s, target);
            let dtime = if l.dtime != 0 {
                json::time(Timestamp {
                    sec: l.dtime.into(),
                    nsec: 0,
                })
            } else {
                Value::Null
            };
            m.insert("dtime".into(), dtime);
            json::write_line(&mut self.out, &Value::Object(m))
        } else {
            let name = l.name.unwrap_or_default();
            writeln!(self.out, "{}", bodyfile::line(name, s)).is_ok()
        };
        if !ok {
            self.closed = true; // stdout went away: stop quietly
        }
        self.lines += 1;
        if self.lines.is_multiple_of(4096) {
            self.progress.set_message(format!("{} lines", self.lines));
        }
    }

    /// Report a failure now and go on; the command fails at its end.
    fn fail(&mut self, f: Failure) {
        let json = self.json;
        let f = self.progress.suspend(|| f.reported(json));
        self.failed.get_or_insert(f);
    }
}
