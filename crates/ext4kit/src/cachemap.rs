//! The concurrent maps of the in-memory caches (buffers, inodes, dentries,
//! pages, descriptors) and the hasher they share.
//!
//! Keys are block and inode numbers and (directory, name) pairs, hashed on
//! every lookup of every cache: with std's SipHash (`RandomState`),
//! `hash_one` and `DefaultHasher::write` were ~4% of a create's samples
//! (seed 004 under `perf`); with foldhash the same run to 200,000 files
//! used ~4% less CPU. foldhash is built for exactly this — short keys,
//! hash tables — at a fraction of the cost, and is still seeded at random
//! per map, so a crafted image cannot choose numbers or names that collide
//! in every process (papaya also bounds probe lengths).
//!
//! Eviction order lives beside each map in a [`crate::clock::Clock`].

/// The hasher of every cache map.
pub type KeyHasher = foldhash::fast::RandomState;

/// A cache's concurrent map.
pub type Map<K, V> = papaya::HashMap<K, V, KeyHasher>;

/// A pinned view of a [`Map`].
pub type MapRef<'a, K, V> = papaya::HashMapRef<'a, K, V, KeyHasher, papaya::LocalGuard<'a>>;

/// An empty map with a freshly seeded hasher.
pub fn new<K, V>() -> Map<K, V> {
    papaya::HashMap::with_hasher(KeyHasher::default())
}

/// Make room for a cache that has reached its limit and will now churn
/// (each insert paid for by an eviction): a table of about four times the
/// limit, once. Call it before each eviction sweep; it does nothing when
/// the table is that large already.
///
/// Why: papaya never reuses the slot of a removed entry, so a map whose
/// size stays put while its keys change fills its table with tombstones
/// and copies every live entry into a fresh table each time it does.
/// With the table about twice the live entries, as papaya sizes it, that
/// is a copy every ~0.7 × live inserts — more than one entry copied per
/// insert, each a cache miss on a large map (`help_copy` was ~0.3 µs of
/// a create past the dentry cache's limit, seed 004). At four times the
/// limit a copy comes every ~2.4 × live inserts; papaya keeps that size,
/// as it shrinks a table only below one eighth full.
pub fn size_for_churn<K, V>(m: &MapRef<'_, K, V>, limit: usize)
where
    K: std::hash::Hash + Eq,
{
    let want = 3 * limit;
    let len = m.len();
    if want > len {
        m.reserve(want - len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's size is not observable through papaya's API (the effect
    /// is measured by `seeds-create`); what must hold is that resizing
    /// under churn loses and invents nothing.
    #[test]
    fn a_churning_map_sized_for_it_keeps_exactly_its_entries() {
        let m: Map<u32, u32> = new();
        let g = m.pin();
        let limit = 4096u32;
        for i in 0..limit {
            g.insert(i, i);
        }
        size_for_churn(&g, limit as usize);
        size_for_churn(&g, limit as usize);
        for i in limit..limit * 8 {
            g.insert(i, i);
            g.remove(&(i - limit));
            size_for_churn(&g, limit as usize);
        }
        assert_eq!(g.len(), limit as usize);
        assert!((limit * 7..limit * 8).all(|i| g.get(&i) == Some(&i)));
        assert!((0..limit * 7).step_by(97).all(|i| g.get(&i).is_none()));
    }

    #[test]
    fn maps_hash_with_independent_seeds() {
        use std::hash::BuildHasher;
        let (a, b) = (KeyHasher::default(), KeyHasher::default());
        // Two maps disagree on where most keys go (seeded at random).
        let same = (0u64..64).filter(|k| a.hash_one(k) == b.hash_one(k)).count();
        assert!(same < 4, "{same} of 64 keys hashed alike by two seeds");
        let m: Map<u32, u32> = new();
        let g = m.pin();
        for i in 0..1000 {
            g.insert(i, i * 2);
        }
        assert!((0..1000).all(|i| g.get(&i) == Some(&(i * 2))));
    }
}
