"""Images that are Python objects: an `io.BytesIO` (or any binary file
object) is the device, read and written through its own methods."""

from __future__ import annotations

import gc
import io
import os
import shutil

import pytest

import ext4kit
from conftest import e2fsck_clean, ext4kit_view, mke2fs, need, run


def filled_image(tmp: str) -> str:
    img = mke2fs(os.path.join(tmp, "f.img"), "24M")
    with ext4kit.open(img, writable=True) as fs:
        fs.makedirs("/etc/conf.d")
        fs.write("/etc/hostname", b"bytesio\n")
        fs.write("/etc/conf.d/big", os.urandom(2 * 1024 * 1024))
        fs.symlink("hostname", "/etc/name")
        fs.setxattr("/etc/hostname", "user.x", b"1")
    return img


def test_a_bytesio_image_reads_as_the_file_does(tmp):
    img = filled_image(tmp)
    with ext4kit.open(img) as fs:
        want = ext4kit_view(fs)
    with open(img, "rb") as f:
        bio = io.BytesIO(f.read())
    with ext4kit.open(bio) as fs:
        assert ext4kit_view(fs) == want
        assert fs.read("/etc/hostname") == b"bytesio\n"
        assert fs.journal()["journal_inode"] == 8
    # An open host file object works the same way.
    with open(img, "rb") as f, ext4kit.open(f) as fs:
        assert ext4kit_view(fs) == want


def test_a_writable_bytesio_takes_changes_and_checks_clean(tmp):
    img = filled_image(tmp)
    with open(img, "rb") as f:
        bio = io.BytesIO(f.read())
    with ext4kit.open(bio, writable=True) as fs:
        fs.write("/etc/new", b"written through BytesIO\n")
        fs.remove("/etc/name")
        fs.chmod("/etc/hostname", 0o600)
    out = os.path.join(tmp, "out.img")
    with open(out, "wb") as f:
        f.write(bio.getvalue())
    e2fsck_clean(out)
    with ext4kit.open(out) as fs:
        assert fs.read("/etc/new") == b"written through BytesIO\n"
        assert not fs.exists("/etc/name")
        assert fs.stat("/etc/hostname").st_mode & 0o777 == 0o600
    # The file the BytesIO came from is untouched.
    with ext4kit.open(img) as fs:
        assert fs.exists("/etc/name") and not fs.exists("/etc/new")


def test_a_qcow2_in_a_bytesio_and_a_partition_offset(tmp):
    need("qemu-img")
    img = filled_image(tmp)
    q = os.path.join(tmp, "f.qcow2")
    run("qemu-img", "convert", "-O", "qcow2", img, q)
    with open(q, "rb") as f:
        bio = io.BytesIO(f.read())
    with ext4kit.open(bio) as fs:
        assert fs.read("/etc/hostname") == b"bytesio\n"
    # The filesystem 1 MiB into a bigger object.
    with open(img, "rb") as f:
        bio = io.BytesIO(b"\0" * (1 << 20) + f.read())
    with ext4kit.open(bio, offset=1 << 20) as fs:
        assert fs.read("/etc/hostname") == b"bytesio\n"


def test_file_objects_of_the_image_are_io_raw(tmp):
    img = filled_image(tmp)
    with ext4kit.open(img, writable=True) as fs:
        with fs.open("/etc/conf.d/big") as f:
            assert isinstance(f, io.RawIOBase) and f.readable() and not f.writable() and f.seekable()
            buf = bytearray(1000)
            assert f.readinto(buf) == 1000
            whole = fs.read("/etc/conf.d/big")
            assert bytes(buf) == whole[:1000] and f.tell() == 1000
            assert f.seek(-10, os.SEEK_END) == len(whole) - 10
            assert f.read() == whole[-10:] and f.read(5) == b""
            assert f.pread(20, 100) == whole[100:120]
            buffered = io.BufferedReader(fs.open("/etc/conf.d/big"))
            assert buffered.read(4096) == whole[:4096]
            buffered.close()
            dst = io.BytesIO()
            f.seek(0)
            shutil.copyfileobj(f, dst)
            assert dst.getvalue() == whole
        with fs.open("/etc/lines", "w+b") as f:
            f.write(b"one\ntwo\n")
            f.seek(0)
            assert list(f) == [b"one\n", b"two\n"]
        with fs.open("/etc/lines", "r+b") as f:
            f.write(b"ONE")
            f.truncate(5)
        assert fs.read("/etc/lines") == b"ONE\nt"
        f = fs.open("/etc/lines")
        f.close()
        assert f.closed
    e2fsck_clean(img)


def test_a_file_open_past_the_filesystems_close_keeps_the_image_open(tmp):
    img = filled_image(tmp)
    fs = ext4kit.open(img, writable=True)
    f = fs.open("/etc/late", "wb")
    fs.close()
    assert fs.closed
    with pytest.raises(ValueError, match="closed"):
        fs.stat("/")
    f.write(b"after close\n")
    f.close()  # the last handle: the image is closed here
    e2fsck_clean(img)
    with ext4kit.open(img) as fs:
        assert fs.read("/etc/late") == b"after close\n"


def test_a_filesystem_dropped_without_close_is_closed_clean(tmp):
    img = filled_image(tmp)
    with open(img, "rb") as f:
        bio = io.BytesIO(f.read())
    for image in (img, bio):
        fs = ext4kit.open(image, writable=True)
        fs.write("/etc/dropped", b"collected\n")
        del fs
        gc.collect()
    e2fsck_clean(img)
    out = os.path.join(tmp, "bio.img")
    with open(out, "wb") as f:
        f.write(bio.getvalue())
    e2fsck_clean(out)
    for image in (img, out):
        with ext4kit.open(image) as fs:
            assert fs.read("/etc/dropped") == b"collected\n"


class _Lying(io.RawIOBase):
    """An image object that misbehaves in one way: `how` names it."""

    def __init__(self, data: bytes, how: str):
        self.data, self.how, self.pos = data, how, 0

    def readable(self):
        return True

    def seek(self, off, whence=0):
        if self.how == "negative-size" and whence == 2:
            return -1
        self.pos = off if whence == 0 else len(self.data) if whence == 2 else self.pos + off
        return self.pos

    def read(self, n=-1):
        if self.how == "raises":
            raise RuntimeError("the disk fell off")
        if self.how == "text":
            return "not bytes"
        if self.how == "short" and self.pos >= 4096:
            return b""
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out


@pytest.mark.parametrize("how", ["raises", "text", "short", "negative-size"])
def test_a_misbehaving_image_object_is_an_error_not_a_crash(tmp, how):
    img = filled_image(tmp)
    with open(img, "rb") as f:
        data = f.read()
    with pytest.raises((OSError, TypeError, ValueError, OverflowError)):
        with ext4kit.open(_Lying(data, how)) as fs:
            ext4kit_view(fs)
    # An object without read() at all is refused by name.
    with pytest.raises(TypeError, match="read"):
        ext4kit.open(object())
