#!/usr/bin/env python3
"""Images per second of ext4kit.fleet against the number of Dask workers.

Makes ``--images`` small root-filesystem images (ext4kit.build from
generated trees: /etc, /usr/lib with shared objects, /var/lib/dpkg/status,
a log, a few thousand entries in all), then inventories all of them
``--rounds`` times each way, rounds interleaved so the drift of a shared
machine hits every way alike:

- ``loop``: ``fleet.scan(images, out)`` in this process, no Dask;
- ``dask-N``: the same on a ``LocalCluster`` of N worker processes of one
  thread each (started, and the package imported in each worker, before
  the clock, as in a running cluster), for each N of ``--workers``.

Every way writes its Parquet file and the files are checked equal. It
prints the median round's images/s, each way's ratio to the loop and to
one worker, the fastest round's images/s (the least disturbed by other
load on a shared machine), and the core count and load average (workers
past the cores only share them).

    PYTHONPATH=... python3 crates/python/bench/fleet_bench.py --images 40 --rounds 3

Needs ``ext4kit`` with its ``fleet`` extra (``dask[distributed]``,
``pyarrow``) importable.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time


def make_tree(root: str, i: int, files: int) -> None:
    rng = random.Random(i)
    for d in ("etc/ssh", "etc/default", "usr/lib/x86_64-linux-gnu", "usr/share/doc", "var/log", "var/lib/dpkg"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for k in range(files // 10):
        with open(os.path.join(root, f"etc/default/conf{k}"), "wb") as f:
            f.write(rng.randbytes(rng.randrange(50, 2000)))
    for k in range(files // 10):
        with open(os.path.join(root, f"usr/lib/x86_64-linux-gnu/lib{k}.so.1"), "wb") as f:
            f.write(rng.randbytes(rng.randrange(2000, 30_000)))
    for k in range(files - 2 * (files // 10)):
        d = os.path.join(root, f"usr/share/doc/pkg{k % 97}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{k}"), "wb") as f:
            f.write(rng.randbytes(rng.randrange(0, 800)))
    with open(os.path.join(root, "var/lib/dpkg/status"), "w") as f:
        for k in range(200):
            f.write(f"Package: p{k}\nStatus: install ok installed\nVersion: {k}.0\nArchitecture: amd64\n\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=40, help="images in the fleet (default 40)")
    ap.add_argument("--files", type=int, default=1500, help="files per image (default 1500)")
    ap.add_argument("--workers", default="1,2", help="worker counts to run, comma-separated (default 1,2)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every way (default 3)")
    ap.add_argument("--dir", help="where the images go (default: a temporary directory, removed after)")
    args = ap.parse_args()

    import ext4kit
    import pyarrow.parquet as pq
    from dask.distributed import Client, LocalCluster

    from ext4kit import fleet

    logging.getLogger("distributed").setLevel(logging.WARNING)
    counts = [int(n) for n in args.workers.split(",")]
    base = args.dir or tempfile.mkdtemp(prefix="ext4kit-fleet-bench-")
    os.makedirs(base, exist_ok=True)
    hash_pattern = ["/etc/*", "*.so*"]
    try:
        images = []
        t0 = time.monotonic()
        for i in range(args.images):
            tree = os.path.join(base, f"tree{i}")
            make_tree(tree, i, args.files)
            img = os.path.join(base, f"img{i:03d}.img")
            ext4kit.build(img, [tree], all_root=True, free="10%", timestamp=1_700_000_000)
            shutil.rmtree(tree)
            images.append(img)
        size = sum(os.path.getsize(p) for p in images)
        print(f"{len(images)} images, {args.files} files each, {size / 2**20:.0f} MiB in all, made in {time.monotonic() - t0:.1f} s", flush=True)

        clusters = {}
        for n in counts:
            cluster = LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0", silence_logs=logging.WARNING
            )
            client = Client(cluster)
            client.wait_for_workers(n)
            # Warm, as a cluster in service is: every worker has imported
            # the package and pyarrow (half a second each) before the clock.
            client.run(lambda: __import__("ext4kit.fleet"))
            clusters[n] = (cluster, client)
        ways = [("loop", None)] + [(f"dask-{n}", clusters[n][1]) for n in counts]
        times: dict[str, list[float]] = {name: [] for name, _ in ways}
        ref = None
        for r in range(args.rounds):
            for name, client in ways:
                out = os.path.join(base, f"{name}.parquet")
                t = time.monotonic()
                s = fleet.scan(images, out, client=client, hash_pattern=hash_pattern)
                times[name].append(time.monotonic() - t)
                table = pq.read_table(out)
                if ref is None:
                    ref = table
                    print(f"{s.rows} rows per scan, {s.images_with_errors} images with errors", flush=True)
                elif not table.equals(ref):
                    print(f"{name}: the inventory differs from the first scan's", file=sys.stderr)
                    return 1
                print(f"round {r + 1} {name}: {times[name][-1]:.2f} s", flush=True)
        for cluster, client in clusters.values():
            client.close()
            cluster.close()

        rate = {name: len(images) / statistics.median(ts) for name, ts in times.items()}
        best = {name: len(images) / min(ts) for name, ts in times.items()}
        one = rate.get("dask-1")
        load = os.getloadavg()[0]
        print(f"\n{os.cpu_count()} cores, load average {load:.1f}; {args.rounds} rounds; page cache warm after the first")
        print(f"{'way':<8} {'images/s':>9} {'÷ loop':>7} {'÷ 1 worker':>11} {'best round':>11}")
        for name, _ in ways:
            per_one = f"{rate[name] / one:.2f}" if one and name.startswith("dask") else "-"
            print(f"{name:<8} {rate[name]:>9.2f} {rate[name] / rate['loop']:>7.2f} {per_one:>11} {best[name]:>11.2f}")
        print("(images/s: the median round's; best round: the fastest round's images/s)")
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
