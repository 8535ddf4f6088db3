"""Helpers of the test suite, importable from any test module (``from tests.helpers import ...``).

In the manner of ``distributed.utils_test``: functions here, fixtures in ``tests/conftest.py``.
One module per topic:

- ``polling``: :func:`poll_for`, the one way a test waits for a condition.
- ``processes``: child processes of the test process and the leak check every test runs.
- ``trainers``: which trainer process runs which job (:func:`worker_trainers`), read from the
  job file in its working directory, so that a fault test kills its own job's trainer.
- ``output``: what the workers write to their fd 2 during a block (:func:`workers_stderr`).
- ``background``: a dvml call in a thread of the test (:class:`Background`).
- ``clusters``: :func:`running_cluster` (a LocalCluster that is closed and leak-checked) and
  :func:`on_worker` (run a function on one chosen worker).
- ``vineyard_probes``: what each vineyardd and the cluster hold (worker-side probes that
  never close the process's shared vineyard connection).
- ``models`` and ``data``: small Keras models and synthetic images.
- ``jobs``: job files and ``python -m dvml`` as a user runs it.
- ``notebooks``: run a notebook top to bottom.
- ``netns``: the multi-host namespace cluster and its client (:func:`running_netns_cluster`).

dvml itself is imported inside the helpers, never at the top of a module here (but for
``polling``, which reuses ``dvml.cluster.processes.poll_for``, a standard-library-only module):
importing this package stays cheap.
"""

from tests.helpers.background import Background
from tests.helpers.clusters import on_worker, running_cluster, tls_environment
from tests.helpers.data import (
    CLASSES,
    color_images,
    iris_frame,
    sort_rows,
    write_image_folder,
    write_tar_shards,
)
from tests.helpers.jobs import (
    ADAM,
    REPO,
    digits_job,
    dvml_command,
    one_error_line,
    with_state_dir,
    write_job,
)
from tests.helpers.models import cnn, iris_mlp, keras, tiny_backbone
from tests.helpers.netns import (
    NETNS_CLIENT,
    NetnsBackground,
    host_pids,
    netns_argv,
    netns_client,
    running_netns_cluster,
    tensors_by_instance,
)
from tests.helpers.notebooks import execute_notebook
from tests.helpers.output import workers_stderr
from tests.helpers.polling import poll_for
from tests.helpers.processes import (
    SESSION_CLUSTERS,
    assert_no_new_processes,
    child_processes,
    pid_gone,
)
from tests.helpers.trainers import (
    cpu_capped,
    half_speed,
    inference_trainers,
    job_trainers,
    standby_trainers,
    worker_descendants,
    worker_trainers,
)
from tests.helpers.vineyard_probes import (
    batches,
    dataset_names,
    object_exists,
    read_dataset,
    snapshot,
    staging_names,
    vineyard_contents,
    vineyard_usage,
)

__all__ = [
    "ADAM",
    "CLASSES",
    "NETNS_CLIENT",
    "REPO",
    "SESSION_CLUSTERS",
    "Background",
    "NetnsBackground",
    "assert_no_new_processes",
    "batches",
    "child_processes",
    "cnn",
    "color_images",
    "cpu_capped",
    "dataset_names",
    "digits_job",
    "dvml_command",
    "execute_notebook",
    "half_speed",
    "host_pids",
    "inference_trainers",
    "iris_frame",
    "iris_mlp",
    "job_trainers",
    "keras",
    "netns_argv",
    "netns_client",
    "object_exists",
    "on_worker",
    "one_error_line",
    "pid_gone",
    "poll_for",
    "read_dataset",
    "running_cluster",
    "running_netns_cluster",
    "snapshot",
    "sort_rows",
    "staging_names",
    "standby_trainers",
    "tensors_by_instance",
    "tiny_backbone",
    "tls_environment",
    "vineyard_contents",
    "vineyard_usage",
    "with_state_dir",
    "worker_descendants",
    "worker_trainers",
    "workers_stderr",
    "write_image_folder",
    "write_job",
    "write_tar_shards",
]
