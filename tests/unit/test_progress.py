"""The progress of a long command: a bar redrawn in place on a terminal, lines elsewhere."""

from __future__ import annotations

import io

from pikku_celery.cli.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_one_bar_is_redrawn_then_ended_with_a_newline() -> None:
    screen = Terminal()
    with Progress(1200, "runs", stream=screen, width=10) as bar:
        bar.update(500)
        bar.update(1200)
    assert screen.getvalue() == (
        "\r[####......] 500/1200 runs  42%" + "\r[##########] 1200/1200 runs 100%" + "\n"
    )


def test_elsewhere_each_update_is_a_plain_line() -> None:
    log = io.StringIO()
    with Progress(1200, "runs", stream=log) as bar:
        bar.update(500)
        bar.update(1300)  # runs that settled meanwhile: never past 100 %
    assert log.getvalue().splitlines() == ["500/1200 runs (42%)", "1300/1300 runs (100%)"]


def test_nothing_to_do_draws_nothing() -> None:
    screen = Terminal()
    with Progress(0, "runs", stream=screen):
        pass
    assert screen.getvalue() == ""
