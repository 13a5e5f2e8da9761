//! Extended attributes: the in-inode area, external xattr blocks, the entry
//! and block hashes, and POSIX ACL value conversion.
//!
//! Two places hold attributes, with the same entry format:
//!
//! * **In the inode**, after `128 + i_extra_isize` bytes: a 4-byte magic
//!   (`struct ext4_xattr_ibody_header`) then entries. Value offsets count
//!   from the *first entry* (just past the magic). The area is unused unless
//!   it starts with the magic; the kernel zeroes the magic when the last
//!   attribute goes.
//! * **In one external block** (`i_file_acl`): a 32-byte `struct
//!   ext4_xattr_header` then entries; value offsets count from the *block
//!   start*. A block may be shared by several inodes (`h_refcount`), which
//!   is what `h_hash` and the entry hashes are for (the kernel's mbcache
//!   finds identical blocks by hash). With `metadata_csum`, `h_checksum` is
//!   crc32c from the filesystem seed over the little-endian 64-bit block
//!   number, then the block with `h_checksum` taken as zero (kernel
//!   `ext4_xattr_block_csum`): the block number is included so a block
//!   copied elsewhere does not verify.
//!
//! An entry (`struct ext4_xattr_entry`) is 16 bytes {`e_name_len` u8,
//! `e_name_index` u8, `e_value_offs` u16, `e_value_inum` u32, `e_value_size`
//! u32, `e_hash` u32} plus the name, padded to 4 bytes; the list ends with a
//! zero u32. The name is stored without its namespace prefix, which is
//! encoded in `e_name_index` (so `user.foo` is index 1, name `foo`, and the
//! POSIX ACLs are index 2/3 with an *empty* name). Values are padded to 4
//! bytes and packed from the end of the area downwards. With `ea_inode`, a
//! large value lives in its own inode (`e_value_inum`), and only its size is
//! recorded here.
//!
//! Validation follows the kernel's `check_xattrs`: every entry header and
//! name inside the area, names without NUL bytes, values inside the area and
//! past the entry table (including its terminator), `e_value_size` at most
//! 16 MiB. We also refuse an empty name outside the namespaces whose prefix
//! is the whole name (the kernel cannot create one: the VFS rejects
//! `"user."`).

use crate::bytes::{le16, le32, put16, put32};
use crate::checksum::crc32c;
use crate::error::{corrupt, FormatError, Result};

/// `h_magic` of both the in-inode area and an xattr block.
pub const XATTR_MAGIC: u32 = 0xEA02_0000;
/// Size of `struct ext4_xattr_entry` without its name.
pub const ENTRY_HEADER: usize = 16;
/// Largest `e_value_size` the kernel accepts (`EXT4_XATTR_SIZE_MAX`).
pub const VALUE_SIZE_MAX: u32 = 1 << 24;
/// Offset of `h_checksum` in the block header.
pub const BLOCK_CHECKSUM_OFFSET: usize = 0x10;

/// Name index: `user.`.
pub const INDEX_USER: u8 = 1;
/// Name index: `system.posix_acl_access` (empty name).
pub const INDEX_POSIX_ACL_ACCESS: u8 = 2;
/// Name index: `system.posix_acl_default` (empty name).
pub const INDEX_POSIX_ACL_DEFAULT: u8 = 3;
/// Name index: `trusted.`.
pub const INDEX_TRUSTED: u8 = 4;
/// Name index: Lustre (no user-visible prefix).
pub const INDEX_LUSTRE: u8 = 5;
/// Name index: `security.`.
pub const INDEX_SECURITY: u8 = 6;
/// Name index: `system.` (`system.data` holds inline data). The kernel has
/// no handler for it: these attributes are internal and never listed.
pub const INDEX_SYSTEM: u8 = 7;
/// Name index: `system.richacl` (empty name; not in mainline Linux).
pub const INDEX_RICHACL: u8 = 8;
/// Name index: encryption context (name "c"; internal, no prefix).
pub const INDEX_ENCRYPTION: u8 = 9;
/// Name index: `gnu.` (GNU Hurd translators).
pub const INDEX_HURD: u8 = 10;

/// Namespaces whose stored name is empty: the prefix is the whole name.
const FULL_NAMES: [(u8, &[u8]); 3] = [
    (INDEX_POSIX_ACL_ACCESS, b"system.posix_acl_access"),
    (INDEX_POSIX_ACL_DEFAULT, b"system.posix_acl_default"),
    (INDEX_RICHACL, b"system.richacl"),
];
/// Namespaces that prefix a non-empty stored name.
const PREFIXES: [(u8, &[u8]); 5] = [
    (INDEX_USER, b"user."),
    (INDEX_TRUSTED, b"trusted."),
    (INDEX_SECURITY, b"security."),
    (INDEX_SYSTEM, b"system."),
    (INDEX_HURD, b"gnu."),
];

/// The user-visible prefix of a name index (the whole name for the ACL
/// indexes), or `None` for indexes with no user-visible name (Lustre,
/// encryption, unknown).
pub fn prefix(index: u8) -> Option<&'static [u8]> {
    FULL_NAMES
        .iter()
        .chain(PREFIXES.iter())
        .find(|(i, _)| *i == index)
        .map(|(_, p)| *p)
}

/// Whether `index` stores its attribute with an empty name.
fn empty_name_index(index: u8) -> bool {
    FULL_NAMES.iter().any(|(i, _)| *i == index)
}

/// Split "user.foo" into (index, suffix); `None` for an unknown namespace
/// or an empty suffix after a prefix ("user." alone is not a name).
/// The ACL names map to their index with an empty suffix.
pub fn split_name(full: &[u8]) -> Option<(u8, &[u8])> {
    if let Some((i, _)) = FULL_NAMES.iter().find(|(_, n)| *n == full) {
        return Some((*i, &full[full.len()..]));
    }
    PREFIXES.iter().find_map(|(i, p)| match full.strip_prefix(*p) {
        Some(rest) if !rest.is_empty() => Some((*i, rest)),
        _ => None,
    })
}

