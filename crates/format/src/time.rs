//! The one clock every part of the engine reads the current time from.
//!
//! Everything that stamps a time — inode times, the superblock's mount,
//! write and error times, a deleted inode's `i_dtime`, the journal's
//! commit blocks, mkfs's creation time — asks a [`Clock`] handed to it
//! with its options, never the system directly. A [`Clock::Fixed`] clock
//! makes a reproducible build: two runs over the same input write the same
//! bytes. `SOURCE_DATE_EPOCH` (the reproducible-builds convention) is read
//! in one place, [`Clock::from_source_date_epoch`]; the frontends and the
//! open options' defaults call it.
//!
//! It lives here, beside [`Timestamp`], because every crate that stamps a
//! time (mkfs, jbd2, ext4, the vfs) builds on this one; reading the system
//! clock is its only side effect.

use crate::inode::Timestamp;

/// The environment variable of the reproducible-builds convention: seconds
/// since the epoch that every timestamp of a build should carry.
pub const SOURCE_DATE_EPOCH: &str = "SOURCE_DATE_EPOCH";

/// Where the current time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Clock {
    /// The system's real-time clock.
    #[default]
    System,
    /// Every reading is this time (a reproducible build): nothing a run
    /// writes depends on when it ran.
    Fixed(Timestamp),
}

impl Clock {
    /// A clock that always reads `sec` seconds since the epoch.
    pub fn fixed(sec: i64) -> Clock {
        Clock::Fixed(Timestamp { sec, nsec: 0 })
    }

    /// The clock the environment asks for: fixed at `SOURCE_DATE_EPOCH`
    /// when it is set, else the system clock. A value that is not a whole
    /// number of seconds is an error naming it (a build that asked to be
    /// reproducible must not silently become one that is not). This is the
    /// only place the variable is read.
    pub fn from_source_date_epoch() -> Result<Clock, String> {
        match std::env::var(SOURCE_DATE_EPOCH) {
            Ok(v) => v
                .trim()
                .parse::<i64>()
                .map(Clock::fixed)
                .map_err(|_| format!("{SOURCE_DATE_EPOCH}=\"{v}\" is not a number of seconds")),
            Err(_) => Ok(Clock::System),
        }
    }

    /// The current time (nanosecond precision from the system clock; a
    /// time before the epoch reads as the epoch).
    pub fn now(&self) -> Timestamp {
        match self {
            Clock::Fixed(t) => *t,
            Clock::System => {
                let d = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                Timestamp {
                    sec: d.as_secs() as i64,
                    nsec: d.subsec_nanos(),
                }
            }
        }
    }

    /// Whether every reading is the same time (a reproducible build: the
    /// journal then commits on explicit requests only, never because the
    /// clock says a transaction is old).
    pub fn is_fixed(&self) -> bool {
        matches!(self, Clock::Fixed(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_clock_never_moves_and_the_system_one_does_not_go_back() {
        let c = Clock::fixed(1_700_000_000);
        assert_eq!(
            c.now(),
            Timestamp {
                sec: 1_700_000_000,
                nsec: 0
            }
        );
        assert!(c.is_fixed());
        let s = Clock::System;
        let (a, b) = (s.now(), s.now());
        assert!(b >= a && a.sec > 1_600_000_000);
        assert!(!s.is_fixed());
    }
}
