"""`ext4kit.build`: images from host trees, checked by e2fsck and read
back as the tree was."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import ext4kit
from conftest import e2fsck_clean


def test_build_the_smallest_image_of_a_tree(tmp):
    src = os.path.join(tmp, "root")
    os.makedirs(os.path.join(src, "etc"))
    with open(os.path.join(src, "etc", "hostname"), "w") as f:
        f.write("built\n")
    with open(os.path.join(src, "data"), "wb") as f:
        f.write(os.urandom(1 << 20))
    os.symlink("etc/hostname", os.path.join(src, "name"))
    seen = []
    out = os.path.join(tmp, "built.img")
    r = ext4kit.build(
        out,
        [src],
        label="pyroot",
        all_root=True,
        free="10%",
        uuid="01234567-89ab-cdef-0123-456789abcdef",
        timestamp=1_700_000_000,
        progress=lambda entries, nbytes: seen.append((entries, nbytes)),
    )
    assert r["size"] == os.path.getsize(out) and r["needs"]["data_bytes"] >= 1 << 20
    assert r["uuid"] == "01234567-89ab-cdef-0123-456789abcdef" and r["entries"] >= 4
    assert seen and seen[-1][1] <= r["bytes"]
    e2fsck_clean(out)
    with ext4kit.open(out) as fs:
        assert fs.info()["label"] == "pyroot"
        assert fs.read("/etc/hostname") == b"built\n" and fs.readlink("/name") == "etc/hostname"
        st = fs.stat("/data")
        assert (st.st_uid, st.st_gid, st.st_mtime_ns) == (0, 0, os.stat(os.path.join(src, "data")).st_mtime_ns)
    # The same sources and options make the same bytes — in another
    # process: the engine numbers inode generations from a process-wide
    # counter, so two builds in one process differ there.
    again = os.path.join(tmp, "again.img")
    code = (
        "import ext4kit, sys; ext4kit.build(sys.argv[1], [sys.argv[2]], label='pyroot', all_root=True, "
        "free='10%', uuid='01234567-89ab-cdef-0123-456789abcdef', timestamp=1_700_000_000)"
    )
    subprocess.run([sys.executable, "-c", code, again, src], check=True)
    assert open(out, "rb").read() == open(again, "rb").read()


def test_build_with_a_size_and_type_and_a_bad_source(tmp):
    out = os.path.join(tmp, "ext2.img")
    r = ext4kit.build(out, size=8 << 20, fs_type="ext2")
    assert r["size"] == 8 << 20 and "has_journal" not in r["features"]
    e2fsck_clean(out)
    with ext4kit.open(out) as fs:
        assert fs.listdir("/") == ["lost+found"]
    with pytest.raises(ext4kit.BuildError) as e:
        ext4kit.build(os.path.join(tmp, "bad.img"), [os.path.join(tmp, "missing")])
    assert isinstance(e.value, OSError) and "missing" in str(e.value)
    assert not os.path.exists(os.path.join(tmp, "bad.img"))
    with pytest.raises(ValueError):
        ext4kit.build(os.path.join(tmp, "x.img"), size=8 << 20, fs_type="ext5")
