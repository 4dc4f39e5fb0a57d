"""``WorkflowStore``: the store's face for users, the CLI and the dashboard.

One :class:`~pikku_celery.store.connector.Connector` (engine, dialect,
transactions, codec) handed to small operations, one per concept, each beside
its statements in ``store/sql/``. The face delegates what users read and do to
them; what only the mirror, the workflow engine or the reaper write is reached
through the operation itself (``store.batches``, ``store.attempts``,
``store.claims``, ``store.workflows``, ``store.leases``, ``store.reaping``).
Knows nothing of Celery.

A face may read on a streaming replica (``read_url``): its read methods then go
there, on operations of a second connector; every write, and every operation
reached by attribute, stays on the primary.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from pikku_celery.errors import RunNotFound, RunNotOnReplicaYet
from pikku_celery.schema import distribution, migrate
from pikku_celery.store.attempts import Attempts
from pikku_celery.store.batches import Batches
from pikku_celery.store.claims import Claims
from pikku_celery.store.codec import DEFAULT_MAX_PAYLOAD_BYTES
from pikku_celery.store.common import UNSET
from pikku_celery.store.connector import Connector
from pikku_celery.store.day_partitions import DayPartitions
from pikku_celery.store.engine import safe_url
from pikku_celery.store.leases import Leases
from pikku_celery.store.models import (
    RunEvent,
    StepAttempt,
    StepState,
    WorkflowRun,
    WorkflowVersion,
)
from pikku_celery.store.prune import DEFAULT_PRUNE_STATUSES, PruneCount, Pruning
from pikku_celery.store.reap import Reaping
from pikku_celery.store.replica import ReplicaLag, Replication
from pikku_celery.store.results import Results
from pikku_celery.store.runs import Runs
from pikku_celery.store.stats import AttemptCount, AttemptTotals, OpenStepCounts, Stats
from pikku_celery.store.versions import Versions
from pikku_celery.store.workflows import Workflows

__all__ = ["PUBLIC_METHODS", "UNSET", "WorkflowStore"]


class _Reads:
    """The operations the face's read methods use, on one connector: the primary's, or
    a read replica's."""

    def __init__(self, db: Connector) -> None:
        self.db = db
        attempts = Attempts(db)
        claims = Claims(db, attempts)
        self.runs = Runs(db)
        self.versions = Versions(db)
        self.claims = claims
        self.workflows = Workflows(db, attempts, claims)
        self.stats = Stats(db)
        self.partitions = DayPartitions(db)
        self.pruning = Pruning(db, self.partitions)
        self.results = Results(db)
        self.replication = Replication(db)


