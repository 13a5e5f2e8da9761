//! Putting a source's entries into an open image, through the library's
//! public calls (create, link, write, setxattr, setattr, unlink) like any
//! other caller, as root: owners are whatever the [`Owners`] rule makes of
//! the source's, whoever runs the build.
//!
//! Per entry: create with owner and mode, contents (holes stay holes),
//! xattrs, then times. A directory's times are set once every source is
//! in, since each name added below it moves its mtime. A name that exists
//! already is handled as `cp -a` and tar extraction handle it: a directory
//! onto a directory merges (the existing one takes the new owner, mode and
//! xattrs); a non-directory onto a non-directory replaces it (unlinked
//! first, so its other hard links keep the old contents); a directory onto
//! a non-directory, or the reverse, is an error. Parents a source leaves
//! out (a tar without directory members) are made as root's, mode 0755,
//! as tar makes them. OCI whiteouts remove what the earlier layers put
//! there; an opaque directory keeps only what its own layer put in it.
//!
//! Any failure stops the build with the source and the entry named:
//! nothing is skipped in silence.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use ext4kit::vfs::{SetAttr, TimeSet};
use ext4kit::{Cred, Errno, FileType, Fs, NewInode, NodeKind, Target, Timestamp, WriteRequest};

use crate::entry::{Entry, EntryKind, EntryPath, FileData, Meta};
use crate::error::{Error, Result};
use crate::file_contexts::FileContexts;
use crate::fs_config::FsConfig;
use crate::owners::Owners;
use crate::source::{Sink, Source};

/// Largest write handed to the library at once.
const CHUNK: usize = 1 << 20;

/// Where a source's root lands in the image. The paths are the image's
/// absolute paths of the directories named, which `--file-contexts` and
/// `--fs-config` match against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement<'a> {
    /// Into this existing directory (`mkfs -d`, `cp -a SRC/. DEST`): it
    /// takes the root entry's owner, mode, xattrs and times.
    Into {
        /// The directory's inode.
        dir: u32,
        /// Its path in the image (`/` for the root).
        path: &'a [u8],
    },
    /// As this name in this directory (`cp -a SRC DEST/NAME`).
    Named {
        /// The directory it goes in.
        parent: u32,
        /// That directory's path in the image.
        parent_path: &'a [u8],
        /// Its name there.
        name: &'a [u8],
    },
}

impl Placement<'_> {
    /// The image path the source's root becomes.
    fn base(&self) -> Vec<u8> {
        let join = |dir: &[u8], name: &[u8]| {
            let mut v = dir.trim_end_matches_slash().to_vec();
            v.push(b'/');
            v.extend_from_slice(name);
            v
        };
        match *self {
            Placement::Into { path, .. } if path.trim_end_matches_slash().is_empty() => b"/".to_vec(),
            Placement::Into { path, .. } => path.trim_end_matches_slash().to_vec(),
            Placement::Named { parent_path, name, .. } => join(parent_path, name),
        }
    }
}

/// `trim_end_matches('/')` for bytes.
trait TrimSlash {
    fn trim_end_matches_slash(&self) -> &[u8];
}

impl TrimSlash for [u8] {
    fn trim_end_matches_slash(&self) -> &[u8] {
        let mut end = self.len();
        while end > 0 && self[end - 1] == b'/' {
            end -= 1;
        }
        &self[..end]
    }
}

/// What a build has done so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Entries created, linked or removed.
    pub entries: u64,
    /// File bytes written.
    pub bytes: u64,
}

/// What a build makes of the sources' owners, modes and labels: the
/// request a [`Populator`] is made with.
#[derive(Debug, Default)]
pub struct Rules {
    /// Who owns the files in the image.
    pub owners: Owners,
    /// SELinux labels, when given: every file's `security.selinux` is
    /// replaced (or removed where the file says none).
    pub file_contexts: Option<FileContexts>,
    /// Android owners, modes and capabilities of the paths it lists,
    /// over the owner rule.
    pub fs_config: Option<FsConfig>,
}

