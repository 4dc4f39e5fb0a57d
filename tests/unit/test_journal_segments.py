"""The journal's segment files: a torn or damaged tail is dropped, consumed segments go,
another process reads a journal while it grows, and a process killed at any instant
leaves every event whose append returned, in order, once."""

from __future__ import annotations

import itertools
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pikku_celery.mirror.journal import (
    Journal,
    JournalTail,
    journal_depth,
    journaled_steps,
    orphaned_journals,
)
from pikku_celery.mirror.journal import checkpoint as checkpoint_module
from pikku_celery.mirror.journal import core as journal_core

ROOT = Path(__file__).resolve().parents[2]


def segments(path: Path) -> list[Path]:
    return sorted(path.glob("*.seg"))


def payloads(journal: Journal, now: float | None = None) -> list[str]:
    return [e.payload for e in journal.peek(1_000_000, time.time() if now is None else now)]


def left(path: Path, count: int) -> None:
    """A journal left by a process that ended with ``count`` events in it."""
    journal = Journal(path, "db")
    for n in range(count):
        journal.append("started", f'{{"n": {n}}}')
    journal.close(delete_if_empty=False)


def test_a_record_cut_short_is_dropped_and_a_new_owner_starts_a_segment_after_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "host-1-a.journal"
    left(path, 5)
    [segment] = segments(path)
    os.truncate(segment, segment.stat().st_size - 3)  # the machine died mid-write

    again = Journal(path, "db")  # a process with the same pid and owner id
    assert payloads(again) == [f'{{"n": {n}}}' for n in range(4)]
    again.append("started", '{"n": "new"}')
    [entry] = again.peek(10, time.time())[4:]
    assert (entry.seq, entry.payload) == (5, '{"n": "new"}')
    again.close(delete_if_empty=False)
    assert len(segments(path)) == 2  # nothing was appended after the cut record

    [adopted] = orphaned_journals(tmp_path, "db")
    assert [e.seq for e in adopted.peek(10, time.time())] == [1, 2, 3, 4, 5]
    adopted.close(delete_if_empty=False)
    assert journal_depth(tmp_path, only=".") == 5


def test_a_record_whose_checksum_fails_ends_its_segment(tmp_path: Path) -> None:
    path = tmp_path / "host-1-a.journal"
    left(path, 5)
    [segment] = segments(path)
    data = bytearray(segment.read_bytes())
    third = data.index(b'{"n": 2}')
    data[third + 2] ^= 0x01  # one bit flipped on the disk
    segment.write_bytes(bytes(data))

    [adopted] = orphaned_journals(tmp_path, "db")
    assert payloads(adopted) == ['{"n": 0}', '{"n": 1}']
    assert adopted.depth() == 2
    adopted.close(delete_if_empty=False)


def test_a_length_past_any_record_is_damage_not_a_record_to_wait_for(tmp_path: Path) -> None:
    path = tmp_path / "host-1-a.journal"
    left(path, 2)
    [segment] = segments(path)
    with open(segment, "ab") as file:
        file.write(struct.pack("<II", 0xFFFFFFF0, 0) + b"x" * 20)
    tail = JournalTail(path)
    assert [seq for seq, _, _ in tail.read(10)] == [1, 2]
    tail.close()


def test_segments_rotate_and_each_goes_once_every_record_in_it_has_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_core, "SEGMENT_BYTES", 2048)
    path = tmp_path / "host-1-a.journal"
    journal = Journal(path, "db")
    for n in range(200):
        journal.append("started", json.dumps({"n": n, "pad": "x" * 60}))
    made = len(segments(path))
    assert made >= 5
    now = time.time()
    first = journal.peek(150, now)
    assert [json.loads(e.payload)["n"] for e in first] == list(range(150))
    journal.defer([first[120].seq], now + 60, now)  # one event waits: its segment stays
    journal.remove(e.seq for e in first if e.seq != first[120].seq)
    kept = len(segments(path))
    assert 1 < kept < made
    assert journal.depth() == 51
    assert journal_depth(tmp_path, only=".") == 51  # another process sees what has left
    journal.close()

    [adopted] = orphaned_journals(tmp_path, "db")
    assert adopted.depth() == 51
    assert [json.loads(p)["n"] for p in payloads(adopted, now)] == list(range(150, 200))
    [waiting] = adopted.peek(100, now + 61)[:1]
    assert (json.loads(waiting.payload)["n"], waiting.deferred_since) == (120, now)
    adopted.remove(e.seq for e in adopted.peek(100, now + 61))
    assert adopted.depth() == 0
    assert len(segments(path)) == 1  # the last one stays until the journal goes
    adopted.close()
    assert list(tmp_path.iterdir()) == []


