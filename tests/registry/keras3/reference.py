"""Outputs of the Keras 3 fixtures under Keras 3 itself, for tests/registry/test_keras3_json.py.

Run WITHOUT ``TF_USE_LEGACY_KERAS``: ``python reference.py OUT.npz``. Every model of this folder
gets seeded random weights and a seeded random input; the weights, inputs and Keras 3's outputs
are written to OUT.npz, so the converted tf-keras model can be checked to compute the same.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

if os.environ.get("TF_USE_LEGACY_KERAS"):
    sys.exit("unset TF_USE_LEGACY_KERAS: the reference outputs must come from Keras 3")

import keras


def cases() -> dict[str, str]:
    here = Path(__file__).parent
    out = {}
    for path in sorted(here.glob("*.json")):
        data = json.loads(path.read_text())
        if "config" in data:
            out[path.stem] = json.dumps(data)
        else:
            out.update({f"zoo_{name}": text for name, text in data.items()})
    return out


def main(target: str) -> None:
    arrays: dict[str, np.ndarray] = {}
    for name, text in cases().items():
        if name == "unsupported":
            continue
        model = keras.models.model_from_json(text)
        rng = np.random.default_rng(0)
        # positive values keep BatchNormalization's moving variance valid
        weights = [rng.uniform(0.1, 0.5, w.shape).astype("float32") for w in model.get_weights()]
        model.set_weights(weights)
        inputs = []
        for tensor in model.inputs:
            shape = (3, *tensor.shape[1:])
            if "int" in str(tensor.dtype):
                inputs.append(rng.integers(0, 10, shape).astype("int32"))
            else:
                inputs.append(rng.normal(size=shape).astype("float32"))
        outputs = model(inputs if len(inputs) > 1 else inputs[0], training=False)
        for i, w in enumerate(weights):
            arrays[f"{name}/w{i}"] = w
        for i, x in enumerate(inputs):
            arrays[f"{name}/x{i}"] = x
        arrays[f"{name}/y"] = np.asarray(outputs)
    np.savez(target, **arrays)


if __name__ == "__main__":
    main(sys.argv[1])
