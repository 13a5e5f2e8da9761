//! Whether a filesystem may be opened, and whether for writing, decided
//! from its superblock before anything is written (recovery writes, and
//! so does freeing orphans): the engine's one copy of the rule, used by
//! `Volume::open` and, before journal recovery, by the vfs layer's open.
//!
//! - an INCOMPAT feature we cannot read refuses the open
//!   (`ext4_feature_set_ok`);
//! - an RO_COMPAT feature we cannot maintain when writing, the
//!   `read-only` feature included, allows reading only (the kernel refuses
//!   a read-write mount of such an image; a read-write open here becomes
//!   read-only with the reason as a warning);
//! - `mmp`, multi-mount protection: we do not run the MMP protocol
//!   (sequence number updates every `s_mmp_update_interval` seconds in the
//!   MMP block, `ext4_multi_mount_protect`), so another host could not see
//!   our writes coming: reading only, which writes nothing.

use ext4kit_format::features::{self, incompat, OpenMode};
use ext4kit_format::superblock::Superblock;

/// How the filesystem with a given superblock may be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// For reading and writing.
    ReadWrite,
    /// For reading only; the reason, for the user.
    ReadOnly(String),
    /// Not at all; the reason.
    Refused(String),
}

/// The rule of the module doc for superblock `sb`.
pub fn access(sb: &Superblock) -> Access {
    match features::open_mode(sb.feature_compat, sb.feature_incompat, sb.feature_ro_compat) {
        OpenMode::Refuse(names) => Access::Refused(format!(
            "image uses incompatible feature(s) ext4kit does not implement: {}",
            names.join(", ")
        )),
        OpenMode::ReadOnly(names) => Access::ReadOnly(format!(
            "the filesystem uses read-only-compatible feature(s) ext4kit cannot write: {}",
            names.join(", ")
        )),
        OpenMode::ReadWrite if sb.has_incompat(incompat::MMP) => Access::ReadOnly(
            "the filesystem has multi-mount protection (mmp), which ext4kit does not implement for writing".into(),
        ),
        OpenMode::ReadWrite => Access::ReadWrite,
    }
}
