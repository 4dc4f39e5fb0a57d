from __future__ import annotations

import ast
import types
from importlib import metadata
from pathlib import Path

import pytest

import pikku_celery
from pikku_celery import errors
from pikku_celery.cli import main
from pikku_celery.store import PUBLIC_METHODS, WorkflowStore


def test_all_lists_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(pikku_celery).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(pikku_celery.__all__) == (public - {"annotations"}) | {"__version__"}
    assert pikku_celery.__all__ == sorted(pikku_celery.__all__)


def test_every_error_has_one_root_and_a_message_that_says_what_to_do() -> None:
    classes = [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, Exception)
    ]
    assert classes
    for cls in classes:
        assert issubclass(cls, errors.PikkuCeleryError), cls
        assert cls.__doc__, cls
    assert str(errors.SchemaNotCurrent()).endswith("run `pikku-celery db upgrade`.")
    assert "`pikku-celery runs show r`" in str(errors.StepNotFound(run_id="r", step_name="s"))
    assert issubclass(errors.StoreUnavailable, errors.Transient)


def test_every_error_is_exported_from_the_package() -> None:
    classes = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, Exception)
    }
    assert classes <= set(errors.__all__)
    assert set(errors.__all__) <= set(pikku_celery.__all__)


def test_every_module_says_what_it_exports() -> None:
    package = Path(pikku_celery.__file__).parent
    # Alembic revisions are scripts that alembic loads by path, not modules to import from.
    modules = [p for p in package.rglob("*.py") if "migrations" not in p.parts]
    missing = [
        str(path.relative_to(package))
        for path in modules
        if not any(
            isinstance(node, ast.Assign | ast.AnnAssign)
            and any(
                getattr(target, "id", None) == "__all__"
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )
            for node in ast.parse(path.read_text()).body
        )
    ]
    assert missing == []


def test_the_store_face_offers_what_users_read_and_nothing_the_mirror_writes() -> None:
    """What a user's code, the CLI and the dashboard call; the mirror's, the engine's and the
    reaper's writes are reached through the store's operations, not its face."""
    methods = {
        name
        for name, value in vars(WorkflowStore).items()
        if callable(value) or isinstance(value, staticmethod)
        if not name.startswith("_")
    }
    assert methods == set(PUBLIC_METHODS)
    assert sorted(PUBLIC_METHODS) == sorted(
        [
            "init",
            "distribute",
            "schema_revision",
            "latest_schema_revision",
            "close",
            "dispose_after_fork",
            "transaction",
            "create_run",
            "get_run",
            "list_runs",
            "delete_run",
            "update_run_state",
            "get_run_state",
            "get_step",
            "get_step_state",
            "list_step_states",
            "get_run_history",
            "list_events",
            "result_states",
            "get_workflow_version",
            "run_counts",
            "attempt_counts",
            "attempt_totals",
            "count_runs",
            "search_runs",
            "workflow_names",
            "count_open_steps",
            "lost_steps_by_run",
            "oldest_running_attempt_age",
            "replica_lag",
            "count_prunable",
            "count_prunable_runs",
            "prune_batch",
            "prune",
        ]
    )
    for retired in ("set_step_result", "insert_step_state", "schedule_step", "apply_batch"):
        assert not hasattr(WorkflowStore, retired), retired
    assert WorkflowStore.__doc__ is not None
    assert all(f"``{name}``" in WorkflowStore.__doc__ for name in PUBLIC_METHODS)


def test_the_version_is_the_installed_metadatas_and_the_command_prints_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert pikku_celery.__version__ == metadata.version("pikku-celery")
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"pikku-celery {pikku_celery.__version__}\n"
