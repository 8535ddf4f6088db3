"""MADlib's hyperopt as a state machine: batches of proposals, each loss told back.

MADlib (``madlib_keras_automl_hyperopt.py_in``) proposes configurations in batches of as many
as there are workers (:func:`~dvml.search.hyperband.hyperopt_batches`), trains each batch for
``num_iterations`` in one ``fit_multiple`` call and tells the sampler (random, or TPE) every
loss before it proposes the next batch. :class:`HyperoptRun` does the proposing and the
telling; a driver trains. Its journal (:mod:`dvml.search.journal`) holds every proposal (the
sampler's point and the configuration) and every loss, so a search replays into a fresh
:class:`HyperoptRun` with the same seed. A configuration proposed twice is drawn again (told to
the sampler as failed, which TPE leaves out). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dvml.configs.search_space import SearchSpace
from dvml.exceptions import ArgumentError
from dvml.search import journal as j
from dvml.search.automl_params import HyperoptParams, parse_automl_params
from dvml.search.hyperband import Done, Losses, Reported, hyperopt_batches, rank_key
from dvml.search.samplers import make_sampler

__all__ = ["Batch", "HyperoptRun", "NextBatch"]

_REDRAWS = 50


@j.record_type("next_batch")
@dataclasses.dataclass(frozen=True)
class NextBatch:
    """Event: the previous batch is done (or none ran yet); propose the next one."""


@j.record_type("batch")
@dataclasses.dataclass(frozen=True)
class Batch:
    """Decision: configurations to train together, ``num_iterations`` each, from scratch."""

    index: int
    num_iterations: int
    rows: list[dict[str, Any]]
    """``mst_key``, ``model_id``, ``compile_params``, ``fit_params``, and the sampler's
    ``number`` and ``values``."""

    @property
    def keys(self) -> list[int]:
        return [int(r["mst_key"]) for r in self.rows]


class HyperoptRun:
    """MADlib's hyperopt: :meth:`next_batch`, train it, :meth:`report` its losses, repeat.

    Parameters
    ----------
    space : SearchSpace
    params : HyperoptParams
        ``num_configs``, ``num_iterations``, ``algorithm`` (``tpe`` or ``rand``).
    num_workers : int
        The workers that train (MADlib's segments): the size of a batch.
    seed : int, optional
        The sampler's seed (MADlib's ``random_state``).
    """

    def __init__(
        self, space: SearchSpace, params: HyperoptParams, num_workers: int, seed: int | None = None
    ) -> None:
        self.space, self.params = space, params
        self.batches = hyperopt_batches(params.num_configs, num_workers)
        self.sampler = make_sampler(params.algorithm, space, seed)
        self.losses: dict[int, float | None] = {}
        self._numbers: dict[int, int] = {}
        self._seen: set[tuple[int, str, str]] = set()
        self._next = 0
        self._pending: Batch | None = None
        self.journal = j.Journal(
            header={
                "method": "hyperopt",
                "automl_params": params.text(),
                "num_workers": num_workers,
                "seed": seed,
                "space": space.header(),
            }
        )

    @classmethod
    def from_journal(cls, journal: j.Journal | str) -> HyperoptRun:
        """The search a journal (or its text) wrote, rebuilt by replaying it: resume here."""
        journal = j.Journal.loads(journal) if isinstance(journal, str) else journal
        header = journal.header
        if header.get("method") != "hyperopt":
            raise ArgumentError(
                f"The journal is a {header.get('method')!r} search's, not hyperopt's. Received: "
                f"method={header.get('method')!r}. Resume it with its own scheduler."
            )
        params = parse_automl_params("hyperopt", header["automl_params"])
        space = SearchSpace.from_header(header["space"])
        fresh = cls(space, params, header["num_workers"], header["seed"])  # type: ignore[arg-type]
        return j.replay(journal, fresh)  # type: ignore[return-value]

    def apply(self, event: Any) -> Any:
        """Take NextBatch or Losses; return Batch, Done or Reported (journaled)."""
        if isinstance(event, NextBatch):
            decision: Any = self._batch()
        elif isinstance(event, Losses):
            self._report({int(k): loss for k, loss in event.losses})
            decision = Reported(self.best())
        else:
            raise ArgumentError(
                f"HyperoptRun takes NextBatch or Losses events. Received: "
                f"{type(event).__name__} {event!r:.80}."
            )
        self.journal.append(event, decision)
        return decision

    def next_batch(self) -> Batch | None:
        decision = self.apply(NextBatch())
        return decision if isinstance(decision, Batch) else None

    def report(self, losses: Mapping[int, float | None]) -> None:
        self.apply(Losses([[int(k), j.finite(v)] for k, v in sorted(losses.items())]))

    def best(self) -> int | None:
        if not self.losses:
            return None
        return min(self.losses, key=lambda k: (rank_key(self.losses[k]), k))

    def _batch(self) -> Batch | Done:
        if self._pending is not None:
            missing = sorted(set(self._pending.keys) - set(self.losses))
            raise ArgumentError(
                f"Batch {self._pending.index} is not finished: no loss reported for mst_key "
                f"{missing[:10]}. Received: a request for the next batch. Report every loss "
                "first (a failed one as None)."
            )
        if self._next >= len(self.batches):
            return Done(self.best())
        rows = []
        for key in self.batches[self._next]:
            for _ in range(_REDRAWS):
                number, values = self.sampler.ask()
                config = self.space.config(values)
                if config not in self._seen:
                    break
                self.sampler.tell(number, None)
            else:
                raise ArgumentError(
                    f"The grids hold fewer than num_configs={self.params.num_configs} distinct "
                    f"configurations ({len(self._seen)} found). Received: automl_params="
                    f"{self.params.text()!r}. Ask for fewer, or widen the grids."
                )
            self._seen.add(config)
            self._numbers[key] = number
            model_id, compile_text, fit_text = config
            rows.append({"mst_key": key, "model_id": model_id, "compile_params": compile_text,
                         "fit_params": fit_text, "number": number, "values": values})  # fmt: skip
        batch = Batch(self._next, self.params.num_iterations, rows)
        self._next += 1
        self._pending = batch
        return batch

    def _report(self, losses: Mapping[int, float | None]) -> None:
        if self._pending is None:
            raise ArgumentError(
                "No batch is pending. Received: a report of losses. Call next_batch() first."
            )
        unknown = sorted(set(losses) - set(self._pending.keys))
        if unknown:
            raise ArgumentError(
                f"mst_key {unknown[:10]} is not in batch {self._pending.index}. Received: losses "
                f"for {sorted(losses)[:10]}. Report only {self._pending.keys[:10]}."
            )
        for key, loss in losses.items():
            self.losses[key] = loss
            self.sampler.tell(self._numbers[key], loss)
        if set(self._pending.keys) <= set(self.losses):
            self._pending = None
