"""pikku's result backend (``backend="pikku://"``) against Celery's own and django-celery-results.

Run from the project root::

    python -m bench.result_backend            # best of 2 rounds
    python -m bench.result_backend --quick    # one round, smaller counts

Celery's Redis and SQLAlchemy (``db+``) backends, pikku and django-celery-results (the
``bench`` extra), each on a fresh ``celery worker -P prefork -c 2`` (``bench.result_backend.app``)
and client process (``bench.result_backend.client``): drain throughput, ``get()`` latency,
a large chord and ``cleanup()`` of expired results. Method and figures: ``bench/README.md``,
"Result backend benchmark".
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
