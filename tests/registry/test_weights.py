"""Tests of dvml.registry.weights: weights as npz bytes that load without pickle."""

from __future__ import annotations

import io
import os
import zipfile

import numpy as np
import pytest

from dvml.exceptions import RegistryError
from dvml.registry.weights import WEIGHTS_FORMAT, weights_from_bytes, weights_to_bytes

DTYPES = [
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "complex64",
    "complex128",
    ">f4",
    "<U5",
    "S4",
    "datetime64[s]",
]


def _sample(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(0)
    size = int(np.prod(shape))
    kind = np.dtype(dtype).kind
    if kind in "US":
        values = np.array([f"w{i % 100}" for i in range(size)], dtype=dtype)
    elif kind == "M":
        values = np.arange(size).astype(dtype)
    elif kind == "b":
        values = rng.integers(0, 2, size).astype(bool)
    else:
        values = (rng.normal(size=size) * 100).astype(dtype)
    return values.reshape(shape)


def _assert_same(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 4), (2, 0, 3), (2, 3, 4, 5)])
def test_round_trip_dtypes_and_shapes(dtype, shape):
    arrays = [_sample(dtype, shape)]
    _assert_same(weights_from_bytes(weights_to_bytes(arrays)), arrays)


def test_round_trip_keeps_order_past_ten():
    arrays = [np.full((i + 1,), i, dtype=np.float32) for i in range(13)]
    _assert_same(weights_from_bytes(weights_to_bytes(arrays)), arrays)


def test_round_trip_non_contiguous_and_fortran():
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    arrays = [base.T, base[::2, 1::3], np.asfortranarray(base), base[:, 0]]
    _assert_same(weights_from_bytes(weights_to_bytes(arrays)), arrays)


def test_round_trip_empty_list_and_tuple():
    assert weights_from_bytes(weights_to_bytes([])) == []
    arrays = (np.ones(2), np.zeros((1, 1), np.int8))
    _assert_same(weights_from_bytes(weights_to_bytes(arrays)), list(arrays))


def test_round_trip_of_a_large_array():
    big = np.random.default_rng(1).normal(size=(512, 1024)).astype(np.float32)  # 2 MiB
    data = weights_to_bytes([big])
    assert len(data) > big.nbytes
    _assert_same(weights_from_bytes(data), [big])


def test_loaded_arrays_are_writable_copies():
    (array,) = weights_from_bytes(weights_to_bytes([np.arange(4)]))
    array[0] = 99
    assert array[0] == 99


def test_format_name():
    assert WEIGHTS_FORMAT == "npz"
    assert weights_to_bytes([np.ones(1)])[:2] == b"PK"  # a zip archive


def test_object_array_refused_at_save_time():
    with pytest.raises(TypeError, match=r"weights\[1\].*pickle"):
        weights_to_bytes([np.ones(2), np.array([{"a": 1}, None], dtype=object)])


def test_structured_dtype_with_object_field_refused():
    array = np.zeros(2, dtype=[("x", "f4"), ("o", "O")])
    with pytest.raises(TypeError, match="pickle"):
        weights_to_bytes([array])


def test_structured_dtype_without_objects_round_trips():
    array = np.zeros(3, dtype=[("x", "f4"), ("n", "i8")])
    _assert_same(weights_from_bytes(weights_to_bytes([array])), [array])


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (np.ones(3), "list of numpy arrays"),
        (None, "list of numpy arrays"),
        ("weights", "list of numpy arrays"),
        ([[1.0, 2.0]], r"weights\[0\] must be a numpy array"),
        ([np.ones(1), 3.0], r"weights\[1\] must be a numpy array"),
    ],
)
def test_bad_input_types(value, match):
    with pytest.raises(TypeError, match=match):
        weights_to_bytes(value)


class _Exploit:
    """Unpickling this runs a shell command: the loader must never unpickle."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickled_payload_is_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    np.savez(buffer, np.array([_Exploit(str(marker))], dtype=object), allow_pickle=True)
    with pytest.raises(RegistryError, match="cannot be read"):
        weights_from_bytes(buffer.getvalue())
    assert not marker.exists()


def test_pickled_object_array_is_refused():
    """Even a harmless pickled array is refused: the loader never unpickles anything."""
    buffer = io.BytesIO()
    np.savez(buffer, np.array([1, "two", None], dtype=object), allow_pickle=True)
    with pytest.raises(RegistryError, match="cannot be read"):
        weights_from_bytes(buffer.getvalue())


def test_raw_pickle_bytes_are_refused(tmp_path):
    import pickle

    marker = tmp_path / "pwned"
    with pytest.raises(RegistryError):
        weights_from_bytes(pickle.dumps(_Exploit(str(marker))))
    assert not marker.exists()


def test_single_npy_is_refused():
    buffer = io.BytesIO()
    np.save(buffer, np.arange(3))
    with pytest.raises(RegistryError, match="not an npz archive"):
        weights_from_bytes(buffer.getvalue())


@pytest.mark.parametrize("data", [b"", b"garbage", b"PK\x03\x04broken zip"])
def test_garbage_is_refused(data):
    with pytest.raises(RegistryError, match="Received"):
        weights_from_bytes(data)


def test_unexpected_member_names_are_refused():
    buffer = io.BytesIO()
    np.savez(buffer, kernel=np.ones(2))
    with pytest.raises(RegistryError, match="unexpected member"):
        weights_from_bytes(buffer.getvalue())


def test_gap_in_members_is_refused():
    buffer = io.BytesIO()
    np.savez(buffer, arr_0=np.ones(1), arr_2=np.ones(1))
    with pytest.raises(RegistryError, match="arr_0"):
        weights_from_bytes(buffer.getvalue())


def test_non_array_member_is_refused():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("arr_0.npy", b"not an npy file")
    with pytest.raises(RegistryError):
        weights_from_bytes(buffer.getvalue())


def test_load_accepts_bytearray_and_memoryview():
    data = weights_to_bytes([np.arange(3)])
    for view in (bytearray(data), memoryview(data)):
        _assert_same(weights_from_bytes(view), [np.arange(3)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes"):
        weights_from_bytes("text")  # type: ignore[arg-type]
