"""The pure steps of the pack graph: split a prepared part, take a target's piece."""

from __future__ import annotations

import numpy as np

from dvml.placement.planner import plan_pieces
from dvml.preprocess.tasks import split_part, take_piece


def _part(n: int) -> dict:
    x = np.arange(n * 3, dtype=np.uint8).reshape(n, 3)  # row i holds 3i, 3i+1, 3i+2
    labels = np.array(["a", "b", "c"] * (n // 3) + ["a"] * (n % 3))
    return {"x": [x], "labels": labels}


def test_split_part_lays_out_normalized_encoded_rows_in_a_permutation() -> None:
    part = _part(10)
    laid_out = split_part(part, [4, 0, 6], 3, ["a", "b", "c"], 4, 2.0)
    assert laid_out["x_0"].dtype == np.float32
    rows = (laid_out["x_0"][:, 0] * 2 / 3).round().astype(int)  # source row of each row
    assert sorted(rows) == list(range(10))
    np.testing.assert_allclose(laid_out["x_0"], part["x"][0][rows].astype(np.float32) / 2)
    # one-hot over 4 classes (num_classes pads), moved with its row
    assert laid_out["y"].shape == (10, 4)
    np.testing.assert_array_equal(
        laid_out["y"].argmax(1), [("abc").index(c) for c in part["labels"][rows]]
    )
    again = split_part(part, [4, 0, 6], 3, ["a", "b", "c"], 4, 2.0)
    np.testing.assert_array_equal(again["x_0"], laid_out["x_0"])


def test_split_part_lays_out_each_output_of_a_multi_output_part() -> None:
    part = _part(10)
    # a second output (an int label: the row's parity) and a third already one-hot encoded
    parity = np.arange(10) % 2
    part["more_labels"] = [parity, np.eye(2, dtype=np.int32)[1 - parity]]
    dtypes = {"x_0": "float32", "y": "uint8", "y_1": "uint8", "y_2": "float32"}
    laid_out = split_part(
        part, [4, 0, 6], 3, ["a", "b", "c"], 3, 2.0, dtypes, [([0, 1], 2), (None, 3)]
    )
    rows = (laid_out["x_0"][:, 0] * 2 / 3).round().astype(int)
    # every output moved with its row: y as class indices, y_1 too, y_2 one-hot padded to 3
    np.testing.assert_array_equal(laid_out["y"], [("abc").index(c) for c in part["labels"][rows]])
    np.testing.assert_array_equal(laid_out["y_1"], rows % 2)
    assert laid_out["y_2"].shape == (10, 3) and laid_out["y_2"].dtype == np.float32
    np.testing.assert_array_equal(laid_out["y_2"].argmax(1), 1 - rows % 2)


def test_take_piece_is_a_view_of_one_target_rows() -> None:
    counts = np.array([[2, 3, 5]])
    plan = plan_pieces(counts, ["w1", "w0", "w1"])
    laid_out = split_part(_part(10), plan.ordered_counts[0].tolist(), 0, ["a", "b", "c"], 3, 1.0)
    w1 = plan.targets.index("w1")
    piece = take_piece(laid_out, *plan.piece_ranges[0, w1])
    assert len(piece["x_0"]) == 7 and len(piece["y"]) == 7
    assert np.shares_memory(piece["x_0"], laid_out["x_0"])  # moved once, copied never here
    buffer_2 = piece["x_0"][slice(*plan.buffer_ranges[0, 2])]
    assert len(buffer_2) == 5


def test_many_single_column_inputs_warn_and_one_grouped_input_does_not() -> None:
    import warnings

    import dask.dataframe as dd
    import pandas as pd
    import pytest

    from dvml.preprocess.sources import MANY_INPUTS, source_parts

    columns = [f"f{i}" for i in range(MANY_INPUTS + 1)]
    frame = pd.DataFrame(np.zeros((4, len(columns))), columns=columns).assign(y=[0, 1, 0, 1])
    ddf = dd.from_pandas(frame, npartitions=2)
    with pytest.warns(UserWarning, match=r"x=\[\['f0', \.\.\.\]\]"):
        flat = source_parts(ddf, "y", columns, 2, "raise", None, 3)
    assert len(flat.x_names) == MANY_INPUTS + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grouped = source_parts(ddf, "y", [columns], 2, "raise", None, 3)
    assert grouped.x_names == [columns]
