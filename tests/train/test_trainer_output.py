"""A trainer's TensorFlow output: hidden while all goes well, quoted when it fails (#13)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dask
import pandas as pd
import pytest

import dvml
from dvml.exceptions import TrainerFailedError
from tests.helpers import cnn

pytestmark = [pytest.mark.cluster, pytest.mark.tf]


@pytest.fixture(scope="module")
def env(cluster2: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    from sklearn.datasets import load_digits

    tmp = tmp_path_factory.mktemp("trainer_output")
    client = cluster2.client
    d = load_digits()
    frame = pd.DataFrame(
        {"pixels": list(d.images[:200].reshape(-1, 8, 8, 1).astype("float32")),
         "label": d.target[:200]}
    )  # fmt: skip
    with dask.config.set({"dvml.cluster.state-dir": str(tmp / "state")}):
        dvml.training_preprocessor(
            frame, y="label", x="pixels", normalizing_const=16.0, name="to_digits",
            overwrite=True, client=client,
        )  # fmt: skip
        registry = dvml.Registry(f"sqlite:///{tmp / 'registry.db'}")
        arch = dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
        yield {"client": client, "registry": registry, "arch": arch}
        registry.close()
        dvml.datasets.drop("to_digits", client=client)


def test_a_failing_trainer_quotes_its_tensorflow_output(env: dict[str, Any]) -> None:
    dvml.register_custom_function(
        "exploding_loss",
        "def exploding_loss(y_true, y_pred):\n    raise RuntimeError('the loss exploded')\n",
        kind="loss",
        registry=env["registry"],
    )
    with pytest.raises(TrainerFailedError) as info:
        dvml.fit(
            "to_digits",
            "exploding",
            env["arch"],
            compile_params="loss='exploding_loss', optimizer='adam', metrics=['accuracy']",
            fit_params="batch_size=32, epochs=1",
            num_iterations=1,
            custom_objects=["exploding_loss"],
            registry=env["registry"],
            client=env["client"],
            progress=False,
        )
    message = str(info.value)
    assert "the loss exploded" in message
    # The tail of what the trainer wrote to fd 2: TensorFlow's C++ start-up lines, or, when
    # later lines fill the tail (CI), TensorFlow's Python warnings: here AutoGraph's, that it
    # could not read the registered function's source.
    tail = message.split("Its TensorFlow output ended with:\n", 1)[1]
    marks = ("absl::InitializeLog", "oneDNN", ".cc:", "WARNING:tensorflow:")
    assert any(mark in tail for mark in marks), message
