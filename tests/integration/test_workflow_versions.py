"""A suspended run, then a deploy that edits its workflow: what the next replay does.

Each version of the workflow is a module written to disk and imported, as a
deploy does it, by a PikkuCelery of its own (a worker of that version) on one
store. The replays are the real engine's; a dispatcher records what they send
and the test plays the worker (``tests.support.durable``).
"""

from __future__ import annotations

import importlib.util
import logging
import textwrap
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.integration.task import WorkflowTask
from tests.support.durable import Recorder, durable_pikku, settle

ORIGINAL = """
@pikku.workflow("evolving")
def evolving(ctx, order_id):
    reserved = ctx.do("reserve", lambda: f"reserved {order_id}")
    charged = ctx.do("charge", lambda: f"charged {order_id}")
    ctx.sleep("cool-off", seconds=0)
    return [reserved, charged, ctx.do("ship", lambda: "shipped")]
"""

# The same code, reworded, reformatted and decorated otherwise.
RESTYLED = '''
@pikku.workflow(
    "evolving",   # the name stays
)
def evolving(ctx, order_id):
    """Reserve, charge, cool off, ship."""
    # A comment where there was none.
    reserved = ctx.do(
        "reserve", lambda: f"reserved {order_id}"
    )
    charged = ctx.do("charge", lambda: f"charged {order_id}")  # and another

    ctx.sleep("cool-off", seconds=0)
    return [reserved, charged, ctx.do("ship", lambda: "shipped")]
'''

# Charges before it reserves: the run's history says the other way round.
REORDERED = """
@pikku.workflow("evolving")
def evolving(ctx, order_id):
    charged = ctx.do("charge", lambda: f"charged {order_id}")
    reserved = ctx.do("reserve", lambda: f"reserved {order_id}")
    ctx.sleep("cool-off", seconds=0)
    return [reserved, charged, ctx.do("ship", lambda: "shipped")]
"""

# The recorded part as it was; what comes after the sleep changed.
EXTENDED = """
@pikku.workflow("evolving")
def evolving(ctx, order_id):
    reserved = ctx.do("reserve", lambda: f"reserved {order_id}")
    charged = ctx.do("charge", lambda: f"charged {order_id}")
    ctx.sleep("cool-off", seconds=0)
    label = ctx.do("label", lambda: "label printed")
    return [reserved, charged, label, ctx.do("ship", lambda: "shipped by courier")]
"""


class Deploy:
    """Workers of one version after another on one store, each its own PikkuCelery."""

    def __init__(self, store: WorkflowStore, folder: Path, stack: ExitStack) -> None:
        self.store = store
        self.folder = folder
        self._stack = stack

    def version(self, name: str, source: str) -> tuple[PikkuCelery, Any]:
        """A worker running ``source`` (a module of its own, from a file, as a deploy)."""
        pikku = self._stack.enter_context(durable_pikku(self.store))
        path = self.folder / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        spec = importlib.util.spec_from_file_location(f"flows_{name}", path)
        assert spec is not None and spec.loader is not None
        module: ModuleType = importlib.util.module_from_spec(spec)
        module.__dict__["pikku"] = pikku
        spec.loader.exec_module(module)
        return pikku, module.evolving


@pytest.fixture
def deploy(store: WorkflowStore, tmp_path: Path) -> Iterator[Deploy]:
    with ExitStack() as stack:
        yield Deploy(store, tmp_path, stack)


def suspended_run(deploy: Deploy) -> tuple[str, Any]:
    """A run of the original version, suspended in its sleep after two inline steps."""
    old, workflow = deploy.version("original", ORIGINAL)
    run_id = workflow.start(order_id=7)
    assert settle(old) == ["sleeping"]
    run = deploy.store.get_run(run_id)
    assert (run.status, run.graph_hash) == ("suspended", workflow.version)
    return run_id, workflow


def replay_on(pikku: PikkuCelery, run_id: str) -> list[str]:
    """What a worker's start does for an unsettled run: replay it."""
    pikku.workflows.replay_soon(run_id)
    return settle(pikku)


def test_a_change_of_comments_layout_and_decorator_keeps_the_version(deploy: Deploy) -> None:
    run_id, original = suspended_run(deploy)
    new, restyled = deploy.version("restyled", RESTYLED)
    assert restyled.version == original.version
    assert replay_on(new, run_id) == ["completed"]
    assert deploy.store.get_run(run_id).output == ["reserved 7", "charged 7", "shipped"]


