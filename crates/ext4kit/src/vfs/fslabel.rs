//! The filesystem label (`s_volume_name`), as the `FS_IOC_GETFSLABEL` /
//! `FS_IOC_SETFSLABEL` ioctls of ext4 read and write it
//! (`ext4_ioctl_getlabel` / `ext4_ioctl_setlabel`).
//!
//! The on-disk field is 16 bytes, not necessarily NUL-terminated; a new
//! label of more than 16 bytes is EINVAL, and the field is zero-filled
//! past it. The change is journaled with the superblock
//! (`Volume::sync_super`). ext4 also rewrites the backup superblocks
//! (`ext4_update_superblocks_fn`); we change the primary only, which
//! e2fsck does not compare with the backups for this field, and a later
//! `tune2fs`/e2fsck run refreshes them. Setting it needs CAP_SYS_ADMIN
//! (root).

use super::cred::Cred;
use super::Fs;
use crate::error::{Errno, Error, Result};

/// Longest ext4 label (`EXT4_LABEL_MAX`).
pub const LABEL_MAX: usize = 16;

impl Fs {
    /// The label: `s_volume_name` up to its first NUL (at most 16 bytes).
    pub fn fs_label(&self) -> Vec<u8> {
        let sb = self.vol.sb().read();
        let end = sb.volume_name.iter().position(|&b| b == 0).unwrap_or(LABEL_MAX);
        sb.volume_name[..end].to_vec()
    }

    /// Set the label to `label` (up to its first NUL) for `cred`, in
    /// `ext4_ioctl_setlabel`'s order: EPERM unless root (CAP_SYS_ADMIN),
    /// EINVAL if longer than 16 bytes, EROFS on a read-only filesystem.
    pub fn set_fs_label(&self, label: &[u8], cred: &Cred) -> Result<()> {
        if !cred.is_root() {
            return Err(Error::posix(Errno::EPERM, "setting the label needs CAP_SYS_ADMIN"));
        }
        let end = label.iter().position(|&b| b == 0).unwrap_or(label.len());
        let label = &label[..end];
        if label.len() > LABEL_MAX {
            return Err(Error::posix(
                Errno::EINVAL,
                format!("a label has at most {LABEL_MAX} bytes, not {}", label.len()),
            ));
        }
        if self.vol.read_only() {
            return Err(Error::posix(Errno::EROFS, "filesystem is read-only"));
        }
        {
            let mut sb = self.vol.sb().write();
            sb.volume_name = [0; LABEL_MAX];
            sb.volume_name[..label.len()].copy_from_slice(label);
        }
        self.vol.sync_super()
    }
}

#[cfg(test)]
mod tests {
    use crate::mkfs::{mkfs, MkfsOptions};

    #[test]
    fn label_round_trips_and_long_labels_are_refused() {
        let dev = std::sync::Arc::new(crate::device::MemDevice::new(8 << 20));
        mkfs(&*dev, 8 << 20, &MkfsOptions::default()).unwrap();
        let opts = crate::OpenOptions {
            read_only: false,
            cache_budget: 8 << 20,
            ..Default::default()
        };
        let fs = crate::Fs::open_device(dev.clone(), &opts).unwrap();
        fs.set_fs_label(b"sixteen-bytes-ok", &crate::Cred::root()).unwrap();
        assert_eq!(fs.fs_label(), b"sixteen-bytes-ok");
        assert_eq!(
            fs.set_fs_label(b"seventeen-bytes!!", &crate::Cred::root())
                .unwrap_err()
                .errno(),
            crate::Errno::EINVAL
        );
        fs.set_fs_label(b"short\0ignored", &crate::Cred::root()).unwrap();
        assert_eq!(
            fs.set_fs_label(b"x", &crate::Cred::user(1, 1)).unwrap_err().errno(),
            crate::Errno::EPERM
        );
        assert_eq!(fs.fs_label(), b"short");
        fs.sync().unwrap();
        drop(fs);
        let fs = crate::Fs::open_device(dev, &opts).unwrap();
        assert_eq!(fs.fs_label(), b"short");
    }
}
