//! How a command fails: one message naming the image, the path and the
//! cause, printed on stderr as `ext4kit: MESSAGE`, or with `--json` as one
//! JSON object per line, `{"error": {"message": .., "path": .., "errno":
//! ..}}` (`path`, the path inside the image, and `errno`, the POSIX name
//! of the cause, are `null` when not known). The exit status is 1 either
//! way.

use serde_json::{json, Value};

use crate::image::Image;

/// Format an engine error for a path in an image.
pub fn err(image: &Image, path: &str, e: ext4kit::Error) -> String {
    // Engine messages for path lookups already name the path.
    let s = e.to_string();
    if s.starts_with(path) || s.starts_with(&format!("/{path}")) {
        format!("{}: {s}", image.display())
    } else {
        format!("{}: {path}: {s}", image.display())
    }
}

/// A command's failure (see the module doc).
#[derive(Debug)]
pub struct Failure {
    message: String,
    path: Option<String>,
    errno: Option<&'static str>,
    /// Already printed (a command that goes on after a failure prints
    /// each one as it meets it, then ends with this).
    reported: bool,
}

impl Failure {
    /// An engine error about `path` in `image` (the message as
    /// [`err`] words it).
    pub fn engine(image: &Image, path: &str, e: ext4kit::Error) -> Failure {
        let errno = errno_of(&e);
        Failure {
            message: err(image, path, e),
            path: Some(path.to_string()),
            errno,
            reported: false,
        }
    }

    /// An engine error about the image as a whole (opening it, statfs).
    pub fn image(image: &Image, e: ext4kit::Error) -> Failure {
        Failure {
            errno: errno_of(&e),
            message: format!("{}: {e}", image.display()),
            path: None,
            reported: false,
        }
    }

    /// Print this failure on stderr, as text or as a JSON line.
    pub fn report(&self, json: bool) {
        if json {
            eprintln!("{}", self.to_json());
        } else {
            eprintln!("ext4kit: {}", self.message);
        }
    }

    /// Print it now and return it marked as printed: for a command that
    /// goes on after a failure and fails at its end.
    pub fn reported(mut self, json: bool) -> Failure {
        if !self.reported {
            self.report(json);
            self.reported = true;
        }
        self
    }

    /// Whether it was printed already.
    pub fn was_reported(&self) -> bool {
        self.reported
    }

    /// The `{"error": ..}` object.
    pub fn to_json(&self) -> Value {
        json!({"error": {"message": self.message, "path": self.path, "errno": self.errno}})
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure {
            message,
            path: None,
            errno: None,
            reported: false,
        }
    }
}

impl From<Failure> for String {
    fn from(f: Failure) -> String {
        f.message
    }
}

/// The POSIX name of an engine error's cause: its errno, or for a device
/// error the operating system's error beneath it.
fn errno_of(e: &ext4kit::Error) -> Option<&'static str> {
    if let ext4kit::Error::Io { source, .. } = e {
        return Some(source.raw_os_error().and_then(os_errno_name).unwrap_or("EIO"));
    }
    errno_name(e.errno())
}

/// The name of an engine errno.
fn errno_name(e: ext4kit::Errno) -> Option<&'static str> {
    use ext4kit::Errno::*;
    Some(match e {
        EPERM => "EPERM",
        ENOENT => "ENOENT",
        EIO => "EIO",
        E2BIG => "E2BIG",
        ENXIO => "ENXIO",
        EBADF => "EBADF",
        EACCES => "EACCES",
        EBUSY => "EBUSY",
        EEXIST => "EEXIST",
        EXDEV => "EXDEV",
        ENOTDIR => "ENOTDIR",
        EISDIR => "EISDIR",
        EINVAL => "EINVAL",
        EMFILE => "EMFILE",
        EFBIG => "EFBIG",
        ENOSPC => "ENOSPC",
        EROFS => "EROFS",
        EMLINK => "EMLINK",
        ERANGE => "ERANGE",
        ENAMETOOLONG => "ENAMETOOLONG",
        ENOTEMPTY => "ENOTEMPTY",
        ELOOP => "ELOOP",
        ENODATA => "ENODATA",
        EOVERFLOW => "EOVERFLOW",
        EOPNOTSUPP => "EOPNOTSUPP",
        ESTALE => "ESTALE",
        EUCLEAN => "EUCLEAN",
    })
}

/// The name of a Linux errno number the engine's set has a name for.
fn os_errno_name(n: i32) -> Option<&'static str> {
    use ext4kit::Errno::*;
    let all = [
        EPERM,
        ENOENT,
        EIO,
        E2BIG,
        ENXIO,
        EBADF,
        EACCES,
        EBUSY,
        EEXIST,
        EXDEV,
        ENOTDIR,
        EISDIR,
        EINVAL,
        EMFILE,
        EFBIG,
        ENOSPC,
        EROFS,
        EMLINK,
        ERANGE,
        ENAMETOOLONG,
        ENOTEMPTY,
        ELOOP,
        ENODATA,
        EOVERFLOW,
        EOPNOTSUPP,
        ESTALE,
        EUCLEAN,
    ];
    all.into_iter().find(|&e| e as i32 == n).and_then(errno_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(errno_name(ext4kit::Errno::ENOENT), Some("ENOENT"));
        assert_eq!(os_errno_name(13), Some("EACCES"));
        assert_eq!(os_errno_name(4242), None);
        let io = ext4kit::Error::io("reading", std::io::Error::from_raw_os_error(2));
        assert_eq!(errno_of(&io), Some("ENOENT"));
    }
}
