"""Lineage without a cluster: the pure record builders and a real SQLite registry.

The registry completes a fit's lineage when it saves the model (architecture hash, the model a
warm start started from); a copy keeps it; the retrain workflow's promotion is added to it;
models saved before lineage read as what their summary knew.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import dvml
from dvml.jobs.models import copy_model
from dvml.registry import Registry
from dvml.registry.model_lineage import (
    MAX_ANCESTORS,
    architecture_sha256,
    completed,
    from_summary,
    promoted,
)
from dvml.store.versions import dataset_lineage, version_digest, version_record
from dvml.tracking.runs import fit_run
from tests.registry.test_registry import sequential_json


def _buffer(index: int, version: int, digest: str, rows: int = 10) -> dict[str, Any]:
    return {
        "index": index, "rows": rows, "version": version,
        "fields": {"x": {"digest": f"x{digest}", "shape": [rows, 4]}},
    }  # fmt: skip


def _summary(data_version: int, warm: bool, model: str = "m") -> dict[str, Any]:
    return {
        "model": model,
        "source_table": "ds",
        "lineage": {
            "model": model,
            "data": {"training": {"name": "ds", "version": data_version}, "validation": None},
            "code": {"dvml_version": "1", "architecture_id": 1},
            "warm_start": warm,
        },
    }


def test_version_digest_is_order_free_and_none_without_digests() -> None:
    a = version_digest({"0": "aa", "1": "bb"})
    assert a == version_digest({"1": "aa", "0": "bb"})  # placement does not matter
    assert a != version_digest({"0": "aa", "1": "bc"})
    assert version_digest({"0": "aa", "1": None}) is None
    assert version_digest({}) is None


def test_dataset_lineage_lists_the_versions_a_reader_of_version_n_holds() -> None:
    b1, b2, b3 = _buffer(0, 1, "a"), _buffer(1, 2, "b"), _buffer(2, 3, "c")
    records = [
        version_record(1, [b1], {"description": "v1 source"}, "t1"),
        version_record(2, [b2], {"description": "v2 source"}, "t2", parent=1),
        version_record(3, [b3], {"description": "v3 source"}, "t3", parent=2),
    ]
    layout_v2 = {"buffers": [b1, b2]}  # what a reader of version 2 holds
    read = dataset_lineage("ds", 2, layout_v2, records)
    assert read["version"] == 2 and read["rows"] == 20
    assert read["digests"] == {**records[0]["digests"], **records[1]["digests"]}
    assert read["content_digest"] == version_digest(read["digests"])
    assert [s["version"] for s in read["sources"]] == [1, 2]
    assert read["sources"][1]["source"] == {"description": "v2 source"}
    # after an overwrite (version 4 has no parent) only that publication is its source
    records.append(version_record(4, [_buffer(3, 4, "d")], {"description": "new"}, "t4"))
    read4 = dataset_lineage("ds", 4, {"buffers": [_buffer(3, 4, "d")]}, records)
    assert [s["version"] for s in read4["sources"]] == [4]


def test_completed_adds_the_architecture_hash_and_the_warm_start_parent() -> None:
    first = completed(_summary(1, warm=False), '{"a": 1, "b": 2}', None, "m")
    assert first["lineage"]["parent"] is None
    assert first["lineage"]["code"]["architecture_sha256"] == architecture_sha256('{"b":2,"a":1}')
    second = completed(_summary(2, warm=True), '{"a": 1}', {"version": 3, "summary": first}, "m")
    parent = second["lineage"]["parent"]
    assert parent["registry_version"] == 3 and parent["registered_as"] == "m"
    assert parent["lineage"]["data"]["training"]["version"] == 1
    # a copy (the parent key is set) is left as it is
    assert completed(second, '{"other": 1}', {"version": 9, "summary": {}}, "m") == second


def test_a_long_warm_start_chain_is_cut_at_max_ancestors() -> None:
    summary: dict[str, Any] = completed(_summary(1, warm=False), "{}", None, "m")
    for n in range(MAX_ANCESTORS + 3):
        summary = completed(
            _summary(n + 2, warm=True), "{}", {"version": n + 1, "summary": summary}, "m"
        )
    chain = from_summary("m", 99, summary).chain()
    assert len(chain) == MAX_ANCESTORS + 1  # the model and its MAX_ANCESTORS ancestors
    assert chain[-1].training == {"name": "ds", "version": 3 + 2 - 1}


def test_legacy_summary_reads_as_what_it_knew() -> None:
    legacy = {"model": "old", "source_table": "ds", "training_dataset_version": 2,
              "version": "0.1", "model_id": 4, "warm_start": False}  # fmt: skip
    found = from_summary("old", 1, legacy)
    assert found.legacy
    assert found.training == {"name": "ds", "version": 2}
    assert found.code["architecture_id"] == 4 and found.code["dvml_version"] == "0.1"
    assert found.to_dict()["parent"] is None


def test_mlflow_input_is_the_version_and_its_content_digest() -> None:
    summary = _summary(2, warm=False)
    summary["lineage"]["data"]["training"]["content_digest"] = "f" * 64
    summary.update(training_dataset_id="uuid")
    (inp,) = fit_run(summary).inputs
    assert (inp.name, inp.digest, inp.context) == ("ds@v2", "f" * 36, "training")
    old = {"model": "m", "source_table": "ds", "training_dataset_id": "uuid"}
    (inp,) = fit_run(old).inputs
    assert (inp.name, inp.digest) == ("ds", "uuid")


@pytest.fixture
def reg(tmp_path: Any) -> Any:
    with Registry(f"sqlite:///{tmp_path / 'r.db'}") as registry:
        yield registry


def test_registry_chains_warm_starts_through_a_copy_and_records_a_promotion(reg: Any) -> None:
    arch = reg.add_architecture(sequential_json())
    weights = [np.zeros((4, 3), "float32")]
    reg.save_model("prod", arch, weights, _summary(1, warm=False, model="prod@candidate"))
    copy_model(reg, "prod", "cand")  # the retrain workflow's warm start
    reg.save_model("cand", arch, weights, _summary(2, warm=True, model="cand"), replace=True)
    record = {"from": "cand", "metric": "accuracy", "candidate": 0.9, "previous": 0.8}
    lineage = promoted(
        reg.get_model("cand")["summary"], record, {"name": "prod", "registry_version": 1}
    )
    copy_model(reg, "cand", "prod", {"promotion": record, "lineage": lineage})
    found = dvml.lineage("prod", registry=reg)
    assert found.registry_version == 2 and found.training == {"name": "ds", "version": 2}
    assert found.promotions == [{**record, "over": {"name": "prod", "registry_version": 1}}]
    assert found.parent is not None
    assert (found.parent.model, found.parent.registry_version) == ("prod", 1)
    assert found.parent.training == {"name": "ds", "version": 1}
    assert found.code["architecture_sha256"] == architecture_sha256(sequential_json())
