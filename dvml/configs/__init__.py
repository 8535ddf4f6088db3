"""Configurations: the parameter language, the grid language and model selection rows. Pure.

What a user writes to say how a model trains, checked on the client before anything runs:

- MADlib-style compile and fit parameters, ``"loss='mse', optimizer='SGD(lr=0.01)'"`` and
  ``"batch_size=32, epochs=2"`` (:mod:`~dvml.configs.compile_params`,
  :mod:`~dvml.configs.fit_params`), read by a safe literal reader that evaluates nothing
  (:mod:`~dvml.configs.literals`), each value checked (:mod:`~dvml.configs.value_checks`), the
  optimizer, losses and metrics looked up in tf-keras' own classes
  (:mod:`~dvml.configs.optimizers`, :mod:`~dvml.configs.keras_specs`,
  :mod:`~dvml.configs.keras_objects`) and written back as text
  (:mod:`~dvml.configs.param_text`);
- MADlib's grids (:mod:`~dvml.configs.grids`), searched by ``model_configs``
  (:mod:`~dvml.configs.config_plans`) and drawn from by every search method through one search
  space (:mod:`~dvml.configs.search_space`);
- the model selection row, :class:`ModelConfig`, with its one check
  (:func:`check_config_rows`, one ``mst_key`` rule).

It owns no I/O: the registry stores the rows (:mod:`dvml.registry`), the schedulers train them
(:mod:`dvml.train`, :mod:`dvml.search`). It imports no Dask, vineyard or TensorFlow at module
level; :func:`build_optimizer` and :func:`compile_kwargs` start tf-keras lazily, in a trainer.
"""

from dvml.configs.compile_params import COMPILE_KEYS, compile_kwargs, parse_compile_params
from dvml.configs.config_plans import cross_configs, plan_configs
from dvml.configs.fit_params import FIT_KEYS, parse_fit_params
from dvml.configs.grids import (
    DISTRIBUTIONS,
    INT_KEYS,
    MAX_CONFIGS,
    OPTIMIZER_PARAMS_LIST,
    SEARCHES,
    parse_grid,
    parse_grids,
)
from dvml.configs.keras_specs import object_text, reported_name
from dvml.configs.literals import MAX_DEPTH, MAX_LENGTH, bracket_depth
from dvml.configs.model_config import (
    COLUMNS,
    ModelConfig,
    check_arch_ids,
    check_config_rows,
    check_mst_key,
    kept_texts,
)
from dvml.configs.optimizers import build_optimizer
from dvml.configs.param_text import format_params, params_key, params_text
from dvml.configs.search_space import Dimension, Draw, RandomDraw, SearchSpace

__all__ = [
    "COLUMNS",
    "COMPILE_KEYS",
    "DISTRIBUTIONS",
    "FIT_KEYS",
    "INT_KEYS",
    "MAX_CONFIGS",
    "MAX_DEPTH",
    "MAX_LENGTH",
    "OPTIMIZER_PARAMS_LIST",
    "SEARCHES",
    "Dimension",
    "Draw",
    "ModelConfig",
    "RandomDraw",
    "SearchSpace",
    "bracket_depth",
    "build_optimizer",
    "check_arch_ids",
    "check_config_rows",
    "check_mst_key",
    "compile_kwargs",
    "cross_configs",
    "format_params",
    "kept_texts",
    "object_text",
    "params_key",
    "params_text",
    "parse_compile_params",
    "parse_fit_params",
    "parse_grid",
    "parse_grids",
    "plan_configs",
    "reported_name",
]
