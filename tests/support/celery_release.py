"""What Celery itself does from one release on.

A test of such a behaviour is skipped, saying why, on an older Celery that pyproject.toml
allows (the lowest-versions session, docs/versions.md): there the package does what that
Celery does with its own result backends.
"""

from __future__ import annotations

from importlib import metadata
from typing import Final

import pytest
from packaging.version import Version

__all__ = ["CELERY", "since_celery"]

CELERY: Final = Version(metadata.version("celery"))


def since_celery(release: str, older: str) -> pytest.MarkDecorator:
    """Skips the test on a Celery before ``release``; ``older`` says what that Celery does."""
    return pytest.mark.skipif(
        CELERY < Version(release), reason=f"Celery {CELERY} is before {release}: {older}"
    )
