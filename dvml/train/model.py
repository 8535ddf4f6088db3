"""The handle of a registered model: summary, per-iteration history, plots, evaluate, predict."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dvml.train.predict import evaluate, predict

if TYPE_CHECKING:
    import pandas as pd

    from dvml.registry import Registry

__all__ = ["Model", "plot_history"]


class Model:
    """A model in the registry, as returned by :func:`dvml.fit`.

    Parameters
    ----------
    name : str
        The model's name in the registry.
    registry : Registry
        The registry that holds it.
    """

    def __init__(self, name: str, registry: Registry) -> None:
        self.name = name
        self.registry = registry

    @property
    def summary(self) -> dict[str, Any]:
        """MADlib's fit summary fields (and dvml's own)."""
        return dict(self.registry.model_summary(self.name))

    def history(self) -> pd.DataFrame:
        """One row per evaluated iteration: losses and metrics on training and validation.

        Returns
        -------
        pandas.DataFrame
            Columns ``iteration``, ``training_loss``, ``training_metrics``,
            ``validation_loss``, ``validation_metrics``, ``elapsed_s``.
        """
        return self.registry.model_iterations(self.name)

    def weights(self) -> list[Any]:
        """The trained weights, as ``model.get_weights()`` gives them.

        Returns
        -------
        list of numpy.ndarray
            One array per weight.
        """
        return list(self.registry.get_model(self.name)["weights"])

    def plot(self, ax: Any = None) -> Any:
        """Training and validation loss and metrics per iteration (matplotlib).

        Parameters
        ----------
        ax : matplotlib.axes.Axes, optional
            Where to draw (default: a new figure).

        Returns
        -------
        matplotlib.axes.Axes
            The axes drawn on (:func:`plot_history`).
        """
        return plot_history(self.history(), title=self.name, ax=ax)

    def evaluate(self, dataset: Any, **kwargs: Any) -> dict[str, Any]:
        """Evaluate this model on a packed dataset, on the workers (:func:`dvml.evaluate`).

        Parameters
        ----------
        dataset : str or Dataset
            A validation set (or any packed dataset with labels).
        **kwargs
            :func:`dvml.evaluate`'s other arguments.

        Returns
        -------
        dict
            As :func:`dvml.evaluate` returns.
        """
        return evaluate(self.name, dataset, registry=self.registry, **kwargs)

    def predict(
        self, data: Any, id_col: str, x: Any, pred_type: Any = "response", **kwargs: Any
    ) -> Any:
        """Predict raw rows with this model, on the workers (:func:`dvml.predict`).

        Parameters
        ----------
        data, id_col, x, pred_type : as for dvml.predict
            The rows, their id and feature columns, and what to return per row.
        **kwargs
            :func:`dvml.predict`'s other arguments.

        Returns
        -------
        dask.dataframe.DataFrame
            As :func:`dvml.predict` returns.
        """
        return predict(self.name, data, id_col, x, pred_type, registry=self.registry, **kwargs)

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"<dvml.Model {self.name!r} iterations={s.get('num_iterations')} "
            f"loss={s.get('training_loss_final')} metric={s.get('training_metrics_final')} "
            f"val_metric={s.get('validation_metrics_final')}>"
        )


def plot_history(history: pd.DataFrame, title: str = "", ax: Any = None) -> Any:
    """Plot loss (left axis) and metrics (right axis) per iteration.

    Parameters
    ----------
    history : pandas.DataFrame
        :meth:`Model.history`'s table.
    title : str
        The plot's title.
    ax : matplotlib.axes.Axes, optional
        Where to draw (default: a new figure).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on (metrics on a twin axis at the right).
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    # Metrics exist only for the iterations where they were computed.
    history = history[history["training_loss"].notna()]
    it = history["iteration"]
    for part, style in (("training", "-"), ("validation", "--")):
        col = f"{part}_loss"
        if col in history and history[col].notna().any():
            ax.plot(it, history[col], style, marker="o", label=f"{part} loss")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    right = ax.twinx()
    for part, style in (("training", "-"), ("validation", "--")):
        col = f"{part}_metrics"
        if col not in history:
            continue
        for name in sorted({k for m in history[col].dropna() for k in (m or {})}):
            values = [(m or {}).get(name) for m in history[col]]
            right.plot(it, values, style, marker="s", alpha=0.7, label=f"{part} {name}")
    right.set_ylabel("metric")
    lines = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + right.get_legend_handles_labels()[1]
    ax.legend(lines, labels, loc="center right", fontsize="small")
    ax.set_title(title)
    return ax
