from __future__ import annotations

import types

import pikku_celery
from pikku_celery import errors


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
    assert "insert_step_state" in str(errors.StepNotFound(run_id="r", step_name="s"))
    assert issubclass(errors.StoreUnavailable, errors.Transient)
