"""The command line reference (docs/operations/cli.md) is the parser's own help, put in the
page by the site's build hook (docs/hooks/cli_reference.py)."""

from __future__ import annotations

import re

from docs.hooks.cli_reference import MARKER, commands, on_page_markdown, reference
from pikku_celery.cli.commands import build_parser
from tests.docs.pages import DOCS


def test_the_reference_has_the_help_of_every_command_and_action() -> None:
    names = [name for name, _ in commands(build_parser())]
    assert {"pikku-celery", "pikku-celery db upgrade", "pikku-celery runs send"} <= set(names)
    text = reference()
    assert re.findall(r"^### `(.+)`$", text, flags=re.MULTILINE) == names
    for _, parser in commands(build_parser()):
        for action in parser._actions:
            for option in action.option_strings:
                assert option in text


def test_the_cli_page_holds_the_reference_where_the_hook_puts_it() -> None:
    page = (DOCS / "operations" / "cli.md").read_text(encoding="utf-8")
    assert page.count(MARKER) == 1
    built = on_page_markdown(page)
    assert MARKER not in built
    assert "### `pikku-celery prune`" in built and "--older-than" in built
    assert on_page_markdown("no marker here") == "no marker here"
