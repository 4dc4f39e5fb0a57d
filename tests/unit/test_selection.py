"""Which tasks the mirror records: the default opt-in, mirror="all", its exclude list."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, shared_task

from pikku_celery import PikkuCelery, WorkflowTask
from pikku_celery.errors import ConfigurationError
from pikku_celery.integration import signals as pikku_signals
from pikku_celery.integration.installed import installed_on
from pikku_celery.integration.selection import (
    ENV_MIRROR,
    ENV_MIRROR_EXCLUDE,
    MIRROR_ALL,
    MIRROR_STEPS,
    TaskSelection,
)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("picks", broker="memory://", set_as_current=False)

    @app.task(name="picks.plain", shared=False)
    def plain() -> None:
        return None

    @app.task(name="picks.noisy_ping", shared=False)
    def noisy_ping() -> None:
        return None

    @app.task(name="picks.decorated", base=WorkflowTask, shared=False)
    def decorated() -> None:
        return None

    @app.task(name="picks.named", base=WorkflowTask, pikku_step_name="by-hand", shared=False)
    def named() -> None:
        return None

    yield app
    installed = installed_on(app)  # what a test made on it
    if installed is not None:
        pikku_signals.uninstall(installed)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_MIRROR, raising=False)
    monkeypatch.delenv(ENV_MIRROR_EXCLUDE, raising=False)


def names(selection: TaskSelection, app: Celery) -> dict[str, str | None]:
    """The decisions for this file's tasks and Celery's (other shared tasks may be there)."""
    return {
        name: selection.step_name(task)
        for name, task in app.tasks.items()
        if name.startswith(("picks.", "celery."))
    }


def test_by_default_only_workflow_tasks_are_mirrored(app: Celery) -> None:
    selection = TaskSelection.configured(app.conf)
    assert selection.mode == MIRROR_STEPS
    assert not selection.mirrors_all
    mirrored = {name: step for name, step in names(selection, app).items() if step}
    assert mirrored == {"picks.decorated": "decorated", "picks.named": "by-hand"}


def test_all_mirrors_plain_tasks_under_the_last_part_of_their_name(app: Celery) -> None:
    selection = TaskSelection(MIRROR_ALL)
    assert selection.step_name(app.tasks["picks.plain"]) == "plain"
    assert selection.step_name(app.tasks["picks.named"]) == "by-hand"


def test_celery_and_pikku_plumbing_is_never_a_step(app: Celery, tmp_path: Path) -> None:
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'p.db'}", mirror="all")
    plumbing = [name for name in app.tasks if name.startswith(("celery.", "pikku_celery."))]
    assert {"celery.chord_unlock", "celery.backend_cleanup", "pikku_celery.reap"} <= set(plumbing)
    assert {"pikku_celery.orchestrate", "pikku_celery.wake"} <= set(plumbing)
    for name in plumbing:
        assert pikku.selection.step_name(app.tasks[name]) is None, name
    assert pikku.selection.step_name(app.tasks["picks.plain"]) == "plain"


def test_exclude_takes_names_and_globs(app: Celery) -> None:
    selection = TaskSelection(MIRROR_ALL, exclude=["picks.noisy_*", "picks.plain"])
    assert names(selection, app) == {
        **{name: None for name in app.tasks if name.startswith("celery.")},
        "picks.plain": None,
        "picks.noisy_ping": None,
        "picks.decorated": "decorated",  # asked for by its decorator: a step whatever the list
        "picks.named": "by-hand",
    }


def test_globs_match_the_whole_name_and_case(app: Celery) -> None:
    selection = TaskSelection(MIRROR_ALL, exclude=["noisy_*", "PICKS.PLAIN"])
    assert selection.mirrors(app.tasks["picks.noisy_ping"])
    assert selection.mirrors(app.tasks["picks.plain"])


def test_a_decision_is_made_once_per_task_name(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    selection = TaskSelection(MIRROR_ALL, exclude=["picks.noisy_*"])
    calls: list[str] = []
    decide = selection._decide

    def counted(task: Any, name: str) -> str | None:
        calls.append(name)
        return decide(task, name)

    monkeypatch.setattr(selection, "_decide", counted)
    for _ in range(3):
        selection.step_name(app.tasks["picks.plain"])
        selection.step_name(app.tasks["picks.noisy_ping"])
    assert calls == ["picks.plain", "picks.noisy_ping"]


def test_a_shared_task_is_mirrored_under_all() -> None:
    @shared_task(name="picks.shared_hello")
    def hello() -> str:
        return "hi"

    app = Celery("shared", broker="memory://", set_as_current=False)
    selection = TaskSelection(MIRROR_ALL)
    assert selection.step_name(app.tasks["picks.shared_hello"]) == "shared_hello"
    assert TaskSelection(MIRROR_STEPS).step_name(app.tasks["picks.shared_hello"]) is None


def test_the_argument_wins_over_app_conf_which_wins_over_the_environment(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_MIRROR, "all")
    monkeypatch.setenv(ENV_MIRROR_EXCLUDE, "picks.plain, picks.noisy_*")
    from_env = TaskSelection.configured(app.conf)
    assert (from_env.mode, from_env.exclude) == ("all", ("picks.plain", "picks.noisy_*"))

    app.conf.pikku_mirror = "steps"
    app.conf.pikku_mirror_exclude = ["picks.decorated"]
    assert TaskSelection.configured(app.conf).mode == "steps"

    app.conf.pikku_mirror = "all"
    assert TaskSelection.configured(app.conf).exclude == ("picks.decorated",)

    chosen = TaskSelection.configured(app.conf, "all", ["other.*"])
    assert (chosen.mode, chosen.exclude) == ("all", ("other.*",))
    assert TaskSelection.configured(app.conf, "steps").mode == "steps"


def test_pikku_celery_takes_mirror_and_exclude(app: Celery, tmp_path: Path) -> None:
    default = PikkuCelery(app, f"sqlite:///{tmp_path / 'd.db'}")
    assert default.selection.mode == "steps"
    pikku = PikkuCelery(
        app, f"sqlite:///{tmp_path / 'a.db'}", mirror="all", exclude=["picks.noisy_*"]
    )
    assert (pikku.selection.mode, pikku.selection.exclude) == ("all", ("picks.noisy_*",))
    assert pikku_signals.registry[id(app)] is pikku


def test_modes_are_read_in_any_case_and_spacing(app: Celery) -> None:
    app.conf.pikku_mirror = " ALL "
    assert TaskSelection.configured(app.conf).mode == "all"


@pytest.mark.parametrize("value", ["everything", "", "WorkflowTask", 1, True])
def test_a_bad_mode_says_which_values_to_use(app: Celery, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"mirror= is 'steps' .* or 'all' .*not"):
        TaskSelection.configured(app.conf, value)


def test_a_bad_mode_in_app_conf_or_the_environment_names_where_it_is(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_MIRROR, "any")
    with pytest.raises(ConfigurationError, match=r"^PIKKU_MIRROR is 'steps'.*not 'any'"):
        TaskSelection.configured(app.conf)
    app.conf.pikku_mirror = "every"
    with pytest.raises(ConfigurationError, match=r"^app.conf.pikku_mirror is 'steps'"):
        TaskSelection.configured(app.conf)


def test_pikku_celery_rejects_a_bad_mode_before_it_installs_anything(
    app: Celery, tmp_path: Path
) -> None:
    with pytest.raises(ConfigurationError, match="'steps'"):
        PikkuCelery(app, f"sqlite:///{tmp_path / 'b.db'}", mirror="everything")
    assert id(app) not in pikku_signals.registry


@pytest.mark.parametrize("value", [3, [1, "picks.*"], [None]])
def test_a_bad_exclude_list_says_what_it_should_be(app: Celery, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"list of task names or globs"):
        TaskSelection.configured(app.conf, "all", value)


def test_exclude_without_all_is_refused_rather_than_ignored(app: Celery) -> None:
    with pytest.raises(ConfigurationError, match="only applies to mirror='all'"):
        TaskSelection.configured(app.conf, None, ["picks.*"])


def test_a_string_is_one_glob_or_a_comma_separated_list(app: Celery) -> None:
    assert TaskSelection(MIRROR_ALL, "picks.noisy_*").exclude == ("picks.noisy_*",)
    assert TaskSelection(MIRROR_ALL, "a.*, b.c,").exclude == ("a.*", "b.c")
