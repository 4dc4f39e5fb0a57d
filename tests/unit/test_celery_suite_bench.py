"""The Celery-suite bench's own parts: its backend mode's URL alias, which of Celery's tests
it counts as gated on a Redis result backend, and how it compares two modes' outcomes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from celery import Celery

from bench.celery_suite.gates import gated_tests, redis_internals
from bench.celery_suite.outcomes import Outcome, differences, failing, tally
from bench.celery_suite.plugin import register_alias
from bench.celery_suite.report import classify
from bench.celery_suite.session import BACKEND_ALIAS, backend_url, redis_helpers_env
from pikku_celery import PikkuCelery
from pikku_celery.integration.backend import PikkuBackend


def _app(name: str) -> Celery:
    return Celery(name, broker="memory://", set_as_current=False)


def test_the_open_gates_url_starts_with_redis_and_is_the_pikku_backend(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'suite.db'}"
    url = backend_url(database, "open")
    assert url.startswith("redis")  # what the suite's gates ask of result_backend
    app = _app("alias")
    register_alias(app, BACKEND_ALIAS)
    app.conf.update(result_backend=url)
    pikku = PikkuCelery(app, database, mirror="all", journal_dir=str(tmp_path / "journal"))
    pikku.store.init()
    try:
        assert isinstance(app.backend, PikkuBackend)
        task_id = str(uuid.uuid4())
        app.backend.store_result(task_id, 42, "SUCCESS")
        assert app.AsyncResult(task_id).get(timeout=10) == 42
        assert pikku.store.results.get_many([task_id])[task_id].status == "SUCCESS"
    finally:
        pikku.uninstall()
        pikku.mirror.close()
        app.close()


def test_the_closed_gates_url_is_the_pikku_scheme(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'suite.db'}"
    app = _app("closed")
    app.conf.update(result_backend=backend_url(database, "closed"))
    assert app.conf.result_backend == f"pikku+{database}"
    assert isinstance(app.backend, PikkuBackend)
    app.close()


def test_the_alias_is_known_only_to_the_apps_it_was_registered_on(tmp_path: Path) -> None:
    registered, other = _app("registered"), _app("other")
    register_alias(registered, BACKEND_ALIAS)
    url = backend_url(f"sqlite:///{tmp_path / 'suite.db'}", "open")
    registered.conf.update(result_backend=url)
    other.conf.update(result_backend=url)
    assert isinstance(registered.backend, PikkuBackend)
    # Celery takes an unknown name for a module to import.
    with pytest.raises(ModuleNotFoundError, match=BACKEND_ALIAS):
        other.backend  # noqa: B018 - Celery makes the backend when it is first read
    registered.close()
    other.close()


def test_the_suites_own_redis_client_is_pointed_at_the_brokers_server() -> None:
    assert redis_helpers_env("redis://127.0.0.1:6395/0") == {
        "REDIS_HOST": "127.0.0.1",
        "REDIS_PORT": "6395",
    }
    assert redis_helpers_env("redis://") == {"REDIS_HOST": "localhost", "REDIS_PORT": "6379"}


def test_gates_are_unknown_values_refused() -> None:
    with pytest.raises(ValueError, match="gates"):
        backend_url("sqlite://", "ajar")


SUITE = """
import pytest

def test_gated_module_function(manager):
    if not manager.app.conf.result_backend.startswith("redis"):
        raise pytest.skip("Requires redis result backend.")

def test_redis_or_rpc(manager):
    if not manager.app.conf.result_backend.startswith(("redis", "rpc")):
        raise pytest.skip("Requires redis or rpc result backend.")

def test_asks_but_runs_anyway(manager):
    if manager.app.conf.result_backend.startswith("redis"):
        assert True

def test_other_backend(manager):
    if not manager.app.conf.result_backend.startswith("cache"):
        raise pytest.skip("cache")

class test_by_fixture:
    @pytest.fixture()
    def manager(self, manager):
        if not manager.app.conf.result_backend.startswith("redis"):
            raise pytest.skip("Requires redis result backend.")
        return manager

    def test_one(self, manager):
        pass

class test_mixed:
    def test_gated(self, manager):
        if not manager.app.conf.result_backend.startswith('redis'):
            raise pytest.skip('Requires redis result backend.')

    def test_free(self, manager):
        pass
"""


def test_gated_tests_are_those_that_skip_unless_the_backend_is_spelled_redis(
    tmp_path: Path,
) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_x.py").write_text(SUITE, encoding="utf-8")
    assert gated_tests(tmp_path, ["t/test_x.py::test_mixed"]) == {
        "t/test_x.py::test_gated_module_function",
        "t/test_x.py::test_redis_or_rpc",
        "t/test_x.py::test_by_fixture::test_one",
        "t/test_x.py::test_mixed::test_gated",
    }


def _outcomes(**results: str) -> dict[str, Outcome]:
    return {name: Outcome(name, result=result) for name, result in results.items()}


def test_differences_failing_and_tally() -> None:
    plain = _outcomes(a="passed", b="failed", c="passed", d="skipped")
    mine = _outcomes(a="passed", b="passed", c="failed", e="error")
    mine["a"].teardown_error = True
    assert [row[0] for row in differences(plain, mine)] == ["a", "b", "c", "d", "e"]
    assert failing(mine) == ["a", "c", "e"]
    counted = tally({**mine, "c[1]": Outcome("c[1]", result="failed")}, {"c", "e"})
    assert (counted["failed"], counted["error"], counted["passed"]) == (2, 1, 0)


def test_classify_names_redis_internals_closed_gates_and_the_rest() -> None:
    internal = (
        "t/integration/test_tasks.py::test_task_redis_result_backend::"
        "test_asyncresult_get_cancels_subscription"
    )
    assert redis_internals(internal + "[x]") is not None
    assert classify(internal, "passed", "failed", "", True).startswith("asserts Redis internals")
    assert classify("t::x", "passed", "skipped", "Requires redis result backend.", True) == (
        "skipped: requires a result_backend starting with 'redis' (gates closed)"
    )
    assert classify("t::x", "passed", "failed", "", True) == (
        "fails here, not plain (a redis-gated test)"
    )
    assert classify("t::x", "failed", "passed", "", False) == "fails plain, not here (not gated)"
    assert classify("t::x", "passed", "passed + teardown error", "", False) == (
        "fails here, not plain (not gated)"
    )
