"""A fleet of images: one inventory of many ext2/3/4 images, scanned in
parallel by a Dask cluster (``pip install 'ext4kit[fleet]'``).

::

    from dask.distributed import Client
    from ext4kit import fleet

    client = Client("tcp://scheduler:8786")          # or LocalCluster(...)
    fleet.scan(["s3://bucket/vm1.qcow2", "/nfs/images/vm2.img"],
               out="inventory.parquet", client=client, hash_pattern="/etc/*")

or from a shell::

    python -m ext4kit.fleet --scheduler tcp://scheduler:8786 \\
        --out inventory.parquet --hash '/etc/*' IMAGE...

Each image is one task: :func:`inventory` runs in a worker, opens the
image by its name (a path or URL: what travels to the worker is the name,
never the image's bytes, so every worker must reach every image — a
shared filesystem or object storage) and sends back its rows as an Arrow
table. The client writes the tables to one Parquet file, in the order the
images were given, so a scan's file is the same whichever cluster ran it
(and the same as a plain loop's: ``client=None``).

The rows (:data:`SCHEMA`), one table for all images:

- ``record="entry"``: one row per inode name of the image, from ``/``
  down (directories in name order): ``path``, ``type`` (``file``,
  ``dir``, ``symlink``, ``chardev``, ``blockdev``, ``fifo``, ``socket``),
  ``size``, ``mode`` (permission bits, with set-id and sticky), ``uid``,
  ``gid``, ``atime_ns``/``mtime_ns``/``ctime_ns``/``birth_ns`` (nanoseconds
  since 1970, as ``os.stat``'s ``st_*_ns``), ``nlink``, ``ino``, the
  ``sha256`` of regular files whose path matches ``hash_pattern``, the
  ``target`` of symlinks; ``error`` when part of it could not be read
  (the rest of the row stands).
- ``record="package"``: one row per installed package
  (:mod:`ext4kit.packages`): ``type`` is the manager (``dpkg``, ``rpm``),
  ``path`` the database, ``package``, ``version``, ``arch``.
- ``record="error"``: what stopped part of an image's inventory — the
  image would not open (``path`` null), a directory could not be listed,
  a package database could not be read — with the message in ``error``.
  An image never stops the scan.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import hashlib
import os
import stat
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(f"ext4kit.fleet needs pyarrow (and dask[distributed] to scan on a cluster): pip install 'ext4kit[fleet]' ({e})") from e

import ext4kit

from . import packages as _packages

__all__ = ["SCHEMA", "Image", "ScanSummary", "inventory", "scan", "main"]

#: The inventory's columns (see the module's text for what each record
#: kind fills in). Times are int64 nanoseconds, lossless from 1677 to
#: 2262; an ext4 time past that (the format reaches 2446) is left null
#: and said in ``error``.
SCHEMA = pa.schema(
    [
        ("image", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("record", pa.string()),
        ("path", pa.string()),
        # The path's bytes when they are not UTF-8 (``path`` then shows
        # them as \\xNN); null otherwise.
        ("path_bytes", pa.binary()),
        ("type", pa.string()),
        ("size", pa.int64()),
        ("mode", pa.int32()),
        ("uid", pa.int64()),
        ("gid", pa.int64()),
        ("nlink", pa.int64()),
        ("ino", pa.int64()),
        ("atime_ns", pa.int64()),
        ("mtime_ns", pa.int64()),
        ("ctime_ns", pa.int64()),
        ("birth_ns", pa.int64()),
        ("sha256", pa.string()),
        ("target", pa.string()),
        ("package", pa.string()),
        ("version", pa.string()),
        ("arch", pa.string()),
        ("error", pa.string()),
    ]
)

_TYPES = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "symlink",
    stat.S_IFCHR: "chardev",
    stat.S_IFBLK: "blockdev",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
}
_INT64 = range(-(1 << 63), 1 << 63)


@dataclass(frozen=True)
class Image:
    """An image of the fleet: its ``source`` (a path or URL that every
    worker can open) and, for a partitioned disk, the filesystem's
    ``partition`` (1-based) or byte ``offset``, as :func:`ext4kit.open`
    takes them. A plain string is ``Image(source)``."""

    source: str
    partition: int | None = None
    offset: int | None = None


@dataclass(frozen=True)
class ScanSummary:
    """What :func:`scan` did: images scanned, rows written, the images
    with at least one ``error`` (an error row or an entry's error) and
    the wall time."""

    images: int
    rows: int
    images_with_errors: int
    seconds: float


def _image(item) -> Image:
    if isinstance(item, Image):
        return item
    return Image(os.fsdecode(item))


class _Rows:
    """Column lists of one image's rows, made into an Arrow table at the
    end (one table per image is what a task sends back)."""

    def __init__(self, image: Image) -> None:
        self.image = image
        self.cols: dict[str, list] = {name: [] for name in SCHEMA.names}
        # One read buffer for the image's hashing: a fresh megabyte per
        # file is an mmap and munmap each where the allocator's dynamic
        # mmap threshold is off, as Dask's MALLOC_TRIM_THRESHOLD_ setting
        # for its workers turns it off (mallopt(3)).
        self.buffer = bytearray(1 << 20)

    def add(self, **values) -> None:
        values.setdefault("image", self.image.source)
        values.setdefault("partition", self.image.partition)
        values.setdefault("offset", self.image.offset)
        for name, col in self.cols.items():
            col.append(values.get(name))

    def error(self, path: str | None, message: str) -> None:
        self.add(record="error", path=path, error=message)

    def table(self) -> pa.Table:
        return pa.Table.from_pydict(self.cols, schema=SCHEMA)


def _decode(b: bytes) -> tuple[str, bytes | None]:
    try:
        return b.decode("utf-8"), None
    except UnicodeDecodeError:
        return b.decode("utf-8", errors="backslashreplace"), b


def _patterns(hash_pattern: str | Sequence[str] | None) -> tuple[str, ...]:
    if hash_pattern is None:
        return ()
    if isinstance(hash_pattern, str):
        return (hash_pattern,)
    return tuple(hash_pattern)


def _sha256(fs, path: bytes, buf: bytearray) -> str:
    h = hashlib.sha256()
    with fs.open(path) as f:
        while n := f.readinto(buf):
            h.update(memoryview(buf)[:n])
    return h.hexdigest()


def _walk(fs, rows: _Rows) -> Iterator[tuple[bytes, object]]:
    """Every name below ``/`` with its lstat, depth first, each
    directory's names in byte order; a directory that cannot be listed,
    or a name that cannot be stat'ed, becomes an error row and the walk
    goes on."""
    stack = [b"/"]
    while stack:
        p = stack.pop()
        try:
            st = fs.lstat(p)
        except OSError as e:
            rows.error(_decode(p)[0], f"lstat: {e}")
            continue
        yield p, st
        if stat.S_ISDIR(st.st_mode):
            try:
                names = sorted(fs.listdir(p))
            except OSError as e:
                rows.error(_decode(p)[0], f"listing the directory: {e}")
                continue
            base = p if p.endswith(b"/") else p + b"/"
            stack.extend(base + n for n in reversed(names))


def _entry(fs, rows: _Rows, p: bytes, st, patterns: tuple[str, ...]) -> None:
    path, raw = _decode(p)
    problems = []
    times = {}
    for name, v in (
        ("atime_ns", st.st_atime_ns),
        ("mtime_ns", st.st_mtime_ns),
        ("ctime_ns", st.st_ctime_ns),
        ("birth_ns", st.st_birthtime_ns),
    ):
        if v is not None and v not in _INT64:
            problems.append(f"{name} {v} is outside int64 nanoseconds")
            v = None
        times[name] = v
    size = st.st_size
    if size not in _INT64:  # i_size is 64 bits unsigned; a damaged inode may use the top one
        problems.append(f"size {size} is outside int64")
        size = None
    kind = _TYPES.get(stat.S_IFMT(st.st_mode), f"unknown:{stat.S_IFMT(st.st_mode):o}")
    digest = target = None
    if kind == "file" and any(fnmatch.fnmatchcase(path, pat) for pat in patterns):
        try:
            digest = _sha256(fs, p, rows.buffer)
        except OSError as e:
            problems.append(f"reading for sha256: {e}")
    elif kind == "symlink":
        try:
            target = _decode(fs.readlink(p))[0]
        except OSError as e:
            problems.append(f"readlink: {e}")
    rows.add(
        record="entry",
        path=path,
        path_bytes=raw,
        type=kind,
        size=size,
        mode=stat.S_IMODE(st.st_mode),
        uid=st.st_uid,
        gid=st.st_gid,
        nlink=st.st_nlink,
        ino=st.st_ino,
        sha256=digest,
        target=target,
        error="; ".join(problems) or None,
        **times,
    )


def inventory(image, *, hash_pattern: str | Sequence[str] | None = None) -> pa.Table:
    """The inventory of one image (a path, URL or :class:`Image`) as an
    Arrow table of :data:`SCHEMA`: its entries, its installed packages,
    and an error row for whatever could not be read. Never raises for a
    bad image: a scan of many images must outlive any one of them.

    ``hash_pattern`` (a pattern or several, ``fnmatch`` style over the
    whole path, where ``*`` also crosses ``/``: ``/etc/*``,
    ``*.so``) picks the regular files whose sha256 is taken; reading
    them is most of a scan's I/O, so none are by default.

    This is the function a Dask worker runs, one call per image."""
    img = _image(image)
    rows = _Rows(img)
    patterns = _patterns(hash_pattern)
    try:
        fs = ext4kit.open(img.source, partition=img.partition, offset=img.offset)
    except Exception as e:  # noqa: BLE001 - any failure is this image's error row
        rows.error(None, f"opening the image: {type(e).__name__}: {e}")
        return rows.table()
    try:
        with fs:
            for p, st in _walk(fs, rows):
                _entry(fs, rows, p, st, patterns)
            found, problems = _packages.installed(fs)
            for pkg in found:
                rows.add(
                    record="package",
                    path=pkg.source,
                    type=pkg.manager,
                    package=pkg.name,
                    version=pkg.version,
                    arch=pkg.arch,
                )
            for path, message in problems:
                rows.error(path, message)
    except Exception as e:  # noqa: BLE001 - the rows so far stand, the rest is this error
        rows.error(None, f"{type(e).__name__}: {e}")
    try:
        return rows.table()
    except (pa.ArrowException, OverflowError, TypeError) as e:
        # A value the schema cannot hold that slipped past the checks
        # above: the image's rows are lost, said in its one row.
        only = _Rows(img)
        only.error(None, f"making the rows: {type(e).__name__}: {e}")
        return only.table()


def _has_error(t: pa.Table) -> bool:
    return t.column("error").null_count < t.num_rows


def _tables_in_order(images: list[Image], client, hash_pattern, window: int | None) -> Iterator[pa.Table]:
    """The images' tables in the order given: a plain loop without a
    client; with one, a task per image, at most ``window`` submitted
    ahead of the one being written (so results waiting on the workers
    stay bounded however long the list)."""
    if client is None:
        for img in images:
            yield inventory(img, hash_pattern=hash_pattern)
        return
    if window is None:
        threads = sum(client.nthreads().values()) or 1
        window = max(8, 4 * threads)
    pending: collections.deque = collections.deque()
    todo = iter(images)

    def submit() -> bool:
        img = next(todo, None)
        if img is None:
            return False
        # pure=False: an image may change between two scans (or appear
        # twice in one); each submission is its own task.
        pending.append((img, client.submit(inventory, img, hash_pattern=hash_pattern, pure=False)))
        return True

    while len(pending) < window and submit():
        pass
    while pending:
        img, fut = pending.popleft()
        try:
            table = fut.result()
        except Exception as e:  # noqa: BLE001 - a worker lost with the task (KilledWorker, ...)
            rows = _Rows(img)
            rows.error(None, f"the task failed: {type(e).__name__}: {e}")
            table = rows.table()
        finally:
            fut.release()
        submit()
        yield table


def scan(
    images: Iterable,
    out: str | os.PathLike | None = None,
    *,
    client=None,
    hash_pattern: str | Sequence[str] | None = None,
    window: int | None = None,
) -> pa.Table | ScanSummary:
    """Inventory every image of ``images`` (paths, URLs or :class:`Image`).

    ``client`` is a ``dask.distributed.Client``, or a scheduler's address
    (``"tcp://host:8786"``, connected to and closed here); without one
    the images are read one after another in this process. With ``out``
    the rows go to that Parquet file as the images finish (written under
    a temporary name, renamed when complete) and a :class:`ScanSummary`
    is returned; without it, the whole inventory as one Arrow table.
    Either way the rows are in the images' order, and the same for any
    cluster and for the plain loop."""
    imgs = [_image(i) for i in images]
    own = None
    if isinstance(client, str):
        from dask.distributed import Client

        client = own = Client(client)
    try:
        start = time.monotonic()
        tables = _tables_in_order(imgs, client, hash_pattern, window)
        if out is None:
            return pa.concat_tables(list(tables)) if imgs else SCHEMA.empty_table()
        out = os.fspath(out)
        tmp = f"{out}.part-{os.getpid()}"
        rows = bad = 0
        try:
            with pq.ParquetWriter(tmp, SCHEMA, compression="zstd") as w:
                for t in tables:
                    w.write_table(t)
                    rows += t.num_rows
                    bad += _has_error(t)
            os.replace(tmp, out)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return ScanSummary(len(imgs), rows, bad, time.monotonic() - start)
    finally:
        if own is not None:
            own.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ext4kit.fleet``: scan images into a Parquet file."""
    ap = argparse.ArgumentParser(
        prog="python -m ext4kit.fleet",
        description="Inventory many ext2/3/4 images into one Parquet file, on a Dask cluster or in this process.",
    )
    ap.add_argument("images", nargs="*", metavar="IMAGE", help="an image's path or URL, as every worker reaches it")
    ap.add_argument("--from-file", metavar="LIST", help="read more image names from LIST, one a line ('-': standard input)")
    ap.add_argument("--out", "-o", required=True, help="the Parquet file to write")
    ap.add_argument("--hash", action="append", metavar="PATTERN", help="sha256 of the regular files whose path matches (fnmatch; repeatable)")
    ap.add_argument("--partition", type=int, help="the filesystem's partition (1-based) in every image")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS", help="a running Dask scheduler, e.g. tcp://scheduler:8786")
    where.add_argument("--workers", type=int, metavar="N", help="start a local Dask cluster of N worker processes")
    args = ap.parse_args(argv)
    names = list(args.images)
    if args.from_file:
        src = sys.stdin if args.from_file == "-" else open(args.from_file, encoding="utf-8")
        with src:
            names += [line.strip() for line in src if line.strip()]
    if not names:
        ap.error("no images: give IMAGE arguments or --from-file")
    images = [Image(n, partition=args.partition) for n in names]
    cluster = client = None
    try:
        if args.scheduler or args.workers:
            from dask.distributed import Client, LocalCluster

            if args.workers:
                cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True)
                client = Client(cluster)
            else:
                client = Client(args.scheduler)
        s = scan(images, args.out, client=client, hash_pattern=args.hash)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    print(
        f"{s.images} images, {s.rows} rows, {s.images_with_errors} with errors, "
        f"{s.seconds:.2f} s ({s.images / s.seconds if s.seconds else 0:.1f} images/s) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    # Run as `python -m ext4kit.fleet`, this file is __main__; the tasks
    # must name the importable module's inventory, which every worker
    # imports, so the entry goes through it.
    from ext4kit.fleet import main as _main

    sys.exit(_main())
