"""The compose stack, the Dockerfile and the Procfile, checked offline (no Docker engine)."""

from __future__ import annotations

import subprocess

from tests.deploy.conftest import (
    COMPOSE_FILE,
    DOCKER,
    ROOT,
    compose,
    env_example,
    procfile,
    tool,
)

ALWAYS_UP = {"postgres", "redis", "migrate", "worker", "beat", "flower", "dashboard"}


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False
    )


def test_the_compose_file_follows_the_compose_specification() -> None:
    checked = run(
        tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_compose_up_starts_the_services_in_order() -> None:
    services = compose()["services"]
    default = {name for name, s in services.items() if not s.get("profiles")}
    assert default == ALWAYS_UP  # the test-only services wait for --profile test
    for name, service in services.items():
        for needed, rule in service.get("depends_on", {}).items():
            assert needed in services, (name, needed)
            condition = rule["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[needed], (name, needed)
            else:
                # A one-shot step: it must end, and not be restarted when it has.
                assert condition == "service_completed_successfully", (name, needed)
                assert services[needed]["restart"] == "no", needed
    # The schema is current before anything that reads or writes it starts.
    for name in ("worker", "beat", "dashboard"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
    assert services["migrate"]["command"] == ["pikku-celery", "db", "upgrade"]
    for name in ALWAYS_UP - {"migrate"}:
        assert "healthcheck" in services[name], name
    # Ports are published on this machine only.
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_the_tests_service_points_the_suite_at_the_stack() -> None:
    tests = compose()["services"]["tests"]
    assert tests["command"] == ["make", "test"]
    env = tests["environment"]
    assert "@postgres:5432/" in env["PIKKU_TEST_POSTGRES_URL"]
    assert env["PIKKU_TEST_REDIS_URL"] == "redis://redis:6379"
    assert "@rabbitmq:5672/" in env["PIKKU_TEST_AMQP_URL"]
    assert tests["build"]["target"] == "tests"


def test_the_dockerfile_passes_hadolint() -> None:
    linted = run(
        tool("hadolint"),
        "--no-color",
        "--config",
        str(DOCKER / "hadolint.yaml"),
        str(DOCKER / "Dockerfile"),
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_image_runs_as_a_user_and_the_default_stage_is_the_app() -> None:
    lines = [line.split() for line in (DOCKER / "Dockerfile").read_text().splitlines()]
    stages = [words[-1] for words in lines if words and words[0] == "FROM"]
    assert stages[-1] == "app"
    users = [words[1] for words in lines if words and words[0] == "USER"]
    assert users and all(user.split(":")[0] not in ("root", "0") for user in users)


def test_every_procfile_process_runs_what_its_compose_service_runs() -> None:
    services = compose()["services"]
    processes = procfile()
    assert set(processes) == {"worker", "beat", "flower", "dashboard"}
    for name, command in processes.items():
        assert command == services[name]["command"], name


def test_env_example_sets_what_the_stack_sets() -> None:
    """Honcho's .env and compose's environment name the same settings."""
    example = env_example()
    services = compose()["services"]
    for name in ("worker", "flower", "dashboard"):
        for variable in services[name]["environment"]:
            assert variable in example, (name, variable)
    assert example["PIKKU_CELERY_APP"] == "pikku_celery.demo.app:pikku"
    assert example["PIKKU_DASHBOARD_PASSWORD"] == ""  # read-only until someone sets one
