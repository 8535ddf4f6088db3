"""Scheduled workflows: scripts that cron or a systemd timer runs, each configured by YAML.

Each module has ``main(argv=None) -> int`` and runs as ``python -m workflows.<name> --config
FILE.yaml``; ``python -m workflows`` lists them. They share :mod:`workflows._runtime` (lock,
journal, logging, exit codes) and the job-file schema and helpers of :mod:`dvml.jobs`.
See ``workflows/README.md`` for scheduling, logs, exit codes and the lock.
"""

WORKFLOWS: dict[str, str] = {
    "retrain": "retrain a model on the newest data; promote it when it beats production",
    "feature_refresh": "refresh the transfer-learning feature cache for the newest images",
}

__all__ = ["WORKFLOWS"]
