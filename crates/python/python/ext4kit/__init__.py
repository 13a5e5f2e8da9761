"""Read, write and build ext2/ext3/ext4 images from Python, without mounting.

The ext4kit engine (Rust) as a Python package::

    import ext4kit

    with ext4kit.open("disk.img") as fs:                 # read-only by default
        for dirpath, dirnames, filenames in fs.walk("/etc"):
            print(dirpath, filenames)
        print(fs.stat("/etc/hostname").st_mtime_ns)
        with fs.open("/etc/hostname") as f:
            print(f.read())

    with ext4kit.open("disk.img", writable=True) as fs:
        fs.mkdir("/srv")
        fs.write("/srv/hello.txt", b"hello\\n")
        fs.put("site/", "/srv/www")                       # a host tree, as cp -a

    ext4kit.build("rootfs.img", ["rootfs/"], all_root=True, label="root")

Calls follow the ``os`` module: the same names, arguments and results
(``stat_result``-like objects, ``str`` names for ``str`` paths and
``bytes`` for ``bytes``), and failures raise the ``OSError`` subclass of
the errno (``FileNotFoundError``, ``PermissionError``, ...) with
``filename`` set. Image I/O runs with the GIL released; one filesystem
may be used from several threads at once.
"""

from __future__ import annotations

import io
import os
import stat as _stat

from ._ext4kit import BuildError, RawFile, StatResult, __version__, build
from ._ext4kit import Filesystem as _Filesystem

__all__ = [
    "open",
    "build",
    "Filesystem",
    "File",
    "DirEntry",
    "StatResult",
    "BuildError",
    "__version__",
]


class File(io.RawIOBase):
    """A file of the image, opened by :meth:`Filesystem.open`: an
    ``io.RawIOBase``, so ``read``, ``readinto``, ``readall``, ``write``,
    ``seek``, ``tell``, ``truncate`` and iteration by lines work as for a
    host file opened with ``buffering=0`` (wrap it in ``io.BufferedReader``
    for buffered reads)."""

    def __init__(self, raw: RawFile, name, mode: str) -> None:
        super().__init__()
        self._raw = raw
        self.name = name
        self.mode = mode

    def readinto(self, b) -> int:
        self._checkClosed()
        with memoryview(b) as m, m.cast("B") as flat:
            return self._raw.readinto(flat)

    def read(self, size: int = -1) -> bytes:
        self._checkClosed()
        return self._raw.read(-1 if size is None else size)

    def readall(self) -> bytes:
        self._checkClosed()
        return self._raw.read(-1)

    def pread(self, size: int, offset: int) -> bytes:
        """``os.pread``: read at ``offset`` without moving the position."""
        self._checkClosed()
        return self._raw.pread(size, offset)

    def write(self, b) -> int:
        self._checkClosed()
        with memoryview(b) as m, m.cast("B") as flat:
            return self._raw.write(flat)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._checkClosed()
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        self._checkClosed()
        return self._raw.tell()

    def truncate(self, size: int | None = None) -> int:
        self._checkClosed()
        return self._raw.truncate(size)

    def fsync(self) -> None:
        """Make the file's data and inode durable in the image."""
        self._checkClosed()
        self._raw.fsync()

    def readable(self) -> bool:
        self._checkClosed()
        return self._raw.readable()

    def writable(self) -> bool:
        self._checkClosed()
        return self._raw.writable()

    def seekable(self) -> bool:
        self._checkClosed()
        return True

    @property
    def ino(self) -> int:
        """The inode number."""
        return self._raw.ino

    def close(self) -> None:
        if not self.closed:
            try:
                self._raw.close()
            finally:
                super().close()

    def __repr__(self) -> str:
        return f"<ext4kit.File name={self.name!r} mode={self.mode!r}>"


class DirEntry:
    """What :meth:`Filesystem.scandir` yields, as ``os.DirEntry``: ``name``,
    ``path``, ``inode()``, ``is_dir()``, ``is_file()``, ``is_symlink()``
    (from the directory entry, no inode read) and ``stat()``."""

    __slots__ = ("name", "path", "_ino", "_kind", "_fs", "_stat", "_lstat")

    def __init__(self, fs: "Filesystem", dirpath, name, ino: int, kind: int | None) -> None:
        self._fs = fs
        self.name = name
        self.path = _join(dirpath, name)
        self._ino = ino
        self._kind = kind
        self._stat = None
        self._lstat = None

    def inode(self) -> int:
        return self._ino

    def _type(self) -> int:
        if self._kind is None:  # a filesystem without the filetype feature
            self._kind = _stat.S_IFMT(self.stat(follow_symlinks=False).st_mode)
        return self._kind

    def is_symlink(self) -> bool:
        return self._type() == _stat.S_IFLNK

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        if follow_symlinks and self.is_symlink():
            try:
                return _stat.S_ISDIR(self.stat().st_mode)
            except OSError:
                return False
        return self._type() == _stat.S_IFDIR

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        if follow_symlinks and self.is_symlink():
            try:
                return _stat.S_ISREG(self.stat().st_mode)
            except OSError:
                return False
        return self._type() == _stat.S_IFREG

    def stat(self, *, follow_symlinks: bool = True) -> StatResult:
        if follow_symlinks:
            if self._stat is None:
                self._stat = self._fs.stat(self.path)
            return self._stat
        if self._lstat is None:
            self._lstat = self._fs.lstat(self.path)
        return self._lstat

    def __fspath__(self):
        return self.path

    def __repr__(self) -> str:
        return f"<ext4kit.DirEntry {self.name!r}>"


