"""The inline runner: workflows, retries, canvases and lone tasks run in the test process.

Every message goes through Celery's own publish path and worker tracer, so the
mirror sees what a worker would produce; the app's broker is on a port where
nothing listens, so a message that leaked to it would fail the test.

These runners fast-forward: their clock jumps to the next ETA whenever nothing else
is due, so the hour-long retry delay and sleep below pass at once. How ETAs wait for
a clock that stands still is in test_inline_clock.py.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, chord, group

from pikku_celery import PikkuCelery, WorkflowTask
from pikku_celery.errors import ConfigurationError, NeverIdle, StepFailed
from pikku_celery.testing import InlineRunner, inline
from pikku_celery.workflows.definition import Workflow

pytest_plugins = ["pytester"]

NOWHERE = "redis://127.0.0.1:9/0"


class Shop:
    """The docs' checkout, on an app of its own; ``calls`` counts each step's runs."""

    def __init__(self, database: Path) -> None:
        self.app = Celery(f"shop_{uuid.uuid4().hex[:8]}", broker=NOWHERE, set_as_current=False)
        self.pikku = PikkuCelery(self.app, f"sqlite:///{database}")
        # shared=False throughout: every test builds a Shop, each app with tasks of its own.
        self.calls: Counter[str] = Counter()
        self.fixed = False
        self.flaky_failures = 2
        pikku, calls = self.pikku, self.calls

        @pikku.step(shared=False)
        def charge(order_id: int) -> dict[str, Any]:
            calls["charge"] += 1
            return {"id": f"receipt-{order_id}"}

        @pikku.step(shared=False)
        def send_email(receipt: dict[str, Any]) -> str:
            calls["email"] += 1
            return f"mailed {receipt['id']}"

        @pikku.step(shared=False)
        def make_invoice(receipt: dict[str, Any]) -> str:
            calls["invoice"] += 1
            return f"invoice for {receipt['id']}"

        @pikku.step(shared=False)
        def ship(order_id: int) -> str:
            calls["ship"] += 1
            if not self.fixed:
                raise RuntimeError("no courier today")
            return f"shipped {order_id}"

        @pikku.step(retries=2, retry_delay=3600, shared=False)
        def flaky(n: int) -> int:
            calls["flaky"] += 1
            if calls["flaky"] <= self.flaky_failures:
                raise ConnectionError(f"attempt {calls['flaky']} failed")
            return n * 10

        @pikku.step(shared=False)
        def add(x: int, y: int) -> int:
            calls["add"] += 1
            return x + y

        @pikku.step(shared=False)
        def total(values: list[int]) -> int:
            return sum(values)

        @self.app.task(base=WorkflowTask, bind=True, max_retries=None, shared=False)
        def forever(task: Any) -> None:
            raise task.retry(countdown=0)

        @pikku.workflow("checkout")
        def checkout(ctx: Any, order_id: int) -> dict[str, Any]:
            receipt = ctx.do("charge", charge, order_id)
            ctx.sleep("cool-off", seconds=3600)
            token = ctx.do("token", lambda: f"token-{order_id}")
            email, invoice = ctx.do_all(
                [("email", send_email, receipt), ("invoice", make_invoice, receipt)]
            )
            shipped = ctx.do("ship", ship, order_id)
            return {
                "receipt": receipt,
                "token": token,
                "sent": [email, invoice],
                "shipped": shipped,
            }

        @pikku.workflow("retrying")
        def retrying(ctx: Any) -> int:
            return int(ctx.do("flaky", flaky, 4))

        @pikku.workflow("compensating")
        def compensating(ctx: Any, order_id: int) -> str:
            try:
                ctx.do("ship", ship, order_id)
            except StepFailed:
                return "refunded"
            return "shipped"

        @pikku.workflow("approval")
        def approval(ctx: Any, amount: int) -> dict[str, Any]:
            decision = ctx.wait_for("approval")
            return {
                "refunded": amount if decision["approved"] else 0,
                "approved_by": decision["by"],
            }

        @pikku.workflow("compensating-child")
        def shipping(ctx: Any, order_id: int) -> str:
            return str(ctx.do("ship", ship, order_id))

        @pikku.workflow("parent")
        def parent(ctx: Any, order_id: int) -> str:
            try:
                return str(ctx.do("ship", shipping, order_id))
            except StepFailed:
                return "compensated"

        self.approval: Workflow = approval
        self.parent: Workflow = parent
        self.charge, self.add, self.total, self.forever = charge, add, total, forever
        self.checkout: Workflow = checkout
        self.retrying: Workflow = retrying
        self.compensating: Workflow = compensating


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Shop]:
    shop = Shop(tmp_path / "production.db")
    yield shop
    shop.pikku.uninstall()


@pytest.fixture
def runner(shop: Shop) -> Iterator[InlineRunner]:
    with InlineRunner(shop.pikku, fast_forward=True) as runner:
        yield runner


def test_checkout_fails_then_resumes_without_running_done_steps_again(
    shop: Shop, runner: InlineRunner
) -> None:
    run = runner.start(shop.checkout, order_id=1)
    assert run.status == "failed"
    assert run.error is not None and run.error["step"] == "ship"
    assert {name: step.status for name, step in run.steps.items()} == {
        "charge": "succeeded",
        "cool-off": "succeeded",
        "token": "succeeded",
        "email": "succeeded",
        "invoice": "succeeded",
        "ship": "failed",
    }
    shop.fixed = True
    run = runner.resume(run.run_id)
    assert run.status == "completed"
    assert run.output == {
        "receipt": {"id": "receipt-1"},
        "token": "token-1",
        "sent": ["mailed receipt-1", "invoice for receipt-1"],
        "shipped": "shipped 1",
    }
    assert run.steps["ship"].attempt_statuses == ["failed", "succeeded"]
    assert [a.reason for a in run.steps["ship"].attempts] == ["first", "resume"]
    assert dict(shop.calls) == {"charge": 1, "email": 1, "invoice": 1, "ship": 2}
    # What a worker records: the worker's name and the Celery task id on each attempt.
    attempt = run.steps["charge"].attempts[0]
    assert attempt.worker is not None and attempt.worker.startswith("inline@")
    assert attempt.delivery_count == 1


def test_rerun_runs_the_step_and_those_after_it_again(shop: Shop, runner: InlineRunner) -> None:
    shop.fixed = True
    run = runner.start(shop.checkout, order_id=2)
    assert run.status == "completed"
    run = runner.rerun(run.run_id, from_step="email")
    assert run.status == "completed"
    assert dict(shop.calls) == {"charge": 1, "email": 2, "invoice": 2, "ship": 2}


def test_a_failed_step_can_be_compensated(shop: Shop, runner: InlineRunner) -> None:
    run = runner.start(shop.compensating, order_id=3)
    assert (run.status, run.output) == ("completed", "refunded")


def test_celery_retries_are_attempts_and_their_delay_is_not_waited_for(
    shop: Shop, runner: InlineRunner
) -> None:
    began = time.monotonic()
    run = runner.start(shop.retrying)
    assert time.monotonic() - began < 10  # retry_delay is an hour
    assert (run.status, run.output) == ("completed", 40)
    attempts = run.steps["flaky"].attempts
    assert [a.attempt for a in attempts] == [1, 2, 3]
    assert [a.status for a in attempts] == ["failed", "failed", "succeeded"]
    assert [a.reason for a in attempts] == ["first", "retry", "retry"]
    assert attempts[0].error is not None and attempts[0].error["message"] == "attempt 1 failed"
    assert shop.calls["flaky"] == 3


def test_retries_running_out_fail_the_step_with_its_last_error(
    shop: Shop, runner: InlineRunner
) -> None:
    shop.flaky_failures = 10
    run = runner.start(shop.retrying)
    assert run.status == "failed"
    assert run.steps["flaky"].attempt_statuses == ["failed", "failed", "failed"]
    shop.flaky_failures = 0
    run = runner.resume(run.run_id)
    assert (run.status, run.output) == ("completed", 40)
    assert run.steps["flaky"].attempt_statuses == ["failed", "failed", "failed", "succeeded"]


def test_a_durable_sleep_ends_at_once(shop: Shop, runner: InlineRunner) -> None:
    shop.fixed = True
    began, clock = time.monotonic(), runner.now
    run = runner.start(shop.checkout, order_id=4)
    assert time.monotonic() - began < 10  # the sleep is an hour
    assert run.status == "completed"
    sleep = run.steps["cool-off"]
    assert sleep.status == "succeeded" and sleep.attempts[0].eta is not None
    assert runner.now == sleep.attempts[0].eta == clock + dt.timedelta(hours=1)


def test_a_lone_task_is_a_run_of_its_own(shop: Shop, runner: InlineRunner) -> None:
    run = runner.delay(shop.add, 2, 3)
    assert (run.status, run.output, run.workflow) == ("completed", 5, shop.add.name)
    assert run.run.wire == {"type": "task"}
    assert list(run.steps) == ["add"]


def test_a_canvas_is_one_run(shop: Shop, runner: InlineRunner) -> None:
    run = runner.run(chain(shop.add.s(1, 2), shop.add.s(3), shop.add.s(4)), name="sums")
    assert (run.status, run.output) == ("completed", 10)
    assert list(run.steps) == ["add", "add#2", "add#3"]
    assert run.steps["add#2"].attempts[0].from_step_name == "add"
    fanned = runner.run(group(shop.add.s(1, 1), shop.add.s(2, 2)), name="fan")
    assert fanned.status == "completed"
    assert sorted(step.result for step in fanned.steps.values()) == [2, 4]
    joined = runner.run(chord([shop.add.s(1, 1), shop.add.s(2, 2)], shop.total.s()), name="sum")
    assert (joined.status, joined.output) == ("completed", 6)


def test_cancel_revokes_a_step_before_it_runs(shop: Shop, runner: InlineRunner) -> None:
    sent = shop.add.delay(1, 1)  # queued, not run: the runner runs messages when asked
    run = runner.cancel(str(sent.id))
    assert run.status == "cancelled"
    assert run.steps["add"].status == "cancelled"
    assert shop.calls["add"] == 0


def test_a_run_that_never_settles_raises_a_typed_error(shop: Shop, runner: InlineRunner) -> None:
    shop.forever.delay()
    with pytest.raises(NeverIdle, match=r"ran 30 messages .*" + shop.forever.name):
        runner.run_until_idle(max_messages=30)


def test_a_wait_for_an_event_suspends_the_run_until_it_is_sent(
    shop: Shop, runner: InlineRunner
) -> None:
    run = runner.start(shop.approval, amount=30)
    assert run.status == "suspended"
    run = runner.send(run.run_id, "approval", {"approved": True, "by": "ana"})
    assert (run.status, run.output) == ("completed", {"refunded": 30, "approved_by": "ana"})
    assert run.steps["approval"].result == {"approved": True, "by": "ana"}


def test_a_child_workflow_runs_inline_and_failing_it_is_compensated(
    shop: Shop, runner: InlineRunner
) -> None:
    shop.fixed = True
    run = runner.start(shop.parent, order_id=2)
    assert (run.status, run.output) == ("completed", "shipped 2")
    child = runner.result(run.steps["ship"].child_run_id or "")
    assert (child.workflow, child.status) == ("compensating-child", "completed")
    shop.fixed = False
    run = runner.start(shop.parent, order_id=3)
    assert run.output == "compensated"


def test_the_app_and_pikku_are_put_back_afterwards(shop: Shop, tmp_path: Path) -> None:
    store = shop.pikku.store
    transport = shop.app.conf.broker_transport
    with inline(shop.pikku) as runner:
        assert shop.pikku.store is runner.store
        assert shop.app.conf.broker_url != NOWHERE
        run = runner.delay(shop.add, 1, 2)
        assert runner.store.get_run(run.run_id).status == "completed"
    assert shop.pikku.store is store
    assert shop.app.conf.broker_url == NOWHERE
    assert shop.app.conf.broker_transport is transport
    assert shop.app.connection_for_write().transport_cls == "redis"
    # The pools were dropped. (celery-types has app.pool as a ProducerPool; it is a ConnectionPool.)
    assert shop.app.pool.connection.transport_cls == "redis"  # type: ignore[attr-defined]
    assert not (tmp_path / "production.db").exists()  # nothing reached the real store
    with pytest.raises(ConfigurationError, match="not open"):
        runner.store  # noqa: B018


def test_each_runner_starts_with_no_messages_and_an_empty_store(shop: Shop) -> None:
    for _ in range(2):
        with InlineRunner(shop.pikku) as runner:
            shop.add.delay(5, 5)
            assert runner.store.list_runs() == []  # journaled, not written yet
        # The runner closed with that message unrun: the next one must not run it.
    with InlineRunner(shop.pikku) as runner:
        assert runner.run_until_idle() == 0
        assert runner.store.list_runs() == []
    assert shop.calls["add"] == 0


def test_a_workflow_of_another_pikku_is_refused(
    shop: Shop, runner: InlineRunner, tmp_path: Path
) -> None:
    other = Shop(tmp_path / "other.db")
    try:
        with pytest.raises(ConfigurationError, match="not declared on this runner"):
            runner.start(other.checkout, order_id=1)
    finally:
        other.pikku.uninstall()


# --- the pytest plugin ---------------------------------------------------------------------


@pytest.fixture
def pikku_app(shop: Shop) -> PikkuCelery:
    return shop.pikku


def test_the_pikku_inline_fixture_runs_the_app_of_pikku_app(
    shop: Shop, pikku_inline: InlineRunner
) -> None:
    shop.fixed = True
    pikku_inline.fast_forward = True  # the checkout's hour of cool-off passes at once
    assert pikku_inline.pikku is shop.pikku
    assert pikku_inline.start(shop.checkout, order_id=6).status == "completed"


def test_the_plugin_is_loaded_by_its_entry_point(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n')
    pytester.makeconftest(
        """
        import pytest
        from celery import Celery
        from pikku_celery import PikkuCelery

        app = Celery("plugged", broker="redis://127.0.0.1:9/0", set_as_current=False)
        pikku = PikkuCelery(app, "sqlite:///never.db")

        @pikku.step(shared=False)
        def double(n):
            return n * 2

        @pikku.workflow("twice")
        def twice(ctx, n):
            return ctx.do("double", double, ctx.do("first", double, n))

        @pytest.fixture
        def pikku_app():
            return pikku
        """
    )
    pytester.makepyfile(
        """
        import conftest

        def test_twice(pikku_inline):
            run = pikku_inline.start(conftest.twice, 3)
            assert (run.status, run.output) == ("completed", 12)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "never.db").exists()


def test_without_pikku_app_the_fixture_says_what_to_define(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_it(pikku_inline):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*define a fixture named pikku_app*"])
