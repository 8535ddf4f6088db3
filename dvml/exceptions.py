"""The one exception tree of dvml.

Every error dvml raises on purpose is a :class:`DvmlError`. Errors about bad input also derive
from the matching builtin (``ValueError``, ``TypeError``, ``LookupError``), so code written
against the builtins keeps working. Messages follow one form: what went wrong, what was
received, and what to do next.

::

    DvmlError
    ├── ArgumentError (ValueError)          an argument's value is invalid
    ├── ArgumentTypeError (TypeError)       an argument has the wrong type
    ├── ConfigError (ValueError)            a configuration value or file is invalid
    ├── ClusterError                        the cluster cannot do what was asked
    │   ├── ClusterStartError               a LocalCluster failed to start (and was cleaned up)
    │   ├── DaemonDiedError                 an etcd or vineyardd process is not running
    │   │   └── VineyarddDiedError          a worker's vineyardd (its data is lost)
    │   ├── NoClusterError                  no Dask client is available
    │   └── SharedMemoryError (ValueError)  /dev/shm cannot hold the vineyardd memory asked for
    ├── LockHeldError                       another process holds a run lock
    │   ├── FitRunningError                 another fit of the same model is running
    │   └── DatasetInUseError               a job reads the dataset (drop/overwrite refused)
    ├── PlacementError (ValueError)         distribution rules resolve to nothing usable
    ├── DataError (ValueError)              the input data cannot be preprocessed
    ├── StoreError                          vineyard storage failed
    │   ├── DatasetNotFoundError (LookupError)
    │   ├── DatasetExistsError
    │   ├── LeaseBrokenError                a dataset a job read was dropped with force=True
    │   └── VineyardMemoryError             a vineyardd has no room for a buffer
    │       └── MemoryPlanError             a job's memory plan does not fit: refused first
    ├── ParameterError (ValueError)         a compile/fit parameter string or dict is invalid
    ├── RegistryError                       the model registry failed
    │   └── RegistryNotFoundError (LookupError)
    ├── ModelMismatchError (ValueError)     data and architecture do not fit each other
    └── TrainingError                       a trainer failed
        ├── TrainerFailedError              one trainer process died or raised
        │   └── WorkerDepartedError         a trainer's worker left the cluster
        ├── TrainerStoppedError             dvml stopped a trainer (a peer failed, a timeout,
        │                                   its client went away)
        └── ProtocolError                   a trainer line that is not a known message

Use the most specific class that fits; :class:`ArgumentError` and :class:`ArgumentTypeError`
are for arguments no specific class covers. ``tests/test_error_contract.py`` fails on any
``raise ValueError(...)`` (or other builtin) in ``dvml/`` outside its commented allow-list.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "ClusterError",
    "ClusterStartError",
    "ConfigError",
    "DaemonDiedError",
    "DataError",
    "DatasetExistsError",
    "DatasetInUseError",
    "DatasetNotFoundError",
    "DvmlError",
    "FitRunningError",
    "LeaseBrokenError",
    "LockHeldError",
    "MemoryPlanError",
    "ModelMismatchError",
    "NoClusterError",
    "ParameterError",
    "PlacementError",
    "ProtocolError",
    "RegistryError",
    "RegistryNotFoundError",
    "SharedMemoryError",
    "StoreError",
    "TrainerFailedError",
    "TrainerStoppedError",
    "TrainingError",
    "VineyardMemoryError",
    "VineyarddDiedError",
    "WorkerDepartedError",
]


class DvmlError(Exception):
    """Base class of every error that dvml raises on purpose."""


class ArgumentError(DvmlError, ValueError):
    """An argument's value is invalid and no more specific error applies."""


class ArgumentTypeError(DvmlError, TypeError):
    """An argument has the wrong type and no more specific error applies."""


class ConfigError(DvmlError, ValueError):
    """A configuration value or file is invalid."""


class ClusterError(DvmlError):
    """The cluster cannot do what was asked."""


