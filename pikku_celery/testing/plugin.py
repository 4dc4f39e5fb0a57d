"""The pytest plugin (registered as ``pikku_celery``): the ``pikku_inline`` fixture.

Tell it your app by overriding ``pikku_app`` (in a ``conftest.py`` or a test module)::

    @pytest.fixture
    def pikku_app():
        return shop.pikku

    def test_checkout(pikku_inline):
        run = pikku_inline.start(shop.checkout, order_id=1)
        assert run.status == "completed"

Each test gets a runner of its own, on a new SQLite file in its ``tmp_path``, with
a clock of its own that stands still: ``pikku_inline.advance(seconds)`` moves it, or
set ``pikku_inline.fast_forward = True`` for every ETA to pass at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pikku_celery.app import PikkuCelery
    from pikku_celery.testing.runner import InlineRunner

__all__ = ["pikku_app", "pikku_inline"]


@pytest.fixture
def pikku_app() -> PikkuCelery:
    """Your ``PikkuCelery``: override this fixture to return it."""
    pytest.fail(
        "The pikku_inline fixture needs your PikkuCelery: define a fixture named pikku_app "
        "in your conftest.py that returns it (`return myapp.pikku`).",
        pytrace=False,
    )


@pytest.fixture
def pikku_inline(pikku_app: PikkuCelery, tmp_path: Path) -> Iterator[InlineRunner]:
    """An open :class:`~pikku_celery.testing.InlineRunner` for ``pikku_app``."""
    # Imported here: pytest loads the plugin in every session, which need not pay for Celery.
    from pikku_celery.testing.runner import InlineRunner

    folder = tmp_path / "pikku"
    folder.mkdir()
    with InlineRunner(
        pikku_app,
        database_url=f"sqlite:///{folder / 'pikku.db'}",
        journal_dir=folder / "journal",
    ) as runner:
        yield runner
