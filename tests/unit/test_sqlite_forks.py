"""A process forked while its parent writes the SQLite store can still write it.

A prefork worker forks pool processes while its main process writes the database. A
child forked in the middle of one of its parent's transactions used to find the database
locked for ever ("database is locked" after every busy timeout): SQLite's in-memory lock
state was inherited without the locks. A fork now waits for the transaction to end.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from pikku_celery import WorkflowStore


def test_a_child_forked_during_a_write_of_its_parent_writes_the_database(
    tmp_path: Path,
) -> None:
    store = WorkflowStore(f"sqlite:///{tmp_path / 'pikku.db'}")
    store.init()
    holding, release = threading.Event(), threading.Event()

    def write_slowly() -> None:
        with store.transaction() as conn:
            store.create_run("held", {"n": 1}, conn=conn)
            holding.set()
            release.wait(10)

    writer = threading.Thread(target=write_slowly)
    writer.start()
    assert holding.wait(10)
    threading.Timer(0.3, release.set).start()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one write, its outcome through the pipe
        os.close(read)
        outcome = b"wrote"
        try:
            store.dispose_after_fork()
            with store.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA busy_timeout=2000")
            store.create_run("child", {"n": 2})
        except Exception as exc:
            outcome = repr(exc).encode()[:500]
        os.write(write, outcome)
        os._exit(0)
    os.close(write)
    forked_at = time.monotonic()
    writer.join(10)
    with os.fdopen(read, "rb") as pipe:
        outcome = pipe.read()
    os.waitpid(pid, 0)
    assert outcome == b"wrote", outcome
    # The fork waited for the parent's transaction, not for a timeout.
    assert time.monotonic() - forked_at < 4.0
    assert sorted(run.workflow for run in store.list_runs()) == ["child", "held"]
    store.close()
