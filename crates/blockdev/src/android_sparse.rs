//! Android sparse images (what `img2simg` writes and `fastboot flash`
//! takes): a 28-byte file header, then chunks that each describe the next
//! blocks of the image in order — RAW (the blocks follow), FILL (one
//! 32-bit pattern repeated), DONT_CARE (nothing to write there). The
//! layout is libsparse's `sparse_format.h`; the header and chunk structs
//! are the `android-sparse-image` crate's.
//!
//! [`export`] writes one straight from a [`ScratchDevice`]: its written
//! runs become RAW or FILL chunks, everything never written a DONT_CARE
//! chunk — as `img2simg` makes of a raw image's holes — so `simg2img`
//! expands the output to the bytes a raw build of the same filesystem has.
//! A written block of one repeated 32-bit word (zeros above all) is a FILL
//! chunk, as `img2simg` makes it, so the device gets those bytes written.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;

use android_sparse_image::{ChunkHeader, FileHeader};

use crate::scratch::{ScratchDevice, UNIT};
use crate::BlockDevice;

/// Units read from the scratch at a time, and the largest RAW chunk
/// written (libsparse splits its RAW chunks too; any size up to 4 GiB is
/// valid).
const BATCH: u64 = 1024;

/// What [`export`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SparseSummary {
    /// Blocks of the expanded image ([`UNIT`] bytes each).
    pub blocks: u64,
    /// Chunks of each kind: RAW, FILL, DONT_CARE.
    pub raw_chunks: u32,
    /// See [`SparseSummary::raw_chunks`].
    pub fill_chunks: u32,
    /// See [`SparseSummary::raw_chunks`].
    pub dont_care_chunks: u32,
    /// Bytes of the sparse file.
    pub bytes: u64,
}

/// The chunk being gathered: consecutive RAW blocks, or FILL blocks of
/// one pattern.
enum Pending {
    None,
    Raw(Vec<u8>),
    Fill(u32, u64),
}

struct Writer<'a> {
    out: BufWriter<&'a File>,
    pending: Pending,
    sum: SparseSummary,
}

impl Writer<'_> {
    fn chunk(&mut self, h: ChunkHeader, body: &[u8]) -> io::Result<()> {
        self.out.write_all(&h.to_bytes())?;
        self.out.write_all(body)?;
        self.sum.bytes += (h.to_bytes().len() + body.len()) as u64;
        Ok(())
    }

    fn flush_pending(&mut self) -> io::Result<()> {
        match std::mem::replace(&mut self.pending, Pending::None) {
            Pending::None => {}
            Pending::Raw(data) => {
                let blocks = (data.len() as u64 / UNIT) as u32;
                self.chunk(ChunkHeader::new_raw(blocks, UNIT as u32), &data)?;
                self.sum.raw_chunks += 1;
            }
            Pending::Fill(word, blocks) => {
                // chunk_sz is 32 bits of blocks: 16 TiB per chunk.
                let mut left = blocks;
                while left > 0 {
                    let n = left.min(u64::from(u32::MAX));
                    self.chunk(ChunkHeader::new_fill(n as u32), &word.to_le_bytes())?;
                    self.sum.fill_chunks += 1;
                    left -= n;
                }
            }
        }
        Ok(())
    }

    fn dont_care(&mut self, blocks: u64) -> io::Result<()> {
        self.flush_pending()?;
        let mut left = blocks;
        while left > 0 {
            let n = left.min(u64::from(u32::MAX));
            self.chunk(ChunkHeader::new_dontcare(n as u32), &[])?;
            self.sum.dont_care_chunks += 1;
            left -= n;
        }
        Ok(())
    }

    fn block(&mut self, b: &[u8]) -> io::Result<()> {
        let word = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let uniform = b.chunks_exact(4).all(|w| w == &b[..4]);
        match (&mut self.pending, uniform) {
            (Pending::Fill(w, n), true) if *w == word => *n += 1,
            (Pending::Raw(data), false) if (data.len() as u64) < BATCH * UNIT => data.extend_from_slice(b),
            (_, true) => {
                self.flush_pending()?;
                self.pending = Pending::Fill(word, 1);
            }
            (_, false) => {
                self.flush_pending()?;
                let mut data = Vec::with_capacity((BATCH * UNIT) as usize);
                data.extend_from_slice(b);
                self.pending = Pending::Raw(data);
            }
        }
        Ok(())
    }
}

