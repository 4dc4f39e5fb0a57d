"""Finding the user's ``PikkuCelery`` from ``--app module[:attribute]`` (``PIKKU_CELERY_APP``).

Commands that publish messages (resume, rerun, cancel) need the user's own
Celery app: its broker, its routes and its tasks. Like ``celery -A``, the
module is imported from the current folder.

A database URL given to the command as well (``--database-url`` or
``PIKKU_DATABASE_URL``) is the app's ``PIKKU_DATABASE_URL`` while it is imported, so
an app that takes its URL from the environment, as workers are usually configured,
acts on that database. An app that names another database itself is an error: the
command would act on one database while the app's workers write to the other.
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
from pikku_celery.store import (
    ENV_DATABASE_URL,
    require_existing_database,
    safe_url,
    same_database,
)

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


@contextmanager
def _environment_database(database_url: str | None) -> Iterator[None]:
    """``PIKKU_DATABASE_URL`` set to ``database_url`` while the app is imported, then as it was."""
    if database_url is None:
        yield
        return
    saved = os.environ.get(ENV_DATABASE_URL)
    os.environ[ENV_DATABASE_URL] = database_url
    try:
        yield
    finally:
        if saved is None:
            del os.environ[ENV_DATABASE_URL]
        else:
            os.environ[ENV_DATABASE_URL] = saved


def load_pikku(spec: str, database_url: str | None = None) -> PikkuCelery:
    """The ``PikkuCelery`` named by ``module:attribute``, or the first one in ``module``.

    ``database_url``: the database the command was given; the app is imported with it as
    ``PIKKU_DATABASE_URL``, and must end up on it (``ConfigurationError`` otherwise).
    """
    with _environment_database(database_url):
        pikku = _find_pikku(spec)
    app_url = pikku.store.engine.url
    if database_url is not None and not same_database(app_url, database_url):
        raise ConfigurationError(
            f"--app {spec!r} mirrors into {safe_url(app_url)}, but --database-url (or "
            f"{ENV_DATABASE_URL}) names {safe_url(database_url)}: the command would act on one "
            "database while the app's workers write to the other. Leave --database-url out to "
            "use the app's, or let the app take its URL from the environment (drop its "
            "database_url argument or app.conf.pikku_database_url)."
        )
    return pikku


def _find_pikku(spec: str) -> PikkuCelery:
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
def user_app(
    spec: str | None, command: str, database_url: str | None = None
) -> Iterator[PikkuCelery]:
    """The user's PikkuCelery for a command that talks to Celery, on ``database_url`` if
    given (see :func:`load_pikku`), which must exist; closed afterwards."""
    if not spec:
        raise ConfigurationError(
            f"`pikku-celery {command}` talks to your Celery workers, so it needs your app: "
            f"pass --app module:attribute (like proj.tasks:pikku) or set {ENV_APP}."
        )
    pikku = load_pikku(spec, database_url)
    try:
        # Acting on runs needs runs: never start an empty SQLite file at a mistyped path.
        require_existing_database(pikku.store.engine.url)
        yield pikku
    finally:
        pikku.store.close()
        pikku.app.close()  # the broker connections it opened
