"""Running the same code in several threads at the same moment."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_threads(count: int, target: Callable[[int], object]) -> None:
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait()
            target(index)
        except BaseException as exc:  # collected and re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
