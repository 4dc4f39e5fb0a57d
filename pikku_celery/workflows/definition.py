"""A workflow definition: its function, its name and the version that identifies its code."""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
import types
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pikku_celery.errors import ConfigurationError

__all__ = ["Workflow", "code_version"]

# Run ids derived from idempotency keys: this project's own namespace, so they never
# collide with the step keys derived in Pikku's.
_START_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pikku.dev/celery/start")

_Function = ast.FunctionDef | ast.AsyncFunctionDef


def code_version(fn: Callable[..., Any]) -> str:
    """A short hash of what the function does: a change of its code is a new version.

    The hash is of its syntax tree without decorators, docstrings, comments and
    layout, so reformatting the function, rewording its comments or moving it in
    its file leaves the version as it is.
    """
    tree = _syntax_tree(fn)
    if tree is not None:
        material = ast.dump(tree).encode()
    else:
        code = getattr(inspect.unwrap(fn), "__code__", None)
        if isinstance(code, types.CodeType):
            material = _code_material(code)
        else:  # a callable object: nothing but its name says what it is
            name = getattr(fn, "__qualname__", type(fn).__qualname__)
            material = f"{fn.__module__}.{name}".encode()
    return hashlib.sha256(material).hexdigest()[:12]


def _syntax_tree(fn: Callable[..., Any]) -> _Function | None:
    """The function's definition as parsed from its source, decorators and docstrings
    removed; None without source or for a lambda (its lines hold more than itself)."""
    try:
        module = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = module.body[0] if module.body else None
    if not isinstance(node, _Function) or node.name != getattr(fn, "__name__", None):
        return None
    node.decorator_list = []
    for each in ast.walk(node):
        if isinstance(each, _Function | ast.ClassDef) and _is_docstring(each.body[0]):
            each.body = each.body[1:] or [ast.Pass()]
    return node


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _code_material(code: types.CodeType) -> bytes:
    """Without source (a REPL, a frozen app): the bytecode with the names and constants
    it uses, nested functions included, and no line numbers."""
    parts = [code.co_code, repr(code.co_names).encode(), repr(code.co_varnames).encode()]
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            parts.append(_code_material(constant))
        else:
            parts.append(repr(constant).encode())
    return b"\0".join(parts)


@dataclass(frozen=True)
class Workflow:
    """What ``@pikku.workflow(...)`` returns; call ``.start(...)`` to run it."""

    name: str
    fn: Callable[..., Any]
    version: str
    compatible: frozenset[str] = frozenset()
    #: The version was given (``version=``): a run of a version not in ``compatible``
    #: fails without a look at its steps. A version derived from the code is not
    #: pinned: such a run is replayed under watch (see ``workflows.versions``).
    pinned: bool = True
    starter: Callable[[Workflow, tuple[Any, ...], dict[str, Any], str | None], str] | None = field(
        default=None, repr=False, compare=False
    )

    def accepts(self, version: str | None) -> bool:
        """Whether a run started by ``version`` may be replayed by this code."""
        return version == self.version or version in self.compatible

    def start(
        self,
        *args: Any,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Start a run and return its id at once; a worker replays it step by step.

        ``run_id`` (or ``idempotency_key``, from which a run id is derived):
        a start with an id that a run of this workflow has already returns
        that run and starts nothing, even when several processes race. Both
        names are taken by ``start``, so they never reach the workflow.

        The arguments are held against the function's signature here, so a call
        the workflow could not take raises ``TypeError`` now, not at its replay.
        """
        if self.starter is None:
            raise RuntimeError("This workflow is not registered; use @pikku.workflow(...).")
        self._check_call(args, kwargs)
        if run_id is not None and idempotency_key is not None:
            raise ConfigurationError("Pass run_id or idempotency_key to start(), not both.")
        if idempotency_key is not None:
            run_id = self.run_id_for(idempotency_key)
        if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()):
            raise ConfigurationError(f"A run id is a non-empty str, not {run_id!r}.")
        return self.starter(self, args, kwargs, run_id)

    def _check_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            signature = inspect.signature(self.fn)
        except (TypeError, ValueError):  # no signature to hold the call against
            return
        try:
            signature.bind(None, *args, **kwargs)  # None stands for ctx
        except TypeError as exc:
            taken = [
                str(parameter.replace(annotation=inspect.Parameter.empty))
                for parameter in list(signature.parameters.values())[1:]
            ]
            raise TypeError(
                f"Workflow {self.name!r} cannot start with these arguments: {exc}. Pass "
                f"what it takes after ctx ({', '.join(taken) or 'nothing'}); run_id= and "
                "idempotency_key= are start()'s own."
            ) from None

    def run_id_for(self, idempotency_key: str) -> str:
        """The run id a start with this ``idempotency_key`` gets (the same in every process)."""
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise ConfigurationError(
                f"An idempotency key is a non-empty str, not {idempotency_key!r}."
            )
        return str(uuid.uuid5(_START_NAMESPACE, f"{self.name}:{idempotency_key}"))

    @property
    def graph(self) -> dict[str, Any]:
        """What is stored in ``workflow_versions`` for this version."""
        try:
            source = inspect.getsource(self.fn)
        except (OSError, TypeError):
            source = None
        return {"module": self.fn.__module__, "qualname": self.fn.__qualname__, "source": source}
