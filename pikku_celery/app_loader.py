"""Finding the user's ``PikkuCelery`` from ``--app module[:attribute]`` (``PIKKU_CELERY_APP``).

Commands that publish messages (resume, rerun, cancel) need the user's own
Celery app: its broker, its routes and its tasks. Like ``celery -A``, the
module is imported from the current folder.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from pikku_celery.app import PikkuCelery
from pikku_celery.errors import ConfigurationError

__all__ = ["ENV_APP", "load_pikku", "user_app"]

ENV_APP: Final = "PIKKU_CELERY_APP"


def _import(spec: str, module_name: str) -> object:
    # A console script's sys.path lacks the current folder; `celery -A` and
    # `python -m` both have it, so the same --app works the same way here.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"--app {spec!r}: cannot import {module_name!r}; run from the folder that "
            "holds it, or add that folder to PYTHONPATH."
        ) from exc
    except Exception as exc:  # the user's module failed while it was being imported
        raise ConfigurationError(
            f"--app {spec!r}: importing {module_name!r} failed; fix the error it raised."
        ) from exc


def load_pikku(spec: str) -> PikkuCelery:
    """The ``PikkuCelery`` named by ``module:attribute``, or the first one in ``module``."""
    module_name, _, attribute = spec.strip().partition(":")
    if not module_name:
        raise ConfigurationError(
            f"--app {spec!r} names no module; use module or module:attribute, "
            "like proj.tasks:pikku."
        )
    found: object = _import(spec, module_name)
    if attribute:
        for part in attribute.split("."):
            try:
                found = getattr(found, part)
            except AttributeError:
                raise ConfigurationError(
                    f"--app {spec!r}: {module_name!r} has no attribute {attribute!r}."
                ) from None
        if not isinstance(found, PikkuCelery):
            raise ConfigurationError(
                f"--app {spec!r} is a {type(found).__name__}, not a PikkuCelery; name the "
                f"PikkuCelery(app) instance, like {module_name}:pikku."
            )
        return found
    for value in vars(found).values():
        if isinstance(value, PikkuCelery):
            return value
    raise ConfigurationError(
        f"--app {spec!r}: module {module_name!r} has no PikkuCelery instance; create one "
        "there (pikku = PikkuCelery(app)) or name it, like module:pikku."
    )


@contextmanager
def user_app(spec: str | None, command: str) -> Iterator[PikkuCelery]:
    """The user's PikkuCelery for a command that talks to Celery; closed afterwards."""
    if not spec:
        raise ConfigurationError(
            f"`pikku-celery {command}` talks to your Celery workers, so it needs your app: "
            f"pass --app module:attribute (like proj.tasks:pikku) or set {ENV_APP}."
        )
    pikku = load_pikku(spec)
    try:
        yield pikku
    finally:
        pikku.store.close()
        pikku.app.close()  # the broker connections it opened
