"""The Celery app behind ``pikku-celery demo``: an ordinary app, as a user would write it.

Configured from the environment by the demo command: ``PIKKU_DEMO_BROKER_URL``
(empty: kombu's filesystem broker in ``PIKKU_DEMO_FOLDER``) and
``PIKKU_DATABASE_URL`` for the mirror.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery
from kombu.transport import filesystem
from kombu.utils.json import dumps

from pikku_celery.app import PikkuCelery

__all__ = ["app", "charge", "pikku", "refund", "reserve", "ship"]

_folder = Path(os.environ.get("PIKKU_DEMO_FOLDER", ".pikku-demo"))
_broker = os.environ.get("PIKKU_DEMO_BROKER_URL") or "filesystem://"


class _Channel(filesystem.Channel):
    """kombu's filesystem channel, which makes its folders when the broker is first used
    and puts each message in place whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Here and not at import: importing the app (`--app pikku_celery.demo.app:pikku`)
        # must leave nothing behind in the current folder; publishing or consuming writes.
        for folder in (self.data_folder_in, self.data_folder_out, self.control_folder):
            Path(folder).mkdir(parents=True, exist_ok=True)

    # kombu's filesystem channel widens the base channel's _put (**kwargs): so does this.
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # kombu creates the message file, then locks and writes it: a worker that opens it
        # in between reads it empty and its consumer dies on the JSON. A file written
        # under a name the worker skips, then renamed, is whole when it is seen.
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        folder = Path(self.data_folder_out)
        partial = folder / f".{uuid.uuid4()}.partial"
        partial.write_bytes(dumps(payload).encode())
        os.replace(partial, folder / name)


class FolderMakingTransport(filesystem.Transport):
    Channel = _Channel


app = Celery("pikku_demo", broker=_broker)
if _broker.startswith("filesystem://"):
    messages = _folder / "messages"
    app.conf.broker_transport = f"{__name__}:FolderMakingTransport"
    app.conf.broker_transport_options = {
        "data_folder_in": str(messages),
        "data_folder_out": str(messages),
        # kombu's default is ./control: the demo would leave it in the user's folder.
        "control_folder": str(_folder / "control"),
        "store_processed": False,
        "polling_interval": 0.1,
    }
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("PIKKU_DEMO_QUEUE", "pikku-demo"),
    worker_hijack_root_logger=False,
)
pikku = PikkuCelery(app)
# The stuck-attempt reaper, sent by `celery beat` (the Procfile's and compose's beat process)
# besides the worker's own passes (app.conf.pikku_reaper_interval).
pikku.reap_every(float(os.environ.get("PIKKU_REAP_EVERY", "60")))
if _broker.startswith("filesystem://"):
    # The filesystem transport has no fanout exchange for task events.
    app.conf.worker_send_task_events = False
    app.conf.task_send_sent_event = False


@pikku.step(name="shop.reserve")
def reserve(order_id: int) -> dict[str, Any]:
    return {"order": order_id, "items": 3}


@pikku.step(name="shop.charge", bind=True, retries=3, retry_delay=0.2)
def charge(self: Any, order: dict[str, Any]) -> dict[str, Any]:
    if self.request.retries < 2:
        raise ConnectionError(f"payment gateway timed out (attempt {self.request.retries + 1})")
    return {**order, "charged": 42.0}


@pikku.step(name="shop.ship")
def ship(order: dict[str, Any]) -> str:
    return f"order {order['order']} shipped"


@pikku.step(name="shop.refund", retries=1, retry_delay=0.2)
def refund(order_id: int) -> None:
    raise ValueError(f"order {order_id} was never charged, nothing to refund")