class ClusterStartError(ClusterError):
    """A cluster failed to start; everything it had started was stopped again."""


class DaemonDiedError(ClusterError):
    """An etcd or vineyardd process that dvml needs is not running."""


class VineyarddDiedError(DaemonDiedError):
    """A worker's vineyardd is not running: the data it held is lost, the rest still works."""


class NoClusterError(ClusterError):
    """No Dask client was given and none is set as the default."""


class SharedMemoryError(ClusterError, ValueError):
    """Free ``/dev/shm`` cannot hold the vineyardd memory asked for (or cannot be read)."""


class LockHeldError(DvmlError):
    """Another process holds a run lock; nothing was started."""


class FitRunningError(LockHeldError):
    """Another fit of the same model is running; nothing was started."""


class DatasetInUseError(LockHeldError):
    """A running job (a fit) holds a lease on the dataset: dropping or overwriting it is refused."""


class PlacementError(DvmlError, ValueError):
    """Distribution rules do not resolve to a usable list of workers."""


class DataError(DvmlError, ValueError):
    """The input data cannot be preprocessed as asked."""


class StoreError(DvmlError):
    """Storing or reading an object in vineyard failed."""


class DatasetNotFoundError(StoreError, LookupError):
    """No dataset or feature cache of that name exists."""


class DatasetExistsError(StoreError):
    """A dataset of that name exists and ``overwrite=True`` was not given."""


class LeaseBrokenError(StoreError):
    """A dataset a job read was dropped or overwritten with ``force=True`` (or its lease
    expired) while the job ran: the job fails instead of registering what it trained."""


class VineyardMemoryError(StoreError):
    """A vineyardd has no room for a buffer; nothing was put elsewhere."""


class MemoryPlanError(VineyardMemoryError):
    """A job's memory plan does not fit: a pack's buffers do not fit its vineyardds (refused
    before any buffer is written), or a fit's trainers do not fit their hosts (refused before
    any trainer starts).

    Parameters
    ----------
    message : str
        What does not fit and what to do.
    plan : MemoryPlan or FitMemoryPlan, optional
        The plan, kept as ``.plan``: a :class:`~dvml.placement.memory.MemoryPlan` or a
        :class:`~dvml.placement.fit_memory.FitMemoryPlan` (``plan.table()``, ``plan.fixes``).
    """

    def __init__(self, message: str, plan: object = None) -> None:
        super().__init__(message)
        self.plan = plan

    def __reduce__(self) -> tuple[type, tuple[str, object]]:  # pickles with its plan
        return (type(self), (str(self), self.plan))


class ParameterError(DvmlError, ValueError):
    """A compile or fit parameter is malformed, unknown or unsafe."""


class RegistryError(DvmlError):
    """The model registry failed."""


class RegistryNotFoundError(RegistryError, LookupError):
    """No architecture or model of that id or name exists in the registry."""


class ModelMismatchError(DvmlError, ValueError):
    """A dataset and a model architecture do not fit each other."""


class TrainingError(DvmlError):
    """Training, evaluation or prediction failed."""


class TrainerFailedError(TrainingError):
    """A trainer process died or raised; the message names its worker."""


class WorkerDepartedError(TrainerFailedError):
    """Workers of a job left the cluster during training.

    The host died, was cut off, or the worker was killed.

    Parameters
    ----------
    message : str
        Which workers left and what to do.
    workers : list of WorkerInfo, optional
        The departed workers (:class:`dvml.WorkerInfo`), kept as ``.workers``, so that an
        elastic job can go on without them.
    """

    def __init__(self, message: str, workers: list[Any] | None = None) -> None:
        super().__init__(message)
        self.workers: list[Any] = list(workers or [])


class TrainerStoppedError(TrainingError):
    """dvml stopped a trainer: another trainer failed, it ran past its timeout, or its
    job's client went away (its checkpoint is kept; a rerun resumes)."""


class ProtocolError(TrainingError):
    """A trainer printed a protocol line that is not a known, well-formed message."""
