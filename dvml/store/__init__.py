"""Vineyard storage: local puts, the catalog of named datasets, and dataset handles.

This package owns how datasets are laid out in vineyard (:mod:`dvml.store.catalog`) and the
only code that puts objects (:mod:`dvml.store.tensors`). It leaves deciding where buffers go to
:mod:`dvml.placement` and reading them into TensorFlow to :mod:`dvml.resolve`.
"""
