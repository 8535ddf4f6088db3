"""B13: dvml.fit across two network hosts vs the same fit on one host (network namespaces).

What is measured, per repeat and side: the wall time of one :func:`dvml.fit` call (two
MultiWorkerMirroredStrategy trainers, ``num_iterations=1``), timed inside a client that runs
in the head namespace of a :class:`dvml.testing.netns.NetnsCluster`:

- dvml side ("two hosts"): two worker-host namespaces with one vineyardd and one Dask worker
  each; the trainers' gradient all-reduce crosses the bridge between the namespaces.
- baseline ("one host"): one worker-host namespace with one vineyardd and two Dask workers;
  the same two trainers talk over that host's own address.

Both clusters are started once (``prepare``, reported apart) with the ``cluster/`` recipes, and
the digits are packed onto each before the first repeat (outside the clock). The bridge is not
a real network: the ratio measures dvml's multi-host overheads (addresses, separate daemons,
veth and bridge hops), not bandwidth.

Data: scikit-learn's digits replicated as in B4 (``benchmarks.b4_end_to_end.digits_frames``):
20 copies (28752 training rows), global batch 256, 4 epochs. ``--quick``: 1 copy, 1 epoch.
Needs root (``ip netns``): without it the row reports the reason.

Target: ratio <= 1.3.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from benchmarks.harness import Benchmark, register

SIZES = {False: (20, 4), True: (1, 1)}  # quick -> (copies of the digits, epochs)
BATCH = 256
TRAIN, MODEL = "bench_b13_digits", "bench_b13_cnn"
PROTOCOL = "B13 "


def prepare(quick: bool) -> dict[str, Any]:
    from dvml.testing import netns

    reason = netns.unavailable_reason()
    if reason:
        raise RuntimeError(f"B13 needs network namespaces: {reason}")
    copies, epochs = SIZES[quick]
    context: dict[str, Any] = {"clusters": {}, "epochs": epochs, "times": {}, "accuracy": {}}
    try:
        for side, (hosts, per_host) in {"two_hosts": (2, 1), "one_host": (1, 2)}.items():
            cluster = netns.NetnsCluster(hosts=hosts, workers_per_host=per_host)
            context["clusters"][side] = cluster
            cluster.up()
            reply = _client(cluster, "prepare", copies=copies)
            context.setdefault("arch", {})[side] = reply["arch"]
            context["times"][side] = []
    except BaseException:
        cleanup(context)
        raise
    return context


def _client(cluster: Any, command: str, **args: Any) -> dict[str, Any]:
    import os

    args["state_dir"] = os.path.join(cluster.workdir, "client-state")
    out = cluster.run_client(
        [sys.executable, "-m", "benchmarks.b13_netns_fit", command, cluster.scheduler_address,
         json.dumps(args)],
        timeout=1800,
    )  # fmt: skip
    found = [x for x in out.stdout.splitlines() if x.startswith(PROTOCOL)]
    if out.returncode != 0 or not found:
        raise RuntimeError(
            f"The B13 client ({command}) failed with exit code {out.returncode}: "
            f"{out.stderr.strip()[-1500:]}"
        )
    return dict(json.loads(found[-1][len(PROTOCOL) :]))


def cleanup(context: dict[str, Any]) -> None:
    problems = []
    for cluster in context["clusters"].values():
        problems += cluster.down()
    if problems:
        raise RuntimeError(f"B13: removing the namespace clusters left {problems}")


def _side(context: dict[str, Any], side: str) -> float:
    cluster = context["clusters"][side]
    reply = _client(cluster, "fit", arch=context["arch"][side], epochs=context["epochs"])
    context["times"][side].append(reply["seconds"])
    context["accuracy"][side] = reply["accuracy"]
    return float(reply["seconds"])


def two_hosts(context: dict[str, Any]) -> float:
    return _side(context, "two_hosts")


def one_host(context: dict[str, Any]) -> float:
    return _side(context, "one_host")


def details(context: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for side, times in context["times"].items():
        if times:
            found[f"{side} fit s (median)"] = round(statistics.median(times), 2)
        if side in context["accuracy"]:
            found[f"{side} train accuracy"] = round(context["accuracy"][side], 3)
    return found


# -- the client, run inside the head namespace ---------------------------------------------


def client_main(command: str, scheduler: str, args: dict[str, Any]) -> dict[str, Any]:
    import time

    import dask.config

    import dvml

    dask.config.set({"dvml.cluster.state-dir": args["state_dir"]})
    cluster = dvml.connect(scheduler)
    try:
        if command == "prepare":
            from benchmarks.b4_end_to_end import digits_frames
            from dvml.demo import digits_cnn_json

            train, _ = digits_frames(args["copies"])
            dvml.training_preprocessor(
                train, y="label", x="pixels", normalizing_const=16.0, name=TRAIN, overwrite=True
            )
            return {"arch": dvml.load_keras_model(digits_cnn_json(), name="digits-cnn")}
        from dvml.demo import COMPILE_PARAMS

        start = time.perf_counter()
        model = dvml.fit(
            TRAIN, MODEL, args["arch"], COMPILE_PARAMS,
            f"batch_size={BATCH}, epochs={args['epochs']}", num_iterations=1, resume=False,
            overwrite=True, progress=False,
        )  # fmt: skip
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "accuracy": model.summary["training_metrics_final"]}
    finally:
        cluster.close()


BENCHMARK = register(
    Benchmark(
        key="B13",
        title="dvml.fit on two namespace hosts vs the same fit on one host",
        unit="s",
        dvml=two_hosts,
        baseline=one_host,
        target=1.3,
        prepare=prepare,
        cleanup=cleanup,
        details=details,
    )
)


if __name__ == "__main__":
    reply = client_main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
    print(PROTOCOL + json.dumps(reply), flush=True)