def test_a_run_whose_steps_the_new_version_reorders_fails_naming_the_step(
    deploy: Deploy,
) -> None:
    run_id, original = suspended_run(deploy)
    new, reordered = deploy.version("reordered", REORDERED)
    assert reordered.version != original.version
    assert replay_on(new, run_id) == ["failed"]
    run = deploy.store.get_run(run_id)
    assert run.status == "failed" and run.error is not None
    assert run.error["code"] == "VERSION_CONFLICT"
    assert run.error["step"] == "charge"
    message = run.error["message"]
    assert "step 'charge' was recorded after 'reserve'" in message
    assert "asks for it first" in message
    assert repr(original.version) in message and repr(reordered.version) in message
    assert "pikku.resume(" in message  # what to do: finish it on the old version
    # Nothing of the new version's path was done.
    assert [s.step_name for s in deploy.store.list_step_states(run_id)] == [
        "reserve",
        "charge",
        "cool-off",
    ]


def test_a_new_version_that_changes_only_steps_after_the_history_takes_the_run_over(
    deploy: Deploy,
) -> None:
    run_id, original = suspended_run(deploy)
    new, extended = deploy.version("extended", EXTENDED)
    assert extended.version != original.version
    assert replay_on(new, run_id) == ["completed"]
    run = deploy.store.get_run(run_id)
    assert run.output == ["reserved 7", "charged 7", "label printed", "shipped by courier"]
    assert run.graph_hash == original.version  # the run still says who started it
    steps = {s.step_name: s.from_step_name for s in deploy.store.list_step_states(run_id)}
    assert steps == {
        "reserve": None,
        "charge": "reserve",
        "cool-off": "charge",
        "label": "cool-off",
        "ship": "label",
    }


def test_a_new_version_that_ends_the_run_early_conflicts_at_the_step_it_skips(
    deploy: Deploy,
) -> None:
    run_id, _ = suspended_run(deploy)
    new, _ = deploy.version(
        "shortened",
        """
        @pikku.workflow("evolving")
        def evolving(ctx, order_id):
            return ctx.do("reserve", lambda: f"reserved {order_id}")
        """,
    )
    assert replay_on(new, run_id) == ["failed"]
    error = deploy.store.get_run(run_id).error
    assert error is not None and error["step"] == "charge"
    assert "this version ends the run instead of asking for it" in error["message"]


def test_a_new_version_that_fails_before_it_reaches_the_history_leaves_the_run_suspended(
    deploy: Deploy, caplog: pytest.LogCaptureFixture
) -> None:
    run_id, original = suspended_run(deploy)
    new, _ = deploy.version(
        "broken",
        """
        @pikku.workflow("evolving")
        def evolving(ctx, order_id):
            reserved = ctx.do("reserve", lambda: f"reserved {order_id}")
            raise KeyError("a bug of the new version")
        """,
    )
    with caplog.at_level(logging.WARNING, logger="pikku_celery.workflows.replay"):
        assert replay_on(new, run_id) == ["undecided"]
    run = deploy.store.get_run(run_id)
    assert (run.status, run.error) == ("suspended", None)
    [line] = [r for r in caplog.records if getattr(r, "action", None) == "version_undecided"]
    text = line.getMessage()
    assert run_id in text and "stays suspended" in text
    assert f"compatible=[{original.version!r}]" in text
    # The old version's worker, started again, finishes it.
    old, _ = deploy.version("original_again", ORIGINAL)
    assert replay_on(old, run_id) == ["completed"]


def test_a_pinned_version_still_refuses_runs_it_does_not_list(deploy: Deploy) -> None:
    run_id, _ = suspended_run(deploy)
    new, pinned = deploy.version(
        "pinned", RESTYLED.replace('"evolving",   # the name stays', '"evolving", version="v2"')
    )
    assert pinned.version == "v2"
    assert replay_on(new, run_id) == ["failed"]
    error = deploy.store.get_run(run_id).error
    assert error is not None and error["code"] == "VERSION_CONFLICT" and "step" not in error


# --- steps a task step published: in the run, never asked for ---------------------------


class ChargeTask(WorkflowTask):
    name = "tests.versions.charge"


class ShipTask(WorkflowTask):
    name = "tests.versions.ship"


charge_task = ChargeTask()
ship_task = ShipTask()


def finish_step(store: WorkflowStore, step_id: str, result: Any) -> None:
    store.attempts.record_attempt(step_id, 1, "running")
    store.attempts.record_attempt(step_id, 1, "succeeded", result=result)


