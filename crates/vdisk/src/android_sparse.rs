//! Reading an Android sparse image (libsparse's format, what `img2simg`
//! and Android builds write) as the disk it expands to.
//!
//! The file is a header and a list of chunks, each covering a run of
//! output blocks: RAW (the blocks follow the chunk header), FILL (one
//! 32-bit value repeated), DONT_CARE (nothing stored; reads as zeros, as
//! `simg2img` leaves them in a fresh file) and CRC32 (a checksum of the
//! output so far, covering no blocks). The chunk list is read once at open
//! into an index sorted by output block, so a read is a binary search.
//!
//! The format is made for flashing, not for changing in place (a written
//! block would have to split a FILL chunk), so it opens read-only; writing
//! goes through the raw image and `mkfs --output-format android-sparse`.

use std::io;
use std::sync::Arc;

use android_sparse_image::{ChunkHeader, ChunkType, FileHeader, CHUNK_HEADER_BYTES_LEN, FILE_HEADER_BYTES_LEN};

use crate::{corrupt, unsupported, BlockDevice, DiskFormat, DiskImage, LayerInfo};

const FORMAT: DiskFormat = DiskFormat::AndroidSparse;

/// Where the blocks of one chunk come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Stored in the file from this byte offset.
    Raw(u64),
    /// One 32-bit value repeated (as stored, little-endian bytes).
    Fill([u8; 4]),
    /// Not stored.
    DontCare,
}

/// One chunk's place in the output.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// First output block.
    start: u64,
    /// Blocks covered.
    blocks: u64,
    source: Source,
}

/// An Android sparse image presented as the disk it expands to.
pub struct AndroidSparseDisk {
    file: Arc<dyn BlockDevice>,
    block_size: u64,
    size: u64,
    /// Chunks covering blocks, in output order, without gaps.
    runs: Vec<Run>,
}

impl AndroidSparseDisk {
    /// Open the sparse image held by `file`. Writing is refused: see the
    /// module doc.
    pub fn open(file: Arc<dyn BlockDevice>, writable: bool) -> io::Result<AndroidSparseDisk> {
        if writable {
            return Err(unsupported(
                FORMAT,
                "sparse images are read-only here (expand with simg2img, change the raw image, or rebuild \
                 with `ext4kit mkfs --output-format android-sparse`)",
            ));
        }
        let mut hb = [0u8; FILE_HEADER_BYTES_LEN];
        file.read_at(0, &mut hb)
            .map_err(|e| corrupt(FORMAT, format_args!("the file header cannot be read: {e}")))?;
        let header = FileHeader::from_bytes(&hb).map_err(|e| corrupt(FORMAT, format_args!("file header: {e}")))?;
        let block_size = header.block_size as u64;
        if block_size == 0 || !block_size.is_multiple_of(4) {
            return Err(corrupt(
                FORMAT,
                format_args!("block size {block_size} is not a positive multiple of 4"),
            ));
        }
        let size = block_size * header.blocks as u64;
        let file_size = file.size();
        // Every chunk takes at least a chunk header in the file: a count
        // the file cannot hold is refused before anything is allocated.
        let max_chunks = file_size.saturating_sub(FILE_HEADER_BYTES_LEN as u64) / CHUNK_HEADER_BYTES_LEN as u64;
        if header.chunks as u64 > max_chunks {
            return Err(corrupt(
                FORMAT,
                format_args!(
                    "the header counts {} chunks, more than a {file_size}-byte file holds",
                    header.chunks
                ),
            ));
        }
        let mut runs = Vec::with_capacity(header.chunks as usize);
        let mut pos = FILE_HEADER_BYTES_LEN as u64;
        let mut block = 0u64;
        for n in 0..header.chunks {
            let mut cb = [0u8; CHUNK_HEADER_BYTES_LEN];
            file.read_at(pos, &mut cb)
                .map_err(|e| corrupt(FORMAT, format_args!("chunk {n} header at byte {pos}: {e}")))?;
            let ch = ChunkHeader::from_bytes(&cb)
                .map_err(|e| corrupt(FORMAT, format_args!("chunk {n} at byte {pos}: {e}")))?;
            let data = pos + CHUNK_HEADER_BYTES_LEN as u64;
            let blocks = ch.chunk_size as u64;
            let (source, stored) = match ch.chunk_type {
                ChunkType::Raw => (Source::Raw(data), blocks * block_size),
                ChunkType::Fill => {
                    let mut v = [0u8; 4];
                    file.read_at(data, &mut v)
                        .map_err(|e| corrupt(FORMAT, format_args!("chunk {n}'s fill value at byte {data}: {e}")))?;
                    (Source::Fill(v), 4)
                }
                ChunkType::DontCare => (Source::DontCare, 0),
                // A checksum of the output so far; covers no blocks.
                ChunkType::Crc32 => (Source::DontCare, 4),
            };
            if ch.total_size as u64 != CHUNK_HEADER_BYTES_LEN as u64 + stored {
                return Err(corrupt(
                    FORMAT,
                    format_args!(
                        "chunk {n} at byte {pos} says it takes {} bytes, its kind and {blocks} blocks take {}",
                        ch.total_size,
                        CHUNK_HEADER_BYTES_LEN as u64 + stored
                    ),
                ));
            }
            let next = data + stored;
            if next > file_size {
                return Err(corrupt(
                    FORMAT,
                    format_args!("chunk {n} at byte {pos} runs past the end of the file ({file_size} bytes)"),
                ));
            }
            if ch.chunk_type != ChunkType::Crc32 && blocks > 0 {
                if block + blocks > header.blocks as u64 {
                    return Err(corrupt(
                        FORMAT,
                        format_args!(
                            "chunk {n} covers blocks {block}..{}, past the image's {} blocks",
                            block + blocks,
                            header.blocks
                        ),
                    ));
                }
                runs.push(Run {
                    start: block,
                    blocks,
                    source,
                });
                block += blocks;
            }
            pos = next;
        }
        if block != header.blocks as u64 {
            return Err(corrupt(
                FORMAT,
                format_args!("the chunks cover {block} blocks, the header says {}", header.blocks),
            ));
        }
        Ok(AndroidSparseDisk {
            file,
            block_size,
            size,
            runs,
        })
    }

