"""YAML job files: their schema and what a job does with them, shared by the CLI and workflows.

``dvml fit|evaluate|predict --config FILE`` and the scheduled workflows in ``workflows/`` read
the same file format (``dvml fit-multiple --config`` its own, with the same data sections):

- :mod:`dvml.jobs.yaml_schema`: a small schema (key → type, required, default, help; nested
  sections) and the loader that checks a file before anything runs (pure).
- :mod:`dvml.jobs.schemas`: the schemas of job files (pure).
- :mod:`dvml.jobs.job_cluster`: which cluster a job uses; cleaning up after a killed client.
- :mod:`dvml.jobs.data`: the newest input matching ``data.source``; preprocessing it.
- :mod:`dvml.jobs.models`: architectures named in job files, model copies, promotion rules.
- :mod:`dvml.jobs.appends`: ``data.append: true``, packing only a growing source's new files
  (checked for schema, class values and drift) as a new dataset version.
- :mod:`dvml.jobs.file_diff`: which files of a listing are new, changed or gone (pure).
- :mod:`dvml.jobs.drift`: the population stability index of new rows against old (pure).

This package leaves preprocessing, training and storage to :mod:`dvml.preprocess`,
:mod:`dvml.train` and :mod:`dvml.store`; the lock and journal of scheduled runs live with the
workflows.
"""

from dvml.jobs.schemas import (
    FEATURE_REFRESH_SCHEMA,
    FIT_MULTIPLE_SCHEMA,
    JOB_SCHEMA,
    MODEL_CONFIGS_SCHEMA,
)
from dvml.jobs.yaml_schema import Field, Section, describe, load, validate

__all__ = [
    "FEATURE_REFRESH_SCHEMA",
    "FIT_MULTIPLE_SCHEMA",
    "JOB_SCHEMA",
    "MODEL_CONFIGS_SCHEMA",
    "Field",
    "Section",
    "describe",
    "load",
    "validate",
]
