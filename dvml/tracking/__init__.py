"""Runs in a tracking server (MLflow), when the user asks for it.

With the config key ``tracking.mlflow-uri`` set (``dask.config.set({"dvml.tracking.mlflow-uri":
"http://host:5000"})``, or ``DASK_DVML__TRACKING__MLFLOW_URI``), ``dvml.fit``,
``dvml.fit_multiple`` and ``dvml.automl`` log each run there once it is registered: its
parameters as written, its per-iteration metrics, its summary and the datasets it read
(:mod:`dvml.tracking.runs` builds what is logged, :mod:`dvml.tracking.mlflow_client` sends it).
:func:`dvml.export_to_mlflow` puts a registered model in MLflow's model registry as a pyfunc
model that predicts class values (:mod:`dvml.tracking.pyfunc`). Without the key nothing is sent
and MLflow is never imported. MLflow is the optional extra ``dvml[mlflow]`` (mlflow-skinny).
"""
