"""What a statement both dialects send is handed to spell its dialect's part.

A statement here never asks which database it is for: what PostgreSQL and SQLite
spell differently inside it (their INSERT ... ON CONFLICT, a typed parameter in
INSERT ... SELECT, a clock, a match against a list of ids) comes in as an
argument, given by the dialect's catalogue (``store/dialect.py``), which builds
each such statement once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

__all__ = ["Among", "Parameter", "Upsert"]

#: The dialect's INSERT, the one with ON CONFLICT: ``insert(table)``.
Upsert = Callable[[sa.Table], Any]

#: A parameter of a given type inside INSERT ... SELECT: ``parameter(name, type_)``.
Parameter = Callable[[str, Any], sa.ColumnElement[Any]]

#: ``key`` is one of the ids a subquery selects: ``among(key, ids)``.
Among = Callable[[sa.ColumnElement[Any], sa.ScalarSelect[Any]], sa.ColumnElement[bool]]
