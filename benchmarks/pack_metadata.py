"""Metadata cost of packing per buffer (issue 17, item 2): etcd round trips and pack time.

Not a registered benchmark (B12 is the scaling benchmark): a probe, run by hand::

    PYTHONPATH=$PWD python -m benchmarks.pack_metadata [--rows 262144] [--repeats 3]

Source: ``{"x": x, "y": y}`` with x float32 (rows, 32) and y int labels in [0, 10), Dask
arrays of 32 partitions generated on the workers. Two rows, alternating, on one 2-worker
LocalCluster: the default buffer size (2 buffers, one per worker) and ``buffer_size`` set for
64 buffers. For each run it reports the wall time of ``training_preprocessor`` and the etcd
requests the vineyardds made during it, read from etcd's own Prometheus counters
(``grpc_server_handled_total`` by method; a lock or unlock is a request of the
``v3lockpb.Lock`` service), so nothing in dvml or vineyard is instrumented.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
import urllib.request
from collections import Counter
from typing import Any

CLASSES = 10


def etcd_requests(endpoint: str) -> Counter[str]:
    """Handled gRPC requests by method, from etcd's /metrics."""
    text = urllib.request.urlopen(f"{endpoint}/metrics", timeout=10).read().decode()
    counts: Counter[str] = Counter()
    pattern = re.compile(r"^grpc_server_handled_total\{([^}]*)\} (\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("grpc_type") != "unary":
            continue
        counts[labels["grpc_method"]] += int(float(m.group(2)))
    return counts


def _source(rows: int, parts: int) -> dict[str, Any]:
    import dask.array as da
    import numpy as np

    chunk = rows // parts
    x = da.random.default_rng(0).random((rows, 32), dtype=np.float32, chunks=(chunk, -1))
    y = da.random.default_rng(1).integers(0, CLASSES, size=rows, chunks=chunk)
    return {"x": x, "y": y}


def main(argv: list[str] | None = None) -> int:
    import dvml

    parser = argparse.ArgumentParser(prog="python -m benchmarks.pack_metadata")
    parser.add_argument("--rows", type=int, default=1 << 18)
    parser.add_argument("--parts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows = args.rows
    rows_64 = -(-rows // 64)
    with dvml.LocalCluster(n_workers=2, vineyard_memory="256MiB", set_as_default=False) as cluster:
        client = cluster.client
        src = _source(rows, args.parts)
        sides = {"2 buffers": None, "64 buffers": rows_64}
        times: dict[str, list[float]] = {k: [] for k in sides}
        calls: dict[str, Counter[str]] = {}
        buffers: dict[str, int] = {}
        for repeat in range(args.repeats + 1):  # the first round is a warm-up, untimed
            for side, size in sides.items():
                before = etcd_requests(cluster.etcd_endpoint)
                start = time.perf_counter()
                ds = dvml.training_preprocessor(
                    src, y="y", x="x", buffer_size=size, name="meta_probe", overwrite=True,
                    client=client,
                )  # fmt: skip
                elapsed = time.perf_counter() - start
                after = etcd_requests(cluster.etcd_endpoint)
                buffers[side] = len(ds.layout["buffers"])
                ds.drop(client)
                if repeat == 0:
                    continue
                times[side].append(elapsed)
                calls[side] = Counter({k: after[k] - before[k] for k in after
                                       if after[k] - before[k]})  # fmt: skip
        print(f"rows={rows} parts={args.parts} repeats={args.repeats}")
        for side in sides:
            total = sum(calls[side].values())
            runs = ", ".join(f"{t:.3f}" for t in times[side])
            median = statistics.median(times[side])
            per_buffer = total / buffers[side]
            print(
                f"{side:>10}: buffers={buffers[side]:3d} median {median:.3f} s (runs {runs}); "
                f"etcd requests in the last run {total} ({per_buffer:.1f} per buffer): "
                f"{dict(sorted(calls[side].items()))}"
            )
        ratio = statistics.median(times["64 buffers"]) / statistics.median(times["2 buffers"])
        print(f"64 buffers / 2 buffers: {ratio:.2f}x (target <= 1.3)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