class WorkflowStore:
    """Reads and writes workflow runs, steps and attempts in one SQL database.

    ``WorkflowStore("postgresql://...")``, ``WorkflowStore("sqlite:///pikku.db")``
    or ``WorkflowStore(engine)``. Call :meth:`init` (or ``pikku-celery db
    upgrade``) once to bring the schema up to date.

    ``read_url`` (a URL or an engine) names a streaming replica of that database: the
    read methods below (and ``schema_revision``) read there, and so see what it has
    replayed; writes, ``transaction`` and the operations reached by attribute
    (``store.runs``, ``store.batches``, ...) always use the primary. ``get_run`` of a run
    the replica lacks while it is behind raises ``RunNotOnReplicaYet`` (a
    ``RunNotFound``) saying how far behind; ``replica_lag`` says it too.

    Its methods (``PUBLIC_METHODS``): the lifecycle (``init``, ``distribute``, ``schema_revision``,
    ``latest_schema_revision``, ``close``, ``dispose_after_fork``, ``transaction``);
    runs (``create_run``, ``get_run``, ``list_runs``, ``delete_run``,
    ``update_run_state``, ``get_run_state``); steps and attempts (``get_step``,
    ``get_step_state``, ``list_step_states``, ``get_run_history``, ``list_events``,
    ``result_states``, ``get_workflow_version``); counts (``run_counts``, ``attempt_counts``,
    ``attempt_totals``, ``count_runs``, ``search_runs``, ``workflow_names``,
    ``count_open_steps``, ``lost_steps_by_run``, ``oldest_running_attempt_age``,
    ``replica_lag``); pruning (``count_prunable``, ``count_prunable_runs``, ``prune_batch``,
    ``prune``).
    """

    def __init__(
        self,
        url_or_engine: str | sa.URL | sa.Engine | None = None,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        read_url: str | sa.URL | sa.Engine | None = None,
    ) -> None:
        self.db = Connector(url_or_engine, max_payload_bytes=max_payload_bytes)
        #: The read replica's connector; None when the face reads the primary.
        self.replica: Connector | None = (
            None if read_url is None else Connector(read_url, max_payload_bytes=max_payload_bytes)
        )
        self._reads = _Reads(self.replica or self.db)
        self.engine = self.db.engine
        self.dialect = self.db.sql.name
        self.codec = self.db.codec
        self.runs = Runs(self.db)
        self.versions = Versions(self.db)
        self.attempts = Attempts(self.db)
        self.claims = Claims(self.db, self.attempts)
        self.workflows = Workflows(self.db, self.attempts, self.claims)
        self.leases = Leases(self.db)
        self.reaping = Reaping(self.db, self.attempts)
        self.stats = Stats(self.db)
        #: The day partitions, where the tables are laid out by day (``db upgrade --layout
        #: partitioned``): made ahead and dropped by the workers' upkeep and by ``prune``.
        self.partitions = DayPartitions(self.db)
        self.pruning = Pruning(self.db, self.partitions)
        self.results = Results(self.db)
        self.batches = Batches(self.db, self.results)

    def __repr__(self) -> str:
        if self.replica is None:
            return f"WorkflowStore({safe_url(self.engine.url)!r})"
        reads = safe_url(self.replica.engine.url)
        return f"WorkflowStore({safe_url(self.engine.url)!r}, read_url={reads!r})"

    # --- lifecycle ---

    def init(self) -> None:
        """Bring the database to the latest schema; does nothing when it is already there."""
        self.db.upgrade()

    def distribute(self, shard_count: int | None = None) -> list[str]:
        """Lay the tables out on the Citus cluster whose coordinator this store writes to
        (``pikku_celery.schema.distribution``); returns the tables laid out now."""
        return distribution.distribute(self.engine, shard_count=shard_count)

    def schema_revision(self) -> str | None:
        """The schema revision the database is at (None: pikku-celery never ran there); of
        the read replica when there is one, the database the reads see."""
        return self._reads.db.schema_revision()

    @staticmethod
    def latest_schema_revision() -> str:
        return migrate.head_revision()

    def close(self) -> None:
        """Release the store's connections (an engine passed in is left to its owner)."""
        self.db.close()
        if self.replica is not None:
            self.replica.close()

    def dispose_after_fork(self) -> None:
        """Forget connections inherited from a parent process without closing them."""
        self.db.dispose_after_fork()
        if self.replica is not None:
            self.replica.dispose_after_fork()

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """A transaction to pass as ``conn=`` so several writes commit together.

        Failing to connect or to commit raises the same typed errors as any
        store call (``StoreUnavailable`` when the database cannot be reached).
        """
        with self.db.transaction() as conn:
            yield conn

    # --- runs ---
    def create_run(
        self,
        workflow: str,
        input: Any,
        *,
        inline: bool = False,
        graph_hash: str | None = None,
        wire: Any = None,
        deterministic: bool = False,
        planned_steps: Any = None,
        run_id: str | None = None,
        status: str = "running",
        conn: sa.Connection | None = None,
    ) -> str:
        """Start recording a run; returns its id (a new UUID unless given)."""
        return self.runs.create_run(
            workflow,
            input,
            inline=inline,
            graph_hash=graph_hash,
            wire=wire,
            deterministic=deterministic,
            planned_steps=planned_steps,
            run_id=run_id,
            status=status,
            conn=conn,
        )

    def get_run(self, run_id: str, *, conn: sa.Connection | None = None) -> WorkflowRun:
        try:
            return self._reads.runs.get_run(run_id, conn=conn)
        except RunNotFound:
            self._not_replayed_yet(run_id, conn)
            raise

    def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: str | list[str] | tuple[str, ...] | None = None,
        limit: int = 50,
        offset: int = 0,
        conn: sa.Connection | None = None,
    ) -> list[WorkflowRun]:
        """Runs, newest first; page with ``limit`` and ``offset``."""
        return self._reads.runs.list_runs(
            workflow=workflow, status=status, limit=limit, offset=offset, conn=conn
        )

    def delete_run(self, run_id: str, *, conn: sa.Connection | None = None) -> bool:
        """Delete a run with its steps and attempts; False when there was none."""
        return self.runs.delete_run(run_id, conn=conn)

    def update_run_state(
        self, run_id: str, key: str, value: Any, *, conn: sa.Connection | None = None
    ) -> None:
        """Set one key of the run's state, in one statement, without reading it first."""
        return self.runs.update_run_state(run_id, key, value, conn=conn)

    def get_run_state(self, run_id: str, *, conn: sa.Connection | None = None) -> dict[str, Any]:
        return self._reads.runs.get_run_state(run_id, conn=conn)

    def get_step_state(
        self, run_id: str, step_name: str, *, conn: sa.Connection | None = None
    ) -> StepState:
        """The step's row: one query, never the history table."""
        return self._reads.runs.get_step_state(run_id, step_name, conn=conn)

    def list_step_states(
        self, run_id: str, *, conn: sa.Connection | None = None
    ) -> list[StepState]:
        """Every step of a run, in creation order, in one query ([] for an unknown run)."""
        return self._reads.runs.list_step_states(run_id, conn=conn)

    def get_run_history(
        self, run_id: str, *, conn: sa.Connection | None = None
    ) -> list[StepAttempt]:
        """Every attempt of every step of the run: steps in creation order, attempts by number."""
        return self._reads.runs.get_run_history(run_id, conn=conn)

    # --- claims ---
    def get_step(self, step_id: str, *, conn: sa.Connection | None = None) -> StepState:
        """A step by its id (for a Celery step, its task id): one query."""
        return self._reads.claims.get_step(step_id, conn=conn)

    # --- workflows ---
    def list_events(self, run_id: str, *, conn: sa.Connection | None = None) -> list[RunEvent]:
        """Every event sent to the run, oldest first, taken or not."""
        return self._reads.workflows.list_events(run_id, conn=conn)

    def result_states(
        self, task_ids: Iterable[str], *, conn: sa.Connection | None = None
    ) -> dict[str, str]:
        """Celery's state of each task that has a result (``backend="pikku://"``), by id."""
        return {
            task_id: stored.status
            for task_id, stored in self._reads.results.get_many(task_ids, conn=conn).items()
        }

    # --- versions ---
    def get_workflow_version(
        self, workflow_name: str, graph_hash: str, *, conn: sa.Connection | None = None
    ) -> WorkflowVersion | None:
        return self._reads.versions.get_workflow_version(workflow_name, graph_hash, conn=conn)

    # --- stats ---
    def run_counts(self, *, conn: sa.Connection | None = None) -> dict[str, int]:
        """How many runs are in each status; a status with no run is absent."""
        return self._reads.stats.run_counts(conn=conn)

    def attempt_counts(self, *, conn: sa.Connection | None = None) -> list[AttemptCount]:
        """Attempts by task and status, sorted by task then status."""
        return self._reads.stats.attempt_counts(conn=conn)

    def attempt_totals(self, *, conn: sa.Connection | None = None) -> AttemptTotals:
        return self._reads.stats.attempt_totals(conn=conn)

    def count_runs(
        self,
        *,
        workflow: str | None = None,
        status: str | Sequence[str] | None = None,
        run_id_prefix: str | None = None,
        conn: sa.Connection | None = None,
    ) -> int:
        """How many runs ``list_runs`` (or ``search_runs``) with these filters pages through."""
        return self._reads.stats.count_runs(
            workflow=workflow, status=status, run_id_prefix=run_id_prefix, conn=conn
        )

    def search_runs(
        self,
        run_id_prefix: str,
        *,
        workflow: str | None = None,
        status: str | Sequence[str] | None = None,
        limit: int = 50,
        offset: int = 0,
        conn: sa.Connection | None = None,
    ) -> list[WorkflowRun]:
        """Runs whose id starts with ``run_id_prefix``, newest first, like ``list_runs``."""
        return self._reads.stats.search_runs(
            run_id_prefix, workflow=workflow, status=status, limit=limit, offset=offset, conn=conn
        )

    def workflow_names(self, *, conn: sa.Connection | None = None) -> list[str]:
        """Every workflow name that has a run, sorted."""
        return self._reads.stats.workflow_names(conn=conn)

    def count_open_steps(
        self,
        stale_after: float,
        *,
        at: dt.datetime | None = None,
        conn: sa.Connection | None = None,
    ) -> OpenStepCounts:
        """How many steps are lost, running, and scheduled untouched for ``stale_after`` s."""
        return self._reads.stats.count_open_steps(stale_after, at=at, conn=conn)

    def lost_steps_by_run(
        self, run_ids: Iterable[str], *, conn: sa.Connection | None = None
    ) -> dict[str, int]:
        """How many ``lost`` steps each of these runs has; a run with none is absent."""
        return self._reads.stats.lost_steps_by_run(run_ids, conn=conn)

    def oldest_running_attempt_age(
        self, *, at: dt.datetime | None = None, conn: sa.Connection | None = None
    ) -> float | None:
        """Seconds since the oldest attempt still running started (None: nothing runs)."""
        return self._reads.stats.oldest_running_attempt_age(at=at, conn=conn)

    # --- the read replica ---
    def replica_lag(self, *, conn: sa.Connection | None = None) -> ReplicaLag | None:
        """How far behind its primary the database the reads go to is; None when it is not
        a replica (no ``read_url``, or one that names a primary)."""
        return self._reads.replication.lag(conn=conn)

    def _not_replayed_yet(self, run_id: str, conn: sa.Connection | None) -> None:
        """Raises ``RunNotOnReplicaYet`` when a run was read on a replica that is behind."""
        if self.replica is None or conn is not None:
            return
        lag = self.replica_lag()
        if lag is not None and not lag.caught_up:
            raise RunNotOnReplicaYet(run_id, safe_url(self.replica.engine.url), lag.describe())

    # --- pruning (see ``prune.Pruning``) ---
    def count_prunable(
        self,
        before: dt.datetime,
        statuses: Iterable[str] = DEFAULT_PRUNE_STATUSES,
        *,
        conn: sa.Connection | None = None,
    ) -> PruneCount:
        """How many runs (steps, attempts) in ``statuses`` were created before ``before``."""
        return self._reads.pruning.count_prunable(before, statuses, conn=conn)

    def count_prunable_runs(
        self,
        before: dt.datetime,
        statuses: Iterable[str] = DEFAULT_PRUNE_STATUSES,
        *,
        conn: sa.Connection | None = None,
    ) -> int:
        """How many runs ``count_prunable`` would count, without reading their steps."""
        return self._reads.pruning.count_prunable_runs(before, statuses, conn=conn)

    def prune_batch(
        self,
        before: dt.datetime,
        statuses: Iterable[str] = DEFAULT_PRUNE_STATUSES,
        limit: int = 500,
        *,
        conn: sa.Connection | None = None,
    ) -> PruneCount:
        """Delete the ``limit`` oldest prunable runs, in one transaction; returns what went."""
        return self.pruning.prune_batch(before, statuses, limit, conn=conn)

    def prune(
        self,
        before: dt.datetime,
        statuses: Iterable[str] = DEFAULT_PRUNE_STATUSES,
        *,
        batch_size: int = 500,
        on_batch: Callable[[PruneCount], None] | None = None,
    ) -> PruneCount:
        """Delete every prunable run, ``batch_size`` runs per transaction; returns the total."""
        return self.pruning.prune(before, statuses, batch_size=batch_size, on_batch=on_batch)


#: What the face offers; pinned by the tests.
PUBLIC_METHODS: tuple[str, ...] = (
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
    "get_step_state",
    "list_step_states",
    "get_run_history",
    "get_step",
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
)
