//! VHD (Virtual PC, Azure): fixed and dynamic disks, read and write.
//!
//! A fixed VHD is the disk's bytes followed by a 512-byte footer
//! ([`footer`]). A dynamic VHD starts with a copy of the footer, then a
//! header and a block allocation table ([`dynamic`]); blocks are appended
//! as they are first written, and the footer moves to the new end of the
//! file. Differencing disks (a dynamic disk over a parent) are refused.
//!
//! Writing a new block follows the format's safe order: the block (its
//! sector bitmap all set, its data zero-filled around what is written) and
//! the footer after it reach the file first; the BAT entry pointing at it
//! is written at the next [`BlockDevice::flush`], after a flush has made
//! the block durable, and a second flush makes the entry durable. A power
//! cut therefore leaves at worst a block no entry points to, never an
//! entry pointing at garbage; the copy of the footer in the first sector
//! keeps the file readable even if the footer at the end was not written.

mod create;
mod dynamic;
mod footer;

use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{corrupt, unsupported, BlockDevice, DiskFormat, DiskImage, LayerInfo};
use dynamic::{Bat, Header, HEADER_LEN};
use footer::{DiskType, Footer, FOOTER_LEN};

const FORMAT: DiskFormat = DiskFormat::Vhd;

pub(crate) use create::create;

/// A fixed or dynamic VHD presented as its disk.
pub struct VhdDisk {
    file: Arc<dyn BlockDevice>,
    footer: Footer,
    size: u64,
    writable: bool,
    /// The block table of a dynamic disk; `None` for a fixed one.
    dynamic: Option<Dynamic>,
}

/// A dynamic disk's table and allocation state.
struct Dynamic {
    header: Header,
    bat: Bat,
    /// Where the next block goes (where the footer is now): serializes
    /// allocation.
    end: Mutex<u64>,
}

impl std::fmt::Debug for VhdDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhdDisk")
            .field("type", &self.footer.disk_type())
            .field("size", &self.size)
            .field("writable", &self.writable)
            .finish()
    }
}

fn read_footer(file: &dyn BlockDevice, at: u64) -> Result<Footer, String> {
    let mut raw = [0u8; FOOTER_LEN];
    file.read_at(at, &mut raw).map_err(|e| e.to_string())?;
    Footer::parse(&raw)
}

