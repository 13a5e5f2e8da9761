//! Little-endian field access and the `layout!` macro that turns an offset
//! table (as printed in the ext4 disk-layout documentation) into a struct with
//! bit-exact `parse`/`serialize`.
//!
//! Every byte of a fixed-size structure is covered by a field (reserved areas
//! included), so `serialize(parse(b)) == b` holds for any input: this is what
//! lets us rewrite a superblock or inode without disturbing fields we do not
//! interpret.

macro_rules! codec {
    ($(#[$doc:meta])* $trait:ident, $from:ident, $to:ident) => {
        $(#[$doc])*
        pub trait $trait: Sized + Copy {
            /// Width in bytes.
            const SIZE: usize;
            /// Read at `off`; the caller guarantees `off + SIZE <= buf.len()`.
            fn get(buf: &[u8], off: usize) -> Self;
            /// Write at `off`; the caller guarantees `off + SIZE <= buf.len()`.
            fn put(self, buf: &mut [u8], off: usize);
        }

        codec!(@int $trait, $from, $to, u8, u16, u32, u64);

        impl<const N: usize> $trait for [u8; N] {
            const SIZE: usize = N;
            fn get(buf: &[u8], off: usize) -> Self {
                let mut a = [0u8; N];
                a.copy_from_slice(&buf[off..off + N]);
                a
            }
            fn put(self, buf: &mut [u8], off: usize) {
                buf[off..off + N].copy_from_slice(&self);
            }
        }

        impl<const N: usize> $trait for [u32; N] {
            const SIZE: usize = 4 * N;
            fn get(buf: &[u8], off: usize) -> Self {
                let mut a = [0u32; N];
                for (i, v) in a.iter_mut().enumerate() {
                    *v = <u32 as $trait>::get(buf, off + 4 * i);
                }
                a
            }
            fn put(self, buf: &mut [u8], off: usize) {
                for (i, v) in self.iter().enumerate() {
                    <u32 as $trait>::put(*v, buf, off + 4 * i);
                }
            }
        }
    };
    (@int $trait:ident, $from:ident, $to:ident, $($t:ty),*) => {$(
        impl $trait for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline]
            fn get(buf: &[u8], off: usize) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&buf[off..off + <Self as $trait>::SIZE]);
                <$t>::$from(a)
            }
            #[inline]
            fn put(self, buf: &mut [u8], off: usize) {
                buf[off..off + <Self as $trait>::SIZE].copy_from_slice(&self.$to());
            }
        }
    )*};
}

codec!(
    /// A value read from and written to a little-endian byte slice (every
    /// ext2/3/4 structure).
    Le, from_le_bytes, to_le_bytes
);
codec!(
    /// A value read from and written to a big-endian byte slice (the jbd2
    /// journal, which inherited ext3's big-endian on-disk format).
    Be, from_be_bytes, to_be_bytes
);

/// Read a little-endian u16 (bounds are the caller's responsibility).
#[inline]
pub fn le16(buf: &[u8], off: usize) -> u16 {
    <u16 as Le>::get(buf, off)
}

/// Read a little-endian u32 (bounds are the caller's responsibility).
#[inline]
pub fn le32(buf: &[u8], off: usize) -> u32 {
    <u32 as Le>::get(buf, off)
}

/// Write a little-endian u16.
#[inline]
pub fn put16(buf: &mut [u8], off: usize, v: u16) {
    Le::put(v, buf, off)
}

/// Write a little-endian u32.
#[inline]
pub fn put32(buf: &mut [u8], off: usize, v: u32) {
    Le::put(v, buf, off)
}

/// One half of a split field (`_lo`/`_hi`): an unsigned integer of
/// `BITS` bits.
pub trait Half: Copy {
    /// Width in bits.
    const BITS: u32;
    /// The value, zero-extended.
    fn widen(self) -> u64;
    /// The low `BITS` bits of `v`.
    fn truncate(v: u64) -> Self;
}

macro_rules! half {
    ($($t:ty),*) => {$(
        impl Half for $t {
            const BITS: u32 = <$t>::BITS;
            #[inline]
            fn widen(self) -> u64 {
                u64::from(self)
            }
            #[inline]
            fn truncate(v: u64) -> Self {
                v as $t
            }
        }
    )*};
}
half!(u8, u16, u32);

/// The value type of a split field, as the bits its halves hold.
pub trait Whole: Copy {
    /// The value's bits (two's complement for signed times).
    fn to_bits(self) -> u64;
    /// The value of `bits`.
    fn from_bits(bits: u64) -> Self;
}

impl Whole for u32 {
    #[inline]
    fn to_bits(self) -> u64 {
        u64::from(self)
    }
    #[inline]
    fn from_bits(bits: u64) -> Self {
        bits as u32
    }
}

impl Whole for u64 {
    #[inline]
    fn to_bits(self) -> u64 {
        self
    }
    #[inline]
    fn from_bits(bits: u64) -> Self {
        bits
    }
}

