"""The memory plan of a fit (pure): trainers' resident bytes per host, the margin, the fixes."""

from __future__ import annotations

import json
import math
import pickle
from typing import Any

import pytest

from dvml.exceptions import ArgumentError, MemoryPlanError
from dvml.placement.fit_memory import (
    BATCHES_HELD,
    HostRoom,
    count_model,
    machine_rooms,
    optimizer_slots,
    plan_fit,
)
from dvml.placement.metrics_batch import EVAL_SCALE
from dvml.train.trainer_memory import check_fit_fits

MiB = 2**20


def seq(*layers: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """A tf-keras Sequential model's JSON, parsed."""
    return {
        "class_name": "Sequential",
        "config": {"layers": [{"class_name": k, "config": c} for k, c in layers]},
    }


MLP = seq(("InputLayer", {}), ("Dense", {"units": 10}), ("Dense", {"units": 3}))
CNN = seq(
    ("InputLayer", {}),
    ("Conv2D", {"filters": 16, "kernel_size": [3, 3], "padding": "same"}),
    ("Flatten", {}),
    ("Dense", {"units": 32}),
    ("Dense", {"units": 10}),
)


@pytest.mark.parametrize(
    ("model", "shape", "params", "acts", "unknown"),
    [
        # 4*10+10 + 10*3+3; outputs 10 + 3
        (MLP, [4], 83, 13, None),
        # conv 3*3*1*16+16=160 (8x8x16 out), dense 1024*32+32, dense 32*10+10
        (CNN, [8, 8, 1], 160 + 32800 + 330, 1024 + 1024 + 32 + 10, None),
        # no bias; valid padding with stride 2: (8-3)//2+1 = 3
        (seq(("Conv2D", {"filters": 4, "kernel_size": 3, "strides": 2, "use_bias": False})),
         [8, 8, 2], 3 * 3 * 2 * 4, 3 * 3 * 4, None),
        # pooling halves, global pooling keeps channels, batch norm 4 per channel
        (seq(("MaxPooling2D", {"pool_size": [2, 2]}), ("BatchNormalization", {}),
             ("GlobalAveragePooling2D", {})), [8, 8, 3], 12, 4 * 4 * 3 * 2 + 3, None),
        (seq(("Embedding", {"input_dim": 100, "output_dim": 8}), ("Flatten", {})), [5], 800,
         40 + 40, None),
        # an unknown layer stops the count and is named
        (seq(("Dense", {"units": 2}), ("LSTM", {"units": 4})), [3], 8, 2, "layer LSTM"),
        ({"class_name": "Functional", "config": {"layers": []}}, [3], 0, 0,
         "a Functional model"),
    ],
)  # fmt: skip
def test_count_model(model: Any, shape: Any, params: int, acts: int, unknown: Any) -> None:
    count = count_model(model, shape)
    assert (count.params, count.activations_per_row, count.unknown) == (params, acts, unknown)


@pytest.mark.tf
def test_count_model_agrees_with_keras() -> None:
    from tests.helpers import cnn

    model = cnn()
    count = count_model(json.loads(model.to_json()), [8, 8, 1])
    assert count.unknown is None
    assert count.params == model.count_params()
    assert count.activations_per_row == sum(math.prod(lay.output_shape[1:]) for lay in model.layers)


@pytest.mark.parametrize(
    ("optimizer", "slots"),
    [
        ("adam", 2), ("Adam", 2), ({"class_name": "Adam", "config": {"amsgrad": True}}, 3),
        ("sgd", 0), ({"class_name": "SGD", "config": {"momentum": 0.9}}, 1),
        ("rmsprop", 1), ({"class_name": "RMSprop", "config": {"momentum": 0.5,
                                                             "centered": True}}, 3),
        ("adagrad", 1), ("nadam", 2), ("something_new", 2),
    ],
)  # fmt: skip
def test_optimizer_slots(optimizer: Any, slots: int) -> None:
    assert optimizer_slots(optimizer) == slots


def _plan(batches: list[int], hosts: list[str], room_mib: float, **kw: Any) -> Any:
    trainers = [(f"worker-{i}", h, b) for i, (h, b) in enumerate(zip(hosts, batches, strict=True))]
    rooms = [HostRoom(h, int(room_mib * MiB)) for h in sorted(set(hosts))]
    kw.setdefault("runtime", 100 * MiB)
    return plan_fit(trainers, [[4]], 3, MLP, "adam", rooms, **kw)


def test_a_trainer_is_runtime_weights_batches_and_evaluation() -> None:
    plan = _plan([16], ["a"], 1024)
    t = plan.trainers[0]
    row = 4 * (4 + 3)  # float32 x and one-hot y
    assert t.runtime == 100 * MiB
    assert t.weights == 83 * 4 * (2 + 2)  # weight, gradient, Adam's two slots
    assert t.batches == 16 * (BATCHES_HELD * row + 2 * 4 * 13)
    assert t.evaluation == 16 * EVAL_SCALE * (row + 4 * 3)  # the metrics pass: larger batches
    assert t.total == t.runtime + t.weights + t.batches + t.evaluation
    assert plan.fits and plan.fixes == ()
    assert any("zero-copy" in n for n in plan.notes)


@pytest.mark.parametrize(
    ("hosts", "room_mib", "margin", "fits"),
    [
        (["a", "b"], 110, 0.0, [True, True]),  # one trainer per host: ~100 MiB each
        (["a", "a"], 110, 0.0, [False]),  # two on one host add up
        (["a", "a"], 201, 0.0, [True]),
        (["a", "a"], 201, 0.2, [False]),  # the margin counts
        (["a", "a"], 241, 0.2, [True]),
    ],
)
def test_trainers_on_one_host_add_up_with_the_margin(hosts, room_mib, margin, fits) -> None:
    plan = _plan([8] * len(hosts), hosts, room_mib, margin=margin)
    assert [h.fits for h in plan.hosts] == fits
    assert plan.fits == all(fits)


def test_the_zygote_is_counted_once_per_host_and_the_fixes_leave_it_room() -> None:
    """Forked trainers share TensorFlow's pages with their machine's zygote: each host adds
    the zygote once, however many trainers it forks, and a fix's numbers leave it room."""
    one = _plan([8], ["a"], 10_000, runtime=10 * MiB, zygote=600 * MiB)
    two = _plan([8, 8, 8], ["a", "a", "b"], 10_000, runtime=10 * MiB, zygote=600 * MiB)
    t = one.trainers[0]
    assert one.hosts[0].needed == 600 * MiB + t.total
    assert [h.needed for h in two.hosts] == [600 * MiB + 2 * t.total, 600 * MiB + t.total]
    assert "and their zygote 600.0 MiB" in two.describe()
    assert list(two.table()["host_zygote"]) == [600 * MiB] * 3
    # 600 MiB of zygote + 3 trainers of ~10 MiB, no margin: 2 of the 3 fit in 625 MiB
    crowded = _plan([8] * 3, ["a"] * 3, 625, margin=0.0, runtime=10 * MiB, zygote=600 * MiB)
    assert not crowded.fits
    assert any("2 of 3 fit on a" in f and "beside their zygote" in f for f in crowded.fixes)
    assert not _plan([8], ["a"], 599, margin=0.0, runtime=1, zygote=600 * MiB).fits


def test_room_is_the_least_of_available_cgroup_and_cap() -> None:
    assert HostRoom("a", 10, None, None).room == 10
    assert HostRoom("a", 10, 4, None).room == 4
    assert HostRoom("a", 10, 40, 6).room == 6


def test_hosts_of_one_kernel_share_one_room() -> None:
    readings = {"host-0": ("boot-a", 100, None), "host-1": ("boot-a", 90, 50),
                "host-2": ("boot-b", 70, None), "host-3": ("", 60, None)}  # fmt: skip
    rooms, machine_of = machine_rooms(readings, cap=80)
    assert machine_of == {"host-0": "host-0 + host-1", "host-1": "host-0 + host-1",
                          "host-2": "host-2", "host-3": "host-3"}  # fmt: skip
    assert [(r.host, r.room) for r in rooms] == [("host-0 + host-1", 50), ("host-2", 70),
                                                 ("host-3", 60)]  # fmt: skip
    # trainers of the two hosts of one kernel add up against its one room
    trainers = [("w0", machine_of["host-0"], 8), ("w1", machine_of["host-1"], 8)]
    plan = plan_fit(trainers, [[4]], 3, MLP, "adam", rooms, runtime=30, margin=0.0)
    assert len(plan.hosts) == 1 and not plan.fits  # 2 x (30 + ...) > 50


def test_fixes_fewer_trainers_per_host() -> None:
    plan = _plan([8, 8], ["a", "a"], 150, margin=0.2)
    assert not plan.fits
    fixes = "\n".join(plan.fixes)
    assert "1 of 2 fit on a" in fixes
    assert "at least" in fixes and "available on a" in fixes


def test_fixes_a_smaller_batch_with_its_number() -> None:
    runtime = 10 * MiB
    big = 2**18  # rows per trainer (228 bytes each in flight): batches dominate
    plan = _plan([big], ["a"], 40, margin=0.0, runtime=runtime)
    assert not plan.fits
    (fix,) = [f for f in plan.fixes if f.startswith("a smaller batch_size")]
    rows = int(fix.split("at most ")[1].split(" ")[0])
    assert 1 <= rows < big
    assert _plan([rows], ["a"], 40, margin=0.0, runtime=runtime).fits
    assert not _plan([rows + 64], ["a"], 40, margin=0.0, runtime=runtime).fits


def test_a_smaller_batch_does_not_help_below_the_runtime() -> None:
    plan = _plan([8], ["a"], 50)  # 100 MiB runtime alone
    assert any("does not help" in f for f in plan.fixes)
    assert not any(f.startswith("a smaller batch_size") for f in plan.fixes)


def test_stored_weights_replace_the_count_and_unknown_layers_are_noted() -> None:
    plan = _plan([8], ["a"], 1024, weights_bytes=4000)
    assert plan.trainers[0].weights == 1000 * 4 * 4
    odd = seq(("LSTM", {"units": 4}))
    lstm = plan_fit([("w", "a", 8)], [[4]], 3, odd, "sgd", [HostRoom("a", 2**30)])
    assert any("LSTM" in n and "lower bound" in n for n in lstm.notes)


def test_missing_host_room_is_refused() -> None:
    with pytest.raises(ArgumentError, match=r"\['b'\]"):
        plan_fit([("w", "b", 8)], [[4]], 3, MLP, "adam", [HostRoom("a", 2**30)])


def test_refusal_carries_the_plan_and_pickles() -> None:
    plan = _plan([8, 8], ["a", "a"], 150)
    with pytest.raises(MemoryPlanError) as info:
        check_fit_fits(plan, "m", 16)
    text = str(info.value)
    assert "'m'" in text and "No trainer was started" in text and "batch_size=16" in text
    assert "What would make it fit" in text
    table = info.value.plan.table()
    assert list(table["worker"]) == ["worker-0", "worker-1"]
    assert not table["fits"].any()
    again = pickle.loads(pickle.dumps(info.value))
    assert again.plan == plan
    check_fit_fits(_plan([8], ["a"], 1024), "m", 8)  # a plan that fits passes


@pytest.mark.parametrize(
    ("num_classes", "width"), [(10, 10), ([3, 3], 6), ([2, 5, 1], 8), (None, 0)]
)
def test_a_rows_label_width_adds_the_outputs_of_a_multi_output_dataset(
    num_classes: Any, width: int
) -> None:
    from dvml.train.trainer_memory import label_width

    assert label_width(num_classes) == width