impl VhdDisk {
    /// Open the VHD held by `file`, read-write if `writable`.
    pub fn open(file: Arc<dyn BlockDevice>, writable: bool) -> io::Result<VhdDisk> {
        let file_size = file.size();
        if file_size < FOOTER_LEN as u64 {
            return Err(corrupt(
                FORMAT,
                format_args!("a {file_size}-byte file cannot hold a footer"),
            ));
        }
        // The footer at the end is authoritative; a dynamic disk's copy in
        // sector 0 stands in when the end was cut short (a crash between
        // appending a block and writing the footer after it), as qemu's
        // vpc_open reads it.
        let end_footer = read_footer(&*file, file_size - FOOTER_LEN as u64);
        let (footer, footer_at_end) = match end_footer {
            Ok(f) => (f, true),
            Err(end_err) => match read_footer(&*file, 0) {
                Ok(f) if f.disk_type() != DiskType::Fixed => (f, false),
                _ => {
                    return Err(corrupt(
                        FORMAT,
                        format_args!("the footer in the last sector: {end_err}"),
                    ))
                }
            },
        };
        let size = footer.virtual_size();
        let dynamic = match footer.disk_type() {
            DiskType::Differencing => {
                return Err(unsupported(
                    FORMAT,
                    "a differencing disk (changes over a parent VHD) is not supported; merge it first \
                     (qemu-img convert -O vpc)",
                ))
            }
            DiskType::Fixed => {
                if size > file_size - FOOTER_LEN as u64 {
                    return Err(corrupt(
                        FORMAT,
                        format_args!(
                            "a fixed disk of {size} bytes in a {file_size}-byte file (data and a 512-byte footer)"
                        ),
                    ));
                }
                None
            }
            DiskType::Dynamic => Some(Self::open_dynamic(&*file, &footer, size, footer_at_end)?),
        };
        if writable && file.read_only() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "vhd: the file is open read-only",
            ));
        }
        Ok(VhdDisk {
            file,
            footer,
            size,
            writable,
            dynamic,
        })
    }

    fn open_dynamic(file: &dyn BlockDevice, footer: &Footer, size: u64, footer_at_end: bool) -> io::Result<Dynamic> {
        let file_size = file.size();
        let at = footer.data_offset();
        if at.checked_add(HEADER_LEN as u64).is_none_or(|e| e > file_size) || at < FOOTER_LEN as u64 {
            return Err(corrupt(
                FORMAT,
                format_args!("the dynamic header's offset {at} is outside the {file_size}-byte file"),
            ));
        }
        let mut raw = [0u8; HEADER_LEN];
        file.read_at(at, &mut raw)?;
        let header =
            Header::parse(&raw).map_err(|e| corrupt(FORMAT, format_args!("dynamic header at byte {at}: {e}")))?;
        let bat_len = header.max_entries as u64 * 4;
        let bat_end = header
            .table_offset
            .checked_add(bat_len)
            .filter(|&e| e <= file_size && header.table_offset >= FOOTER_LEN as u64)
            .ok_or_else(|| {
                corrupt(
                    FORMAT,
                    format_args!(
                        "the block table ({} entries at byte {}) is outside the {file_size}-byte file",
                        header.max_entries, header.table_offset
                    ),
                )
            })?;
        let blocks_needed = size.div_ceil(header.block_size);
        if blocks_needed > header.max_entries as u64 {
            return Err(corrupt(
                FORMAT,
                format_args!(
                    "a {size}-byte disk needs {blocks_needed} blocks of {}, the table has {} entries",
                    header.block_size, header.max_entries
                ),
            ));
        }
        let mut raw_bat = vec![0u8; bat_len as usize];
        file.read_at(header.table_offset, &mut raw_bat)?;
        let bat = Bat::from_bytes(&raw_bat);
        // Every allocated block lies in the file, after the tables, and no
        // two overlap: a hostile table could otherwise make a write to one
        // block change another, or the table itself.
        let span = header.bitmap_len() + header.block_size;
        let meta_end = bat_end.max(at + HEADER_LEN as u64);
        let mut starts: Vec<(u64, u64)> = Vec::new();
        for (i, sector) in bat.allocated() {
            let start = sector as u64 * 512;
            if i >= blocks_needed || start < meta_end || start + span > file_size {
                return Err(corrupt(
                    FORMAT,
                    format_args!(
                        "block table entry {i} points at byte {start}: {}",
                        if i >= blocks_needed {
                            "past the disk's end".to_string()
                        } else if start < meta_end {
                            "inside the header or the table".to_string()
                        } else {
                            format!("the block runs past the end of the {file_size}-byte file")
                        }
                    ),
                ));
            }
            starts.push((start, i));
        }
        starts.sort_unstable();
        for w in starts.windows(2) {
            if w[0].0 + span > w[1].0 {
                return Err(corrupt(
                    FORMAT,
                    format_args!(
                        "block table entries {} and {} overlap (bytes {} and {})",
                        w[0].1, w[1].1, w[0].0, w[1].0
                    ),
                ));
            }
        }
        let data_end = starts.last().map_or(meta_end, |s| s.0 + span).max(meta_end);
        let end = if footer_at_end {
            file_size - FOOTER_LEN as u64
        } else {
            file_size
        };
        Ok(Dynamic {
            header,
            bat,
            end: Mutex::new(end.max(data_end).next_multiple_of(512)),
        })
    }

    fn past_end(&self, off: u64, len: usize) -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "vhd: {len} bytes at offset {off} run past the end of the {}-byte disk",
                self.size
            ),
        )
    }

    /// Write `buf` into block `i` at `in_block`, allocating the block.
    fn write_block(&self, d: &Dynamic, i: u64, in_block: u64, buf: &[u8]) -> io::Result<()> {
        let data_off = |sector: u32| sector as u64 * 512 + d.header.bitmap_len() + in_block;
        if let Some(s) = d.bat.get(i) {
            return self.file.write_at(data_off(s), buf);
        }
        let mut end = d.end.lock();
        // Allocated by another writer while we waited.
        if let Some(s) = d.bat.get(i) {
            return self.file.write_at(data_off(s), buf);
        }
        let start = *end;
        let sector = u32::try_from(start / 512)
            .ok()
            .filter(|&s| s != dynamic::UNALLOCATED)
            .ok_or_else(|| {
                unsupported(
                    FORMAT,
                    "the file would grow past the 2 TiB a block table entry can address",
                )
            })?;
        let bitmap = d.header.bitmap_len() as usize;
        let mut block = vec![0u8; bitmap + d.header.block_size as usize];
        block[..bitmap].fill(0xFF);
        block[bitmap + in_block as usize..][..buf.len()].copy_from_slice(buf);
        self.file.write_at(start, &block)?;
        let new_end = start + block.len() as u64;
        self.file.write_at(new_end, self.footer.bytes())?;
        *end = new_end;
        d.bat.set(i, sector);
        Ok(())
    }
}

