"""The registry's model selection tables: store, read, list and drop them (a Registry mixin).

MADlib's model selection table (``mst_key``, ``model_id``, ``compile_params``,
``fit_params``), one header row and one row per configuration, stored as it is handed: the
rows are :class:`~dvml.configs.ModelConfig` values that :func:`dvml.configs.check_config_rows`
checked once. :class:`~dvml.registry.database.Registry` inherits these methods; split from
its module so that each holds one kind of record.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import sqlalchemy as sa

from dvml.configs.model_config import COLUMNS, ModelConfig
from dvml.exceptions import ArgumentTypeError, RegistryError, RegistryNotFoundError
from dvml.names import check_name
from dvml.registry import values as v
from dvml.registry.schema import model_arch, model_selection_rows, model_selections, new_id

__all__ = ["SelectionTables"]


class SelectionTables:
    """The model selection table methods of :class:`~dvml.registry.database.Registry`."""

    @property
    def url(self) -> str:  # the Registry's
        raise NotImplementedError

    def _transaction(self, write: bool = False) -> contextlib.AbstractContextManager[sa.Connection]:
        raise NotImplementedError  # the Registry's: one transaction, errors as RegistryError

    def _not_found(self, what: str, received: str, lister: str) -> RegistryNotFoundError:
        raise NotImplementedError  # the Registry's

    def save_model_selection(
        self,
        name: str,
        rows: Sequence[ModelConfig],
        *,
        search: str | None = None,
        seed: int | None = None,
        source: Mapping[str, Any] | None = None,
        custom_objects: Sequence[str] | None = None,
        description: str | None = None,
        replace: bool = False,
    ) -> int:
        """Store a model selection table (MADlib's ``mst_key``, ``model_id``, ``compile_params``,
        ``fit_params``) under ``name``, in one transaction.

        The rows are stored as they are handed: a :class:`~dvml.configs.ModelConfig` is a
        checked row (:func:`dvml.configs.check_config_rows` checks rows once, before this).
        Every ``model_id`` must be an architecture in the registry.

        Parameters
        ----------
        name : str
            The table's name (letters, digits and ``. _ - @ +``).
        rows : list of ModelConfig
            One per configuration; ``mst_key`` values are distinct.
        search, seed, source, custom_objects, description : optional
            How the table was made (``source``: the grids or lists, as JSON), shown by
            :meth:`list_model_selections` and kept in the loaded table's ``attrs``.
        replace : bool
            Replace a table of the same name instead of failing.

        Returns
        -------
        int
            The table's id.

        Raises
        ------
        ArgumentTypeError
            When ``rows`` is not a non-empty list of :class:`~dvml.configs.ModelConfig`.
        RegistryError
            When a table of this name exists and ``replace`` is False.
        RegistryNotFoundError
            Naming every ``model_id`` that is not an architecture.
        """
        name = check_name(name, "name")
        checked = _row_dicts(rows)
        header = {
            "description": v.check_text(description, "description"),
            "search": v.check_text(search, "search", 16),
            "seed": None if seed is None else v.check_id(seed, "seed"),
            "source": v.dumps(None if source is None else dict(source), "source"),
            "custom_objects": v.dumps(list(custom_objects or []), "custom_objects"),
            "created_at": v.now(),
        }
        ids = sorted({row["model_id"] for row in checked})
        t = model_selections
        with self._transaction(write=True) as conn:
            query = sa.select(model_arch.c.id).where(model_arch.c.id.in_(ids))
            found = {int(r.id) for r in conn.execute(query)}
            missing = [i for i in ids if i not in found]
            if missing:
                raise self._not_found(
                    f"architecture with id {', '.join(map(str, missing))}",
                    f"model_id values {ids} in model selection table {name!r}",
                    "list_architectures",
                )
            existing = conn.execute(sa.select(t.c.id).where(t.c.name == name)).first()
            if existing is not None and not replace:
                raise RegistryError(
                    f"A model selection table named {name!r} exists in the registry at "
                    f"{self.url}. Received: name={name!r}, replace=False. Pass replace=True "
                    "to overwrite it, or choose another name."
                )
            if existing is not None:
                selection_id = int(existing.id)
                rows_table = model_selection_rows
                conn.execute(sa.delete(rows_table).where(rows_table.c.selection_id == selection_id))
                conn.execute(sa.update(t).where(t.c.id == selection_id).values(**header))
            else:
                selection_id = new_id(conn.execute(sa.insert(t).values(name=name, **header)))
            conn.execute(
                sa.insert(model_selection_rows),
                [{**row, "selection_id": selection_id} for row in checked],
            )
        return selection_id

    def _selection_id(self, conn: sa.Connection, name: Any) -> sa.Row[Any]:
        name = check_name(name, "name")
        t = model_selections
        row = conn.execute(sa.select(t).where(t.c.name == name)).first()
        if row is None:
            raise self._not_found(
                f"model selection table named {name!r}", f"name={name!r}", "list_model_selections"
            )
        return row

    def model_selection(self, name: str) -> pd.DataFrame:
        """A stored model selection table, ordered by ``mst_key``.

        Parameters
        ----------
        name : str
            The table's name.

        Returns
        -------
        pandas.DataFrame
            Columns ``mst_key``, ``model_id``, ``compile_params``, ``fit_params``;
            ``attrs`` holds ``name``, ``description``, ``search``, ``seed``, ``source``,
            ``custom_objects`` and ``created_at``.
        """
        r = model_selection_rows
        with self._transaction() as conn:
            header = dict(self._selection_id(conn, name)._mapping)
            query = (
                sa.select(*(r.c[c] for c in COLUMNS))
                .where(r.c.selection_id == header["id"])
                .order_by(r.c.mst_key)
            )
            rows = [dict(row._mapping) for row in conn.execute(query)]
        frame = pd.DataFrame(rows, columns=list(COLUMNS))
        frame = frame.astype({"mst_key": "int64", "model_id": "int64"})
        frame.attrs.update(
            name=header["name"],
            description=header["description"],
            search=header["search"],
            seed=header["seed"],
            source=v.loads(header["source"]),
            custom_objects=v.loads(header["custom_objects"]) or [],
            created_at=v.utc(header["created_at"]),
        )
        return frame

    def list_model_selections(self) -> pd.DataFrame:
        """One row per model selection table.

        Returns
        -------
        pandas.DataFrame
            Columns name, n_configs, search, seed, description, created_at.
        """
        t, r = model_selections, model_selection_rows
        counts = (
            sa.select(r.c.selection_id, sa.func.count().label("n_configs"))
            .group_by(r.c.selection_id)
            .subquery()
        )
        query = (
            sa.select(
                t.c.name,
                sa.func.coalesce(counts.c.n_configs, 0).label("n_configs"),
                t.c.search,
                t.c.seed,
                t.c.description,
                t.c.created_at,
            )
            .select_from(t.outerjoin(counts, counts.c.selection_id == t.c.id))
            .order_by(t.c.id)
        )
        with self._transaction() as conn:
            rows = [dict(row._mapping) for row in conn.execute(query)]
        for row in rows:
            row["created_at"] = v.utc(row["created_at"])
        columns = ["name", "n_configs", "search", "seed", "description", "created_at"]
        return pd.DataFrame(rows, columns=columns)

    def drop_model_selection(self, name: str) -> None:
        """Remove a model selection table and its rows in one transaction.

        Parameters
        ----------
        name : str
            The table's name.
        """
        with self._transaction(write=True) as conn:
            selection_id = self._selection_id(conn, name).id
            r = model_selection_rows
            conn.execute(sa.delete(r).where(r.c.selection_id == selection_id))
            conn.execute(sa.delete(model_selections).where(model_selections.c.id == selection_id))


def _row_dicts(rows: Any) -> list[dict[str, Any]]:
    """The rows to insert. Not a check: dvml.configs checked each ModelConfig once."""
    if (
        isinstance(rows, str | bytes)
        or not isinstance(rows, Sequence)
        or not rows
        or not all(isinstance(row, ModelConfig) for row in rows)
    ):
        raise ArgumentTypeError(
            "rows must be a non-empty list of ModelConfig rows (checked by "
            f"dvml.configs.check_config_rows). Received: {type(rows).__name__} {rows!r:.200}. "
            "Store rows with dvml.model_selection_table, which checks them."
        )
    return [row.as_dict() for row in rows]
