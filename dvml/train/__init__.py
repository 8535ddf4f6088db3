"""Training: the trainer runtime, and the schedulers on it.

Every way to train is a *scheduler* over one *runtime* (:mod:`dvml.train.runtime`: the
planner, the trainer protocol, the process supervisor with the client lease, the checkpoint
store, the failure watcher and the trainer process itself). The schedulers here decide which
model trains on which worker for how long: :mod:`dvml.train.fit` (every trainer in lock-step
on one model) and :mod:`dvml.train.fit_multiple` (MADlib's model hopper, whose iteration loop
:mod:`dvml.train.hop_loop` the model searches share). Around them: model selection tables in
the registry (:mod:`dvml.train.model_selection`), summaries, evaluate and predict. The
configuration language (compile/fit parameters, grids, model selection rows) is
:mod:`dvml.configs`'; data placement is :mod:`dvml.placement`'s, storage :mod:`dvml.store`'s,
reading local partitions :mod:`dvml.resolve`'s and saving models :mod:`dvml.registry`'s.

``dvml.train.params``, ``dvml.train.config_search`` and ``dvml.train.keras_objects`` moved to
:mod:`dvml.configs`; ``from dvml.train import params`` (and the other two) still gives their
names, for a release.
"""

from __future__ import annotations

from types import ModuleType


def __getattr__(name: str) -> ModuleType:
    # The parameter language moved to dvml.configs (issue 41); the old module names stay
    # importable from here for a release, without loading dvml.configs on `import dvml.train`.
    if name in ("params", "config_search"):
        import dvml.configs

        return dvml.configs
    if name == "keras_objects":
        from dvml.configs import keras_objects

        return keras_objects
    raise AttributeError(f"module 'dvml.train' has no attribute {name!r}")
