//! What mkfs writes and how: small blocks collected in block order (so the
//! writes are deterministic and each block is written once), large runs of
//! zeros and the per-group bitmaps written at once (collecting them would
//! cost memory in proportion to the filesystem), and a count of the bytes
//! written for `s_kbytes_written`.

use std::collections::BTreeMap;

use ext4kit_blockdev::BlockDevice;

use crate::error::{MkfsError, Result};

const MIB: u64 = 1 << 20;

/// The device and the blocks still to write to it.
pub(crate) struct Writer<'a> {
    dev: &'a dyn BlockDevice,
    bs: u64,
    blocks: BTreeMap<u64, Vec<u8>>,
    written: u64,
}

impl<'a> Writer<'a> {
    /// Blocks of `bs` bytes on `dev`.
    pub(crate) fn new(dev: &'a dyn BlockDevice, bs: u64) -> Self {
        Writer {
            dev,
            bs,
            blocks: BTreeMap::new(),
            written: 0,
        }
    }

    /// The collected copy of block `b` (zeros until something is put in
    /// it), written by [`Writer::write_blocks`].
    pub(crate) fn block(&mut self, b: u64) -> &mut Vec<u8> {
        let bs = self.bs as usize;
        self.blocks.entry(b).or_insert_with(|| vec![0u8; bs])
    }

    /// Write zeros over blocks `start .. start + n` now, a MiB at a time.
    pub(crate) fn zero_range(&mut self, start: u64, n: u64) -> Result<()> {
        let chunk_blocks = (MIB / self.bs).max(1);
        let zeros = vec![0u8; (chunk_blocks * self.bs) as usize];
        let mut b = start;
        while b < start + n {
            let k = chunk_blocks.min(start + n - b);
            let buf = &zeros[..(k * self.bs) as usize];
            self.dev
                .write_at(b * self.bs, buf)
                .map_err(|e| MkfsError::io(format!("zeroing blocks {b}..{}", b + k), e))?;
            self.written += buf.len() as u64;
            b += k;
        }
        Ok(())
    }

    /// Write zeros over `blocks` (in the order given), one
    /// [`Writer::zero_range`] per run of consecutive block numbers.
    pub(crate) fn zero_runs(&mut self, blocks: &[u64]) -> Result<()> {
        let mut i = 0;
        while i < blocks.len() {
            let mut j = i + 1;
            while j < blocks.len() && blocks[j] == blocks[j - 1] + 1 {
                j += 1;
            }
            self.zero_range(blocks[i], (j - i) as u64)?;
            i = j;
        }
        Ok(())
    }

    /// Write one block at once (bitmaps and descriptor copies, which would
    /// take `blocks / 4` bytes of memory if collected).
    pub(crate) fn write_now(&mut self, b: u64, data: &[u8]) -> Result<()> {
        self.dev
            .write_at(b * self.bs, data)
            .map_err(|e| MkfsError::io(format!("writing block {b}"), e))?;
        self.written += data.len() as u64;
        Ok(())
    }

    /// Write every collected block, in block order.
    pub(crate) fn write_blocks(&mut self) -> Result<()> {
        for (b, data) in std::mem::take(&mut self.blocks) {
            self.write_now(b, &data)?;
        }
        Ok(())
    }

    /// Bytes written so far.
    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// Flush the device's cache.
    pub(crate) fn flush(&self) -> Result<()> {
        self.dev.flush().map_err(|e| MkfsError::io("flushing the device", e))
    }
}