/// Puts the entries of one source after another into an image.
pub struct Populator<'a> {
    fs: &'a Fs,
    cred: Cred,
    rules: Rules,
    /// Host identity of a multiply-linked file → its inode in the image,
    /// across every source of the build.
    links: HashMap<(u64, u64), u32>,
    /// Directories whose times are set at the end, with the times.
    dir_times: BTreeMap<u32, (Timestamp, Timestamp)>,
    progress: Progress,
    on_progress: Option<Box<dyn FnMut(Progress) + 'a>>,
    buf: Vec<u8>,
}

/// The state of one source being put in.
struct Placing<'p> {
    name: String,
    placement: Placement<'p>,
    /// The image path of the source's root.
    base: Vec<u8>,
    /// The inode the source's root became, once known.
    root: Option<u32>,
    /// Directories of this source already found or made.
    dirs: HashMap<EntryPath, u32>,
    /// Paths the current layer made (an opaque marker keeps them); kept
    /// only for a source in layers (an OCI image): a plain tree or tar
    /// has no opaque markers, and its every path held here would cost
    /// memory in proportion to the tree.
    made: HashSet<EntryPath>,
    /// The source announced layers (`Sink::begin_layer`).
    layered: bool,
}

impl<'a> Populator<'a> {
    /// A build into `fs` under these rules.
    pub fn new(fs: &'a Fs, rules: Rules) -> Self {
        Populator {
            fs,
            cred: Cred::root(),
            rules,
            links: HashMap::new(),
            dir_times: BTreeMap::new(),
            progress: Progress::default(),
            on_progress: None,
            buf: vec![0u8; CHUNK],
        }
    }

    /// Call `f` as the build goes (after every entry, and during a large
    /// file's data).
    pub fn on_progress(&mut self, f: impl FnMut(Progress) + 'a) {
        self.on_progress = Some(Box::new(f));
    }

    /// Put every entry of `source` in, its root at `placement`; later
    /// sources overlay earlier ones.
    pub fn add(&mut self, source: &mut dyn Source, placement: Placement<'_>) -> Result<()> {
        let mut p = Placing {
            name: source.name(),
            base: placement.base(),
            placement,
            root: None,
            dirs: HashMap::new(),
            made: HashSet::new(),
            layered: false,
        };
        let mut sink = PopulateSink { w: self, p: &mut p };
        source.visit(&mut sink)
    }

    /// Set the directories' times (after everything below them is in) and
    /// say what was done.
    pub fn finish(mut self) -> Result<Progress> {
        for (&ino, &(atime, mtime)) in &self.dir_times {
            let attr = SetAttr {
                atime: Some(TimeSet::Set(atime)),
                mtime: Some(TimeSet::Set(mtime)),
                ..Default::default()
            };
            self.fs
                .setattr(ino, &attr, &self.cred)
                .map_err(|e| Error::entry("image", format!("inode {ino}"), format!("setting times: {e}")))?;
        }
        self.dir_times.clear();
        Ok(self.progress)
    }

    fn tick(&mut self) {
        if let Some(f) = &mut self.on_progress {
            f(self.progress);
        }
    }
}

/// The sink a source reports to: the populator and the source's state.
struct PopulateSink<'w, 'a, 'p> {
    w: &'w mut Populator<'a>,
    p: &'w mut Placing<'p>,
}

impl Sink for PopulateSink<'_, '_, '_> {
    fn begin_layer(&mut self) -> Result<()> {
        self.p.made.clear();
        self.p.layered = true;
        Ok(())
    }

    fn entry(&mut self, e: &Entry, data: Option<&mut dyn FileData>) -> Result<()> {
        let r = self.apply(e, data);
        self.w.tick();
        r.map_err(|reason| Error::entry(&self.p.name, e.path.to_string(), reason))
    }
}

type Why<T> = std::result::Result<T, String>;

