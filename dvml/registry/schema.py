"""The registry's tables (SQLAlchemy Core), portable across SQLite, PostgreSQL and MySQL.

JSON values are stored as TEXT written by :mod:`json`, so every backend reads them the same.
Times are UTC. ``models.arch_id`` has no foreign key on purpose: an architecture may be deleted
while models trained from it remain (their ``arch_id`` then names nothing); architecture ids
are never reused (``AUTOINCREMENT`` on SQLite), so a dangling id never points to another one.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from dvml.exceptions import RegistryError

__all__ = [
    "custom_functions",
    "metadata",
    "model_arch",
    "model_iterations",
    "model_selection_rows",
    "model_selection_runs",
    "model_selections",
    "models",
    "new_id",
]

metadata = sa.MetaData()

_NAME = sa.String(255)
# MySQL's plain BLOB and TEXT stop at 64 KiB: weights and model JSON are larger.
_BLOB = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
_TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")

model_arch = sa.Table(
    "model_arch",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", _NAME, nullable=True),
    sa.Column("description", sa.Text, nullable=True),
    sa.Column("model_json", _TEXT, nullable=False),
    sa.Column("weights", _BLOB, nullable=True),
    sa.Column("weights_format", sa.String(32), nullable=True),
    sa.Column("input_shapes", sa.Text, nullable=True),
    sa.Column("output_shape", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sqlite_autoincrement=True,
)

models = sa.Table(
    "models",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", _NAME, nullable=False, unique=True),
    sa.Column("arch_id", sa.Integer, nullable=False),
    sa.Column("weights", _BLOB, nullable=False),
    sa.Column("weights_format", sa.String(32), nullable=False),
    sa.Column("summary", _TEXT, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sqlite_autoincrement=True,
)

model_iterations = sa.Table(
    "model_iterations",
    metadata,
    sa.Column(
        "model_id",
        sa.Integer,
        sa.ForeignKey("models.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("iteration", sa.Integer, primary_key=True),
    sa.Column("training_loss", sa.Float, nullable=True),
    sa.Column("training_metrics", sa.Text, nullable=True),
    sa.Column("validation_loss", sa.Float, nullable=True),
    sa.Column("validation_metrics", sa.Text, nullable=True),
    sa.Column("elapsed_s", sa.Float, nullable=True),
)

custom_functions = sa.Table(
    "custom_functions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", _NAME, nullable=False, unique=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("source", _TEXT, nullable=False),
    sa.Column("description", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("kind IN ('loss', 'metric')", name="custom_functions_kind"),
)

# MADlib's model selection tables, one row per table here and its configurations below. The
# rows' model_id has no foreign key, as models.arch_id: the ids are checked when a table is
# saved, and deleting an architecture later leaves the table readable.
model_selections = sa.Table(
    "model_selections",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", _NAME, nullable=False, unique=True),
    sa.Column("description", sa.Text, nullable=True),
    sa.Column("search", sa.String(16), nullable=True),
    sa.Column("seed", sa.BigInteger, nullable=True),
    sa.Column("source", _TEXT, nullable=True),
    sa.Column("custom_objects", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sqlite_autoincrement=True,
)

model_selection_rows = sa.Table(
    "model_selection_rows",
    metadata,
    sa.Column(
        "selection_id",
        sa.Integer,
        sa.ForeignKey("model_selections.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("mst_key", sa.Integer, primary_key=True),
    sa.Column("model_id", sa.Integer, nullable=False),
    sa.Column("compile_params", _TEXT, nullable=False),
    sa.Column("fit_params", _TEXT, nullable=False),
)

# dvml.fit_multiple: MADlib's <model_output>_info (one row per configuration) and
# <model_output>_summary, as JSON, under the run's model_output name.
model_selection_runs = sa.Table(
    "model_selection_runs",
    metadata,
    sa.Column("name", _NAME, primary_key=True),
    sa.Column("info", _TEXT, nullable=False),
    sa.Column("summary", _TEXT, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)


def new_id(result: sa.CursorResult[Any]) -> int:
    """The id of the row an insert added."""
    key = result.inserted_primary_key
    if key is None:  # pragma: no cover - every insert here has an integer primary key
        raise RegistryError("The database returned no id for a new row. Received: None.")
    return int(key[0])