/// One extended attribute as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrEntry {
    /// `e_name_index`: the namespace.
    pub name_index: u8,
    /// `e_name`: the name without its namespace prefix.
    pub name: Vec<u8>,
    /// The value when stored in the area or block; empty when it lives in an
    /// EA inode (`value_inum != 0`).
    pub value: Vec<u8>,
    /// `e_value_inum`: the EA inode holding the value, or 0.
    pub value_inum: u32,
    /// `e_value_size`: the value's length (equals `value.len()` for an
    /// inline value; the EA inode's value length otherwise).
    pub value_size: u32,
    /// `e_hash` as stored (see [`entry_hash`]).
    pub hash: u32,
}

impl XattrEntry {
    /// An inline attribute (hash left 0: the serialisers compute it).
    pub fn new(name_index: u8, name: &[u8], value: &[u8]) -> Self {
        XattrEntry {
            name_index,
            name: name.to_vec(),
            value: value.to_vec(),
            value_inum: 0,
            value_size: value.len() as u32,
            hash: 0,
        }
    }

    /// "user.foo" etc.: the namespace prefix followed by the stored name.
    /// Empty for an index without a user-visible prefix ([`prefix`]): such
    /// attributes are internal and must not be listed.
    pub fn full_name(&self) -> Vec<u8> {
        match prefix(self.name_index) {
            Some(p) => [p, &self.name[..]].concat(),
            None => Vec::new(),
        }
    }

    /// Whether the value lives in an EA inode.
    pub fn in_ea_inode(&self) -> bool {
        self.value_inum != 0
    }
}

crate::layout! {
    /// `struct ext4_xattr_header`: the first 32 bytes of an xattr block.
    pub struct XattrBlockHeader (32) {
        magic: u32 = 0x0,
        refcount: u32 = 0x4,
        blocks: u32 = 0x8,
        hash: u32 = 0xC,
        checksum: u32 = 0x10,
        reserved: [u32; 3] = 0x14,
    }
}

/// Length of an entry with a `name_len`-byte name (`EXT4_XATTR_LEN`).
#[inline]
pub fn entry_len(name_len: usize) -> usize {
    (ENTRY_HEADER + name_len + 3) & !3
}

/// Space a value takes (`EXT4_XATTR_SIZE`), in u64 so that no size wraps.
#[inline]
fn padded(size: u64) -> u64 {
    (size + 3) & !3
}

const NAME_HASH_SHIFT: u32 = 5;
const VALUE_HASH_SHIFT: u32 = 16;
const BLOCK_HASH_SHIFT: u32 = 16;

fn hash_value_words(mut hash: u32, value: &[u8]) -> u32 {
    for chunk in value.chunks(4) {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        hash = (hash << VALUE_HASH_SHIFT) ^ (hash >> (32 - VALUE_HASH_SHIFT)) ^ u32::from_le_bytes(w);
    }
    hash
}

/// `ext4_xattr_hash_entry`: the hash of a stored name (no prefix) and value
/// (zero-padded to 4 bytes, taken as little-endian words). Name bytes are
/// `unsigned char`.
///
/// Why unsigned: the C code used plain `char`, so x86 kernels (signed
/// `char`) and e2fsprogs hashed names with bytes >= 0x80 differently from
/// ARM ones. Linux 6.2 made `char` unsigned everywhere and now writes this
/// flavour, accepting [`entry_hash_signed`] as a legacy alternative when
/// checking (e2fsck 1.47 does the same). New hashes should therefore be
/// unsigned; a reader that checks hashes should accept either. The two
/// differ only for names with high bytes.
///
/// For an entry whose value is in an EA inode the kernel hashes the name and
/// then the EA inode's stored value hash as one word: that is
/// `entry_hash(name, &ea_inode_hash.to_le_bytes())`.
pub fn entry_hash(name: &[u8], value: &[u8]) -> u32 {
    let mut hash = 0u32;
    for &b in name {
        hash = (hash << NAME_HASH_SHIFT) ^ (hash >> (32 - NAME_HASH_SHIFT)) ^ b as u32;
    }
    hash_value_words(hash, value)
}

/// `ext4_xattr_hash_entry_signed`: [`entry_hash`] with name bytes
/// sign-extended, as x86 kernels before 6.2 computed it.
pub fn entry_hash_signed(name: &[u8], value: &[u8]) -> u32 {
    let mut hash = 0u32;
    for &b in name {
        hash = (hash << NAME_HASH_SHIFT) ^ (hash >> (32 - NAME_HASH_SHIFT)) ^ (b as i8 as i32 as u32);
    }
    hash_value_words(hash, value)
}

/// `ext4_xattr_rehash`: the block hash over the entries' `e_hash` in
/// on-disk order; 0 (meaning "never share this block") if any entry hash
/// is 0.
pub fn block_hash(entries: &[XattrEntry]) -> u32 {
    rehash(entries.iter().map(|e| e.hash))
}

fn rehash(hashes: impl IntoIterator<Item = u32>) -> u32 {
    let mut hash = 0u32;
    for h in hashes {
        if h == 0 {
            return 0;
        }
        hash = (hash << BLOCK_HASH_SHIFT) ^ (hash >> (32 - BLOCK_HASH_SHIFT)) ^ h;
    }
    hash
}

/// `ext4_xattr_block_csum` of a whole block (the stored checksum is read as
/// zero).
pub fn block_checksum(block: &[u8], block_nr: u64, fs_seed: u32) -> u32 {
    let c = crc32c(fs_seed, &block_nr.to_le_bytes());
    let c = crc32c(c, &block[..BLOCK_CHECKSUM_OFFSET]);
    let c = crc32c(c, &[0u8; 4]);
    crc32c(c, &block[BLOCK_CHECKSUM_OFFSET + 4..])
}

/// Recompute and store `h_checksum` (after editing a block in place).
pub fn set_block_checksum(block: &mut [u8], block_nr: u64, fs_seed: u32) {
    let c = block_checksum(block, block_nr, fs_seed);
    put32(block, BLOCK_CHECKSUM_OFFSET, c);
}

