"""MkDocs hook: the command line reference, generated from the command's own parser.

A page that holds the line ``<!-- cli-reference -->`` gets, in its place, the ``--help`` of
``pikku-celery`` and of every command and action below it, in the order the parser lists
them, so the reference can never disagree with the command.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

MARKER = "<!-- cli-reference -->"
# The width the help is wrapped at, whatever terminal builds the site.
COLUMNS = "100"


def commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """The parser and every sub-command's parser, depth first, with its full name."""
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from commands(sub)


def reference() -> str:
    """The help of every command, as Markdown: one heading and one text block each."""
    from pikku_celery.cli.commands import build_parser

    # Defaults read from the environment must not leak the builder's settings into the page.
    saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith("PIKKU_")}
    saved_columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = COLUMNS
    try:
        parts = []
        for name, parser in commands(build_parser()):
            parts.append(f"### `{name}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
        return "\n".join(parts)
    finally:
        os.environ.update(saved)
        if saved_columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved_columns


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference())
