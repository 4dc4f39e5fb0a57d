"""The examples runner itself: how it reads pages and checks output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.docs.driver import matches, server_kind
from tests.docs.pages import ROOT, Block, _blocks, commands


def test_ellipsis_matches_within_a_line_and_whole_lines() -> None:
    printed = "run  abc  completed\nsteps\nstep  status\nadd   succeeded\n"
    assert matches(["run  ...  completed", "...", "add   succeeded"], printed)
    assert matches(["...", "step  status", "..."], printed)
    assert not matches(["run  ...  failed", "..."], printed)
    assert not matches(["run  abc  completed"], printed)  # the lines after it are not there


def test_console_commands_carry_their_output_and_shell_lines_their_continuations() -> None:
    console = Block(ROOT / "x.md", 1, "console", "$ echo a \\\n  b\na b\n$ true\n")
    assert [(c.text, c.expected) for c in commands(console)] == [
        ("echo a  b", ["a b"]),
        ("true", []),
    ]
    shell = Block(
        ROOT / "x.md", 1, "sh", "# a comment\nmake demo   # why\ncelery -A x \\\n worker\n"
    )
    assert [c.text for c in commands(shell)] == ["make demo   # why", "celery -A x  worker"]
    assert commands(shell)[0].words == ["make", "demo"]


def test_servers_are_told_from_commands() -> None:
    assert server_kind(["celery", "-A", "shop", "worker", "--loglevel=info"]) == "worker"
    assert server_kind(["celery", "-A", "proj.tasks", "flower"]) == "flower"
    assert server_kind(["pikku-celery", "--app", "p:pikku", "dashboard"]) == "dashboard"
    assert server_kind(["pikku-celery", "runs", "list"]) is None


def test_markers_say_what_is_not_run_and_hold_for_what_an_include_brings(tmp_path: Path) -> None:
    included = tmp_path / "bench.md"
    included.write_text("```sh\npython -m bench\n```\n", encoding="utf-8")
    page = tmp_path / "page.md"
    text = (
        '<!-- examples: not-run "too long" -->\n'
        f'--8<-- "{os.path.relpath(included, ROOT)}"\n'
        "<!-- examples: run-by tests/x.py -->\n```python\nprint(1)\n```\n"
        "```python\nprint(2)\n```\n```text\nnot an example\n```\n"
    )
    blocks = _blocks(page, text, {page})
    assert [(b.origin.resolve(), b.not_run, b.run_by, b.runs_here) for b in blocks] == [
        (included, "too long", None, False),
        (page, None, "tests/x.py", False),
        (page, None, None, True),
    ]


def test_an_unknown_marker_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not know"):
        _blocks(tmp_path / "x.md", "<!-- examples: skip -->\n```python\npass\n```\n", set())
