"""Property tests on the real store, both databases: stored faithfully or refused whole."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pikku_celery import SerializationError, WorkflowStore
from pikku_celery.store.attempts import NewRun
from tests.support import transitions

# The same store serves every example; each example makes its own run.
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# PostgreSQL keeps jsonb numbers as decimals: floats beyond 2**53 may come back as
# ints of the same decimal value (a documented limit), so they are kept in range.
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**62), max_value=2**62)
    | st.floats(min_value=-1e15, max_value=1e15, allow_nan=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=20), children, max_size=5)
    ),
    max_leaves=25,
)
not_json = st.sampled_from(
    [math.nan, math.inf, -math.inf, {1, 2}, object(), b"bytes", {"k": [math.nan]}, dt.date.today()]
)
keys = st.text(min_size=0, max_size=300) | st.sampled_from(
    ["a.b", 'it"s', "\\", "$.x", "ü", "x" * 10_000, "' OR 1=1 --", "\\u00fc"]
)


def storable_on(store: WorkflowStore, value: Any) -> bool:
    """Whether the database can hold every string in the value (PostgreSQL: no NUL)."""
    if store.dialect != "postgresql":
        return True
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, list):
        return all(storable_on(store, item) for item in value)
    if isinstance(value, dict):
        return all(storable_on(store, k) and storable_on(store, v) for k, v in value.items())
    return True


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


@FUZZ
@given(key=keys, value=json_values)
def test_any_state_key_and_json_value(store: WorkflowStore, key: str, value: Any) -> None:
    run_id = store.create_run("fuzz", {})
    store.update_run_state(run_id, "other", 1)
    if not (storable_on(store, key) and storable_on(store, value)):
        with pytest.raises(SerializationError, match="NUL"):
            store.update_run_state(run_id, key, value)
        assert store.get_run_state(run_id) == {"other": 1}
        return
    store.update_run_state(run_id, key, value)
    state = store.get_run_state(run_id)
    assert set(state) == {"other", key} or (key == "other" and set(state) == {"other"})
    assert same(state[key], value)


@FUZZ
@given(value=json_values | not_json)
def test_any_result_is_stored_faithfully_or_refused_whole(store: WorkflowStore, value: Any) -> None:
    run_id = store.create_run("fuzz", {})
    step_id = transitions.schedule(store, run_id, "s")
    transitions.start(store, step_id)
    try:
        transitions.succeed(store, step_id, 1, value)
    except SerializationError:
        state = store.get_step_state(run_id, "s")
        [attempt] = store.get_run_history(run_id)
        assert (state.status, state.result, attempt.status) == ("running", None, "running")
        return
    assert storable_on(store, value)
    state = store.get_step_state(run_id, "s")
    [attempt] = store.get_run_history(run_id)
    assert state.status == attempt.status == "succeeded"
    assert same(state.result, value) and same(attempt.result, value)


def test_multi_megabyte_results_round_trip(store: WorkflowStore) -> None:
    run_id = store.create_run("fuzz", {})
    step_id = transitions.schedule(store, run_id, "big")
    big = {"rows": [{"id": n, "name": f"row {n} ü"} for n in range(60_000)]}
    transitions.succeed(store, step_id, 1, big)
    assert store.get_step_state(run_id, "big").result == big


def attempt_events(attempts: int) -> list[tuple[int, str]]:
    """What Celery reports for a step that fails `attempts - 1` times, then succeeds."""
    events: list[tuple[int, str]] = []
    for k in range(1, attempts + 1):
        events.append((k, "running"))
        if k < attempts:
            events += [(k, "failed"), (k + 1, "scheduled")]
        else:
            events.append((k, "succeeded"))
    return events


def apply(store: WorkflowStore, step_id: str, event: tuple[int, str]) -> None:
    attempt, status = event
    if status == "succeeded":
        store.attempts.record_attempt(step_id, attempt, status, result={"attempt": attempt})
    elif status == "failed":
        store.attempts.record_attempt(step_id, attempt, status, error=ValueError(f"try {attempt}"))
    else:
        store.attempts.record_attempt(step_id, attempt, status)


def outcome(store: WorkflowStore, run_id: str) -> Any:
    state = store.get_step_state(run_id, "s")
    return (
        (state.status, state.attempt_count, state.result),
        [
            (a.attempt, a.status, a.result, a.error and a.error["message"])
            for a in store.get_run_history(run_id)
        ],
    )


def new_step(store: WorkflowStore) -> tuple[str, str]:
    step_id = str(uuid.uuid4())
    transitions.schedule(
        store, step_id, "s", step_id=step_id, rpc_name="t", data={}, new_run=NewRun("fuzz", {})
    )
    return step_id, step_id


@FUZZ
@given(data=st.data(), attempts=st.integers(min_value=1, max_value=4))
def test_any_interleaving_of_events_ends_as_the_ordered_one(
    store: WorkflowStore, data: st.DataObject, attempts: int
) -> None:
    events = attempt_events(attempts)
    run_id, step_id = new_step(store)
    for event in events:
        apply(store, step_id, event)
    expected = outcome(store, run_id)

    shuffled = data.draw(st.permutations(events))
    duplicates = data.draw(st.lists(st.sampled_from(events), max_size=4))
    run_id, step_id = new_step(store)
    for event in [*shuffled, *duplicates]:
        apply(store, step_id, event)
    assert outcome(store, run_id) == expected
