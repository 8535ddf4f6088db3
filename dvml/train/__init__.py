"""Training: safe parsing of compile/fit parameters, trainer launch, fit, evaluate and predict.

This package owns turning MADlib-style parameter strings into checked values
(:mod:`dvml.train.params`), planning model configurations from MADlib's grids
(:mod:`dvml.train.config_search`, stored by :mod:`dvml.train.model_selection`) and running
TensorFlow trainers, one process per worker that holds
partitions. It leaves data placement to :mod:`dvml.placement`, storage to :mod:`dvml.store`,
reading local partitions to :mod:`dvml.resolve` and saving models to :mod:`dvml.registry`.
"""
