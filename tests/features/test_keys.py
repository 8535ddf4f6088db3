"""The pure core of the feature cache: fingerprints, the cache key, names, argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from dvml.features import keys

BASE = {
    "backbone": "b" * 64,
    "layer": None,
    "pooling": "avg",
    "preprocessing": {"image_size": [32, 32], "channels": 3, "normalizing_const": 255.0},
    "source": {"dataset_id": "abc"},
}


def key(**changes: object) -> str:
    parts = {**BASE, **changes}
    return keys.cache_key(**parts)  # type: ignore[arg-type]


def test_key_is_stable_and_hex() -> None:
    assert key() == key()
    assert len(key()) == 64 and int(key(), 16) >= 0


@pytest.mark.parametrize(
    "change",
    [
        {"backbone": "c" * 64},
        {"layer": "conv"},
        {"pooling": "max"},
        {"pooling": None},
        {"preprocessing": {"image_size": [64, 64], "channels": 3, "normalizing_const": 255.0}},
        {"preprocessing": {"image_size": [32, 32], "channels": 1, "normalizing_const": 255.0}},
        {"preprocessing": {"image_size": [32, 32], "channels": 3, "normalizing_const": 1.0}},
        {"source": {"dataset_id": "abd"}},
        {"training": {"dataset_id": "t1"}},
    ],
)
def test_every_part_changes_the_key(change: dict[str, object]) -> None:
    assert key(**change) != key()


def test_key_ignores_dict_order() -> None:
    reordered = {"normalizing_const": 255.0, "channels": 3, "image_size": [32, 32]}
    assert key(preprocessing=reordered) == key()


def test_json_fingerprint_ignores_formatting_but_not_content() -> None:
    a = '{"class_name": "Sequential", "config": {"layers": [1, 2]}}'
    b = '{ "config": {"layers": [1,2]},  "class_name": "Sequential" }'
    c = '{"class_name": "Sequential", "config": {"layers": [2, 1]}}'
    assert keys.json_fingerprint(a) == keys.json_fingerprint(b)
    assert keys.json_fingerprint(a) != keys.json_fingerprint(c)
    with pytest.raises(ValueError, match="not valid JSON"):
        keys.json_fingerprint("{nope")


def test_weights_fingerprint_sees_values_dtype_shape_and_order() -> None:
    w = [np.zeros((2, 3), np.float32), np.ones(3, np.float32)]
    same = [a.copy() for a in w]
    assert keys.weights_fingerprint(w) == keys.weights_fingerprint(same)
    changed = [w[0].copy(), w[1].copy()]
    changed[1][0] = 1.0001
    assert keys.weights_fingerprint(changed) != keys.weights_fingerprint(w)
    assert keys.weights_fingerprint([w[0].reshape(3, 2), w[1]]) != keys.weights_fingerprint(w)
    assert keys.weights_fingerprint([w[0].astype(np.float64), w[1]]) != keys.weights_fingerprint(w)
    assert keys.weights_fingerprint(w[::-1]) != keys.weights_fingerprint(w)


def test_default_name_uses_the_key() -> None:
    k = key()
    assert keys.default_name(k) == f"features-{k[:12]}"


@pytest.mark.parametrize("bad", ["", "__hidden", 3])
def test_cache_name_check(bad: object) -> None:
    with pytest.raises(ValueError, match="name must be 1 to 128 characters"):
        keys.check_cache_name(bad)
    assert keys.check_cache_name(None) is None
    assert keys.check_cache_name("flowers") == "flowers"


def test_argument_checks() -> None:
    assert keys.check_batch_size(8) == 8
    with pytest.raises(ValueError, match="Received: batch_size=0"):
        keys.check_batch_size(0)
    with pytest.raises(TypeError, match="Received: batch_size=True"):
        keys.check_batch_size(True)
    assert keys.check_pooling("max") == "max"
    with pytest.raises(ValueError, match="Received: pooling='mean'"):
        keys.check_pooling("mean")
    with pytest.raises(TypeError, match="Received: layer=3"):
        keys.check_layer(3)
