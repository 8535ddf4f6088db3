"""Benchmarks of dvml against plain baselines, measured side by side in one run.

Run ``python -m benchmarks [--quick] [--only B8] [--repeats N] [--out DIR]`` from the
repository root. Each benchmark is one module (``b8_cluster_start.py``) that registers itself
with :mod:`benchmarks.harness`; the harness alternates the dvml and baseline sides and reports
the ratio ``dvml / baseline`` against the benchmark's target.
"""
