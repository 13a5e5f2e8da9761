"""ext4kit.fleet: many images inventoried on a Dask cluster.

The images are made by e2fsprogs (`mke2fs -d`) from trees generated
here; the oracles are the host trees themselves (lstat, readlink,
hashlib), `dpkg-query` on the dpkg status files and `rpm -qa` on the rpm
database (one written by rpm itself, `rpm --rebuilddb`, from headers made
here). The acceptance: a real Dask cluster (`LocalCluster`, two worker
processes) writes the same Parquet inventory as a plain loop.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import random
import shutil
import sqlite3
import stat
import struct
import subprocess
import sys
import threading
import types

import pytest

from conftest import need, run

N_IMAGES = 20
HASH = ["/etc/*", "*.bin"]
# Which generated images carry what.
DPKG = {i for i in range(N_IMAGES) if i % 2 == 0}
RPM = 7
NON_UTF8 = 3


def _fleet():
    """The module under test; its dependencies are the `fleet` extra."""
    try:
        import dask.distributed  # noqa: F401
        import pyarrow  # noqa: F401

        from ext4kit import fleet
    except ImportError as e:
        pytest.fail(f"ext4kit.fleet's dependencies are missing ({e}): pip install 'dask[distributed]' pyarrow (.ci/run installs them)")
    return fleet


# --- rpm headers, made by hand -------------------------------------------

RPM_INT32, RPM_STRING, RPM_BIN = 4, 6, 7


def rpm_header(tags: list[tuple[int, int, object]]) -> bytes:
    """An rpm header blob as rpm keeps it in its database: counts, index
    entries, data; an immutable region (tag 63) first, whose trailer at
    the data's end points back over all the entries, as rpm's header.c
    checks. ``tags`` in tag order: (tag, type, value)."""
    entries, data = [], b""
    for tag, typ, value in tags:
        if typ == RPM_INT32:
            data += b"\0" * (-len(data) % 4)
            entries.append((tag, typ, len(data), 1))
            data += struct.pack(">I", value)
        else:
            entries.append((tag, typ, len(data), 1))
            data += str(value).encode() + b"\0"
    il = len(entries) + 1
    entries.insert(0, (63, RPM_BIN, len(data), 16))
    data += struct.pack(">iiiI", 63, RPM_BIN, -il * 16, 16)
    index = b"".join(struct.pack(">iIiI", *e) for e in entries)
    return struct.pack(">II", il, len(data)) + index + data


def rpm_package(name, version, release, epoch, arch) -> bytes:
    tags = [(1000, RPM_STRING, name), (1001, RPM_STRING, version), (1002, RPM_STRING, release)]
    if epoch is not None:
        tags.append((1003, RPM_INT32, epoch))
    # rpm --rebuilddb drops a header without a build time (1006).
    tags.append((1006, RPM_INT32, 1_700_000_000))
    if arch is not None:
        tags.append((1022, RPM_STRING, arch))
    return rpm_header(tags)


RPM_PACKAGES = [
    ("bash", "5.2.26", "1.fc40", None, "x86_64"),
    ("openssl-libs", "3.2.1", "2.fc40", 1, "x86_64"),
    ("tzdata", "2024a", "5.fc40", None, "noarch"),
    ("gpg-pubkey", "a15b79cc", "63d04c2c", None, None),  # a key: no arch
]


def rpm_sqlite(path: str, blobs: list[bytes]) -> None:
    """The Packages table as rpm's sqlite backend declares it."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE Packages (hnum INTEGER PRIMARY KEY AUTOINCREMENT, blob BLOB NOT NULL)")
    con.executemany("INSERT INTO Packages (blob) VALUES (?)", [(b,) for b in blobs])
    con.commit()
    con.close()


