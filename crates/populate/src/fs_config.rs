//! Owners, modes and file capabilities from an Android `fs_config` file
//! (the canned form `fs_config -C` writes and `e2fsdroid -C` and
//! `make_ext4fs -C` read): one line per path,
//!
//! ```text
//! system/bin/ping 0 2000 0755 capabilities=0x2000
//! ```
//!
//! the path relative to the image's root (no leading `/`), uid, gid, the
//! mode's permission bits in octal, and optionally the capability mask,
//! which becomes a `security.capability` xattr (`vfs_cap_data` revision 2
//! with the effective flag, the mask as the permitted set, as
//! make_ext4fs's contents.c writes it). A path the file does not list
//! keeps what the source says.

use std::collections::HashMap;

/// One path's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsConfigEntry {
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Permission bits with set-id and sticky.
    pub perm: u16,
    /// Capability mask (0: none).
    pub capabilities: u64,
}

impl FsConfigEntry {
    /// The `security.capability` value for the mask, if any: magic
    /// `VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE`, then permitted and
    /// inheritable for the low and the high 32 capabilities.
    pub fn capability_xattr(&self) -> Option<Vec<u8>> {
        if self.capabilities == 0 {
            return None;
        }
        let mut v = Vec::with_capacity(20);
        v.extend_from_slice(&(0x0200_0000u32 | 1).to_le_bytes());
        v.extend_from_slice(&(self.capabilities as u32).to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&((self.capabilities >> 32) as u32).to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        Some(v)
    }
}

/// A parsed fs_config file.
#[derive(Debug, Default)]
pub struct FsConfig {
    map: HashMap<Vec<u8>, FsConfigEntry>,
}

impl FsConfig {
    /// Parse the file's text; `name` is what errors call it.
    pub fn parse(text: &str, name: &str) -> Result<FsConfig, String> {
        let mut map = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| format!("{name}:{}: {why}", n + 1);
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 4 || f.len() > 5 {
                return Err(bad("expected PATH UID GID MODE [capabilities=0xMASK]"));
            }
            let num = |s: &str, what: &str| {
                s.parse::<u32>()
                    .map_err(|_| bad(&format!("{what} \"{s}\" is not a number")))
            };
            let uid = num(f[1], "uid")?;
            let gid = num(f[2], "gid")?;
            let perm = u16::from_str_radix(f[3], 8)
                .ok()
                .filter(|&m| m <= 0o7777)
                .ok_or_else(|| bad(&format!("mode \"{}\" is not octal permission bits", f[3])))?;
            let capabilities = match f.get(4) {
                None => 0,
                Some(c) => {
                    let hex = c
                        .strip_prefix("capabilities=")
                        .ok_or_else(|| bad(&format!("\"{c}\": expected capabilities=0xMASK")))?;
                    let hex = hex.strip_prefix("0x").or_else(|| hex.strip_prefix("0X")).unwrap_or(hex);
                    u64::from_str_radix(hex, 16).map_err(|_| bad(&format!("\"{c}\" is not a hex mask")))?
                }
            };
            let path = f[0].trim_start_matches('/').trim_end_matches('/');
            map.insert(
                path.as_bytes().to_vec(),
                FsConfigEntry {
                    uid,
                    gid,
                    perm,
                    capabilities,
                },
            );
        }
        Ok(FsConfig { map })
    }

    /// The settings for a path relative to the image's root (`system/bin/sh`;
    /// empty for the root).
    pub fn lookup(&self, path: &[u8]) -> Option<&FsConfigEntry> {
        self.map.get(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_capabilities() {
        let c = FsConfig::parse(
            "# canned\n \nsystem 0 0 0755\nsystem/bin/ping 0 2000 0755 capabilities=0x2000\n/vendor/ 1000 1000 2750\n",
            "fsc",
        )
        .unwrap();
        let ping = c.lookup(b"system/bin/ping").unwrap();
        assert_eq!((ping.uid, ping.gid, ping.perm), (0, 2000, 0o755));
        let x = ping.capability_xattr().unwrap();
        assert_eq!(&x[0..4], &0x0200_0001u32.to_le_bytes());
        assert_eq!(&x[4..8], &0x2000u32.to_le_bytes());
        assert_eq!(c.lookup(b"vendor").unwrap().perm, 0o2750);
        assert!(c.lookup(b"system").unwrap().capability_xattr().is_none());
        assert!(c.lookup(b"nothere").is_none());
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, want) in [
            ("a 0 0\n", "fsc:1:"),
            ("a 0 0 0999\n", "mode"),
            ("\na x 0 0755\n", "fsc:2: uid"),
            ("a 0 0 0755 caps=1\n", "capabilities="),
            ("a 0 0 0755 capabilities=0xzz\n", "hex"),
        ] {
            let e = FsConfig::parse(text, "fsc").unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