/// An engine error as the reason of a build's error: a full image says
/// so first, since the fix is a larger SIZE, not the source.
fn why(e: ext4kit::Error) -> String {
    if e.errno() == Errno::ENOSPC {
        format!("the image is full (give mkfs a larger SIZE): {e}")
    } else {
        e.to_string()
    }
}

impl PopulateSink<'_, '_, '_> {
    fn apply(&mut self, e: &Entry, data: Option<&mut dyn FileData>) -> Why<()> {
        match (&e.kind, e.path.split()) {
            (EntryKind::Whiteout | EntryKind::Opaque, None) => Err("a whiteout of the tree's root".into()),
            (EntryKind::Whiteout, Some((dir, name))) => {
                let parent = self.dir(&dir)?;
                self.remove(parent, name)?;
                // Directories known below the removed name are gone.
                self.p.dirs.retain(|p, _| !p.starts_with(&e.path));
                Ok(())
            }
            (EntryKind::Opaque, Some(_)) if !self.p.layered => {
                Err("an opaque marker outside an image's layers (Sink::begin_layer)".into())
            }
            (EntryKind::Opaque, Some(_)) => {
                let ino = self.dir(&e.path)?;
                self.clear(ino, &e.path)
            }
            (_, None) => {
                let e = self.image_entry(e, &e.path)?;
                self.root(&e, data)
            }
            (_, Some((dir, name))) => {
                let parent = self.dir(&dir)?;
                let e = &*self.image_entry(e, &e.path)?;
                let ino = self.create(e, parent, name, data)?;
                if e.kind == EntryKind::Dir {
                    self.p.dirs.insert(e.path.clone(), ino);
                }
                if self.p.layered {
                    self.p.made.insert(e.path.clone());
                }
                Ok(())
            }
        }
    }

    /// The image path of tree path `at`.
    fn image_path(&self, at: &EntryPath) -> Vec<u8> {
        let mut v = self.p.base.trim_end_matches_slash().to_vec();
        if !at.is_root() || v.is_empty() {
            v.push(b'/');
        }
        v.extend_from_slice(at.as_bytes());
        v
    }

    /// Entry `e` as the image gets it: owners mapped, then what
    /// --fs-config says of its path, then its label from --file-contexts.
    fn image_entry<'e>(&self, e: &'e Entry, at: &EntryPath) -> Why<Cow<'e, Entry>> {
        let w = &self.w.rules;
        if w.fs_config.is_none() && w.file_contexts.is_none() && w.owners == Owners::as_source() {
            return Ok(Cow::Borrowed(e));
        }
        let mut e = e.clone();
        (e.meta.uid, e.meta.gid) = w.owners.map(e.meta.uid, e.meta.gid)?;
        let path = self.image_path(at);
        if let Some(c) = w.fs_config.as_ref().and_then(|c| c.lookup(&path[1..])) {
            e.meta.uid = c.uid;
            e.meta.gid = c.gid;
            e.meta.perm = c.perm;
            if let Some(cap) = c.capability_xattr() {
                e.xattrs.retain(|(n, _)| n != b"security.capability");
                e.xattrs.push((b"security.capability".to_vec(), cap));
            }
        }
        if let Some(fc) = &w.file_contexts {
            e.xattrs.retain(|(n, _)| n != b"security.selinux");
            if let Some(label) = fc.lookup(&path, &e.kind) {
                e.xattrs
                    .push((b"security.selinux".to_vec(), FileContexts::xattr_value(label)));
            }
        }
        Ok(Cow::Owned(e))
    }

    /// The source's own root entry.
    fn root(&mut self, e: &Entry, data: Option<&mut dyn FileData>) -> Why<()> {
        let ino = match self.p.placement {
            Placement::Into { dir: ino, .. } => {
                if e.kind != EntryKind::Dir {
                    return Err("the source's root is not a directory, and the destination is one".into());
                }
                self.merge(ino, e)?;
                ino
            }
            Placement::Named { parent, name, .. } => self.create(e, parent, name, data)?,
        };
        if e.kind == EntryKind::Dir {
            self.p.root = Some(ino);
        }
        Ok(())
    }

    /// The image directory of tree path `path`, made (root's, 0755) where
    /// the source did not give it.
    fn dir(&mut self, path: &EntryPath) -> Why<u32> {
        if let Some(&ino) = self.p.dirs.get(path) {
            return Ok(ino);
        }
        let mut ino = match self.p.root {
            Some(r) => r,
            None => {
                let r = match self.p.placement {
                    Placement::Into { dir, .. } => dir,
                    Placement::Named { parent, name, .. } => self.implicit_dir(parent, name, &EntryPath::root())?,
                };
                self.p.root = Some(r);
                r
            }
        };
        let mut at = EntryPath::root();
        for c in path.components() {
            at = at.join(c);
            ino = match self.p.dirs.get(&at) {
                Some(&i) => i,
                None => {
                    let i = self.implicit_dir(ino, c, &at)?;
                    self.p.dirs.insert(at.clone(), i);
                    if self.p.layered {
                        self.p.made.insert(at.clone());
                    }
                    i
                }
            };
        }
        Ok(ino)
    }

    /// Directory `name` in `parent` (tree path `at`), made if missing:
    /// root's, 0755, unless the owner rule or --fs-config say otherwise,
    /// labelled by --file-contexts.
    fn implicit_dir(&mut self, parent: u32, name: &[u8], at: &EntryPath) -> Why<u32> {
        match self.w.fs.lookup_at(parent, name).map_err(why)? {
            Some((ino, FileType::Directory)) => Ok(ino),
            Some(_) => Err(format!(
                "\"{}\" on the way is not a directory",
                String::from_utf8_lossy(name)
            )),
            None => {
                // Its times are the filesystem's clock's, as for any
                // directory created now: these two are not applied.
                let now = Timestamp { sec: 0, nsec: 0 };
                let implicit = Entry {
                    path: at.clone(),
                    kind: EntryKind::Dir,
                    meta: Meta {
                        perm: 0o755,
                        uid: 0,
                        gid: 0,
                        atime: now,
                        mtime: now,
                    },
                    xattrs: Vec::new(),
                    identity: None,
                };
                let e = self.image_entry(&implicit, at)?;
                let new = NewInode::new(Target::at(parent, name), NodeKind::Dir)
                    .mode(e.meta.perm)
                    .cred(&self.w.cred)
                    .owner(e.meta.uid, e.meta.gid);
                let st = self.w.fs.create(&new).map_err(why)?;
                self.set_xattrs(st.ino, &e)?;
                self.w.progress.entries += 1;
                Ok(st.ino)
            }
        }
    }

    /// Create entry `e` as `name` in `parent`; its inode.
    fn create(&mut self, e: &Entry, parent: u32, name: &[u8], data: Option<&mut dyn FileData>) -> Why<u32> {
        let mut replaced = false;
        let made = loop {
            let fs = self.w.fs;
            match retry_when_full(fs, || self.make(e, parent, name)) {
                Ok(m) => break m,
                Err(err) if err.errno() == Errno::EEXIST && !replaced => {
                    let (ino, ft) = self
                        .w
                        .fs
                        .lookup_at(parent, name)
                        .map_err(why)?
                        .ok_or_else(|| err.to_string())?;
                    match (ft == FileType::Directory, e.kind == EntryKind::Dir) {
                        (true, true) => {
                            self.merge(ino, e)?;
                            return Ok(ino);
                        }
                        (true, false) => return Err("cannot overwrite a directory with a non-directory".into()),
                        (false, true) => return Err("cannot overwrite a non-directory with a directory".into()),
                        (false, false) => {
                            if e.identity.is_some_and(|id| self.w.links.get(&id) == Some(&ino)) {
                                // This name is that file already (a source
                                // given twice): nothing to do.
                                return Ok(ino);
                            }
                            self.w
                                .fs
                                .unlink(Target::at(parent, name), &self.w.cred)
                                .map_err(|e| format!("replacing the existing file: {e}"))?;
                            replaced = true;
                        }
                    }
                }
                Err(err) => return Err(why(err)),
            }
        };
        self.w.progress.entries += 1;
        let ino = match made {
            Made::Linked(ino) => return Ok(ino),
            Made::New(ino) => ino,
        };
        if let (EntryKind::File { size }, Some(d)) = (&e.kind, data) {
            self.write_data(ino, *size, d)?;
        }
        self.set_xattrs(ino, e)?;
        if e.kind == EntryKind::Dir {
            self.w.dir_times.insert(ino, (e.meta.atime, e.meta.mtime));
        } else {
            self.set_times(ino, e)?;
            if let Some(id) = e.identity {
                self.w.links.insert(id, ino);
            }
        }
        Ok(ino)
    }

    /// The creating step: a new inode, or a new name of one made before.
    fn make(&mut self, e: &Entry, parent: u32, name: &[u8]) -> ext4kit::Result<Made> {
        let fs = self.w.fs;
        let at = Target::at(parent, name);
        if let Some(&ino) = e.identity.as_ref().and_then(|id| self.w.links.get(id)) {
            return fs.link(ino, at, &self.w.cred).map(|_| Made::Linked(ino));
        }
        let kind = match &e.kind {
            EntryKind::Dir => NodeKind::Dir,
            EntryKind::File { .. } => NodeKind::File,
            EntryKind::Symlink(t) => NodeKind::Symlink(t),
            EntryKind::CharDevice(a, b) => NodeKind::CharDevice(*a, *b),
            EntryKind::BlockDevice(a, b) => NodeKind::BlockDevice(*a, *b),
            EntryKind::Fifo => NodeKind::Fifo,
            EntryKind::Socket => NodeKind::Socket,
            EntryKind::HardLink(target) => {
                let ino = self.find(target).map_err(|r| ext4kit::Error::posix(Errno::ENOENT, r))?;
                return fs.link(ino, at, &self.w.cred).map(|_| Made::Linked(ino));
            }
            EntryKind::Whiteout | EntryKind::Opaque => {
                return Err(ext4kit::Error::posix(Errno::EINVAL, "a whiteout is not a file to make"))
            }
        };
        // Owners are image ids already (image_entry).
        let new = NewInode::new(at, kind)
            .mode(e.meta.perm)
            .cred(&self.w.cred)
            .owner(e.meta.uid, e.meta.gid);
        Ok(Made::New(fs.create(&new)?.ino))
    }

    /// The inode at tree path `target` (a hard link's target: given
    /// before, and not a directory).
    fn find(&mut self, target: &EntryPath) -> Why<u32> {
        let missing = || format!("hard link to \"{target}\", which the source did not give before it");
        let (dir, name) = target.split().ok_or_else(missing)?;
        let parent = match self.p.dirs.get(&dir) {
            Some(&i) => i,
            None if dir.is_root() => self.p.root.ok_or_else(missing)?,
            None => return Err(missing()),
        };
        match self.w.fs.lookup_at(parent, name).map_err(why)? {
            Some((_, FileType::Directory)) => Err(format!("hard link to \"{target}\", a directory")),
            Some((ino, _)) => Ok(ino),
            None => Err(missing()),
        }
    }

    /// An existing directory takes entry `e`'s owner, mode and xattrs
    /// (its times at the end).
    fn merge(&mut self, ino: u32, e: &Entry) -> Why<()> {
        let (uid, gid) = (e.meta.uid, e.meta.gid);
        // Owner first: a chown clears setgid, which the mode then sets.
        for attr in [
            SetAttr {
                uid: Some(uid),
                gid: Some(gid),
                ..Default::default()
            },
            SetAttr {
                mode: Some(e.meta.perm),
                ..Default::default()
            },
        ] {
            self.w.fs.setattr(ino, &attr, &self.w.cred).map_err(why)?;
        }
        self.set_xattrs(ino, e)?;
        self.w.dir_times.insert(ino, (e.meta.atime, e.meta.mtime));
        Ok(())
    }

    fn write_data(&mut self, ino: u32, size: u64, d: &mut dyn FileData) -> Why<()> {
        let fs = self.w.fs;
        let inode = fs.inode(ino).map_err(why)?;
        let mut buf = std::mem::take(&mut self.w.buf);
        let r = (|| -> Why<()> {
            while let Some((off, n)) = d.read_segment(&mut buf).map_err(|e| format!("reading: {e}"))? {
                if off.checked_add(n as u64).is_none_or(|end| end > size) {
                    return Err(format!("data at {off}+{n} past the file's size {size}"));
                }
                let mut done = 0;
                while done < n {
                    let req = WriteRequest::at(off + done as u64, &buf[done..n]);
                    let w = retry_when_full(fs, || fs.write_inode(&inode, &req)).map_err(why)?;
                    done += w.len;
                }
                self.w.progress.bytes += n as u64;
                if self.w.progress.bytes % (64 << 20) < n as u64 {
                    self.w.tick();
                }
            }
            Ok(())
        })();
        self.w.buf = buf;
        r?;
        if inode.size() < size {
            // A trailing hole.
            fs.truncate_inode(&inode, size, &ext4kit::Caller::root()).map_err(why)?;
        }
        Ok(())
    }

    fn set_xattrs(&mut self, ino: u32, e: &Entry) -> Why<()> {
        let fs = self.w.fs;
        for (name, value) in &e.xattrs {
            retry_when_full(fs, || fs.setxattr(ino, name, value, 0, &self.w.cred))
                .map_err(|err| format!("xattr {}: {}", String::from_utf8_lossy(name), why(err)))?;
        }
        Ok(())
    }

    fn set_times(&mut self, ino: u32, e: &Entry) -> Why<()> {
        let attr = SetAttr {
            atime: Some(TimeSet::Set(e.meta.atime)),
            mtime: Some(TimeSet::Set(e.meta.mtime)),
            ..Default::default()
        };
        self.w.fs.setattr(ino, &attr, &self.w.cred).map_err(why)?;
        Ok(())
    }

    /// A whiteout: `name` in `parent` and everything below it go.
    fn remove(&mut self, parent: u32, name: &[u8]) -> Why<()> {
        // A lookup of "." or ".." finds the directory or the one above it,
        // which a whiteout must never empty.
        if name == b"." || name == b".." || name.contains(&b'/') {
            return Err(format!(
                "a whiteout of \"{}\": not a name",
                String::from_utf8_lossy(name)
            ));
        }
        match self.w.fs.lookup_at(parent, name).map_err(why)? {
            None => Err("a whiteout of a path no earlier layer has".into()),
            Some((ino, ft)) => {
                if ft == FileType::Directory {
                    self.empty_dir(ino, None)?;
                    self.w.fs.rmdir(Target::at(parent, name), &self.w.cred)
                } else {
                    self.w.fs.unlink(Target::at(parent, name), &self.w.cred)
                }
                .map_err(why)?;
                self.w.dir_times.remove(&ino);
                self.w.progress.entries += 1;
                Ok(())
            }
        }
    }

    /// An opaque directory: what earlier layers put in it goes; what this
    /// layer put there stays.
    fn clear(&mut self, ino: u32, path: &EntryPath) -> Why<()> {
        self.empty_dir(ino, Some(path))?;
        let made = &self.p.made;
        self.p
            .dirs
            .retain(|p, _| p == path || !p.starts_with(path) || made.contains(p));
        Ok(())
    }

    /// Remove the contents of directory `ino`; with `keep`, the names this
    /// source made below that tree path stay.
    fn empty_dir(&mut self, ino: u32, keep: Option<&EntryPath>) -> Why<()> {
        let entries = self.w.fs.read_dir(ino).map_err(why)?;
        for d in entries {
            if d.name == b"." || d.name == b".." {
                continue;
            }
            if let Some(k) = keep {
                if self.p.made.contains(&k.join(&d.name)) {
                    continue;
                }
            }
            let is_dir = match d.file_type {
                Some(ft) => ft == FileType::Directory,
                None => self.w.fs.stat(d.ino).map_err(why)?.ftype == FileType::Directory,
            };
            if is_dir {
                self.empty_dir(d.ino, None)?;
                self.w.fs.rmdir(Target::at(ino, &d.name), &self.w.cred)
            } else {
                self.w.fs.unlink(Target::at(ino, &d.name), &self.w.cred)
            }
            .map_err(|e| format!("removing \"{}\": {e}", String::from_utf8_lossy(&d.name)))?;
            self.w.dir_times.remove(&d.ino);
        }
        Ok(())
    }
}

