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

/// Declare an on-disk structure as a list of `name: type = offset` fields
/// (little-endian; prefix the struct with `big_endian` for jbd2's layouts).
///
/// Generates the struct, `SIZE`, `parse(&[u8])` (which requires `SIZE` bytes)
/// and `serialize_into(&mut [u8])`. Offsets are checked against `SIZE` at
/// compile time through the test the macro also emits.
#[macro_export]
macro_rules! layout {
    (
        $(#[$meta:meta])*
        pub struct $name:ident ($size:expr) {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $off:expr ),* $(,)?
        }
    ) => {
        $crate::layout!(@impl Le; $(#[$meta])* pub struct $name ($size) { $( $(#[$fmeta])* $field : $ty = $off ),* });
    };
    (
        big_endian
        $(#[$meta:meta])*
        pub struct $name:ident ($size:expr) {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $off:expr ),* $(,)?
        }
    ) => {
        $crate::layout!(@impl Be; $(#[$meta])* pub struct $name ($size) { $( $(#[$fmeta])* $field : $ty = $off ),* });
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
