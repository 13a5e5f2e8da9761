"""Changes made through the package, checked by the two oracles:
`e2fsck -fn` finds nothing, and the kernel's mount shows every change
(and the whole tree the kernel sees equals the package's view)."""

from __future__ import annotations

import errno
import os
import stat

import pytest

import ext4kit
from conftest import assert_views_equal, e2fsck_clean, ext4kit_view, kernel_view, mke2fs, mounted, need_root


def host_tree(base: str) -> str:
    src = os.path.join(base, "site")
    os.makedirs(os.path.join(src, "css"))
    with open(os.path.join(src, "index.html"), "w") as f:
        f.write("<h1>hi</h1>\n")
    with open(os.path.join(src, "css", "a.css"), "w") as f:
        f.write("body{}\n")
    os.symlink("index.html", os.path.join(src, "home.html"))
    os.link(os.path.join(src, "index.html"), os.path.join(src, "index-copy.html"))
    os.chmod(os.path.join(src, "css"), 0o750)
    os.utime(os.path.join(src, "index.html"), ns=(1_000_000_001, 2_000_000_002))
    return src


def test_writes_are_clean_and_the_kernel_sees_them(tmp):
    need_root()
    img = mke2fs(os.path.join(tmp, "w.img"), "64M")
    src = host_tree(tmp)
    single = os.path.join(tmp, "notes.txt")
    with open(single, "wb") as f:
        f.write(b"host file\n" * 1000)
    big = os.urandom(5 * 1024 * 1024 + 3)

    with ext4kit.open(img, writable=True) as fs:
        assert not fs.read_only
        fs.mkdir("/d", 0o750)
        fs.makedirs("/a/b/c")
        fs.makedirs("/a/b/c", exist_ok=True)
        assert fs.write("/d/f", b"hello\n") == 6
        fs.write("/d/big", big)
        with fs.open("/d/f", "ab") as f:
            f.write(b"more\n")
        fs.put(single, "/d")  # into a directory, under its own name
        fs.put(single, "/d/renamed-notes.txt")  # as a new name
        entries, nbytes = fs.put(src, "/srv")  # a tree, as cp -a site /srv
        # A hard link's data is written once.
        assert entries >= 5 and nbytes == len("<h1>hi</h1>\n") + len("body{}\n")
        fs.symlink("f", "/d/link")
        fs.link("/d/f", "/d/hard")
        fs.mknod("/d/null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        fs.chown("/d/f", 1234, 5678)
        fs.chmod("/d/f", 0o4711)  # after the chown, which clears set-user-ID as the kernel does
        fs.chown("/d/link", 42, -1, follow_symlinks=False)
        fs.setxattr("/d/f", "user.k", b"v")
        fs.setxattr("/d/f", b"user.gone", b"x")
        fs.removexattr("/d/f", "user.gone")
        fs.write("/d/tmp", b"x")
        fs.remove("/d/tmp")
        fs.write("/d/old", b"moved\n")
        fs.rename("/d/old", "/d/new")
        fs.mkdir("/empty")
        fs.rmdir("/empty")
        fs.utime("/d/new", ns=(-1_500_000_000, 4_102_444_800_123_456_789))
        fs.write("/d/short", b"0123456789")
        fs.truncate("/d/short", 4)
        fs.rmtree("/a/b")
        with pytest.raises(FileExistsError):
            fs.rename("/d/f", "/d/new", noreplace=True)
        want_f_ino = fs.stat("/d/f").st_ino

    e2fsck_clean(img)
    with ext4kit.open(img) as fs:
        ours = ext4kit_view(fs)
    with mounted(img, ro=True) as mnt:
        m = lambda p: os.path.join(mnt, p.lstrip("/"))  # noqa: E731
        st = os.lstat(m("/d/f"))
        assert (st.st_mode, st.st_uid, st.st_gid, st.st_ino) == (stat.S_IFREG | 0o4711, 1234, 5678, want_f_ino)
        assert st.st_nlink == 2 and os.lstat(m("/d/hard")).st_ino == st.st_ino
        assert open(m("/d/f"), "rb").read() == b"hello\nmore\n"
        assert open(m("/d/big"), "rb").read() == big
        assert open(m("/d/notes.txt"), "rb").read() == b"host file\n" * 1000
        assert open(m("/d/renamed-notes.txt"), "rb").read() == b"host file\n" * 1000
        assert open(m("/srv/index.html")).read() == "<h1>hi</h1>\n"
        assert os.lstat(m("/srv/index.html")).st_mtime_ns == 2_000_000_002
        assert os.lstat(m("/srv/index.html")).st_ino == os.lstat(m("/srv/index-copy.html")).st_ino
        assert os.readlink(m("/srv/home.html")) == "index.html"
        assert stat.S_IMODE(os.lstat(m("/srv/css")).st_mode) == 0o750
        assert os.readlink(m("/d/link")) == "f" and os.lstat(m("/d/link")).st_uid == 42
        assert os.lstat(m("/d/null")).st_rdev == os.makedev(1, 3)
        assert os.getxattr(m("/d/f"), "user.k") == b"v"
        assert "user.gone" not in os.listxattr(m("/d/f"))
        assert not os.path.exists(m("/d/tmp")) and not os.path.exists(m("/d/old"))
        assert open(m("/d/new"), "rb").read() == b"moved\n"
        st = os.lstat(m("/d/new"))
        assert (st.st_atime_ns, st.st_mtime_ns) == (-1_500_000_000, 4_102_444_800_123_456_789)
        assert open(m("/d/short"), "rb").read() == b"0123"
        assert not os.path.exists(m("/empty")) and os.listdir(m("/a")) == []
        assert stat.S_IMODE(os.lstat(m("/d")).st_mode) == 0o750
        assert_views_equal(kernel_view(mnt), ours)


def test_errors_are_oserror_subclasses_with_errno_and_filename(tmp):
    img = mke2fs(os.path.join(tmp, "e.img"), "16M")
    with ext4kit.open(img, writable=True) as fs:
        with pytest.raises(FileNotFoundError) as e:
            fs.stat("/missing")
        assert e.value.errno == errno.ENOENT and e.value.filename == "/missing"
        with pytest.raises(FileNotFoundError) as e:
            fs.stat(b"/missing")
        assert e.value.filename == b"/missing"
        fs.write("/file", b"x")
        with pytest.raises(NotADirectoryError) as e:
            fs.listdir("/file")
        assert e.value.errno == errno.ENOTDIR
        with pytest.raises(FileExistsError):
            fs.mkdir("/file")
        with pytest.raises(IsADirectoryError):
            fs.open("/lost+found").read()
        fs.mkdir("/full")
        fs.write("/full/x", b"")
        with pytest.raises(OSError) as e:
            fs.rmdir("/full")
        assert e.value.errno == errno.ENOTEMPTY and e.value.filename == "/full"
        with pytest.raises(FileNotFoundError) as e:
            fs.rename("/nope", "/other")
        assert (e.value.filename, e.value.filename2) == ("/nope", "/other")
        with pytest.raises(OSError) as e:
            fs.getxattr("/file", "user.none")
        assert e.value.errno == errno.ENODATA
        with pytest.raises(ValueError):
            fs.open("/file", "rt")
    with pytest.raises(ValueError, match="closed"):
        fs.stat("/")
    fs.close()  # twice is fine
    with ext4kit.open(img) as ro:
        assert ro.read_only
        with pytest.raises(OSError) as e:
            ro.mkdir("/new")
        assert e.value.errno == errno.EROFS
    with pytest.raises(FileNotFoundError) as e:
        ext4kit.open(os.path.join(tmp, "no-such.img"))
    assert e.value.errno == errno.ENOENT
    e2fsck_clean(img)


def test_info_and_journal(tmp):
    img = mke2fs(os.path.join(tmp, "j.img"), "32M", "-L", "pylabel")
    with ext4kit.open(img, writable=True) as fs:
        info = fs.info()
        assert info["label"] == "pylabel" and info["block_size"] in (1024, 4096)
        assert "has_journal" in info["features"] and info["state"] == "clean"
        j = fs.journal()
        assert j["journal_inode"] == 8 and j["end"]["kind"] == "empty" and j["transactions"] == []
        # An fsync commits a transaction: the log holds it until the close.
        with fs.open("/f", "wb") as f:
            f.write(b"data" * 1000)
            f.fsync()
        j = fs.journal()
        assert j["transactions"], j
        assert all(t["commit"] is not None for t in j["transactions"])
        assert any(b["fs_block"] > 0 for t in j["transactions"] for b in t["blocks"])
    with ext4kit.open(img) as fs:
        assert fs.journal()["end"]["kind"] == "empty"  # the close emptied the log
    e2fsck_clean(img)
