"""The release files as a user gets them: the sdist and the wheel built from it, checked as
an index would check them, and the wheel installed alone in a fresh virtualenv, run from a
folder with no checkout on ``sys.path``."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pikku_celery"
# The checkout's own metadata (its editable install): the version pyproject.toml gives.
VERSION = metadata.version("pikku-celery")

pytestmark = pytest.mark.packaging


def _run(
    command: Sequence[str | Path], *, cwd: Path, env: dict[str, str] | None = None, timeout: float
) -> str:
    """The command's output; its output in the failure when it does not exit 0."""
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, command))} exited {done.returncode}:\n" + (done.stdout[-4000:])
    )
    return done.stdout


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path


@dataclass(frozen=True)
class Installed:
    bin: Path
    here: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    # `python -m build` makes the sdist, then the wheel from the sdist: so the sdist is
    # proved to build, and the wheel carries only what the sdist does.
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", out, ROOT], cwd=out, timeout=120)
    return Dist(
        wheel=out / f"pikku_celery-{VERSION}-py3-none-any.whl",
        sdist=out / f"pikku_celery-{VERSION}.tar.gz",
    )


@pytest.fixture(scope="module")
def installed(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("fresh")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=base, timeout=60)
    here = base / "elsewhere"
    here.mkdir()
    # Nothing of this checkout or of the test session leaks in: no PYTHONPATH, no virtualenv
    # of ours, no PIKKU_ settings. pip's own settings (index, cache) stay.
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"} and not key.startswith("PIKKU_")
    }
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["PIKKU_JOURNAL_DIR"] = str(base / "journal")
    _run(
        [venv / "bin" / "python", "-m", "pip", "install", "--quiet", dist.wheel],
        cwd=here,
        env=env,
        timeout=300,
    )
    return Installed(bin=venv / "bin", here=here, env=env)


def test_both_files_pass_the_index_checks(dist: Dist) -> None:
    output = _run(
        [sys.executable, "-m", "twine", "check", "--strict", dist.sdist, dist.wheel],
        cwd=dist.wheel.parent,
        timeout=60,
    )
    assert output.count("PASSED") == 2, output


def test_the_wheel_carries_every_file_of_the_package(dist: Dist) -> None:
    """Migrations, their template, the dashboard's templates and ``py.typed`` are not Python
    modules a build finds by import: each file of the package is looked for in the wheel."""
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"pikku_celery-{VERSION}.dist-info/METADATA").decode()
    source = {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert source - names == set()
    for needed in (
        "pikku_celery/py.typed",
        "pikku_celery/schema/migrations/env.py",
        "pikku_celery/schema/migrations/script.py.mako",
        "pikku_celery/schema/migrations/versions/0001_workflow_tables.py",
        "pikku_celery/dashboard/templates/base.html",
    ):
        assert needed in names
    # Only the package: no tests, benchmarks or checkout files installed beside it.
    assert {name.split("/")[0] for name in names} == {
        "pikku_celery",
        f"pikku_celery-{VERSION}.dist-info",
    }
    assert f"\nVersion: {VERSION}\n" in metadata
    assert "\nClassifier: Programming Language :: Python :: 3.11\n" in metadata
    assert "\nClassifier: Framework :: Celery\n" in metadata


def test_the_installed_wheel_runs_the_command_the_migrations_and_the_demo(
    installed: Installed,
) -> None:
    python, command = installed.bin / "python", installed.bin / "pikku-celery"

    def run(*args: str, timeout: float = 60) -> str:
        return _run([*args], cwd=installed.here, env=installed.env, timeout=timeout)

    where = run(str(python), "-c", "import pikku_celery, sys; print(pikku_celery.__file__)")
    assert Path(where.strip()).is_relative_to(installed.bin.parent)
    assert run(str(python), "-c", "import pikku_celery; print(pikku_celery.__version__)") == (
        f"{VERSION}\n"
    )
    assert run(str(command), "--version") == f"pikku-celery {VERSION}\n"
    # Celery finds `backend="pikku://"`, and pytest the inline runner's fixtures, by these
    # (only pytest loads its plugin: pytest is not a dependency).
    found = run(
        str(python),
        "-c",
        "from importlib.metadata import entry_points\n"
        "print(entry_points(group='celery.result_backends')['pikku'].load().__name__)\n"
        "print(entry_points(group='pytest11')['pikku_celery'].value)",
    )
    assert found.split() == ["PikkuBackend", "pikku_celery.testing.plugin"]

    database = f"sqlite:///{installed.here / 'x.db'}"
    # Every revision the checkout has, applied from the installed files.
    head = max(p.name for p in (PACKAGE / "schema" / "migrations" / "versions").glob("0*.py"))
    revision = head.split("_")[0]
    upgraded = run(str(command), "db", "upgrade", "--database-url", database)
    assert f"from empty to {revision}" in upgraded
    assert f"current: {revision}" in run(str(command), "db", "current", "--database-url", database)
    run(str(command), "db", "check", "--database-url", database)

    # The demo runs a real prefork worker on kombu's filesystem broker and a SQLite mirror.
    demo = run(
        str(command),
        "demo",
        "--database-url",
        f"sqlite:///{installed.here / 'demo.db'}",
        timeout=150,
    )
    assert "checkout" in demo
    assert "completed" in demo
