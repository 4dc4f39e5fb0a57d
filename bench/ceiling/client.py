"""The caller of the ceiling bench: one workload's tasks sent, in a process of its own.

``python -m bench.ceiling.client --count N --run R`` runs in the workload's
environment (``bench.ceiling.app``) beside the running worker: it sends ``N``
lone tasks or chords, and where the workload has results, ``get()``s each one
in the order sent and checks its value; it prints one JSON line. Its own
writes (the publishes its flusher records) and reads are the workload's, so
they land on the server the bench measures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

from celery import chord

from bench.ceiling.app import BY_KEY, CHORD_SIZE, NOOP, PART, RETRY, TOTAL, WORKLOAD_ENV, app

GET_TIMEOUT: Final = 120.0


def main(argv: Sequence[str] | None = None) -> int:
    options = argparse.ArgumentParser(prog="python -m bench.ceiling.client")
    options.add_argument("--count", type=int, required=True)
    options.add_argument("--run", required=True)
    args = options.parse_args(argv)
    if app is None:
        raise SystemExit(f"the client needs ${WORKLOAD_ENV}")
    workload = BY_KEY[os.environ[WORKLOAD_ENV]]
    clock = time.perf_counter()
    sent: list[Any]
    if workload.key == "chord":
        body = app.signature(TOTAL, (args.run,))
        sent = [
            chord([app.signature(PART, (args.run,)) for _ in range(CHORD_SIZE)], body).apply_async()
            for _ in range(args.count)
        ]
    else:
        task = app.tasks[RETRY if workload.key == "retry" else NOOP]
        sent = [task.delay(args.run) for _ in range(args.count)]
    published = time.perf_counter() - clock
    if workload.results:
        expected = CHORD_SIZE if workload.key == "chord" else None
        for result in sent:
            value = result.get(timeout=GET_TIMEOUT)
            if value != expected:
                raise SystemExit(f"{result.id} came back as {value!r}, not {expected!r}")
    elapsed = time.perf_counter() - clock
    print(json.dumps({"published": published, "elapsed": elapsed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
