"""Which of the suite's tests skip themselves unless the result backend is Redis's.

Celery's integration tests gate on the configured URL's spelling
(``if not manager.app.conf.result_backend.startswith('redis'): pytest.skip(...)``), in a
test or in a fixture of its class. Found by reading the suite's source (``ast``), so the
backend mode can say how the gated tests fared whatever the backend's URL was.
Also: the few tests that look at the Redis backend's own keys and channels, which another
backend fails by design.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path
from typing import Final

__all__ = ["GATE_MESSAGES", "REDIS_INTERNALS", "gated_tests", "redis_internals"]

#: The skip messages of those gates.
GATE_MESSAGES: Final = ("Requires redis result backend.", "Requires redis or rpc result backend.")

#: Tests (node ids without parameters) that assert what the Redis backend keeps in Redis.
REDIS_INTERNALS: Final = {
    "t/integration/test_tasks.py::test_task_redis_result_backend::"
    "test_asyncresult_forget_cancels_subscription": "asserts the Redis pub/sub channel "
    "celery-task-meta-<id> is subscribed while the result is pending",
    "t/integration/test_tasks.py::test_task_redis_result_backend::"
    "test_asyncresult_get_cancels_subscription": "asserts the Redis pub/sub channel "
    "celery-task-meta-<id> is subscribed while the result is pending",
    "t/integration/test_canvas.py::test_chord::test_chord_on_error": "reads the chord's "
    "Redis sorted set <group>.j (backend.get_key_for_group) with a Redis client",
    "t/integration/test_canvas.py::test_chord::test_redis_subscribed_channels_leak": "counts "
    "Redis pub/sub channels (backend.result_consumer); xfail in Celery's own suite",
}


def _is_gate(node: ast.AST) -> bool:
    """``not <...>.result_backend.startswith(<'redis' or a tuple holding it>)``."""
    if not (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
        return False
    call = node.operand
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "startswith"
        and isinstance(call.func.value, ast.Attribute)
        and call.func.value.attr == "result_backend"
        and call.args
    ):
        return False
    arg = call.args[0]
    values = arg.elts if isinstance(arg, ast.Tuple) else [arg]
    return any(isinstance(v, ast.Constant) and v.value == "redis" for v in values)


def _gated(function: ast.AST) -> bool:
    return any(_is_gate(node) for node in ast.walk(function))


def _functions(body: Iterable[ast.stmt]) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def gated_tests(root: Path, files: Iterable[str]) -> set[str]:
    """Node ids (without parameters) of the gated tests in ``files`` under ``root``: a test
    function holding a gate, or every test of a class one of whose fixtures holds one."""
    found: set[str] = set()
    for name in files:
        path = name.split("::", 1)[0]
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        for function in _functions(tree.body):
            if function.name.startswith("test") and _gated(function):
                found.add(f"{path}::{function.name}")
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            methods = _functions(cls.body)
            fixture_gate = any(not m.name.startswith("test") and _gated(m) for m in methods)
            for method in methods:
                if method.name.startswith("test") and (fixture_gate or _gated(method)):
                    found.add(f"{path}::{cls.name}::{method.name}")
    return found


def redis_internals(nodeid: str) -> str | None:
    """Why this test fails on any backend but Redis's, or None."""
    return REDIS_INTERNALS.get(nodeid.split("[", 1)[0])