def rpm_oracle(dbdir: str) -> list[tuple[str, str, str]]:
    """What rpm itself lists in the database directory `dbdir`."""
    need("rpm")
    out = run(
        "rpm", "--dbpath", os.path.abspath(dbdir), "-qa",
        "--qf", "%{NAME}\\t%|EPOCH?{%{EPOCH}:}|%{VERSION}-%{RELEASE}\\t%|ARCH?{%{ARCH}}|\\n",
    ).stdout.decode()
    return sorted(tuple(line.split("\t")) for line in out.splitlines())


# --- dpkg status ---------------------------------------------------------


def dpkg_status(rng: random.Random, n: int) -> str:
    stanzas = []
    states = ["install ok installed"] * 4 + ["deinstall ok config-files", "install ok half-installed"]
    for k in range(n):
        stanzas.append(
            f"Package: pkg{k}-{rng.randrange(1000)}\n"
            f"Status: {rng.choice(states)}\n"
            "Priority: optional\n"
            "Maintainer: Someone <someone@example.org>\n"
            f"Architecture: {rng.choice(['amd64', 'all', 'arm64'])}\n"
            f"Version: {rng.choice(['', '1:'])}{rng.randrange(10)}.{rng.randrange(10)}-{rng.randrange(5)}\n"
            "Conffiles:\n /etc/pkg.conf 0123456789abcdef0123456789abcdef\n"
            "Description: a package\n a long description\n .\n more of it\n"
        )
    return "\n".join(stanzas)


def dpkg_oracle(status_file: str) -> list[tuple[str, str, str]]:
    """What dpkg-query lists as installed from that status file."""
    need("dpkg-query")
    adm = os.path.dirname(status_file)
    out = subprocess.run(
        ["dpkg-query", f"--admindir={adm}", "-W", "-f", "${Package}\\t${Version}\\t${Architecture}\\t${db:Status-Status}\\n"],
        check=True, capture_output=True,
    ).stdout.decode()
    rows = [line.split("\t") for line in out.splitlines()]
    return sorted((p, v, a) for p, v, a, s in rows if s == "installed")


# --- the fleet -----------------------------------------------------------


def make_tree(root: str, i: int) -> None:
    """A small root filesystem, different for each `i`: every file type,
    set-id bits, owners past 65535 (as root), a hard link, symlinks (one
    dangling), a name that is not UTF-8 in one image, packages in some."""
    rng = random.Random(1000 + i)
    for d in ("etc/app", "srv/data", "usr/bin", "run", "var/log", f"home/u{i}"):
        os.makedirs(os.path.join(root, d))
    with open(os.path.join(root, "etc/hostname"), "w") as f:
        f.write(f"host-{i}\n")
    with open(os.path.join(root, "etc/os-release"), "w") as f:
        f.write(f'ID=fleet\nVERSION_ID="{i}"\n')
    for k in range(rng.randrange(2, 6)):
        with open(os.path.join(root, f"etc/app/c{k}.conf"), "wb") as f:
            f.write(rng.randbytes(rng.randrange(0, 5000)))
    for k in range(rng.randrange(3, 8)):
        with open(os.path.join(root, f"srv/data/blob{k}.bin"), "wb") as f:
            f.write(rng.randbytes(rng.choice([0, 1, 4095, 4096, 70_000])))
    with open(os.path.join(root, "var/log/messages"), "wb") as f:
        f.write(rng.randbytes(rng.randrange(100, 20_000)))
    tool = os.path.join(root, "usr/bin/tool")
    with open(tool, "wb") as f:
        f.write(b"\x7fELF" + rng.randbytes(300))
    os.chmod(tool, 0o4755)
    os.chmod(os.path.join(root, f"home/u{i}"), 0o700)
    os.chmod(os.path.join(root, "srv/data"), 0o2775 if i % 3 else 0o1777)
    os.link(os.path.join(root, "srv/data/blob0.bin"), os.path.join(root, "srv/data/hard.bin"))
    os.symlink("/usr/share/zoneinfo/UTC", os.path.join(root, "etc/localtime"))
    os.symlink("data/blob1.bin", os.path.join(root, "srv/current"))
    os.mkfifo(os.path.join(root, "run/initctl"))
    if os.geteuid() == 0:
        os.chown(os.path.join(root, f"home/u{i}"), 1000 + i, 100_000 + i)
        os.chown(os.path.join(root, "var/log/messages"), 0, 4)
    if i == NON_UTF8:
        with open(os.path.join(os.fsencode(root), b"srv/caf\xe9.txt"), "wb") as f:
            f.write(b"latin-1 name\n")
    if i in DPKG:
        os.makedirs(os.path.join(root, "var/lib/dpkg"))
        with open(os.path.join(root, "var/lib/dpkg/status"), "w") as f:
            f.write(dpkg_status(rng, rng.randrange(3, 12)))
    if i == RPM:
        # The database as rpm writes it: headers made here, rebuilt by
        # rpm into its own rpmdb.sqlite (rpm drops what it finds bad);
        # /var/lib/rpm is the compatibility symlink Fedora ships.
        need("rpm")
        db = os.path.join(root, "usr/lib/sysimage/rpm")
        os.makedirs(db)
        rpm_sqlite(os.path.join(db, "rpmdb.sqlite"), [rpm_package(*p) for p in RPM_PACKAGES])
        run("rpm", "--dbpath", db, "--rebuilddb")
        os.makedirs(os.path.join(root, "var/lib"), exist_ok=True)
        os.symlink("../../usr/lib/sysimage/rpm", os.path.join(root, "var/lib/rpm"))
    # Times after the last change to each directory: seconds apart, some
    # before 1970 (mke2fs -d keeps whole seconds).
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames + dirnames:
            p = os.path.join(dirpath, name)
            t = rng.randrange(-200_000_000, 2_000_000_000) * 1_000_000_000
            os.utime(p, ns=(t, t), follow_symlinks=False)