/// Decode the entries of `area`: the table starts at `first`, value offsets
/// count from `value_base`, and everything must lie inside `area`.
fn parse_entries(s: &'static str, area: &[u8], first: usize, value_base: usize) -> Result<Vec<XattrEntry>> {
    let end = area.len();
    // Pass 1 (names): walk to the terminating zero word.
    let mut e = first;
    let mut heads = Vec::new();
    loop {
        if e + 4 > end {
            return Err(corrupt(
                s,
                format!("entry table runs past the end at offset {e} (no terminator)"),
            ));
        }
        if le32(area, e) == 0 {
            break;
        }
        let name_len = area[e] as usize;
        let next = e + entry_len(name_len);
        if next + 4 > end {
            return Err(corrupt(
                s,
                format!("entry at offset {e} (name of {name_len} bytes) runs past the end"),
            ));
        }
        let index = area[e + 1];
        let name = &area[e + ENTRY_HEADER..e + ENTRY_HEADER + name_len];
        if name.contains(&0) {
            return Err(corrupt(s, format!("name of entry at offset {e} contains a NUL byte")));
        }
        if name.is_empty() && !empty_name_index(index) {
            return Err(corrupt(
                s,
                format!("entry at offset {e} has an empty name in namespace {index}"),
            ));
        }
        heads.push(e);
        e = next;
    }
    let table_end = e + 4;
    // Pass 2 (values).
    heads
        .into_iter()
        .map(|e| {
            let name_len = area[e] as usize;
            let offs = le16(area, e + 2) as usize;
            let value_inum = le32(area, e + 4);
            let value_size = le32(area, e + 8);
            if value_size > VALUE_SIZE_MAX {
                return Err(corrupt(
                    s,
                    format!("value of entry at offset {e} is {value_size} bytes (max {VALUE_SIZE_MAX})"),
                ));
            }
            let value = if value_inum != 0 || value_size == 0 {
                Vec::new()
            } else {
                let start = value_base + offs;
                if start < table_end {
                    return Err(corrupt(
                        s,
                        format!("value of entry at offset {e} overlaps the entry table"),
                    ));
                }
                if start as u64 + padded(value_size as u64) > end as u64 {
                    return Err(corrupt(
                        s,
                        format!("value of entry at offset {e} ({value_size} bytes at {start}) runs past the end"),
                    ));
                }
                area[start..start + value_size as usize].to_vec()
            };
            Ok(XattrEntry {
                name_index: area[e + 1],
                name: area[e + ENTRY_HEADER..e + ENTRY_HEADER + name_len].to_vec(),
                value,
                value_inum,
                value_size,
                hash: le32(area, e + 12),
            })
        })
        .collect()
}

/// Decode the in-inode attributes. `area` is the inode from byte
/// `128 + i_extra_isize` to its end. An area shorter than 4 bytes or not
/// starting with [`XATTR_MAGIC`] holds no attributes: `Ok(vec![])`.
pub fn parse_ibody(area: &[u8]) -> Result<Vec<XattrEntry>> {
    const S: &str = "in-inode xattr";
    if area.len() < 4 || le32(area, 0) != XATTR_MAGIC {
        return Ok(Vec::new());
    }
    if area.len() < 8 {
        return Err(corrupt(
            S,
            format!("{}-byte area too small for the magic and a terminator", area.len()),
        ));
    }
    parse_entries(S, area, 4, 4)
}

/// Decode and validate an xattr block: magic, `h_blocks == 1`, the checksum
/// when `fs_csum_seed` is given (`block_nr` is the block's physical
/// number), and the entries. Entry hashes are not checked (the kernel does
/// not either; they only matter for block sharing). `h_refcount` is left to
/// the caller.
pub fn parse_block(
    block: &[u8],
    block_nr: u64,
    fs_csum_seed: Option<u32>,
) -> Result<(XattrBlockHeader, Vec<XattrEntry>)> {
    const S: &str = "xattr block";
    if block.len() < XattrBlockHeader::SIZE + 4 {
        return Err(corrupt(S, format!("{}-byte block too small", block.len())));
    }
    let h = XattrBlockHeader::parse_raw(block);
    if h.magic != XATTR_MAGIC {
        return Err(corrupt(S, format!("bad magic {:#010x}", h.magic)));
    }
    if h.blocks != 1 {
        return Err(corrupt(S, format!("h_blocks is {} (must be 1)", h.blocks)));
    }
    if let Some(seed) = fs_csum_seed {
        let computed = block_checksum(block, block_nr, seed);
        if computed != h.checksum {
            return Err(FormatError::Checksum {
                structure: S,
                stored: h.checksum,
                computed,
            });
        }
    }
    let entries = parse_entries(S, block, XattrBlockHeader::SIZE, 0)?;
    Ok((h, entries))
}

