//! Namespace edits on an image without mounting it: `mkdir`, `rm`, `mv`,
//! `ln`. Each opens the image read-write, applies every operation through
//! the library (so the same locking, allocation and checks as any other
//! caller), writes the superblock and flushes, and reports each failure
//! with the image, the path and the cause. Operations run in the order
//! given; one that fails does not stop the rest, but the exit status is 1.

use ext4kit::{NewInode, Target};
use std::sync::Arc;

use ext4kit::RenameFlags;
use ext4kit::{Cred, Errno, FileType, Fs, OpenOptions};

use super::Image;

/// Open an image for writing, printing the engine's warnings; refuse if
/// it could only be opened read-only (a feature we cannot write, or a
/// journal that needs recovery).
pub fn open_rw(image: &Image, budget: usize) -> Result<Arc<Fs>, String> {
    image.check_writable()?;
    let location = image.resolve()?;
    let fs = Fs::open_image(
        &image.path,
        &OpenOptions {
            read_only: false,
            cache_budget: budget,
            no_replay: false,
            location,
            disk_format: image.format(),
            any_backing_path: image.any_backing_path(),
            volume: image.volume().map(str::to_string),
            ..Default::default()
        },
    )
    .map_err(|e| format!("{}: {e}", image.display()))?;
    for w in fs.warnings() {
        eprintln!("ext4kit: warning: {}: {w}", image.display());
    }
    if fs.read_only() {
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

fn apply(image: &Image, fs: &Fs, ops: Vec<Op<'_>>) -> Result<(), String> {
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

/// A path inside the image made absolute (a missing leading "/" is allowed).
pub fn abs(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    }
}

/// `ext4kit mkdir [-p] [-m MODE] IMAGE PATH...`
pub fn mkdir(image: &Image, paths: &[String], parents: bool, mode: u16, budget: usize) -> Result<(), String> {
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
                        .create(&NewInode::dir(p.as_bytes()).mode(mode).cred(root))
                        .map(|_| ())
                        .map_err(|e| super::err(image, &p, e));
                }
                let mut cur = String::new();
                for comp in p.split('/').filter(|c| !c.is_empty()) {
                    cur.push('/');
                    cur.push_str(comp);
                    match fs.create(&NewInode::dir(cur.as_bytes()).mode(mode).cred(root)) {
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
pub fn rm(image: &Image, paths: &[String], recursive: bool, force: bool, budget: usize) -> Result<(), String> {
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
    // Paths are bytes: a name need not be UTF-8 (ext4 names are any bytes
    // but '/' and NUL), and a lossy conversion would name another file.
    let shown = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
    // (path, children already pushed)
    let mut stack: Vec<(Vec<u8>, bool)> = vec![(top.as_bytes().to_vec(), false)];
    while let Some((dir, expanded)) = stack.pop() {
        if expanded {
            fs.rmdir(&dir, cred).map_err(|e| (shown(&dir), e))?;
            continue;
        }
        stack.push((dir.clone(), true));
        let entries = fs.read_dir(&dir).map_err(|e| (shown(&dir), e))?;
        let base = dir.strip_suffix(b"/").unwrap_or(&dir);
        for e in entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let mut child = base.to_vec();
            child.push(b'/');
            child.extend_from_slice(&e.name);
            let st = fs.lstat(&child).map_err(|e| (shown(&child), e))?;
            if st.ftype == FileType::Directory {
                stack.push((child, false));
            } else {
                fs.unlink(&child, cred).map_err(|e| (shown(&child), e))?;
            }
        }
    }
    Ok(())
}

/// `ext4kit mv [-n] IMAGE SRC DEST` (DEST an existing directory: SRC moves
/// into it, keeping its name).
pub fn mv(image: &Image, src: &str, dest: &str, no_clobber: bool, budget: usize) -> Result<(), String> {
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
        whiteout: false,
    };
    let op = Box::new(move |fs: &Fs| {
        fs.rename(src.as_bytes(), dest.as_bytes(), flags, &Cred::root())
            .map_err(|e| super::err(image, &src, e))
    }) as Op<'_>;
    apply(image, &fs, vec![op])
}

/// `ext4kit ln [-s] IMAGE TARGET LINK`
pub fn ln(image: &Image, target: &str, link: &str, symbolic: bool, budget: usize) -> Result<(), String> {
    let fs = open_rw(image, budget)?;
    let link = abs(link);
    let target = target.to_string();
    let op = Box::new(move |fs: &Fs| {
        if symbolic {
            fs.create(&NewInode::symlink(link.as_bytes(), target.as_bytes()).owner(0, 0))
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

/// `ext4kit chmod IMAGE MODE PATH...` (octal MODE).
pub fn chmod(image: &Image, mode: u16, paths: &[String], budget: usize) -> Result<(), String> {
    let fs = open_rw(image, budget)?;
    let ops = paths
        .iter()
        .map(|p| {
            let p = abs(p);
            Box::new(move |fs: &Fs| {
                fs.chmod(p.as_bytes(), mode, &Cred::root())
                    .map(|_| ())
                    .map_err(|e| super::err(image, &p, e))
            }) as Op<'_>
        })
        .collect();
    apply(image, &fs, ops)
}

/// Parse "UID", "UID:GID", ":GID" (numeric ids: an image has no passwd of
/// ours to consult).
pub fn parse_owner(s: &str) -> Result<(Option<u32>, Option<u32>), String> {
    let num = |t: &str| -> Result<Option<u32>, String> {
        if t.is_empty() {
            Ok(None)
        } else {
            t.parse::<u32>()
                .map(Some)
                .map_err(|_| format!("\"{t}\" is not a numeric user or group id"))
        }
    };
    match s.split_once(':') {
        Some((u, g)) => Ok((num(u)?, num(g)?)),
        None => Ok((num(s)?, None)),
    }
}

/// `ext4kit chown [-h] IMAGE UID[:GID] PATH...`
pub fn chown(
    image: &Image,
    owner: (Option<u32>, Option<u32>),
    no_deref: bool,
    paths: &[String],
    budget: usize,
) -> Result<(), String> {
    let fs = open_rw(image, budget)?;
    let ops = paths
        .iter()
        .map(|p| {
            let p = abs(p);
            Box::new(move |fs: &Fs| {
                fs.chown(
                    {
                        let t = Target::from(p.as_bytes());
                        if !no_deref {
                            t
                        } else {
                            t.nofollow()
                        }
                    },
                    owner.0,
                    owner.1,
                    &Cred::root(),
                )
                .map(|_| ())
                .map_err(|e| super::err(image, &p, e))
            }) as Op<'_>
        })
        .collect();
    apply(image, &fs, ops)
}

/// `ext4kit touch [-c] [-d SECONDS[.NANOS]] IMAGE PATH...`: set atime and
/// mtime (to now, or the given time), creating missing files unless -c.
pub fn touch(
    image: &Image,
    no_create: bool,
    at: Option<ext4kit::Timestamp>,
    paths: &[String],
    budget: usize,
) -> Result<(), String> {
    use ext4kit::vfs::TimeSet;
    let fs = open_rw(image, budget)?;
    let t = at.map_or(TimeSet::Now, TimeSet::Set);
    let ops = paths
        .iter()
        .map(|p| {
            let p = abs(p);
            Box::new(
                move |fs: &Fs| match fs.utimens(p.as_bytes(), Some(t), Some(t), &Cred::root()) {
                    Ok(_) => Ok(()),
                    Err(e) if e.errno() == Errno::ENOENT && !no_create => {
                        fs.create(&NewInode::file(p.as_bytes()).mode(0o644).owner(0, 0))
                            .map_err(|e| super::err(image, &p, e))?;
                        if at.is_some() {
                            fs.utimens(p.as_bytes(), Some(t), Some(t), &Cred::root())
                                .map_err(|e| super::err(image, &p, e))?;
                        }
                        Ok(())
                    }
                    Err(e) => Err(super::err(image, &p, e)),
                },
            ) as Op<'_>
        })
        .collect();
    apply(image, &fs, ops)
}

/// Parse "SECONDS" or "SECONDS.NANOS" since the epoch (may be negative).
pub fn parse_time(s: &str) -> Result<ext4kit::Timestamp, String> {
    let bad = || format!("\"{s}\" is not a time (seconds since 1970, optionally .nanoseconds)");
    let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
    let sec: i64 = sec.parse().map_err(|_| bad())?;
    let nsec = if frac.is_empty() {
        0
    } else {
        if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        format!("{frac:0<9}").parse::<u32>().map_err(|_| bad())?
    };
    Ok(ext4kit::Timestamp { sec, nsec })
}

/// `ext4kit setfattr IMAGE -n NAME [-v VALUE | -x] PATH...`. VALUE as in
/// setfattr(1): "0x..." hex, "0s..." base64 is not supported, otherwise the
/// text itself (quotes stripped).
pub fn setfattr(
    image: &Image,
    name: &str,
    value: Option<&str>,
    remove: bool,
    paths: &[String],
    budget: usize,
) -> Result<(), String> {
    let fs = open_rw(image, budget)?;
    let value = match value {
        Some(v) => Some(decode_value(v)?),
        None if remove => None,
        None => Some(Vec::new()),
    };
    let ops = paths
        .iter()
        .map(|p| {
            let p = abs(p);
            let value = value.clone();
            Box::new(move |fs: &Fs| {
                let r = match &value {
                    Some(v) => fs.setxattr(
                        Target::path(p.as_bytes()).nofollow(),
                        name.as_bytes(),
                        v,
                        0,
                        &Cred::root(),
                    ),
                    None => fs.removexattr(Target::path(p.as_bytes()).nofollow(), name.as_bytes(), &Cred::root()),
                };
                r.map_err(|e| super::err(image, &p, e))
            }) as Op<'_>
        })
        .collect();
    apply(image, &fs, ops)
}

fn decode_value(v: &str) -> Result<Vec<u8>, String> {
    if let Some(hex) = v.strip_prefix("0x") {
        if hex.len() % 2 != 0 {
            return Err(format!("\"{v}\": odd number of hex digits"));
        }
        return (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| format!("\"{v}\": not hex")))
            .collect();
    }
    let t = v.strip_prefix('"').and_then(|x| x.strip_suffix('"')).unwrap_or(v);
    Ok(t.as_bytes().to_vec())
}

/// `ext4kit truncate -s SIZE IMAGE PATH...`: set file sizes (shrinking
/// frees blocks; growing leaves a hole), creating missing files unless -c.
pub fn truncate(image: &Image, size: u64, no_create: bool, paths: &[String], budget: usize) -> Result<(), String> {
    let fs = open_rw(image, budget)?;
    let ops = paths
        .iter()
        .map(|p| {
            let p = abs(p);
            Box::new(move |fs: &Fs| {
                let st = match fs.stat(p.as_bytes()) {
                    Ok(st) => st,
                    Err(e) if e.errno() == Errno::ENOENT && !no_create => fs
                        .create(&NewInode::file(p.as_bytes()).mode(0o644).owner(0, 0))
                        .map_err(|e| super::err(image, &p, e))?,
                    Err(e) => return Err(super::err(image, &p, e)),
                };
                let inode = fs.inode(st.ino).map_err(|e| super::err(image, &p, e))?;
                fs.truncate_inode(&inode, size, &ext4kit::Caller::root())
                    .map(|_| ())
                    .map_err(|e| super::err(image, &p, e))
            }) as Op<'_>
        })
        .collect();
    apply(image, &fs, ops)
}