def mkfs(tree: str, image: str) -> str:
    need("mke2fs")
    run("mke2fs", "-q", "-F", "-t", "ext4", "-b", "1024", "-N", "256", "-d", tree, image, "4M")
    return image


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory):
    """N_IMAGES images and the trees they were made from."""
    base = tmp_path_factory.mktemp("fleet")
    images = []
    for i in range(N_IMAGES):
        tree = str(base / f"tree{i:02d}")
        os.mkdir(tree)
        make_tree(tree, i)
        images.append(mkfs(tree, str(base / f"img{i:02d}.img")))
    return str(base), images


@pytest.fixture(scope="module")
def client():
    """A real Dask cluster on this machine: a scheduler and two worker
    processes of one thread each, the package imported in each."""
    _fleet()
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address="127.0.0.1:0")
    c = Client(cluster)
    c.wait_for_workers(2)
    yield c
    c.close()
    cluster.close()


def host_view(tree: str) -> dict[bytes, os.stat_result]:
    out = {}
    broot = os.fsencode(tree)
    for dirpath, dirnames, filenames in os.walk(broot):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            out[b"/" + os.path.relpath(p, broot)] = os.lstat(p)
    return out


def rows_by_path(table, record="entry") -> dict[bytes, dict]:
    out = {}
    for r in table.to_pylist():
        if r["record"] == record:
            key = r["path_bytes"] if r["path_bytes"] is not None else r["path"].encode()
            assert key not in out, f"{key!r} twice"
            out[key] = r
    return out


# --- packages: the parsers alone ------------------------------------------