impl Whole for i64 {
    #[inline]
    fn to_bits(self) -> u64 {
        self as u64
    }
    #[inline]
    fn from_bits(bits: u64) -> Self {
        bits as i64
    }
}

/// A split field's value from its halves: `hi` above the bits of `lo`.
#[inline]
pub fn join<L: Half, H: Half>(lo: L, hi: H) -> u64 {
    hi.widen() << L::BITS | lo.widen()
}

/// A split field's halves for `v`: its low bits in `lo`, the next in `hi`
/// (bits above both are dropped, as the disk has no room for them).
#[inline]
pub fn split<L: Half, H: Half>(v: u64) -> (L, H) {
    (L::truncate(v), H::truncate(v >> L::BITS))
}

/// Declare an on-disk structure as a list of `name: type = offset` fields
/// (little-endian; prefix the struct with `big_endian` for jbd2's layouts).
///
/// Generates the struct, `SIZE`, `parse(&[u8])` (which requires `SIZE` bytes)
/// and `serialize_into(&mut [u8])`. Offsets are checked against `SIZE` at
/// compile time through the test the macro also emits.
///
/// An optional `split { … }` block after the struct states the fields
/// stored as a low and a high half (`s_blocks_count_lo`/`_hi`,
/// `i_size_lo`/`i_size_high` …), once, with the accessors it generates:
///
/// - `getter / setter: T = lo + hi` — `getter(&self) -> T` joins the
///   halves (`hi` above the bits of `lo`), `setter(&mut self, v: T)`
///   writes both;
/// - `setter: T = lo + hi` — the setter only (the getter is written by
///   hand because it applies a rule of its own);
/// - a trailing `if flag` — the high half exists only under a rule
///   outside the record (the descriptor size, a feature): the accessors
///   take `flag: bool`; without it the getter reads `lo` alone and the
///   setter leaves `hi` untouched.
#[macro_export]
macro_rules! layout {
    (
        $(#[$meta:meta])*
        pub struct $name:ident ($size:expr) {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $off:expr ),* $(,)?
        }
        $( split { $($split:tt)* } )?
    ) => {
        $crate::layout!(@impl Le; $(#[$meta])* pub struct $name ($size) { $( $(#[$fmeta])* $field : $ty = $off ),* });
        $( $crate::layout!(@split $name { $($split)* }); )?
    };
    (
        big_endian
        $(#[$meta:meta])*
        pub struct $name:ident ($size:expr) {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $off:expr ),* $(,)?
        }
        $( split { $($split:tt)* } )?
    ) => {
        $crate::layout!(@impl Be; $(#[$meta])* pub struct $name ($size) { $( $(#[$fmeta])* $field : $ty = $off ),* });
        $( $crate::layout!(@split $name { $($split)* }); )?
    };
    (
        @split $name:ident {
            $( $(#[$m:meta])* $first:ident $(/ $set:ident)? : $ty:ty = $lo:ident + $hi:ident $(if $flag:ident)? ),* $(,)?
        }
    ) => {
        impl $name {
            $( $crate::layout!(@accessors [$(#[$m])*] $first [$($set)?] ($ty) $lo $hi [$($flag)?]); )*
        }
    };
    (@accessors [$(#[$m:meta])*] $get:ident [$set:ident] ($ty:ty) $lo:ident $hi:ident []) => {
        $(#[$m])*
        pub fn $get(&self) -> $ty {
            <$ty as $crate::bytes::Whole>::from_bits($crate::bytes::join(self.$lo, self.$hi))
        }
        $crate::layout!(@accessors [$(#[$m])*] $set [] ($ty) $lo $hi []);
    };
    (@accessors [$(#[$m:meta])*] $set:ident [] ($ty:ty) $lo:ident $hi:ident []) => {
        $(#[$m])*
        #[doc = ""]
        #[doc = concat!("Setter: writes `", stringify!($lo), "` and `", stringify!($hi), "`.")]
        pub fn $set(&mut self, v: $ty) {
            (self.$lo, self.$hi) = $crate::bytes::split(<$ty as $crate::bytes::Whole>::to_bits(v));
        }
    };
    (@accessors [$(#[$m:meta])*] $get:ident [$set:ident] ($ty:ty) $lo:ident $hi:ident [$flag:ident]) => {
        $(#[$m])*
        #[doc = ""]
        #[doc = concat!("`", stringify!($hi), "` counts only when `", stringify!($flag), "`.")]
        pub fn $get(&self, $flag: bool) -> $ty {
            let hi = if $flag { self.$hi } else { 0 };
            <$ty as $crate::bytes::Whole>::from_bits($crate::bytes::join(self.$lo, hi))
        }
        $crate::layout!(@accessors [$(#[$m])*] $set [] ($ty) $lo $hi [$flag]);
    };
    (@accessors [$(#[$m:meta])*] $set:ident [] ($ty:ty) $lo:ident $hi:ident [$flag:ident]) => {
        $(#[$m])*
        #[doc = ""]
        #[doc = concat!("Setter: writes `", stringify!($lo), "`, and `", stringify!($hi), "` only when `", stringify!($flag), "`.")]
        pub fn $set(&mut self, v: $ty, $flag: bool) {
            let (lo, hi) = $crate::bytes::split(<$ty as $crate::bytes::Whole>::to_bits(v));
            self.$lo = lo;
            if $flag {
                self.$hi = hi;
            }
        }
    };
    (
        @impl $codec:ident;
        $(#[$meta:meta])*
        pub struct $name:ident ($size:expr) {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $off:expr ),*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fmeta])* #[doc = concat!("On-disk field `", stringify!($field), "` at byte ", stringify!($off), ".")] pub $field: $ty, )*
        }

        impl $name {
            /// Size of the structure on disk, in bytes.
            pub const SIZE: usize = $size;

            /// Decode from the first `SIZE` bytes of `buf` (no validation).
            pub fn parse_raw(buf: &[u8]) -> Self {
                assert!(buf.len() >= Self::SIZE);
                Self { $( $field: <$ty as $crate::bytes::$codec>::get(buf, $off), )* }
            }

            /// Encode into the first `SIZE` bytes of `buf`.
            pub fn serialize_into(&self, buf: &mut [u8]) {
                assert!(buf.len() >= Self::SIZE);
                $( <$ty as $crate::bytes::$codec>::put(self.$field, buf, $off); )*
            }

            /// Encode into a fresh buffer.
            pub fn to_bytes(&self) -> Vec<u8> {
                let mut v = vec![0u8; Self::SIZE];
                self.serialize_into(&mut v);
                v
            }

            #[cfg(test)]
            #[allow(dead_code)]
            fn layout_covers_every_byte() {
                let mut cover = vec![0u8; Self::SIZE];
                $(
                    for b in &mut cover[$off..$off + <$ty as $crate::bytes::$codec>::SIZE] {
                        assert_eq!(*b, 0, concat!("field ", stringify!($field), " overlaps"));
                        *b = 1;
                    }
                )*
                assert!(cover.iter().all(|&b| b == 1), concat!(stringify!($name), " has uncovered bytes"));
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    $( .field(stringify!($field), &self.$field) )*
                    .finish()
            }
        }
    };
}

#[cfg(test)]
// Every layout's `to_bytes(&self)`: clippy spares it on exported structs
// only, and this one is private to the tests.
#[allow(clippy::wrong_self_convention)]
mod tests {
    crate::layout! {
        /// Every kind of split field.
        pub struct Split (16) {
            count_lo: u16 = 0x0,
            block_lo: u32 = 0x2,
            block_hi: u16 = 0x6,
            count_hi: u16 = 0x8,
            time: u32 = 0xA,
            time_hi: u8 = 0xE,
            pad: u8 = 0xF,
        }
        split {
            /// A 48-bit block number.
            block / set_block: u64 = block_lo + block_hi,
            /// A count whose high half exists only when `wide`.
            count / set_count: u32 = count_lo + count_hi if wide,
            /// A signed 40-bit time.
            time_secs / set_time_secs: i64 = time + time_hi,
        }
    }

    #[test]
    fn layout_is_complete() {
        Split::layout_covers_every_byte();
    }

    #[test]
    fn setters_write_both_halves_and_getters_join_them() {
        let mut s = Split::parse_raw(&[0; 16]);
        s.set_block(0x1234_5678_9abc);
        assert_eq!((s.block_lo, s.block_hi), (0x5678_9abc, 0x1234));
        assert_eq!(s.block(), 0x1234_5678_9abc);
        // Bits above the two halves have no room on disk.
        s.set_block(0xffff_0000_0000_0001);
        assert_eq!(s.block(), 1);
        // A time's high byte holds bits 32..39, as `(t >> 32) as u8` does.
        let t = (3i64 << 32) + 7;
        s.set_time_secs(t);
        assert_eq!((s.time, s.time_hi), (7, 3));
        assert_eq!(s.time_secs(), t);
        s.set_time_secs(-1);
        assert_eq!((s.time, s.time_hi), (u32::MAX, u8::MAX));
        // The accessors change the fields the layout serialises, nothing else.
        assert_eq!(Split::parse_raw(&s.to_bytes()), s);
    }

    #[test]
    fn a_conditional_high_half_is_written_and_read_only_under_its_rule() {
        let mut s = Split::parse_raw(&[0; 16]);
        s.set_count(0x0002_0001, true);
        assert_eq!((s.count_lo, s.count_hi), (1, 2));
        assert_eq!(s.count(true), 0x0002_0001);
        assert_eq!(s.count(false), 1);
        // Without the rule the high half is left as it was.
        s.set_count(0x0009_0005, false);
        assert_eq!((s.count_lo, s.count_hi), (5, 2));
    }
}
