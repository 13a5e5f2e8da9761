//! Read-only or read-write, and the superblock's mount state: what a
//! frontend that mounts the filesystem (the FUSE server) asks the engine,
//! so the rule lives here once.
//!
//! The mode: a read-write open of a filesystem that must not be written
//! becomes read-only, decided from the superblock before anything is
//! written (`ext4::write_access`; the open: `open.rs`), and
//! [`Fs::read_only_reason`] says why. A mount without `-o ro` or `-o rw`
//! then serves read-only with that warning; `-o rw` is refused with it.
//!
//! The state, as the kernel's `ext4_setup_super` records a read-write
//! mount ([`Fs::record_mount`]): `s_mnt_count` goes up by one, `s_mtime`
//! is the mount time, `s_last_mounted` the mount point (as
//! `ext4_sample_last_mounted` records it), and — on a filesystem without a
//! journal only — `s_state` loses `EXT2_VALID_FS`, so that a crash leaves
//! an image e2fsck recognises as not cleanly unmounted and checks. With a
//! journal a crash leaves `needs_recovery` and a log to replay instead, and
//! the state stays valid. The warnings `ext4_setup_super` prints (not
//! cleanly unmounted, errors recorded, maximal mount count reached) are
//! returned for the user. At a clean unmount ([`Fs::record_unmount`]),
//! after everything is flushed, `s_state` gets back the value it had at
//! mount (`ext4_put_super` restores `s_mount_state`, so an image that was
//! not clean stays so until e2fsck has looked at it) and `s_wtime` is the
//! time of that write. Times come from the filesystem's clock.

use ext4kit_format::superblock::{STATE_ERROR, STATE_VALID};

use super::Fs;
use crate::error::{Errno, Error, Result};

/// What [`Fs::record_mount`] found, for [`Fs::record_unmount`].
#[derive(Debug, Clone, Copy)]
pub struct MountRecord {
    /// `s_state` at mount time (the kernel's `s_mount_state`).
    state: u16,
}

impl Fs {
    /// Whether the filesystem is open read-only (asked for, or decided at
    /// the open: [`Fs::read_only_reason`]).
    pub fn read_only(&self) -> bool {
        self.vol.read_only()
    }

    /// Why a read-write open became read-only (a feature we cannot write,
    /// `mmp`, a read-only device); `None` when it did not, or read-only
    /// was asked for.
    pub fn read_only_reason(&self) -> Option<&str> {
        self.read_only_reason.as_deref()
    }

    /// Record a read-write mount at `mount_point` in the superblock (see
    /// the module doc) and write it. Returns what
    /// [`Fs::record_unmount`] restores, and `ext4_setup_super`'s warnings.
    pub fn record_mount(&self, mount_point: &[u8]) -> Result<(MountRecord, Vec<String>)> {
        if self.read_only() {
            return Err(Error::posix(Errno::EROFS, "recording a mount: filesystem is read-only"));
        }
        let mut warnings = Vec::new();
        let now = self.now().sec;
        let state = {
            let mut sb = self.vol.sb().write();
            let state = sb.state;
            if state & STATE_VALID == 0 {
                warnings.push(
                    "the filesystem was not cleanly unmounted (or is in use elsewhere); running e2fsck is \
                     recommended"
                        .to_string(),
                );
            } else if state & STATE_ERROR != 0 {
                warnings.push("the filesystem has errors recorded; running e2fsck is recommended".to_string());
            }
            if sb.max_mnt_count as i16 > 0 && sb.mnt_count >= sb.max_mnt_count {
                warnings.push("the maximal mount count is reached; running e2fsck is recommended".to_string());
            }
            // The kernel clears EXT2_VALID_FS while mounted only without a
            // journal (ext4_setup_super): with one, a crash leaves a journal
            // to replay, and a replayed filesystem is as valid as it was.
            if !self.vol.jbd().is_journaled() {
                sb.state &= !STATE_VALID;
            }
            sb.mnt_count = sb.mnt_count.wrapping_add(1);
            sb.set_mtime(now);
            let n = mount_point.len().min(sb.last_mounted.len() - 1);
            sb.last_mounted = [0; 64];
            sb.last_mounted[..n].copy_from_slice(&mount_point[..n]);
            state
        };
        self.vol
            .metadata_changed()
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.sync()?;
        Ok((MountRecord { state }, warnings))
    }

    /// The clean unmount's superblock: everything is flushed
    /// ([`Fs::sync`]), then `s_state` is what it was at mount and
    /// `s_wtime` now.
    pub fn record_unmount(&self, m: MountRecord) -> Result<()> {
        self.sync()?;
        {
            let mut sb = self.vol.sb().write();
            sb.state = m.state;
            sb.set_wtime(self.now().sec);
        }
        self.vol
            .metadata_changed()
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.sync()
    }
}

#[cfg(test)]
mod tests {
    use crate::vfs::mem_fs as fs;

    #[test]
    fn a_mount_is_recorded_and_its_state_restored() {
        let fs = fs();
        let (count0, state0) = {
            let sb = fs.vol.sb().read();
            (sb.mnt_count, sb.state)
        };
        let (rec, warnings) = fs.record_mount(b"/mnt/x").unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        {
            let sb = fs.vol.sb().read();
            assert_eq!(sb.mnt_count, count0 + 1);
            assert_eq!(&sb.last_mounted[..7], b"/mnt/x\0");
            assert!(sb.mtime() > 0);
        }
        fs.record_unmount(rec).unwrap();
        assert_eq!(fs.vol.sb().read().state, state0);
        assert!(!fs.read_only() && fs.read_only_reason().is_none());
    }
}