def test_dpkg_status_parser_follows_deb_control():
    from ext4kit import packages

    text = (
        b"Package: a\nStatus: install ok installed\nVersion: 1:2.0-1\nArchitecture: amd64\n"
        b"Description: x\n long\n .\n more\n\n\n"
        b"Package: b\nStatus: deinstall ok config-files\nVersion: 1\n\n"
        b"Package: c\nStatus: install ok half-installed\nVersion: 1\n\n"
        b"Package: d\nVersion: 3\nStatus: install ok installed\n"
    )
    got = [(p.name, p.version, p.arch) for p in packages.dpkg_status(text)]
    assert got == [("a", "1:2.0-1", "amd64"), ("d", "3", "")]
    with pytest.raises(packages.PackageDbError, match="line 4 has no Package"):
        packages.dpkg_status(b"Package: a\nStatus: install ok installed\n\nVersion: 1\nStatus: install ok installed\n")
    with pytest.raises(packages.PackageDbError, match="line 1: a continuation"):
        packages.dpkg_status(b" orphan\n")


def test_rpm_header_parser_checks_bounds():
    from ext4kit import packages

    blob = rpm_package("zlib", "1.3", "4.fc40", 2, "x86_64")
    h = packages.rpm_header(blob)
    assert h == {1000: "zlib", 1001: "1.3", 1002: "4.fc40", 1003: 2, 1022: "x86_64"}
    il, dl = struct.unpack_from(">II", blob)
    bad = {
        "short": blob[:6],
        "truncated data": blob[:-1],
        "huge counts": struct.pack(">II", 0x10000, 8) + blob[8:],
        # The name's offset (entry 1) pointed past the data.
        "offset": blob[:8 + 16 + 8] + struct.pack(">i", dl + 5) + blob[8 + 16 + 12:],
        # The name's type made an INT32.
        "type": blob[:8 + 16 + 4] + struct.pack(">I", 4) + blob[8 + 16 + 8:],
        # The data ends inside the arch string (no NUL before the end).
        "no NUL": struct.pack(">II", il, dl - 17) + blob[8:8 + 16 * il] + blob[8 + 16 * il:-17],
    }
    for what, b in bad.items():
        with pytest.raises(packages.PackageDbError):
            packages.rpm_header(b)
            pytest.fail(f"{what}: accepted")


# --- one image: the inventory against the trees ---------------------------


def test_inventory_matches_the_source_trees(fleet_dir):
    """Each image's rows against the tree it was made from, field by
    field, and its packages against dpkg-query and rpm."""
    fleet = _fleet()
    base, images = fleet_dir
    for i, image in enumerate(images):
        tree = os.path.join(base, f"tree{i:02d}")
        t = fleet.inventory(image, hash_pattern=HASH)
        assert t.schema == fleet.SCHEMA
        assert set(t.column("image").to_pylist()) == {image}
        errors = [r for r in t.to_pylist() if r["error"] is not None]
        assert not errors, f"{image}: {errors}"
        rows = rows_by_path(t)
        host = host_view(tree)
        assert set(rows) == set(host) | {b"/", b"/lost+found"}, image
        for p, st in host.items():
            r = rows[p]
            what = f"{image} {p!r}"
            kind = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink", stat.S_IFIFO: "fifo"}
            assert r["type"] == kind[stat.S_IFMT(st.st_mode)], what
            assert r["mode"] == stat.S_IMODE(st.st_mode), what
            assert (r["uid"], r["gid"]) == (st.st_uid, st.st_gid), what
            assert r["mtime_ns"] == st.st_mtime_ns // 10**9 * 10**9, what
            assert r["atime_ns"] is not None and r["ctime_ns"] is not None and r["birth_ns"] is not None, what
            if r["type"] != "dir":
                assert r["size"] == st.st_size, what
                assert r["nlink"] == st.st_nlink, what
            host_path = os.path.join(os.fsencode(tree), p[1:])
            if r["type"] == "symlink":
                assert r["target"] == os.readlink(host_path).decode(), what
            else:
                assert r["target"] is None, what
            path = p.decode("utf-8", errors="backslashreplace")
            hashed = r["type"] == "file" and (path.startswith("/etc/") or path.endswith(".bin"))
            if hashed:
                with open(host_path, "rb") as f:
                    assert r["sha256"] == hashlib.sha256(f.read()).hexdigest(), what
            else:
                assert r["sha256"] is None, what
            assert r["path_bytes"] == (p if i == NON_UTF8 and b"\xe9" in p else None), what
        # Hard links: one inode, two names.
        assert rows[b"/srv/data/hard.bin"]["ino"] == rows[b"/srv/data/blob0.bin"]["ino"]
        pkgs = sorted((r["package"], r["version"], r["arch"] or "") for r in t.to_pylist() if r["record"] == "package")
        managers = {r["type"] for r in t.to_pylist() if r["record"] == "package"}
        if i in DPKG:
            want = dpkg_oracle(os.path.join(tree, "var/lib/dpkg/status"))
            assert want, "the generated status has installed packages"
            assert pkgs == want and managers == {"dpkg"}, image
        elif i == RPM:
            want = rpm_oracle(os.path.join(tree, "usr/lib/sysimage/rpm"))
            assert len(want) == len(RPM_PACKAGES), want
            assert pkgs == want and managers == {"rpm"}, image
            paths = {r["path"] for r in t.to_pylist() if r["record"] == "package"}
            assert paths == {"/usr/lib/sysimage/rpm/rpmdb.sqlite"}
        else:
            assert pkgs == [], image


