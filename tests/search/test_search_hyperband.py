"""MADlib's Hyperband (dvml.search.hyperband): the schedule table row for row, the diagonal run,
hyperopt's batches. Pure: no cluster."""

from __future__ import annotations

import math

import pytest

import dvml
from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.search import hyperband as hb
from dvml.search import journal as j

# MADlib's documented hyperband_schedule(R=81, eta=3, skip_last=0): (s, i, n_i, r_i)
MADLIB_81 = [
    (4, 0, 81, 1), (4, 1, 27, 3), (4, 2, 9, 9), (4, 3, 3, 27), (4, 4, 1, 81),
    (3, 0, 27, 3), (3, 1, 9, 9), (3, 2, 3, 27), (3, 3, 1, 81),
    (2, 0, 9, 9), (2, 1, 3, 27), (2, 2, 1, 81),
    (1, 0, 6, 27), (1, 1, 2, 81),
    (0, 0, 5, 81),
]  # fmt: skip


def test_schedule_r81_is_madlibs_table() -> None:
    rows = dvml.hyperband_schedule(81, 3, 0)
    assert [tuple(r) for r in rows] == MADLIB_81
    assert rows[0].s == 4 and rows[0].n_i == 81 and rows[0]._fields == ("s", "i", "n_i", "r_i")
    # integer division: 81/27/9/6/5 configurations, not the paper's 81/34/15/8/5
    assert [r.n_i for r in rows if r.i == 0] == [81, 27, 9, 6, 5]


@pytest.mark.parametrize(
    ("R", "eta", "skip_last", "expected"),
    [
        (6, 3, 0, [(1, 0, 3, 2), (1, 1, 1, 6), (0, 0, 2, 6)]),  # MADlib's default automl_params
        (9, 3, 0, [(2, 0, 9, 1), (2, 1, 3, 3), (2, 2, 1, 9), (1, 0, 3, 3), (1, 1, 1, 9),
                   (0, 0, 3, 9)]),
        (81, 3, 1, [r for r in MADLIB_81 if r[1] < r[0]]),  # the last round of every bracket
        (3, 3, 0, [(1, 0, 3, 1), (1, 1, 1, 3), (0, 0, 2, 3)]),
        # r = 5 * 2**-1 = 2.5: MADlib's Python 2 round gives 3 (Python 3's round would give 2)
        (5, 2, 0, [(2, 0, 4, 1), (2, 1, 2, 3), (2, 2, 1, 5), (1, 0, 2, 3), (1, 1, 1, 5),
                   (0, 0, 3, 5)]),
    ],
)  # fmt: skip
def test_schedule_table(R: int, eta: int, skip_last: int, expected: list[tuple[int, ...]]) -> None:
    assert [tuple(r) for r in hb.hyperband_schedule(R, eta, skip_last)] == expected


def test_s_max_follows_madlibs_floating_point() -> None:
    assert hb.s_max(81, 3) == 4
    assert hb.s_max(243, 3) == 4  # math.log(243, 3) is 4.999...: MADlib's floor gives 4
    assert math.log(243, 3) < 5


