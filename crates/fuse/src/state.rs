//! Read-only or read-write, and the superblock's mount state.
//!
//! An image whose journal needs recovery is not a reason: a read-write
//! mount replays the journal on disk first, as the kernel's mount does (a
//! read-only one replays it in memory; see `ext4kit::ext4::journal`).
//!
//! Choosing the mode follows the compatibility contract (ARCHITECTURE.md),
//! decided from the superblock before the image is opened for writing
//! (opening read-write already writes: orphans are freed). A mount without
//! `-o ro` or `-o rw` is read-write when nothing forbids it, and read-only
//! with a warning naming the reason when something does; `-o rw` is refused
//! with that reason instead. Reasons:
//!
//! - a read-only-compatible feature we cannot maintain when writing
//!   (`RO_COMPAT_WRITE_SUPPORTED`), including the `read-only` feature;
//! - `mmp`: multi-mount protection. We do not implement the MMP protocol
//!   (sequence number updates every `s_mmp_update_interval` seconds in the
//!   MMP block, `ext4_multi_mount_protect`), so another host could not see
//!   our mount: read-write is refused, read-only is allowed (it writes
//!   nothing);
//! - the image file (or device) cannot be opened for writing.
//!
//! While mounted read-write the superblock says so, as the kernel's
//! `ext4_setup_super` does: `s_mnt_count` goes up by one, `s_mtime` is the
//! mount time (and `s_last_mounted` the mount point, as
//! `ext4_sample_last_mounted` records it), and — on an image without a
//! journal only — `s_state` loses `EXT2_VALID_FS`, so that a crash (kill
//! -9) leaves an image e2fsck recognises as not cleanly unmounted and
//! checks. With a journal a crash leaves `needs_recovery` and a log to
//! replay instead, and the state stays valid. At a clean unmount, after everything is flushed,
//! `s_state` gets back the value it had at mount (`ext4_put_super`
//! restores `s_mount_state`, so an image that was not clean stays so until
//! e2fsck has looked at it) and `s_wtime` is the time of that write.

use std::path::Path;
use std::sync::Arc;

use ext4kit::{Fs, Location};
use ext4kit_blockdev::{open_location, BlockDevice, FileDevice};
use ext4kit_format::features::{self, incompat, OpenMode};
use ext4kit_format::superblock::{Superblock, STATE_ERROR, STATE_VALID, SUPERBLOCK_OFFSET};

/// Why an image cannot be mounted read-write (`None`: it can), read from
/// the superblock of the filesystem at `location` of it. Errors reading or
/// parsing it are left to the real open, which reports them with context.
pub fn read_only_reason(image: &Path, location: Location) -> Option<String> {
    let sb = read_superblock(image, location)?;
    if sb.has_incompat(incompat::MMP) {
        return Some("it has multi-mount protection (mmp), which ext4kit does not implement for writing".to_string());
    }
    if let OpenMode::ReadOnly(names) = features::open_mode(sb.feature_compat, sb.feature_incompat, sb.feature_ro_compat)
    {
        return Some(format!(
            "it uses read-only-compatible feature(s) ext4kit cannot write: {}",
            names.join(", ")
        ));
    }
    None
}

/// The superblock at byte 1024 of the filesystem at `location` (through
/// the same partition or offset window the mount will use).
fn read_superblock(image: &Path, location: Location) -> Option<Superblock> {
    let disk: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(image, false).ok()?);
    let dev = open_location(disk, location).ok()?;
    let mut raw = vec![0u8; Superblock::SIZE];
    dev.read_at(SUPERBLOCK_OFFSET, &mut raw).ok()?;
    Superblock::parse(&raw).ok()
}

/// What [`mark_mounted`] found, for [`mark_unmounted`].
#[derive(Debug, Clone, Copy)]
pub struct MountState {
    /// `s_state` at mount time (the kernel's `s_mount_state`).
    state: u16,
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Record a read-write mount in the superblock (see the module doc) and
/// write it. Returns the state to restore and warnings for the user.
pub fn mark_mounted(fs: &Fs, mount_point: &Path) -> ext4kit::Result<(MountState, Vec<String>)> {
    let mut warnings = Vec::new();
    let state = {
        let mut sb = fs.vol.sb().write();
        let state = sb.state;
        // The kernel's ext4_setup_super warnings.
        if state & STATE_VALID == 0 {
            warnings.push(
                "the filesystem was not cleanly unmounted (or is in use elsewhere); running e2fsck is recommended"
                    .to_string(),
            );
        } else if state & STATE_ERROR != 0 {
            warnings.push("the filesystem has errors recorded; running e2fsck is recommended".to_string());
        }
        if sb.max_mnt_count as i16 > 0 && sb.mnt_count >= sb.max_mnt_count {
            warnings.push("the maximal mount count is reached; running e2fsck is recommended".to_string());
        }
        // The kernel clears EXT2_VALID_FS while mounted only without a
        // journal (ext4_setup_super): with one, a crash leaves a journal to
        // replay, and a replayed filesystem is as valid as it was.
        if !fs.vol.jbd().is_journaled() {
            sb.state &= !STATE_VALID;
        }
        sb.mnt_count = sb.mnt_count.wrapping_add(1);
        let t = now_secs();
        sb.set_mtime(t);
        let mp = mount_point.as_os_str().as_encoded_bytes();
        let n = mp.len().min(sb.last_mounted.len() - 1);
        sb.last_mounted = [0; 64];
        sb.last_mounted[..n].copy_from_slice(&mp[..n]);
        state
    };
    fs.sync()?;
    Ok((MountState { state }, warnings))
}

/// The clean unmount's superblock: everything is flushed (`Fs::sync`),
/// then `s_state` is what it was at mount and `s_wtime` now.
pub fn mark_unmounted(fs: &Fs, m: MountState) -> ext4kit::Result<()> {
    fs.sync()?;
    {
        let mut sb = fs.vol.sb().write();
        sb.state = m.state;
        let t = now_secs();
        sb.set_wtime(t);
    }
    fs.sync()
}
