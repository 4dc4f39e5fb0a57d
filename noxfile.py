"""The versions pyproject.toml allows, tested: the lowest set and the newest (docs/versions.md).

Each session installs the package with its `test` extra into a fresh virtualenv and runs the
unit and integration suites, then a slice of the acceptance suite whose tests start real
`celery worker` processes: steps and retries, canvases, the result backend, chords and
durable workflows. Arguments after `--` replace the test paths (`nox -s lowest -- tests/unit`).
"""

from __future__ import annotations

import nox

nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lowest", "newest"]

PYTHON = "3.11"
SUITES = ["tests/unit", "tests/integration"]
WORKER_SLICE = [
    "tests/acceptance/test_celery_worker.py",
    "tests/acceptance/test_result_backend.py",
    "tests/acceptance/test_result_chords.py",
    "tests/acceptance/test_workflows.py",
]
# Printed before the tests, so that a session's log says which versions it ran.
NAMED = ["celery", "kombu", "billiard", "vine", "redis", "sqlalchemy", "psycopg", "alembic"]


def _run_tests(session: nox.Session) -> None:
    session.run(
        "python",
        "-c",
        "import importlib.metadata as m, sys; "
        "print(' '.join(f'{name}=={m.version(name)}' for name in sys.argv[1:]))",
        *NAMED,
    )
    session.run("python", "-m", "pytest", "-q", *(session.posargs or [*SUITES, *WORKER_SLICE]))


@nox.session(python=PYTHON)
def lowest(session: nox.Session) -> None:
    """The floors of pyproject.toml's dependencies, named in constraints/lowest.txt."""
    session.install("-c", "constraints/lowest.txt", "-e", ".[test]")
    _run_tests(session)


@nox.session(python=PYTHON)
def newest(session: nox.Session) -> None:
    """The newest release of every dependency."""
    session.install("--upgrade", "-e", ".[test]")
    _run_tests(session)