    /// The run holding output block `b` (`b` < blocks).
    fn run_of(&self, b: u64) -> &Run {
        let i = self.runs.partition_point(|r| r.start + r.blocks <= b);
        &self.runs[i]
    }
}

impl std::fmt::Debug for AndroidSparseDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AndroidSparseDisk")
            .field("block_size", &self.block_size)
            .field("size", &self.size)
            .field("chunks", &self.runs.len())
            .finish()
    }
}

impl BlockDevice for AndroidSparseDisk {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "read of {} bytes at offset {off} past the end of the disk ({} bytes)",
                        buf.len(),
                        self.size
                    ),
                )
            })?;
        let mut pos = off;
        while pos < end {
            let run = *self.run_of(pos / self.block_size);
            let run_start = run.start * self.block_size;
            let run_end = (run.start + run.blocks) * self.block_size;
            let n = (run_end.min(end) - pos) as usize;
            let out = &mut buf[(pos - off) as usize..][..n];
            match run.source {
                Source::Raw(at) => self.file.read_at(at + (pos - run_start), out)?,
                Source::Fill(v) => {
                    for (i, b) in out.iter_mut().enumerate() {
                        *b = v[((pos - run_start) as usize + i) % 4];
                    }
                }
                Source::DontCare => out.fill(0),
            }
            pos += n as u64;
        }
        Ok(())
    }

    fn write_at(&self, _off: u64, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "android-sparse: opened read-only",
        ))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        true
    }
}

