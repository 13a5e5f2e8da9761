//! GUIDs as VHDX stores them: Microsoft's layout, `Data1` (u32), `Data2`
//! and `Data3` (u16) little-endian, then `Data4`'s eight bytes as written
//! (MS-VHDX 2.1 refers to [MS-DTYP] 2.3.4.2 GUID--Packet Representation).

use std::fmt;

use super::bytes::{u16_at, u32_at};

/// A 16-byte GUID in its on-disk byte order.
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub(crate) struct Guid(pub(crate) [u8; 16]);

impl Guid {
    /// The all-zero GUID: "no log" in `LogGuid` (MS-VHDX 2.2.2).
    pub(crate) const ZERO: Guid = Guid([0; 16]);

    /// The GUID spelled `d1-d2-d3-d4` in the spec's text.
    pub(crate) const fn new(d1: u32, d2: u16, d3: u16, d4: [u8; 8]) -> Guid {
        let a = d1.to_le_bytes();
        let b = d2.to_le_bytes();
        let c = d3.to_le_bytes();
        Guid([
            a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d4[0], d4[1], d4[2], d4[3], d4[4], d4[5], d4[6], d4[7],
        ])
    }

    /// The GUID stored at `off` of `b`.
    pub(crate) fn at(b: &[u8], off: usize) -> Guid {
        let mut g = [0u8; 16];
        g.copy_from_slice(&b[off..off + 16]);
        Guid(g)
    }

    /// Whether this is the zero GUID.
    pub(crate) fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// A fresh random (version 4) GUID: the spec asks for a "new, unique"
    /// `FileWriteGuid`/`DataWriteGuid` on the first change of a session.
    pub(crate) fn random() -> Guid {
        let mut g: [u8; 16] = rand::random();
        g[7] = (g[7] & 0x0f) | 0x40; // Data3's high byte: version 4
        g[8] = (g[8] & 0x3f) | 0x80; // Data4[0]: RFC 4122 variant
        Guid(g)
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "{:08X}-{:04X}-{:04X}-{:02X}{:02X}-",
            u32_at(b, 0),
            u16_at(b, 4),
            u16_at(b, 6),
            b[8],
            b[9]
        )?;
        b[10..].iter().try_for_each(|x| write!(f, "{x:02X}"))
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bat_guid_is_laid_out_as_the_spec_spells_it() {
        let g = Guid::new(
            0x2DC2_7766,
            0xF623,
            0x4200,
            [0x9D, 0x64, 0x11, 0x5E, 0x9B, 0xFD, 0x4A, 0x08],
        );
        assert_eq!(&g.0[..4], &[0x66, 0x77, 0xC2, 0x2D]);
        assert_eq!(g.to_string(), "2DC27766-F623-4200-9D64-115E9BFD4A08");
        let r = Guid::random();
        assert!(!r.is_zero() && r != Guid::random());
    }
}
