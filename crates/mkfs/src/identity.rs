//! The filesystem's identity: `s_uuid`, `s_hash_seed` and the one time
//! every timestamp carries. The only inputs mkfs draws from outside its
//! options (`/dev/urandom`, the clock), and only when they are not given.

use ext4kit_format::checksum::crc32c;

use crate::error::{MkfsError, Result};
use crate::options::MkfsOptions;

/// UUID, directory hash seed and creation time of the filesystem.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Identity {
    uuid: [u8; 16],
    hash_seed: [u8; 16],
    now: i64,
}

impl Identity {
    /// The UUID as given, else a random version-4 one (mke2fs's
    /// `uuid_generate`); the hash seed as given, else derived from the
    /// UUID when the clock is fixed (a reproducible build), else random;
    /// the time from the options' clock.
    pub(crate) fn resolve(opts: &MkfsOptions) -> Result<Self> {
        let uuid = match opts.uuid {
            Some(u) => u,
            None => random_uuid()?,
        };
        let hash_seed = match opts.hash_seed {
            Some(u) => u,
            None if opts.clock.is_fixed() => hash_seed_from_uuid(&uuid),
            None => random_uuid()?,
        };
        let now = opts.clock.now().sec;
        Ok(Identity { uuid, hash_seed, now })
    }

    /// `s_uuid`.
    pub(crate) fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// `s_hash_seed`, as bytes.
    pub(crate) fn hash_seed(&self) -> [u8; 16] {
        self.hash_seed
    }

    /// Seconds since the epoch: `s_mkfs_time`, `s_wtime`, `s_lastcheck`
    /// and every inode time.
    pub(crate) fn now(&self) -> i64 {
        self.now
    }
}

/// The directory hash seed of a reproducible build (a fixed clock, no
/// `hash_seed`): a fixed function of the UUID, so that one fixed UUID and
/// fixed clock are enough for byte-identical images. Shaped as a
/// version-4 UUID, like the random seeds mke2fs draws; distinct from the
/// UUID itself so the two never coincide.
pub fn hash_seed_from_uuid(uuid: &[u8; 16]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, w) in out.chunks_exact_mut(4).enumerate() {
        let mut msg = Vec::with_capacity(40);
        msg.extend_from_slice(b"ext4kit directory hash seed");
        msg.extend_from_slice(uuid);
        msg.push(i as u8);
        w.copy_from_slice(&crc32c(!(i as u32), &msg).to_le_bytes());
    }
    out[6] = (out[6] & 0x0f) | 0x40;
    out[8] = (out[8] & 0x3f) | 0x80;
    out
}

fn random_bytes() -> Result<[u8; 16]> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| MkfsError::io("reading /dev/urandom for a UUID", e))?;
    Ok(b)
}

/// A random version-4, variant-1 UUID (RFC 4122 §4.4).
fn random_uuid() -> Result<[u8; 16]> {
    let mut b = random_bytes()?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    Ok(b)
}
