//! The rules every new container's request is checked by: whole sectors,
//! allocation units that are powers of two within the format's range,
//! and how a VHD records its size. A leaf module: the format folders'
//! `create.rs` and the dispatcher in `create.rs` both use it.

use std::io;

use crate::DiskFormat;

/// The sector every format counts the disk in.
pub(crate) const SECTOR: u64 = 512;

/// How a VHD records its size. The footer holds both a CHS geometry and
/// a byte size, and readers disagree on which counts: Virtual PC (and
/// qemu, for images it made as creator "qemu") use the geometry, Hyper-V
/// and Windows use the byte size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VhdSizing {
    /// Round the size up to the next whole CHS geometry (as `qemu-img
    /// create -f vpc` does, creator "qemu"), so the geometry and the byte
    /// size agree and every reader sees the same disk. From 127 GiB up
    /// the geometry is at its maximum and the byte size counts alone, so
    /// the size is kept as asked.
    #[default]
    Geometry,
    /// Keep the size as asked (creator "qem2", as `qemu-img create -o
    /// force_size=on`): Hyper-V, Windows and qemu read the byte size; a
    /// reader that goes by the geometry alone sees up to a few MiB less.
    Exact,
}

/// `size` rounded up to whole sectors; a size of 0 is refused.
pub(crate) fn sectors(format: DiskFormat, size: u64) -> io::Result<u64> {
    if size == 0 {
        return Err(invalid(format, "a disk of 0 bytes cannot be created"));
    }
    size.checked_next_multiple_of(SECTOR)
        .ok_or_else(|| invalid(format, format_args!("a disk of {size} bytes is too large")))
}

/// The error for a request the format cannot meet: `InvalidInput`, naming
/// the format.
pub(crate) fn invalid(format: DiskFormat, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{format}: {what}"))
}

/// `unit`, or `default`, checked to be a power of two in `range`; `what`
/// names it in the error.
pub(crate) fn unit_or(
    format: DiskFormat,
    unit: Option<u64>,
    default: u64,
    range: std::ops::RangeInclusive<u64>,
    what: &str,
) -> io::Result<u64> {
    let u = unit.unwrap_or(default);
    if !u.is_power_of_two() || !range.contains(&u) {
        return Err(invalid(
            format,
            format_args!(
                "{what} {u} is not a power of two from {} to {} bytes",
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(u)
}
