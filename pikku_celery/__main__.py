from __future__ import annotations

import sys

from pikku_celery.cli import main

sys.exit(main())
