//! Telling the compressed forms of a stream apart by their first bytes
//! (gzip `1f 8b`, zstd `28 b5 2f fd`, xz `fd 37 7a 58 5a 00`), and the
//! decompressing reader for each. Whether what is inside is a tar is the
//! tar reader's to say.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

/// How a file's first bytes say it is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Not compressed (or in a form we do not read).
    None,
    /// gzip (RFC 1952), members concatenated as `gzip` writes them.
    Gzip,
    /// Zstandard frames.
    Zstd,
    /// xz (LZMA2).
    Xz,
}

/// The first 512 bytes of `path` (fewer if it is shorter).
pub fn head(path: &Path) -> Result<Vec<u8>, String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let mut head = [0u8; 512];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(head[..n].to_vec())
}

/// What bytes at the start of a stream say it is.
pub fn classify(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Compression::Xz
    } else {
        Compression::None
    }
}

/// A reader of the decompressed stream.
pub fn reader(path: &Path, c: Compression) -> io::Result<Box<dyn Read>> {
    let f = BufReader::with_capacity(1 << 20, File::open(path)?);
    Ok(match c {
        Compression::None => Box::new(f),
        Compression::Gzip => Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::bufread::MultiGzDecoder::new(f),
        )),
        Compression::Zstd => Box::new(BufReader::with_capacity(
            1 << 20,
            zstd::stream::read::Decoder::with_buffer(f)?,
        )),
        Compression::Xz => Box::new(BufReader::with_capacity(
            1 << 20,
            liblzma::bufread::XzDecoder::new_multi_decoder(f),
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn each_kind_is_recognised_and_decompressed() {
        let payload = b"the same bytes, four ways".repeat(100);
        let dir = std::env::temp_dir().join(format!("ext4kit-compress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gz = {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&payload).unwrap();
            e.finish().unwrap()
        };
        let zs = zstd::stream::encode_all(&payload[..], 1).unwrap();
        let xz = {
            let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
            e.write_all(&payload).unwrap();
            e.finish().unwrap()
        };
        for (name, bytes, kind) in [
            ("g", gz, Compression::Gzip),
            ("z", zs, Compression::Zstd),
            ("x", xz, Compression::Xz),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, &bytes).unwrap();
            assert_eq!(classify(&head(&p).unwrap()), kind);
            let mut out = Vec::new();
            reader(&p, kind).unwrap().read_to_end(&mut out).unwrap();
            assert_eq!(out, payload, "{name}");
        }
        assert_eq!(classify(b"BZh91AY&SY"), Compression::None);
        assert_eq!(classify(b""), Compression::None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
