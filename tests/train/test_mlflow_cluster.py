"""Runs in a real MLflow tracking server (issue 40 item 2): fit and fit_multiple log their
parameters as written, per-iteration metrics, summary and dataset inputs once the key
``tracking.mlflow-uri`` is set (and nothing without it); a registered model exported to
MLflow's model registry loads back with MLflow and predicts dvml.predict's classes."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import dask
import pandas as pd
import pytest

import dvml
from tests.helpers.mlflow_server import running_mlflow_server

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = "loss='categorical_crossentropy',  optimizer='adam', metrics=['accuracy']"  # as typed
FIT = "batch_size=32, epochs=1"


@pytest.fixture(scope="module")
def env(cluster2: dvml.LocalCluster, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    from dvml.examples import digits_frame
    from tests.helpers.models import cnn

    home = tmp_path_factory.mktemp("mlflow")
    client = cluster2.client
    data = digits_frame(seed=0)
    dvml.training_preprocessor(data.iloc[:400], y="label", x="pixels", normalizing_const=16.0,
                               name="mlf_train", client=client)  # fmt: skip
    dvml.validation_preprocessor(data.iloc[400:600], y="label", x="pixels",
                                 training="mlf_train", name="mlf_val", client=client)  # fmt: skip
    registry = dvml.Registry(f"sqlite:///{home / 'registry.db'}")
    arch = dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
    try:
        with running_mlflow_server(home) as uri:
            yield {"client": client, "registry": registry, "arch": arch, "uri": uri,
                   "raw": data.iloc[600:640].reset_index(drop=True)}  # fmt: skip
    finally:
        registry.close()
        for name in ("mlf_train", "mlf_val"):
            dvml.datasets.drop(name, client=client)


def _runs(uri: str) -> pd.DataFrame:
    import mlflow

    mlflow_client = mlflow.MlflowClient(tracking_uri=uri)
    found = mlflow_client.get_experiment_by_name("dvml")
    if found is None:
        return pd.DataFrame()
    runs = mlflow_client.search_runs([found.experiment_id])
    return pd.DataFrame(
        [{"run_id": r.info.run_id, "name": r.info.run_name, **r.data.tags} for r in runs]
    )


def test_a_fit_is_logged_only_when_asked_and_as_its_summary_says(
    env: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    import mlflow

    reg, client, uri = env["registry"], env["client"], env["uri"]
    dvml.fit("mlf_train", "mlf_quiet", env["arch"], COMPILE, FIT, num_iterations=1,
             registry=reg, client=client)  # fmt: skip
    assert "mlf_quiet" not in set(_runs(uri).get("name", [])), "logged without the option"

    with dask.config.set({"dvml.tracking.mlflow-uri": uri}):
        model = dvml.fit(
            "mlf_train", "mlf_model", env["arch"], COMPILE, FIT, num_iterations=3,
            validation_set="mlf_val", metrics_compute_frequency=1, registry=reg, client=client,
        )  # fmt: skip
    summary = model.summary
    runs = _runs(uri)
    (run_id,) = runs.loc[runs["name"] == "mlf_model", "run_id"]
    mlflow_client = mlflow.MlflowClient(tracking_uri=uri)
    run = mlflow_client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["dvml.kind"] == "fit"
    assert run.data.params["compile_params"] == COMPILE  # the text as written, spaces kept
    assert run.data.params["source_table"] == "mlf_train"
    for key in ("training_loss", "validation_loss", "validation_metrics"):
        history = mlflow_client.get_metric_history(run_id, key)
        assert [m.step for m in sorted(history, key=lambda m: m.step)] == summary["metrics_iters"]
        logged = [m.value for m in sorted(history, key=lambda m: m.step)]
        assert logged == pytest.approx(summary[key], rel=1e-6), key
    inputs = {(d.dataset.name, d.tags[0].value) for d in run.inputs.dataset_inputs}
    # named with the version trained on; the digest is that version's content digest
    assert inputs == {("mlf_train@v1", "training"), ("mlf_val@v1", "validation")}
    digests = {d.dataset.name: d.dataset.digest for d in run.inputs.dataset_inputs}
    lineage = dvml.lineage("mlf_model", registry=env["registry"])
    assert lineage.training is not None
    assert digests["mlf_train@v1"] == lineage.training["content_digest"][:36]
    stored = mlflow_client.download_artifacts(
        run_id, "summary.json", str(pathlib.Path(env["registry"].url.split("///")[1]).parent)
    )
    assert '"model": "mlf_model"' in pathlib.Path(stored).read_text()


def test_fit_multiple_is_a_parent_run_with_a_child_per_configuration(env: dict[str, Any]) -> None:
    import mlflow

    table = pd.DataFrame({
        "mst_key": [1, 2], "model_id": [env["arch"]] * 2,
        "compile_params": [COMPILE, COMPILE.replace("'adam'", "'sgd'")],
        "fit_params": [FIT, FIT],
    })  # fmt: skip
    with dask.config.set({"dvml.tracking.mlflow-uri": env["uri"]}):
        selection = dvml.fit_multiple(
            "mlf_train", "mlf_mop", table, num_iterations=2, metrics_compute_frequency=1,
            progress=False, registry=env["registry"], client=env["client"],
        )  # fmt: skip
    runs = _runs(env["uri"])
    (parent,) = runs.loc[runs["name"] == "mlf_mop", "run_id"]
    children = runs[runs.get("mlflow.parentRunId") == parent].set_index("name")
    assert sorted(children.index) == ["mlf_mop_1", "mlf_mop_2"]
    mlflow_client = mlflow.MlflowClient(tracking_uri=env["uri"])
    info = selection.info.set_index("mst_key")
    for k in (1, 2):
        child = mlflow_client.get_run(children.loc[f"mlf_mop_{k}", "run_id"])
        assert child.data.params["compile_params"] == info.loc[k, "compile_params"]
        history = sorted(mlflow_client.get_metric_history(child.info.run_id, "training_loss"),
                         key=lambda m: m.step)  # fmt: skip
        assert [m.value for m in history] == pytest.approx(info.loc[k, "training_loss"], rel=1e-6)


def reports_two_steps(context: Any) -> int:
    """A training loop that reports two steps (shipped to the trainers by value)."""
    for epoch in range(2):
        context.report({"loss": 1.0 / (epoch + 1), "rank_seen": float(context.rank)})
    return int(context.rank)


def test_a_dvml_run_is_logged_with_its_reports_and_datasets(env: dict[str, Any]) -> None:
    import mlflow

    with dask.config.set({"dvml.tracking.mlflow-uri": env["uri"]}):
        result = dvml.run(
            reports_two_steps, {"train": "mlf_train", "val": "mlf_val"}, config={"lr": 0.01},
            name="mlf_loop", progress=False, registry=env["registry"], client=env["client"],
        )  # fmt: skip
    runs = _runs(env["uri"])
    (run_id,) = runs.loc[runs["name"] == "mlf_loop", "run_id"]
    mlflow_client = mlflow.MlflowClient(tracking_uri=env["uri"])
    run = mlflow_client.get_run(run_id)
    assert run.data.tags["dvml.kind"] == "run" and run.data.params["config.lr"] == "0.01"
    assert run.data.params["sync"] == "step"
    for key in ("loss", "rank_seen"):
        history = sorted(mlflow_client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == result.history["step"].tolist()
        assert [m.value for m in history] == pytest.approx(result.history[key].tolist())
    inputs = {(d.dataset.name, d.tags[0].value) for d in run.inputs.dataset_inputs}
    assert inputs == {("mlf_train@v1", "training"), ("mlf_val@v1", "validation")}


def test_an_exported_model_predicts_dvml_predicts_classes(env: dict[str, Any]) -> None:
    import mlflow
    import numpy as np

    reg, client, raw = env["registry"], env["client"], env["raw"]
    if not reg.model_exists("mlf_model"):
        dvml.fit("mlf_train", "mlf_model", env["arch"], COMPILE, FIT, num_iterations=2,
                 registry=reg, client=client)  # fmt: skip
    uri = dvml.export_to_mlflow("mlf_model", "digits-cnn", registry=reg, mlflow_uri=env["uri"])
    assert uri.startswith("models:/digits-cnn/")
    mlflow.set_tracking_uri(env["uri"])
    try:
        loaded = mlflow.pyfunc.load_model(uri)
        theirs = loaded.predict(np.stack(raw["pixels"]).astype(np.float32))
    finally:
        mlflow.set_tracking_uri(None)
    ours = dvml.predict("mlf_model", raw, "id", "pixels", registry=reg,
                        client=client).compute(scheduler=client)  # fmt: skip
    by_id = dict(zip(ours["id"], ours["class_value"], strict=True))
    assert list(theirs["class_value"]) == [by_id[i] for i in raw["id"]]
    assert str(loaded.metadata.signature.inputs.inputs[0].shape[1:]) == str(
        tuple(reg.get_model("mlf_model")["summary"]["x_shapes"][0])
    )
