"""Model search that stops bad configurations early: MADlib's AutoML and ASHA, as pure schedulers.

The package decides; it never trains. Each scheduler is a state machine that takes events (a
worker asks for work, a model finished ``k`` iterations with loss ``L``, a model failed) and
returns decisions (start a new configuration, promote a parked model to the next rung, park,
finish, fail, stop), so that a driver on top of any trainer runtime carries them out:

- :mod:`dvml.search.hyperband`: MADlib's ``hyperband_schedule`` table and its diagonal
  Hyperband, and the batches of MADlib's ``hyperopt``;
- :mod:`dvml.search.asha`: asynchronous successive halving (Li et al., MLSys 2020): promotion as
  soon as a model is in the top ``1/eta`` of its rung, parked models promoted later, new
  configurations on idle workers;
- :mod:`dvml.search.hyperopt_run`: MADlib's hyperopt (batches of proposals, losses told back);
- :mod:`dvml.search.automl_params`: MADlib's ``automl_params`` strings, checked before anything
  runs;
- :mod:`dvml.search.samplers`: configurations drawn from MADlib's grids through the one search
  space of :mod:`dvml.configs.search_space` (ranges ``[lo, hi, 'linear' | 'log' |
  'log_near_one']`` included), at random (seeded) or by Optuna's TPE (the optional extra
  ``dvml[automl]``);
- :mod:`dvml.search.journal`: every event and decision as JSON, so a search resumes by
  replaying its journal into a fresh state machine;
- :mod:`dvml.search.simulation`: workers of given speeds driving a scheduler, no cluster (B16).

The schedulers are pure: plain values in and out, no I/O, no cluster; they import only the
exceptions and the configuration language (:mod:`dvml.configs`: the grids, the search space,
the parameter parsers). The drivers carry the decisions out on ONE job of the trainer
runtime's serving trainers per search: :mod:`dvml.search.driver` (``dvml.automl``),
:mod:`dvml.search.asha_driver` (ASHA), :mod:`dvml.search.hop_search` (Hyperband's diagonals and
hyperopt's batches with ``fit_multiple``'s MOP loop), :mod:`dvml.search.outcome` (MADlib's
tables from a search's history, for every driver).
"""
