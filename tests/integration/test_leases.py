"""Leases on both databases: one holder at a time, taken over only once expired."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pikku_celery import WorkflowStore
from pikku_celery.integration import upkeep as upkeep_module
from pikku_celery.integration.reaper import Reaper
from pikku_celery.integration.upkeep import Recover, Upkeep
from pikku_celery.mirror import Recorder
from tests.support.threads import run_threads


def test_a_lease_has_one_holder_until_it_expires(store: WorkflowStore) -> None:
    assert store.leases.lease_generation("reaper") == 0
    first = store.leases.take_lease("reaper", "worker-a", ttl=30)
    assert first == 1
    assert store.leases.take_lease("reaper", "worker-b", ttl=30) is None
    assert store.leases.lease_generation("reaper") == 1
    assert store.leases.release_lease("reaper", "worker-a", first)
    assert store.leases.take_lease("reaper", "worker-b", ttl=30) == 2


def test_an_expired_lease_is_taken_over_and_its_old_holder_cannot_renew_it(
    store: WorkflowStore,
) -> None:
    old = store.leases.take_lease("recovery", "worker-a", ttl=0.2)
    assert old is not None
    time.sleep(0.3)
    new = store.leases.take_lease("recovery", "worker-b", ttl=30)
    assert new == old + 1
    assert not store.leases.renew_lease("recovery", "worker-a", old, ttl=30)
    assert store.leases.renew_lease("recovery", "worker-b", new, ttl=30)


def test_a_released_lease_can_be_held_back_for_a_while(store: WorkflowStore) -> None:
    generation = store.leases.take_lease("reaper", "worker-a", ttl=30)
    assert generation is not None
    store.leases.release_lease("reaper", "worker-a", generation, hold=30)
    assert store.leases.take_lease("reaper", "worker-b", ttl=30) is None


def test_of_many_takers_at_once_exactly_one_gets_the_lease(store: WorkflowStore) -> None:
    got: list[int | None] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def take(holder: str) -> None:
        barrier.wait()
        generation = store.leases.take_lease("recovery", holder, ttl=30)
        with lock:
            got.append(generation)

    takers = [threading.Thread(target=take, args=(f"worker-{n}",)) for n in range(6)]
    for taker in takers:
        taker.start()
    for taker in takers:
        taker.join()
    assert sorted(got, key=lambda g: g or 0) == [None] * 5 + [1]


def test_a_resting_lease_can_be_taken_over_the_rest_but_never_a_held_one(
    store: WorkflowStore,
) -> None:
    held = store.leases.take_lease("reaper", "worker-a", ttl=30)
    assert held is not None
    assert store.leases.take_lease("reaper", "worker-b", ttl=30, over_resting=True) is None
    store.leases.release_lease("reaper", "worker-a", held, hold=30)
    assert store.leases.take_lease("reaper", "worker-c", ttl=30) is None
    assert store.leases.take_lease("reaper", "worker-b", ttl=30, over_resting=True) == held + 1
    assert not store.leases.release_lease("reaper", "worker-a", held)  # no longer its own


def test_a_lease_taken_since_a_given_moment_is_not_taken_again_even_when_free(
    store: WorkflowStore,
) -> None:
    looked = store.leases.lease_clock()
    first = store.leases.take_lease("recovery", "worker-a", ttl=30, if_taken_before=looked)
    assert first == 1
    taken_at = store.leases.lease_taken_at("recovery")
    assert taken_at is not None and taken_at >= looked
    store.leases.release_lease("recovery", "worker-a", first)
    # Free again, but taken since worker-b looked: that pass covers it.
    assert store.leases.take_lease("recovery", "worker-b", ttl=30, if_taken_before=looked) is None
    later = store.leases.lease_clock() + 0.001
    assert store.leases.take_lease("recovery", "worker-b", ttl=30, if_taken_before=later) == 2


def _no_reaper() -> Reaper:
    raise AssertionError("these tests run no reaper pass")


def _upkeeps(store: WorkflowStore, tmp_path: Path, calls: list[str], n: int) -> list[Upkeep]:
    mirror = Recorder(store, journal_dir=tmp_path, background=False)

    def recover_for(name: str) -> Recover:
        def recover(go_on: Callable[[], bool]) -> int:
            calls.append(name)
            time.sleep(0.3)  # a pass long enough for the others to see it going
            assert go_on()
            return 1

        return recover

    return [
        Upkeep(mirror, _no_reaper, holder=f"w{i}", recover=recover_for(f"w{i}")) for i in range(n)
    ]


def test_workers_that_started_before_a_recovery_pass_began_share_it(
    store: WorkflowStore, tmp_path: Path
) -> None:
    calls: list[str] = []
    upkeeps = _upkeeps(store, tmp_path, calls, 3)
    started = store.leases.lease_clock()  # all three started before any pass
    run_threads(3, lambda i: upkeeps[i].recover_once(started))
    assert len(calls) == 1


def test_a_worker_that_started_during_a_pass_runs_one_more_after_it(
    store: WorkflowStore, tmp_path: Path
) -> None:
    calls: list[str] = []
    early, late, later = _upkeeps(store, tmp_path, calls, 3)
    before = store.leases.lease_generation("recovery")
    going = threading.Thread(target=early.recover_once, args=(store.leases.lease_clock(),))
    going.start()
    wait = time.monotonic() + 5
    while store.leases.lease_generation("recovery") == before and time.monotonic() < wait:
        time.sleep(0.01)
    during = store.leases.lease_clock()  # these two started while it ran
    run_threads(2, lambda i: (late, later)[i].recover_once(during))
    going.join()
    assert len(calls) == 2  # the pass they found going, and one for both of them


class _CountingReaper:
    """Counts passes: the upkeep's scheduling is what is under test here."""

    reply_timeout = 0.1

    def __init__(self, passes: list[float]) -> None:
        self.passes = passes

    def reap(self) -> None:
        self.passes.append(time.monotonic())


def test_a_recovery_lease_a_dead_worker_holds_never_holds_up_the_reaper(
    store: WorkflowStore, tmp_path: Path
) -> None:
    # A worker died mid-recovery: its lease stands until it expires.
    assert store.leases.take_lease("recovery", "dead:1", ttl=30) is not None
    passes: list[float] = []
    recovered: list[str] = []
    mirror = Recorder(store, journal_dir=tmp_path, background=False)

    def recover(go_on: Callable[[], bool]) -> int:
        recovered.append("pass")
        return 0

    upkeep = Upkeep(
        mirror,
        lambda: _CountingReaper(passes),  # type: ignore[arg-type,return-value]
        holder="alive",
        interval=0.2,
        recover=recover,
    )
    upkeep.note_start()
    upkeep.start()
    try:
        deadline = time.monotonic() + 10
        while len(passes) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(passes) >= 3  # the reaper goes on while recovery waits for the lease
        assert recovered == []
    finally:
        upkeep.stop()


def test_a_recovery_that_fails_is_tried_again_until_it_is_done(
    store: WorkflowStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upkeep_module, "_RETRY_RECOVERY", 0.05)
    attempts: list[int] = []

    def recover(go_on: Callable[[], bool]) -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("the database is away")  # as at a start during an outage
        return 0

    mirror = Recorder(store, journal_dir=tmp_path, background=False)
    upkeep = Upkeep(mirror, _no_reaper, holder="w", interval=0, recover=recover)
    upkeep.note_start()
    upkeep.start()
    try:
        deadline = time.monotonic() + 10
        while len(attempts) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        assert len(attempts) == 2  # failed once, then done: not tried a third time
    finally:
        upkeep.stop()