impl DiskImage for AndroidSparseDisk {
    fn layer(&self) -> LayerInfo {
        let stored = self
            .runs
            .iter()
            .filter(|r| matches!(r.source, Source::Raw(_)))
            .map(|r| r.blocks)
            .sum::<u64>();
        LayerInfo {
            format: FORMAT,
            variant: String::new(),
            virtual_size: self.size,
            details: vec![
                ("block size".into(), self.block_size.to_string()),
                ("chunks".into(), self.runs.len().to_string()),
                ("blocks stored".into(), stored.to_string()),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_blockdev::MemDevice;
    use rand::{Rng, SeedableRng};

    /// Build a sparse image of `blocks` blocks of 4 KiB from (kind, blocks) chunks.
    fn build(chunks: &[(ChunkType, u32, u8)]) -> (Vec<u8>, Vec<u8>) {
        let bs = 4096usize;
        let blocks: u32 = chunks.iter().filter(|c| c.0 != ChunkType::Crc32).map(|c| c.1).sum();
        let header = FileHeader {
            block_size: bs as u32,
            blocks,
            chunks: chunks.len() as u32,
            checksum: 0,
        };
        let mut out = header.to_bytes().to_vec();
        let mut raw = Vec::new();
        for &(kind, n, fill) in chunks {
            match kind {
                ChunkType::Raw => {
                    out.extend(ChunkHeader::new_raw(n, bs as u32).to_bytes());
                    let data: Vec<u8> = (0..n as usize * bs).map(|i| (i as u8) ^ fill).collect();
                    out.extend(&data);
                    raw.extend(&data);
                }
                ChunkType::Fill => {
                    out.extend(ChunkHeader::new_fill(n).to_bytes());
                    let v = [fill, 1, 2, 3];
                    out.extend(v);
                    raw.extend(v.iter().cycle().take(n as usize * bs));
                }
                ChunkType::DontCare => {
                    out.extend(ChunkHeader::new_dontcare(n).to_bytes());
                    raw.extend(std::iter::repeat_n(0u8, n as usize * bs));
                }
                ChunkType::Crc32 => {
                    let h = ChunkHeader {
                        chunk_type: ChunkType::Crc32,
                        chunk_size: 0,
                        total_size: CHUNK_HEADER_BYTES_LEN as u32 + 4,
                    };
                    out.extend(h.to_bytes());
                    out.extend([0u8; 4]);
                }
            }
        }
        (out, raw)
    }

    fn open(bytes: Vec<u8>) -> io::Result<AndroidSparseDisk> {
        AndroidSparseDisk::open(Arc::new(MemDevice::from_vec(bytes)), false)
    }

    #[test]
    fn every_chunk_kind_reads_as_it_expands() {
        let (img, raw) = build(&[
            (ChunkType::Raw, 3, 7),
            (ChunkType::DontCare, 5, 0),
            (ChunkType::Fill, 2, 9),
            (ChunkType::Crc32, 0, 0),
            (ChunkType::Raw, 1, 1),
        ]);
        let d = open(img).unwrap();
        assert_eq!(d.size(), raw.len() as u64);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..500 {
            let off = rng.random_range(0..raw.len());
            let len = rng.random_range(0..=(raw.len() - off).min(20000));
            let mut buf = vec![0xeeu8; len];
            d.read_at(off as u64, &mut buf).unwrap();
            assert_eq!(buf, raw[off..off + len], "at {off}+{len}");
        }
        let mut past = [0u8; 2];
        assert_eq!(
            d.read_at(raw.len() as u64 - 1, &mut past).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn writing_is_refused_with_the_way_out() {
        let (img, _) = build(&[(ChunkType::Raw, 1, 0)]);
        let e = AndroidSparseDisk::open(Arc::new(MemDevice::from_vec(img)), true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("simg2img"), "{e}");
    }

    /// A change that damages an image.
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;

    #[test]
    fn hostile_headers_and_chunks_are_errors() {
        let (good, _) = build(&[(ChunkType::Raw, 2, 0), (ChunkType::DontCare, 2, 0)]);
        let le32 = |v: &mut Vec<u8>, at: usize, x: u32| v[at..at + 4].copy_from_slice(&x.to_le_bytes());
        let cases: Vec<(&str, Damage)> = vec![
            ("huge chunk count", Box::new(move |v| le32(v, 20, u32::MAX))),
            ("blocks beyond the header's", Box::new(move |v| le32(v, 16, 3))),
            ("block size 0", Box::new(move |v| le32(v, 12, 0))),
            ("raw chunk past the end", Box::new(move |v| le32(v, 28 + 4, 1000))),
            ("total size disagrees", Box::new(move |v| le32(v, 28 + 8, 12))),
            ("unknown chunk type", Box::new(|v| v[28] = 0x55)),
            ("truncated", Box::new(|v| v.truncate(40))),
            ("truncated header", Box::new(|v| v.truncate(10))),
        ];
        for (what, damage) in cases {
            let mut v = good.clone();
            damage(&mut v);
            let e = open(v).expect_err(what);
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{what}: {e}");
            assert!(e.to_string().starts_with("android-sparse: "), "{what}: {e}");
        }
    }
}
