"""The :class:`Registry`: model architectures, trained models and custom functions in SQL.

Every write runs in one transaction, so a writer that dies mid-write leaves nothing behind. On
SQLite (the default) the database runs in WAL mode with a busy timeout, and write transactions
start with ``BEGIN IMMEDIATE``: concurrent writers from several processes queue for the write
lock instead of failing or corrupting the file.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy.typing as npt
import pandas as pd
import sqlalchemy as sa

from dvml import config
from dvml.exceptions import ArgumentError, ArgumentTypeError, RegistryError, RegistryNotFoundError
from dvml.names import check_name
from dvml.registry import custom, keras_json, model_lineage, renamed_methods, selection_tables
from dvml.registry import values as v
from dvml.registry.schema import (
    custom_functions,
    metadata,
    model_arch,
    model_iterations,
    model_selection_runs,
    models,
    new_id,
)
from dvml.registry.weights import WEIGHTS_FORMAT, weights_from_bytes, weights_to_bytes

TRAINED_SUMMARY_KEYS = (
    "compile_params",
    "class_values",
    "normalizing_const",
    "dependent_varname",
)
"""The summary keys that evaluate and predict read (written by every dvml fit)."""

__all__ = ["TRAINED_SUMMARY_KEYS", "Registry", "open_registry", "opened_registry"]

BUSY_TIMEOUT_S = 60.0
"""How long an SQLite connection waits for another process's write lock before failing."""

_BEGIN_OPTION = "dvml_sqlite_begin"


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite's own transaction handling skips BEGIN before SELECT and DDL; emit it ourselves
    # (the "begin" listener) so that every transaction is a real one.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _sqlite_on_begin(connection: sa.Connection) -> None:
    # IMMEDIATE takes the write lock up front: a deferred transaction that reads and then
    # writes can fail at once with SQLITE_BUSY instead of waiting for the busy timeout.
    mode = connection.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
    connection.exec_driver_sql(f"BEGIN {mode}")


def _create_engine(url: sa.URL) -> sa.Engine:
    if url.get_backend_name() != "sqlite":
        return sa.create_engine(url, pool_pre_ping=True)
    database = url.database
    if database and database != ":memory:" and not database.startswith("file:"):
        path = pathlib.Path(database).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise RegistryError(
                f"Cannot create the directory of the registry file: {exc}. Received: "
                f"url={url.render_as_string(hide_password=True)!r}. Pass a URL whose directory "
                "can be created, or set dvml.registry.url."
            ) from None
        try:
            _owner_only(path)
        except OSError as exc:
            raise RegistryError(
                f"Opening the registry file failed: {exc}. Received: "
                f"url={url.render_as_string(hide_password=True)!r}. Pass a URL naming a file "
                "you can write (not a directory), or set dvml.registry.url."
            ) from None
        url = url.set(database=str(path))
    engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})
    sa.event.listen(engine, "connect", _sqlite_on_connect)
    sa.event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _owner_only(path: pathlib.Path) -> None:
    """Create the SQLite file 0600 (its -wal, -shm and -journal files inherit its mode).

    The registry holds weights and custom-function source, which whoever may write it runs.
    An existing file of ours that others could read is tightened too.

    No descriptor of the file is opened here: closing ANY descriptor of a file drops every
    POSIX lock this process holds on it (SQLite's "How To Corrupt An SQLite Database File",
    2.2), so another process closing its last connection would believe it is the last user
    and delete the live ``-wal`` and ``-shm`` files under this process's open connections.
    A missing file is made with ``mknod`` (no descriptor); an existing one is changed by path.
    """
    try:
        # umask only clears bits: the file is created 0600 or stricter, never wider.
        os.mknod(path, 0o600 | stat.S_IFREG)
    except FileExistsError:
        pass
    for candidate in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
        try:
            st = candidate.stat()
        except FileNotFoundError:
            continue
        if candidate == path and not stat.S_ISREG(st.st_mode):
            raise RegistryError(
                f"Opening the registry file failed: {path} is not a regular file (a "
                f"directory?). Received: {path}. Pass a URL naming a file you can write, or "
                "set dvml.registry.url."
            )
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(candidate, 0o600)


