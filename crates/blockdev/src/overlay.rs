//! A copy-on-write overlay: the device as it would be after some writes,
//! without making them.
//!
//! Journal replay of a read-only open goes here (the kernel replays even a
//! read-only mount; we must not touch the image file: a read-only open never
//! writes), and so do the fast-commit replay and orphan cleanup that follow
//! it. Reads see the overlay's blocks first and the base device under them;
//! writes land in the overlay only.
//!
//! A block may be held as bytes, or as a *redirect* to another place of the
//! base device: a replayed journal block is the logged copy in the journal,
//! so the overlay records where that copy is instead of holding it — a
//! replay of a 1 GiB journal then costs a few bytes per block, not 1 GiB of
//! memory. A redirect may replace the block's first four bytes (jbd2's
//! escaped blocks, whose logged copy had the journal magic zeroed).
//!
//! Locking: while recovery writes, one reader/writer lock guards the block
//! map. Once recovery is done the overlay is
//! [frozen](OverlayDevice::freeze): the map moves behind a `OnceLock` and
//! reads take no lock at all, so concurrent readers of a recovered image
//! share no written cache line; a frozen overlay refuses writes.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use crate::BlockDevice;

/// What the overlay holds for one block.
#[derive(Debug, Clone)]
enum Patch {
    /// The block's bytes.
    Bytes(Box<[u8]>),
    /// Read the block from `from` (a byte offset of the base device), then
    /// replace its first four bytes with `head` if given.
    Redirect { from: u64, head: Option<[u8; 4]> },
}

/// A device whose writes go to memory, over a base device that is only read.
pub struct OverlayDevice {
    base: Arc<dyn BlockDevice>,
    block: u64,
    patches: RwLock<HashMap<u64, Patch>>,
    /// The map after [`OverlayDevice::freeze`]: read without a lock.
    frozen: OnceLock<HashMap<u64, Patch>>,
}

impl std::fmt::Debug for OverlayDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OverlayDevice")
            .field("block", &self.block)
            .field("patched_blocks", &self.patched_blocks())
            .field("frozen", &self.frozen.get().is_some())
            .finish()
    }
}

impl OverlayDevice {
    /// An empty overlay of `block_size`-byte blocks over `base`. Writes of
    /// any size and alignment are accepted; the overlay keeps whole blocks.
    pub fn new(base: Arc<dyn BlockDevice>, block_size: u64) -> Self {
        assert!(
            block_size.is_power_of_two() && block_size >= 512,
            "overlay block size {block_size}"
        );
        OverlayDevice {
            base,
            block: block_size,
            patches: RwLock::new(HashMap::new()),
            frozen: OnceLock::new(),
        }
    }

    /// Stop accepting writes: from now on reads take no lock, and writes
    /// fail. Recovery calls this when it is done, before the read-only
    /// filesystem opens on the overlay.
    pub fn freeze(&self) {
        let map = std::mem::take(&mut *self.patches.write());
        let _ = self.frozen.set(map);
    }

