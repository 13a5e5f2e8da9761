//! Who owns the files in the image, whoever owns them in the source: a
//! rootless build records the builder's own uid for every file of a host
//! tree, and a tar's owners may belong to another system.
//!
//! [`Owners::all_root`] makes every file root's (`mke2fs -d` run under
//! fakeroot, `--all-root`). An [`IdMap`] is a user namespace's map read
//! the other way: `IMAGE:SOURCE:COUNT` says the source ids
//! SOURCE..SOURCE+COUNT are the image ids IMAGE..IMAGE+COUNT (what
//! `/proc/PID/uid_map` says of a namespace whose root is SOURCE outside).
//! With a map given, an id no range covers is an error naming the entry:
//! a namespace would show it as the overflow id 65534, a build should not
//! guess.

/// One range of an id map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// First id in the image.
    pub image: u32,
    /// First id in the source.
    pub source: u32,
    /// How many.
    pub count: u32,
}

/// Ranges of ids, as `--uid-map` / `--gid-map` give them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdMap(Vec<IdRange>);

impl IdMap {
    /// Parse `IMAGE:SOURCE:COUNT`, checking that the ranges fit in 32
    /// bits and that no two overlap on either side.
    pub fn push(&mut self, spec: &str) -> Result<(), String> {
        let parts: Vec<&str> = spec.split(':').collect();
        let nums: Vec<u32> = match parts.as_slice() {
            [a, b, c] => [a, b, c]
                .iter()
                .map(|s| s.trim().parse::<u32>())
                .collect::<Result<_, _>>()
                .map_err(|_| format!("\"{spec}\": expected IMAGE_ID:SOURCE_ID:COUNT (three numbers)"))?,
            _ => return Err(format!("\"{spec}\": expected IMAGE_ID:SOURCE_ID:COUNT")),
        };
        let r = IdRange {
            image: nums[0],
            source: nums[1],
            count: nums[2],
        };
        if r.count == 0 {
            return Err(format!("\"{spec}\": COUNT must be at least 1"));
        }
        let end = |start: u32| u64::from(start) + u64::from(r.count);
        if end(r.image) > 1 << 32 || end(r.source) > 1 << 32 {
            return Err(format!("\"{spec}\": the range runs past 2^32"));
        }
        for o in &self.0 {
            let hits = |s1: u32, c1: u32, s2: u32, c2: u32| {
                u64::from(s1) < u64::from(s2) + u64::from(c2) && u64::from(s2) < u64::from(s1) + u64::from(c1)
            };
            if hits(r.image, r.count, o.image, o.count) || hits(r.source, r.count, o.source, o.count) {
                return Err(format!("\"{spec}\" overlaps {}:{}:{}", o.image, o.source, o.count));
            }
        }
        self.0.push(r);
        Ok(())
    }

    /// Whether no range is given.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The image id of source id `id`, if a range covers it.
    pub fn map(&self, id: u32) -> Option<u32> {
        self.0.iter().find_map(|r| {
            let k = id.checked_sub(r.source)?;
            (k < r.count).then(|| r.image + k)
        })
    }
}

/// The owner rule of a build.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owners {
    all_root: bool,
    uids: IdMap,
    gids: IdMap,
}

impl Owners {
    /// Owners as the source says (the default).
    pub fn as_source() -> Self {
        Owners::default()
    }

    /// Every file owned by root, group root.
    pub fn all_root() -> Self {
        Owners {
            all_root: true,
            ..Owners::default()
        }
    }

    /// Source ids mapped by these maps (an empty map leaves its ids as
    /// they are).
    pub fn mapped(uids: IdMap, gids: IdMap) -> Self {
        Owners {
            all_root: false,
            uids,
            gids,
        }
    }

    /// The image owner of a source owner; the error says which id no
    /// range covers.
    pub fn map(&self, uid: u32, gid: u32) -> Result<(u32, u32), String> {
        if self.all_root {
            return Ok((0, 0));
        }
        let u = if self.uids.is_empty() {
            uid
        } else {
            self.uids
                .map(uid)
                .ok_or_else(|| format!("uid {uid} is not covered by any --uid-map range"))?
        };
        let g = if self.gids.is_empty() {
            gid
        } else {
            self.gids
                .map(gid)
                .ok_or_else(|| format!("gid {gid} is not covered by any --gid-map range"))?
        };
        Ok((u, g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_read_as_a_namespace_would() {
        let mut m = IdMap::default();
        m.push("0:100000:65536").unwrap();
        m.push("70000:1000:1").unwrap();
        assert_eq!(m.map(100_000), Some(0));
        assert_eq!(m.map(165_535), Some(65_535));
        assert_eq!(m.map(165_536), None);
        assert_eq!(m.map(1000), Some(70_000));
        assert_eq!(m.map(999), None);
        assert!(m.push("5:100005:1").is_err(), "source overlap");
        assert!(m.push("0:5:1").is_err(), "image overlap");
        assert!(m.push("1:2").is_err());
        assert!(m.push("1:2:0").is_err());
        assert!(m.push("4294967295:0:2").is_err());
        assert!(m.push("x:1:1").is_err());
    }

    #[test]
    fn owners() {
        assert_eq!(Owners::all_root().map(1000, 1000), Ok((0, 0)));
        assert_eq!(Owners::as_source().map(4_000_000_000, 7), Ok((4_000_000_000, 7)));
        let mut u = IdMap::default();
        u.push("0:1000:1").unwrap();
        let o = Owners::mapped(u, IdMap::default());
        assert_eq!(o.map(1000, 1000), Ok((0, 1000)));
        assert!(o.map(1001, 0).unwrap_err().contains("uid 1001"));
    }
}
