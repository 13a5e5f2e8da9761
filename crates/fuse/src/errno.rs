//! Engine errors to kernel errnos, in one place.

use fuser::Errno;

/// The errno the kernel returns to the caller for an engine error. The
/// engine's error values are Linux errnos, so this is a lossless cast;
/// corruption becomes EUCLEAN ("structure needs cleaning", the kernel's
/// EFSCORRUPTED) and device failure EIO, exactly as ext4 in the kernel.
pub fn errno(e: &ext4kit::Error) -> Errno {
    Errno::from_i32(e.errno() as i32)
}

/// The same, for results.
pub fn res<T>(r: ext4kit::Result<T>) -> Result<T, Errno> {
    r.map_err(|e| errno(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit::{Errno as E, Error};

    #[test]
    fn engine_errnos_pass_through() {
        assert_eq!(errno(&Error::posix(E::ENOENT, "x")), Errno::ENOENT);
        assert_eq!(errno(&Error::posix(E::ENAMETOOLONG, "x")), Errno::ENAMETOOLONG);
        assert_eq!(errno(&Error::io("x", std::io::Error::other("y"))), Errno::EIO);
        assert_eq!(errno(&Error::Unsupported("z".into())), Errno::EOPNOTSUPP);
        assert_eq!(
            errno(&Error::corrupt_msg("inode 12", "inode", "bad")).code(),
            libc::EUCLEAN
        );
    }
}
