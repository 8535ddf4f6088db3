"""The per-output locks (:mod:`dvml.train.model_lock`) without a cluster: one holder per name,
``fit_multiple``/``automl`` apart from ``fit``, the holder named in the refusal, released after
the block. ``flock`` is per open file, so two holders in one process exclude each other too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dvml.exceptions import FitRunningError
from dvml.train.model_lock import holding_model, holding_output


def test_a_second_run_of_one_model_output_is_refused_naming_the_first(tmp_path: Path) -> None:
    with holding_output(tmp_path, "grid", "dvml.automl 'grid' method='asha'", "dvml.automl"):
        with (
            pytest.raises(FitRunningError, match=r"dvml.fit_multiple refused: the run 'grid'") as e,
            holding_output(tmp_path, "grid", "dvml.fit_multiple k", "dvml.fit_multiple"),
        ):
            pass
        message = str(e.value)
        assert "job dvml.automl 'grid' method='asha'" in message and f"pid {os.getpid()}" in message
        assert "Received: model_output='grid'" in message
        # another output, and fit's model of the same name, are other locks
        with (
            holding_output(tmp_path, "grid2", "j", "dvml.fit_multiple"),
            holding_model(tmp_path, "grid", "j"),
        ):
            pass
    with holding_output(tmp_path, "grid", "dvml.fit_multiple k", "dvml.fit_multiple"):
        pass  # released when the first block ended


def test_the_lock_is_released_when_the_run_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), holding_output(tmp_path, "grid", "j", "dvml.fit_multiple"):
        raise RuntimeError("a trainer failed")
    with holding_output(tmp_path, "grid", "j", "dvml.fit_multiple"):
        pass
