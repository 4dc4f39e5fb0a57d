# One entry point for people and CI. `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test test-quick test-partitioned test-lowest test-docker docs check format bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/pikku-celery demo

# Two processes (pytest-xdist), each test file in one; JOBS=0 runs in one process.
JOBS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile $(PYTEST_ARGS)

# A contributor's loop: the unit and integration suites (PostgreSQL, Redis; no workers).
test-quick: $(STAMP)
	$(BIN)/python -m pytest tests/unit tests/integration $(PYTEST_ARGS)

# The integration suite's PostgreSQL tests, and real workers running canvases, retries,
# chords, durable workflows and replaced tasks, with the suite's database laid out by day
# (the partitioned layout, `pikku-celery db upgrade --layout partitioned`).
PARTITIONED_ACCEPTANCE = tests/acceptance/test_celery_worker.py \
	tests/acceptance/test_result_chords.py tests/acceptance/test_workflows.py \
	tests/acceptance/test_durable_features.py tests/acceptance/test_replace.py
test-partitioned: $(STAMP)
	PIKKU_TEST_LAYOUT=partitioned $(BIN)/python -m pytest -n $(JOBS) --dist loadfile \
		tests/integration $(PARTITIONED_ACCEPTANCE) -k "not sqlite" $(PYTEST_ARGS)

# The unit and integration suites and a slice of the acceptance suite, in a virtualenv of their
# own with the lowest versions pyproject.toml allows (noxfile.py, constraints/lowest.txt).
test-lowest: $(STAMP)
	$(BIN)/nox -s lowest

# Only the docker suite (tests/docker: pytest-celery's containers and the compose stack). It
# needs a docker engine; without an image registry, run docker/build-local-images.sh first.
test-docker: $(STAMP)
	$(BIN)/python -m pytest tests/docker $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on a broken link or
# anchor. Nothing is fetched while it builds.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

check: $(STAMP)
	$(BIN)/ruff check pikku_celery tests bench docs/hooks
	$(BIN)/ruff format --check pikku_celery tests bench docs/hooks
	$(BIN)/mypy
	$(BIN)/mypy -p bench
	$(BIN)/mypy docs/hooks
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff check --fix pikku_celery tests bench docs/hooks
	$(BIN)/ruff format pikku_celery tests bench docs/hooks

bench: $(STAMP)
	$(BIN)/python -m bench.store $(BENCH_ARGS)

# The store bench in its quick mode: small numbers, under a minute.
bench-quick: $(STAMP)
	$(BIN)/python -m bench.store --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache build dist site *.egg-info
