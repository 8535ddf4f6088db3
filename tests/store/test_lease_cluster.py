"""A drop or overwrite of a dataset while dvml.fit trains on it is refused, naming the fit.

Before issue 28 the drop returned in 0.4 s, the trainers kept zero-copy views of freed blobs,
a pack that followed reused the memory and the fit registered a ruined model. The fit now
holds a lease on its datasets (dvml.store.leases) for the whole training. The attempts run
while the trainers are alive, between the fit's two iterations (``on_iteration``), from the
fit's own process (API) and from another (``dvml datasets drop``) that has ANOTHER state
directory: before issue 42 (item 6) the leases were files in the client's state directory, and
such a client dropped the dataset in 0.18 s while the fit trained. A drop with ``--force``
makes the fit fail instead of registering its model.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import stat
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import dask
import pandas as pd
import pytest

import dvml
from dvml.exceptions import DatasetInUseError, LeaseBrokenError
from dvml.store.leases import read_leases
from tests.helpers import REPO, Background, cnn, poll_for, tls_environment

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']"
NAME = "lease_digits"
# Enough iterations that the fit still trains while the three attempts run (~10 s: one is a
# `python -m dvml` process); the test checks that it did.
ITERATIONS = 36  # the fit must outlast three refused attempts on a loaded machine (~8 s)


def _digits() -> pd.DataFrame:
    from sklearn.datasets import load_digits

    d = load_digits()
    return pd.DataFrame(
        {
            "pixels": list(d.images.reshape(-1, 8, 8, 1).astype("float32")[:1200]),
            "label": d.target[:1200],
        }
    )


@contextlib.contextmanager
def _packed_digits(
    client: Any, tmp_path: pathlib.Path, name: str
) -> Iterator[tuple[dvml.Registry, int]]:
    """Digits packed as ``name`` (state directory under ``tmp_path``), a registry and the CNN's
    architecture id in it; the registry is closed after."""
    with dask.config.set({"dvml.cluster.state-dir": str(tmp_path / "state")}):
        dvml.training_preprocessor(
            _digits(), y="label", x="pixels", normalizing_const=16.0, name=name,
            overwrite=True, client=client,
        )  # fmt: skip
        registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
        try:
            yield registry, dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
        finally:
            registry.close()


def test_drop_and_overwrite_during_a_fit_are_refused(cluster2: Any, tmp_path: pathlib.Path):
    client = cluster2.client
    state = tmp_path / "state"  # made by the fit: owner-only, with its locks and checkpoints
    frame = _digits()
    env = _other_client_env(cluster2, tmp_path)
    attempts: dict[str, Any] = {}
    ready_cli: subprocess.Popen[str] | None = None

    def attempt_all() -> None:
        assert ready_cli is not None
        for what, call in (
            ("drop", lambda: dvml.datasets.drop(NAME, client=client)),
            ("overwrite", lambda: dvml.training_preprocessor(
                frame, y="label", x="pixels", normalizing_const=16.0, name=NAME,
                overwrite=True, client=client)),
        ):  # fmt: skip
            try:
                call()
                attempts[what] = None
            except Exception as exc:
                attempts[what] = exc
        attempts["cli"] = ready_cli.communicate("go\n", timeout=120)

    with dask.config.set({"dvml.cluster.state-dir": str(state)}):
        dvml.training_preprocessor(
            frame, y="label", x="pixels", normalizing_const=16.0, name=NAME, overwrite=True,
            client=client,
        )  # fmt: skip
        registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
        try:
            arch = dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
            fitting = Background(
                lambda seen: dvml.fit(
                    NAME, "lease_model", arch, compile_params=COMPILE,
                    fit_params="batch_size=32, epochs=1", num_iterations=ITERATIONS,
                    registry=registry, client=client, on_iteration=seen, progress=False,
                )
            )  # fmt: skip
            # The other client's `dvml datasets drop` starts now and waits, imported, for the
            # word: the fit need not outlast a Python start on a loaded machine.
            ready_cli = _cli_drop_when_told(cluster2, env, NAME)
            # The trainers run (one iteration is done) and read the dataset from now on.
            assert fitting.first.wait(300), "the fit did not reach its first iteration"
            attempt_all()
            assert not fitting.done(), "the fit ended before the attempts: raise ITERATIONS"
            model = fitting.result()
            accuracy = model.summary["training_metrics_final"]
        finally:
            registry.close()
            if ready_cli is not None and ready_cli.poll() is None:  # a failure before its turn
                ready_cli.kill()
                ready_cli.communicate()
        try:
            for what in ("drop", "overwrite"):
                error = attempts[what]
                assert isinstance(error, DatasetInUseError), (what, error)
                assert "dvml.fit of model 'lease_model'" in str(error)
                assert f"Cannot {what} dataset {NAME!r}" in str(error)
            cli_out, cli_err = attempts["cli"]
            assert ready_cli.returncode == 1, (cli_out, cli_err)
            assert cli_err.startswith("dvml: error: Cannot drop dataset"), cli_err
            assert "dvml.fit of model 'lease_model'" in cli_err
            assert "Wait for that job to end" in cli_err and "--force" in cli_err
            assert accuracy > 0.5  # trained on the data it was given, not on freed memory
            assert dvml.datasets.exists(NAME, client=client)
            # Item 7: the state directory and what the fit made in it are owner-only.
            for path in (state, state / "locks", state / "checkpoints"):
                assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
            # The lease ended with the fit: the other client's drop is accepted now.
            after = _cli_drop(cluster2, env, NAME)
            assert after.returncode == 0, (after.stdout, after.stderr)
        finally:
            if dvml.datasets.exists(NAME, client=client):
                dvml.datasets.drop(NAME, client=client)
    assert not dvml.datasets.exists(NAME, client=client)


def _other_client_env(cluster: Any, tmp_path: pathlib.Path) -> dict[str, str]:
    """A `python -m dvml` client of this cluster with its own state directory."""
    return {
        **os.environ,
        **tls_environment(cluster),
        "PYTHONPATH": str(REPO),
        "DASK_DVML__CLUSTER__STATE_DIR": str(tmp_path / "other-client-state"),
    }


def _cli_drop_when_told(cluster: Any, env: dict[str, str], name: str) -> Any:
    """``dvml datasets drop NAME`` as ``python -m dvml`` runs it, started now: it imports the
    command line, then waits for a line on its stdin before it runs (``communicate``)."""
    code = (
        "import sys\nfrom dvml.cli import main\nsys.stdin.readline()\n"
        f"sys.exit(main(['datasets', 'drop', {name!r}, '--scheduler', "
        f"{cluster.scheduler_address!r}]))\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def _cli_drop(cluster: Any, env: dict[str, str], name: str, *extra: str) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "dvml", "datasets", "drop", name,
         "--scheduler", cluster.scheduler_address, *extra],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def test_a_fit_whose_dataset_was_dropped_with_force_registers_nothing(
    cluster2: Any, tmp_path: pathlib.Path
) -> None:
    client = cluster2.client
    with _packed_digits(client, tmp_path, "forced_digits") as (registry, arch):
        fitting = Background(
            lambda seen: dvml.fit(
                "forced_digits", "forced_model", arch, compile_params=COMPILE,
                fit_params="batch_size=32, epochs=1", num_iterations=6, registry=registry,
                client=client, on_iteration=seen, progress=False,
            )
        )  # fmt: skip
        assert fitting.first.wait(300), "the fit did not reach its first iteration"
        dvml.datasets.drop("forced_digits", client=client, force=True)  # under the trainers
        assert not fitting.done(), "the fit ended before the forced drop: raise iterations"
        error = fitting.error()
        assert isinstance(error, LeaseBrokenError), error
        assert "dvml.fit of model 'forced_model'" in str(error)
        assert "a drop with force=True from pid" in str(error)
        assert registry.list_models().empty  # nothing registered as if all went well
    assert not dvml.datasets.exists("forced_digits", client=client)
    assert read_leases(client) == []  # the broken lease was given back


def test_a_search_whose_dataset_was_dropped_with_force_stops_at_its_next_hop(
    cluster2: Any, tmp_path: pathlib.Path
) -> None:
    """ASHA checks its lease after each hop: a forced drop stops the search long before its
    end (it used to train every configuration on freed memory, then fail)."""
    client = cluster2.client
    compile_grid = {"loss": ["categorical_crossentropy"], "metrics": ["accuracy"],
                    "optimizer_params_list": [{"optimizer": ["Adam"],
                                               "lr": [1e-3, 3e-3, 1e-2, 3e-2]}]}  # fmt: skip
    with _packed_digits(client, tmp_path, "forced_search_digits") as (registry, arch):
        searching = Background(
            lambda seen: dvml.automl(
                "forced_search_digits", "forced_search", [arch], compile_grid,
                {"batch_size": [32], "epochs": [1]}, method="asha",
                params="max_t=9, eta=3, grace_period=1, max_configs=8", seed=3,
                progress=False, registry=registry, client=client,
            )
        )  # fmt: skip

        def decisions() -> list[str]:
            with dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}") as reg:
                try:
                    text = reg.model_selection_run("forced_search")["summary"]["journal"]
                except dvml.DvmlError:
                    return []
            return [r["event"]["type"] for r in json.loads(text)["records"]]

        assert poll_for(lambda: searching.done() or "result" in decisions(), 300)
        dvml.datasets.drop("forced_search_digits", client=client, force=True)
        at_drop = decisions()
        error = searching.error()
        assert isinstance(error, LeaseBrokenError), error
        assert "dvml.automl 'forced_search'" in str(error)
        # it stopped at its next hop (the one in flight may still finish): no model went on to
        # train on the freed memory, and none failed on it
        after = decisions()
        assert after.count("result") <= at_drop.count("result") + 2, (at_drop, after)
        assert "failure" not in after, after
        assert registry.list_models().empty
    assert read_leases(client) == []


def test_fit_multiple_refuses_a_model_output_too_long_for_its_names(
    cluster2: Any, tmp_path: pathlib.Path
) -> None:
    """Item 7 of issue 28: a 128-character model_output registered 130-character models."""
    from dvml.exceptions import ArgumentError
    from dvml.names import MAX_NAME_LENGTH

    client = cluster2.client
    with _packed_digits(client, tmp_path, "long_digits") as (registry, arch):
        try:
            table = pd.DataFrame(
                [{"mst_key": k, "model_id": arch, "compile_params": COMPILE,
                  "fit_params": f"batch_size={16 * k}, epochs=1"} for k in (1, 2)]
            )  # fmt: skip
            with pytest.raises(ArgumentError, match=r"model_output is too long.*at most 126"):
                dvml.fit_multiple(
                    "long_digits", "m" * MAX_NAME_LENGTH, table, 1, registry=registry,
                    client=client, progress=False,
                )  # fmt: skip
            assert registry.list_models().empty  # nothing trained, nothing registered
        finally:
            dvml.datasets.drop("long_digits", client=client)
