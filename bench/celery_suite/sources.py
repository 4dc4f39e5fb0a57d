"""What the suite needs that is not in the repository, fetched once into a cache folder.

- Celery's sdist (``pip download --no-deps --no-binary :all: celery==5.7.0``), of which
  only ``t/`` and ``pyproject.toml`` (the suite's pytest settings) are extracted: the Celery
  under test is the one installed in this virtualenv, which must be the same version.
- The suite's own test dependencies that pikku-celery's do not bring: pydantic (its
  ``tasks.py`` imports it) and pytest-timeout (a per-test limit, so one hung test does not
  take the whole mode), installed with ``pip install --target`` into ``site/``. That folder
  is appended to ``sys.path`` of the suite's process, after the virtualenv's packages.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Final

__all__ = ["CELERY_VERSION", "DEFAULT_CACHE", "SUITE_FILES", "Sources", "prepare"]

CELERY_VERSION: Final = "5.7.0"
#: The modules of Celery's integration suite this recipe runs.
SUITE_FILES: Final = (
    "t/integration/test_tasks.py",
    "t/integration/test_canvas.py",
    "t/integration/test_inspect.py",
)
DEFAULT_CACHE: Final = Path(tempfile.gettempdir()) / "pikku-celery-suite"
# Pinned, with --no-deps: exactly these land in site/ (typing_extensions and pytest are the
# virtualenv's own).
HELPERS: Final = (
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "pytest-timeout==2.4.0",
)


@dataclass(frozen=True)
class Sources:
    root: Path  # the extracted sdist: t/ and pyproject.toml; the suite's rootdir
    site: Path  # the helper packages


def _run(command: list[str]) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def _sdist(cache: Path) -> Path:
    archive = cache / f"celery-{CELERY_VERSION}.tar.gz"
    if not archive.exists():
        download = cache / "download"
        download.mkdir(parents=True, exist_ok=True)
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"celery=={CELERY_VERSION}",
                "-d",
                str(download),
            ]
        )
        (download / archive.name).replace(archive)
    return archive


def _extract(archive: Path, root: Path) -> None:
    prefix = f"celery-{CELERY_VERSION}/"
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(archive) as tar:
        members = [
            member
            for member in tar.getmembers()
            if member.name.startswith(prefix + "t/") or member.name == prefix + "pyproject.toml"
        ]
        for member in members:
            member.name = member.name[len(prefix) :]
        tar.extractall(partial, members=members, filter="data")
    partial.replace(root)


def prepare(cache: Path) -> Sources:
    """The cache made complete (idempotent: what is there is kept)."""
    installed = version("celery")
    if installed != CELERY_VERSION:
        raise SystemExit(
            f"This virtualenv has celery {installed}; the suite is that of {CELERY_VERSION}."
        )
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / f"celery-{CELERY_VERSION}"
    if not (root / "t" / "integration" / "conftest.py").exists():
        _extract(_sdist(cache), root)
    site = cache / "site"
    if not (site / "pytest_timeout.py").exists():
        partial = cache / "site.partial"
        shutil.rmtree(partial, ignore_errors=True)
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(partial),
                *HELPERS,
            ]
        )
        partial.replace(site)
    return Sources(root=root, site=site)
