"""The examples of the documentation: every Python block and shell command of the site's
pages (``docs/``) and of ``README.md``, read the way MkDocs reads them.

A page's text includes what its ``--8<-- "file[:section]"`` lines include (pymdownx.snippets,
as the site does). A block is run where it is written: one included from another page (the
README's first app, shown again by the getting-started page) is run with that page, and one
included from a file that is no page (the benchmarks' figures) is run with the page that
includes it.

What a block is to the runner is said by HTML comments right above its fence (they do not
show in the site):

- ``<!-- examples: not-run "reason" -->``: never run; the test reports it as skipped with the
  reason. Above an include line, it holds for every block the include brings.
- ``<!-- examples: run-by tests/.../test_x.py -->``: run by that test, which reads the block
  from this page itself (the test checks the file names the page).

Every other ``python``, ``sh`` and ``console`` block is run, in page order, as one session
(``tests/docs/driver.py``): a Python block whose first line is ``# name.py`` is written to
that file, any other is executed; a ``sh`` block is one command a line (``\\`` continues
one); a ``console`` block is ``$ command`` lines, each followed by the output the command must
print (``...`` matches anything within a line, a line of its own ``...`` any lines).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
# The languages the runner runs; blocks in others (text, sql, toml, ...) are not examples.
PYTHON = ("python", "py")
SHELL = ("sh", "bash", "shell")
CONSOLE = ("console",)
LANGUAGES = PYTHON + SHELL + CONSOLE

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<lang>[\w+-]*)")
_COMMENT = re.compile(r"^\s*<!--\s*(?P<body>.*?)\s*-->\s*$")
_INCLUDE = re.compile(r'^\s*--8<--\s+"(?P<file>[^":]+)(?::(?P<section>[\w-]+))?"\s*$')
_NOT_RUN = re.compile(r'^examples:\s*not-run\s+"(?P<reason>[^"]+)"$')
_RUN_BY = re.compile(r"^examples:\s*run-by\s+(?P<test>\S+)$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a runnable language, where it is written."""

    origin: Path  # the file the block is written in
    line: int  # the line of its opening fence, 1-based
    language: str
    code: str
    not_run: str | None = None  # the reason it is not run
    run_by: str | None = None  # the test that runs it

    @property
    def where(self) -> str:
        return f"{self.origin.relative_to(ROOT)}:{self.line}"

    @property
    def runs_here(self) -> bool:
        return self.not_run is None and self.run_by is None


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))


def pages() -> list[Page]:
    """README.md and every page of the site, each with the blocks it runs."""
    paths = [README, *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)]
    return [
        Page(path, list(_blocks(path, path.read_text(encoding="utf-8"), set(paths))))
        for path in paths
    ]


def _section(text: str, name: str, path: Path) -> tuple[str, int]:
    """The lines between a file's ``--8<-- [start:name]`` and ``[end:name]`` markers, and
    the line the section starts at."""
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if f"[start:{name}]" in line]
    ends = [i for i, line in enumerate(lines) if f"[end:{name}]" in line]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ValueError(f"{path}: no single section {name!r}")
    return "\n".join(lines[starts[0] + 1 : ends[0]]), starts[0] + 2


def _blocks(
    path: Path,
    text: str,
    page_files: set[Path],
    *,
    first_line: int = 1,
    inherited_not_run: str | None = None,
) -> list[Block]:
    found: list[Block] = []
    lines = text.split("\n")
    comments: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        comment = _COMMENT.match(line)
        if comment:
            comments.append(comment.group("body"))
            i += 1
            continue
        marks = _marks(comments, path, first_line + i)
        include = _INCLUDE.match(line)
        fence = _FENCE.match(line)
        if include:
            target = ROOT / include.group("file")
            if target.resolve() not in {p.resolve() for p in page_files}:
                body = target.read_text(encoding="utf-8")
                start = 1
                if include.group("section"):
                    body, start = _section(body, include.group("section"), target)
                found += _blocks(
                    target,
                    body,
                    page_files,
                    first_line=start,
                    inherited_not_run=marks[0] or inherited_not_run,
                )
        elif fence:
            close = re.compile(rf"^ *{re.escape(fence.group('fence'))}\s*$")
            end = i + 1
            while end < len(lines) and not close.match(lines[end]):
                end += 1
            language = fence.group("lang").lower()
            if language in LANGUAGES:
                indent = len(fence.group("indent"))
                code = "\n".join(body[indent:] for body in lines[i + 1 : end])
                found.append(
                    Block(
                        path,
                        first_line + i,
                        language,
                        code + "\n",
                        marks[0] or inherited_not_run,
                        marks[1],
                    )
                )
            i = end
        comments = []
        i += 1
    return found


def _marks(comments: list[str], path: Path, line: int) -> tuple[str | None, str | None]:
    not_run = run_by = None
    for body in comments:
        if not body.startswith("examples:"):
            continue
        if match := _NOT_RUN.match(body):
            not_run = match.group("reason")
        elif match := _RUN_BY.match(body):
            run_by = match.group("test")
        else:
            raise ValueError(f"{path}:{line}: an examples marker the runner does not know: {body}")
    return not_run, run_by


# Commands a page may show that are never run by the examples, and why: they run this very
# suite, or what CI runs around it.
NOT_RUN_COMMANDS = {
    "make test": "the whole test suite: the examples are part of it",
    "make test-quick": "the unit and integration suites, which CI runs as part of make test",
    "make test-docker": "the docker suite, which CI runs as part of make test",
    "make test-partitioned": "the integration suite on the partitioned layout, which CI runs "
    "after make test",
    "make check": "the linters and type checks, which CI runs before the suite",
}


@dataclass(frozen=True)
class Command:
    """One shell command of a block, and the output it must print (console blocks)."""

    text: str
    expected: list[str] | None = None

    @property
    def not_run(self) -> str | None:
        return NOT_RUN_COMMANDS.get(" ".join(self.words))

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text, comments=True)


def commands(block: Block) -> list[Command]:
    """A shell block's commands: one a line (``\\`` continues one), comments dropped by the
    shell; a console block's ``$`` lines, each with the lines below it as its output."""
    lines = block.code.rstrip("\n").split("\n")
    found: list[Command] = []
    i = 0
    while i < len(lines):
        text = lines[i]
        console = block.language in CONSOLE
        if console and not text.startswith("$ "):
            if not found:
                raise ValueError(f"{block.where}: output before any command")
            assert found[-1].expected is not None
            found[-1].expected.append(text)
            i += 1
            continue
        text = text[2:] if console else text
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        i += 1
        text = text.strip()
        if text and not text.startswith("#"):
            found.append(Command(text, [] if console else None))
    return found
