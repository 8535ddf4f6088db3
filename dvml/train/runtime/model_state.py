"""A model's state as bytes: its weights and, for a serving trainer, its optimizer's variables.

One ``.npz`` (the registry's weights codec, :mod:`dvml.registry.weights`): the number of
weight arrays, the weights, then the optimizer's variables. A state with no weights asks the
trainer for the model's own seeded initialisation; one with no optimizer variables starts a
fresh optimizer (a new model, a warm start). Pure numpy: no TensorFlow here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from dvml.registry.weights import weights_from_bytes, weights_to_bytes

__all__ = ["read_state", "state_bytes", "weights_digest", "write_state"]


def state_bytes(weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray] = ()) -> bytes:
    """The state of a model with these weights and optimizer variables."""
    return weights_to_bytes([np.array([len(weights)], dtype=np.int64), *weights, *optimizer])


def write_state(path: str, weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray]) -> None:
    """Write :func:`state_bytes` to ``path``."""
    with open(path, "wb") as f:
        f.write(state_bytes(weights, optimizer))


def read_state(blob: bytes) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The weights and optimizer variables of a state written by :func:`state_bytes`."""
    arrays = weights_from_bytes(blob)
    n = int(arrays[0][0])
    return list(arrays[1 : 1 + n]), list(arrays[1 + n :])


def weights_digest(weights: Sequence[np.ndarray]) -> str:
    """A sha256 of weights by value (shapes, dtypes and bytes), to check what a model resumed
    from."""
    digest = hashlib.sha256()
    for w in weights:
        a = np.ascontiguousarray(w)
        digest.update(f"{a.dtype.str}{a.shape}".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()
