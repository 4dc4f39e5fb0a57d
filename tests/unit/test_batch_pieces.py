"""How a batch is cut into pieces by key group, before any database sees it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping

from pikku_celery.store import MirrorBatch, ResultWrite, RunOutcome, StepTransition
from pikku_celery.store.batch_pieces import pieces

AT = dt.datetime(2026, 12, 5, tzinfo=dt.timezone.utc)


def by_first_letter(keys: Collection[str]) -> Mapping[str, int]:
    return {key: ord(key[0]) for key in keys}


def test_a_step_its_lookup_missed_goes_with_the_run_its_outcome_names() -> None:
    # The step's publish committed after the batch looked its steps up: its attempt's end
    # and its run's completion check must still be one transaction, in the run's group.
    batch = MirrorBatch(
        transitions=[StepTransition("s-link", 2, "succeeded", AT)],
        outcomes=[RunOutcome("s-link", "r-run", "complete", AT)],
        results=[ResultWrite("s-link", 2, "SUCCESS", b"{}", AT)],
    )
    cut = pieces(batch, {}, by_first_letter)
    [(piece, own)] = cut.first
    assert own == {"r-run"}
    assert [t.step_id for t in piece.transitions] == ["s-link"]
    assert [o.step_id for o in piece.outcomes] == ["s-link"]
    # Its result, keyed by its task id in another group, is written after the run's piece.
    [then] = cut.then
    assert [r.task_id for r in then.results] == ["s-link"]


def test_the_lookups_run_wins_and_an_unknown_step_without_a_run_keys_by_itself() -> None:
    batch = MirrorBatch(
        transitions=[
            StepTransition("a-step", 1, "running", AT),
            StepTransition("b-step", 1, "running", AT),
        ],
    )
    cut = pieces(batch, {"a-step": "c-run"}, by_first_letter)
    assert [(sorted(own), [t.step_id for t in p.transitions]) for p, own in cut.first] == [
        (["b-step"], ["b-step"]),
        (["c-run"], ["a-step"]),
    ]
    assert cut.then == []
