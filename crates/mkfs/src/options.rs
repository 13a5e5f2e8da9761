//! What mkfs is asked for, and the checks mke2fs makes of the request
//! before it computes anything (its `PRS()`): the device is writable and
//! large enough, the label fits, the reserve and the time are in range.

use ext4kit_blockdev::BlockDevice;
use ext4kit_format::readers::Reader;
use ext4kit_format::time::Clock;

use crate::error::{MkfsError, Result};

/// Which member of the family to make; selects the default features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsType {
    /// `sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr`.
    Ext2,
    /// ext2 plus `has_journal`.
    Ext3,
    /// ext3 plus `extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize`.
    Ext4,
}

impl FsType {
    /// Parse "ext2" / "ext3" / "ext4".
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ext2" => Some(Self::Ext2),
            "ext3" => Some(Self::Ext3),
            "ext4" => Some(Self::Ext4),
            _ => None,
        }
    }
}

/// What to make. `Default` is mke2fs's ext4 with a random UUID and hash
/// seed and the current time.
#[derive(Debug, Clone)]
pub struct MkfsOptions {
    /// ext2 / ext3 / ext4 (default features).
    pub fs_type: FsType,
    /// Block size in bytes (1024 .. 65536, a power of two); `None` picks
    /// 1024 below 512 MiB and 4096 otherwise.
    pub block_size: Option<u32>,
    /// Inode record size (128 .. block size, a power of two). mke2fs 1.47
    /// uses 256 for every size; 128-byte inodes cannot hold timestamps past
    /// 2038.
    pub inode_size: u16,
    /// Total number of inodes (`-N`); `None` derives it from the inode ratio.
    pub inodes: Option<u64>,
    /// Volume label (at most 16 bytes).
    pub label: String,
    /// Filesystem UUID; `None` draws a random (version 4) one.
    pub uuid: Option<[u8; 16]>,
    /// Directory hash seed; `None` draws a random one — or, when
    /// `clock` is fixed (a reproducible build), derives it from the UUID
    /// ([`crate::hash_seed_from_uuid`]), so a fixed `uuid` is all else it
    /// takes.
    pub hash_seed: Option<[u8; 16]>,
    /// Percentage of blocks reserved for root.
    pub reserved_percent: f64,
    /// The time every timestamp carries: `s_mkfs_time`, `s_wtime`,
    /// `s_lastcheck` and every inode time. A fixed clock
    /// ([`Clock::from_source_date_epoch`]) makes a reproducible build; the
    /// default is the system clock.
    pub clock: Clock,
    /// Feature edits applied after the type's defaults, in mke2fs `-O`
    /// syntax: `name` adds, `^name` removes, `none` clears everything.
    pub features: Vec<String>,
    /// The programs that must open the image (`--compat`): boot loaders,
    /// Android, an older kernel. The type's default features that any of
    /// them does not support are left out, and a `features` edit that
    /// asks for one is refused, so the image is found unreadable here
    /// rather than at boot. Empty: no restriction.
    pub readers: Vec<Reader>,
    /// The device already reads as zeros (a fresh sparse file), so inode
    /// tables and the journal need not be written.
    pub device_zeroed: bool,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            fs_type: FsType::Ext4,
            block_size: None,
            inode_size: 256,
            inodes: None,
            label: String::new(),
            uuid: None,
            hash_seed: None,
            reserved_percent: 5.0,
            clock: Clock::System,
            features: Vec::new(),
            readers: Vec::new(),
            device_zeroed: false,
        }
    }
}

impl MkfsOptions {
    /// The values that stand on their own: `s_volume_name` holds 16 bytes;
    /// mke2fs's `-m` accepts 0..50 percent; superblock times are 32 bits
    /// plus an 8-bit high byte (`s_mkfs_time_hi`), unsigned, so 0..2^40.
    pub(crate) fn check(&self) -> Result<()> {
        if self.label.len() > 16 {
            return Err(MkfsError::invalid(format!(
                "label \"{}\" longer than 16 bytes",
                self.label
            )));
        }
        if !(0.0..=50.0).contains(&self.reserved_percent) {
            return Err(MkfsError::invalid(format!(
                "reserved blocks percentage {} outside 0..50",
                self.reserved_percent
            )));
        }
        if let Clock::Fixed(ts) = self.clock {
            let t = ts.sec;
            if !(0..1 << 40).contains(&t) {
                return Err(MkfsError::invalid(format!("timestamp {t} outside 0..2^40 seconds")));
            }
        }
        Ok(())
    }
}

/// The device takes writes and holds the `size_bytes` asked for.
pub(crate) fn check_device(dev: &dyn BlockDevice, size_bytes: u64) -> Result<()> {
    if dev.read_only() {
        return Err(MkfsError::ReadOnly);
    }
    if size_bytes > dev.size() {
        return Err(MkfsError::invalid(format!(
            "filesystem size {size_bytes} exceeds the device ({} bytes)",
            dev.size()
        )));
    }
    Ok(())
}
