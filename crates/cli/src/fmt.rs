//! Text formatting shared by the commands: modes as `ls` prints them and
//! timestamps in UTC.

use ext4kit::{FileType, Timestamp};

/// `drwxr-xr-x`-style mode string.
pub fn mode_string(ft: FileType, mode: u16) -> String {
    let t = match ft {
        FileType::Regular => '-',
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        FileType::CharDevice => 'c',
        FileType::BlockDevice => 'b',
        FileType::Fifo => 'p',
        FileType::Socket => 's',
    };
    let mut s = String::with_capacity(10);
    s.push(t);
    let bit = |m: u16, c: char| if mode & m != 0 { c } else { '-' };
    let special = |x: bool, exec: bool, on: char| match (x, exec) {
        (true, true) => on,
        (true, false) => on.to_ascii_uppercase(),
        (false, true) => 'x',
        (false, false) => '-',
    };
    s.push(bit(0o400, 'r'));
    s.push(bit(0o200, 'w'));
    s.push(special(mode & 0o4000 != 0, mode & 0o100 != 0, 's'));
    s.push(bit(0o040, 'r'));
    s.push(bit(0o020, 'w'));
    s.push(special(mode & 0o2000 != 0, mode & 0o010 != 0, 's'));
    s.push(bit(0o004, 'r'));
    s.push(bit(0o002, 'w'));
    s.push(special(mode & 0o1000 != 0, mode & 0o001 != 0, 't'));
    s
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's civil_from_days).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `2024-05-01 12:00:00` (UTC).
pub fn time_short(t: Timestamp) -> String {
    let (y, mo, d) = civil(t.sec.div_euclid(86_400));
    let s = t.sec.rem_euclid(86_400);
    format!("{y:04}-{mo:02}-{d:02} {:02}:{:02}", s / 3600, s / 60 % 60)
}

/// `2024-05-01 12:00:00.123456789 +0000`.
pub fn time_full(t: Timestamp) -> String {
    let (y, mo, d) = civil(t.sec.div_euclid(86_400));
    let s = t.sec.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}.{:09} +0000",
        s / 3600,
        s / 60 % 60,
        s % 60,
        t.nsec
    )
}

/// Bytes in human units (KiB, MiB, ...).
pub fn human(bytes: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(mode_string(FileType::Directory, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(FileType::Regular, 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_string(FileType::Regular, 0o2644), "-rw-r-Sr--");
        assert_eq!(mode_string(FileType::Directory, 0o1777), "drwxrwxrwt");
    }

    #[test]
    fn times() {
        assert_eq!(
            time_full(Timestamp { sec: 0, nsec: 5 }),
            "1970-01-01 00:00:00.000000005 +0000"
        );
        assert_eq!(time_short(Timestamp { sec: -1, nsec: 0 }), "1969-12-31 23:59");
        assert_eq!(
            time_short(Timestamp {
                sec: 3_000_000_000,
                nsec: 0
            }),
            "2065-01-24 05:20"
        );
        assert_eq!(human(1536), "1.5 KiB");
    }
}
