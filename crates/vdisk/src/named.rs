//! Opening the files an image names: a qcow2 backing file, the extent
//! files of a VMDK descriptor.
//!
//! Those names are chosen by whoever made the image, not by the user who
//! opens it: a downloaded qcow2 whose backing file is `/etc/shadow` would
//! otherwise show that file's bytes as disk sectors, and one naming
//! `/dev/sda` would read (or, through a writable chain, expose) a disk.
//! So a name is followed only when it resolves, symlinks included, to a
//! regular file inside the directory of the image that names it, unless
//! the user allowed any path; a URL or a protocol prefix (`nbd:`, `json:`
//! as qemu accepts them) is never followed.

use std::io;
use std::path::{Path, PathBuf};

use ext4kit_blockdev::FileDevice;

/// Where named files may be, for one image.
#[derive(Debug, Clone)]
pub struct NamedFiles {
    /// The directory of the image that names the files; `None` when the
    /// image has no directory (a remote object, memory), where no name is
    /// followed.
    dir: Option<PathBuf>,
    /// The user allowed any path (still only regular files, never URLs).
    anywhere: bool,
}

impl NamedFiles {
    /// Names resolved against the directory of `image` (a path on this
    /// machine), kept inside it unless `anywhere`.
    pub fn beside(image: &Path, anywhere: bool) -> NamedFiles {
        let dir = image
            .parent()
            .map(|d| if d.as_os_str().is_empty() { Path::new(".") } else { d });
        NamedFiles {
            dir: dir.map(Path::to_path_buf),
            anywhere,
        }
    }

    /// No name may be followed (an image that is not a local file).
    pub fn none() -> NamedFiles {
        NamedFiles {
            dir: None,
            anywhere: false,
        }
    }

    /// The same policy for the files a named file names in turn (a backing
    /// file's own backing file): resolved against its directory.
    pub fn for_file(&self, path: &Path) -> NamedFiles {
        NamedFiles::beside(path, self.anywhere)
    }

    /// Where `name` (as the image `what` spells it: "backing file",
    /// "extent 2") resolves, if it may be opened.
    pub fn resolve(&self, what: &str, name: &str) -> io::Result<PathBuf> {
        let refuse = |why: String| io::Error::new(io::ErrorKind::PermissionDenied, format!("{what} {name:?}: {why}"));
        if name.is_empty() || name.contains('\0') {
            return Err(refuse("not a file name".into()));
        }
        if name.contains("://") || protocol_prefix(name) {
            return Err(refuse(
                "names a URL or a protocol, which is never followed; open that image yourself".into(),
            ));
        }
        let Some(dir) = &self.dir else {
            return Err(refuse(
                "the image is not a local file, so the files it names are not followed".into(),
            ));
        };
        let given = Path::new(name);
        let joined = if given.is_absolute() {
            given.to_path_buf()
        } else {
            dir.join(given)
        };
        let real = joined
            .canonicalize()
            .map_err(|e| io::Error::new(e.kind(), format!("{what} {name:?} ({}): {e}", joined.display())))?;
        if !self.anywhere {
            let base = dir
                .canonicalize()
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
            if !real.starts_with(&base) {
                return Err(refuse(format!(
                    "resolves to {}, outside the image's directory {}; follow it only if you trust the image \
                     (--any-backing-path)",
                    real.display(),
                    base.display()
                )));
            }
        }
        let meta = std::fs::metadata(&real)?;
        if !meta.file_type().is_file() {
            return Err(refuse(format!(
                "resolves to {}, which is not a regular file (a device node or a special file is never \
                 followed)",
                real.display()
            )));
        }
        Ok(real)
    }

    /// Open `name` (see [`NamedFiles::resolve`]), read-write if `writable`.
    pub fn open(&self, what: &str, name: &str, writable: bool) -> io::Result<(PathBuf, FileDevice)> {
        let path = self.resolve(what, name)?;
        let dev = FileDevice::open(&path, writable)
            .map_err(|e| io::Error::new(e.kind(), format!("{what} {}: {e}", path.display())))?;
        Ok((path, dev))
    }
}

/// `nbd:host`, `json:{...}`, `file:x`: qemu's protocol prefixes (a word of
/// letters before a colon, where a Unix file name has no reason to put one).
fn protocol_prefix(name: &str) -> bool {
    match name.split_once(':') {
        Some((p, _)) => !p.is_empty() && !p.contains('/') && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ext4kit-vdisk-named-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        d
    }

    #[test]
    fn a_file_beside_the_image_is_followed() {
        let d = tmpdir("beside");
        std::fs::write(d.join("base.qcow2"), b"x").unwrap();
        std::fs::write(d.join("sub/deeper.img"), b"x").unwrap();
        let n = NamedFiles::beside(&d.join("top.qcow2"), false);
        assert_eq!(
            n.resolve("backing file", "base.qcow2").unwrap(),
            d.join("base.qcow2").canonicalize().unwrap()
        );
        assert!(n.resolve("backing file", "sub/deeper.img").is_ok());
        let abs = d.join("base.qcow2");
        assert!(
            n.resolve("backing file", abs.to_str().unwrap()).is_ok(),
            "absolute but inside"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn outside_paths_devices_and_urls_are_refused() {
        let d = tmpdir("refuse");
        let n = NamedFiles::beside(&d.join("sub/top.qcow2"), false);
        std::fs::write(d.join("up.img"), b"x").unwrap();
        for name in [
            "/etc/shadow",
            "../up.img",
            "/dev/null",
            "http://example.invalid/x",
            "nbd:localhost:10809",
            "json:{}",
        ] {
            let e = n.resolve("backing file", name).unwrap_err();
            assert!(e.to_string().contains(name), "{name}: {e}");
            assert_ne!(e.kind(), io::ErrorKind::NotFound, "{name}: {e}");
        }
        // A symlink beside the image pointing out of its directory.
        std::os::unix::fs::symlink("/etc/hostname", d.join("sub/link.img")).unwrap();
        assert!(n.resolve("backing file", "link.img").is_err());
        // With --any-backing-path: files anywhere, still never a device or a URL.
        let any = NamedFiles::beside(&d.join("sub/top.qcow2"), true);
        assert!(any.resolve("backing file", "../up.img").is_ok());
        assert!(any.resolve("backing file", "/dev/null").is_err());
        assert!(any.resolve("backing file", "https://example.invalid/x").is_err());
        assert!(NamedFiles::none().resolve("backing file", "up.img").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_missing_file_says_not_found_with_its_path() {
        let d = tmpdir("missing");
        let n = NamedFiles::beside(&d.join("top.qcow2"), false);
        let e = n.resolve("backing file", "gone.qcow2").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("gone.qcow2"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