def _insert_iterations(conn: sa.Connection, model_id: int, rows: list[dict[str, Any]]) -> None:
    if rows:
        conn.execute(sa.insert(model_iterations), [{**row, "model_id": model_id} for row in rows])


class Registry(selection_tables.SelectionTables, renamed_methods.RenamedMethods):
    """A model registry in any SQLAlchemy database; an SQLite file by default.

    Parameters
    ----------
    url : str, optional
        SQLAlchemy URL such as ``"sqlite:////data/registry.db"`` or
        ``"postgresql+psycopg://user@host/db"``. None uses ``dvml.config.registry_url()``
        (``sqlite:///~/.dvml/registry.db`` unless configured); the directory of an SQLite
        file is created. The tables are created when missing.

    Notes
    -----
    Weights are data: they are stored as ``.npz`` bytes and loaded without pickle. Custom
    functions are code: their Python source is stored and run by :meth:`load_custom_objects`,
    so whoever may write to the registry may run code in the processes that load them.
    """

    # Named here so that the reference documents them as Registry's (they live in
    # dvml.registry.selection_tables, one module per kind of record).
    _tables = selection_tables.SelectionTables
    save_model_selection = _tables.save_model_selection
    model_selection = _tables.model_selection
    list_model_selections = _tables.list_model_selections
    drop_model_selection = _tables.drop_model_selection

    def __init__(self, url: str | None = None) -> None:
        raw = config.registry_url() if url is None else url
        if not isinstance(raw, str) or not raw:
            raise ArgumentTypeError(
                f"url must be an SQLAlchemy URL string or None. Received: {raw!r}. For "
                "example 'sqlite:////tmp/registry.db'."
            )
        try:
            self._url = sa.make_url(raw)
        except sa.exc.ArgumentError as exc:
            raise ArgumentError(
                f"url is not an SQLAlchemy URL: {exc}. Received: url={raw!r}. For example "
                "'sqlite:////tmp/registry.db'."
            ) from None
        self._engine = _create_engine(self._url)
        self._writer = self._engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
        try:
            self._create_missing_tables()
        except BaseException:
            self._engine.dispose()
            raise

    def _create_missing_tables(self) -> None:
        """Create the tables only when one is missing.

        A read transaction looks first: in WAL mode it waits for no writer, so opening a
        registry whose schema exists (every open but the first) never queues behind another
        process's write lock. Only a missing table takes the write lock (``create_all``
        checks again inside it, so two first openers do not collide).
        """
        wanted = set(metadata.tables)
        with self._transaction() as conn:
            present = set(sa.inspect(conn).get_table_names())
        if wanted <= present:
            return
        with self._transaction(write=True) as conn:
            metadata.create_all(conn)

    @property
    def url(self) -> str:
        """The database URL, with any password hidden."""
        return self._url.render_as_string(hide_password=True)

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine (for inspection; write through the methods)."""
        return self._engine

    def close(self) -> None:
        """Close the database connections. The registry can still be used afterwards."""
        self._engine.dispose()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Registry({self.url!r})"

    @contextlib.contextmanager
    def _transaction(self, write: bool = False) -> Iterator[sa.Connection]:
        try:
            with (self._writer if write else self._engine).begin() as conn:
                yield conn
        except sa.exc.SQLAlchemyError as exc:
            raise RegistryError(
                f"The model registry at {self.url} failed: {type(exc).__name__}: "
                f"{getattr(exc, 'orig', None) or exc}. Received: a "
                f"{'write' if write else 'read'} transaction. Check that the database is "
                "reachable and writable; a locked SQLite file means another process held the "
                f"write lock for over {BUSY_TIMEOUT_S:.0f} s."
            ) from exc

    def _not_found(self, what: str, received: str, lister: str) -> RegistryNotFoundError:
        return RegistryNotFoundError(
            f"No {what} in the registry at {self.url}. Received: {received}. See what exists "
            f"with dvml.registry.{lister}() or Registry.{lister}()."
        )

    # ------------------------------------------------------------------- architectures

    def add_architecture(
        self,
        model_json: str,
        weights: Sequence[npt.NDArray[Any]] | None = None,
        name: str | None = None,
        description: str | None = None,
    ) -> int:
        """Store a Keras architecture (``model.to_json()``), optionally with initial weights.

        The input shapes and the number of output units are read from the JSON without
        TensorFlow and shown by :meth:`list_architectures` (None where they are not plain).

        Parameters
        ----------
        model_json : str
            The architecture's JSON (tf-keras or Keras 3 in the common layers).
        weights : list of numpy.ndarray, optional
            Initial weights, for example pre-trained ones.
        name, description : str, optional
            Free text.

        Returns
        -------
        int
            The new architecture's id; ids are never reused.
        """
        # A Keras 3 model is stored in tf-keras' form (the trainers' Keras), or refused here.
        model_json, model = keras_json.tf_keras_json(model_json)
        row = {
            "name": v.check_text(name, "name", 255),
            "description": v.check_text(description, "description"),
            "model_json": model_json,
            "weights": None if weights is None else weights_to_bytes(weights),
            "weights_format": None if weights is None else WEIGHTS_FORMAT,
            "input_shapes": v.dumps(keras_json.input_shapes(model), "input_shapes"),
            "output_shape": v.dumps(keras_json.output_shape(model), "output_shape"),
            "created_at": v.now(),
        }
        with self._transaction(write=True) as conn:
            result = conn.execute(sa.insert(model_arch).values(**row))
            return new_id(result)

    def list_architectures(self) -> pd.DataFrame:
        """One row per architecture, without JSON or weights.

        Returns
        -------
        pandas.DataFrame
            Columns id, name, description, shapes, has_weights, created_at.
        """
        t = model_arch
        has_weights = sa.case((t.c.weights.is_(None), False), else_=True).label("has_weights")
        query = sa.select(
            t.c.id,
            t.c.name,
            t.c.description,
            t.c.input_shapes,
            t.c.output_shape,
            has_weights,
            t.c.created_at,
        ).order_by(t.c.id)
        with self._transaction() as conn:
            rows = [dict(row._mapping) for row in conn.execute(query)]
        for row in rows:
            row["input_shapes"] = v.loads(row["input_shapes"])
            row["output_shape"] = v.loads(row["output_shape"])
            row["has_weights"] = bool(row["has_weights"])
            row["created_at"] = v.utc(row["created_at"])
        columns = ["id", "name", "description", "input_shapes", "output_shape", "has_weights"]
        return pd.DataFrame(rows, columns=[*columns, "created_at"])

    def get_architecture(self, arch_id: int) -> dict[str, Any]:
        """Everything stored about one architecture.

        Parameters
        ----------
        arch_id : int
            The architecture's id.

        Returns
        -------
        dict
            ``id``, ``name``, ``description``, ``model_json``, ``weights`` (a list of arrays or
            None), ``input_shapes``, ``output_shape``, ``created_at``.

        Raises
        ------
        RegistryNotFoundError
            When no architecture has this id.
        """
        arch_id = v.check_id(arch_id, "arch_id")
        with self._transaction() as conn:
            row = conn.execute(sa.select(model_arch).where(model_arch.c.id == arch_id)).first()
        if row is None:
            raise self._not_found(
                f"architecture with id {arch_id}", f"arch_id={arch_id}", "list_architectures"
            )
        result = dict(row._mapping)
        result["weights"] = self._weights(result["weights"], result["weights_format"])
        result["input_shapes"] = v.loads(result["input_shapes"])
        result["output_shape"] = v.loads(result["output_shape"])
        result["created_at"] = v.utc(result["created_at"])
        return result

    def drop_architecture(self, arch_id: int) -> None:
        """Remove an architecture.

        Models trained from it stay and keep working: a dvml fit keeps the architecture's
        JSON in the model's summary (``model_arch``, MADlib's column of a model table), so
        predict and evaluate need no architecture row; their ``arch_id`` then names nothing.

        Parameters
        ----------
        arch_id : int
            The architecture's id.
        """
        arch_id = v.check_id(arch_id, "arch_id")
        with self._transaction(write=True) as conn:
            result = conn.execute(sa.delete(model_arch).where(model_arch.c.id == arch_id))
            if result.rowcount == 0:
                raise self._not_found(
                    f"architecture with id {arch_id}", f"arch_id={arch_id}", "list_architectures"
                )

    def _weights(self, blob: bytes | None, fmt: str | None) -> list[npt.NDArray[Any]] | None:
        if blob is None:
            return None
        if fmt != WEIGHTS_FORMAT:
            raise RegistryError(
                f"Stored weights have format {fmt!r}, which this dvml cannot read. Received: "
                f"weights_format={fmt!r}, expected {WEIGHTS_FORMAT!r}. Upgrade dvml or save "
                "the weights again."
            )
        return weights_from_bytes(blob)

    # ------------------------------------------------------------------- models

    def save_model(
        self,
        name: str,
        arch_id: int,
        weights: Sequence[npt.NDArray[Any]],
        summary: Mapping[str, Any] | None = None,
        iterations: Sequence[Mapping[str, Any]] | None = None,
        replace: bool = False,
    ) -> int:
        """Store a trained model and its per-iteration metrics in one transaction.

        Parameters
        ----------
        name : str
            Unique model name.
        arch_id : int
            The architecture it was built from; it must exist.
        weights : list of numpy.ndarray
            ``model.get_weights()``.
        summary : dict, optional
            MADlib-style summary; numpy scalars are stored as plain numbers.
        iterations : list of dict, optional
            Per-iteration records (see :func:`dvml.registry.values.iteration_rows`).
        replace : bool
            Replace a model of the same name (keeping its id, bumping its ``version``)
            instead of failing.

        Returns
        -------
        int
            The model's id.

        Raises
        ------
        RegistryError
            When a model of this name exists and ``replace`` is False.
        RegistryNotFoundError
            When the architecture does not exist.
        """
        entry = self._model_values(name, arch_id, weights, summary, iterations)
        with self._transaction(write=True) as conn:
            model_id = self._write_model(conn, entry, replace)
        return model_id

    def _model_values(
        self,
        name: str,
        arch_id: int,
        weights: Sequence[npt.NDArray[Any]],
        summary: Mapping[str, Any] | None,
        iterations: Sequence[Mapping[str, Any]] | None,
    ) -> dict[str, Any]:
        """A model's checked row values and iteration rows (before any transaction)."""
        # The names the rest of dvml accepts (dvml.names): a model's name reaches checkpoint
        # paths and lock files, so '../../x', NUL, newlines or 129 characters are refused.
        name = check_name(v.check_model_name(name), "name")
        arch_id = v.check_id(arch_id, "arch_id")
        if summary is not None and not isinstance(summary, Mapping):
            raise ArgumentTypeError(
                f"summary must be a dict or None. Received: {type(summary).__name__}."
            )
        values = {"arch_id": arch_id, "weights": weights_to_bytes(weights)}
        values.update(
            weights_format=WEIGHTS_FORMAT, summary=v.dumps(dict(summary or {}), "summary")
        )
        entry = {"name": name, "values": values, "rows": v.iteration_rows(iterations)}
        return {**entry, "summary": dict(summary or {})}

    def _write_model(self, conn: sa.Connection, entry: dict[str, Any], replace: bool) -> int:
        """Insert (or replace) one model inside the caller's transaction; its id."""
        name, values, rows = entry["name"], dict(entry["values"]), entry["rows"]
        arch_id = values["arch_id"]
        now = v.now()
        values["updated_at"] = now
        arch = sa.select(model_arch.c.id, model_arch.c.model_json).where(model_arch.c.id == arch_id)
        arch_row = conn.execute(arch).first()
        if arch_row is None:
            raise self._not_found(
                f"architecture with id {arch_id}", f"arch_id={arch_id}", "list_architectures"
            )
        query = sa.select(models.c.id, models.c.version, models.c.summary)
        existing = conn.execute(query.where(models.c.name == name)).first()
        if "lineage" in entry.get("summary", {}):  # completed here: arch hash, warm-start parent
            before = None if existing is None else {
                "version": existing.version, "summary": v.loads(existing.summary)
            }  # fmt: skip
            summary = model_lineage.completed(entry["summary"], arch_row.model_json, before, name)
            values["summary"] = v.dumps(summary, "summary")
        if existing is not None and not replace:
            raise RegistryError(
                f"A model named {name!r} exists in the registry at {self.url}. Received: "
                f"name={name!r}, replace=False. Pass replace=True to overwrite it, or "
                "choose another name."
            )
        if existing is not None:
            model_id = int(existing.id)
            conn.execute(sa.delete(model_iterations).where(model_iterations.c.model_id == model_id))
            update = sa.update(models).where(models.c.id == model_id)
            conn.execute(update.values(**values, version=existing.version + 1))
        else:
            insert = sa.insert(models).values(name=name, created_at=now, version=1, **values)
            model_id = new_id(conn.execute(insert))
        _insert_iterations(conn, model_id, rows)
        return model_id

    def save_model_selection_run(
        self,
        name: str,
        models_: Sequence[Mapping[str, Any]],
        info: Sequence[Mapping[str, Any]],
        summary: Mapping[str, Any],
    ) -> list[int]:
        """Store the models of one ``fit_multiple`` run and its info and summary tables.

        Everything is written in ONE transaction (replacing models and a run of the same
        names): a run that fails half-way leaves nothing behind.

        Parameters
        ----------
        name : str
            The run's ``model_output`` name (its info and summary are found by it).
        models_ : list of dict
            One per configuration: ``name``, ``arch_id``, ``weights``, ``summary``,
            ``iterations`` (as for :meth:`save_model`).
        info, summary : list of dict, dict
            MADlib's ``<model_output>_info`` rows and ``<model_output>_summary``.

        Returns
        -------
        list of int
            The models' ids, in order.
        """
        name = v.check_model_name(name)
        entries = [
            self._model_values(m["name"], m["arch_id"], m["weights"], m["summary"], m["iterations"])
            for m in models_
        ]
        info_text = v.dumps([dict(r) for r in info], "info")
        summary_text = v.dumps(dict(summary), "summary")
        with self._transaction(write=True) as conn:
            ids = [self._write_model(conn, e, replace=True) for e in entries]
            conn.execute(sa.delete(model_selection_runs).where(model_selection_runs.c.name == name))
            conn.execute(
                sa.insert(model_selection_runs).values(
                    name=name, info=info_text, summary=summary_text, created_at=v.now()
                )
            )
        return ids

    def model_selection_run(self, name: str) -> dict[str, Any]:
        """A ``fit_multiple`` run's info and summary.

        Parameters
        ----------
        name : str
            The run's ``model_output``.

        Returns
        -------
        dict
            ``info`` (a list of rows, MADlib's ``<model_output>_info``) and ``summary`` (a dict).

        Raises
        ------
        RegistryNotFoundError
            No run of that name.
        """
        name = v.check_model_name(name)
        query = sa.select(model_selection_runs).where(model_selection_runs.c.name == name)
        with self._transaction() as conn:
            row = conn.execute(query).first()
        if row is None:
            raise self._not_found(
                f"fit_multiple run named {name!r}", f"name={name!r}", "list_models"
            )
        return {"info": v.loads(row.info), "summary": v.loads(row.summary)}

    def _model_row(self, conn: sa.Connection, name: Any, *columns: Any) -> sa.Row[Any]:
        name = v.check_model_name(name)
        row = conn.execute(sa.select(*(columns or (models,))).where(models.c.name == name)).first()
        if row is None:
            raise self._not_found(f"model named {name!r}", f"name={name!r}", "list_models")
        return row

    def get_model(self, name: str, require: Sequence[str] = ()) -> dict[str, Any]:
        """A model: id, name, arch_id, weights (list of arrays), summary, version and times.

        Parameters
        ----------
        name : str
            The model's name.
        require : sequence of str
            Summary keys the caller needs (:data:`TRAINED_SUMMARY_KEYS` for evaluate and
            predict): a model saved without them (by :meth:`save_model` with another summary)
            is a :class:`RegistryError` naming what is missing, not a ``KeyError`` later.

        Returns
        -------
        dict
            ``id``, ``name``, ``arch_id``, ``weights``, ``summary``, ``version``,
            ``created_at``, ``updated_at``.
        """
        with self._transaction() as conn:
            result = dict(self._model_row(conn, name)._mapping)
        result["summary"] = v.loads(result["summary"])
        summary = result["summary"] if isinstance(result["summary"], dict) else {}
        missing = [key for key in require if key not in summary]
        if missing:
            raise RegistryError(
                f"Model {name!r} in the registry at {self.url} was not saved by a dvml fit: its "
                f"summary lacks {', '.join(missing)}. Received: summary keys "
                f"{sorted(summary)}. Train it with dvml.fit, or save it with a summary that "
                "holds them."
            )
        result["weights"] = self._weights(result["weights"], result["weights_format"])
        result["created_at"] = v.utc(result["created_at"])
        result["updated_at"] = v.utc(result["updated_at"])
        return result

    def model_exists(self, name: str) -> bool:
        """Whether a model of this name exists.

        Parameters
        ----------
        name : str
            The model's name.

        Returns
        -------
        bool
            True when the registry holds it.
        """
        name = v.check_model_name(name)
        with self._transaction() as conn:
            query = sa.select(models.c.id).where(models.c.name == name)
            return conn.execute(query).first() is not None

    def list_models(self) -> pd.DataFrame:
        """One row per model, without weights.

        Returns
        -------
        pandas.DataFrame
            Columns id, name, arch_id, version, n_iterations, created_at, updated_at.
        """
        counts = (
            sa.select(model_iterations.c.model_id, sa.func.count().label("n_iterations"))
            .group_by(model_iterations.c.model_id)
            .subquery()
        )
        n_iterations = sa.func.coalesce(counts.c.n_iterations, 0).label("n_iterations")
        query = (
            sa.select(
                models.c.id,
                models.c.name,
                models.c.arch_id,
                models.c.version,
                n_iterations,
                models.c.created_at,
                models.c.updated_at,
            )
            .select_from(models.outerjoin(counts, counts.c.model_id == models.c.id))
            .order_by(models.c.id)
        )
        with self._transaction() as conn:
            rows = [dict(row._mapping) for row in conn.execute(query)]
        for row in rows:
            row["created_at"] = v.utc(row["created_at"])
            row["updated_at"] = v.utc(row["updated_at"])
        columns = ["id", "name", "arch_id", "version", "n_iterations", "created_at", "updated_at"]
        return pd.DataFrame(rows, columns=columns)

    def model_summary(self, name: str) -> dict[str, Any]:
        """The summary dict saved with the model.

        Parameters
        ----------
        name : str
            The model's name.

        Returns
        -------
        dict
            MADlib's fit summary fields and dvml's own.
        """
        with self._transaction() as conn:
            row = self._model_row(conn, name, models.c.summary)
        return dict(v.loads(row.summary) or {})

    def model_iterations(self, name: str) -> pd.DataFrame:
        """The per-iteration records of a model, ordered by iteration; metrics are dicts.

        Parameters
        ----------
        name : str
            The model's name.

        Returns
        -------
        pandas.DataFrame
            One row per evaluated iteration: losses, metrics, seconds.
        """
        with self._transaction() as conn:
            model_id = self._model_row(conn, name, models.c.id).id
            t = model_iterations
            query = sa.select(*(t.c[c] for c in v.ITERATION_COLUMNS)).where(
                t.c.model_id == model_id
            )
            rows = [dict(row._mapping) for row in conn.execute(query.order_by(t.c.iteration))]
        for row in rows:
            row["training_metrics"] = v.loads(row["training_metrics"])
            row["validation_metrics"] = v.loads(row["validation_metrics"])
        return pd.DataFrame(rows, columns=list(v.ITERATION_COLUMNS))

    def drop_model(self, name: str) -> None:
        """Remove a model and its iteration records in one transaction.

        Parameters
        ----------
        name : str
            The model's name, or a ``fit_multiple``/``automl`` run's ``model_output``: its info
            and summary are removed with every model the run registered (MADlib's ``DROP TABLE
            x, x_info, x_summary``).
        """
        name = v.check_model_name(name)
        runs = model_selection_runs
        with self._transaction(write=True) as conn:
            run = conn.execute(sa.select(runs.c.summary).where(runs.c.name == name)).first()
            names = [name]
            if run is not None:
                summary = v.loads(run.summary)
                names += list(summary.get("model_names") or []) if isinstance(summary, dict) else []
                conn.execute(sa.delete(runs).where(runs.c.name == name))
            found = conn.execute(sa.select(models.c.id).where(models.c.name.in_(names))).all()
            if run is None and not found:
                self._model_row(conn, name, models.c.id)  # raises RegistryNotFoundError
            for row in found:
                conn.execute(
                    sa.delete(model_iterations).where(model_iterations.c.model_id == row.id)
                )
                conn.execute(sa.delete(models).where(models.c.id == row.id))

    # ------------------------------------------------------------------- custom functions

    def register_custom_function(
        self,
        name: str,
        source: str,
        kind: str = "loss",
        description: str | None = None,
        replace: bool = False,
    ) -> int:
        """Store the Python source of a custom loss or metric ``def name(y_true, y_pred)``.

        The source is checked with :mod:`ast` (see :mod:`dvml.registry.custom`) and stored as
        text; nothing is run here. Registering is a trust decision: the code runs in every
        process that later calls :meth:`load_custom_objects` with this name.

        Parameters
        ----------
        name : str
            The function's name.
        source : str
            Python source that defines ``name``.
        kind : {"loss", "metric"}
            What it is.
        description : str, optional
            Free text.
        replace : bool
            Replace a function of this name.

        Returns
        -------
        int
            The function's id.
        """
        custom.check_source(name, source)
        if kind not in custom.KINDS:
            raise ArgumentError(
                f"kind must be one of {list(custom.KINDS)}. Received: kind={kind!r}."
            )
        row = {
            "name": name,
            "kind": kind,
            "source": source,
            "description": v.check_text(description, "description"),
            "created_at": v.now(),
        }
        t = custom_functions
        with self._transaction(write=True) as conn:
            existing = conn.execute(sa.select(t.c.id).where(t.c.name == name)).first()
            if existing is not None and not replace:
                raise RegistryError(
                    f"A custom function named {name!r} exists in the registry at {self.url}. "
                    f"Received: name={name!r}, replace=False. Pass replace=True to overwrite "
                    "it, or choose another name."
                )
            if existing is not None:
                conn.execute(sa.update(t).where(t.c.id == existing.id).values(**row))
                return int(existing.id)
            return new_id(conn.execute(sa.insert(t).values(**row)))

    def list_custom_functions(self) -> pd.DataFrame:
        """One row per custom function, with its source.

        Returns
        -------
        pandas.DataFrame
            Columns id, name, kind, description, created_at, source.
        """
        t = custom_functions
        columns = ["id", "name", "kind", "description", "created_at", "source"]
        with self._transaction() as conn:
            query = sa.select(*(t.c[c] for c in columns)).order_by(t.c.id)
            rows = [dict(row._mapping) for row in conn.execute(query)]
        for row in rows:
            row["created_at"] = v.utc(row["created_at"])
        return pd.DataFrame(rows, columns=columns)

    def drop_custom_function(self, name: str) -> None:
        """Remove a custom function.

        Parameters
        ----------
        name : str
            The function's name.
        """
        name = custom.check_name(name)
        t = custom_functions
        with self._transaction(write=True) as conn:
            if conn.execute(sa.delete(t).where(t.c.name == name)).rowcount == 0:
                raise self._not_found(
                    f"custom function named {name!r}", f"name={name!r}", "list_custom_functions"
                )

    def custom_function_sources(self, names: str | Iterable[str]) -> dict[str, str]:
        """The stored source of each named custom function, checked again but not run.

        For processes that compile the functions elsewhere (trainers) with
        :func:`dvml.registry.custom.compile_function`.

        Parameters
        ----------
        names : str or iterable of str
            The functions' names.

        Returns
        -------
        dict of str to str
            The source of each, by name.

        Raises
        ------
        RegistryNotFoundError
            Naming every requested function that does not exist.
        ArgumentError
            When a stored source no longer passes the checks (it was edited in the database).
        """
        wanted = [names] if isinstance(names, str) else list(names)
        for name in wanted:
            custom.check_name(name)
        if not wanted:
            return {}
        t = custom_functions
        with self._transaction() as conn:
            query = sa.select(t.c.name, t.c.source).where(t.c.name.in_(wanted))
            sources = {row.name: row.source for row in conn.execute(query)}
        missing = [name for name in wanted if name not in sources]
        if missing:
            raise self._not_found(
                f"custom function named {', '.join(map(repr, missing))}",
                f"names={wanted!r}",
                "list_custom_functions",
            )
        for name in wanted:
            custom.check_source(name, sources[name])
        return {name: sources[name] for name in wanted}

    def load_custom_objects(self, names: str | Iterable[str]) -> dict[str, Callable[..., Any]]:
        """Compile stored custom functions, for ``custom_objects=`` and ``model.compile``.

        Each source runs with :func:`exec` in a fresh namespace holding ``tf`` (TensorFlow,
        started through :mod:`dvml.tf_runtime`) and ``np``. This runs code that a
        registry user registered on purpose: the trust boundary is who may write to the
        registry. Weights, in contrast, are data and never run anything.

        Parameters
        ----------
        names : str or iterable of str
            The functions' names.

        Returns
        -------
        dict of str to callable
            Each compiled function, by name.

        Raises
        ------
        RegistryNotFoundError
            Naming every requested function that does not exist.
        """
        return custom.custom_objects_from_sources(self.custom_function_sources(names))


def open_registry(registry: Registry | str | None) -> Registry:
    """``registry`` itself when it is a :class:`Registry`, else one opened on that URL.

    The caller owns (and closes) a registry opened here; use :func:`opened_registry` when the
    registry is needed only for the length of a ``with`` block.
    """
    if isinstance(registry, Registry):
        return registry
    if registry is not None and not isinstance(registry, str):
        raise ArgumentTypeError(
            f"registry must be a Registry, a URL string or None. Received: "
            f"{type(registry).__name__}."
        )
    return Registry(registry)


@contextlib.contextmanager
def opened_registry(registry: Registry | str | None) -> Iterator[Registry]:
    """:func:`open_registry` for a ``with`` block: closes the registry if it opened it."""
    opened = open_registry(registry)
    try:
        yield opened
    finally:
        if opened is not registry:
            opened.close()