def test_rpmdb_rows_only_in_the_write_ahead_log(tmp):
    """rpm keeps its sqlite database in WAL mode: rows committed but not
    yet checkpointed live in rpmdb.sqlite-wal, and are installed all the
    same."""
    fleet = _fleet()
    tree = os.path.join(tmp, "tree")
    db = os.path.join(tree, "var/lib/rpm")
    os.makedirs(db)
    live = os.path.join(tmp, "live.sqlite")
    con = sqlite3.connect(live)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute("CREATE TABLE Packages (hnum INTEGER PRIMARY KEY AUTOINCREMENT, blob BLOB NOT NULL)")
    con.execute("INSERT INTO Packages (blob) VALUES (?)", (rpm_package("first", "1", "1", None, "noarch"),))
    con.commit()
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("INSERT INTO Packages (blob) VALUES (?)", (rpm_package("second", "2", "1", 3, "x86_64"),))
    con.commit()
    # Copied while the connection holds the log, as a crash would leave them.
    shutil.copyfile(live, os.path.join(db, "rpmdb.sqlite"))
    shutil.copyfile(live + "-wal", os.path.join(db, "rpmdb.sqlite-wal"))
    assert os.path.getsize(os.path.join(db, "rpmdb.sqlite-wal")) > 0
    con.close()
    image = mkfs(tree, os.path.join(tmp, "wal.img"))
    t = fleet.inventory(image)
    pkgs = [(r["package"], r["version"]) for r in t.to_pylist() if r["record"] == "package"]
    assert pkgs == [("first", "1-1"), ("second", "3:2-1")]


def test_an_old_rpm_database_is_reported_not_skipped(tmp):
    """A Berkeley DB `Packages` (rpm up to 4.15) is not read: an error row
    says so, where a silent empty list would claim no packages."""
    fleet = _fleet()
    tree = os.path.join(tmp, "tree")
    os.makedirs(os.path.join(tree, "var/lib/rpm"))
    with open(os.path.join(tree, "var/lib/rpm/Packages"), "wb") as f:
        f.write(b"\0" * 12 + struct.pack("<I", 0x061561) + b"\0" * 4080)  # a hash database's magic
    t = fleet.inventory(mkfs(tree, os.path.join(tmp, "bdb.img")))
    errors = [(r["path"], r["error"]) for r in t.to_pylist() if r["record"] == "error"]
    assert len(errors) == 1 and errors[0][0] == "/var/lib/rpm/Packages", errors
    assert "format not read" in errors[0][1]
    assert not [r for r in t.to_pylist() if r["record"] == "package"]


# --- the fleet on Dask ----------------------------------------------------