/// Run `op`; when it finds the image full, write back what is dirty and
/// run it once more. Room that looks taken may only be promised: each
/// dirty range holds its worst case of block-map growth until it is
/// written back — the kernel's ext4_should_retry_alloc forces a commit
/// and retries for the same reason.
fn retry_when_full<T>(fs: &Fs, mut op: impl FnMut() -> ext4kit::Result<T>) -> ext4kit::Result<T> {
    match op() {
        Err(e) if e.errno() == Errno::ENOSPC => {
            fs.writeback_all()?;
            op()
        }
        r => r,
    }
}

/// What [`PopulateSink::make`] did.
enum Made {
    /// A new inode.
    New(u32),
    /// A new name for an inode made before.
    Linked(u32),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::Meta;
    use ext4kit::device::MemDevice;
    use std::sync::Arc;

    /// A fresh 16 MiB ext4 in memory, opened read-write.
    fn scratch() -> Arc<Fs> {
        let dev = MemDevice::new(16 << 20);
        let o = ext4kit::mkfs::MkfsOptions {
            device_zeroed: true,
            ..Default::default()
        };
        ext4kit::mkfs::mkfs(&dev, 16 << 20, &o).unwrap();
        let o = ext4kit::OpenOptions {
            read_only: false,
            ..Default::default()
        };
        Fs::open_device(Arc::new(dev), &o).unwrap()
    }