/// Writes `src` to `out` (from its offset 0, which it must be positioned
/// at, and truncated) as an Android sparse image of [`UNIT`]-byte blocks,
/// releasing the scratch space of what it has read (`src` reads as zeros
/// after). The caller syncs `out`.
pub fn export(src: &ScratchDevice, out: &File) -> io::Result<SparseSummary> {
    let blocks = src.size() / UNIT;
    // total_blks and total_chunks are 32-bit fields.
    let total_blks = u32::try_from(blocks).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "an Android sparse image holds at most 2^32 blocks of {UNIT} bytes (16 TiB); this one has {blocks}"
            ),
        )
    })?;
    let mut w = Writer {
        out: BufWriter::with_capacity(1 << 20, out),
        pending: Pending::None,
        sum: SparseSummary {
            blocks,
            bytes: android_sparse_image::FILE_HEADER_BYTES_LEN as u64,
            ..SparseSummary::default()
        },
    };
    // The header is written last, once the chunks are counted.
    w.out.write_all(&[0u8; android_sparse_image::FILE_HEADER_BYTES_LEN])?;
    let mut at = 0u64;
    let mut buf = vec![0u8; (BATCH * UNIT) as usize];
    for run in src.runs() {
        if run.start > at {
            w.dont_care(run.start - at)?;
        }
        let mut u = run.start;
        while u < run.start + run.len {
            let n = (run.start + run.len - u).min(BATCH);
            let b = &mut buf[..(n * UNIT) as usize];
            src.read_at(u * UNIT, b)?;
            for blk in b.chunks_exact(UNIT as usize) {
                w.block(blk)?;
            }
            // The batch is in memory now (a pending chunk or the write
            // buffer, at most a few MiB): its scratch space is given back,
            // so the output grows as the scratch shrinks and the two
            // together stay near the written size.
            src.release(u, n);
            u += n;
        }
        at = run.start + run.len;
    }
    if at < blocks {
        w.dont_care(blocks - at)?;
    }
    w.flush_pending()?;
    w.out.flush()?;
    let chunks = w.sum.raw_chunks + w.sum.fill_chunks + w.sum.dont_care_chunks;
    let header = FileHeader {
        block_size: UNIT as u32,
        blocks: total_blks,
        chunks,
        // 0: no checksum, as img2simg writes it.
        checksum: 0,
    };
    out.write_all_at(&header.to_bytes(), 0)?;
    Ok(w.sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use android_sparse_image::{ChunkType, CHUNK_HEADER_BYTES_LEN, FILE_HEADER_BYTES_LEN};

    /// Expands a sparse image as simg2img does (DONT_CARE reads as zeros
    /// in a new file).
    fn expand(bytes: &[u8]) -> Vec<u8> {
        let h = FileHeader::from_bytes(bytes[..FILE_HEADER_BYTES_LEN].try_into().unwrap()).unwrap();
        let mut out = Vec::new();
        let mut p = FILE_HEADER_BYTES_LEN;
        for _ in 0..h.chunks {
            let c = ChunkHeader::from_bytes(bytes[p..p + CHUNK_HEADER_BYTES_LEN].try_into().unwrap()).unwrap();
            p += CHUNK_HEADER_BYTES_LEN;
            let len = c.out_size(&h);
            match c.chunk_type {
                ChunkType::Raw => out.extend_from_slice(&bytes[p..p + len]),
                ChunkType::Fill => {
                    let w = &bytes[p..p + 4];
                    for _ in 0..len / 4 {
                        out.extend_from_slice(w);
                    }
                }
                ChunkType::DontCare => out.resize(out.len() + len, 0),
                ChunkType::Crc32 => {}
            }
            p += c.data_size();
        }
        assert_eq!(p, bytes.len(), "trailing bytes after the last chunk");
        assert_eq!(out.len(), h.total_size());
        out
    }

    #[test]
    fn expands_to_the_device_and_uses_each_chunk_kind() {
        let units = 40u64;
        let s = ScratchDevice::new(&std::env::temp_dir(), units * UNIT).unwrap();
        let mut want = vec![0u8; (units * UNIT) as usize];
        let mut put = |off: u64, data: &[u8]| {
            s.write_at(off, data).unwrap();
            want[off as usize..off as usize + data.len()].copy_from_slice(data);
        };
        // The superblock-like partial write, explicit zeros, a fill
        // pattern, mixed data spanning units, a last block.
        put(1024, &[0x53; 1024]);
        put(3 * UNIT, &vec![0; (2 * UNIT) as usize]);
        put(5 * UNIT, &0xdead_beef_u32.to_le_bytes().repeat((3 * UNIT / 4) as usize));
        let mixed: Vec<u8> = (0..(6 * UNIT + 100) as usize).map(|i| (i * 7 % 251) as u8).collect();
        put(10 * UNIT + 50, &mixed);
        put((units - 1) * UNIT, &[1; UNIT as usize]);
        let path = std::env::temp_dir().join(format!("ext4kit-simg-test-{}", std::process::id()));
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let sum = export(&s, &f).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(sum.bytes, bytes.len() as u64);
        assert!(
            sum.raw_chunks >= 2 && sum.fill_chunks >= 2 && sum.dont_care_chunks >= 2,
            "{sum:?}"
        );
        assert_eq!(expand(&bytes), want);
        // Exporting gave the scratch space back.
        assert_eq!(s.written_bytes(), 0);
    }
}
