"""A journal written by another process than the one appending to it (a worker node's
main process and its pool processes): the consumer reads it while it grows, deletes what
it consumed, and no adopter takes it from under the consumer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pikku_celery.mirror.journal import Journal, orphaned_journals

ROOT = Path(__file__).resolve().parents[2]

# Appends argv[2] events in the "append" role, says so on stdout, and ends when stdin does.
_APPENDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from pikku_celery.mirror.journal import core as module
    module.SEGMENT_BYTES = 4096
    journal = module.Journal(Path(sys.argv[1]), "db", role="append")
    for n in range(int(sys.argv[2])):
        journal.append("started", '{"n": %d, "pad": "%s"}' % (n, "x" * 40))
    print("appended", flush=True)
    sys.stdin.read()
    journal.close()
    """
)


def appender(path: Path, count: int) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _APPENDER, str(path), str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "appended\n"
    return child


def end(child: subprocess.Popen[str]) -> None:
    child.communicate("", timeout=30)
    assert child.returncode == 0


def consume(journal: Journal) -> list[int]:
    """Everything due, read and removed; returns the event numbers in order."""
    found: list[int] = []
    while entries := journal.peek(100, time.time()):
        found += [int(e.payload.split(",")[0].split(":")[1]) for e in entries]
        journal.remove(e.seq for e in entries)
    return found


def test_a_consumer_writes_a_living_appenders_journal_and_deletes_it_once_its_owner_ended(
    tmp_path: Path,
) -> None:
    path = tmp_path / "host-7-a.journal"
    child = appender(path, 300)
    try:
        consumer = Journal(path, role="consume")
        assert consumer.next_due() == 0.0  # what the other process appended is seen
        assert consume(consumer) == list(range(300))
        assert consumer.next_due() is None
        # Consumed segments go while the owner still appends to its newest one.
        assert len(list(path.glob("*.seg"))) == 1
        with pytest.raises(OSError):
            Journal(path, role="consume")  # one consumer at a time
        assert list(orphaned_journals(tmp_path, "db")) == []  # no adopter takes it either
        assert not consumer.owner_gone()
    finally:
        end(child)
    assert consumer.owner_gone()
    consumer.close()
    assert list(tmp_path.iterdir()) == []


def test_a_consumer_that_lets_go_leaves_the_rest_to_the_next_one(tmp_path: Path) -> None:
    path = tmp_path / "host-7-a.journal"
    child = appender(path, 50)
    first = Journal(path, role="consume")
    entries = first.peek(20, time.time())
    first.remove(e.seq for e in entries)
    first.close()  # its owner lives: nothing is deleted
    assert path.is_dir()

    end(child)
    # Its owner and its consumer are gone: an adopter writes the rest, once.
    [adopted] = orphaned_journals(tmp_path, "db")
    assert consume(adopted) == list(range(20, 50))
    adopted.close()
    assert list(tmp_path.iterdir()) == []


def test_a_process_that_only_appends_never_deletes_its_journal(tmp_path: Path) -> None:
    path = tmp_path / "host-7-a.journal"
    journal = Journal(path, "db", role="append")
    journal.close()  # empty, as far as it knows: the consumer decides
    assert path.is_dir()
    consumer = Journal(path, role="consume")
    with pytest.raises(RuntimeError):
        consumer.append("started", "{}")  # a consumer never appends to another's journal
    consumer.close()