    fn frozen_error() -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the recovered image is read-only (its replayed journal lives in memory)",
        )
    }

    /// Make block `blk` read as the `block_size` bytes at byte offset `from`
    /// of the base device, with its first four bytes replaced by `head` if
    /// given. Nothing is read now.
    pub fn redirect(&self, blk: u64, from: u64, head: Option<[u8; 4]>) -> io::Result<()> {
        if self.frozen.get().is_some() {
            return Err(Self::frozen_error());
        }
        self.check_block(blk)?;
        if from.checked_add(self.block).is_none_or(|e| e > self.base.size()) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("redirect of block {blk} to byte {from}, past the end of the device"),
            ));
        }
        self.patches.write().insert(blk, Patch::Redirect { from, head });
        Ok(())
    }

    /// An independent copy of this overlay as it is now: later writes to
    /// either do not show in the other. A caller about to try something
    /// that may fail halfway keeps one to fall back to.
    pub fn fork(&self) -> OverlayDevice {
        let map = match self.frozen.get() {
            Some(f) => f.clone(),
            None => self.patches.read().clone(),
        };
        OverlayDevice {
            base: self.base.clone(),
            block: self.block,
            patches: RwLock::new(map),
            frozen: OnceLock::new(),
        }
    }

    /// How many blocks differ from the base device.
    pub fn patched_blocks(&self) -> usize {
        match self.frozen.get() {
            Some(f) => f.len(),
            None => self.patches.read().len(),
        }
    }

    /// The device underneath.
    pub fn base(&self) -> &Arc<dyn BlockDevice> {
        &self.base
    }

    fn check_block(&self, blk: u64) -> io::Result<()> {
        if blk
            .checked_mul(self.block)
            .and_then(|o| o.checked_add(self.block))
            .is_none_or(|e| e > self.base.size())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("block {blk} is past the end of the device"),
            ));
        }
        Ok(())
    }

    /// Fill `out` (one whole block) with block `blk` as the overlay sees it.
    fn read_block(&self, blk: u64, patches: &HashMap<u64, Patch>, out: &mut [u8]) -> io::Result<()> {
        match patches.get(&blk) {
            Some(Patch::Bytes(b)) => out.copy_from_slice(b),
            Some(Patch::Redirect { from, head }) => {
                self.base.read_at(*from, out)?;
                if let Some(h) = head {
                    out[..4].copy_from_slice(h);
                }
            }
            None => self.base.read_at(blk * self.block, out)?,
        }
        Ok(())
    }
}

impl BlockDevice for OverlayDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "read of {} bytes at offset {off} past the end of the image ({} bytes)",
                        buf.len(),
                        self.size()
                    ),
                )
            })?;
        if let Some(f) = self.frozen.get() {
            return self.read_through(f, off, end, buf);
        }
        let patches = self.patches.read();
        self.read_through(&patches, off, end, buf)
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if self.frozen.get().is_some() {
            return Err(Self::frozen_error());
        }
        self.write_patched(off, buf)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.base.size()
    }

    fn read_only(&self) -> bool {
        self.frozen.get().is_some()
    }
}

impl OverlayDevice {
    /// A read of `off..end` through `patches`.
    fn read_through(&self, patches: &HashMap<u64, Patch>, off: u64, end: u64, buf: &mut [u8]) -> io::Result<()> {
        if patches.is_empty() {
            return self.base.read_at(off, buf);
        }
        // Runs of unpatched blocks go to the base in one read; patched
        // blocks are assembled one by one.
        let bs = self.block;
        let mut pos = off;
        let mut tmp = Vec::new();
        while pos < end {
            let blk = pos / bs;
            let in_blk = (pos % bs) as usize;
            let dst = (pos - off) as usize;
            if patches.contains_key(&blk) {
                tmp.resize(bs as usize, 0);
                self.read_block(blk, patches, &mut tmp)?;
                let n = ((bs as usize - in_blk) as u64).min(end - pos) as usize;
                buf[dst..dst + n].copy_from_slice(&tmp[in_blk..in_blk + n]);
                pos += n as u64;
            } else {
                let mut stop = (blk + 1) * bs;
                while stop < end && !patches.contains_key(&(stop / bs)) {
                    stop += bs;
                }
                let stop = stop.min(end);
                let n = (stop - pos) as usize;
                self.base.read_at(pos, &mut buf[dst..dst + n])?;
                pos = stop;
            }
        }
        Ok(())
    }

