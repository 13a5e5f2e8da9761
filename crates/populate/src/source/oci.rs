//! An OCI image as a source: an image layout directory (`oci-layout`,
//! `index.json`, `blobs/sha256/…`), or the same packed in a tar
//! (`oci-archive`, and `docker save`, which writes the layout and its own
//! `manifest.json`, or only the latter in older versions). One image is
//! chosen (`--image NAME[:TAG]`, `--platform OS/ARCH[/VARIANT]`) and its
//! layers are applied in order, each a tar, as the image spec's
//! "Applying Changesets" says: a `.wh.NAME` member removes NAME from what
//! the layers below put there, a `.wh..wh..opq` member empties its
//! directory of what the layers below put in it.
//!
//! Every blob is checked against its digest (sha256 of the blob; for a
//! `docker save` layer without one, the config's `diff_ids`, sha256 of the
//! uncompressed tar) as it is read; a mismatch fails the build, which then
//! leaves no image. Nothing is unpacked onto the host.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::compress::{classify, Compression};
use super::tar::{Archive, TarSource};
use super::{Sink, Source};
use crate::entry::{Entry, EntryKind, FileData};
use crate::error::{Error, Result};

/// The largest JSON document (index, manifest, config) read into memory.
const MAX_JSON: u64 = 64 << 20;

/// Which image of several to take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageChoice {
    /// `NAME[:TAG]` (or only `TAG`), as the index's annotations or `docker
    /// save`'s RepoTags name it.
    pub image: Option<String>,
    /// OS/ARCH[/VARIANT]; default linux and this machine's architecture
    /// when the index offers several.
    pub platform: Option<String>,
}

/// Whether `path` holds an OCI image: a layout directory, or a tar whose
/// first member is part of one (or of a `docker save`).
pub fn is_image(path: &Path, compression: Compression) -> bool {
    if path.is_dir() {
        return path.join("index.json").is_file() || path.join("oci-layout").is_file();
    }
    if compression != Compression::None {
        return false;
    }
    let Ok(f) = File::open(path) else {
        return false;
    };
    let mut a = Archive::new(BufReader::new(f));
    // The first member but the archive's own root ("./").
    loop {
        match a.next_member() {
            Ok(Some(m)) => {
                let p = m.path.strip_prefix(b"./").unwrap_or(&m.path);
                if p.is_empty() || p == b"." {
                    continue;
                }
                return p.starts_with(b"blobs/")
                    || p == b"blobs"
                    || p == b"oci-layout"
                    || p == b"index.json"
                    || p == b"manifest.json"
                    || p == b"repositories"
                    || is_legacy_layer_dir(p);
            }
            _ => return false,
        }
    }
}

/// `docker save`'s per-layer directory or config: 64 hex digits.
fn is_legacy_layer_dir(p: &[u8]) -> bool {
    let first = p.split(|&b| b == b'/').next().unwrap_or(b"");
    let first = first.strip_suffix(b".json").unwrap_or(first);
    first.len() == 64 && first.iter().all(|c| c.is_ascii_hexdigit())
}

/// Where the files of the layout are.
enum Store {
    Dir(PathBuf),
    /// Members of an outer tar: path → (data offset, size).
    Tar(PathBuf, HashMap<String, (u64, u64)>),
}

impl Store {
    fn open(path: &Path) -> std::result::Result<Store, String> {
        if path.is_dir() {
            return Ok(Store::Dir(path.to_path_buf()));
        }
        let f = File::open(path).map_err(|e| e.to_string())?;
        let mut a = Archive::new(BufReader::with_capacity(1 << 16, f));
        let mut members = HashMap::new();
        loop {
            match a.next_member() {
                Ok(Some(m)) => {
                    let p = String::from_utf8_lossy(m.path.strip_prefix(b"./").unwrap_or(&m.path)).into_owned();
                    members.insert(p, (a.position(), m.size));
                }
                Ok(None) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(Store::Tar(path.to_path_buf(), members))
    }

    /// A reader of the file at `rel` in the layout. `rel` comes from the
    /// image's own JSON (`docker save`'s manifest names its layers and
    /// config by path): one that climbs out of the layout (`..`, a
    /// leading `/`) is refused, not read from the host.
    fn reader(&self, rel: &str) -> io::Result<(Box<dyn Read>, u64)> {
        let inside = crate::entry::EntryPath::parse(rel.as_bytes())
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, format!("{rel}: {why}")))?;
        let rel = String::from_utf8_lossy(inside.as_bytes()).into_owned();
        let rel = rel.as_str();
        match self {
            Store::Dir(d) => {
                let f = File::open(d.join(rel))?;
                let len = f.metadata()?.len();
                Ok((Box::new(f), len))
            }
            Store::Tar(p, members) => {
                let &(off, size) = members
                    .get(rel)
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{rel}: not in the archive")))?;
                let mut f = File::open(p)?;
                f.seek(SeekFrom::Start(off))?;
                Ok((Box::new(f.take(size)), size))
            }
        }
    }

