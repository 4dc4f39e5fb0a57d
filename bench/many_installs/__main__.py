"""How long a process with many ``PikkuCelery`` installs on one database takes to exit.

A test session that makes an app per test (Celery's own suite makes 313) holds a mirror
per install, each with a journal and a flusher. The process publishes one task per app
(memory broker, no worker), then ends; the time from its last line to its exit is what
closing the mirrors costs. Plain Celery apps are the baseline.

    python -m bench.many_installs [--installs 50 300] [--rounds 2]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.harness.options import parser

_CHILD = """
import sys, time
from celery import Celery
from pikku_celery import PikkuCelery
count, url, mirrored = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
apps = []
for i in range(count):
    app = Celery(f"a{i}", broker="memory://", backend="cache+memory://")
    pikku = PikkuCelery(app, database_url=url, mirror="all") if mirrored else None
    @app.task(name=f"t{i}")
    def task():
        return 1
    task.delay()
    apps.append((app, pikku))
time.sleep(0.5)
print(time.time(), flush=True)
"""


def exit_seconds(count: int, url: str, mirrored: bool, journal: Path) -> float:
    env = {**os.environ, "PIKKU_JOURNAL_DIR": str(journal)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(count), url, "1" if mirrored else "0"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return time.time() - float(out.stdout.split()[-1])


def main(argv: Sequence[str] | None = None) -> None:
    options = parser(
        "many_installs",
        __doc__.split("\n\n")[0],
        quick="50 installs, one round",
        rounds=(2, 1, "the fastest exit is kept"),
    )
    options.add_argument(
        "--installs", type=int, nargs="+", help="installs in a process (default 50 300)"
    )
    args = options.read(argv)
    args.installs = args.installs or ([50] if args.quick else [50, 300])
    if min(args.installs) < 1:
        options.error("--installs must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'pikku.db'}"
        subprocess.run(
            [sys.executable, "-m", "pikku_celery", "--database-url", url, "db", "upgrade"],
            check=True,
            capture_output=True,
        )
        print("| installs | plain exit (s) | mirrored exit (s) |")
        print("|---:|---:|---:|")
        for count in args.installs:
            plain = min(exit_seconds(count, url, False, Path(tmp)) for _ in range(args.rounds))
            mirrored = min(exit_seconds(count, url, True, Path(tmp)) for _ in range(args.rounds))
            print(f"| {count} | {plain:.2f} | {mirrored:.2f} |")


if __name__ == "__main__":
    main()
