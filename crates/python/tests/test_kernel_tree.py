"""What the kernel wrote, read back through the package: a varied tree
made on a loop mount (every file type, device numbers with high bits,
hard links, fast and slow symlinks, xattrs in the inode and in a block,
times to the nanosecond before 1970 and after 2038, ids above 65535, an
indexed directory, a sparse file, a name that is not UTF-8) must read
through ext4kit exactly as `os.lstat` and friends saw it on the mount."""

from __future__ import annotations

import os
import socket
import stat

import pytest

import ext4kit
from conftest import assert_views_equal, kernel_view, ext4kit_view, mke2fs, mounted, need, need_root, run


def make_tree(root: str) -> None:
    need("setfattr")
    need("touch")
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    os.mkdir(j("etc"), 0o755)
    with open(j("etc", "hostname"), "w") as f:
        f.write("box\n")
    with open(j("etc", "random.bin"), "wb") as f:
        f.write(os.urandom(3 * 1024 * 1024 + 17))
    # Sparse: data at the start, in the middle and at the end.
    with open(j("sparse"), "wb") as f:
        f.write(b"head")
        f.seek(9 * 1024 * 1024)
        f.write(b"middle" * 1000)
        f.truncate(20 * 1024 * 1024)
    with open(j("empty"), "wb"):
        pass
    os.link(j("etc", "hostname"), j("hard-link"))
    os.symlink("etc/hostname", j("fast-link"))
    os.symlink("/" + "long-target/" * 10 + "end", j("slow-link"))  # > 60 bytes: a block
    os.mkdir(j("dev"))
    os.mknod(j("dev", "null"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(j("dev", "big"), stat.S_IFBLK | 0o660, os.makedev(300, 70000))  # new-style encoding
    os.mkfifo(j("dev", "fifo"), 0o640)
    s = socket.socket(socket.AF_UNIX)
    s.bind(j("dev", "sock"))
    s.close()
    os.mkdir(j("many"))
    for i in range(400):  # several blocks of entries: an htree directory
        with open(j("many", f"file-{i:04d}-with-a-longer-name"), "w") as f:
            f.write(str(i))
    os.mkdir(j("modes"))
    for name, mode in [("suid", 0o4755), ("sgid", 0o2711), ("none", 0o000), ("sticky", 0o1777)]:
        p = j("modes", name)
        if name == "sticky":
            os.mkdir(p)
        else:
            open(p, "w").close()
        os.chmod(p, mode)
    os.chown(j("modes", "suid"), 70000, 80000)  # ids above 16 bits
    os.chown(j("modes", "none"), 1000, 1000)
    os.lchown(j("fast-link"), 4321, 8765)
    name = os.fsencode(j("")) + b"caf\xe9-latin1"
    with open(name, "wb") as f:
        f.write(b"not utf-8\n")
    # xattrs: small ones in the inode, a large one in an xattr block (1 KiB
    # blocks below 512 MiB: 900 bytes fit one), on a
    # symlink (trusted.* may be set there), a binary value.
    run("setfattr", "-n", "user.comment", "-v", "hello", j("etc", "hostname"))
    run("setfattr", "-n", "user.binary", "-v", "0x00ff10ab", j("etc", "hostname"))
    run("setfattr", "-n", "trusted.big", "-v", "x" * 900, j("etc", "random.bin"))
    run("setfattr", "-n", "security.label", "-v", "system_u:object_r:etc_t", j("etc"))
    run("setfattr", "-h", "-n", "trusted.on-link", "-v", "yes", j("fast-link"))
    # Times to the nanosecond, before the epoch and past 2038 too.
    run("touch", "-d", "2001-02-03 04:05:06.123456789", j("etc", "hostname"))
    run("touch", "-a", "-d", "1965-05-05 05:05:05.500000001", j("empty"))
    run("touch", "-m", "-d", "2100-01-01 00:00:00.999999999", j("empty"))
    run("touch", "-h", "-d", "2010-10-10 10:10:10.101010101", j("slow-link"))
    run("touch", "-d", "1999-12-31 23:59:59.000000001", j("dev"))


@pytest.mark.parametrize("inode_size", ["256", "128"])
def test_every_file_of_a_kernel_tree_reads_as_the_kernel_sees_it(tmp, inode_size):
    need_root()
    img = mke2fs(os.path.join(tmp, "k.img"), "96M", "-I", inode_size)
    with mounted(img) as mnt:
        make_tree(mnt)
        run("sync")
        want = kernel_view(mnt)
    assert len(want) > 400
    if inode_size == "128":
        # No room for i_crtime: no birth time, from either side.
        assert all(e["birth_ns"] is None for e in want.values())
    else:
        assert all(e["birth_ns"] is not None for e in want.values())
    with ext4kit.open(img) as fs:
        got = ext4kit_view(fs)
        # The bytes name came back as bytes; a str path gives str names,
        # the undecodable byte as a surrogate (os.fsdecode's way).
        assert b"caf\xe9-latin1" in fs.listdir(b"/")
        assert os.fsdecode(b"caf\xe9-latin1") in fs.listdir("/")
        assert fs.read(os.fsdecode(b"/caf\xe9-latin1")) == b"not utf-8\n"
    assert_views_equal(want, got)


def test_stat_follows_symlinks_and_lstat_does_not(tmp):
    need_root()
    img = mke2fs(os.path.join(tmp, "k.img"), "32M")
    with mounted(img) as mnt:
        make_tree(mnt)
        st_follow = os.stat(os.path.join(mnt, "fast-link"))
        st_link = os.lstat(os.path.join(mnt, "fast-link"))
    with ext4kit.open(img) as fs:
        assert fs.stat("/fast-link").st_ino == st_follow.st_ino
        assert fs.stat("/fast-link", follow_symlinks=False).st_ino == st_link.st_ino
        assert stat.S_ISLNK(fs.lstat("/fast-link").st_mode)
        assert fs.readlink("/fast-link") == "etc/hostname"
        assert fs.readlink(b"/fast-link") == b"etc/hostname"
        e = {d.name: d for d in fs.scandir("/")}
        assert e["fast-link"].is_symlink() and e["fast-link"].is_file()
        assert not e["fast-link"].is_file(follow_symlinks=False)
        assert e["etc"].is_dir() and e["etc"].inode() == fs.stat("/etc").st_ino
        assert e["dev"].path == "/dev"
        # walk: a tree as os.walk gives it, top-down, pruning honoured.
        seen = []
        for dirpath, dirnames, _ in fs.walk("/"):
            seen.append(dirpath)
            if "many" in dirnames:
                dirnames.remove("many")
        assert "/many" not in seen and "/etc" in seen and "/modes/sticky" in seen
        bottom_up = [d for d, _, _ in fs.walk("/", topdown=False)]
        assert bottom_up[-1] == "/" and bottom_up.index("/modes/sticky") < bottom_up.index("/modes")
