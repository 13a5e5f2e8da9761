"""One filesystem, several threads: every read returns the right data
while others run (the engine is thread-safe and each call releases the
GIL)."""

from __future__ import annotations

import hashlib
import io
import os
import threading

import ext4kit
from conftest import mke2fs


def test_two_threads_reading_at_once_get_their_own_data(tmp):
    img = mke2fs(os.path.join(tmp, "t.img"), "64M")
    data = {f"/f{i}": os.urandom(6 * 1024 * 1024 + i) for i in range(2)}
    with ext4kit.open(img, writable=True) as fs:
        for p, d in data.items():
            fs.write(p, d)
    want = {p: hashlib.sha256(d).hexdigest() for p, d in data.items()}

    for source in (img, None):
        image = img if source else io.BytesIO(open(img, "rb").read())
        with ext4kit.open(image) as fs:
            errors: list[BaseException] = []
            start = threading.Barrier(2)

            def reader(path: str) -> None:
                try:
                    start.wait()
                    for _ in range(4):
                        with fs.open(path) as f:
                            h = hashlib.sha256()
                            while chunk := f.read(256 * 1024):
                                h.update(chunk)
                        assert h.hexdigest() == want[path], path
                        st = fs.stat(path)
                        assert st.st_size == len(data[path])
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            threads = [threading.Thread(target=reader, args=(p,)) for p in data]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors


def test_threads_sharing_one_file_with_pread(tmp):
    img = mke2fs(os.path.join(tmp, "t.img"), "32M")
    blob = os.urandom(4 * 1024 * 1024)
    with ext4kit.open(img, writable=True) as fs:
        fs.write("/blob", blob)
    with ext4kit.open(img) as fs, fs.open("/blob") as f:
        errors: list[BaseException] = []

        def worker(k: int) -> None:
            try:
                for off in range(k * 4096, len(blob), 8 * 4096):
                    assert f.pread(4096, off) == blob[off : off + 4096]
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
