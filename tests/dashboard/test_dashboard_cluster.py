"""dvml's page on the Dask dashboard, on a real cluster and in a real headless browser.

A fit runs while the page is opened: the rendered page (chromium's DOM after its script ran,
and a screenshot kept in ``test-artifacts/``) shows the dataset, the workers' vineyard bytes
and the running job's trainers with their step times and its memory reservation, and shows
the job done when it is, its model with the data version that trained it. The JSON endpoints
agree with :func:`dvml.datasets.describe`, the vineyardds' own figures and the fit's summary.
"""

from __future__ import annotations

import pathlib
import shutil
import threading
from typing import Any

import pytest

import dvml
from tests.helpers.browser import ARTIFACTS, rendered_text
from tests.helpers.browser import get_json as _get
from tests.helpers.polling import poll_until

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']"


def test_the_dvml_page_shows_datasets_workers_and_a_running_fit(
    cluster2: dvml.LocalCluster, tmp_path: pathlib.Path
) -> None:
    from dvml.examples import digits_frame
    from tests.helpers.models import cnn

    client = cluster2.client
    page = cluster2.dvml_dashboard_link
    assert page.endswith("/dvml") and page.startswith("http")
    registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    data = digits_frame(seed=0).iloc[:400]
    packed = dvml.training_preprocessor(
        data, y="label", x="pixels", normalizing_const=16.0, name="dash_digits", client=client
    )
    try:
        # -- the JSON endpoints against describe and the vineyardds ------------------------
        described = dvml.datasets.describe("dash_digits", client=client)
        (listed,) = [d for d in _get(f"{page}/api/datasets.json") if d["name"] == "dash_digits"]
        assert listed["rows"] == described.rows == packed.rows
        assert listed["version"] == described.version == 1
        assert listed["nbytes"] == described.nbytes
        per_worker = described.distribution().set_index("worker_name")
        assert {w: v["rows"] for w, v in listed["workers"].items()} == per_worker["rows"].to_dict()
        status = cluster2.status().set_index("name")  # what each vineyardd says itself
        # the vineyardds' figures come with the heartbeats: the pack's bytes within seconds
        workers = poll_until(
            lambda: (
                (w := _get(f"{page}/api/workers.json"))
                and all((x["vineyard_used"] or 0) >= sum(x["datasets"].values()) > 0 for x in w)
                and w
            ),
            timeout=30,
            what="every worker's vineyardd holding the dataset on the page",
        )
        for w in workers:
            assert w["vineyard_limit"] == status.loc[w["name"], "memory_limit"]
            assert w["datasets"]["dash_digits"] == per_worker.loc[w["name"], "nbytes"]
            assert 0 < w["vineyard_used"] <= w["vineyard_limit"]

        # -- a fit, watched while it runs ----------------------------------------------------
        arch = dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
        result: dict[str, Any] = {}
        fit = threading.Thread(
            target=lambda: result.update(
                model=dvml.fit(
                    "dash_digits",
                    "dash_model",
                    arch,
                    COMPILE,
                    "batch_size=16, epochs=1",
                    num_iterations=25,
                    registry=registry,
                    client=client,
                )
            )
        )
        fit.start()
        try:
            running = poll_until(
                lambda: next(
                    (
                        j
                        for j in _get(f"{page}/api/jobs.json")
                        if j["model"] == "dash_model"
                        and j["state"] == "running"
                        and j["iteration"] >= 1
                    ),
                    None,
                ),
                timeout=120,
                what="the fit running past its first iteration on the page",
            )
            assert sorted(t["worker"] for t in running["trainers"]) == sorted(per_worker.index)
            assert all(t["step_seconds"] > 0 and t["steps"] > 0 for t in running["trainers"])
            assert running["num_iterations"] == 25 and running["eta_seconds"] is not None
            # the fit holds its planned bytes per machine while it runs (its admission)
            (held,) = [r for r in _get(f"{page}/api/reservations.json") if "dash_model" in r["job"]]
            assert held["total"] == sum(held["machines"].values()) > 0
            shot = tmp_path / "dvml-page.png"
            seen = rendered_text(page, tmp_path, screenshot=shot)
        finally:
            fit.join(timeout=600)
        assert "model" in result, "the fit did not finish"
        ARTIFACTS.mkdir(exist_ok=True)
        if shot.is_file():
            shutil.copy(shot, ARTIFACTS / "dvml-dashboard-page.png")
        assert "dash_digits" in seen and "dash_model" in seen, seen[:800]
        for w in per_worker.index:
            assert w in seen, f"{w} is not on the page: {seen[:800]}"
        assert "running" in seen and ("MiB" in seen or "KiB" in seen), seen[:800]

        # -- the page follows the job to its end, and agrees with the summary ---------------
        (done,) = [j for j in _get(f"{page}/api/jobs.json") if j["job"] == running["job"]]
        summary = result["model"].summary
        assert done["state"] == "done" and done["iteration"] == 25
        for t in done["trainers"]:
            assert t["step_seconds"] == pytest.approx(
                summary["trainer_step_seconds"][t["worker"]], abs=1e-6
            )
            peak = summary["trainer_memory"][t["worker"]]["peak_bytes"]
            assert t["peak_resident_bytes"] == peak and peak > 0
        assert (done["straggler"] or {}).get("worker") == summary["straggler_worker"]
        after = rendered_text(page, tmp_path)
        assert "25 / 25" in after and "done" in after, after[:800]
        # ... releases its reservation, and lists the model with the data that trained it
        assert not [r for r in _get(f"{page}/api/reservations.json") if "dash_model" in r["job"]]
        (listed_model,) = [m for m in _get(f"{page}/api/models.json") if m["name"] == "dash_model"]
        trained_on = summary["lineage"]["data"]["training"]
        assert listed_model["trained_by"] == "dvml.fit"
        assert listed_model["training"] == {
            "name": "dash_digits", "version": 1, "content_digest": trained_on["content_digest"]
        }  # fmt: skip
        assert f"dash_digits@v1 {trained_on['content_digest'][:12]}" in after, after
    finally:
        registry.close()
        dvml.datasets.drop("dash_digits", client=client)
    gone = _get(f"{page}/api/datasets.json")
    assert "dash_digits" not in [d["name"] for d in gone]