    fn exists(&self, rel: &str) -> bool {
        match self {
            Store::Dir(d) => d.join(rel).is_file(),
            Store::Tar(_, m) => m.contains_key(rel),
        }
    }

    /// A small file (JSON), checked against `digest` when one is given.
    fn read_small(&self, rel: &str, digest: Option<&str>) -> std::result::Result<Vec<u8>, String> {
        let (r, len) = self.reader(rel).map_err(|e| format!("{rel}: {e}"))?;
        if len > MAX_JSON {
            return Err(format!(
                "{rel}: {len} bytes, more than a JSON document of an image needs"
            ));
        }
        let mut v = Vec::with_capacity(len as usize);
        r.take(MAX_JSON)
            .read_to_end(&mut v)
            .map_err(|e| format!("{rel}: {e}"))?;
        if let Some(d) = digest {
            check_digest(d, &format!("{:x}", Sha256::digest(&v))).map_err(|e| format!("{rel}: {e}"))?;
        }
        Ok(v)
    }
}

/// A descriptor in an index or manifest.
#[derive(Deserialize, Debug, Clone)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    annotations: HashMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize, Debug, Clone, Default)]
struct Platform {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// `docker save`'s manifest.json entries.
#[derive(Deserialize)]
struct SaveEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

#[derive(Deserialize, Default)]
struct Config {
    #[serde(default)]
    rootfs: Option<RootFs>,
}

#[derive(Deserialize, Default)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

/// One layer to apply: where its blob is and what its digests must be.
struct Layer {
    rel: String,
    /// sha256 of the blob as stored.
    blob_digest: Option<String>,
    /// sha256 of the uncompressed tar (`diff_ids`).
    diff_id: Option<String>,
}

/// An OCI image (layout directory or archive).
pub struct OciSource {
    path: PathBuf,
    choice: ImageChoice,
}

impl OciSource {
    /// The image at `path`, chosen by `choice`.
    pub fn new(path: &Path, choice: ImageChoice) -> Self {
        OciSource {
            path: path.to_path_buf(),
            choice,
        }
    }

    fn err(&self, reason: impl Into<String>) -> Error {
        Error::source(&self.path, reason.into())
    }

    /// The layers of the chosen image, bottom first.
    fn layers(&self, store: &Store) -> Result<Vec<Layer>> {
        if store.exists("index.json") {
            let index: Index = json(&store.read_small("index.json", None).map_err(|e| self.err(e))?)
                .map_err(|e| self.err(format!("index.json: {e}")))?;
            let manifest = self.pick(store, index.manifests, 0)?;
            let rel = blob_path(&manifest.digest).map_err(|e| self.err(e))?;
            let m: Manifest = json(
                &store
                    .read_small(&rel, Some(&manifest.digest))
                    .map_err(|e| self.err(e))?,
            )
            .map_err(|e| self.err(format!("manifest {}: {e}", manifest.digest)))?;
            let crel = blob_path(&m.config.digest).map_err(|e| self.err(e))?;
            let config: Config = json(
                &store
                    .read_small(&crel, Some(&m.config.digest))
                    .map_err(|e| self.err(e))?,
            )
            .map_err(|e| self.err(format!("config {}: {e}", m.config.digest)))?;
            let diff_ids = config.rootfs.unwrap_or_default().diff_ids;
            let mut out = Vec::new();
            for (i, l) in m.layers.iter().enumerate() {
                if !l.media_type.is_empty() && !l.media_type.contains("tar") {
                    return Err(self.err(format!("layer {}: media type {} is not a tar", l.digest, l.media_type)));
                }
                out.push(Layer {
                    rel: blob_path(&l.digest).map_err(|e| self.err(e))?,
                    blob_digest: Some(l.digest.clone()),
                    diff_id: diff_ids.get(i).cloned(),
                });
            }
            return Ok(out);
        }
        if store.exists("manifest.json") {
            let entries: Vec<SaveEntry> = json(&store.read_small("manifest.json", None).map_err(|e| self.err(e))?)
                .map_err(|e| self.err(format!("manifest.json: {e}")))?;
            let e = self.pick_saved(entries)?;
            let config: Config = json(&store.read_small(&e.config, None).map_err(|e| self.err(e))?)
                .map_err(|err| self.err(format!("{}: {err}", e.config)))?;
            let diff_ids = config.rootfs.unwrap_or_default().diff_ids;
            return Ok(e
                .layers
                .iter()
                .enumerate()
                .map(|(i, rel)| Layer {
                    rel: rel.clone(),
                    blob_digest: None,
                    diff_id: diff_ids.get(i).cloned(),
                })
                .collect());
        }
        Err(self.err("neither index.json nor manifest.json: not an OCI image"))
    }