def test_dask_scan_equals_the_plain_loop(fleet_dir, client, tmp):
    """The acceptance: LocalCluster(n_workers=2, processes=True) over the
    20 images writes the same Parquet inventory as a plain loop, and the
    work was done in the worker processes."""
    fleet = _fleet()
    import pyarrow.parquet as pq

    base, images = fleet_dir
    assert len(images) == 20
    loop_out, dask_out = os.path.join(tmp, "loop.parquet"), os.path.join(tmp, "dask.parquet")
    s_loop = fleet.scan(images, loop_out, hash_pattern=HASH)
    from dask.distributed import get_task_stream

    with get_task_stream(client) as ts:
        s_dask = fleet.scan(images, dask_out, client=client, hash_pattern=HASH)
    loop, dask = pq.read_table(loop_out), pq.read_table(dask_out)
    assert loop.schema == dask.schema == fleet.SCHEMA
    assert loop.num_rows > 20 * 30
    assert dask.equals(loop), "the cluster's inventory differs from the loop's"
    # Sorted too, as an inventory compared without regard to order.
    keys = [("image", "ascending"), ("record", "ascending"), ("path", "ascending"), ("package", "ascending")]
    assert dask.sort_by(keys).equals(loop.sort_by(keys))
    assert (s_loop.images, s_loop.rows, s_loop.images_with_errors) == (20, loop.num_rows, 0)
    assert (s_dask.images, s_dask.rows, s_dask.images_with_errors) == (20, dask.num_rows, 0)
    # Every image in the file, in the order given.
    order = list(dict.fromkeys(dask.column("image").to_pylist()))
    assert order == images
    # One task per image, run in the two worker processes (not here).
    tasks = [t for t in ts.data if t["key"].startswith("inventory-")]
    assert len(tasks) == 20, [t["key"] for t in ts.data]
    workers = client.run(os.getpid)
    assert len(set(workers.values())) == 2 and os.getpid() not in workers.values()
    assert {t["worker"] for t in tasks} <= set(workers)


def test_a_bad_image_is_an_error_row_not_a_failed_scan(fleet_dir, client, tmp):
    fleet = _fleet()
    base, images = fleet_dir
    junk = os.path.join(tmp, "junk.img")
    with open(junk, "wb") as f:
        f.write(random.Random(5).randbytes(1 << 20))
    truncated = os.path.join(tmp, "truncated.img")
    with open(images[0], "rb") as src, open(truncated, "wb") as dst:
        dst.write(src.read(40 << 10))  # the superblock, not the inode tables
    missing = os.path.join(tmp, "missing.img")
    tree = os.path.join(tmp, "tree")
    os.makedirs(os.path.join(tree, "var/lib/dpkg"))
    with open(os.path.join(tree, "var/lib/dpkg/status"), "w") as f:
        f.write("Package: ok\nStatus: install ok installed\nVersion: 1\n\nVersion: 2\n")
    bad_dpkg = mkfs(tree, os.path.join(tmp, "bad-dpkg.img"))
    listed = [images[1], junk, truncated, missing, bad_dpkg, images[2]]
    t = fleet.scan(listed, client=client)
    by_image = {img: [r for r in t.to_pylist() if r["image"] == img] for img in listed}
    for img in (junk, missing):
        rows = by_image[img]
        assert len(rows) == 1 and rows[0]["record"] == "error" and rows[0]["path"] is None, rows
        assert "opening the image" in rows[0]["error"]
    assert "No such file" in by_image[missing][0]["error"]
    errs = [r for r in by_image[truncated] if r["error"] is not None]
    assert errs, "a truncated image reads without an error"
    errs = [r for r in by_image[bad_dpkg] if r["record"] == "error"]
    assert len(errs) == 1 and errs[0]["path"] == "/var/lib/dpkg/status", errs
    assert "has no Package field" in errs[0]["error"]
    assert rows_by_path(fleet.inventory(bad_dpkg)).keys() == {
        r["path"].encode() for r in by_image[bad_dpkg] if r["record"] == "entry"
    }
    assert any(r["path"] == "/var/lib/dpkg/status" for r in by_image[bad_dpkg] if r["record"] == "entry")
    # The good images around them are whole.
    for img in (images[1], images[2]):
        assert by_image[img] == fleet.inventory(img).to_pylist()


