"""Lineage on a real 2-worker cluster (issue 39, item 3): a model records the version it read.

One dataset, three fits: ``lin_a`` on version 1; then version 2 is appended and ``lin_b`` (a
copy of ``lin_a``) is warm-started on it, and ``lin_old`` trains on version 1 named by a
reader; then the dataset is dropped. Each model's lineage still
names the version it read and exactly the digests that version had, and ``lin_b``'s chains to
``lin_a``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import dask
import pytest

import dvml
from dvml.jobs.models import copy_model
from dvml.store.versions import version_digest
from tests.helpers.data import iris_frame
from tests.helpers.models import iris_mlp

pytestmark = pytest.mark.cluster

NAME = "lineage_iris"
COMPILE = "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']"
FIT = "batch_size=16, epochs=1"


@pytest.fixture(scope="module")
def env(cluster2: dvml.LocalCluster, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """lin_a trained on version 1; version 2 appended; lin_b warm-started on it; then dropped."""
    tmp = tmp_path_factory.mktemp("lineage")
    client = cluster2.client
    frame = iris_frame().drop(columns=["id"]).reset_index(drop=True)
    with dask.config.set({"dvml.cluster.state-dir": str(tmp / "state")}):
        registry = dvml.Registry(f"sqlite:///{tmp / 'registry.db'}")
        try:
            dvml.training_preprocessor(
                frame.iloc[:120], y="label", x="x", name=NAME, overwrite=True, client=client
            )
            v1 = dvml.datasets.describe(NAME, client=client, version=1)
            v1_record = next(v for v in v1.versions if v["version"] == 1)
            arch = dvml.load_keras_model(iris_mlp().to_json(), name="mlp", registry=registry)
            fit = {"registry": registry, "client": client, "num_iterations": 1, "progress": False}
            dvml.fit(NAME, "lin_a", arch, COMPILE, FIT, **fit)
            dvml.datasets.append(NAME, frame.iloc[120:], client=client)
            v2 = dvml.datasets.describe(NAME, client=client)
            copy_model(registry, "lin_a", "lin_b")
            dvml.fit(NAME, "lin_b", arch, COMPILE, FIT, warm_start=True, **fit)
            old = dvml.datasets.describe(NAME, client=client, version=1)  # named, after append
            dvml.fit(old, "lin_old", arch, COMPILE, FIT, **fit)
            dvml.datasets.drop(NAME, client=client)
            yield {"registry": registry, "v1": v1_record, "v2": v2, "tmp": tmp}
        finally:
            registry.close()
            if dvml.datasets.exists(NAME, client=client):
                dvml.datasets.drop(NAME, client=client, force=True)


def test_lineage_keeps_version_1_and_its_digests_after_append_and_drop(
    env: dict[str, Any],
) -> None:
    found = dvml.lineage("lin_a", registry=env["registry"])
    assert found.training is not None
    assert found.training["name"] == NAME
    assert found.training["version"] == 1
    assert found.training["digests"] == env["v1"]["digests"]  # as describe(version=1) had them
    assert found.training["content_digest"] == version_digest(env["v1"]["digests"])
    assert found.training["rows"] == 120
    (source,) = found.training["sources"]
    assert source["version"] == 1
    assert source["source"] == env["v1"]["source"]  # description and preprocessing parameters
    assert found.code["architecture_sha256"] and found.code["dvml_version"] == dvml.__version__
    assert found.code["compile_params"] and found.code["fit_params"]
    assert found.parent is None and not found.warm_start


def test_a_fit_given_an_old_version_trains_on_its_rows_only(env: dict[str, Any]) -> None:
    """describe(name, version=1) after an append: the fit reads version 1's buffers, and its
    lineage and summary say so (the latest has 150 rows)."""
    found = dvml.lineage("lin_old", registry=env["registry"])
    assert found.training is not None
    assert (found.training["version"], found.training["rows"]) == (1, 120)
    assert found.training["digests"] == env["v1"]["digests"]
    summary = env["registry"].get_model("lin_old")["summary"]
    assert summary["training_dataset_version"] == 1
    assert env["v2"].rows == 150


def test_a_warm_started_model_chains_to_its_parent(env: dict[str, Any]) -> None:
    found = dvml.lineage("lin_b", registry=env["registry"])
    assert found.warm_start and found.training is not None
    assert found.training["version"] == 2
    v2_buffers = {str(b["index"]) for b in env["v2"].layout["buffers"]}
    assert set(found.training["digests"]) == v2_buffers  # every buffer of version 2
    assert env["v1"]["digests"].items() <= found.training["digests"].items()  # v1's, shared
    assert [s["version"] for s in found.training["sources"]] == [1, 2]
    assert found.parent is not None
    assert found.parent.model == "lin_a"
    assert found.parent.training is not None
    assert found.parent.training["digests"] == env["v1"]["digests"]
    assert [n.model for n in found.chain()] == ["lin_b", "lin_a"]


def test_cli_prints_the_lineage_chain(env: dict[str, Any]) -> None:
    found = dvml.lineage("lin_b", registry=env["registry"])
    out = subprocess.run(
        [sys.executable, "-m", "dvml", "models", "lineage", "lin_b",
         "--registry", env["registry"].url],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert out.startswith("model: lin_b")
    assert "warm-started from: lin_a" in out
    assert f"content digest {found.training['content_digest']}" in out  # type: ignore[index]
