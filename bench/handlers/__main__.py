"""CPU of the mirror's task signal handlers per lone no-op task, in a pool process.

A prefork worker's pool process runs a task through Celery's tracer, which sends
``task_prerun``, ``task_success`` and ``task_postrun``; the mirror's handlers
build the task's events and append them to the process's journal (the node's
main process writes it). This bench does the same without a broker: a process
that serves its node (as a worker's main process does) forks a child, which
traces ``--tasks`` lone no-op tasks from messages as a publisher makes them
(Celery's own ``build_tracer``, the request a worker builds), and times each
signal's receivers in that thread (``time.thread_time``, see
``bench.harness.handler_cpu``). Afterwards the parent writes the child's journal
and checks SQL holds every step succeeded.

Figures, median of the rounds: µs of CPU per task in the signals' sends (each
signal and their sum, the clock's own cost of each send, measured, taken off) and in
the whole trace (not timed per send), for three sides: an app without
pikku and pikku's handlers disconnected (Celery's own cost of a send, and the
clock's), the same app with them connected (what they cost a task they leave
alone), and the mirrored app.
``--backend``: ``backend="pikku://"`` with ``task_track_started`` and
``result_extended`` (the result is journaled in the handlers too); ``--profile FILE``:
cProfile (by CPU time) of the child's tasks.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery, signals
from celery.app.trace import build_tracer

from bench.harness.handler_cpu import SignalClock
from pikku_celery import PikkuCelery

SENDS = ("send_prerun", "send_success", "send_postrun")
NOOP = "hbench.noop"


def build(database_url: str | None, journal_dir: Path, *, backend: bool) -> tuple[Celery, Any]:
    app = Celery("hbench", broker="memory://", backend="pikku://" if backend else None)
    app.conf.update(task_track_started=backend, result_extended=backend)
    pikku = None
    if database_url is not None:
        pikku = PikkuCelery(app, database_url=database_url, journal_dir=str(journal_dir))
    task: Callable[..., Callable[[Callable[..., Any]], Any]] = (
        pikku.step if pikku is not None else app.task
    )

    @task(name=NOOP, shared=False)
    def noop(index: int) -> None:
        return None

    return app, pikku


def request_of(app: Celery, index: int) -> tuple[str, dict[str, Any]]:
    """A lone task's request as a worker's pool process gets it (message protocol 2)."""
    task_id = str(uuid.uuid4())
    message = app.amqp.as_task_v2(task_id, NOOP, (index,), {})
    request = dict(message.headers)
    # What the publisher's handler adds to a mirrored task's headers.
    request.update(pikku_run_id=task_id, pikku_step="noop", pikku_sent_at=time.time())
    request.update(
        delivery_info={
            "exchange": "",
            "routing_key": "celery",
            "priority": 0,
            "redelivered": False,
        },
        hostname="hbench@host",
        is_eager=False,
        args=(index,),
        kwargs={},
    )
    return task_id, request


def trace_tasks(app: Celery, count: int, profile: cProfile.Profile | None) -> dict[str, float]:
    """Trace ``count`` tasks; µs of CPU per task, by signal, in all and for the trace."""
    clock = SignalClock(SENDS, receivers="pikku_celery.")
    with clock.timing():
        tracer = build_tracer(NOOP, app.tasks[NOOP], app=app, hostname="hbench@host")
        requests = [request_of(app, i) for i in range(count)]
        if profile is not None:
            profile.enable()
        start = time.thread_time()
        for task_id, request in requests:
            tracer(task_id, request["args"], request["kwargs"], request)
        trace = time.thread_time() - start
        if profile is not None:
            profile.disable()
    sends, receivers = clock.net(clock.bias())
    figures = {name: seconds / count * 1e6 for name, seconds in sends.items()}
    figures["handlers"] = sum(sends.values()) / count * 1e6
    # pikku-celery's receivers alone: the sends less Celery's dispatch.
    figures["receivers"] = sum(receivers.values()) / count * 1e6
    figures["trace"] = trace / count * 1e6
    return figures


def _disconnect_pikku() -> None:
    """This process's task signals without pikku-celery's receivers (they are connected
    process-wide once any app installs it): Celery's own cost of sending them."""
    for name in SENDS:
        signal = getattr(signals, "task_" + name.removeprefix("send_"))
        signal.disconnect(dispatch_uid=f"pikku_celery.task_{name.removeprefix('send_')}")


def in_child(
    app: Celery, count: int, rounds: int, profile_to: Path | None, *, bare: bool = False
) -> list[dict[str, float]]:
    """Run the rounds in a forked child (a pool process of this node); its figures.
    ``bare``: with pikku-celery's handlers disconnected in the child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 1
        try:
            if bare:
                _disconnect_pikku()
            profile = cProfile.Profile(time.thread_time) if profile_to else None
            trace_tasks(app, min(count, 200), None)  # warm-up: imports, caches, the journal
            figures = [trace_tasks(app, count, profile) for _ in range(rounds)]
            if profile is not None and profile_to is not None:
                profile.dump_stats(profile_to)
            os.write(write, json.dumps(figures).encode())
            code = 0
        finally:
            os.close(write)
            os._exit(code)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        raise SystemExit(f"the pool process failed (status {status})")
    measured: list[dict[str, float]] = json.loads(data)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.handlers", description=__doc__)
    parser.add_argument("--tasks", type=int, default=5000, help="tasks per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1,000 tasks, 3 rounds")
    parser.add_argument("--backend", action="store_true", help='backend="pikku://" too')
    parser.add_argument("--profile", type=Path, help="cProfile stats of the child's tasks")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.rounds = 1000, 3
    with tempfile.TemporaryDirectory(prefix="pikku-handlers-") as scratch:
        url = f"sqlite:///{scratch}/bench.db"
        plain, _ = build(None, Path(scratch), backend=False)
        app, pikku = build(url, Path(scratch) / "journal", backend=args.backend)
        assert pikku is not None
        pikku.mirror.store.init()
        pikku.mirror.serve_node()  # a worker's main process, before it forks its pool
        sides = {
            "plain Celery": in_child(plain, args.tasks, args.rounds, None, bare=True),
            "plain, pikku's": in_child(plain, args.tasks, args.rounds, None),
            "pikku": in_child(app, args.tasks, args.rounds, args.profile),
        }
        pikku.mirror.flush()  # the node writes the pool process's journal
        expected = args.tasks * args.rounds + min(args.tasks, 200)
        with pikku.mirror.store.engine.connect() as connection:
            from sqlalchemy import text

            done = connection.execute(
                text("SELECT count(*) FROM workflow_step WHERE status = 'succeeded'")
            ).scalar_one()
        pikku.mirror.close()
    names = [*(SignalClock.label(s) for s in SENDS), "handlers", "receivers", "trace"]
    print(f"{'µs CPU per task':<16}" + "".join(f"{n:>14}" for n in names))
    for side, rounds in sides.items():
        medians = [statistics.median(r[n] for r in rounds) for n in names]
        print(f"{side:<16}" + "".join(f"{m:>14.1f}" for m in medians))
    print(f"steps succeeded in SQL: {done} of {expected}")
    if args.profile:
        pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(35)
    if done != expected:
        raise SystemExit("the mirror did not record every task")


if __name__ == "__main__":
    main()
