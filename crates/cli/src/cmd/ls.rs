//! `ext4kit ls [-l] [-a] [-R] [--json] IMAGE PATH`.
//!
//! Text: one name per line (with `-l`, ls's long format); with `-R` each
//! directory under PATH in turn, depth first in name order as `ls -R`
//! does, each headed by `PATH:` and separated by a blank line. `--json`:
//! JSON Lines, one object per entry, whatever the directory's size (see
//! README.md, "JSON output").

use std::collections::HashSet;
use std::io::{BufWriter, Write};

use ext4kit::{FileType, Fs};
use serde_json::{Map, Value};

use super::{Failure, Image};
use crate::fmt::{mode_string, time_short};
use crate::json;

/// What to list and how.
#[derive(Debug, Clone, Copy)]
pub struct Listing<'a> {
    /// Directory (or file) inside the image.
    pub path: &'a str,
    /// Long format: the inode's attributes too.
    pub long: bool,
    /// Names beginning with "." too (with "." and "..").
    pub all: bool,
    /// The directories under `path` too.
    pub recursive: bool,
    /// JSON Lines instead of text.
    pub json: bool,
}

/// One name to show: where it is and what it names.
struct Entry {
    name: Vec<u8>,
    path: Vec<u8>,
    ino: u32,
    ftype: Option<FileType>,
}

/// List a directory (or show one non-directory entry).
pub fn run(image: &Image, req: &Listing<'_>, budget: usize) -> Result<(), Failure> {
    let fs = super::open_fs(image, budget, req.json)?;
    let path = req.path;
    let st = fs.stat(path.as_bytes()).map_err(|e| Failure::engine(image, path, e))?;
    let mut out = Output {
        fs: &fs,
        image,
        req,
        w: BufWriter::new(std::io::stdout().lock()),
        failed: None,
        closed: false,
    };
    if st.ftype != FileType::Directory {
        let e = Entry {
            name: path.as_bytes().to_vec(),
            path: path.as_bytes().to_vec(),
            ino: st.ino,
            ftype: Some(st.ftype),
        };
        out.entry(&e);
        return out.finish();
    }
    // Depth first, in name order: a directory's entries, then each of its
    // subdirectories in turn (`ls -R`). A directory met twice (a damaged
    // image's loop) is listed once.
    let mut seen = HashSet::new();
    let mut stack = vec![(path.as_bytes().to_vec(), st.ino)];
    let mut first = true;
    while let Some((dir, ino)) = stack.pop() {
        if out.closed {
            break;
        }
        if !seen.insert(ino) {
            continue;
        }
        let entries = match fs.read_dir(ino) {
            Ok(v) => v,
            Err(e) if first => return Err(Failure::engine(image, path, e)),
            Err(e) => {
                out.fail(Failure::engine(image, &String::from_utf8_lossy(&dir), e));
                continue;
            }
        };
        let mut rows: Vec<Entry> = entries
            .into_iter()
            .filter(|e| req.all || !e.name.starts_with(b"."))
            .map(|e| Entry {
                path: super::child_path(&dir, &e.name),
                name: e.name,
                ino: e.ino,
                ftype: e.file_type,
            })
            .collect();
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        if req.recursive && !req.json {
            let sep = if first { "" } else { "\n" };
            out.text(&format!("{sep}{}:", String::from_utf8_lossy(&dir)));
        }
        first = false;
        for e in &rows {
            out.entry(e);
        }
        if req.recursive {
            for e in rows.into_iter().rev() {
                if e.ftype == Some(FileType::Directory) && e.name != b"." && e.name != b".." {
                    stack.push((e.path, e.ino));
                }
            }
        }
    }
    out.finish()
}

/// Where the listing goes, and how it has gone so far.
struct Output<'a, W: Write> {
    fs: &'a Fs,
    image: &'a Image,
    req: &'a Listing<'a>,
    w: W,
    /// The first failure met on the way (printed when met).
    failed: Option<Failure>,
    /// stdout went away (piped into head): stop quietly.
    closed: bool,
}

impl<W: Write> Output<'_, W> {
    fn text(&mut self, line: &str) {
        if !self.closed && writeln!(self.w, "{line}").is_err() {
            self.closed = true;
        }
    }

    fn fail(&mut self, f: Failure) {
        let f = f.reported(self.req.json);
        self.failed.get_or_insert(f);
    }

    /// Show one entry (its attributes read for -l); a name whose inode
    /// cannot be read is reported and left out.
    fn entry(&mut self, e: &Entry) {
        let stat = if self.req.long {
            match self.fs.stat(e.ino) {
                Ok(s) => Some(s),
                Err(err) => {
                    self.fail(Failure::engine(self.image, &String::from_utf8_lossy(&e.path), err));
                    return;
                }
            }
        } else {
            None
        };
        let target = match &stat {
            Some(s) if s.ftype == FileType::Symlink => self.fs.read_link(e.ino).ok(),
            _ => None,
        };
        if self.req.json {
            let mut m = Map::new();
            json::put_bytes(&mut m, "name", &e.name);
            json::put_bytes(&mut m, "path", &e.path);
            m.insert("ino".into(), e.ino.into());
            m.insert(
                "type".into(),
                e.ftype.map_or(Value::Null, |t| json::type_name(t).into()),
            );
            if let Some(s) = &stat {
                json::put_inode(&mut m, s, target.as_deref());
            }
            if !self.closed && !json::write_line(&mut self.w, &Value::Object(m)) {
                self.closed = true;
            }
            return;
        }
        let shown = String::from_utf8_lossy(&e.name);
        let line = match &stat {
            None => shown.into_owned(),
            Some(s) => {
                let mut line = format!(
                    "{} {:>3} {:>5} {:>5} {:>10} {} {}",
                    mode_string(s.ftype, s.mode),
                    s.nlink,
                    s.uid,
                    s.gid,
                    if matches!(s.ftype, FileType::CharDevice | FileType::BlockDevice) {
                        format!("{}, {}", s.rdev.0, s.rdev.1)
                    } else {
                        s.size.to_string()
                    },
                    time_short(s.mtime),
                    shown
                );
                if let Some(t) = &target {
                    line.push_str(" -> ");
                    line.push_str(&String::from_utf8_lossy(t));
                }
                line
            }
        };
        self.text(&line);
    }

    fn finish(mut self) -> Result<(), Failure> {
        let _ = self.w.flush();
        self.failed.map_or(Ok(()), Err)
    }
}
