"""Where a process journals: a folder it can write, proven at start-up, and one folder per
database, however the database is spelled, so a journal is only ever written into its own."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from celery import Celery

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.errors import ConfigurationError
from pikku_celery.mirror import Recorder
from pikku_celery.mirror.journal import Journal, journal_folder, orphaned_journals
from pikku_celery.store import database_key
from tests.acceptance.conftest import ROOT
from tests.integration.test_journal import left_journal


def unwritable(tmp_path: Path) -> Path:
    """A folder no process can make, root included: its parent is a file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return blocker / "journal"


def test_a_publisher_whose_journal_folder_cannot_be_written_fails_at_start_up(
    tmp_path: Path,
) -> None:
    folder = unwritable(tmp_path)
    app = Celery("publisher", broker="memory://", set_as_current=False)
    with pytest.raises(ConfigurationError) as raised:
        PikkuCelery(app, database_url=f"sqlite:///{tmp_path / 'p.db'}", journal_dir=str(folder))
    message = str(raised.value)
    assert str(folder) in message and "PIKKU_JOURNAL_DIR" in message


def test_the_folder_is_proven_with_a_file_written_synced_and_removed(tmp_path: Path) -> None:
    mirror = Recorder(WorkflowStore(f"sqlite:///{tmp_path / 'p.db'}"), journal_dir=tmp_path)
    folder = mirror.check_journal()
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_a_key_per_database_whatever_the_spelling() -> None:
    pg = "postgresql+psycopg://shop:secret@db.internal/orders"
    assert database_key(pg) == database_key("postgres://shop:other@db.internal:5432/orders")
    assert database_key(pg) != database_key("postgresql://shop@db.internal/refunds")
    assert database_key(pg) != database_key("postgresql://billing@db.internal/orders")
    assert "secret" not in database_key(pg)


def test_two_projects_on_the_default_sqlite_url_journal_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = []
    for project in ("shop", "billing"):
        (tmp_path / project).mkdir()
        monkeypatch.chdir(tmp_path / project)
        folders.append(journal_folder(tmp_path / "journals", "sqlite:///pikku.db"))
        assert database_key("sqlite:///pikku.db") == f"sqlite:{tmp_path / project / 'pikku.db'}"
    assert folders[0] != folders[1]


def test_a_journal_of_another_database_is_never_written_into_this_one(
    store: WorkflowStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mirror = Recorder(store, journal_dir=tmp_path)
    step_id = str(uuid.uuid4())
    # A journal in this database's folder that says it is for another database (a
    # folder shared by hand, a copied file): adoption leaves it where it is.
    path = mirror.journal_folder / "elsewhere-4242.journal"
    Journal(path, "sqlite:/somewhere/else.db").close(delete_if_empty=False)
    left_journal(mirror.journal_folder, step_id).close(delete_if_empty=False)
    with caplog.at_level(logging.WARNING):
        written = mirror.adopt_orphans()
    assert written == 0
    assert "not " + mirror.database_key in caplog.text
    with pytest.raises(LookupError):
        store.get_run(step_id)
    assert path.exists()


def test_a_process_journal_records_its_database(store: WorkflowStore, tmp_path: Path) -> None:
    mirror = Recorder(store, journal_dir=tmp_path, background=False)
    step_id = str(uuid.uuid4())
    mirror.started(step_id, 1, worker="w", pid=os.getpid())
    [path] = mirror.journal_folder.glob("*.journal")
    mirror.close()
    [journal] = list(orphaned_journals(mirror.journal_folder, mirror.database_key))
    assert journal.database == mirror.database_key
    journal.close(delete_if_empty=False)
    assert path.exists()


def test_a_worker_whose_journal_folder_cannot_be_written_refuses_to_start(
    tmp_path: Path, pg_url: str
) -> None:
    folder = unwritable(tmp_path)
    env = {
        **os.environ,
        "PIKKU_JOURNAL_DIR": str(folder),
        "PLAIN_DATABASE_URL": pg_url,
        "PLAIN_BROKER_URL": "memory://",
        "PYTHONPATH": str(ROOT),
    }
    worker = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.acceptance.plain_app",
            "worker",
            "-P",
            "solo",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode != 0
    assert "ready." not in worker.stdout + worker.stderr
    assert f"cannot write its journal folder {folder}" in worker.stderr
    assert "PIKKU_JOURNAL_DIR" in worker.stderr


def test_the_journal_command_says_why_it_cannot_read_a_folder_it_cannot_make(
    tmp_path: Path,
) -> None:
    folder = unwritable(tmp_path)
    url = f"sqlite:///{tmp_path / 'p.db'}"
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "pikku_celery",
            "--database-url",
            url,
            "journal",
            "--journal-dir",
            str(folder),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode != 0
    assert "0 mirror events" not in shown.stdout
    assert str(folder) in shown.stderr and "PIKKU_JOURNAL_DIR" in shown.stderr