/// Lay out `entries` in `area` (already zeroed): table from `first`, value
/// offsets from `value_base`, values packed down from the end.
/// `block_hashes` selects the hash rule (see the serialisers).
fn write_entries(
    s: &'static str,
    area: &mut [u8],
    entries: &[XattrEntry],
    first: usize,
    value_base: usize,
    block_hashes: bool,
) -> Result<Vec<u32>> {
    let table: usize = entries.iter().map(|e| entry_len(e.name.len())).sum::<usize>() + 4;
    let values: u64 = entries
        .iter()
        .filter(|e| e.value_inum == 0)
        .map(|e| padded(e.value.len() as u64))
        .sum();
    let need = first as u64 + table as u64 + values;
    if need > area.len() as u64 {
        return Err(corrupt(
            s,
            format!("attributes need {need} bytes, {} available", area.len()),
        ));
    }
    let mut hashes = Vec::with_capacity(entries.len());
    let mut e_off = first;
    let mut v_end = area.len();
    for e in entries {
        if e.name.len() > 255 {
            return Err(corrupt(s, format!("name of {} bytes (max 255)", e.name.len())));
        }
        if e.name.contains(&0) || (e.name.is_empty() && !empty_name_index(e.name_index)) {
            return Err(corrupt(
                s,
                format!(
                    "invalid name {:?} in namespace {}",
                    String::from_utf8_lossy(&e.name),
                    e.name_index
                ),
            ));
        }
        let (offs, size, hash) = if e.value_inum != 0 {
            if !e.value.is_empty() || e.value_size > VALUE_SIZE_MAX {
                return Err(corrupt(s, "EA-inode entry with an inline value or an oversized length"));
            }
            (0, e.value_size, e.hash)
        } else {
            if e.value.len() > VALUE_SIZE_MAX as usize {
                return Err(corrupt(
                    s,
                    format!("value of {} bytes (max {VALUE_SIZE_MAX})", e.value.len()),
                ));
            }
            let hash = if block_hashes { entry_hash(&e.name, &e.value) } else { 0 };
            if e.value.is_empty() {
                (0, 0, hash)
            } else {
                // Fits: checked against the total above.
                v_end -= padded(e.value.len() as u64) as usize;
                area[v_end..v_end + e.value.len()].copy_from_slice(&e.value);
                let offs = v_end - value_base;
                if offs > u16::MAX as usize {
                    return Err(corrupt(s, format!("value offset {offs} does not fit 16 bits")));
                }
                (offs as u16, e.value.len() as u32, hash)
            }
        };
        area[e_off] = e.name.len() as u8;
        area[e_off + 1] = e.name_index;
        put16(area, e_off + 2, offs);
        put32(area, e_off + 4, e.value_inum);
        put32(area, e_off + 8, size);
        put32(area, e_off + 12, hash);
        area[e_off + ENTRY_HEADER..e_off + ENTRY_HEADER + e.name.len()].copy_from_slice(&e.name);
        hashes.push(hash);
        e_off += entry_len(e.name.len());
    }
    Ok(hashes)
}

/// Build an in-inode attribute area of `area_len` bytes (the inode from
/// `128 + i_extra_isize` to its end), in the given order. No entries gives
/// an all-zero area (no magic), as the kernel leaves it.
///
/// `e_hash` is written 0 for inline values, as both the kernel and mke2fs
/// do in-inode (e2fsck accepts 0 or the true hash); an EA-inode entry keeps
/// its `hash`, which depends on the EA inode only the caller can read.
/// `value_size` of inline entries is taken from `value.len()`. Errors if the
/// entries do not fit or are not representable.
pub fn serialize_ibody(entries: &[XattrEntry], area_len: usize) -> Result<Vec<u8>> {
    let mut area = vec![0u8; area_len];
    if entries.is_empty() {
        return Ok(area);
    }
    write_entries("in-inode xattr", &mut area, entries, 4, 4, false)?;
    put32(&mut area, 0, XATTR_MAGIC);
    Ok(area)
}

/// The kernel's order for block entries (`ext4_xattr_find_entry` with
/// `sorted`): by index, then name length, then name bytes. Lookups in a
/// block stop early on the strength of it.
fn block_order(a: &XattrEntry, b: &XattrEntry) -> std::cmp::Ordering {
    (a.name_index, a.name.len(), &a.name).cmp(&(b.name_index, b.name.len(), &b.name))
}

/// Build an xattr block of `block_size` bytes: header (`h_blocks` 1, the
/// given `h_refcount`, `h_hash` from [`block_hash`], checksum when
/// `fs_csum_seed` is given, using physical `block_nr`) and the entries in
/// the kernel's sorted order, values packed from the block end.
///
/// `e_hash` is computed ([`entry_hash`], unsigned) for inline values; an
/// EA-inode entry keeps its `hash`. Errors if the entries do not fit.
pub fn serialize_block(
    entries: &[XattrEntry],
    block_size: usize,
    refcount: u32,
    block_nr: u64,
    fs_csum_seed: Option<u32>,
) -> Result<Vec<u8>> {
    const S: &str = "xattr block";
    let mut sorted: Vec<&XattrEntry> = entries.iter().collect();
    sorted.sort_by(|a, b| block_order(a, b));
    let sorted: Vec<XattrEntry> = sorted.into_iter().cloned().collect();
    let mut block = vec![0u8; block_size];
    let hashes = write_entries(S, &mut block, &sorted, XattrBlockHeader::SIZE, 0, true)?;
    let hash = rehash(hashes);
    XattrBlockHeader {
        magic: XATTR_MAGIC,
        refcount,
        blocks: 1,
        hash,
        checksum: 0,
        reserved: [0; 3],
    }
    .serialize_into(&mut block);
    if let Some(seed) = fs_csum_seed {
        set_block_checksum(&mut block, block_nr, seed);
    }
    Ok(block)
}

/// ACL tags (`e_tag`).
pub mod acl_tag {
    /// `ACL_USER_OBJ`: the owner.
    pub const USER_OBJ: u16 = 0x01;
    /// `ACL_USER`: a named user (has an id).
    pub const USER: u16 = 0x02;
    /// `ACL_GROUP_OBJ`: the owning group.
    pub const GROUP_OBJ: u16 = 0x04;
    /// `ACL_GROUP`: a named group (has an id).
    pub const GROUP: u16 = 0x08;
    /// `ACL_MASK`: upper bound for named entries and the group.
    pub const MASK: u16 = 0x10;
    /// `ACL_OTHER`: everyone else.
    pub const OTHER: u16 = 0x20;
}
/// `EXT4_ACL_VERSION`: version of the on-disk ACL format.
pub const ACL_DISK_VERSION: u32 = 1;
/// `POSIX_ACL_XATTR_VERSION`: version of the syscall ACL format.
pub const ACL_XATTR_VERSION: u32 = 2;
/// `ACL_UNDEFINED_ID`: the id of entries that have none.
pub const ACL_UNDEFINED_ID: u32 = u32::MAX;

