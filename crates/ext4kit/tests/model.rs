//! Model-based test: several threads apply random operation sequences to
//! one image at once, each checked op by op against an in-memory model of
//! the tree (same errno, same outcome); at the end the whole tree as we
//! read it, as `e2fsck -fn` judges it and as the kernel reads it must equal
//! the model.
//!
//! Each thread works in its own directory (`/tN`) and also in two shared
//! directories (`/shared-a`, `/shared-b`) with names only it uses, so the
//! final tree is deterministic while the threads contend for the shared
//! directories' locks, the allocators and the same metadata blocks.
//!
//! `EXT4KIT_MODEL_SEED=N` replays one seed; `EXT4KIT_MODEL_OPS=N` sets the
//! operations per thread (default 1500).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit::RenameFlags;
use ext4kit::{Cred, Errno, FileType, Fs, OpenOptions};
use ext4kit_testkit::TestRng;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir,
    File(Vec<u8>),
    Link(Vec<u8>),
}

/// The model: absolute path -> node. Hard links are modelled as separate
/// paths with equal contents plus a link-group id for nlink checks.
#[derive(Debug, Default, Clone)]
struct Model {
    nodes: BTreeMap<String, (Node, u64)>,
    next_group: u64,
}

impl Model {
    fn parent(p: &str) -> &str {
        match p.rfind('/') {
            Some(0) => "/",
            Some(i) => &p[..i],
            None => "/",
        }
    }
    fn exists(&self, p: &str) -> bool {
        p == "/" || self.nodes.contains_key(p)
    }
    fn is_dir(&self, p: &str) -> bool {
        p == "/" || matches!(self.nodes.get(p), Some((Node::Dir, _)))
    }
    fn children(&self, p: &str) -> Vec<String> {
        let pre = if p == "/" { "/".to_string() } else { format!("{p}/") };
        self.nodes
            .keys()
            .filter(|k| k.starts_with(&pre) && !k[pre.len()..].contains('/'))
            .cloned()
            .collect()
    }
    fn group_size(&self, g: u64) -> u64 {
        self.nodes
            .values()
            .filter(|(n, gg)| *gg == g && !matches!(n, Node::Dir))
            .count() as u64
    }
    fn new_group(&mut self) -> u64 {
        self.next_group += 1;
        self.next_group
    }
    /// Move `from` (and its subtree) to `to`.
    fn mv(&mut self, from: &str, to: &str) {
        let moved: Vec<(String, (Node, u64))> = self
            .nodes
            .iter()
            .filter(|(k, _)| *k == from || k.starts_with(&format!("{from}/")))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, _) in &moved {
            self.nodes.remove(k);
        }
        for (k, v) in moved {
            self.nodes.insert(format!("{to}{}", &k[from.len()..]), v);
        }
    }
}

fn content(rng: &mut TestRng) -> Vec<u8> {
    let n = match rng.next_u64() % 4 {
        0 => 0,
        1 => (rng.next_u64() % 100) as usize,
        2 => (rng.next_u64() % 5000) as usize,
        _ => (rng.next_u64() % 40_000) as usize,
    };
    let salt = rng.next_u64() as u8;
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt)).collect()
}

/// Pick a random existing path under `roots` in the model (or a fresh name).
fn pick(m: &Model, rng: &mut TestRng, roots: &[&str], tag: &str) -> String {
    let cands: Vec<&String> = m
        .nodes
        .keys()
        .filter(|k| roots.iter().any(|r| k.starts_with(&format!("{r}/")) && k.contains(tag)))
        .collect();
    if !cands.is_empty() && !rng.next_u64().is_multiple_of(3) {
        return cands[(rng.next_u64() % cands.len() as u64) as usize].clone();
    }
    // A new name in an existing directory.
    let dirs: Vec<String> = m
        .nodes
        .iter()
        .filter(|(k, (n, _))| *n == Node::Dir && roots.iter().any(|r| *k == r || k.starts_with(&format!("{r}/"))))
        .map(|(k, _)| k.clone())
        .collect();
    let d = if dirs.is_empty() {
        roots[0].to_string()
    } else {
        dirs[(rng.next_u64() % dirs.len() as u64) as usize].clone()
    };
    format!("{d}/{tag}{}", rng.next_u64() % 40)
}

