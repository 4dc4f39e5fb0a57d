"""The inline runner's clock: messages with an ETA wait for it, and the test moves it.

A wait's timeout, a durable sleep's wake-up and a retry's countdown are messages
with an ETA; the runner holds each until its clock reaches it, so a test decides
when time passes (``runner.advance``) and never waits for real time.
"""

from __future__ import annotations

import datetime as dt
import re
import textwrap
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from pikku_celery import EventTimeout, PikkuCelery, WorkflowTask
from pikku_celery.errors import ConfigurationError
from pikku_celery.testing import InlineRunner
from pikku_celery.workflows import context
from pikku_celery.workflows.definition import Workflow

pytest_plugins = ["pytester"]

NOWHERE = "redis://127.0.0.1:9/0"
THREE_DAYS = 3 * 24 * 3600
# The inline runner's page of the documentation site.
TESTING_PAGE = Path(__file__).resolve().parents[2] / "docs" / "testing" / "index.md"


class Refunds:
    """The docs' refund pattern (a wait for approval with a timeout), and a sleep."""

    def __init__(self, database: Path) -> None:
        self.app = Celery(f"refunds_{uuid.uuid4().hex[:8]}", broker=NOWHERE, set_as_current=False)
        self.pikku = PikkuCelery(self.app, f"sqlite:///{database}")
        self.calls: Counter[str] = Counter()
        self.card_failures = 0
        self.card_times: list[dt.datetime] = []
        pikku, calls = self.pikku, self.calls

        @pikku.step(shared=False)
        def print_label(order_id: int) -> str:
            calls["label"] += 1
            return f"label-{order_id}"

        @pikku.step(shared=False)
        def pay_back(order_id: int, amount: int) -> int:
            calls["pay_back"] += 1
            return amount

        @pikku.step(shared=False)
        def keep_label(order_id: int) -> str:
            calls["keep_label"] += 1
            return f"kept label-{order_id}"

        @pikku.step(retries=3, retry_delay=2, shared=False)
        def card(order_id: int) -> str:
            calls["card"] += 1
            self.card_times.append(self.app.now())
            if calls["card"] <= self.card_failures:
                raise ConnectionError(f"attempt {calls['card']} failed")
            return f"charged {order_id}"

        @self.app.task(base=WorkflowTask, bind=True, max_retries=3, shared=False)
        def later(task: Any, countdown: float) -> int:
            calls["later"] += 1
            if task.request.retries < 2:
                raise task.retry(countdown=countdown)
            return int(task.request.retries)

        @pikku.workflow("ship-order")
        def ship_order(ctx: Any, order_id: int) -> str:
            return str(ctx.do("label", print_label, order_id))

        @pikku.workflow("refund")
        def refund(ctx: Any, order_id: int, amount: int) -> dict[str, Any]:
            shipped = ctx.do("ship", ship_order, order_id)
            try:
                decision = ctx.wait_for("approval", timeout=THREE_DAYS)
            except EventTimeout:
                ctx.do("keep-label", keep_label, order_id)  # the compensation
                return {"refunded": 0, "why": "nobody decided within 3 days"}
            ctx.do("pay-back", pay_back, order_id, amount)
            return {"refunded": amount, "approved_by": decision["by"], "label": shipped}

        @pikku.workflow("cool-off")
        def cool_off(ctx: Any, order_id: int) -> str:
            ctx.sleep("cool-off", seconds=30)
            return str(ctx.do("label", print_label, order_id))

        @pikku.workflow("charging")
        def charging(ctx: Any, order_id: int) -> str:
            return str(ctx.do("card", card, order_id))

        self.refund: Workflow = refund
        self.cool_off: Workflow = cool_off
        self.charging: Workflow = charging
        self.later = later


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Refunds]:
    shop = Refunds(tmp_path / "production.db")
    yield shop
    shop.pikku.uninstall()


@pytest.fixture
def runner(shop: Refunds) -> Iterator[InlineRunner]:
    with InlineRunner(shop.pikku) as runner:
        yield runner


def test_a_wait_with_a_timeout_leaves_the_run_suspended_when_the_clock_stands(
    shop: Refunds, runner: InlineRunner
) -> None:
    began = runner.now
    run = runner.start(shop.refund, order_id=7, amount=40)  # never NeverIdle
    assert run.status == "suspended"
    wait = run.steps["approval"]
    assert wait.status == "scheduled"
    assert run.steps["ship"].status == "succeeded"
    assert runner.now == began
    assert runner.run_until_idle() == 0  # the replay at the deadline waits for the clock
    assert runner.result(run.run_id).status == "suspended"