/// Convert an on-disk `system.posix_acl_*` value (ext4 format: version 1,
/// 4-byte entries for USER_OBJ/GROUP_OBJ/MASK/OTHER, 8-byte ones with an id
/// for USER/GROUP) to the format `getxattr(2)` returns (version 2, every
/// entry 8 bytes, id `ACL_UNDEFINED_ID` where there is none).
///
/// Checks as the kernel's `ext4_acl_from_disk`: version, a size that
/// `ext4_acl_count` accepts (at most 4 short entries), known tags, and
/// entries consuming the value exactly. Permissions and order are passed
/// through, as the kernel does on read.
pub fn acl_disk_to_xattr(disk: &[u8]) -> Result<Vec<u8>> {
    const S: &str = "posix acl";
    if disk.len() < 4 {
        return Err(corrupt(S, "value shorter than its header"));
    }
    let version = le32(disk, 0);
    if version != ACL_DISK_VERSION {
        return Err(corrupt(
            S,
            format!("on-disk version {version} (expected {ACL_DISK_VERSION})"),
        ));
    }
    let body = disk.len() - 4;
    let count = if body < 16 {
        (body & 3 == 0).then_some(body / 4)
    } else {
        ((body - 16) & 7 == 0).then_some((body - 16) / 8 + 4)
    };
    let count = count.ok_or_else(|| corrupt(S, format!("size {} is no whole number of entries", disk.len())))?;
    let mut out = Vec::with_capacity(4 + 8 * count);
    out.extend_from_slice(&ACL_XATTR_VERSION.to_le_bytes());
    let mut off = 4;
    for _ in 0..count {
        if off + 4 > disk.len() {
            return Err(corrupt(S, "entries run past the end"));
        }
        let tag = le16(disk, off);
        let (id, len) = match tag {
            acl_tag::USER_OBJ | acl_tag::GROUP_OBJ | acl_tag::MASK | acl_tag::OTHER => (ACL_UNDEFINED_ID, 4),
            acl_tag::USER | acl_tag::GROUP => {
                if off + 8 > disk.len() {
                    return Err(corrupt(S, "entries run past the end"));
                }
                (le32(disk, off + 4), 8)
            }
            t => return Err(corrupt(S, format!("unknown tag {t:#x}"))),
        };
        out.extend_from_slice(&disk[off..off + 4]);
        out.extend_from_slice(&id.to_le_bytes());
        off += len;
    }
    if off != disk.len() {
        return Err(corrupt(S, "entries do not fill the value exactly"));
    }
    Ok(out)
}