fn expect<T: std::fmt::Debug>(what: &str, got: ext4kit::Result<T>, want: Result<(), Errno>) {
    match (&got, want) {
        (Ok(_), Ok(())) => {}
        (Err(e), Err(w)) if e.errno() == w => {}
        _ => panic!("{what}: got {got:?}, the model expected {want:?}"),
    }
}

/// Apply one random operation to `fs` and the model.
fn step(fs: &Fs, m: &mut Model, rng: &mut TestRng, roots: &[&str], tag: &str) {
    let root = Cred::root();
    let a = pick(m, rng, roots, tag);
    let b = pick(m, rng, roots, tag);
    let pa = Model::parent(&a).to_string();
    let pb = Model::parent(&b).to_string();
    match rng.next_u64() % 10 {
        0 | 1 => {
            // create with content
            let data = content(rng);
            let want = if m.exists(&a) {
                Err(Errno::EEXIST)
            } else if !m.is_dir(&pa) {
                Err(Errno::ENOTDIR)
            } else {
                Ok(())
            };
            expect(
                &format!("write_file {a}"),
                fs.write_file(a.as_bytes(), &data, 0o644, 0, 0),
                want,
            );
            if want.is_ok() {
                let g = m.new_group();
                m.nodes.insert(a, (Node::File(data), g));
            }
        }
        2 => {
            let want = if m.exists(&a) { Err(Errno::EEXIST) } else { Ok(()) };
            expect(&format!("mkdir {a}"), fs.mkdir(a.as_bytes(), 0o755, &root), want);
            if want.is_ok() {
                m.nodes.insert(a, (Node::Dir, 0));
            }
        }
        3 => {
            let want = match m.nodes.get(&a) {
                None => Err(Errno::ENOENT),
                Some((Node::Dir, _)) => Err(Errno::EISDIR),
                _ => Ok(()),
            };
            expect(&format!("unlink {a}"), fs.unlink(a.as_bytes(), &root), want);
            if want.is_ok() {
                m.nodes.remove(&a);
            }
        }
        4 => {
            let want = match m.nodes.get(&a) {
                None => Err(Errno::ENOENT),
                Some((Node::Dir, _)) if !m.children(&a).is_empty() => Err(Errno::ENOTEMPTY),
                Some((Node::Dir, _)) => Ok(()),
                _ => Err(Errno::ENOTDIR),
            };
            expect(&format!("rmdir {a}"), fs.rmdir(a.as_bytes(), &root), want);
            if want.is_ok() {
                m.nodes.remove(&a);
            }
        }
        5 => {
            let target = format!("target-{}", rng.next_u64() % 1000).repeat(1 + (rng.next_u64() % 8) as usize);
            let want = if m.exists(&a) { Err(Errno::EEXIST) } else { Ok(()) };
            expect(
                &format!("symlink {a}"),
                fs.symlink(target.as_bytes(), a.as_bytes(), 0, 0),
                want,
            );
            if want.is_ok() {
                let g = m.new_group();
                m.nodes.insert(a, (Node::Link(target.into_bytes()), g));
            }
        }
        6 => {
            // The kernel's order: the source must exist, then the new name
            // must not (filename_create), then no directories (vfs_link).
            let want = match (m.nodes.get(&a), m.exists(&b)) {
                (None, _) => Err(Errno::ENOENT),
                (_, true) => Err(Errno::EEXIST),
                (Some((Node::Dir, _)), _) => Err(Errno::EPERM),
                _ => Ok(()),
            };
            expect(
                &format!("link {a} {b}"),
                fs.link(a.as_bytes(), b.as_bytes(), &root),
                want,
            );
            if want.is_ok() {
                let v = m.nodes[&a].clone();
                m.nodes.insert(b, v);
            }
        }
        _ => {
            let exchange = rng.next_u64().is_multiple_of(4);
            let noreplace = !exchange && rng.next_u64().is_multiple_of(4);
            let flags = RenameFlags { noreplace, exchange };
            let src = m.nodes.get(&a).cloned();
            let dst = m.nodes.get(&b).cloned();
            let same_inode = match (&src, &dst) {
                (Some((n1, g1)), Some((_, g2))) => *g1 != 0 && g1 == g2 && !matches!(n1, Node::Dir),
                _ => false,
            };
            let a_is_dir = matches!(src, Some((Node::Dir, _)));
            let b_is_dir = matches!(dst, Some((Node::Dir, _)));
            let want = if src.is_none() {
                Err(Errno::ENOENT)
            } else if !m.is_dir(&pb) {
                Err(Errno::ENOTDIR)
            } else if exchange && dst.is_none() {
                Err(Errno::ENOENT)
            } else if noreplace && dst.is_some() {
                Err(Errno::EEXIST)
            } else if a == b || same_inode {
                Ok(())
            } else if a_is_dir && (b.starts_with(&format!("{a}/"))) {
                // lock_rename's trap: the source is an ancestor of the target.
                Err(Errno::EINVAL)
            } else if b_is_dir && a.starts_with(&format!("{b}/")) {
                // ... or the target an ancestor of the source.
                Err(if exchange { Errno::EINVAL } else { Errno::ENOTEMPTY })
            } else if !exchange && dst.is_some() && a_is_dir && !b_is_dir {
                Err(Errno::ENOTDIR)
            } else if !exchange && dst.is_some() && !a_is_dir && b_is_dir {
                Err(Errno::EISDIR)
            } else if !exchange && b_is_dir && !m.children(&b).is_empty() {
                Err(Errno::ENOTEMPTY)
            } else {
                Ok(())
            };
            expect(
                &format!("rename {a} {b} {flags:?}"),
                fs.rename(a.as_bytes(), b.as_bytes(), flags, &root),
                want,
            );
            if want.is_ok() && a != b && !same_inode {
                if exchange {
                    let tmp = format!("{a}.swap-tmp");
                    m.mv(&a, &tmp);
                    m.mv(&b, &a);
                    m.mv(&tmp, &b);
                } else {
                    if dst.is_some() {
                        m.nodes.remove(&b);
                    }
                    m.mv(&a, &b);
                }
            }
        }
    }
}