    /// The manifest descriptor the choice names, descending into nested
    /// indexes.
    fn pick(&self, store: &Store, manifests: Vec<Descriptor>, depth: u32) -> Result<Descriptor> {
        if depth > 4 {
            return Err(self.err("indexes nested more than four deep"));
        }
        let mut cands = manifests;
        if let Some(want) = &self.choice.image {
            if depth == 0 {
                cands.retain(|d| names_of(d).iter().any(|n| name_matches(n, want)));
                if cands.is_empty() {
                    return Err(self.err(format!("no image named \"{want}\" in index.json")));
                }
            }
        }
        if cands.iter().any(|d| d.platform.is_some()) {
            let want = self.choice.platform.clone().unwrap_or_else(host_platform);
            cands.retain(|d| d.platform.as_ref().is_none_or(|p| platform_matches(p, &want)));
            if cands.is_empty() {
                return Err(self.err(format!("no manifest for platform {want} (--platform)")));
            }
        }
        if cands.len() > 1 {
            let names: Vec<String> = cands.iter().flat_map(names_of).collect();
            return Err(self.err(format!(
                "holds {} images; choose one with --image (named: {})",
                cands.len(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )));
        }
        let d = cands.pop().ok_or_else(|| self.err("index.json lists no manifest"))?;
        if d.media_type.contains("index") || d.media_type.contains("manifest.list") {
            let rel = blob_path(&d.digest).map_err(|e| self.err(e))?;
            let idx: Index = json(&store.read_small(&rel, Some(&d.digest)).map_err(|e| self.err(e))?)
                .map_err(|e| self.err(format!("index {}: {e}", d.digest)))?;
            return self.pick(store, idx.manifests, depth + 1);
        }
        Ok(d)
    }

    fn pick_saved(&self, mut entries: Vec<SaveEntry>) -> Result<SaveEntry> {
        if let Some(want) = &self.choice.image {
            entries.retain(|e| e.repo_tags.iter().flatten().any(|t| name_matches(t, want)));
            if entries.is_empty() {
                return Err(self.err(format!("no image tagged \"{want}\" in manifest.json")));
            }
        }
        if entries.len() > 1 {
            let tags: Vec<String> = entries
                .iter()
                .flat_map(|e| e.repo_tags.clone().unwrap_or_default())
                .collect();
            return Err(self.err(format!(
                "holds {} images; choose one with --image ({})",
                entries.len(),
                tags.join(", ")
            )));
        }
        entries.pop().ok_or_else(|| self.err("manifest.json lists no image"))
    }

    /// Apply one layer: its tar read through the digests, whiteouts
    /// turned into whiteout entries.
    fn apply_layer(&self, store: &Store, l: &Layer, name: &str, sink: &mut dyn Sink) -> Result<()> {
        let io_err = |e: io::Error| Error::source(&self.path, format!("{name}: {e}"));
        let (raw, _) = store.reader(&l.rel).map_err(io_err)?;
        let mut head = BufReader::with_capacity(1 << 20, Hashing::new(raw));
        let kind = classify(head.fill_buf().map_err(io_err)?);
        let mut tar = Hashing::new(decompress(head, kind).map_err(io_err)?);
        sink.begin_layer()?;
        TarSource::visit_stream(name, &mut tar, &mut Whiteouts { inner: sink })?;
        // What follows the end blocks counts for the digests too.
        io::copy(&mut tar, &mut io::sink()).map_err(io_err)?;
        let diff = tar.hex();
        let mut blob = tar.inner.into_inner();
        io::copy(&mut blob, &mut io::sink()).map_err(io_err)?;
        let blob_hex = blob.into_inner().hex();
        if let Some(d) = &l.blob_digest {
            check_digest(d, &blob_hex).map_err(|e| Error::source(&self.path, format!("{name}: {e}")))?;
        }
        if let Some(d) = &l.diff_id {
            check_digest(d, &diff).map_err(|e| Error::source(&self.path, format!("{name}: uncompressed, {e}")))?;
        }
        Ok(())
    }
}

impl Source for OciSource {
    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn visit(&mut self, sink: &mut dyn Sink) -> Result<()> {
        let store = Store::open(&self.path).map_err(|e| self.err(e))?;
        let layers = self.layers(&store)?;
        for (i, l) in layers.iter().enumerate() {
            let name = format!("{} layer {} ({})", self.name(), i + 1, l.rel);
            self.apply_layer(&store, l, &name, sink)?;
        }
        Ok(())
    }
}

fn json<T: for<'de> Deserialize<'de>>(b: &[u8]) -> std::result::Result<T, String> {
    serde_json::from_slice(b).map_err(|e| e.to_string())
}

/// `blobs/sha256/HEX` for `sha256:HEX`, the hex checked (a digest is a
/// path: it must not climb out of the layout).
fn blob_path(digest: &str) -> std::result::Result<String, String> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("digest \"{digest}\": only sha256 is supported"))?;
    if hex.len() != 64 || !hex.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
        return Err(format!("digest \"{digest}\" is not 64 lowercase hex digits"));
    }
    Ok(format!("blobs/sha256/{hex}"))
}