def test_damaged_parts_are_error_rows_beside_the_rest(tmp):
    """Inside one image: a directory whose block debugfs zeroed is an
    error row and the walk goes on; a time past 2262 (debugfs sets the
    epoch bits: 2400) and a size past 2**63 leave that column null and
    say so in the entry's error."""
    fleet = _fleet()
    need("debugfs")
    tree = os.path.join(tmp, "tree")
    for d in ("d/sub", "e"):
        os.makedirs(os.path.join(tree, d))
    for f in ("d/f", "e/g", "e/h"):
        with open(os.path.join(tree, f), "w") as fh:
            fh.write(f)
    image = mkfs(tree, os.path.join(tmp, "damaged.img"))
    run("debugfs", "-w", "-R", "zap_block -f /d 0", image)
    run("debugfs", "-w", "-R", "set_inode_field /e/g mtime 24000101000000", image)
    run("debugfs", "-w", "-R", "set_inode_field /e/h size 0x8000000000000010", image)
    s = fleet.scan([image], os.path.join(tmp, "out.parquet"))
    assert (s.images, s.images_with_errors) == (1, 1)
    import pyarrow.parquet as pq

    rows = pq.read_table(os.path.join(tmp, "out.parquet")).to_pylist()
    errors = [r for r in rows if r["record"] == "error"]
    assert [r["path"] for r in errors] == ["/d"], errors
    assert "listing the directory" in errors[0]["error"] and "corrupt" in errors[0]["error"]
    entries = rows_by_path(pq.read_table(os.path.join(tmp, "out.parquet")))
    assert set(entries) == {b"/", b"/d", b"/e", b"/e/g", b"/e/h", b"/lost+found"}
    g = entries[b"/e/g"]
    assert g["mtime_ns"] is None and "13569465600000000000 is outside int64" in g["error"], g
    assert g["ctime_ns"] is not None and g["size"] == 3
    h = entries[b"/e/h"]
    assert h["size"] is None and h["error"] == "size 9223372036854775824 is outside int64", h
    assert h["mtime_ns"] is not None
    assert all(r["error"] is None for p, r in entries.items() if p not in (b"/e/g", b"/e/h"))


def test_a_lost_task_is_an_error_row():
    """A task whose worker died (Dask gives up with KilledWorker) is that
    image's error row; the images after it are written. A stand-in
    client: killing a worker at the right moment is no test to rely on."""
    fleet = _fleet()
    from distributed import KilledWorker

    class Done:
        def __init__(self, value=None, error=None):
            self.value, self.error, self.released = value, error, False

        def result(self):
            if self.error:
                raise self.error
            return self.value

        def release(self):
            self.released = True

    class Client:
        def __init__(self):
            self.futures = []

        def nthreads(self):
            return {"tcp://w:1": 1}

        def submit(self, fn, image, **kw):
            assert fn is fleet.inventory and kw["pure"] is False
            if image.source == "lost.img":
                f = Done(error=KilledWorker("inventory-1", types.SimpleNamespace(address="tcp://w:1"), 3))
            else:
                f = Done(value=fleet.inventory(image, hash_pattern=kw["hash_pattern"]))
            self.futures.append(f)
            return f

    c = Client()
    t = fleet.scan(["lost.img", "missing.img"], client=c)
    rows = t.to_pylist()
    assert [(r["image"], r["record"]) for r in rows] == [("lost.img", "error"), ("missing.img", "error")]
    assert rows[0]["error"].startswith("the task failed: KilledWorker")
    assert "opening the image" in rows[1]["error"]
    assert all(f.released for f in c.futures)


