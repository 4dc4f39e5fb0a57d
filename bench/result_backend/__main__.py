"""pikku's result backend (``backend="pikku://"``) against Celery's own and django-celery-results.

Run from the project root::

    python -m bench.result_backend            # best of 2 rounds
    python -m bench.result_backend --quick    # one round, smaller counts

Backends, each with ``task_track_started`` and ``result_extended``, on a real
``celery worker -P prefork -c 2`` with a Redis broker (``bench.result_backend.app``):
Celery's Redis backend, Celery's SQLAlchemy backend (``db+postgresql://``),
pikku (``@pikku.step`` tasks, so each is a mirrored step too) and
django-celery-results (``django-db``, Django configured in code). Measures,
the backends taking turns in an order that changes each round:

1. drain: N no-op tasks published one ``apply_async`` each by the client
   process, until the backend says every result is ready (for pikku also
   until SQL shows every step succeeded); tasks/s and CPU ms per task by
   process from ``/proc``;
2. ``get()`` latency: ``add.delay(i, i).get()`` K times in a row on an idle
   worker; p50, p90, p99;
3. a chord of ``add`` headers and a ``total`` body, ``apply_async()`` to the
   body's value (Celery's SQLAlchemy backend has no native chords: its body
   waits on ``celery.chord_unlock``, a task retried every second);
4. expiry: ``backend.cleanup()`` (what ``celery.backend_cleanup`` calls)
   removing expired results loaded straight into the backend's table.

The bench creates and drops its own databases on the PostgreSQL server and
flushes its Redis database before each run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bench.harness.broker import DEFAULT_REDIS_URL
from bench.harness.options import comma_list, parser
from bench.harness.session import Session
from bench.result_backend.app import BACKENDS, BY_KEY, DATABASES
from bench.result_backend.report import (
    report_chord,
    report_drain,
    report_expiry,
    report_latency,
    report_ratios,
)
from bench.result_backend.runs import Bench, Settings, measure

FULL = {"drain": 2000, "latency": 200, "chord": 1000, "expiry": 100_000}
QUICK = {"drain": 300, "latency": 50, "chord": 200, "expiry": 20_000}
EXPIRY_BACKENDS = ("db", "pikku", "dcr")


def settings_from(argv: Sequence[str] | None) -> Settings:
    options = parser(
        "result_backend",
        "pikku's result backend against Redis, db+ and django-celery-results: "
        "drain throughput, get() latency, a large chord, expiry.",
        quick=f"one round of {QUICK['drain']} tasks, {QUICK['latency']} gets, "
        f"{QUICK['chord']} header tasks, {QUICK['expiry']:,} expired rows",
        databases=DATABASES,
        redis_url=DEFAULT_REDIS_URL,
        rounds=(2, 1, "the best is kept"),
        check=None,
    )
    options.add_argument(
        "--backends",
        type=comma_list(BY_KEY),
        default=tuple(BY_KEY),
        help=f"some of {','.join(BY_KEY)} (default all)",
    )
    options.add_argument(
        "--pikku-flush-interval",
        type=float,
        help="the mirror's flush interval in seconds for the pikku runs (default pikku's own): "
        "how much of get()'s latency is the wait for the worker's next flush",
    )
    options.add_argument("--skip-expiry", action="store_true", help="no cleanup() timing")
    args = options.read(argv)
    backends = tuple(b for b in BACKENDS if b.key in args.backends)
    expiry = () if args.skip_expiry else tuple(b for b in backends if b.key in EXPIRY_BACKENDS)
    settings = Settings(
        rounds=args.rounds,
        counts=dict(QUICK if args.quick else FULL),
        backends=backends,
        expiry=expiry,
        pg_url=args.pg_url,
        redis_url=args.redis_url,
        flush_interval=args.pikku_flush_interval,
    )
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from(argv)
    # Each run makes its backend's database anew: none to create up front.
    with Session("result-bench", settings, DATABASES, create=False) as session:
        runs = measure(Bench(settings, session))
        report_drain(runs, settings)
        report_latency(runs, settings)
        report_chord(runs, settings)
        report_expiry(runs, settings)
        report_ratios(runs, settings)
    return session.finish(check=False)


if __name__ == "__main__":
    sys.exit(main())