/// `len` bytes at disk offset `off` cut at block boundaries: (block index,
/// offset in the block, the piece's range in the caller's buffer).
fn pieces(block_size: u64, off: u64, len: usize) -> impl Iterator<Item = (u64, u64, std::ops::Range<usize>)> {
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let pos = off + done as u64;
        let in_block = pos % block_size;
        let n = ((block_size - in_block) as usize).min(len - done);
        let piece = (pos / block_size, in_block, done..done + n);
        done += n;
        Some(piece)
    })
}

impl BlockDevice for VhdDisk {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        if off.checked_add(buf.len() as u64).is_none_or(|e| e > self.size) {
            return Err(self.past_end(off, buf.len()));
        }
        let Some(d) = &self.dynamic else {
            return self.file.read_at(off, buf);
        };
        for (i, in_block, range) in pieces(d.header.block_size, off, buf.len()) {
            let out = &mut buf[range];
            match d.bat.get(i) {
                Some(s) => self
                    .file
                    .read_at(s as u64 * 512 + d.header.bitmap_len() + in_block, out)?,
                None => out.fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "vhd: opened read-only"));
        }
        if off.checked_add(buf.len() as u64).is_none_or(|e| e > self.size) {
            return Err(self.past_end(off, buf.len()));
        }
        let Some(d) = &self.dynamic else {
            return self.file.write_at(off, buf);
        };
        for (i, in_block, range) in pieces(d.header.block_size, off, buf.len()) {
            self.write_block(d, i, in_block, &buf[range])?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if !self.writable {
            return Ok(());
        }
        let Some(d) = &self.dynamic else {
            return self.file.flush();
        };
        // Blocks (and the footer after them) durable before the entries
        // that point at them are written.
        self.file.flush()?;
        let dirty = d.bat.take_dirty();
        if dirty.is_empty() {
            return Ok(());
        }
        for (k, (s, bytes)) in dirty.iter().enumerate() {
            if let Err(e) = self.file.write_at(d.header.table_offset + s * 512, bytes) {
                d.bat.redirty(dirty[k..].iter().map(|x| x.0));
                return Err(e);
            }
        }
        self.file.flush()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        !self.writable
    }
}

impl DiskImage for VhdDisk {
    fn layer(&self) -> LayerInfo {
        let mut details = vec![("creator".to_string(), self.footer.creator())];
        if let Some(d) = &self.dynamic {
            details.push(("block size".into(), d.header.block_size.to_string()));
            details.push(("blocks allocated".into(), d.bat.allocated().count().to_string()));
        }
        LayerInfo {
            format: FORMAT,
            variant: self.footer.disk_type().to_string(),
            virtual_size: self.size,
            details,
        }
    }
}

impl Drop for VhdDisk {
    fn drop(&mut self) {
        // Entries of blocks written since the last flush; an error here has
        // no caller to reach (the engine flushes before it closes).
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests;