def published_by(store: WorkflowStore, run_id: str, step: str, name: str) -> None:
    """A mirrored task the step's task sent: a step of the run after that step."""
    store.claims.claim_step(
        run_id,
        f"{run_id}-{name}",
        name,
        "tests.versions.notify",
        {"args": [], "kwargs": {}},
        status="succeeded",
        from_step_name=step,
        result="notified",
    )


def test_a_task_a_step_published_neither_conflicts_nor_stops_a_new_version(
    store: WorkflowStore,
) -> None:
    with durable_pikku(store) as old, durable_pikku(store) as new:

        @old.workflow("tasks")
        def tasks(ctx: Any) -> Any:
            return [ctx.do("charge", charge_task), ctx.do("ship", ship_task)]

        @new.workflow("tasks")
        def tasks_and_label(ctx: Any) -> Any:
            charged, shipped = ctx.do("charge", charge_task), ctx.do("ship", ship_task)
            return [charged, shipped, ctx.do("label", lambda: "label")]

        run_id = tasks.start()
        settle(old)
        recorder = old.workflows.dispatcher
        assert isinstance(recorder, Recorder)
        finish_step(store, recorder.steps[-1][0], "charged")
        published_by(store, run_id, "charge", "notify")
        assert replay_on(old, run_id) == ["waiting"]  # ship is out
        # Ship came after charge, so "notify" (after charge too) is what charge sent.
        finish_step(store, recorder.steps[-1][0], "shipped")
        assert replay_on(new, run_id) == ["completed"]
        assert store.get_run(run_id).output == ["charged", "shipped", "label"]


def test_a_step_after_a_task_that_may_be_the_old_versions_next_leaves_the_run_suspended(
    store: WorkflowStore,
) -> None:
    with durable_pikku(store) as old, durable_pikku(store) as new:

        @old.workflow("tasks")
        def tasks(ctx: Any) -> Any:
            return ctx.do("charge", charge_task)

        @new.workflow("tasks")
        def tasks_and_label(ctx: Any) -> Any:
            return [ctx.do("charge", charge_task), ctx.do("label", lambda: "label")]

        run_id = tasks.start()
        settle(old)
        recorder = old.workflows.dispatcher
        assert isinstance(recorder, Recorder)
        finish_step(store, recorder.steps[-1][0], "charged")
        published_by(store, run_id, "charge", "refund")
        # "refund", a task after "charge": the old version's next step, or what charge sent?
        assert replay_on(new, run_id) == ["undecided"]
        assert store.get_run(run_id).status == "suspended"
        assert "label" not in {s.step_name for s in store.list_step_states(run_id)}


def test_a_recorded_task_asked_of_another_task_by_a_new_version_conflicts(
    store: WorkflowStore,
) -> None:
    with durable_pikku(store) as old, durable_pikku(store) as new:

        @old.workflow("tasks")
        def tasks(ctx: Any) -> Any:
            return ctx.do("charge", charge_task)

        @new.workflow("tasks")
        def tasks_shipping(ctx: Any) -> Any:
            return ctx.do("charge", ship_task)

        run_id = tasks.start()
        settle(old)
        assert replay_on(new, run_id) == ["failed"]
        error = store.get_run(run_id).error
        assert error is not None and error["step"] == "charge"
        assert (
            "was recorded as task 'tests.versions.charge', and this version asks for it as "
            "task 'tests.versions.ship'"
        ) in error["message"]


def test_a_new_branch_in_a_parallel_group_takes_the_run_over(store: WorkflowStore) -> None:
    with durable_pikku(store) as old, durable_pikku(store) as new:

        @old.workflow("fan")
        def fan(ctx: Any) -> Any:
            return ctx.do_all([("charge", charge_task), ("ship", ship_task)])

        @new.workflow("fan")
        def wider(ctx: Any) -> Any:
            return ctx.do_all(
                [("label", lambda: "label"), ("charge", charge_task), ("ship", ship_task)]
            )

        run_id = fan.start()
        assert settle(old) == ["waiting"]  # both branches out
        recorder = old.workflows.dispatcher
        assert isinstance(recorder, Recorder)
        for step_id, name, _ in recorder.steps:
            finish_step(store, step_id, f"{name} done")
        # The group is judged whole: a new branch before recorded ones is no reordering.
        assert replay_on(new, run_id) == ["completed"]
        assert store.get_run(run_id).output == ["label", "charge done", "ship done"]
