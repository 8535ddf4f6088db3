"""A registered dvml model as an MLflow pyfunc model that predicts class values.

Imports MLflow: loaded only by :func:`dvml.tracking.export.export_to_mlflow` and by MLflow's
own loader (``mlflow.pyfunc.load_model``), which finds this class by its module.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from mlflow.pyfunc import PythonModel


class ClassifierModel(PythonModel):
    """Predicts like ``dvml.predict(..., pred_type="response")``: the top class of each row.

    Input: an array of rows (the raw ``x`` values, before ``normalizing_const``), or a
    DataFrame whose one column holds each row's array. Output: a DataFrame with
    ``class_value`` (from the model's ``class_values``) and ``prob``.
    """

    # MLflow reads predict's type hints as an input schema and warns when there are none; the
    # input here (an array, or a frame of arrays) is what its schema cannot describe.
    _skip_type_hint_validation = True

    def load_context(self, context: Any) -> None:
        from dvml import tf_runtime

        with open(context.artifacts["spec"]) as f:
            spec = json.load(f)
        with np.load(context.artifacts["weights"]) as stored:
            weights = [stored[f"w{i}"] for i in range(len(stored.files))]
        self.model = tf_runtime.build_model(spec["model_json"], weights)
        self.class_values = spec["class_values"]
        self.normalizing_const = float(spec["normalizing_const"] or 1.0)

    def predict(self, context, model_input, params=None):
        import pandas as pd

        if isinstance(model_input, pd.DataFrame):
            x = np.stack([np.asarray(v, dtype=np.float32) for v in model_input.iloc[:, 0]])
        else:
            x = np.asarray(model_input, dtype=np.float32)
        probs = np.asarray(self.model.predict(x / self.normalizing_const, verbose=0))
        top = probs.argmax(axis=1)
        values = self.class_values or list(range(probs.shape[1]))
        classes = [values[k] for k in top]
        return pd.DataFrame({"class_value": classes, "prob": probs.max(axis=1)})
