"""Adopting journals while their owners empty and delete them: one adopter per journal,
never a journal made again, never a corrupted one (a process with hundreds of mirrors
on one database adopts all the time)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pikku_celery.mirror.journal import Journal, orphaned_journals
from pikku_celery.mirror.orphans import Orphans


def test_a_journal_its_owner_emptied_and_deleted_is_never_made_again_by_an_adopter(
    tmp_path: Path,
) -> None:
    path = tmp_path / "host-1-a.journal"
    owner = Journal(path, "db")
    owner.append("published", "{}")
    owner.remove([1])
    owner.close()
    assert list(tmp_path.iterdir()) == []

    with pytest.raises(FileNotFoundError):
        Journal(path, existing=True)
    assert list(tmp_path.iterdir()) == [], "an adopter left files of a journal that is gone"


def test_an_adopter_takes_a_journal_whose_lock_file_is_gone(tmp_path: Path) -> None:
    kept = tmp_path / "host-1-kept.journal"
    dead = Journal(kept, "db")  # its process is gone, and its lock file with it
    dead.append("published", "{}")
    dead.close(delete_if_empty=False)
    Path(f"{kept}.lock").unlink()

    adopted = list(orphaned_journals(tmp_path, "db"))

    assert [journal.path for journal in adopted] == [kept]
    assert adopted[0].depth() == 1
    adopted[0].close()


def test_adopters_racing_owners_that_delete_their_journals_corrupt_none_and_share_none(
    tmp_path: Path,
) -> None:
    errors: list[BaseException] = []
    held: dict[Path, int] = {}
    held_lock = threading.Lock()
    stop = threading.Event()

    def owner(n: int) -> None:
        i = 0
        while not stop.is_set():
            journal = Journal(tmp_path / f"host-{n}-{i}.journal", "db")
            journal.append("published", "{}")
            journal.remove([1])
            journal.close()
            i += 1

    def adopter() -> None:
        while not stop.is_set():
            for journal in orphaned_journals(tmp_path, "db"):
                with held_lock:
                    held[journal.path] = held.get(journal.path, 0) + 1
                    twice = held[journal.path] > 1
                try:
                    assert not twice, f"{journal.path} adopted by two at once"
                    journal.depth()
                finally:
                    with held_lock:
                        held[journal.path] -= 1
                    journal.close()

    def guarded(target: object, *args: object) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)  # type: ignore[operator]
            except (AssertionError, OSError) as exc:
                errors.append(exc)
                stop.set()

        return threading.Thread(target=run)

    threads = [guarded(owner, n) for n in range(3)] + [guarded(adopter) for _ in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join(10)

    assert errors == []
    assert list(tmp_path.iterdir()) == [], "files of emptied journals were left behind"


def test_mirrors_of_one_process_look_for_orphans_once_per_interval_between_them(
    tmp_path: Path,
) -> None:
    looks: list[str] = []

    def flush(journal: Journal) -> bool:
        looks.append(journal.path.name)
        return True

    left = tmp_path / "host-9-left.journal"
    mirrors = [Orphans(tmp_path, "db", flush, adopt_interval=60.0) for _ in range(50)]
    for _ in range(3):  # the left journal comes back after each look: count the looks
        dead = Journal(left, "db")
        dead.append("published", "{}")
        dead.close()
        for orphans in mirrors:
            orphans.run_when_due()

    assert looks == ["host-9-left.journal"], "more than one look in one interval"
