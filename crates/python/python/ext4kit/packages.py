"""The packages installed in an image, read from its package databases.

Two databases are read, straight from the image (nothing is run):

- dpkg's status file, ``/var/lib/dpkg/status`` (Debian, Ubuntu): stanzas
  of ``Field: value`` lines separated by blank lines, as deb-control(5)
  describes; a package is installed when the last word of its
  ``Status:`` is ``installed``.
- rpm's SQLite database, ``rpmdb.sqlite`` in ``/usr/lib/sysimage/rpm``
  (rpm 4.17+ with the newer layout: Fedora 36+, openSUSE) or
  ``/var/lib/rpm`` (rpm 4.16+): its ``Packages`` table holds one row per
  package whose ``blob`` is the package's header as rpm stores it (no
  magic; see :func:`rpm_header`).

Older rpm databases (Berkeley DB ``Packages``, SUSE's ``Packages.db``)
are reported as not read rather than skipped silently.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import struct
import tempfile
from dataclasses import dataclass

__all__ = [
    "Package",
    "PackageDbError",
    "installed",
    "dpkg_status",
    "rpm_header",
    "rpm_sqlite",
    "DPKG_STATUS",
    "RPMDB_DIRS",
]

DPKG_STATUS = "/var/lib/dpkg/status"
#: Where rpm keeps its database, newest layout first (/var/lib/rpm is a
#: symlink to the newer directory on systems that moved it).
RPMDB_DIRS = ("/usr/lib/sysimage/rpm", "/var/lib/rpm")
#: Berkeley DB (rpm up to 4.15) and NDB (SUSE) databases: not read.
_RPMDB_OTHER = ("Packages", "Packages.db")


@dataclass(frozen=True, order=True)
class Package:
    """One installed package. ``version`` is as its manager prints it:
    dpkg's ``Version`` field, rpm's ``[epoch:]version-release``.
    ``source`` is the database it was read from (a path in the image)."""

    manager: str
    name: str
    version: str
    arch: str
    source: str


class PackageDbError(ValueError):
    """A package database that cannot be read; the message says which
    and where."""


def installed(fs) -> tuple[list[Package], list[tuple[str, str]]]:
    """The packages installed in the open filesystem ``fs``, and the
    problems met: (path, message) for each database that could not be
    read. A damaged database is reported, never fatal, so the rest of an
    image's inventory survives it. An image with neither database has
    no packages."""
    packages: list[Package] = []
    problems: list[tuple[str, str]] = []
    try:
        if _is_file(fs, DPKG_STATUS):
            packages += dpkg_status(fs.read(DPKG_STATUS), DPKG_STATUS)
    except (OSError, PackageDbError) as e:
        problems.append((DPKG_STATUS, str(e)))
    seen: set[int] = set()
    for d in RPMDB_DIRS:
        db = d + "/rpmdb.sqlite"
        try:
            if not _is_file(fs, db):
                continue
            # /var/lib/rpm -> ../../usr/lib/sysimage/rpm: the same
            # database under two names; the first found is the one read.
            ino = fs.stat(db).st_ino
            if ino in seen:
                continue
            seen.add(ino)
            packages += rpm_sqlite(fs, db)
        except (OSError, PackageDbError, sqlite3.DatabaseError) as e:
            problems.append((db, str(e)))
    if not seen:
        for p in (f"{d}/{n}" for d in RPMDB_DIRS for n in _RPMDB_OTHER):
            try:
                if _is_file(fs, p):
                    problems.append(
                        (
                            p,
                            "an rpm database in a format not read (Berkeley DB or NDB; "
                            "`rpmdb --rebuilddb` of rpm 4.16+ converts it to rpmdb.sqlite)",
                        )
                    )
                    break
            except OSError as e:
                problems.append((p, str(e)))
    packages.sort()
    return packages, problems


def _is_file(fs, path: str) -> bool:
    """Whether ``path`` is a regular file (symlinks followed); absent is
    False, any other failure raises."""
    try:
        return stat.S_ISREG(fs.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def dpkg_status(data: bytes, source: str = DPKG_STATUS) -> list[Package]:
    """The installed packages of a dpkg status file's contents.

    Stanzas are separated by blank lines; a line starting with a space or
    tab continues the field before it (deb-control(5)). A stanza counts
    when its ``Status`` (``want flag state``) ends in ``installed``;
    one without ``Package`` is an error naming its line."""
    text = data.decode("utf-8", errors="replace")
    out: list[Package] = []
    fields: dict[str, str] = {}
    start = 1
    last = None

    def flush() -> None:
        if not fields:
            return
        if "Package" not in fields:
            raise PackageDbError(f"the stanza at line {start} has no Package field")
        if fields.get("Status", "").split()[-1:] == ["installed"]:
            out.append(
                Package("dpkg", fields["Package"], fields.get("Version", ""), fields.get("Architecture", ""), source)
            )

    for no, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            flush()
            fields, last, start = {}, None, no + 1
            continue
        if line[0] in " \t":
            if last is None:
                raise PackageDbError(f"line {no}: a continuation line with no field before it")
            continue  # a multi-line value (Description, Conffiles): not used
        name, sep, value = line.partition(":")
        if not sep:
            raise PackageDbError(f"line {no}: {line[:60]!r} is neither 'Field: value' nor a continuation")
        last = name.strip()
        fields[last] = value.strip()
    flush()
    return out


# rpm header tags and types (rpm's rpmtag.h): the package's name,
# version, release, epoch and architecture.
RPMTAG_NAME, RPMTAG_VERSION, RPMTAG_RELEASE, RPMTAG_EPOCH, RPMTAG_ARCH = 1000, 1001, 1002, 1003, 1022
_RPM_INT32, _RPM_STRING = 4, 6
#: rpm refuses headers with more index entries or data than these
#: (header_internal.h: HEADER_TAGS_MAX 0xffff, HEADER_DATA_MAX 256 MiB).
_RPM_INDEX_MAX, _RPM_DATA_MAX = 0xFFFF, 256 << 20


def rpm_header(blob: bytes) -> dict[int, str | int]:
    """The name, version, release, epoch and arch tags of an rpm header
    blob, as rpm stores it in its database (the header without its 8-byte
    magic): a big-endian count of index entries ``il`` and of data bytes
    ``dl``, then ``il`` entries of (tag, type, offset, count), each four
    big-endian 32-bit integers, then the ``dl`` data bytes the offsets
    point into. A STRING (type 6) is NUL-terminated; an INT32 (type 4) is
    ``count`` big-endian integers. Other tags are skipped. Bad bounds
    raise :class:`PackageDbError` naming the entry."""
    if len(blob) < 8:
        raise PackageDbError(f"an rpm header of {len(blob)} bytes (less than its 8-byte counts)")
    il, dl = struct.unpack_from(">II", blob, 0)
    if il > _RPM_INDEX_MAX or dl > _RPM_DATA_MAX:
        raise PackageDbError(f"an rpm header claiming {il} index entries and {dl} data bytes")
    data_at = 8 + 16 * il
    if data_at + dl > len(blob):
        raise PackageDbError(f"an rpm header of {len(blob)} bytes too short for its {il} entries and {dl} data bytes")
    data = blob[data_at : data_at + dl]
    wanted = {RPMTAG_NAME, RPMTAG_VERSION, RPMTAG_RELEASE, RPMTAG_EPOCH, RPMTAG_ARCH}
    tags: dict[int, str | int] = {}
    for i in range(il):
        tag, typ, off, count = struct.unpack_from(">iIiI", blob, 8 + 16 * i)
        if tag not in wanted:
            continue
        if off < 0 or off >= dl:
            raise PackageDbError(f"rpm header entry {i} (tag {tag}): offset {off} outside the {dl} data bytes")
        if tag == RPMTAG_EPOCH:
            if typ != _RPM_INT32 or count < 1 or off + 4 > dl:
                raise PackageDbError(f"rpm header entry {i}: the epoch is not an INT32 inside the data")
            (tags[tag],) = struct.unpack_from(">I", data, off)
        else:
            if typ != _RPM_STRING:
                raise PackageDbError(f"rpm header entry {i} (tag {tag}): type {typ}, not a STRING (6)")
            end = data.find(b"\0", off)
            if end < 0:
                raise PackageDbError(f"rpm header entry {i} (tag {tag}): the string has no NUL before the data's end")
            tags[tag] = data[off:end].decode("utf-8", errors="replace")
    return tags


def _copy_out(fs, path: str, host: str) -> None:
    with fs.open(path) as src, open(host, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def rpm_sqlite(fs, db: str) -> list[Package]:
    """The packages in the rpm SQLite database ``db`` of the image ``fs``.

    sqlite3 reads files, so the database (and its write-ahead log, which
    rpm's WAL mode may have left beside it, holding committed rows not yet
    copied into the main file) is copied out to a temporary directory
    first."""
    with tempfile.TemporaryDirectory(prefix="ext4kit-rpmdb-") as tmp:
        local = os.path.join(tmp, "rpmdb.sqlite")
        _copy_out(fs, db, local)
        if _is_file(fs, db + "-wal"):
            _copy_out(fs, db + "-wal", local + "-wal")
        con = sqlite3.connect(local)
        try:
            rows = con.execute("SELECT hnum, blob FROM Packages ORDER BY hnum").fetchall()
        finally:
            con.close()
    out = []
    for hnum, blob in rows:
        if not isinstance(blob, bytes):
            raise PackageDbError(f"Packages row {hnum}: the blob is {type(blob).__name__}, not bytes")
        try:
            h = rpm_header(blob)
        except PackageDbError as e:
            raise PackageDbError(f"Packages row {hnum}: {e}") from None
        if RPMTAG_NAME not in h:
            raise PackageDbError(f"Packages row {hnum}: the header has no name tag (1000)")
        evr = f"{h.get(RPMTAG_VERSION, '')}-{h.get(RPMTAG_RELEASE, '')}"
        if RPMTAG_EPOCH in h:
            evr = f"{h[RPMTAG_EPOCH]}:{evr}"
        out.append(Package("rpm", str(h[RPMTAG_NAME]), evr, str(h.get(RPMTAG_ARCH, "")), db))
    return out
