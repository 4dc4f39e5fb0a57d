"""Suspended runs across a deploy that edits their workflows: real prefork workers, Redis,
PostgreSQL. The runs sleep under the original code; the worker stops; a worker of the
edited code starts, and its start replays them (``evolving_app``)."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from tests.acceptance.conftest import wait_until, worker_running


@pytest.fixture(scope="module")
def evolving(shop: ModuleType) -> ModuleType:
    """Imported once the shop has set the session's broker, queue and database."""
    return importlib.import_module("tests.acceptance.evolving_app")


def test_suspended_runs_go_on_after_an_edit_unless_their_steps_were_reordered(
    evolving: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("versions")
    store = evolving.pikku.store
    nap = 6.0  # long enough to outlast the first worker, short enough to wait for
    with worker_running(evolving, "redis", tmp) as first:
        runs = {
            name: getattr(evolving, name).start(3, nap)
            for name in ("restyled", "extended", "reordered")
        }
        wait_until(
            lambda: all(store.get_run(r).status == "suspended" for r in runs.values()),
            what="each run asleep in its nap",
        )
    assert "VERSION_CONFLICT" not in first.log.read_text()
    with worker_running(evolving, "redis", tmp, extra_env={"EVOLVING_VARIANT": "edited"}) as second:
        done = {name: second.wait_for_run(run_id, timeout=60) for name, run_id in runs.items()}
        log = second.log.read_text()
    # Comments, a docstring and layout: the same version, so nothing to judge.
    assert (done["restyled"].status, done["restyled"].output) == ("completed", [4, 5])
    # A new step after the recorded ones: the edited code took the run over.
    assert (done["extended"].status, done["extended"].output) == ("completed", [4, 104, 105])
    assert done["extended"].graph_hash == evolving.extended.version  # who started it
    # The first two steps swapped: the run fails, naming the step, and nothing more ran.
    reordered = done["reordered"]
    assert reordered.status == "failed" and reordered.error is not None
    assert reordered.error["code"] == "VERSION_CONFLICT"
    assert reordered.error["step"] == "second"
    assert "was recorded after 'first'" in reordered.error["message"]
    assert [s.step_name for s in store.list_step_states(reordered.run_id)] == [
        "first",
        "second",
        "nap",
    ]
    assert "version_undecided" not in log and "cannot tell whether" not in log
