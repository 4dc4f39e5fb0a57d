"""The default version of a workflow: what its code does, not how its source looks."""

from __future__ import annotations

import importlib.util
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pikku_celery.workflows.definition import code_version

BASE = """
import functools

def flow(ctx, order_id):
    total = ctx.do("charge", lambda: order_id * 2)
    return {"total": total}
"""


def load(folder: Path, name: str, source: str) -> Callable[..., Any]:
    """``flow`` from ``source``, imported from a file as a worker imports it."""
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(f"versions_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    flow: Callable[..., Any] = module.flow
    return flow


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(
            """
            import functools

            # Why this flow exists.
            def flow(ctx, order_id):  # the order to charge
                # Charge twice the amount.
                total = ctx.do("charge", lambda: order_id * 2)
                return {"total": total}  # what the caller reads
            """,
            id="comments",
        ),
        pytest.param(
            """
            import functools

            def flow(
                ctx,
                order_id,
            ):
                total = ctx.do(
                    'charge',
                    lambda: order_id*2,
                )

                return {'total': total,}
            """,
            id="layout-and-quotes",
        ),
        pytest.param(
            """
            import functools

            def tag(*names, **options):
                return lambda fn: fn

            @tag("checkout")
            @tag(
                retries=3,
            )
            def flow(ctx, order_id):
                total = ctx.do("charge", lambda: order_id * 2)
                return {"total": total}
            """,
            id="decorators",
        ),
        pytest.param(
            '''
            import functools

            if True:
                def flow(ctx, order_id):
                    """Indented in a block, as in a class or a function."""
                    total = ctx.do("charge", lambda: order_id * 2)
                    return {"total": total}
            ''',
            id="docstring-and-indent",
        ),
    ],
)
def test_only_a_change_of_code_is_a_new_version(tmp_path: Path, variant: str) -> None:
    base = code_version(load(tmp_path, "base", BASE))
    assert len(base) == 12
    assert code_version(load(tmp_path, "variant", variant)) == base


@pytest.mark.parametrize(
    "change",
    [
        ('"charge"', '"pay"'),  # a step renamed
        ("order_id * 2", "order_id * 3"),  # a constant
        ('{"total": total}', '{"sum": total}'),  # the output's shape
        ("def flow(ctx, order_id)", "async def flow(ctx, order_id)"),
    ],
)
def test_every_change_of_code_is_a_new_version(tmp_path: Path, change: tuple[str, str]) -> None:
    old, new = change
    assert old in BASE
    changed = load(tmp_path, "changed", BASE.replace(old, new))
    assert code_version(changed) != code_version(load(tmp_path, "base", BASE))


def test_without_source_the_bytecode_with_its_constants_decides() -> None:
    def compiled(body: str) -> Callable[..., Any]:
        namespace: dict[str, Any] = {}
        exec(compile(f"def flow(ctx):\n    {body}\n", "<no file>", "exec"), namespace)
        flow: Callable[..., Any] = namespace["flow"]
        return flow

    first = code_version(compiled("return ctx.do('a', lambda: 1)"))
    assert first == code_version(compiled("return ctx.do('a', lambda: 1)"))
    assert first != code_version(compiled("return ctx.do('a', lambda: 2)"))
    assert first != code_version(compiled("return ctx.do('b', lambda: 1)"))


def test_a_lambda_is_versioned_by_its_code_not_by_the_line_around_it() -> None:
    first, second = (lambda ctx: ctx.do("a", print)), (lambda ctx: ctx.do("b", print))
    assert code_version(first) != code_version(second)
    assert code_version(first) == code_version(first)