fn walk(fs: &Fs, dir: &str, out: &mut BTreeMap<String, (Node, u64)>) {
    for e in fs.read_dir(dir.as_bytes()).unwrap() {
        if e.name == b"." || e.name == b".." || e.name == b"lost+found" {
            continue;
        }
        let p = format!("{}/{}", dir.trim_end_matches('/'), String::from_utf8_lossy(&e.name));
        let st = fs.lstat(p.as_bytes()).unwrap();
        let n = match st.ftype {
            FileType::Directory => Node::Dir,
            FileType::Symlink => Node::Link(fs.read_link(p.as_bytes()).unwrap()),
            _ => {
                let f = fs.open(p.as_bytes(), Default::default()).unwrap();
                let mut b = vec![0u8; st.size as usize];
                assert_eq!(f.pread(fs, 0, &mut b).unwrap(), b.len());
                Node::File(b)
            }
        };
        let is_dir = n == Node::Dir;
        out.insert(p.clone(), (n, st.nlink as u64));
        if is_dir {
            walk(fs, &p, out);
        }
    }
}

fn run_seed(seed: u64, ops: usize, threads: usize) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("model");
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join(format!("seed-{seed}.img"));
    let _ = std::fs::remove_file(&img);
    ext4kit_testkit::run_ok(
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-b", "1024", "-N", "8192"])
            .arg(&img)
            .arg("64M"),
        &[0],
    )
    .unwrap();
    let fs = Fs::open_image(
        &img,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap();
    let root = Cred::root();
    fs.mkdir(b"/shared-a", 0o755, &root).unwrap();
    fs.mkdir(b"/shared-b", 0o755, &root).unwrap();
    let models: Vec<Model> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let fs = &fs;
                s.spawn(move || {
                    let mut rng = TestRng::new(seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    let mut m = Model::default();
                    let own = format!("/t{t}");
                    fs.mkdir(own.as_bytes(), 0o755, &Cred::root()).unwrap();
                    m.nodes.insert(own.clone(), (Node::Dir, 0));
                    // The shared directories are parents for new names only:
                    // their names never carry this thread's tag, so they are
                    // never picked as operands.
                    m.nodes.insert("/shared-a".into(), (Node::Dir, 0));
                    m.nodes.insert("/shared-b".into(), (Node::Dir, 0));
                    let tag = format!("n{t}-");
                    for _ in 0..ops {
                        step(fs, &mut m, &mut rng, &[&own, "/shared-a", "/shared-b"], &tag);
                    }
                    m
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    fs.sync().unwrap();
    drop(fs);
    // The union of the per-thread models is the whole tree.
    let mut want: BTreeMap<String, (Node, u64)> = BTreeMap::new();
    want.insert("/shared-a".into(), (Node::Dir, 0));
    want.insert("/shared-b".into(), (Node::Dir, 0));
    for m in &models {
        for (k, (n, g)) in &m.nodes {
            if k.starts_with("/shared-") && !k[1..].contains('/') {
                continue;
            }
            let nl = match n {
                Node::Dir => 2 + m.children(k).iter().filter(|c| m.is_dir(c)).count() as u64,
                _ => m.group_size(*g),
            };
            want.insert(k.clone(), (n.clone(), nl));
        }
    }
    for shared in ["/shared-a", "/shared-b"] {
        let subdirs = want
            .iter()
            .filter(|(k, (n, _))| *n == Node::Dir && Model::parent(k) == shared)
            .count() as u64;
        want.get_mut(shared).unwrap().1 = 2 + subdirs;
    }
    // The operation mix must leave a real tree behind, or the comparison
    // below proves little.
    let files = want.values().filter(|(n, _)| matches!(n, Node::File(_))).count();
    let dirs = want.values().filter(|(n, _)| *n == Node::Dir).count();
    assert!(
        files >= 4 * threads && dirs >= 2 * threads,
        "seed {seed}: only {files} files and {dirs} directories survived {ops} operations per thread"
    );
    eprintln!(
        "seed {seed}: {} entries ({files} files, {dirs} directories) after {ops} ops x {threads} threads",
        want.len()
    );
    let fs = Fs::open_image(&img, &OpenOptions::default()).unwrap();
    let mut got = BTreeMap::new();
    walk(&fs, "/", &mut got);
    drop(fs);
    if got != want {
        let only_got: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        let only_want: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        let differ: Vec<_> = got
            .iter()
            .filter(|(k, v)| want.get(*k).is_some_and(|w| w != *v))
            .map(|(k, v)| (k, &v.1, &want[k].1))
            .collect();
        panic!("seed {seed}: tree differs from the model\nonly on disk: {only_got:?}\nonly in model: {only_want:?}\ndiffer (path, nlink got, nlink want): {differ:?}");
    }
    let out = Command::new("e2fsck").arg("-fn").arg(&img).output().unwrap();
    assert!(
        out.status.success(),
        "seed {seed}: e2fsck -fn not clean:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    kernel_agrees(&img, &want);
    let _ = std::fs::remove_file(&img);
}

fn kernel_agrees(img: &Path, want: &BTreeMap<String, (Node, u64)>) {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("the kernel cross-check needs a loop mount ({e}); CI runs as root");
    }
    let mnt = img.with_extension("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = ext4kit_testkit::LoopMount::mount(img, &mnt, "ext4", true).unwrap();
    let mut got = BTreeMap::new();
    fn walk_k(root: &Path, dir: &Path, out: &mut BTreeMap<String, (Node, u64)>) {
        use std::os::unix::fs::MetadataExt;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = format!("/{}", p.strip_prefix(root).unwrap().display());
            if rel == "/lost+found" {
                continue;
            }
            let md = std::fs::symlink_metadata(&p).unwrap();
            let n = if md.is_dir() {
                Node::Dir
            } else if md.file_type().is_symlink() {
                Node::Link(std::fs::read_link(&p).unwrap().into_os_string().into_encoded_bytes())
            } else {
                Node::File(std::fs::read(&p).unwrap())
            };
            let d = n == Node::Dir;
            out.insert(rel, (n, md.nlink()));
            if d {
                walk_k(root, &p, out);
            }
        }
    }
    walk_k(m.path(), m.path(), &mut got);
    m.unmount().unwrap();
    assert!(&got == want, "the kernel's tree differs from the model");
}

#[test]
fn random_operations_from_four_threads_match_the_model() {
    let ops = std::env::var("EXT4KIT_MODEL_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let seeds: Vec<u64> = match std::env::var("EXT4KIT_MODEL_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(s) => vec![s],
        None => vec![1, 2, 3],
    };
    for s in seeds {
        run_seed(s, ops, 4);
    }
}
