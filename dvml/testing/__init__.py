"""Test harnesses for dvml's own tests and benchmarks (as ``distributed.utils_test`` is).

Not part of the runtime: nothing in the rest of ``dvml`` imports this package.

- :mod:`dvml.testing.netns`: several network hosts on one Linux machine (network namespaces,
  veth pairs, a private bridge), each running the ``cluster/`` recipes, with fault injection
  (``kill_host``, ``set_link``); ``python -m dvml.testing.netns up|status|down``.
"""
