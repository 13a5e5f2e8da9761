//! Errors of a build, each naming the source and the entry (or archive
//! member) it is about and why, so a user can find the culprit.

use std::path::Path;

/// A build's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The source (a path) or the image the error is about.
    place: String,
    /// The entry, member or path within it, when there is one.
    entry: Option<String>,
    /// Why.
    reason: String,
}

/// What the build calls return.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error about a source as a whole.
    pub fn source(path: &Path, reason: impl Into<String>) -> Self {
        Error {
            place: path.display().to_string(),
            entry: None,
            reason: reason.into(),
        }
    }

    /// An error about one entry of a source.
    pub fn entry(place: impl Into<String>, entry: impl Into<String>, reason: impl Into<String>) -> Self {
        Error {
            place: place.into(),
            entry: Some(entry.into()),
            reason: reason.into(),
        }
    }

    /// Why, without the place.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The entry the error is about, when there is one.
    pub fn entry_name(&self) -> Option<&str> {
        self.entry.as_deref()
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.entry {
            Some(e) => write!(f, "{}: {}: {}", self.place, e, self.reason),
            None => write!(f, "{}: {}", self.place, self.reason),
        }
    }
}

impl std::error::Error for Error {}
