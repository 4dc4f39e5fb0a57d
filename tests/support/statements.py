"""Counting the statements a store call sends, through SQLAlchemy's engine events."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa


class StatementLog:
    def __init__(self) -> None:
        self.statements: list[str] = []
        self.commits = 0

    def __len__(self) -> int:
        return len(self.statements)

    def verbs(self) -> list[str]:
        return [statement.lstrip().split(None, 1)[0].upper() for statement in self.statements]

    def touching(self, table: str) -> list[str]:
        return [s for s in self.statements if table in s]


@contextmanager
def count_statements(engine: sa.Engine) -> Iterator[StatementLog]:
    log = StatementLog()

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        log.statements.append(statement)

    def committed(conn: Any) -> None:
        log.commits += 1

    sa.event.listen(engine, "before_cursor_execute", record)
    sa.event.listen(engine, "commit", committed)
    try:
        yield log
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
        sa.event.remove(engine, "commit", committed)
