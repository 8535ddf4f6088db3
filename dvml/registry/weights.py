"""Model weights as bytes that load without pickle.

A list of numpy arrays is stored as an ``.npz`` archive (members ``arr_0`` ... ``arr_n``) and
read back with ``numpy.load(..., allow_pickle=False)``: a weights blob is data, and reading one
from a shared registry never runs code. Object arrays, the one kind that needs pickle, are
refused when saving.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from dvml.exceptions import ArgumentTypeError, RegistryError

__all__ = ["WEIGHTS_FORMAT", "weights_from_bytes", "weights_to_bytes"]

WEIGHTS_FORMAT = "npz"
"""The value of the ``weights_format`` column for blobs written by :func:`weights_to_bytes`."""

_MEMBER = re.compile(r"arr_(\d+)")


def weights_to_bytes(weights: Sequence[npt.NDArray[Any]]) -> bytes:
    """Serialize a list of numpy arrays (as ``model.get_weights()`` returns) to bytes.

    Parameters
    ----------
    weights : list of numpy.ndarray
        The arrays, in order. Any numeric, boolean or fixed-width string dtype works.

    Returns
    -------
    bytes
        An ``.npz`` archive with members ``arr_0`` ... ``arr_n``.

    Raises
    ------
    ArgumentTypeError
        When ``weights`` is not a list or tuple of numpy arrays, or an array has an object
        dtype (it could only be stored with pickle).
    """
    if not isinstance(weights, list | tuple):
        raise ArgumentTypeError(
            f"weights must be a list of numpy arrays. Received: {type(weights).__name__}. "
            "Pass model.get_weights()."
        )
    for index, array in enumerate(weights):
        if not isinstance(array, np.ndarray):
            raise ArgumentTypeError(
                f"weights[{index}] must be a numpy array. Received: {type(array).__name__}. "
                "Convert it with numpy.asarray first."
            )
        if array.dtype.hasobject:
            raise ArgumentTypeError(
                f"weights[{index}] has dtype {array.dtype}, which holds Python objects and "
                "could only be stored with pickle. Received: an object array of shape "
                f"{array.shape}. Convert it to a numeric dtype first."
            )
    buffer = io.BytesIO()
    np.savez(buffer, *weights, allow_pickle=False)
    return buffer.getvalue()


def weights_from_bytes(data: bytes) -> list[npt.NDArray[Any]]:
    """Read back the arrays that :func:`weights_to_bytes` wrote, without pickle.

    Parameters
    ----------
    data : bytes
        An ``.npz`` archive.

    Returns
    -------
    list of numpy.ndarray
        The arrays in their original order.

    Raises
    ------
    RegistryError
        When the bytes are not such an archive, or a member would need pickle.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ArgumentTypeError(f"data must be bytes. Received: {type(data).__name__}.")
    try:
        loaded = np.load(io.BytesIO(bytes(data)), allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError(f"a single {type(loaded).__name__}, not an npz archive")
        with loaded as archive:
            indices = {}
            for member in archive.files:
                match = _MEMBER.fullmatch(member)
                if match is None:
                    raise ValueError(f"unexpected member {member!r}")
                indices[int(match.group(1))] = member
            if sorted(indices) != list(range(len(indices))):
                raise ValueError(f"members are not arr_0 ... arr_n: {sorted(archive.files)}")
            arrays = [archive[indices[i]] for i in range(len(indices))]
        for index, array in enumerate(arrays):
            # NpzFile hands back raw bytes for a member that is not an .npy file.
            if not isinstance(array, np.ndarray):
                raise ValueError(f"member arr_{index} is not an .npy array")
        return arrays
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise RegistryError(
            f"Stored weights cannot be read as an {WEIGHTS_FORMAT!r} archive: {exc}. Received: "
            f"{len(data)} bytes starting {bytes(data[:8])!r}. Save the weights again with "
            "weights_to_bytes (objects that need pickle are never loaded)."
        ) from exc
