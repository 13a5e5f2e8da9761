"""Shared helpers of the ext4kit Python suite.

The oracles are external, as everywhere in ext4kit: the kernel's ext4
(loop mounts, as root) and e2fsprogs (`mke2fs`, `e2fsck -fn`). A test
that cannot run — not root, a tool missing — fails and says why; it is
never skipped. `.ci/run` installs what they need.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import stat
import subprocess
import tempfile

import pytest

import ext4kit


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed (Debian: e2fsprogs, attr, coreutils, qemu-utils); .ci/run installs it")
    return path


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test loop-mounts images with the kernel's ext4 and needs root (CI runs as root)")


def run(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, **kw)


def mke2fs(path: str, size: str = "64M", *opts: str) -> str:
    need("mke2fs")
    run("mke2fs", "-q", "-F", "-t", "ext4", *opts, path, size)
    return path


def e2fsck_clean(path: str) -> None:
    """`e2fsck -fn` finds nothing to fix (exit 0)."""
    need("e2fsck")
    r = subprocess.run(["timeout", "120", "e2fsck", "-fn", path], capture_output=True, text=True)
    assert r.returncode == 0, f"e2fsck -fn {path}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"


@contextlib.contextmanager
def mounted(image: str, ro: bool = False):
    """The kernel's view of `image`: a loop mount (noatime, so reading
    the tree leaves its times as they are)."""
    need_root()
    d = tempfile.mkdtemp(prefix="ext4kit-py-mnt-")
    opts = "loop,noatime" + (",ro" if ro else "")
    try:
        run("mount", "-t", "ext4", "-o", opts, image, d)
        try:
            yield d
        finally:
            run("umount", d)
    finally:
        os.rmdir(d)


@pytest.fixture
def tmp(tmp_path) -> str:
    return str(tmp_path)


def birth_times_ns(paths: list[str]) -> list[int | None]:
    """Each path's birth time as the kernel reports it (statx through
    coreutils' `stat %w`, in UTC), None where it has none."""
    if not paths:
        return []
    need("stat")
    out = subprocess.run(
        ["stat", "--printf", "%w\\n", "--", *paths],
        check=True,
        capture_output=True,
        env={**os.environ, "TZ": "UTC", "LC_ALL": "C"},
    ).stdout.decode()
    res: list[int | None] = []
    for line in out.splitlines():
        if line.strip() == "-":
            res.append(None)
            continue
        date, clock, zone = line.split()
        assert zone == "+0000", line
        whole, _, frac = clock.partition(".")
        dt = datetime.datetime.fromisoformat(f"{date}T{whole}+00:00")
        res.append(int(dt.timestamp()) * 1_000_000_000 + int(frac.ljust(9, "0") or 0))
    assert len(res) == len(paths), out
    return res


def _digest(read) -> str:
    import hashlib

    return hashlib.sha256(read()).hexdigest()


def kernel_view(root: str) -> dict:
    """Every path below the mount `root` (as image paths, bytes) with what
    the kernel reports: lstat fields, birth time, xattrs, symlink target,
    contents (as a digest)."""
    entries: dict[bytes, dict] = {}
    order: list[bytes] = []
    broot = os.fsencode(root)

    def visit(host: bytes, rel: bytes) -> None:
        st = os.lstat(host)
        e = {
            "mode": st.st_mode,
            "ino": st.st_ino,
            "nlink": st.st_nlink,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "size": st.st_size,
            "blocks": st.st_blocks,
            "rdev": st.st_rdev,
            "atime_ns": st.st_atime_ns,
            "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns,
            "xattrs": {n: os.getxattr(host, n, follow_symlinks=False) for n in sorted(os.listxattr(host, follow_symlinks=False))},
        }
        if stat.S_ISLNK(st.st_mode):
            e["target"] = os.readlink(host)
        if stat.S_ISREG(st.st_mode):
            with open(host, "rb") as f:
                e["digest"] = _digest(f.read)
        entries[rel] = e
        order.append(host)
        if stat.S_ISDIR(st.st_mode):
            for name in sorted(os.listdir(host)):
                visit(host + b"/" + name, (rel.rstrip(b"/") + b"/" + name))

    visit(broot, b"/")
    for (rel, e), b in zip(entries.items(), birth_times_ns([os.fsdecode(h) for h in order])):
        e["birth_ns"] = b
    return entries


def ext4kit_view(fs: ext4kit.Filesystem) -> dict:
    """The same view of an image through the package: its walk, lstat,
    getxattr, readlink and open."""
    entries: dict[bytes, dict] = {}
    for dirpath, dirnames, filenames in fs.walk(b"/"):
        names = [dirpath] if dirpath == b"/" else []
        names += [dirpath.rstrip(b"/") + b"/" + n for n in dirnames + filenames]
        for p in names:
            if p in entries:
                continue
            st = fs.lstat(p)
            e = {
                "mode": st.st_mode,
                "ino": st.st_ino,
                "nlink": st.st_nlink,
                "uid": st.st_uid,
                "gid": st.st_gid,
                "size": st.st_size,
                "blocks": st.st_blocks,
                "rdev": st.st_rdev,
                "atime_ns": st.st_atime_ns,
                "mtime_ns": st.st_mtime_ns,
                "ctime_ns": st.st_ctime_ns,
                "xattrs": {
                    n: fs.getxattr(p, n, follow_symlinks=False)
                    for n in sorted(fs.listxattr(p, follow_symlinks=False))
                },
                "birth_ns": st.st_birthtime_ns,
            }
            # The float times agree with the integer ones.
            assert abs(st.st_mtime - st.st_mtime_ns / 1e9) < 1e-6
            if stat.S_ISLNK(st.st_mode):
                e["target"] = fs.readlink(p)
            if stat.S_ISREG(st.st_mode):
                with fs.open(p) as f:
                    e["digest"] = _digest(f.readall)
            entries[p] = e
    return entries


def assert_views_equal(kernel: dict, ours: dict) -> None:
    assert sorted(kernel) == sorted(ours), (
        f"only the kernel: {sorted(set(kernel) - set(ours))}, only ext4kit: {sorted(set(ours) - set(kernel))}"
    )
    for p in kernel:
        for field, want in kernel[p].items():
            got = ours[p][field]
            assert got == want, f"{p!r} {field}: kernel {want!r}, ext4kit {got!r}"
