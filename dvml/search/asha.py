"""Asynchronous successive halving (ASHA; Li et al., MLSys 2020) as a pure state machine.

Rung ``k`` is reached after ``grace_period * eta**k`` iterations (the last rung after
``max_t``). When a worker is idle it asks (:class:`~dvml.search.journal.Ask`) and gets, as the
paper's ``get_job``:

1. a **promotion**: from the highest rung down, the best model that is in the top
   ``floor(n / eta)`` of its rung's ``n`` results and has not been promoted from it yet. It was
   parked there with its weights and optimizer state; it resumes from that checkpoint for the
   iterations up to the next rung. A model parked long ago is promoted as soon as enough worse
   results arrive in its rung: parking is never stopping;
2. else a **new configuration** from the sampler, while fewer than ``max_configs`` have started;
3. else **wait** (a running model may still make a promotion possible), or **stop** when nothing
   runs and nothing can be promoted, or when ``time_budget_s`` is spent.

A result (:class:`~dvml.search.journal.Result`) parks the model at its rung, or finishes it at
the top rung. A NaN or missing loss, or a failure (out of memory, an error), marks the
configuration failed: it ranks last in its rung (it still counts in the rung's size) and is
never promoted; the search goes on. The sampler learns each configuration's loss at the first
rung, the one budget every configuration gets, so TPE compares like with like.

Beyond the paper, for the workers of one cluster: the scheduler learns each worker's seconds per
iteration from the results; a worker much slower than the others (over 1.5x the median) is
given new configurations (short jobs) rather than promotions while new ones may be started, so
that one slow machine does not hold a long top-rung job.

Every event and decision goes to :attr:`Asha.journal`; :func:`dvml.search.journal.replay`
rebuilds the state from it. A promotion decision is ``O(log n)`` to insert a result and
``O(n / eta)`` at worst to find the candidate in a rung of ``n`` (benchmarked at 1,000
configurations). Pure: no I/O, no clock (``now`` comes with each event).
"""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from typing import Any

from dvml.configs.search_space import SearchSpace
from dvml.exceptions import ArgumentError
from dvml.search import journal as j
from dvml.search.automl_params import AshaParams, parse_automl_params
from dvml.search.hyperband import rank_key
from dvml.search.samplers import make_sampler

__all__ = ["Asha", "TrialState", "rungs"]

SLOW_FACTOR = 1.5
"""A worker slower than this times the median seconds per iteration gets no promotions while
new configurations may be started."""
_DUPLICATE_DRAWS = 50  # draws of an already-tried configuration before the space counts as spent


def rungs(max_t: int, eta: int, grace_period: int) -> list[int]:
    """The iterations of each rung: ``grace_period * eta**k`` below ``max_t``, then ``max_t``."""
    levels = []
    r = grace_period
    while r < max_t:
        levels.append(r)
        r *= eta
    levels.append(max_t)
    return levels


@dataclasses.dataclass
class TrialState:
    """One configuration's progress."""

    trial_id: int
    number: int
    model_id: int
    compile_params: str
    fit_params: str
    values: dict[str, Any]
    status: str = "running"
    """``running``, ``parked``, ``finished`` or ``failed``."""
    rung: int = -1
    """The highest rung reached (-1: none yet)."""
    target: int = 0
    """The rung its running job trains to."""
    iterations: int = 0
    losses: dict[int, float | None] = dataclasses.field(default_factory=dict)
    checkpoint: str | None = None
    worker: str | None = None


