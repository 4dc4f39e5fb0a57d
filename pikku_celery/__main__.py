"""``python -m pikku_celery``: the ``pikku-celery`` command."""

from __future__ import annotations

import sys

from pikku_celery.cli import main

__all__: list[str] = []

sys.exit(main())