/// Convert a `setxattr(2)` ACL value (version 2, 8-byte entries) to the
/// on-disk format (see [`acl_disk_to_xattr`]).
///
/// Refuses what the kernel's `setxattr` refuses (`posix_acl_from_xattr` and
/// `posix_acl_valid`): wrong version or size, unknown tags, permission bits
/// beyond rwx, entries out of the canonical order (USER_OBJ, USER..,
/// GROUP_OBJ, GROUP.., MASK, OTHER) or duplicated, a missing MASK when named
/// entries exist, and `ACL_UNDEFINED_ID` on a named entry. A header with no
/// entries converts to a header with no entries (the kernel treats it as
/// "remove the ACL").
pub fn acl_xattr_to_disk(x: &[u8]) -> Result<Vec<u8>> {
    const S: &str = "posix acl";
    if x.len() < 4 || (x.len() - 4) & 7 != 0 {
        return Err(corrupt(S, format!("size {} is no whole number of entries", x.len())));
    }
    let version = le32(x, 0);
    if version != ACL_XATTR_VERSION {
        return Err(corrupt(
            S,
            format!("xattr version {version} (expected {ACL_XATTR_VERSION})"),
        ));
    }
    let mut out = Vec::with_capacity(x.len());
    out.extend_from_slice(&ACL_DISK_VERSION.to_le_bytes());
    if x.len() == 4 {
        return Ok(out);
    }
    // posix_acl_valid's state machine: the tag we may see next.
    let mut state = acl_tag::USER_OBJ;
    let mut needs_mask = false;
    for e in x[4..].chunks_exact(8) {
        let (tag, perm, id) = (le16(e, 0), le16(e, 2), le32(e, 4));
        if perm & !7 != 0 {
            return Err(corrupt(S, format!("permission bits {perm:#o} beyond rwx")));
        }
        let ok = match tag {
            acl_tag::USER_OBJ => std::mem::replace(&mut state, acl_tag::USER) == acl_tag::USER_OBJ,
            acl_tag::USER | acl_tag::GROUP => {
                needs_mask = true;
                state == tag && id != ACL_UNDEFINED_ID
            }
            acl_tag::GROUP_OBJ => std::mem::replace(&mut state, acl_tag::GROUP) == acl_tag::USER,
            acl_tag::MASK => std::mem::replace(&mut state, acl_tag::OTHER) == acl_tag::GROUP,
            acl_tag::OTHER => {
                let ok = state == acl_tag::OTHER || (state == acl_tag::GROUP && !needs_mask);
                state = 0;
                ok
            }
            t => return Err(corrupt(S, format!("unknown tag {t:#x}"))),
        };
        if !ok {
            return Err(corrupt(
                S,
                format!("entry with tag {tag:#x} out of order, duplicated or without an id"),
            ));
        }
        out.extend_from_slice(&e[..4]);
        if matches!(tag, acl_tag::USER | acl_tag::GROUP) {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    if state != 0 {
        return Err(corrupt(
            S,
            "incomplete ACL (needs USER_OBJ, GROUP_OBJ, OTHER, and MASK with named entries)",
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::fs_csum_seed;
    use proptest::prelude::*;

    /// UUID of the image the real samples below come from (1 KiB blocks,
    /// 256-byte inodes, metadata_csum; made by mke2fs 1.47.0, then mounted
    /// and written by Linux 6.18).
    const UUID: [u8; 16] = [
        0xa3, 0x49, 0xaa, 0x52, 0xf3, 0x0b, 0x40, 0xdf, 0x85, 0xb3, 0x9c, 0xf9, 0x02, 0xac, 0x29, 0xaa,
    ];

    /// Linux-written inode: bytes 160..256 (extra_isize 32) after
    /// `setxattr trusted.x ""` and an access ACL u::rw,u:1000:rw,u:1001:r,
    /// g::r,g:50:rx,m::rw,o::r.
    const KERNEL_IBODY: [u8; 96] = [
        0x00, 0x00, 0x02, 0xea, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x78, 0x00, 0x00, 0x00, 0x00, 0x02, 0x30, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x2c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x06, 0x00, 0x02, 0x00, 0x06, 0x00, //
        0xe8, 0x03, 0x00, 0x00, 0x02, 0x00, 0x04, 0x00, 0xe9, 0x03, 0x00, 0x00, 0x04, 0x00, 0x04, 0x00, //
        0x08, 0x00, 0x05, 0x00, 0x32, 0x00, 0x00, 0x00, 0x10, 0x00, 0x06, 0x00, 0x20, 0x00, 0x04, 0x00, //
    ];
    /// The same ACL as `getxattr(2)` returned it on that kernel.
    const KERNEL_ACL_XATTR: &str = "0200000001000600ffffffff02000600e803000002000400e903000004000400\
                                    ffffffff080005003200000010000600ffffffff20000400ffffffff";

    /// The same inode's xattr block (physical block 1619): header and
    /// entries; the rest is zeros and the three values (see `kernel_block`).
    const KERNEL_BLOCK_HEAD: [u8; 0x60] = [
        0x00, 0x00, 0x02, 0xea, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x4e, 0x83, 0x8e, 0xf8, //
        0xbc, 0x45, 0xfd, 0xaf, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x03, 0x01, 0xd4, 0x02, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x01, 0x00, 0x00, 0x43, 0x42, 0x05, 0xc7, //
        0x62, 0x69, 0x67, 0x00, 0x04, 0x01, 0x78, 0x02, 0x00, 0x00, 0x00, 0x00, 0x5a, 0x00, 0x00, 0x00, //
        0x42, 0x77, 0x1e, 0xbb, 0x68, 0x69, 0xff, 0xfe, 0x05, 0x01, 0x1c, 0x02, 0x00, 0x00, 0x00, 0x00, //
        0x5a, 0x00, 0x00, 0x00, 0x13, 0x7a, 0xc9, 0x48, 0xc3, 0xa9, 0x74, 0xc3, 0xa9, 0x00, 0x00, 0x00, //
    ];
    const KERNEL_BLOCK_NR: u64 = 1619;

    /// mke2fs -d inode: `user.a=hello` and ACL u::rw,u:1000:rw,g::r,m::rw,o::r
    /// (e2fsprogs converted the ACL to disk format itself).
    const MKE2FS_IBODY: [u8; 96] = [
        0x00, 0x00, 0x02, 0xea, 0x01, 0x01, 0x54, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x61, 0x00, 0x00, 0x00, 0x00, 0x02, 0x38, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x1c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, //
        0x01, 0x00, 0x06, 0x00, 0x02, 0x00, 0x06, 0x00, 0xe8, 0x03, 0x00, 0x00, 0x04, 0x00, 0x04, 0x00, //
        0x10, 0x00, 0x06, 0x00, 0x20, 0x00, 0x04, 0x00, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x00, 0x00, 0x00, //
    ];
    const MKE2FS_ACL_XATTR: &str =
        "0200000001000600ffffffff02000600e803000004000400ffffffff10000600ffffffff20000400ffffffff";

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn kernel_block() -> Vec<u8> {
        let mut b = vec![0u8; 1024];
        b[..0x60].copy_from_slice(&KERNEL_BLOCK_HEAD);
        b[0x2d4..0x2d4 + 300].fill(b'B');
        b[0x278..0x278 + 90].fill(b'w');
        b[0x21c..0x21c + 90].fill(b'v');
        b
    }

    fn seed() -> u32 {
        fs_csum_seed(&UUID, false, 0)
    }

    #[test]
    fn layout_is_complete() {
        XattrBlockHeader::layout_covers_every_byte();
    }

    #[test]
    fn kernel_block_parses_and_reserialises_exactly() {
        let b = kernel_block();
        let (h, es) = parse_block(&b, KERNEL_BLOCK_NR, Some(seed())).unwrap();
        assert_eq!((h.refcount, h.blocks, h.hash), (1, 1, 0xf88e_834e));
        let names: Vec<Vec<u8>> = es.iter().map(|e| e.full_name()).collect();
        assert_eq!(
            names,
            [
                b"user.big".to_vec(),
                b"user.hi\xff\xfe".to_vec(),
                "user.été".as_bytes().to_vec()
            ]
        );
        assert_eq!(es[0].value, vec![b'B'; 300]);
        assert_eq!(es[2].value, vec![b'v'; 90]);
        for e in &es {
            // Linux >= 6.2 hashes names as unsigned char.
            assert_eq!(e.hash, entry_hash(&e.name, &e.value));
        }
        assert_ne!(es[1].hash, entry_hash_signed(&es[1].name, &es[1].value));
        assert_eq!(block_hash(&es), h.hash);
        let again = serialize_block(&es, 1024, 1, KERNEL_BLOCK_NR, Some(seed())).unwrap();
        assert_eq!(again, b);
        // Same bytes, another block number: the checksum no longer holds.
        assert!(matches!(
            parse_block(&b, KERNEL_BLOCK_NR + 1, Some(seed())),
            Err(FormatError::Checksum { .. })
        ));
    }

    #[test]
    fn kernel_ibody_and_acl() {
        let es = parse_ibody(&KERNEL_IBODY).unwrap();
        assert_eq!(es.len(), 2);
        assert_eq!((es[0].full_name(), es[0].value.len()), (b"trusted.x".to_vec(), 0));
        assert_eq!(es[1].full_name(), b"system.posix_acl_access".to_vec());
        assert!(es[1].name.is_empty());
        let x = acl_disk_to_xattr(&es[1].value).unwrap();
        assert_eq!(x, unhex(KERNEL_ACL_XATTR));
        assert_eq!(acl_xattr_to_disk(&x).unwrap(), es[1].value);
        assert_eq!(serialize_ibody(&es, 96).unwrap(), KERNEL_IBODY);
    }

    #[test]
    fn mke2fs_ibody_and_acl() {
        let es = parse_ibody(&MKE2FS_IBODY).unwrap();
        assert_eq!(es[0], XattrEntry::new(INDEX_USER, b"a", b"hello"));
        assert_eq!(es[1].name_index, INDEX_POSIX_ACL_ACCESS);
        assert_eq!(acl_disk_to_xattr(&es[1].value).unwrap(), unhex(MKE2FS_ACL_XATTR));
        assert_eq!(acl_xattr_to_disk(&unhex(MKE2FS_ACL_XATTR)).unwrap(), es[1].value);
        assert_eq!(serialize_ibody(&es, 96).unwrap(), MKE2FS_IBODY);
    }

    #[test]
    fn names() {
        assert_eq!(split_name(b"user.foo"), Some((INDEX_USER, &b"foo"[..])));
        assert_eq!(
            split_name(b"system.posix_acl_default"),
            Some((INDEX_POSIX_ACL_DEFAULT, &b""[..]))
        );
        assert_eq!(
            split_name(b"system.posix_acl_defaultX"),
            Some((INDEX_SYSTEM, &b"posix_acl_defaultX"[..]))
        );
        assert_eq!(split_name(b"system.data"), Some((INDEX_SYSTEM, &b"data"[..])));
        assert_eq!(split_name(b"security.selinux"), Some((INDEX_SECURITY, &b"selinux"[..])));
        assert_eq!(split_name(b"user."), None);
        assert_eq!(split_name(b"os2.foo"), None);
        for full in [
            &b"trusted.a"[..],
            b"gnu.translator",
            b"system.richacl",
            b"system.posix_acl_access",
        ] {
            let (i, n) = split_name(full).unwrap();
            assert_eq!(XattrEntry::new(i, n, b"").full_name(), full);
        }
        assert!(XattrEntry::new(INDEX_ENCRYPTION, b"c", b"").full_name().is_empty());
    }

    #[test]
    fn ibody_edge_cases() {
        assert_eq!(parse_ibody(&[]).unwrap(), vec![]);
        assert_eq!(parse_ibody(&[0u8; 96]).unwrap(), vec![]);
        assert!(parse_ibody(&XATTR_MAGIC.to_le_bytes()).is_err()); // no room for a terminator
        let mut a = [0u8; 8];
        a[..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
        assert_eq!(parse_ibody(&a).unwrap(), vec![]);
        assert_eq!(serialize_ibody(&[], 96).unwrap(), vec![0u8; 96]);
        assert!(serialize_ibody(&[XattrEntry::new(INDEX_USER, b"a", &[1; 80])], 96).is_err());
        assert!(serialize_ibody(&[XattrEntry::new(INDEX_USER, b"", b"x")], 96).is_err());
        // A value pointing into the entry table.
        let mut b = MKE2FS_IBODY;
        b[6] = 0x10;
        assert!(parse_ibody(&b).is_err());
        // A value running past the end.
        let mut b = MKE2FS_IBODY;
        b[12] = 9;
        assert!(parse_ibody(&b).is_err());
        // A NUL in a name.
        let mut b = MKE2FS_IBODY;
        b[20] = 0;
        assert!(parse_ibody(&b).is_err());
    }

    #[test]
    fn ea_inode_entries_keep_their_reference() {
        let e = XattrEntry {
            name_index: INDEX_USER,
            name: b"huge".to_vec(),
            value: vec![],
            value_inum: 99,
            value_size: 1 << 20,
            hash: 0x1234,
        };
        let b = serialize_block(std::slice::from_ref(&e), 4096, 1, 7, None).unwrap();
        let (_, es) = parse_block(&b, 7, None).unwrap();
        assert_eq!(es, vec![e.clone()]);
        assert_eq!(
            parse_ibody(&serialize_ibody(std::slice::from_ref(&e), 100).unwrap()).unwrap(),
            vec![e]
        );
    }

    #[test]
    fn acl_rejects() {
        assert!(acl_disk_to_xattr(&[]).is_err());
        assert!(acl_disk_to_xattr(&2u32.to_le_bytes()).is_err());
        // Five short entries: ext4_acl_count refuses the size.
        let mut five = 1u32.to_le_bytes().to_vec();
        for t in [1u16, 4, 0x10, 0x20, 0x20] {
            five.extend_from_slice(&t.to_le_bytes());
            five.extend_from_slice(&4u16.to_le_bytes());
        }
        assert!(acl_disk_to_xattr(&five).is_err());
        let x = unhex(KERNEL_ACL_XATTR);
        assert!(acl_xattr_to_disk(&x[..x.len() - 1]).is_err());
        // Swap u:1000 and g::r entries: out of order.
        let mut bad = x.clone();
        let (a, b) = (4 + 8, 4 + 8 * 3);
        let tmp: Vec<u8> = bad[a..a + 8].to_vec();
        bad.copy_within(b..b + 8, a);
        bad[b..b + 8].copy_from_slice(&tmp);
        assert!(acl_xattr_to_disk(&bad).is_err());
        // Missing mask with named entries.
        let no_mask: Vec<u8> = [&x[..4 + 8 * 5], &x[4 + 8 * 6..]].concat();
        assert!(acl_xattr_to_disk(&no_mask).is_err());
        // Minimal ACL without mask is fine.
        let min = unhex("0200000001000600ffffffff04000400ffffffff20000400ffffffff");
        assert_eq!(acl_disk_to_xattr(&acl_xattr_to_disk(&min).unwrap()).unwrap(), min);
        assert_eq!(acl_xattr_to_disk(&2u32.to_le_bytes()).unwrap(), 1u32.to_le_bytes());
    }

    fn arb_entry() -> impl Strategy<Value = XattrEntry> {
        let idx = prop_oneof![Just(1u8), Just(2), Just(3), Just(4), Just(6), Just(7)];
        (
            idx,
            proptest::collection::vec(1u8..=255, 1..20),
            proptest::collection::vec(any::<u8>(), 0..60),
            prop::bool::weighted(0.1),
            any::<u32>(),
        )
            .prop_map(|(i, name, value, ea, h)| {
                let name = if empty_name_index(i) { vec![] } else { name };
                if ea {
                    XattrEntry {
                        name_index: i,
                        name,
                        value: vec![],
                        value_inum: 12 + h % 1000,
                        value_size: h % VALUE_SIZE_MAX,
                        hash: h,
                    }
                } else {
                    XattrEntry::new(i, &name, &value)
                }
            })
    }

    /// Remove entries with the same (index, name), keeping the first.
    fn dedup(v: Vec<XattrEntry>) -> Vec<XattrEntry> {
        let mut out: Vec<XattrEntry> = Vec::new();
        for e in v {
            if !out.iter().any(|o| o.name_index == e.name_index && o.name == e.name) {
                out.push(e);
            }
        }
        out
    }

    proptest! {
        #[test]
        fn block_roundtrip(es in proptest::collection::vec(arb_entry(), 0..12), seed in proptest::option::of(any::<u32>()), nr in any::<u64>()) {
            let es = dedup(es);
            match serialize_block(&es, 1024, 3, nr, seed) {
                Ok(b) => {
                    let (h, got) = parse_block(&b, nr, seed).unwrap();
                    let mut want: Vec<XattrEntry> = es.iter().cloned().map(|mut e| {
                        if e.value_inum == 0 { e.hash = entry_hash(&e.name, &e.value); }
                        e
                    }).collect();
                    want.sort_by(block_order);
                    prop_assert_eq!(&got, &want);
                    prop_assert_eq!(h.hash, block_hash(&got));
                    prop_assert_eq!(h.refcount, 3);
                    prop_assert_eq!(serialize_block(&got, 1024, 3, nr, seed).unwrap(), b);
                }
                Err(_) => {
                    let need: usize = 36 + es.iter().map(|e| entry_len(e.name.len()) + if e.value_inum == 0 { (e.value.len() + 3) & !3 } else { 0 }).sum::<usize>();
                    prop_assert!(need > 1024);
                }
            }
        }

        #[test]
        fn ibody_roundtrip(es in proptest::collection::vec(arb_entry(), 0..6), len in 8usize..400) {
            if let Ok(a) = serialize_ibody(&es, len) {
                prop_assert_eq!(a.len(), len);
                let want: Vec<XattrEntry> = es.iter().cloned().map(|mut e| {
                    if e.value_inum == 0 { e.hash = 0; }
                    e
                }).collect();
                prop_assert_eq!(parse_ibody(&a).unwrap(), want);
            }
        }

        #[test]
        fn block_checksum_catches_any_flip(es in proptest::collection::vec(arb_entry(), 1..5), seed in any::<u32>(), bit in 0usize..(1024 * 8)) {
            let es = dedup(es);
            if let Ok(mut b) = serialize_block(&es, 1024, 1, 5, Some(seed)) {
                prop_assert!(parse_block(&b, 5, Some(seed)).is_ok());
                b[bit / 8] ^= 1 << (bit % 8);
                prop_assert!(parse_block(&b, 5, Some(seed)).is_err());
            }
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300), nr in any::<u64>(), flips in proptest::collection::vec((0usize..1024, any::<u8>()), 0..8)) {
            let _ = parse_ibody(&bytes);
            let _ = parse_block(&bytes, nr, None);
            let _ = parse_block(&bytes, nr, Some(1));
            let mut m = bytes.clone();
            if m.len() >= 4 { m[..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes()); }
            let _ = parse_ibody(&m);
            // Mutations of real structures reach deeper.
            let mut b = kernel_block();
            let mut a = KERNEL_IBODY;
            for &(at, v) in &flips {
                b[at] = v;
                a[at % 96] = v;
            }
            b[8] = 1;
            let _ = parse_block(&b, KERNEL_BLOCK_NR, None);
            let _ = parse_ibody(&a);
            let _ = acl_disk_to_xattr(&bytes);
            let _ = acl_xattr_to_disk(&bytes);
        }

        #[test]
        fn acl_roundtrip(users in proptest::collection::btree_map(0u32..u32::MAX, 0u16..8, 0..5), groups in proptest::collection::btree_map(0u32..u32::MAX, 0u16..8, 0..5), perms in any::<[u8; 4]>()) {
            let p = |i: usize| (perms[i] & 7) as u16;
            let mut x = ACL_XATTR_VERSION.to_le_bytes().to_vec();
            let mut push = |tag: u16, perm: u16, id: u32| {
                x.extend_from_slice(&tag.to_le_bytes());
                x.extend_from_slice(&perm.to_le_bytes());
                x.extend_from_slice(&id.to_le_bytes());
            };
            push(acl_tag::USER_OBJ, p(0), ACL_UNDEFINED_ID);
            for (&id, &perm) in &users { push(acl_tag::USER, perm, id); }
            push(acl_tag::GROUP_OBJ, p(1), ACL_UNDEFINED_ID);
            for (&id, &perm) in &groups { push(acl_tag::GROUP, perm, id); }
            if !users.is_empty() || !groups.is_empty() { push(acl_tag::MASK, p(2), ACL_UNDEFINED_ID); }
            push(acl_tag::OTHER, p(3), ACL_UNDEFINED_ID);
            let disk = acl_xattr_to_disk(&x).unwrap();
            prop_assert_eq!(disk.len(), 4 + 4 * 3 + 8 * (users.len() + groups.len()) + if users.is_empty() && groups.is_empty() { 0 } else { 4 });
            prop_assert_eq!(acl_disk_to_xattr(&disk).unwrap(), x);
        }
    }
}