def test_advancing_past_the_timeout_raises_event_timeout_and_compensates(
    shop: Refunds, runner: InlineRunner
) -> None:
    run = runner.start(shop.refund, order_id=7, amount=40)
    runner.advance(THREE_DAYS - 1)
    assert runner.result(run.run_id).status == "suspended"
    assert shop.calls["keep_label"] == 0
    runner.advance(1)
    run = runner.result(run.run_id)
    assert (run.status, run.output) == (
        "completed",
        {"refunded": 0, "why": "nobody decided within 3 days"},
    )
    wait = run.steps["approval"]
    assert wait.status == "failed"
    assert wait.error is not None and wait.error["code"] == EventTimeout.code
    assert run.steps["keep-label"].status == "succeeded"
    assert dict(shop.calls) == {"label": 1, "keep_label": 1}


def test_an_event_sent_before_the_deadline_is_taken(shop: Refunds, runner: InlineRunner) -> None:
    run = runner.start(shop.refund, order_id=7, amount=40)
    runner.advance(24 * 3600)
    run = runner.send(run.run_id, "approval", {"approved": True, "by": "ana"})
    assert (run.status, run.output) == (
        "completed",
        {"refunded": 40, "approved_by": "ana", "label": "label-7"},
    )
    assert run.steps["approval"].result == {"approved": True, "by": "ana"}
    runner.advance(THREE_DAYS)  # the replays at the old deadline find the run settled
    run = runner.result(run.run_id)
    assert run.status == "completed" and run.steps["approval"].status == "succeeded"
    assert dict(shop.calls) == {"label": 1, "pay_back": 1}


def test_a_durable_sleep_waits_for_the_clock(shop: Refunds, runner: InlineRunner) -> None:
    began = runner.now
    run = runner.start(shop.cool_off, order_id=3)
    assert run.status == "suspended"
    sleep = run.steps["cool-off"]
    assert sleep.status == "scheduled"
    assert sleep.attempts[0].eta == began + dt.timedelta(seconds=30)
    runner.advance(29.5)
    assert runner.result(run.run_id).status == "suspended"
    assert shop.calls["label"] == 0
    assert runner.advance(0.5) > 0
    run = runner.result(run.run_id)
    assert (run.status, run.output) == ("completed", "label-3")
    assert run.steps["cool-off"].status == "succeeded"
    assert runner.now == began + dt.timedelta(seconds=30)


def test_retry_delays_pass_on_the_clock_one_eta_after_the_other(
    shop: Refunds, runner: InlineRunner
) -> None:
    shop.card_failures = 10
    began = runner.now
    run = runner.start(shop.charging, order_id=1)
    assert run.status == "running"
    assert run.steps["card"].attempt_statuses == ["failed", "scheduled"]
    # Ten seconds hold the three retries, two seconds apart: each is published when the
    # one before it runs, so the clock stops at every ETA on its way.
    runner.advance(10)
    run = runner.result(run.run_id)
    assert run.status == "failed"
    assert run.steps["card"].attempt_statuses == ["failed"] * 4
    assert shop.card_times == [began + dt.timedelta(seconds=s) for s in (0, 2, 4, 6)]
    assert shop.calls["card"] == 4
    assert runner.now == began + dt.timedelta(seconds=10)


def test_a_plain_tasks_countdown_waits_for_the_clock(shop: Refunds, runner: InlineRunner) -> None:
    run = runner.delay(shop.later, 60)
    assert run.status == "running"
    assert run.steps["later"].attempt_statuses == ["failed", "scheduled"]
    runner.advance(59)
    assert shop.calls["later"] == 1
    runner.advance(61)
    run = runner.result(run.run_id)
    assert (run.status, run.output) == ("completed", 2)
    assert shop.calls["later"] == 3


def test_a_countdown_of_zero_runs_at_once(shop: Refunds, runner: InlineRunner) -> None:
    run = runner.delay(shop.later, 0)
    assert (run.status, run.output) == ("completed", 2)
    assert run.steps["later"].attempt_statuses == ["failed", "failed", "succeeded"]


def test_fast_forward_moves_the_clock_to_each_eta_at_once(shop: Refunds) -> None:
    with InlineRunner(shop.pikku, fast_forward=True) as runner:
        began = runner.now
        run = runner.start(shop.refund, order_id=7, amount=40)
        assert (run.status, run.output) == (
            "completed",
            {"refunded": 0, "why": "nobody decided within 3 days"},
        )
        assert runner.now == began + dt.timedelta(seconds=THREE_DAYS)
        run = runner.start(shop.cool_off, order_id=3)
        assert (run.status, run.output) == ("completed", "label-3")