    fn entry(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: EntryPath::parse(path.as_bytes()).unwrap(),
            kind,
            meta: Meta {
                perm: 0o755,
                uid: 0,
                gid: 0,
                atime: Timestamp::default(),
                mtime: Timestamp::default(),
            },
            xattrs: Vec::new(),
            identity: None,
        }
    }

    /// A source of fixed entries.
    struct Fixed(Vec<Entry>);

    impl Source for Fixed {
        fn name(&self) -> String {
            "fixed".into()
        }
        fn visit(&mut self, sink: &mut dyn Sink) -> Result<()> {
            for e in &self.0 {
                sink.begin_layer()?;
                sink.entry(e, None)?;
            }
            Ok(())
        }
    }

    #[test]
    fn a_whiteout_never_reaches_above_its_directory() {
        let fs = scratch();
        let mut p = Populator::new(&fs, Rules::default());
        let root = Placement::Into { dir: 2, path: b"/" };
        p.add(
            &mut Fixed(vec![entry("keep", EntryKind::Dir), entry("keep/d", EntryKind::Dir)]),
            root,
        )
        .unwrap();
        // "keep/d/.." as a whiteout (a layer's `.wh...`, or a library
        // caller's own path): refused, and nothing removed.
        let mut hostile = entry("keep/d", EntryKind::Whiteout);
        hostile.path = EntryPath::parse(b"keep/d").unwrap().join(b"..");
        let e = p.add(&mut Fixed(vec![hostile]), root).unwrap_err();
        assert!(e.reason().contains("not a name"), "{e}");
        assert!(fs.stat("/keep/d").is_ok(), "the tree above the whiteout was emptied");
    }
}
