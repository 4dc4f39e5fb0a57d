"""An app whose workflows are edited between two deploys, for real workers.

``EVOLVING_VARIANT`` picks the code a worker runs: ``original`` (the default) or
``edited``, where ``restyled`` changed only in comments, docstring and layout,
``extended`` changed only after its sleep, and ``reordered`` swapped its first two
steps. Configured like the shop (``SHOP_BROKER_URL``, ``SHOP_BACKEND_URL``,
``SHOP_DATABASE_URL``, ``SHOP_QUEUE``), so the shop's worker harness runs it.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from pikku_celery import PikkuCelery

app = Celery(
    "evolving",
    broker=os.environ.get("SHOP_BROKER_URL", "redis://127.0.0.1:6379/15"),
    backend=os.environ.get("SHOP_BACKEND_URL") or None,
)
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_default_queue=os.environ.get("SHOP_QUEUE", "celery"),
    pikku_flush_interval=0.04,
)
pikku = PikkuCelery(app, database_url=os.environ.get("SHOP_DATABASE_URL"))

VARIANT = os.environ.get("EVOLVING_VARIANT", "original")


@pikku.step(name="evolving.add")
def add(x: int, y: int) -> int:
    return x + y


if VARIANT == "original":

    @pikku.workflow("evolving-restyled")
    def restyled(ctx: Any, n: int, seconds: float) -> list[int]:
        first = ctx.do("first", add, n, 1)
        ctx.sleep("nap", seconds=seconds)
        return [first, ctx.do("last", add, first, 1)]

    @pikku.workflow("evolving-extended")
    def extended(ctx: Any, n: int, seconds: float) -> list[int]:
        first = ctx.do("first", add, n, 1)
        ctx.sleep("nap", seconds=seconds)
        return [first, ctx.do("last", add, first, 1)]

    @pikku.workflow("evolving-reordered")
    def reordered(ctx: Any, n: int, seconds: float) -> list[int]:
        first = ctx.do("first", add, n, 1)
        second = ctx.do("second", add, n, 2)
        ctx.sleep("nap", seconds=seconds)
        return [first, second, ctx.do("last", add, second, 1)]

else:

    @pikku.workflow(
        "evolving-restyled",
    )
    def restyled(ctx: Any, n: int, seconds: float) -> list[int]:
        """The same steps as before; only how the source reads has changed."""
        first = ctx.do(
            "first",  # laid out otherwise, and commented
            add,
            n,
            1,
        )
        ctx.sleep("nap", seconds=seconds)

        return [first, ctx.do("last", add, first, 1)]

    @pikku.workflow("evolving-extended")
    def extended(ctx: Any, n: int, seconds: float) -> list[int]:
        first = ctx.do("first", add, n, 1)
        ctx.sleep("nap", seconds=seconds)
        label = ctx.do("label", add, first, 100)  # new, after what any run has recorded
        return [first, label, ctx.do("last", add, label, 1)]

    @pikku.workflow("evolving-reordered")
    def reordered(ctx: Any, n: int, seconds: float) -> list[int]:
        second = ctx.do("second", add, n, 2)
        first = ctx.do("first", add, n, 1)
        ctx.sleep("nap", seconds=seconds)
        return [first, second, ctx.do("last", add, second, 1)]