def test_the_clock_is_what_replays_and_celery_read_while_the_runner_is_open(
    shop: Refunds,
) -> None:
    system_clock = context.clock
    with InlineRunner(shop.pikku) as runner:
        runner.advance(dt.timedelta(hours=5))
        assert context.clock() == runner.now
        assert shop.app.now() == runner.now
        assert runner.now.tzinfo is not None
        with pytest.raises(ConfigurationError, match="forward"):
            runner.advance(-1)
    assert context.clock is system_clock
    assert "now" not in vars(shop.app)  # Celery's own app.now again
    assert abs(shop.app.now() - dt.datetime.now(dt.timezone.utc)) < dt.timedelta(minutes=1)


def test_messages_held_for_the_clock_do_not_outlive_the_runner(shop: Refunds) -> None:
    with InlineRunner(shop.pikku) as runner:
        assert runner.start(shop.cool_off, order_id=1).status == "suspended"
    with InlineRunner(shop.pikku) as runner:
        assert runner.advance(3600) == 0
    assert shop.calls["label"] == 0


# --- the testing page's examples (docs/testing/index.md), run as written ---------------

SHOP = '''
"""The shop the testing page tests: the docs' charge, ship, checkout and refund."""
import uuid

from celery import Celery
from pikku_celery import EventTimeout, PikkuCelery, StepFailed, WorkflowTask, current_step

app = Celery("shop", broker="redis://127.0.0.1:9/0")
pikku = PikkuCelery(app, "sqlite:///never.db")
PAYMENTS_UP = True


@pikku.step(retries=3, retry_delay=2)
def charge(order_id):
    if not PAYMENTS_UP:
        raise ConnectionError("the payment gateway is down")
    return {"id": f"receipt-{order_id}"}


@app.task(base=WorkflowTask, bind=True, max_retries=5)
def ship(self, order_id):
    return f"shipped {order_id}"


@pikku.step
def send_email(receipt):
    return f"mailed {receipt['id']}"


@pikku.step
def make_invoice(receipt):
    return f"invoice for {receipt['id']}"


@pikku.step
def refund_fee(order_id):
    raise RuntimeError("no fee to refund")


@pikku.step
def apologise(order_id):
    return "sorry"


@pikku.workflow("checkout")
def checkout(ctx, order_id):
    receipt = ctx.do("charge", charge, order_id)
    ctx.sleep("cool-off", seconds=30)
    token = ctx.do("token", lambda: uuid.uuid4().hex)
    email, invoice = ctx.do_all(
        [("email", send_email, receipt), ("invoice", make_invoice, receipt)]
    )
    ctx.state["receipt_id"] = receipt["id"]
    try:
        ctx.do("refund-fee", refund_fee, order_id)
    except StepFailed:
        ctx.do("apologise", apologise, order_id)
    return {"receipt": receipt, "token": token}


@pikku.step
def print_label(order_id):
    return f"label-{order_id}"


@pikku.workflow("ship-order")
def ship_order(ctx, order_id):
    return ctx.do("label", print_label, order_id)


@pikku.workflow("refund")
def refund(ctx, order_id, amount):
    shipped = ctx.do("ship", ship_order, order_id)
    try:
        decision = ctx.wait_for("approval", timeout=3 * 24 * 3600)
    except EventTimeout:
        return {"refunded": 0, "why": "nobody decided within 3 days"}
    if ctx.branch("approved" if decision["approved"] else "declined") == "declined":
        return {"refunded": 0, "declined_by": decision["by"]}
    ctx.do("pay-back", pay_back, order_id, amount)
    return {"refunded": amount, "approved_by": decision["by"], "label": shipped}


@pikku.step(retries=3)
def pay_back(order_id, amount):
    return current_step().idempotency_key
'''


def _page_snippets() -> list[str]:
    """The Python blocks of docs/testing/index.md, as the page has them."""
    section = TESTING_PAGE.read_text(encoding="utf-8")
    assert section.startswith("# Testing your workflows without a broker"), section[:80]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def test_the_testing_pages_examples_run_as_written(pytester: pytest.Pytester) -> None:
    with_pytest, without_pytest = _page_snippets()
    conftest, tests = with_pytest.split("# test_checkout.py\n")
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n')
    pytester.makepyfile(shop=SHOP)
    pytester.makeconftest(conftest)
    # The page's test module uses the `shop` its conftest imports.
    pytester.makepyfile(test_checkout=f"import shop\n\n\n{tests}")
    body = textwrap.indent(without_pytest, "    ")
    pytester.makepyfile(test_inline=f"import shop\n\n\ndef test_without_pytest():\n{body}")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    assert not (pytester.path / "never.db").exists()