def _join(dirpath, name):
    sep = b"/" if isinstance(name, bytes) else "/"
    return dirpath + name if dirpath.endswith(sep) else dirpath + sep + name


class Filesystem(_Filesystem):
    """An open ext2/3/4 filesystem; :func:`open` makes one. Use it as a
    context manager, or call :meth:`close`: a writable filesystem is then
    written back and left clean (``e2fsck -fn`` finds nothing)."""

    def open(self, path, mode: str = "rb", *, perm: int = 0o644) -> File:
        """Open a file of the image: ``rb`` (the default), ``r+b``, ``wb``,
        ``xb``, ``ab``, ``w+b``...; ``perm`` is the permission bits of a file
        it creates."""
        return File(self.open_raw(path, mode, perm=perm), path, mode)

    def write(self, path, data, *, perm: int = 0o644) -> int:
        """Make ``path`` a file holding ``data`` (created, or replaced)."""
        with self.open(path, "wb", perm=perm) as f:
            return f.write(data)

    def read(self, path) -> bytes:
        """The whole contents of the file ``path``."""
        with self.open(path) as f:
            return f.readall()

    def scandir(self, path="/"):
        """``os.scandir``: the entries of a directory as :class:`DirEntry`,
        without ``.`` and ``..``."""
        for name, ino, kind in self.read_dir(path):
            yield DirEntry(self, os.fspath(path), name, ino, kind)

    def listdir(self, path="/") -> list:
        """``os.listdir``: the names in a directory."""
        return [name for name, _, _ in self.read_dir(path)]

    def exists(self, path) -> bool:
        """Whether ``path`` names something (symlinks followed)."""
        try:
            self.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def makedirs(self, path, mode: int = 0o755, exist_ok: bool = False) -> None:
        """``os.makedirs``: a directory and the missing ones above it."""
        p = os.fspath(path)
        sep = b"/" if isinstance(p, bytes) else "/"
        parts = [c for c in p.split(sep) if c]
        cur = sep
        for i, c in enumerate(parts):
            cur = _join(cur, c)
            try:
                self.mkdir(cur, mode)
            except FileExistsError:
                if i == len(parts) - 1 and not exist_ok:
                    raise
                if not _stat.S_ISDIR(self.stat(cur).st_mode):
                    raise

    def rmtree(self, path) -> None:
        """``shutil.rmtree``: a directory and everything below it."""
        for e in list(self.scandir(path)):
            if e.is_dir(follow_symlinks=False):
                self.rmtree(e.path)
            else:
                self.remove(e.path)
        self.rmdir(path)

    def walk(self, top="/", topdown: bool = True, onerror=None, followlinks: bool = False):
        """``os.walk``: ``(dirpath, dirnames, filenames)`` for every
        directory below ``top``; with ``topdown`` the caller may prune
        ``dirnames`` in place."""
        top = os.fspath(top)
        try:
            entries = list(self.scandir(top))
        except OSError as e:
            if onerror is not None:
                onerror(e)
            return
        dirs, files, links = [], [], set()
        for e in entries:
            try:
                is_dir = e.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                dirs.append(e.name)
                if e.is_symlink():
                    links.add(e.name)
            else:
                files.append(e.name)
        if topdown:
            yield top, dirs, files
        for d in dirs:
            # A symlink to a directory is listed with the directories, as
            # os.walk lists it, and walked into only with followlinks.
            if followlinks or d not in links:
                yield from self.walk(_join(top, d), topdown, onerror, followlinks)
        if not topdown:
            yield top, dirs, files

    def __enter__(self) -> "Filesystem":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def open(
    image,
    partition: int | None = None,
    offset: int | None = None,
    writable: bool = False,
    *,
    no_replay: bool = False,
) -> Filesystem:
    """Open the ext2/3/4 filesystem in ``image``: a path, a URL
    (``https://``, ``s3://``, ``gs://``, ``az://``; read-only), or a binary
    file object with ``read`` and ``seek`` (and ``write`` when writable),
    such as ``io.BytesIO``. Container formats (qcow2, VHDX, VMDK, VHD,
    Android sparse) are read by content; ``partition`` (1-based) or
    ``offset`` (bytes) finds the filesystem in a partitioned disk.
    Read-only unless ``writable``; a journal that needs recovery is replayed
    (in memory when read-only, unless ``no_replay``)."""
    return Filesystem(image, partition=partition, offset=offset, writable=writable, no_replay=no_replay)
