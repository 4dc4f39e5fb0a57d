"""One flusher per worker node: the processes a node's main process forks only append,
and its flusher writes their journals with its own, in shared batches; a pool process
killed at any instant loses nothing, and its journal goes once written."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

from pikku_celery import WorkflowStore
from pikku_celery.errors import RunNotFound
from pikku_celery.mirror import Recorder
from pikku_celery.mirror.events import AttemptStarted, encode, new_event_id
from pikku_celery.mirror.journal import Journal, node_suffix
from pikku_celery.mirror.sinks import AppendOnlySink
from tests.support.published import lone
from tests.support.statements import count_statements


def node_mirror(store: WorkflowStore, tmp_path: Path) -> Recorder:
    mirror = Recorder(store, journal_dir=tmp_path / "journal", background=False, adopt_interval=0.0)
    mirror.serve_node()
    return mirror


def pool_process(mirror: Recorder, steps: list[str], *, then: str) -> int:
    """A forked child that publishes and runs ``steps``, then exits (``then="exit"``),
    is killed (``"kill"``), or waits to be killed (``"wait"``); returns its pid once it
    journaled them."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        try:
            os.close(ready_r)
            for step_id in steps:
                mirror.published(lone(step_id))
                mirror.started(step_id, 1, worker="w", pid=os.getpid())
                mirror.succeeded(step_id, step_id, 1, {"ok": True})
            # Its appends are all it does: it writes nothing and runs no flusher.
            assert isinstance(mirror.sink, AppendOnlySink)
            assert mirror.stats().batches == 0
            os.write(ready_w, b"x")
            if then == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if then == "wait":
                signal.pause()
        except BaseException:
            code = 1
        os._exit(code)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x"
    os.close(ready_r)
    return pid


def ended(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return status


def statuses(store: WorkflowStore, steps: list[str]) -> list[str | None]:
    """Each lone task's run status; None for a run not in SQL."""
    found: list[str | None] = []
    for step_id in steps:
        try:
            found.append(store.runs.get_run(step_id).status)
        except RunNotFound:
            found.append(None)
    return found


def journals(mirror: Recorder) -> list[str]:
    return sorted(p.name for p in mirror.journal_folder.glob("*.journal"))


def test_pool_processes_append_and_the_node_writes_them_in_one_batch_with_its_own(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = node_mirror(store, tmp_path)
    mine = str(uuid.uuid4())
    mirror.published(lone(mine))  # the main process's own event (a rejected message)
    first, second = [str(uuid.uuid4()) for _ in range(3)], [str(uuid.uuid4()) for _ in range(3)]
    one = pool_process(mirror, first, then="exit")
    two = pool_process(mirror, second, then="kill")
    assert ended(one) == 0
    assert os.WIFSIGNALED(ended(two))
    assert statuses(store, first) == [None] * 3  # nothing is written by a pool process

    with count_statements(store.engine) as log:
        assert mirror.flush()
    assert log.commits == 1  # three journals, one shared batch
    assert statuses(store, first + second) == ["completed"] * 6
    assert statuses(store, [mine]) == ["running"]
    # The journals of the ended pool processes are written, and gone.
    assert len(journals(mirror)) == 1
    mirror.close()
    assert journals(mirror) == []


def test_a_living_pool_process_is_written_and_its_journal_kept_until_it_ends(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = node_mirror(store, tmp_path)
    steps = [str(uuid.uuid4()) for _ in range(4)]
    pid = pool_process(mirror, steps, then="wait")
    try:
        assert mirror.flush()
        assert statuses(store, steps) == ["completed"] * 4
        assert len(journals(mirror)) == 1  # its owner lives: it may append again
    finally:
        os.kill(pid, signal.SIGKILL)
        ended(pid)
    assert mirror.flush()
    assert journals(mirror) == []
    mirror.close()


def test_a_node_that_stops_leaves_a_living_pool_processs_journal_to_the_next(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = node_mirror(store, tmp_path)
    mirror.flush()
    steps = [str(uuid.uuid4()) for _ in range(2)]
    pid = pool_process(mirror, steps, then="wait")
    try:
        mirror.close()  # its main process stops before the pool process was written
        assert statuses(store, steps) == ["completed"] * 2  # written as it stopped
        # A new main process (here: another mirror) serves the node and claims it.
        again = node_mirror(store, tmp_path)
        assert again.flush()
        assert len(journals(again)) == 1
    finally:
        os.kill(pid, signal.SIGKILL)
        ended(pid)
    assert again.flush()
    assert journals(again) == []
    again.close()


def test_another_nodes_living_pool_process_is_left_to_its_node(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = node_mirror(store, tmp_path)
    step_id = str(uuid.uuid4())
    mirror.published(lone(step_id))
    mirror.flush()
    # A pool process of another worker on this machine (its main process's pid 999999).
    other = Journal(
        mirror.journal_folder / f"host-1-a{node_suffix(999999)}", mirror.database_key, role="append"
    )
    other.append(
        "started",
        encode(
            AttemptStarted(
                id=new_event_id(), at=time.time(), step_id=step_id, attempt=1, worker="w", pid=1
            )
        ),
    )
    assert mirror.flush()
    assert store.get_run_history(step_id)[0].status == "scheduled"  # its node writes it
    other.close()  # it ended: its journal is anybody's now
    assert mirror.flush()
    assert store.get_run_history(step_id)[0].status == "running"
    assert len(journals(mirror)) == 1
    mirror.close()


def test_the_node_flusher_thread_writes_a_living_pool_processs_events_by_itself(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = Recorder(store, journal_dir=tmp_path / "journal", flush_interval=0.02)
    mirror.serve_node()
    mirror.start()  # the worker's main process: its flusher thread runs
    steps = [str(uuid.uuid4()) for _ in range(3)]
    pid = pool_process(mirror, steps, then="wait")
    try:
        deadline = time.monotonic() + 10
        while statuses(store, steps) != ["completed"] * 3:
            assert time.monotonic() < deadline, statuses(store, steps)
            time.sleep(0.01)
    finally:
        os.kill(pid, signal.SIGKILL)
        ended(pid)
    mirror.close()
    assert journals(mirror) == []
