"""Leases on both databases: one holder at a time, taken over only once expired."""

from __future__ import annotations

import threading
import time

from pikku_celery import WorkflowStore


def test_a_lease_has_one_holder_until_it_expires(store: WorkflowStore) -> None:
    assert store.lease_generation("reaper") == 0
    first = store.take_lease("reaper", "worker-a", ttl=30)
    assert first == 1
    assert store.take_lease("reaper", "worker-b", ttl=30) is None
    assert store.lease_generation("reaper") == 1
    assert store.release_lease("reaper", "worker-a", first)
    assert store.take_lease("reaper", "worker-b", ttl=30) == 2


def test_an_expired_lease_is_taken_over_and_its_old_holder_cannot_renew_it(
    store: WorkflowStore,
) -> None:
    old = store.take_lease("recovery", "worker-a", ttl=0.2)
    assert old is not None
    time.sleep(0.3)
    new = store.take_lease("recovery", "worker-b", ttl=30)
    assert new == old + 1
    assert not store.renew_lease("recovery", "worker-a", old, ttl=30)
    assert store.renew_lease("recovery", "worker-b", new, ttl=30)


def test_a_released_lease_can_be_held_back_for_a_while(store: WorkflowStore) -> None:
    generation = store.take_lease("reaper", "worker-a", ttl=30)
    assert generation is not None
    store.release_lease("reaper", "worker-a", generation, hold=30)
    assert store.take_lease("reaper", "worker-b", ttl=30) is None


def test_of_many_takers_at_once_exactly_one_gets_the_lease(store: WorkflowStore) -> None:
    got: list[int | None] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def take(holder: str) -> None:
        barrier.wait()
        generation = store.take_lease("recovery", holder, ttl=30)
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
    held = store.take_lease("reaper", "worker-a", ttl=30)
    assert held is not None
    assert store.take_lease("reaper", "worker-b", ttl=30, over_resting=True) is None
    store.release_lease("reaper", "worker-a", held, hold=30)
    assert store.take_lease("reaper", "worker-c", ttl=30) is None
    assert store.take_lease("reaper", "worker-b", ttl=30, over_resting=True) == held + 1
    assert not store.release_lease("reaper", "worker-a", held)  # no longer its own
