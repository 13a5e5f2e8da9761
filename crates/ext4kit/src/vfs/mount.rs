//! Read-only or read-write, and the superblock's mount state: what a
//! frontend that mounts the filesystem (the FUSE server) asks the engine,
//! so the rule lives here once.
//!
//! The mode: a read-write open of a filesystem that must not be written
//! becomes read-only, decided from the superblock before anything is
//! written (`ext4::write_access`; the open: `open.rs`), and
//! [`Fs::read_only_reason`](crate::Fs::read_only_reason) says why. A mount without `-o ro` or `-o rw`
//! then serves read-only with that warning; `-o rw` is refused with it.
//!
//! The state, as the kernel's `ext4_setup_super` records a read-write
//! mount ([`Fs::record_mount`](crate::Fs::record_mount)): `s_mnt_count` goes up by one, `s_mtime`
//! is the mount time, `s_last_mounted` the mount point (as
//! `ext4_sample_last_mounted` records it), and — on a filesystem without a
//! journal only — `s_state` loses `EXT2_VALID_FS`, so that a crash leaves
//! an image e2fsck recognises as not cleanly unmounted and checks. With a
//! journal a crash leaves `needs_recovery` and a log to replay instead, and
//! the state stays valid. The warnings `ext4_setup_super` prints (not
//! cleanly unmounted, errors recorded, maximal mount count reached) are
//! returned for the user. At a clean unmount ([`Fs::record_unmount`](crate::Fs::record_unmount)),
//! after everything is flushed, `s_state` gets back the value it had at
//! mount (`ext4_put_super` restores `s_mount_state`, so an image that was
//! not clean stays so until e2fsck has looked at it) and `s_wtime` is the
//! time of that write. Times come from the filesystem's clock.

use ext4kit_format::superblock::{STATE_ERROR, STATE_VALID};

use super::super_block::SuperBlock;
use super::{write, writeback};
use crate::error::{Errno, Error, Result};

/// What [`Fs::record_mount`](crate::Fs::record_mount) found, for [`Fs::record_unmount`](crate::Fs::record_unmount).
#[derive(Debug, Clone, Copy)]
pub struct MountRecord {
    /// `s_state` at mount time (the kernel's `s_mount_state`).
    state: u16,
}

/// The work of [`Fs::read_only`](crate::Fs::read_only).
pub(crate) fn read_only(sb: &SuperBlock) -> bool {
    sb.vol().read_only()
}

/// The work of [`Fs::record_mount`](crate::Fs::record_mount).
pub(crate) fn record_mount(sb: &SuperBlock, mount_point: &[u8]) -> Result<(MountRecord, Vec<String>)> {
    if read_only(sb) {
        return Err(Error::posix(Errno::EROFS, "recording a mount: filesystem is read-only"));
    }
    let mut warnings = Vec::new();
    let now = sb.now().sec;
    let state = {
        let mut s = sb.vol().sb().write();
        let state = s.state;
        if state & STATE_VALID == 0 {
            warnings.push(
                "the filesystem was not cleanly unmounted (or is in use elsewhere); running e2fsck is \
                 recommended"
                    .to_string(),
            );
        } else if state & STATE_ERROR != 0 {
            warnings.push("the filesystem has errors recorded; running e2fsck is recommended".to_string());
        }
        if s.max_mnt_count as i16 > 0 && s.mnt_count >= s.max_mnt_count {
            warnings.push("the maximal mount count is reached; running e2fsck is recommended".to_string());
        }
        // The kernel clears EXT2_VALID_FS while mounted only without a
        // journal (ext4_setup_super): with one, a crash leaves a journal
        // to replay, and a replayed filesystem is as valid as it was.
        if !sb.vol().jbd().is_journaled() {
            s.state &= !STATE_VALID;
        }
        s.mnt_count = s.mnt_count.wrapping_add(1);
        s.set_mtime(now);
        let n = mount_point.len().min(s.last_mounted.len() - 1);
        s.last_mounted = [0; 64];
        s.last_mounted[..n].copy_from_slice(&mount_point[..n]);
        state
    };
    sb.vol()
        .metadata_changed()
        .store(true, std::sync::atomic::Ordering::Relaxed);
    write::sync(sb)?;
    Ok((MountRecord { state }, warnings))
}

/// The work of [`Fs::record_unmount`](crate::Fs::record_unmount).
pub(crate) fn record_unmount(sb: &SuperBlock, m: MountRecord) -> Result<()> {
    write::sync(sb)?;
    {
        let mut s = sb.vol().sb().write();
        s.state = m.state;
        s.set_wtime(sb.now().sec);
    }
    sb.vol()
        .metadata_changed()
        .store(true, std::sync::atomic::Ordering::Relaxed);
    write::sync(sb)
}

/// The close of a filesystem (`ext4_put_super`), what dropping the last
/// [`Fs`] handle does: the worker stops, what is dirty is written back as
/// an unmount does — committed metadata waits for a checkpoint, and a
/// library user who never calls `sync` must not lose it — and the cached
/// pages go. Nothing is written when nothing is dirty (a read-write open
/// that only read leaves the image's bytes alone). A close cannot return
/// an error (it runs in a drop), so a failure is printed.
pub(crate) fn close(sb: &mut SuperBlock) {
    // First the worker: a checkpoint of its own must not run on after
    // the final one below, nor after the caller got its image back.
    sb.stop_flusher();
    if !sb.vol().read_only() {
        write_back_at_close(sb);
    }
    sb.drop_pages();
}

/// The write-back of [`close`].
fn write_back_at_close(sb: &SuperBlock) {
    // A file that cannot be written back does not keep the rest from
    // being closed cleanly (`write::sync`): its error is printed below.
    let wb = writeback::writeback_all(sb);
    let j = sb.vol().jbd();
    let r = match j.is_journaled() {
        // A clean close of a journaled volume: everything committed,
        // written home, the log emptied and needs_recovery cleared —
        // only if anything was ever written (an open that only read
        // leaves the image alone).
        true => {
            if j.running_is_empty() && j.checkpoint_len() == 0 && !j.needs_recovery_on_disk() {
                Ok(())
            } else {
                let again = writeback::writeback_all(sb);
                sb.vol()
                    .sync_super()
                    .and_then(|()| sb.vol().close_journal(true))
                    .and(again)
            }
        }
        false => {
            if j.checkpoint_len() == 0 {
                Ok(())
            } else {
                write::sync(sb)
            }
        }
    };
    let r = wb.and(r);
    if let Err(e) = r {
        eprintln!("ext4kit: writing back at close failed, the image may lose recent changes: {e}");
    }
}

#[cfg(test)]
mod tests {
    use crate::vfs::mem_fs as fs;

    #[test]
    fn a_mount_is_recorded_and_its_state_restored() {
        let fs = fs();
        let (count0, state0) = {
            let sb = fs.volume().sb().read();
            (sb.mnt_count, sb.state)
        };
        let (rec, warnings) = fs.record_mount(b"/mnt/x").unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        {
            let sb = fs.volume().sb().read();
            assert_eq!(sb.mnt_count, count0 + 1);
            assert_eq!(&sb.last_mounted[..7], b"/mnt/x\0");
            assert!(sb.mtime() > 0);
        }
        fs.record_unmount(rec).unwrap();
        assert_eq!(fs.volume().sb().read().state, state0);
        assert!(!fs.read_only() && fs.read_only_reason().is_none());
    }
}