class RangedFiles(http.server.BaseHTTPRequestHandler):
    """Files of one directory over HTTP with byte ranges (RFC 9110
    section 14), which object stores serve and the engine reads by;
    http.server's own handler sends whole files only."""

    root = ""
    requests: list[str] = []

    def _open(self):
        p = os.path.join(self.root, os.path.basename(self.path))
        if not os.path.isfile(p):
            self.send_error(404)
            return None
        return p

    def _head(self, p, length, status=200, first=None):
        st = os.stat(p)
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", self.date_time_string(int(st.st_mtime)))
        self.send_header("ETag", f'"{st.st_ino:x}-{st.st_size:x}"')
        if first is not None:
            self.send_header("Content-Range", f"bytes {first}-{first + length - 1}/{st.st_size}")
        self.end_headers()

    def do_HEAD(self):
        self.requests.append("HEAD")
        p = self._open()
        if p:
            self._head(p, os.path.getsize(p))

    def do_GET(self):
        rng = self.headers.get("Range")
        self.requests.append(f"GET {rng}")
        p = self._open()
        if not p:
            return
        size = os.path.getsize(p)
        first, last = 0, size - 1
        if rng:
            a, _, b = rng.removeprefix("bytes=").partition("-")
            first, last = int(a), min(int(b) if b else size - 1, size - 1)
        with open(p, "rb") as f:
            f.seek(first)
            body = f.read(last - first + 1)
        self._head(p, len(body), 206 if rng else 200, first if rng else None)
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_url_images_over_http(fleet_dir, client):
    """Images named by http:// URLs: the workers read them by ranges from
    the server, and the rows are those of the same images read by path."""
    fleet = _fleet()
    base, images = fleet_dir
    RangedFiles.root = base
    RangedFiles.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangedFiles)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        picked = [images[i] for i in (0, RPM, NON_UTF8, 11)]
        urls = [f"http://127.0.0.1:{server.server_port}/{os.path.basename(p)}" for p in picked]
        by_url = fleet.scan(urls, client=client, hash_pattern=HASH)
    finally:
        server.shutdown()
        server.server_close()
    by_path = fleet.scan(picked, hash_pattern=HASH)
    assert by_url.column("error").null_count == by_url.num_rows, [e for e in by_url.column("error").to_pylist() if e]
    assert by_url.drop_columns(["image"]).equals(by_path.drop_columns(["image"]))
    assert by_url.column("image").to_pylist() == [urls[picked.index(p)] for p in by_path.column("image").to_pylist()]
    assert any(r.startswith("GET bytes=") for r in RangedFiles.requests), RangedFiles.requests


def test_command_line_against_a_running_scheduler(fleet_dir, client, tmp):
    """`python -m ext4kit.fleet --scheduler ADDRESS`: the production path,
    a client process connecting to a cluster that is already up; and
    `--workers N`, a local cluster of the command's own."""
    fleet = _fleet()
    import pyarrow.parquet as pq

    base, images = fleet_dir
    listing = os.path.join(tmp, "images.txt")
    with open(listing, "w") as f:
        f.write("\n".join(images[10:]) + "\n")
    out = os.path.join(tmp, "cli.parquet")
    r = subprocess.run(
        [sys.executable, "-m", "ext4kit.fleet", "--scheduler", client.cluster.scheduler_address, "--out", out,
         "--hash", HASH[0], "--hash", HASH[1], *images[:10], "--from-file", listing],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("20 images, "), r.stdout
    assert pq.read_table(out).equals(fleet.scan(images, hash_pattern=HASH))
    # --workers: a cluster of its own, started and closed by the command.
    r = subprocess.run(
        [sys.executable, "-m", "ext4kit.fleet", "--workers", "2", "--out", out, *images[:4]],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert pq.read_table(out).equals(fleet.scan(images[:4]))
    r = subprocess.run([sys.executable, "-m", "ext4kit.fleet", "--out", out], capture_output=True, text=True)
    assert r.returncode == 2 and "no images" in r.stderr
