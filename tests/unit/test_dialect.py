"""One catalogue per dialect, chosen when the connector is made; nothing else asks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pikku_celery import WorkflowStore
from pikku_celery.errors import StoreError
from pikku_celery.store.dialect import dialect_named

STORE = Path(__file__).resolve().parents[2] / "pikku_celery" / "store"
DIALECT_NAMES = frozenset({"postgresql", "sqlite"})
# Engine set-up (drivers, connection settings) comes before any connector and its catalogue.
CHOOSES_THE_DIALECT = frozenset({"dialect.py", "engine.py"})


def test_connectors_of_a_dialect_share_its_catalogue(tmp_path: Path) -> None:
    first = WorkflowStore(f"sqlite:///{tmp_path / 'a.db'}")
    second = WorkflowStore(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        assert first.db.sql is second.db.sql
        assert first.db.sql.name == first.dialect == "sqlite"
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("name", sorted(DIALECT_NAMES))
def test_a_catalogue_hands_out_the_same_statements_every_call(name: str) -> None:
    # The connector compiles a statement once per engine, keyed by the statement itself:
    # one built again at each call would be compiled again at each call.
    sql = dialect_named(name)
    for status in ("scheduled", "running", "succeeded", "failed", "cancelled"):
        again = sql.record_attempt(status)
        assert all(a is b for a, b in zip(sql.record_attempt(status), again, strict=True))
    for status in ("pending", "scheduled", "running"):
        again = sql.next_attempt(status)
        assert all(a is b for a, b in zip(sql.next_attempt(status), again, strict=True))


def test_another_database_is_refused_with_the_ones_supported() -> None:
    with pytest.raises(StoreError, match="PostgreSQL or SQLite, not 'mysql'"):
        dialect_named("mysql")


def _names_a_dialect(nodes: list[ast.expr]) -> bool:
    return any(isinstance(n, ast.Constant) and n.value in DIALECT_NAMES for n in nodes)


def _is_the_connector(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "_db") or (
        isinstance(node, ast.Name) and node.id == "db"
    )


def _asks_for_the_dialect(tree: ast.Module) -> list[int]:
    """Lines that compare with a dialect's name, key a choice by it, or read the
    connector's dialect: the ways an operation or a statement chose it before."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            asks = _names_a_dialect([node.left, *node.comparators])
        elif isinstance(node, ast.Dict):
            asks = _names_a_dialect([key for key in node.keys if key is not None])
        elif isinstance(node, ast.Attribute):
            asks = node.attr == "dialect" and _is_the_connector(node.value)
        else:
            continue
        if asks:
            lines.append(node.lineno)
    return lines


def test_only_the_catalogue_chooses_by_dialect() -> None:
    found = {
        str(path.relative_to(STORE)): lines
        for path in sorted(STORE.rglob("*.py"))
        if path.name not in CHOOSES_THE_DIALECT
        and (lines := _asks_for_the_dialect(ast.parse(path.read_text())))
    }
    assert found == {}


def test_the_result_literals_are_the_ready_states_and_the_unnamed_attempt() -> None:
    # The ON CONFLICT part of a result's write spells these constants as SQL literals.
    from pikku_celery.store.sql import results

    spelled = tuple(str(literal.name).strip("'") for literal in results._READY_SQL)
    assert spelled == results.READY_STATES
    assert str(results._UNNAMED_SQL.name) == str(results.UNNAMED)
