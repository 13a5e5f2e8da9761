//! `ext4kit ls [-l] [-a] IMAGE PATH`.

use super::Image;
use std::io::Write;

use ext4kit::FileType;

use crate::fmt::{mode_string, time_short};

/// List a directory (or show one non-directory entry).
pub fn run(image: &Image, path: &str, long: bool, all: bool, budget: usize) -> Result<(), String> {
    let fs = super::open(image, budget)?;
    let st = fs.stat(path.as_bytes()).map_err(|e| super::err(image, path, e))?;
    let mut rows: Vec<(Vec<u8>, u32)> = if st.ftype == FileType::Directory {
        fs.read_dir(path.as_bytes())
            .map_err(|e| super::err(image, path, e))?
            .into_iter()
            .filter(|e| all || !e.name.starts_with(b"."))
            .map(|e| (e.name, e.ino))
            .collect()
    } else {
        vec![(path.as_bytes().to_vec(), st.ino)]
    };
    rows.sort();
    let out = std::io::stdout();
    let mut out = out.lock();
    let dir = path.trim_end_matches('/');
    for (name, ino) in rows {
        let shown = String::from_utf8_lossy(&name);
        let res = if long {
            match fs.stat(ino) {
                Ok(s) => {
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
                    if s.ftype == FileType::Symlink {
                        if let Ok(t) = fs.read_link(ino) {
                            line.push_str(" -> ");
                            line.push_str(&String::from_utf8_lossy(&t));
                        }
                    }
                    writeln!(out, "{line}")
                }
                Err(e) => {
                    eprintln!("ext4kit: {}: {dir}/{shown}: {e}", image.display());
                    Ok(())
                }
            }
        } else {
            writeln!(out, "{shown}")
        };
        if res.is_err() {
            break; // stdout closed (e.g. piped into head): stop quietly
        }
    }
    Ok(())
}
