"""The deployment files (docker/, Procfile, .env.example) and the tools that check them."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML has no types; its stubs are types-PyYAML

from tests.conftest import REQUIRE_SERVICES

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "docker-compose.yml"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """A command-line tool of the test extra: beside this Python, else on PATH."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    if found is None:
        message = f"{name} is not installed; run `pip install -e '.[test]'`"
        if REQUIRE_SERVICES:
            pytest.fail(message)
        pytest.skip(message)
    return str(found)


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return document


def procfile() -> dict[str, list[str]]:
    """Each process type of the Procfile and its command, split as a shell would."""
    processes: dict[str, list[str]] = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, command = line.partition(":")
            words = shlex.split(command)
            # `exec` only replaces the runner's shell with the process; the command is the rest.
            processes[name.strip()] = words[1:] if words[:1] == ["exec"] else words
    return processes


def env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values
