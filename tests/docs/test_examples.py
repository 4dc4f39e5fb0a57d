"""Every example of the site and the README runs (``tests/docs/pages.py`` says how they are
marked). The pages that start no server run here; the others run in
``tests/acceptance/test_doc_examples.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import service_missing
from tests.docs.pages import PYTHON, ROOT, Block, Command, Page, commands, pages
from tests.docs.runner import BROKER_URL, run_page, starts_servers

PAGES = pages()
BLOCKS = [block for page in PAGES for block in page.blocks]


def _ids(blocks: list[Block]) -> list[str]:
    return [block.where for block in blocks]


def _redis() -> None:
    import redis

    try:
        redis.Redis.from_url(BROKER_URL).ping()
    except redis.ConnectionError as exc:
        service_missing("Redis", exc)


PLAIN = [p for p in PAGES if any(b.runs_here for b in p.blocks) and not starts_servers(p)]


@pytest.mark.parametrize("page", PLAIN, ids=[p.name for p in PLAIN])
def test_the_page_runs_as_written(
    page: Page, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    _redis()
    run_page(page, tmp_path, lambda: request.getfixturevalue("pg_server").create_database())


NOT_RUN = [block for block in BLOCKS if block.not_run]


@pytest.mark.parametrize("block", NOT_RUN, ids=_ids(NOT_RUN))
def test_a_block_marked_not_run(block: Block) -> None:
    pytest.skip(f"not run: {block.not_run}")


NOT_RUN_COMMANDS = [
    (block, command)
    for block in BLOCKS
    if block.runs_here and block.language not in PYTHON
    for command in commands(block)
    if command.not_run
]


@pytest.mark.parametrize(
    ("block", "command"),
    NOT_RUN_COMMANDS,
    ids=[f"{block.where}: {command.text}" for block, command in NOT_RUN_COMMANDS],
)
def test_a_command_never_run_by_the_examples(block: Block, command: Command) -> None:
    pytest.skip(f"not run: {command.not_run}")


RUN_BY = [block for block in BLOCKS if block.run_by]


@pytest.mark.parametrize("block", RUN_BY, ids=_ids(RUN_BY))
def test_a_block_run_by_another_test_is_read_from_its_page_there(block: Block) -> None:
    assert block.run_by is not None
    test = ROOT / block.run_by
    assert test.is_file(), f"{block.where} names {block.run_by}, which does not exist"
    assert str(block.origin.relative_to(ROOT)) in test.read_text(encoding="utf-8"), (
        f"{block.run_by} does not read {block.origin.relative_to(ROOT)}"
    )


def test_every_page_of_the_site_is_read_and_blocks_are_found() -> None:
    names = {page.name for page in PAGES}
    assert {"README.md", "docs/getting-started.md", "docs/celery/index.md"} <= names
    # The README's first app: its file and its commands.
    readme = next(page for page in PAGES if page.name == "README.md")
    assert [b.language for b in readme.blocks][:3] == ["sh", "python", "sh"]