fn check_digest(want: &str, got_hex: &str) -> std::result::Result<(), String> {
    let got = format!("sha256:{got_hex}");
    if want != got {
        return Err(format!("digest mismatch: the image says {want}, the data is {got}"));
    }
    Ok(())
}

/// The names an index entry goes by.
fn names_of(d: &Descriptor) -> Vec<String> {
    ["io.containerd.image.name", "org.opencontainers.image.ref.name"]
        .iter()
        .filter_map(|k| d.annotations.get(*k).cloned())
        .collect()
}

/// Whether an image called `have` is the one asked for: the same name
/// and tag (a registry prefix on `have` aside), or the same tag when
/// `have` is only a tag; a name without a tag means `latest`.
fn name_matches(have: &str, want: &str) -> bool {
    let split = |s: &str| -> (String, String) {
        match s.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (n.to_string(), t.to_string()),
            _ => (s.to_string(), "latest".to_string()),
        }
    };
    let (wn, wt) = split(want);
    if !have.contains(':') && !have.contains('/') {
        // An OCI ref.name that is only a tag.
        return have == wt || have == want;
    }
    let (hn, ht) = split(have);
    ht == wt && (hn == wn || hn.ends_with(&format!("/{wn}")))
}

/// This machine's platform in OCI's words.
fn host_platform() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    format!("linux/{arch}")
}

fn platform_matches(p: &Platform, want: &str) -> bool {
    let mut it = want.split('/');
    let (os, arch, variant) = (it.next().unwrap_or(""), it.next().unwrap_or(""), it.next());
    p.os == os && p.architecture == arch && variant.is_none_or(|v| p.variant.as_deref() == Some(v))
}

type BlobReader = BufReader<Hashing<Box<dyn Read>>>;

fn decompress(r: BlobReader, c: Compression) -> io::Result<Layered> {
    // What is not compressed is read as a tar; the tar reader refuses
    // anything else at its first header.
    Ok(match c {
        Compression::None => Layered::Plain(r),
        Compression::Gzip => Layered::Gzip(flate2::bufread::MultiGzDecoder::new(r)),
        Compression::Zstd => Layered::Zstd(zstd::stream::read::Decoder::with_buffer(r)?),
        Compression::Xz => Layered::Xz(liblzma::bufread::XzDecoder::new_multi_decoder(r)),
    })
}