def test_what_has_left_is_a_checkpoint_appended_per_batch_and_a_torn_last_one_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint_module, "_CHECKPOINT_BYTES", 1024)
    path = tmp_path / "host-1-a.journal"
    journal = Journal(path, "db")
    for n in range(60):
        journal.append("started", json.dumps({"n": n}))
    log = path / "consumed.log"
    sizes = []
    for _ in range(20):  # a batch of two leaves at a time
        journal.remove(e.seq for e in journal.peek(2, time.time()))
        sizes.append(log.stat().st_size)
    # Appended to, one record per batch, and written anew whenever it grew long.
    assert any(b > a for a, b in itertools.pairwise(sizes))
    assert any(b < a for a, b in itertools.pairwise(sizes))
    assert max(sizes) <= 1024
    assert journal_depth(tmp_path, only=".") == 20
    journal.close(delete_if_empty=False)

    with log.open("ab") as file:  # a consumer killed in the middle of its next record
        file.write(struct.pack("<II", 60, 0) + b"checkpoint {")
    [adopted] = orphaned_journals(tmp_path, "db")
    assert [json.loads(p)["n"] for p in payloads(adopted)] == list(range(40, 60))
    adopted.remove(e.seq for e in adopted.peek(5, time.time()))
    # The adopter wrote it anew: the torn record is gone and hides no later one.
    assert journal_depth(tmp_path, only=".") == 15
    adopted.close(delete_if_empty=False)


def test_set_aside_events_are_json_lines_and_come_back_in_order(tmp_path: Path) -> None:
    path = tmp_path / "host-1-a.journal"
    journal = Journal(path, "db")
    for n in range(3):
        journal.append("started", json.dumps({"step_id": f"s{n}"}))
    now = time.time()
    entries = journal.peek(3, now)
    journal.set_aside(entries[0], "a bug", now)
    journal.remove([entries[2].seq])
    journal.close()
    [line] = (path / "set-aside.jsonl").read_text().splitlines()
    assert json.loads(line)["reason"] == "a bug"
    assert journal_depth(tmp_path, only=".", table="set_aside") == 1
    assert journal_depth(tmp_path, only=".") == 1
    assert journaled_steps(tmp_path, ["s0", "s1", "s2"]) == {"s0", "s1"}

    [adopted] = orphaned_journals(tmp_path, "db")
    assert (adopted.depth(), adopted.set_aside_count()) == (1, 1)
    assert adopted.restore_set_aside() == 1
    assert [e.seq for e in adopted.peek(10, now)] == [1, 2]
    adopted.remove([1, 2])
    adopted.close()
    assert not path.exists()


def test_a_forked_child_cannot_append_to_its_parents_journal(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "host-1-a.journal", "db")
    journal.append("started", "{}")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            journal.append("started", "{}")
        except RuntimeError:
            os._exit(0)
        os._exit(1)
    assert os.waitpid(pid, 0)[1] == 0
    assert journal.depth() == 1
    journal.close(delete_if_empty=False)


_TAILER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from pikku_celery.mirror.journal import JournalTail
    tail, wanted, got = JournalTail(Path(sys.argv[1])), int(sys.argv[2]), 0
    deadline = time.monotonic() + 60
    while got < wanted and time.monotonic() < deadline:
        for seq, kind, payload in tail.read(100):
            print(seq, kind, payload, flush=True)
            got += 1
        time.sleep(0.001)
    """
)


def test_another_process_reads_a_journal_while_it_grows_and_rotates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_core, "SEGMENT_BYTES", 4096)
    path = tmp_path / "host-1-a.journal"
    journal = Journal(path, "db")
    count = 2000
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    reader = subprocess.Popen(
        [sys.executable, "-c", _TAILER, str(path), str(count)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    for n in range(count):
        journal.append("started", f'{{"n": {n}}}')
        if n % 50 == 0:
            time.sleep(0.002)  # the reader catches up now and then, mid-segment
    out, _ = reader.communicate(timeout=60)
    lines = out.splitlines()
    assert lines == [f'{n + 1} started {{"n": {n}}}' for n in range(count)]
    assert len(segments(path)) > 10
    journal.close(delete_if_empty=False)


_APPENDER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from pikku_celery.mirror.journal import core as module
    module.SEGMENT_BYTES = 16384
    journal = module.Journal(Path(sys.argv[1]), "db")
    report = int(sys.argv[2])
    n = 0
    while True:
        journal.append("started", '{"n": %d, "pad": "%s"}' % (n, "x" * (n % 300)))
        os.write(report, n.to_bytes(4, "little"))  # only once its append returned
        n += 1
    """
)


@pytest.mark.parametrize("after", [0.05, 0.2, 0.5])
def test_a_process_killed_mid_stream_leaves_every_appended_event_in_order_once(
    tmp_path: Path, after: float
) -> None:
    path = tmp_path / "host-1-a.journal"
    read, write = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", _APPENDER, str(path), str(write)], pass_fds=[write], env=env
    )
    os.close(write)
    reported = bytearray()
    deadline = time.monotonic() + 30
    while len(reported) < 4 * 200 and time.monotonic() < deadline:
        reported += os.read(read, 65536)  # it appends by now
    time.sleep(after)
    child.send_signal(signal.SIGKILL)
    child.wait()
    while chunk := os.read(read, 65536):
        reported += chunk
    os.close(read)
    returned = [int.from_bytes(reported[i : i + 4], "little") for i in range(0, len(reported), 4)]
    assert returned == list(range(len(returned)))

    [adopted] = orphaned_journals(tmp_path, "db")
    entries = adopted.peek(10_000_000, time.time())
    found = [json.loads(e.payload)["n"] for e in entries]
    # The last append may have returned without its report: one more, never one less.
    assert found[: len(returned)] == returned
    assert len(found) - len(returned) in (0, 1)
    assert [e.seq for e in entries] == list(range(1, len(found) + 1))
    adopted.remove(e.seq for e in entries)
    adopted.close()
    assert list(tmp_path.iterdir()) == []