class Asha:
    """ASHA over a search space; :meth:`apply` one event, get one decision.

    Parameters
    ----------
    space : SearchSpace
    params : AshaParams
        ``max_t``, ``eta``, ``grace_period``, ``max_configs``, ``time_budget_s``, ``sampler``.
    seed : int, optional
        The sampler's seed (the search's ``random_state``).
    """

    def __init__(self, space: SearchSpace, params: AshaParams, seed: int | None = None) -> None:
        self.space = space
        self.params = params
        self.seed = seed
        self.levels = rungs(params.max_t, params.eta, params.grace_period)
        self.sampler = make_sampler(params.sampler, space, seed)
        self.trials: dict[int, TrialState] = {}
        # per rung: sorted (rank key, trial_id) of its results; and who left it promoted
        self._ranked: list[list[tuple[tuple[int, float], int]]] = [[] for _ in self.levels]
        self._promoted: list[set[int]] = [set() for _ in self.levels]
        self._seen: set[tuple[int, str, str]] = set()
        self._spent = False  # the sampler found no new configuration
        self._queue: list[int] = []  # in flight when the search died; given out first
        self._speed: dict[str, float] = {}  # worker → seconds per iteration (moving average)
        self.stopped: str | None = None
        self.journal = j.Journal(
            header={
                "method": "asha",
                "automl_params": params.text(),
                "seed": seed,
                "space": space.header(),
            }
        )

    @classmethod
    def from_journal(cls, journal: j.Journal | str) -> Asha:
        """The search a journal (or its text) wrote, rebuilt by replaying it: resume here.

        Raises
        ------
        ArgumentError
            When the journal is not an ASHA search's, or does not replay.
        """
        journal = j.Journal.loads(journal) if isinstance(journal, str) else journal
        header = journal.header
        if header.get("method") != "asha":
            raise ArgumentError(
                f"The journal is a {header.get('method')!r} search's, not ASHA's. Received: "
                f"method={header.get('method')!r}. Resume it with its own scheduler."
            )
        space = SearchSpace.from_header(header["space"])
        params = parse_automl_params("asha", header["automl_params"])
        fresh = cls(space, params, seed=header["seed"])  # type: ignore[arg-type]
        return j.replay(journal, fresh)  # type: ignore[return-value]

    # ------------------------------------------------------------------ events

    def apply(self, event: Any) -> Any:
        """Take one event (Ask, Result, Failure, Resume, Departed); return the decision,
        journaled."""
        if isinstance(event, j.Ask):
            decision = self._ask(event)
        elif isinstance(event, j.Result):
            decision = self._result(event)
        elif isinstance(event, j.Failure):
            decision = self._fail(event.trial_id, event.reason)
        elif isinstance(event, j.Resume):
            decision = self._resume()
        elif isinstance(event, j.Departed):
            decision = self._departed(event)
        else:
            raise ArgumentError(
                f"ASHA takes Ask, Result, Failure, Resume or Departed events. Received: "
                f"{type(event).__name__} {event!r:.80}."
            )
        self.journal.append(event, decision)
        return decision

    def ask(self, worker: str, now: float = 0.0) -> Any:
        return self.apply(j.Ask(worker, now))

    def report(self, trial_id: int, iterations: int, loss: float | None, **kw: Any) -> Any:
        return self.apply(j.Result(trial_id, iterations, loss, **kw))

    # ------------------------------------------------------------------ state

    @property
    def running(self) -> list[int]:
        return [t.trial_id for t in self.trials.values() if t.status == "running"]

    @property
    def finished(self) -> list[int]:
        return [t.trial_id for t in self.trials.values() if t.status == "finished"]

    def rung_sizes(self) -> list[int]:
        """How many results (failed ones included) each rung holds."""
        return [len(ranked) for ranked in self._ranked]

    def best(self) -> int | None:
        """The trial with the lowest loss at the highest rung reached (None before a result).
        A failed trial is never the best, whatever loss it reported at a lower rung."""
        for k in range(len(self.levels) - 1, -1, -1):
            for rank, trial_id in self._ranked[k]:
                if rank[0] == 0 and self.trials[trial_id].status != "failed":
                    return trial_id
        return None

    # ------------------------------------------------------------------ decisions

    def _ask(self, event: j.Ask) -> Any:
        budget = self.params.time_budget_s
        if self.stopped is None and budget is not None and event.now >= budget:
            self.stopped = f"time budget of {budget:g} s spent"
        if self.stopped is not None:
            return j.Stop(self.stopped)
        if self._queue:
            return self._run_again(self._queue.pop(0), event.worker)
        candidate = self._promotable()
        may_start = len(self.trials) < self.params.max_configs and not self._spent
        if candidate is not None and not (may_start and self._slow(event.worker)):
            return self._promote(candidate, event.worker)
        if may_start:
            decision = self._start(event.worker)
            if decision is not None:
                return decision
        if candidate is not None:
            return self._promote(candidate, event.worker)
        if not self.running:
            self.stopped = "every configuration has run as far as ASHA lets it"
            return j.Stop(self.stopped)
        return j.Wait(event.worker)

    def _promotable(self) -> tuple[int, int] | None:
        """``(trial_id, rung)``: the best promotable model, from the highest rung down."""
        for k in range(len(self.levels) - 2, -1, -1):
            ranked = self._ranked[k]
            top = len(ranked) // self.params.eta
            promoted = self._promoted[k]
            for key, trial_id in ranked[:top]:
                if key[0] != 0:  # failed ones rank last; never promoted
                    break
                if trial_id not in promoted and self.trials[trial_id].status == "parked":
                    return trial_id, k
        return None

    def _slow(self, worker: str) -> bool:
        mine = self._speed.get(worker)
        if mine is None or len(self._speed) < 2:
            return False
        return mine > SLOW_FACTOR * statistics.median(self._speed.values())

    def _promote(self, candidate: tuple[int, int], worker: str) -> j.Promote:
        trial_id, k = candidate
        trial = self.trials[trial_id]
        self._promoted[k].add(trial_id)
        trial.status, trial.worker, trial.target = "running", worker, k + 1
        return j.Promote(
            trial_id, worker, k + 1, self.levels[k + 1] - trial.iterations, trial.checkpoint
        )

    def _start(self, worker: str) -> j.Start | None:
        for _ in range(_DUPLICATE_DRAWS):
            number, values = self.sampler.ask()
            model_id, compile_text, fit_text = self.space.config(values)
            key = (model_id, compile_text, fit_text)
            if key not in self._seen:
                break
            self.sampler.tell(number, None)  # a repeat teaches nothing; TPE leaves it out
        else:
            self._spent = True
            return None
        self._seen.add(key)
        trial_id = len(self.trials) + 1
        self.trials[trial_id] = TrialState(
            trial_id, number, model_id, compile_text, fit_text, values, worker=worker
        )
        return j.Start(
            trial_id, worker, self.levels[0], model_id, compile_text, fit_text, values, number
        )

    def _run_again(self, trial_id: int, worker: str) -> Any:
        trial = self.trials[trial_id]
        trial.worker = worker
        if trial.rung < 0:
            return j.Start(
                trial_id, worker, self.levels[0], trial.model_id, trial.compile_params,
                trial.fit_params, trial.values, trial.number, retry=True,
            )  # fmt: skip
        return j.Promote(
            trial_id, worker, trial.target, self.levels[trial.target] - trial.iterations,
            trial.checkpoint, retry=True,
        )  # fmt: skip

    def _trial(self, trial_id: int, what: str) -> TrialState:
        trial = self.trials.get(trial_id)
        if trial is None or trial.status != "running":
            state = "unknown" if trial is None else trial.status
            raise ArgumentError(
                f"{what} for trial {trial_id}, which is not running (it is {state}). Received: "
                f"trial_id={trial_id}. Report only the trials a Start or Promote gave out."
            )
        return trial

    def _result(self, event: j.Result) -> Any:
        trial = self._trial(event.trial_id, "A result")
        expected = self.levels[trial.target]
        if event.iterations != expected:
            raise ArgumentError(
                f"Trial {trial.trial_id} was to train to {expected} iterations (rung "
                f"{trial.target}). Received: iterations={event.iterations}. Report the total "
                "iterations the model has trained."
            )
        if event.worker and event.elapsed_s > 0:
            done = expected - trial.iterations
            rate = event.elapsed_s / max(done, 1)
            old = self._speed.get(event.worker)
            self._speed[event.worker] = rate if old is None else 0.5 * old + 0.5 * rate
        trial.iterations = expected
        trial.checkpoint = event.checkpoint
        if event.loss is None:
            return self._fail(trial.trial_id, "its loss is not a finite number (NaN or inf)")
        k = trial.target
        trial.rung, trial.worker = k, None
        trial.losses[k] = event.loss
        bisect.insort(self._ranked[k], (rank_key(event.loss), trial.trial_id))
        if k == 0:
            self.sampler.tell(trial.number, event.loss)
        if k == len(self.levels) - 1:
            trial.status = "finished"
            return j.Finish(trial.trial_id, event.loss)
        trial.status = "parked"
        return j.Park(trial.trial_id, k, event.loss)

    def _fail(self, trial_id: int, reason: str) -> j.Fail:
        trial = self._trial(trial_id, "A failure")
        k = trial.target
        trial.status, trial.worker = "failed", None
        trial.losses[k] = None
        bisect.insort(self._ranked[k], (rank_key(None), trial_id))
        if k == 0:
            self.sampler.tell(trial.number, None)
        if trial_id in self._queue:
            self._queue.remove(trial_id)
        return j.Fail(trial_id, reason)

    def _resume(self) -> j.Queued:
        self._queue = sorted(self.running)
        return j.Queued(list(self._queue))

    def _departed(self, event: j.Departed) -> j.Queued:
        """Workers left: their speeds are forgotten, ``requeue`` goes first in the queue,
        ``lost`` is failed (a parked or finished one ranks last in its rung from now on)."""
        reason = (
            f"its state was lost with worker(s) {', '.join(event.workers)}"
            if event.workers
            else "its checkpoint was gone when the search resumed"
        )
        for trial_id in event.lost:
            trial = self.trials[trial_id]
            if trial.status == "running":
                self._fail(trial_id, reason)
                continue
            k = trial.rung
            if k >= 0 and trial.status != "failed":
                self._ranked[k].remove((rank_key(trial.losses.get(k)), trial_id))
                bisect.insort(self._ranked[k], (rank_key(None), trial_id))
                trial.losses[k] = None
            trial.status, trial.worker = "failed", None
        for worker in event.workers:
            self._speed.pop(worker, None)
        self._queue = [*event.requeue, *(q for q in self._queue if q not in event.requeue)]
        return j.Queued(list(event.requeue))
