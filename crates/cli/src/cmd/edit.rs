//! Namespace edits on an image without mounting it: `mkdir`, `rm`, `mv`,
//! `ln`. Each opens the image read-write, applies every operation through
//! the library (so the same locking, allocation and checks as any other
//! caller), writes the superblock and flushes, and reports each failure
//! with the image, the path and the cause. Operations run in the order
//! given; one that fails does not stop the rest, but the exit status is 1.

use std::path::Path;
use std::sync::Arc;

use ext4kit::vfs::namespace::RenameFlags;
use ext4kit::{Cred, Errno, FileType, Fs, OpenOptions};

/// Open an image for writing, printing the engine's warnings; refuse if
/// it could only be opened read-only (a feature we cannot write, or a
/// journal that needs recovery).
pub fn open_rw(image: &Path, budget: usize) -> Result<Arc<Fs>, String> {
    let fs = Fs::open_image(
        image,
        &OpenOptions {
            read_only: false,
            cache_budget: budget,
        },
    )
    .map_err(|e| format!("{}: {e}", image.display()))?;
    for w in fs.warnings() {
        eprintln!("ext4kit: warning: {}: {w}", image.display());
    }
    if fs.vol.read_only {
        return Err(format!(
            "{}: cannot be modified (see the warning above)",
            image.display()
        ));
    }
    Ok(fs)
}

/// Run `ops` and then sync; the first error message is returned after
/// every op ran (others are printed as they happen).
/// One edit, run against the open image.
type Op<'a> = Box<dyn FnOnce(&Fs) -> Result<(), String> + 'a>;

fn apply(image: &Path, fs: &Fs, ops: Vec<Op<'_>>) -> Result<(), String> {
    let mut first: Option<String> = None;
    for op in ops {
        if let Err(e) = op(fs) {
            if first.is_some() {
                eprintln!("ext4kit: {e}");
            } else {
                first = Some(e);
            }
        }
    }
    fs.sync()
        .map_err(|e| format!("{}: writing back: {e}", image.display()))?;
    first.map_or(Ok(()), Err)
}

fn abs(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    }
}

/// `ext4kit mkdir [-p] [-m MODE] IMAGE PATH...`
pub fn mkdir(image: &Path, paths: &[String], parents: bool, mode: u16, budget: usize) -> Result<(), String> {
    let fs = open_rw(image, budget)?;
    let root = Cred::root();
    let ops = paths
        .iter()
        .map(|p| {
            let p = abs(p);
            let root = &root;
            Box::new(move |fs: &Fs| -> Result<(), String> {
                if !parents {
                    return fs
                        .mkdir(p.as_bytes(), mode, root)
                        .map(|_| ())
                        .map_err(|e| super::err(image, &p, e));
                }
                let mut cur = String::new();
                for comp in p.split('/').filter(|c| !c.is_empty()) {
                    cur.push('/');
                    cur.push_str(comp);
                    match fs.mkdir(cur.as_bytes(), mode, root) {
                        Ok(_) => {}
                        Err(e) if e.errno() == Errno::EEXIST => {
                            let st = fs.stat(cur.as_bytes()).map_err(|e| super::err(image, &cur, e))?;
                            if st.ftype != FileType::Directory {
                                return Err(format!("{}: {cur}: exists and is not a directory", image.display()));
                            }
                        }
                        Err(e) => return Err(super::err(image, &cur, e)),
                    }
                }
                Ok(())
            }) as Op<'_>
        })
        .collect();
    apply(image, &fs, ops)
}