    fn write_patched(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("write at {off} past the end")))?;
        let bs = self.block;
        let mut patches = self.patches.write();
        let mut pos = off;
        while pos < end {
            let blk = pos / bs;
            let in_blk = (pos % bs) as usize;
            let n = ((bs as usize - in_blk) as u64).min(end - pos) as usize;
            let src = &buf[(pos - off) as usize..(pos - off) as usize + n];
            let mut block = if n == bs as usize {
                vec![0u8; bs as usize].into_boxed_slice()
            } else {
                let mut b = vec![0u8; bs as usize];
                self.read_block(blk, &patches, &mut b)?;
                b.into_boxed_slice()
            };
            block[in_blk..in_blk + n].copy_from_slice(src);
            patches.insert(blk, Patch::Bytes(block));
            pos += n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    fn base() -> Arc<dyn BlockDevice> {
        let bytes: Vec<u8> = (0..8 * 1024).map(|i| (i / 1024) as u8).collect();
        Arc::new(MemDevice::from_vec_read_only(bytes))
    }

    #[test]
    fn writes_stay_in_memory_and_reads_see_them() {
        let b = base();
        let o = OverlayDevice::new(b.clone(), 1024);
        o.write_at(1024 + 10, b"hello").unwrap();
        let mut got = vec![0u8; 3 * 1024];
        o.read_at(0, &mut got).unwrap();
        assert!(got[..1024].iter().all(|&x| x == 0));
        assert_eq!(&got[1024 + 10..1024 + 15], b"hello");
        assert_eq!(got[1024 + 9], 1);
        assert_eq!(got[1024 + 15], 1);
        assert!(got[2048..].iter().all(|&x| x == 2));
        // The base is untouched.
        let mut raw = [0u8; 5];
        b.read_at(1024 + 10, &mut raw).unwrap();
        assert_eq!(raw, [1; 5]);
        assert_eq!(o.patched_blocks(), 1);
    }

    #[test]
    fn redirects_read_elsewhere_with_their_head_replaced() {
        let o = OverlayDevice::new(base(), 1024);
        o.redirect(2, 5 * 1024, Some(*b"MAGI")).unwrap();
        let mut got = vec![0u8; 1024];
        o.read_at(2 * 1024, &mut got).unwrap();
        assert_eq!(&got[..4], b"MAGI");
        assert!(got[4..].iter().all(|&x| x == 5));
        // A partial write on a redirected block keeps the rest of it.
        o.write_at(2 * 1024 + 100, &[9]).unwrap();
        o.read_at(2 * 1024, &mut got).unwrap();
        assert_eq!(&got[..4], b"MAGI");
        assert_eq!(got[100], 9);
        assert_eq!(got[101], 5);
        // An unaligned read across patched and unpatched blocks.
        let mut span = vec![0u8; 2048];
        o.read_at(1024 + 512, &mut span).unwrap();
        assert!(span[..512].iter().all(|&x| x == 1));
        assert_eq!(&span[512..516], b"MAGI");
        assert!(span[1536..].iter().all(|&x| x == 3));
    }

    #[test]
    fn a_fork_does_not_see_later_writes() {
        let o = OverlayDevice::new(base(), 1024);
        o.write_at(0, b"one").unwrap();
        let f = o.fork();
        o.write_at(0, b"two").unwrap();
        let mut b = [0u8; 3];
        f.read_at(0, &mut b).unwrap();
        assert_eq!(&b, b"one");
        o.read_at(0, &mut b).unwrap();
        assert_eq!(&b, b"two");
    }

    #[test]
    fn a_frozen_overlay_reads_the_same_and_refuses_writes() {
        let o = OverlayDevice::new(base(), 1024);
        o.write_at(3000, b"xyz").unwrap();
        o.redirect(5, 0, None).unwrap();
        let mut before = vec![0u8; 8 * 1024];
        o.read_at(0, &mut before).unwrap();
        o.freeze();
        let mut after = vec![0u8; 8 * 1024];
        o.read_at(0, &mut after).unwrap();
        assert_eq!(before, after);
        assert!(o.read_only());
        assert!(o.write_at(0, b"a").is_err());
        assert!(o.redirect(1, 0, None).is_err());
        assert_eq!(o.patched_blocks(), 2);
        let f = o.fork();
        f.write_at(0, b"a").unwrap();
    }

    #[test]
    fn out_of_range_is_an_error_not_a_panic() {
        let o = OverlayDevice::new(base(), 1024);
        assert!(o.redirect(8, 0, None).is_err());
        assert!(o.redirect(0, 8 * 1024 - 10, None).is_err());
        assert!(o.write_at(8 * 1024 - 2, b"abc").is_err());
        let mut b = [0u8; 4];
        assert!(o.read_at(u64::MAX - 1, &mut b).is_err());
    }
}
