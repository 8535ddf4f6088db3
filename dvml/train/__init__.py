"""Training: MADlib-style parameters, the trainer runtime, and the schedulers on it.

Every way to train is a *scheduler* over one *runtime* (:mod:`dvml.train.runtime`: the
planner, the trainer protocol, the process supervisor with the client lease, the checkpoint
store, the failure watcher and the trainer process itself). The schedulers here decide which
model trains on which worker for how long: :mod:`dvml.train.fit` (every trainer in lock-step
on one model) and :mod:`dvml.train.fit_multiple` (MADlib's model hopper, whose iteration loop
:mod:`dvml.train.hop_loop` the model searches share). Around them: safe
parsing of compile/fit parameters (:mod:`dvml.train.params`), MADlib's grids
(:mod:`dvml.train.config_search`, stored by :mod:`dvml.train.model_selection`), summaries,
evaluate and predict. Data placement is :mod:`dvml.placement`'s, storage :mod:`dvml.store`'s,
reading local partitions :mod:`dvml.resolve`'s and saving models :mod:`dvml.registry`'s.
"""