/// `ext4kit rm [-r] [-f] IMAGE PATH...`
pub fn rm(image: &Path, paths: &[String], recursive: bool, force: bool, budget: usize) -> Result<(), String> {
    let fs = open_rw(image, budget)?;
    let root = Cred::root();
    let ops = paths
        .iter()
        .map(|p| {
            let p = abs(p);
            let root = &root;
            Box::new(move |fs: &Fs| -> Result<(), String> {
                if p.trim_end_matches('/').is_empty() {
                    return Err(format!("{}: refusing to remove the root directory", image.display()));
                }
                let st = match fs.lstat(p.as_bytes()) {
                    Ok(st) => st,
                    Err(e) if force && e.errno() == Errno::ENOENT => return Ok(()),
                    Err(e) => return Err(super::err(image, &p, e)),
                };
                if st.ftype != FileType::Directory {
                    return fs.unlink(p.as_bytes(), root).map_err(|e| super::err(image, &p, e));
                }
                if !recursive {
                    return Err(format!("{}: {p}: is a directory (use -r)", image.display()));
                }
                remove_tree(fs, &p, root).map_err(|(path, e)| super::err(image, &path, e))
            }) as Op<'_>
        })
        .collect();
    apply(image, &fs, ops)
}

/// Remove a directory and everything below it, depth first, without
/// recursion on the call stack (deep trees cannot overflow it).
fn remove_tree(fs: &Fs, top: &str, cred: &Cred) -> Result<(), (String, ext4kit::Error)> {
    // (path, children already pushed)
    let mut stack: Vec<(String, bool)> = vec![(top.to_string(), false)];
    while let Some((dir, expanded)) = stack.pop() {
        if expanded {
            fs.rmdir(dir.as_bytes(), cred).map_err(|e| (dir.clone(), e))?;
            continue;
        }
        stack.push((dir.clone(), true));
        let entries = fs.read_dir(dir.as_bytes()).map_err(|e| (dir.clone(), e))?;
        for e in entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let child = format!("{}/{}", dir.trim_end_matches('/'), String::from_utf8_lossy(&e.name));
            let st = fs.lstat(child.as_bytes()).map_err(|e| (child.clone(), e))?;
            if st.ftype == FileType::Directory {
                stack.push((child, false));
            } else {
                fs.unlink(child.as_bytes(), cred).map_err(|e| (child.clone(), e))?;
            }
        }
    }
    Ok(())
}

/// `ext4kit mv [-n] IMAGE SRC DEST` (DEST an existing directory: SRC moves
/// into it, keeping its name).
pub fn mv(image: &Path, src: &str, dest: &str, no_clobber: bool, budget: usize) -> Result<(), String> {
    let fs = open_rw(image, budget)?;
    let (src, mut dest) = (abs(src), abs(dest));
    if let Ok(st) = fs.stat(dest.as_bytes()) {
        if st.ftype == FileType::Directory {
            let name = src.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
            if fs.lstat(src.as_bytes()).is_ok_and(|s| s.ino != st.ino) {
                dest = format!("{}/{name}", dest.trim_end_matches('/'));
            }
        }
    }
    let flags = RenameFlags {
        noreplace: no_clobber,
        exchange: false,
    };
    let op = Box::new(move |fs: &Fs| {
        fs.rename(src.as_bytes(), dest.as_bytes(), flags, &Cred::root())
            .map_err(|e| super::err(image, &src, e))
    }) as Op<'_>;
    apply(image, &fs, vec![op])
}

/// `ext4kit ln [-s] IMAGE TARGET LINK`
pub fn ln(image: &Path, target: &str, link: &str, symbolic: bool, budget: usize) -> Result<(), String> {
    let fs = open_rw(image, budget)?;
    let link = abs(link);
    let target = target.to_string();
    let op = Box::new(move |fs: &Fs| {
        if symbolic {
            fs.symlink(target.as_bytes(), link.as_bytes(), 0, 0)
                .map(|_| ())
                .map_err(|e| super::err(image, &link, e))
        } else {
            fs.link(abs(&target).as_bytes(), link.as_bytes(), &Cred::root())
                .map(|_| ())
                .map_err(|e| super::err(image, &link, e))
        }
    }) as Op<'_>;
    apply(image, &fs, vec![op])
}