@pytest.mark.parametrize(
    ("x", "rounded"), [(2.5, 3), (1.5, 2), (0.5, 1), (2.4999, 2), (3.0, 3), (0.0, 0), (-2.5, -3)]
)
def test_madlib_round_halves_away_from_zero(x: float, rounded: int) -> None:
    assert hb.madlib_round(x) == rounded


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((81, 1, 0), ArgumentError, "eta must be at least 2"),
        ((2, 3, 0), ArgumentError, "R should not be less than eta"),
        ((81, 3, 5), ArgumentError, "skip_last must be non-negative and less than 5"),
        ((81, 3, -1), ArgumentError, "skip_last must be at least 0"),
        ((81.0, 3, 0), ArgumentTypeError, "R must be an integer"),
        ((81, True, 0), ArgumentTypeError, "eta must be an integer"),
    ],
)
def test_schedule_refuses_madlibs_bad_inputs(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        hb.hyperband_schedule(*args)


def _run(run: hb.HyperbandRun, losses: dict[int, float | None]) -> list[hb.Diagonal]:
    diagonals = []
    while (d := run.next_diagonal()) is not None:
        diagonals.append(d)
        run.report({k: losses.get(k, float(k)) for k in d.keys})
    return diagonals


def test_diagonal_run_r9_trains_15_configurations_as_madlib() -> None:
    run = hb.HyperbandRun(9, 3, 0)
    assert run.num_configs == 15 and run.num_diagonals == 3
    diagonals = _run(run, {})  # loss = mst_key: the smaller key is better
    assert [(d.i, d.num_iterations, d.offset, d.warm_start) for d in diagonals] == [
        (0, 1, 0, False), (1, 3, 1, True), (2, 9, 4, True),
    ]  # fmt: skip
    assert diagonals[0].keys == tuple(range(1, 10)) and diagonals[0].new_keys == diagonals[0].keys
    assert diagonals[1].keys == (1, 2, 3, 10, 11, 12) and diagonals[1].new_keys == (10, 11, 12)
    assert diagonals[1].warm_keys == (1, 2, 3)
    assert diagonals[2].keys == (1, 10, 13, 14, 15)
    assert dict(diagonals[2].rounds) == {2: 2, 1: 1, 0: 0}
    # MADlib's .info columns s and i, and how many rounds each key trained (metrics_iters)
    assert run.bracket_of == {**dict.fromkeys(range(1, 10), 2), 10: 1, 11: 1, 12: 1,
                              13: 0, 14: 0, 15: 0}  # fmt: skip
    rounds = {k: sum(k in d.keys for d in diagonals) for k in range(1, 16)}
    assert {k: run.last_round[k] + 1 for k in rounds} == rounds
    assert rounds == {1: 3, 2: 2, 3: 2, **dict.fromkeys(range(4, 10), 1), 10: 2, 11: 1, 12: 1,
                      13: 1, 14: 1, 15: 1}  # fmt: skip
    assert run.best() == 1


def test_survivors_by_loss_nan_last_and_only_from_the_previous_round() -> None:
    run = hb.HyperbandRun(9, 3, 0)
    d0 = run.next_diagonal()
    assert d0 is not None
    # 9 is best, 1 diverged: survivors are 9, 8, 7; NaN ranks after every number
    run.report({k: (math.nan if k == 1 else 10.0 - k) for k in d0.keys})
    d1 = run.next_diagonal()
    assert d1 is not None and d1.warm_keys == (7, 8, 9)
    # 9 and 8 got worse than 3's old loss from round 0; 3 did not train in round 1: not a survivor
    run.report({7: 0.5, 8: 9.0, 9: 9.5, 10: 1.0, 11: None, 12: 2.0})
    d2 = run.next_diagonal()
    assert d2 is not None and d2.warm_keys == (7, 10)


def test_hyperband_run_refuses_out_of_order_reports() -> None:
    run = hb.HyperbandRun(9, 3, 0)
    with pytest.raises(ArgumentError, match="No diagonal is pending"):
        run.report({1: 0.1})
    d0 = run.next_diagonal()
    assert d0 is not None
    with pytest.raises(ArgumentError, match="did not train in diagonal 0"):
        run.report({10: 0.1})
    run.report({1: 0.1})
    with pytest.raises(ArgumentError, match=r"no loss reported for mst_key \[2, 3"):
        run.next_diagonal()


def test_skip_last_samples_only_the_brackets_that_run() -> None:
    run = hb.HyperbandRun(81, 3, 1)
    # MADlib samples sum(n)[skip_last:]: bracket 0 (5 configurations) never starts
    assert run.num_configs == 81 + 27 + 9 + 6 and run.num_diagonals == 4
    diagonals = _run(run, {})
    assert [d.num_iterations for d in diagonals] == [1, 3, 9, 27]
    assert max(max(d.keys) for d in diagonals) == run.num_configs


def test_hyperband_journal_replays() -> None:
    run = hb.HyperbandRun(9, 3, 0)
    _run(run, {4: math.nan})
    text = run.journal.dumps()
    again = j.replay(j.Journal.loads(text), hb.HyperbandRun(9, 3, 0))
    assert again.journal.dumps() == text
    assert again.next_diagonal() is None and again.best() == 1
    # half a search resumes where it stopped
    half = j.Journal.loads(text)
    half.records = half.records[:3]  # diagonal 0, its losses, diagonal 1
    resumed = j.replay(half, hb.HyperbandRun(9, 3, 0))
    with pytest.raises(ArgumentError, match="Diagonal 1 is not finished"):
        resumed.next_diagonal()
    with pytest.raises(ArgumentError, match="does not replay"):
        j.replay(j.Journal.loads(text), hb.HyperbandRun(9, 3, 1))


@pytest.mark.parametrize(
    ("num_configs", "workers", "batches"),
    [
        (5, 2, [[1, 2], [3, 4], [5]]),  # round(2.5) = 3 batches (Python 2's round)
        (20, 4, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16], [17, 18, 19, 20]]),
        (7, 3, [[1, 2, 3], [4, 5, 6, 7]]),  # the last batch takes what is left
        (1, 4, [[1]]),
        (5, 5, [[1, 2, 3, 4, 5]]),
    ],
)
def test_hyperopt_batches_as_madlib(num_configs: int, workers: int, batches: list) -> None:
    assert [list(b) for b in hb.hyperopt_batches(num_configs, workers)] == batches


