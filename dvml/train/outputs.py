"""What a training call would overwrite: MADlib refuses when an output table exists.

``dvml.fit``, ``dvml.fit_multiple`` and ``dvml.automl`` check their outputs here, at their
entry and before anything trains: an existing model, run (``.info`` and ``.summary``) or
model selection table of the name they would write is refused, naming what exists and how
to drop it, unless the call says to continue it (``warm_start``, ``resume``) or
``overwrite=True``. The registry is only read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dvml.exceptions import ArgumentError, ArgumentTypeError, RegistryError, RegistryNotFoundError

if TYPE_CHECKING:
    from dvml.registry.database import Registry

__all__ = ["check_outputs_free", "existing_outputs", "model_exists"]


def model_exists(reg: Registry, name: object) -> bool:
    """Whether a model named ``name`` exists; False for a name the registry would refuse
    (the call's own checks then say what is wrong with it)."""
    try:
        return reg.model_exists(name)  # type: ignore[arg-type]
    except (ArgumentError, ArgumentTypeError):
        return False


def existing_outputs(reg: Registry, model_output: str, *, selection: bool) -> list[str]:
    """What exists under a ``fit_multiple``/``automl`` ``model_output``: the run, its models
    ``<model_output>_<mst_key>`` and, with ``selection``, the table ``<model_output>_best``.

    Each entry is the object and the call that drops it.
    """
    found = []
    if not isinstance(model_output, str):
        return found  # not a name: the call's own checks refuse it
    try:
        reg.model_selection_run(model_output)
        found.append(
            f"the run {model_output!r} with its .info, .summary and models "
            f"(dvml.drop_model({model_output!r}))"
        )
    except (RegistryNotFoundError, ArgumentError, ArgumentTypeError):
        pass
    pattern = re.compile(re.escape(model_output) + r"_[0-9]+")
    models = [str(n) for n in reg.list_models()["name"] if pattern.fullmatch(str(n))]
    found += [f"the model {n!r} (dvml.drop_model({n!r}))" for n in models]
    if selection:
        best = f"{model_output}_best"
        if best in set(reg.list_model_selections()["name"]):
            found.append(f"the model selection table {best!r} (dvml.drop_model_configs({best!r}))")
    return found


def check_outputs_free(
    reg: Registry, call: str, output: str, found: Sequence[str], allowed_by: str
) -> None:
    """Refuse a call whose outputs exist (``found``: :func:`existing_outputs`, or a model).

    Raises
    ------
    RegistryError
        Naming each output that exists and how to drop it.
    """
    if not found:
        return
    raise RegistryError(
        f"{call} would overwrite outputs that exist in the registry at {reg.url}: "
        f"{'; '.join(found)}. Received: {output!r}. MADlib refuses when an output table "
        f"exists: drop them first, choose another name, pass {allowed_by}, or pass "
        "overwrite=True to replace them."
    )
