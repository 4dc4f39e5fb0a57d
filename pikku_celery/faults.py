"""Crash points for the fault tests: a process killed at one exact line, not by timing luck.

Only the test suite sets ``PIKKU_TEST_CRASH_AT``. A process whose environment
names the point it reaches (``after_claim:charge``: right after a replay
claimed the step ``charge``, before its message is sent; ``before_chord_send:batch``:
a batch that claimed chords committed, their bodies not sent;
``after_result_journaled:shop.add``: a task's result journaled, not yet in SQL;
``before_commit:node``: a worker's main process about to write a batch holding a pool
process's ended attempt) SIGKILLs itself there, as a power cut or the OOM killer would.
"""

from __future__ import annotations

import os
import signal
from typing import Final

__all__ = ["ENV_CRASH_AT", "crash_point"]

ENV_CRASH_AT: Final = "PIKKU_TEST_CRASH_AT"


def crash_point(point: str, detail: str) -> None:
    if os.environ.get(ENV_CRASH_AT) == f"{point}:{detail}":
        os.kill(os.getpid(), signal.SIGKILL)
