"""No SQL in the package is built from strings that carry runtime data.

Statements are SQLAlchemy constructs with bound parameters. A string handed to
``text()``, ``literal_column()`` or a driver-level ``execute`` is only safe when
nothing but literals and the module's own constants went into it; anything
else must be on the short, justified allowlist below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pikku_celery"

# Calls whose first argument becomes SQL text as it is.
SQL_CALLS = frozenset(
    {"text", "literal_column", "exec_driver_sql", "execute", "executescript", "executemany"}
)

# (module path, function) pairs whose built SQL strings were read and found safe.
# The partitioned layout's DDL: PostgreSQL binds no identifier, so its statements name the
# tables of ``PARTITIONED_TABLES`` (the module's constants), partitions named from those and
# a ``date``, and definitions read back from PostgreSQL's own catalogue (a key's columns, an
# index's, a view's and its trigger's ``pg_get_*def``); no value of a row goes into them.
_PARTITIONS = "pikku_celery/schema/partitions.py"
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    (_PARTITIONS, function)
    for function in (
        "_convert",
        "_drop_day",
        "_make_day",
        "_make_parent",
        "_make_partition",
        "_may_drop",
        "_owned",
    )
)

MODULE_SCOPE = "<module>"
Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Finding:
    path: str
    function: str
    line: int
    call: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.call}() in {self.function}"


def module_constants(tree: ast.Module) -> frozenset[str]:
    """Names bound once in the whole module, at its top, to a literal: nothing can change them."""
    bindings: dict[str, int] = {}

    def bind(name: str) -> None:
        bindings[name] = bindings.get(name, 0) + 1

    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            bind(node.id)
        elif isinstance(node, ast.arg):
            bind(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bind(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                bind((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bind(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            # Rebinding from inside a function: never a constant.
            for name in node.names:
                bind(name)
                bind(name)

    constants: set[str] = set()
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Constant)
            and bindings.get(target.id) == 1
        ):
            constants.add(target.id)
    return frozenset(constants)


class _Checker:
    def __init__(self, tree: ast.Module, path: str) -> None:
        self.tree = tree
        self.path = path
        self.constants = module_constants(tree)

    def findings(self) -> Iterator[Finding]:
        yield from self._visit(self.tree, self.tree, MODULE_SCOPE)

    def _visit(self, node: ast.AST, scope: Scope, name: str) -> Iterator[Finding]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                qualname = child.name if name == MODULE_SCOPE else f"{name}.{child.name}"
                yield from self._visit(child, child, qualname)
                continue
            if isinstance(child, ast.ClassDef):
                qualname = child.name if name == MODULE_SCOPE else f"{name}.{child.name}"
                yield from self._visit(child, scope, qualname)
                continue
            if isinstance(child, ast.Call):
                call = _call_name(child)
                argument = _first_argument(child)
                if call in SQL_CALLS and argument is not None:
                    if self._built(argument, scope, set()):
                        yield Finding(self.path, name, child.lineno, call)
            yield from self._visit(child, scope, name)

    def _safe(self, node: ast.expr) -> bool:
        """A literal, or a name of a proven module constant."""
        if isinstance(node, ast.Constant):
            return True
        return isinstance(node, ast.Name) and node.id in self.constants

    def _parts_safe(self, parts: list[ast.expr], scope: Scope, seen: set[str]) -> bool:
        return all(
            self._safe(part)
            or (isinstance(part, ast.JoinedStr) and not self._built(part, scope, seen))
            for part in parts
        )

    def _built(self, node: ast.expr, scope: Scope, seen: set[str]) -> bool:
        """True when ``node`` is a string assembled from anything but literals and constants."""
        if isinstance(node, ast.JoinedStr):
            for value in node.values:
                if not isinstance(value, ast.FormattedValue):
                    continue
                if not self._safe(value.value):
                    return True
                if value.format_spec is not None and self._built(value.format_spec, scope, seen):
                    return True
            return False
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
            parts = _operands(node)
            if not any(_is_str(part) for part in parts):
                return False
            return not self._parts_safe(parts, scope, seen)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("format", "join"):
                parts = [func.value, *node.args, *(k.value for k in node.keywords)]
                parts = [p for arg in parts for p in _elements(arg)]
                return not self._parts_safe(parts, scope, seen)
            # str(x) and repr(x) turn a runtime value into SQL text just the same.
            if isinstance(func, ast.Name) and func.id in ("str", "repr"):
                return not self._parts_safe(list(node.args), scope, seen)
            return False
        if isinstance(node, ast.Name) and node.id not in seen:
            # A built string passed through a local variable is still built.
            seen.add(node.id)
            return any(self._built(value, scope, seen) for value in _assigned(scope, node.id))
        return False


def _call_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def _first_argument(call: ast.Call) -> ast.expr | None:
    if call.args:
        first = call.args[0]
        return None if isinstance(first, ast.Starred) else first
    for keyword in call.keywords:
        if keyword.arg is not None:
            return keyword.value
    return None


def _operands(node: ast.expr) -> list[ast.expr]:
    """The leaves of a chain of ``+`` and ``%``; a ``%`` tuple counts element by element."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return [*_operands(node.left), *_operands(node.right)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return [*_operands(node.left), *_elements(node.right)]
    return [node]