def test_from_journal_rebuilds_the_run() -> None:
    run = hb.HyperbandRun(27, 3, 1)
    d0 = run.next_diagonal()
    assert d0 is not None
    run.report({k: 1.0 / k for k in d0.keys})
    again = hb.HyperbandRun.from_journal(run.journal.dumps())
    assert (again.R, again.eta, again.skip_last) == (27, 3, 1)
    assert again.next_diagonal() == run.next_diagonal()
    with pytest.raises(ArgumentError, match="not Hyperband's"):
        hb.HyperbandRun.from_journal(j.Journal(header={"method": "asha"}))


def test_brackets_report_where_the_search_stands() -> None:
    """What dvml's dashboard page shows: each started bracket's round, survivors, the
    iterations they trained (warm started round after round) and their best loss."""
    run = hb.HyperbandRun(9, 3, 0)  # brackets 2 (9 x 1), 1 (3 x 3), 0 (3 x 9)
    assert run.brackets() == {"done": 0, "diagonals": 3, "best": None, "loss": None,
                              "brackets": []}  # fmt: skip
    for scale in (1.0, 0.5):
        diagonal = run.next_diagonal()
        assert diagonal is not None
        run.report({k: scale / k for k in diagonal.keys})
    state = run.brackets()
    assert (state["done"], state["best"]) == (2, 12) and state["loss"] == pytest.approx(0.5 / 12)
    top, middle = state["brackets"]
    # bracket 2 kept 3 of 9 for round 1: 1 + 3 iterations; bracket 1 started: 3 iterations
    assert (top["s"], top["round"], top["rounds"], top["keys"], top["iterations"]) == (
        2, 1, 3, [7, 8, 9], 4)  # fmt: skip
    assert top["loss"] == pytest.approx(0.5 / 9)
    assert (middle["s"], middle["round"], middle["keys"], middle["iterations"]) == (
        1, 0, [10, 11, 12], 3)  # fmt: skip
    # a failed configuration (loss None) is not its bracket's best
    diagonal = run.next_diagonal()
    assert diagonal is not None
    run.report(dict.fromkeys(diagonal.keys, None))
    assert [b["loss"] for b in run.brackets()["brackets"]] == [None, None, None]