/// A layer's tar stream over its (hashed) blob, so the blob can be
/// drained and its digest taken once the tar is read.
enum Layered {
    Plain(BlobReader),
    Gzip(flate2::bufread::MultiGzDecoder<BlobReader>),
    Zstd(zstd::stream::read::Decoder<'static, BlobReader>),
    Xz(liblzma::bufread::XzDecoder<BlobReader>),
}

impl Layered {
    fn into_inner(self) -> BlobReader {
        match self {
            Layered::Plain(r) => r,
            Layered::Gzip(d) => d.into_inner(),
            Layered::Zstd(d) => d.finish(),
            Layered::Xz(d) => d.into_inner(),
        }
    }
}

impl Read for Layered {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Layered::Plain(r) => r.read(buf),
            Layered::Gzip(d) => d.read(buf),
            Layered::Zstd(d) => d.read(buf),
            Layered::Xz(d) => d.read(buf),
        }
    }
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    h: Sha256,
}

impl<R> Hashing<R> {
    fn new(inner: R) -> Self {
        Hashing {
            inner,
            h: Sha256::new(),
        }
    }

    fn hex(&self) -> String {
        format!("{:x}", self.h.clone().finalize())
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.h.update(&buf[..n]);
        Ok(n)
    }
}

/// Turns a layer's whiteout members into whiteout entries.
struct Whiteouts<'s> {
    inner: &'s mut dyn Sink,
}

impl Sink for Whiteouts<'_> {
    fn begin_layer(&mut self) -> Result<()> {
        self.inner.begin_layer()
    }

    fn entry(&mut self, e: &Entry, data: Option<&mut dyn FileData>) -> Result<()> {
        let Some((dir, name)) = e.path.split() else {
            return self.inner.entry(e, data);
        };
        let Some(hidden) = name.strip_prefix(b".wh.") else {
            return self.inner.entry(e, data);
        };
        let (path, kind) = match hidden {
            b".wh..opq" => (dir, EntryKind::Opaque),
            b"" => return self.inner.entry(e, data),
            // `.wh..` and `.wh...` would name the directory itself or its
            // parent: a whiteout of those would empty what lies above.
            b"." | b".." => {
                return Err(Error::entry(
                    "layer",
                    e.path.to_string(),
                    "a whiteout of \".\" or \"..\" (it would remove the directory above)",
                ))
            }
            h => (dir.join(h), EntryKind::Whiteout),
        };
        let w = Entry {
            path,
            kind,
            ..e.clone()
        };
        self.inner.entry(&w, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_platforms() {
        assert!(name_matches(
            "docker.io/library/alpine:3.20",
            "docker.io/library/alpine:3.20"
        ));
        assert!(name_matches("docker.io/library/alpine:3.20", "alpine:3.20"));
        assert!(!name_matches("docker.io/library/alpine:3.20", "alpine:3.19"));
        assert!(name_matches("3.20", "alpine:3.20"));
        assert!(name_matches("alpine:latest", "alpine"));
        assert!(name_matches("localhost:5000/app:v1", "app:v1"));
        let p = Platform {
            os: "linux".into(),
            architecture: "arm64".into(),
            variant: Some("v8".into()),
        };
        assert!(platform_matches(&p, "linux/arm64"));
        assert!(platform_matches(&p, "linux/arm64/v8"));
        assert!(!platform_matches(&p, "linux/amd64"));
    }

    #[test]
    fn digests_are_paths_only_when_well_formed() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(blob_path(&d).unwrap(), format!("blobs/sha256/{}", "a".repeat(64)));
        assert!(blob_path("sha256:../../etc/passwd").is_err());
        assert!(blob_path(&format!("sha512:{}", "a".repeat(128))).is_err());
        assert!(blob_path(&format!("sha256:{}", "A".repeat(64))).is_err());
    }

    #[test]
    fn a_path_out_of_the_layout_is_not_read() {
        let dir = std::env::temp_dir().join(format!("ext4kit-oci-store-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("layout")).unwrap();
        std::fs::write(dir.join("secret"), b"host file").unwrap();
        let store = Store::Dir(dir.join("layout"));
        for rel in ["../secret", "/etc/passwd", "a/../../secret"] {
            let e = store.reader(rel).err().expect(rel);
            assert!(e.to_string().contains("outside the tree"), "{rel}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn legacy_layer_dirs() {
        let hex = "0123456789abcdef".repeat(4);
        assert!(is_legacy_layer_dir(format!("{hex}/layer.tar").as_bytes()));
        assert!(is_legacy_layer_dir(format!("{hex}.json").as_bytes()));
        assert!(!is_legacy_layer_dir(b"etc/passwd"));
    }
}
