"""Preprocessing: the pure partition functions and the Dask graph that packs buffers.

The pure functions live in small modules that import neither Dask, vineyard nor TensorFlow:
:mod:`~dvml.preprocess.encode` (class values, one-hot labels, x arrays, finiteness checks,
``normalizing_const``), :mod:`~dvml.preprocess.images` (class-per-folder image trees and Pillow
decoding) and :mod:`~dvml.preprocess.shards` (WebDataset-style tar shards). Where rows go is
decided by :mod:`dvml.placement`; storing the packed buffers is left to :mod:`dvml.store`.
"""
