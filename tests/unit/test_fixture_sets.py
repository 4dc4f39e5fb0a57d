"""A project that uses both fixture sets: the inline runner's and the docker containers'.

Each set names its fixtures apart (``pikku_app`` for ``pikku_inline``; ``pikku_docker_*``
for the containers), so overriding one set's fixture never hands the other set a value of
the wrong kind. No docker engine is needed: pytest-celery's ``celery_setup`` (the broker
and worker containers) is replaced by a stand-in, and only fixture resolution is checked.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SHOP = """
from celery import Celery

from pikku_celery import PikkuCelery

app = Celery("shop", broker="redis://127.0.0.1:9/0", set_as_current=False)
pikku = PikkuCelery(app, "sqlite:///never.db")


@pikku.step()
def double(n):
    return 2 * n
"""

CONFTEST = """
import types

import pytest

import shop

pytest_plugins = ["pikku_celery.testing.docker"]


@pytest.fixture
def pikku_app():  # the inline runner's app: a PikkuCelery
    return shop.pikku


@pytest.fixture(scope="session")
def pikku_docker_app_module():  # the containers' app: a module
    return shop


@pytest.fixture
def pikku_docker_postgres():  # no container: only resolution is checked
    return None


@pytest.fixture
def celery_setup():  # pytest-celery's containers, stood in for
    broker = types.SimpleNamespace(config=lambda: {"host_url": "memory://"})
    return types.SimpleNamespace(broker=broker)
"""

TESTS = """
import shop


def test_inline(pikku_inline):
    run = pikku_inline.delay(shop.double, 21)
    assert run.status == "completed" and run.output == 42


def test_docker_app(pikku_docker_app):
    assert pikku_docker_app is shop
    assert pikku_docker_app.double.name == "shop.double"
"""


def test_a_project_using_both_fixture_sets_gets_each_its_own(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n')
    pytester.makepyfile(shop=SHOP)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_both=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert not (pytester.path / "never.db").exists()


def test_the_two_fixture_sets_share_no_name() -> None:
    from pikku_celery.testing import docker, plugin

    def fixtures(module: object) -> set[str]:
        return {
            name
            for name, value in vars(module).items()
            if getattr(value, "_fixture_function_marker", None) is not None
            or type(value).__name__ == "FixtureFunctionDefinition"
        }

    inline, containers = fixtures(plugin), fixtures(docker)
    assert inline and containers
    assert not inline & containers
