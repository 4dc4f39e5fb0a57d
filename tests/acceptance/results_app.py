"""An app whose result backend is the pikku-celery store: ``backend="pikku://"``.

Configured from the environment: ``RESULTS_BROKER_URL``, ``RESULTS_DATABASE_URL``,
``RESULTS_QUEUE``, ``RESULTS_SERIALIZER`` / ``RESULTS_COMPRESSION`` (Celery's
``result_serializer`` and ``result_compression``; json and none by default), and
``RESULTS_MIRROR`` (``PikkuCelery``'s ``mirror``: decorated steps by default). Its tasks
cover what ``AsyncResult`` reads: a value, an exception, retries, a started task, a
custom state, an ignored result, a value only pickle carries.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery, group
from celery.exceptions import Reject

from pikku_celery import PikkuCelery

app = Celery(
    "results",
    broker=os.environ.get("RESULTS_BROKER_URL", "redis://127.0.0.1:6379/12"),
    backend="pikku://",
)
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
    task_default_queue=os.environ.get("RESULTS_QUEUE", "celery"),
    task_track_started=True,
    result_extended=True,
    pikku_flush_interval=0.02,
    pikku_chord_resend_after=float(os.environ.get("RESULTS_CHORD_RESEND_AFTER") or 30),
)
SERIALIZER = os.environ.get("RESULTS_SERIALIZER", "json")
app.conf.update(
    result_serializer=SERIALIZER,
    # Messages stay json (a worker accepting pickled messages refuses to run as root);
    # only results are read in the serializer under test.
    result_accept_content=sorted({"json", SERIALIZER}),
    result_compression=os.environ.get("RESULTS_COMPRESSION") or None,
)

pikku = PikkuCelery(
    app,
    database_url=os.environ.get("RESULTS_DATABASE_URL"),
    mirror=os.environ.get("RESULTS_MIRROR") or None,
)


@pikku.step(name="results.add", shared=False)
def add(x: int, y: int) -> int:
    return x + y


@app.task(bind=True, name="results.grow", shared=False)
def grow(self: Any, n: int) -> int:
    """A header task that adds a task to its own chord (``Task.add_to_chord``)."""
    self.add_to_chord(add.s(n, n))
    return n


@app.task(name="results.plain_add", shared=False)
def plain_add(x: int, y: int) -> int:
    return x + y


class OutOfStock(Exception):
    pass


@pikku.step(name="results.huge", shared=False)
def huge(megabytes: int) -> str:
    """A value over the store's payload limit (16 MiB by default)."""
    return "x" * (megabytes * 1024 * 1024)


@pikku.step(name="results.refuse", shared=False)
def refuse(item: str) -> None:
    raise KeyError(f"no {item}")


@app.task(bind=True, name="results.flaky", shared=False, max_retries=3)
def flaky(self: Any, fails: int) -> str:
    if self.request.retries < fails:
        raise self.retry(exc=ConnectionError("busy"), countdown=0)
    return f"done after {self.request.retries}"


@app.task(bind=True, name="results.progress", shared=False)
def progress(self: Any, seconds: float) -> str:
    self.update_state(state="PROGRESS", meta={"done": 1, "of": 2})
    time.sleep(seconds)
    return "finished"


@app.task(name="results.nap", shared=False)
def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"


@app.task(name="results.quiet", shared=False, ignore_result=True)
def quiet() -> str:
    return "nobody asked"


@app.task(name="results.unusual", shared=False)
def unusual() -> object:
    """A value only pickle carries (a frozenset of tuples), and bytes only some do."""
    return frozenset({(1, "one"), (2, "two")})


@app.task(name="results.total", shared=False)
def total(values: list[int]) -> int:
    return sum(values)


@app.task(name="results.failed_part", shared=False)
def failed_part(task_id: str) -> str:
    """An old-style errback: Celery publishes it with the failed task's id."""
    return f"noted {task_id}"


@pikku.step(name="results.sum_step", shared=False)
def sum_step(values: list[int]) -> int:
    return sum(values)


@app.task(name="results.identity", shared=False)
def identity(value: Any) -> Any:
    return value


@app.task(bind=True, name="results.ids", shared=False)
def ids(self: Any, previous: Any = None) -> dict[str, Any]:
    """Who sent this task (``root_id``, ``parent_id``), and what it was given."""
    return {"root": self.request.root_id, "parent": self.request.parent_id, "given": previous}


@app.task(name="results.chord_of_ids", shared=False)
def chord_of_ids() -> str:
    """A task that sends a chord: the id of the chord's body."""
    from celery import chord

    return str(chord([ids.si(), ids.si()], ids.s()).apply_async().id)


@app.task(bind=True, name="results.grow_by_chord", shared=False)
def grow_by_chord(self: Any, numbers: list[int], value: int) -> int:
    """A header task that adds a chord to its own chord: the inner body is the part."""
    from celery import group

    self.add_to_chord(group(plain_add.s(n, value) for n in numbers) | total.s())
    return 0


@app.task(name="results.fail", shared=False)
def fail() -> None:
    raise ValueError("a header task fails")


@app.task(name="results.echo", shared=False)
def echo(message: str) -> str:
    return message


@pikku.step(name="results.add_to_all", bind=True, shared=False)
def add_to_all(self: Any, nums: list[int], val: int) -> None:
    """``Task.replace`` with a group: Celery makes it a chord whose ``celery.accumulate``
    body takes over this task's id, and this backend sends that body itself."""
    raise self.replace(group(add.s(n, val) for n in nums))


@app.task(name="results.reject", shared=False)
def reject() -> None:
    """Rejects its message for good: Celery's main process stores the FAILURE."""
    raise Reject("not for this queue", requeue=False)
