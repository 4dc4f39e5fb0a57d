"""The versions pyproject.toml allows, tested: the lowest set and the newest (docs/versions.md).

Each session installs the package with its `test` extra into a fresh virtualenv and runs the
unit and integration suites, then a slice of the acceptance suite whose tests start real
`celery worker` processes: retries, canvases and a SIGKILLed pool child, the result backend,
chords and durable workflows. Arguments after `--` replace both pytest runs with one of
their own: `nox -s lowest -- tests/unit -x`.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lowest", "newest"]

PYTHON = "3.11"
CONSTRAINTS = Path(__file__).parent / "constraints" / "lowest.txt"
# uv installs the test extra in seconds; pip (virtualenv) where uv is not installed.
BACKEND = "uv|virtualenv"
SUITES = ["tests/unit", "tests/integration"]
# On PostgreSQL and Redis only, within CI's time: the other databases and brokers, and the
# chord tests that start workers of their own for the reaper's recovery paths, run in
# `make test` on the newest set.
LEFT_OUT = ["sqlite", "rabbitmq", "reaper", "counts_by_its_body"]
WORKER_SLICE = [
    "tests/acceptance/test_celery_worker.py",
    "tests/acceptance/test_result_backend.py",
    "tests/acceptance/test_result_chords.py",
    "tests/acceptance/test_workflows.py",
    "-k",
    " and ".join(f"not {word}" for word in LEFT_OUT),
]
XDIST = ["-n", "2", "--dist", "loadfile"]
# Every package the lowest set names, printed with its version before the tests of either
# session, so that its log says which versions it ran.
NAMED = [
    line.split("==")[0]
    for line in (raw.split("#")[0].strip() for raw in CONSTRAINTS.read_text().splitlines())
    if line
]


def _run_tests(session: nox.Session) -> None:
    session.run(
        "python",
        "-c",
        "import importlib.metadata as m, sys; "
        "print(' '.join(f'{name}=={m.version(name)}' for name in sys.argv[1:]))",
        *NAMED,
    )
    if session.posargs:
        session.run("python", "-m", "pytest", *session.posargs)
        return
    # In two processes, as `make test` runs (tests/conftest.py keeps them apart).
    session.run("python", "-m", "pytest", "-q", *XDIST, *SUITES)
    session.run("python", "-m", "pytest", "-q", *XDIST, *WORKER_SLICE)


@nox.session(python=PYTHON, venv_backend=BACKEND)
def lowest(session: nox.Session) -> None:
    """The floors of pyproject.toml's dependencies, named in constraints/lowest.txt."""
    session.install("-c", str(CONSTRAINTS), "-e", ".[test]")
    _run_tests(session)


@nox.session(python=PYTHON, venv_backend=BACKEND)
def newest(session: nox.Session) -> None:
    """The newest release of every dependency."""
    session.install("--upgrade", "-e", ".[test]")
    _run_tests(session)