def _elements(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return list(node.elts)
    if isinstance(node, ast.Dict):
        return [value for value in node.values if value is not None]
    return [node]


def _is_str(node: ast.expr) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


def _assigned(scope: Scope, name: str) -> Iterator[ast.expr]:
    """Every value bound to ``name`` in ``scope``, ``+=`` included."""
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                yield node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            if isinstance(node.target, ast.Name) and node.target.id == name:
                yield node.value
        elif isinstance(node, ast.AugAssign):
            if isinstance(node.target, ast.Name) and node.target.id == name:
                yield ast.BinOp(left=node.target, op=node.op, right=node.value)
        elif isinstance(node, ast.NamedExpr) and node.target.id == name:
            yield node.value


def check_source(source: str, path: str) -> list[Finding]:
    return list(_Checker(ast.parse(source, filename=path), path).findings())


def check_package() -> list[Finding]:
    findings: list[Finding] = []
    for file in sorted(PACKAGE.rglob("*.py")):
        path = file.relative_to(ROOT).as_posix()
        findings.extend(check_source(file.read_text(encoding="utf-8"), path))
    return findings


# --- the package -----------------------------------------------------------


def test_no_sql_is_built_from_runtime_strings() -> None:
    unexpected = [f for f in check_package() if (f.path, f.function) not in ALLOWED]
    assert unexpected == [], "SQL built from strings; bind the values instead:\n" + "\n".join(
        map(str, unexpected)
    )


def test_every_allowlist_entry_still_matches_a_call() -> None:
    matched = {(f.path, f.function) for f in check_package()}
    assert sorted(ALLOWED - matched) == [], "allowlist entries that match nothing: remove them"


# --- the checker itself ----------------------------------------------------

PROLOGUE = "import sqlalchemy as sa\nTABLE = 'runs'\n"


@pytest.mark.parametrize(
    "line",
    [
        'conn.execute(sa.text(f"select * from t where id = {user}"))',
        'conn.execute(sa.text("select * from t where id = " + user))',
        'conn.execute(sa.text("select * from t where id = %s" % user))',
        'conn.execute(sa.text("select * from t where id = %s" % (user,)))',
        'conn.execute(sa.text("select * from t where id = {}".format(user)))',
        'conn.execute(sa.text(" and ".join(clauses)))',
        "conn.exec_driver_sql(f'delete from {table}')",
        "cursor.executescript('drop table ' + name)",
        "cursor.executemany(f'insert into {table} values (?)', rows)",
        "sa.literal_column(f\"'{status}'\")",
        "sa.literal_column(str(order))",
        'query = f"select * from t where id = {user}"\nconn.execute(sa.text(query))',
        'query = "select * from t"\nquery += " where id = " + user\nconn.execute(sa.text(query))',
        'conn.execute(sa.text(text=f"select {column} from t"))',
    ],
)
def test_the_checker_flags_sql_built_from_runtime_data(line: str) -> None:
    source = PROLOGUE + "def load(conn, cursor, user, clauses, table, name, rows, status, order, "
    source += "column):\n" + "".join(f"    {part}\n" for part in line.splitlines())
    findings = check_source(source, "example.py")
    assert [f.function for f in findings] == ["load"], findings


@pytest.mark.parametrize(
    "line",
    [
        'sa.text("select 1")',
        'conn.execute(sa.text("select * from t where id = :id"), {"id": user})',
        'conn.execute(sa.select(sa.column("id")).where(sa.column("id") == sa.bindparam("id")))',
        "conn.execute(statement, params)",
        'cursor.execute("PRAGMA foreign_keys=ON")',
        'conn.exec_driver_sql(f"select * from {TABLE}")',
        'conn.exec_driver_sql("select * from " + TABLE)',
        'sa.literal_column("0")',
        'log.info("ran " + statement)',
        'query = "select 1"\nconn.execute(sa.text(query))',
    ],
)
def test_the_checker_passes_constant_sql_and_bound_parameters(line: str) -> None:
    source = PROLOGUE + "def load(conn, cursor, user, statement, params, log):\n"
    source += "".join(f"    {part}\n" for part in line.splitlines())
    assert check_source(source, "example.py") == []


def test_a_module_constant_that_is_rebound_is_not_trusted() -> None:
    source = PROLOGUE + (
        "def rename(name):\n"
        "    global TABLE\n"
        "    TABLE = name\n"
        "def load(conn):\n"
        '    conn.exec_driver_sql(f"select * from {TABLE}")\n'
    )
    assert [str(f) for f in check_source(source, "example.py")] == [
        "example.py:7 exec_driver_sql() in load"
    ]


def test_findings_name_their_method() -> None:
    source = "class Store:\n    def load(self, conn, user):\n        conn.execute(f'{user}')\n"
    assert check_source(source, "example.py") == [Finding("example.py", "Store.load", 3, "execute")]
