"""The pages, the JSON API under ``/api/``, ``/metrics``, ``/healthz`` and ``/readyz``: reads,
through the store.

With a password, everything but ``/metrics`` (counts only), ``/healthz`` and ``/readyz``
needs it, reads included: pages and API documents show runs' input and output.
"""

from __future__ import annotations

import logging
import math

from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from pikku_celery.dashboard.auth import SIGN_IN, RequireSignIn
from pikku_celery.dashboard.context import Dashboard
from pikku_celery.dashboard.filters import RunFilters
from pikku_celery.dashboard.forms import ActionForms
from pikku_celery.dashboard.metrics import CONTENT_TYPE, collect_metrics
from pikku_celery.dashboard.timeline import render_timeline
from pikku_celery.errors import InvalidStatus, NotFoundError, RunNotFound, StoreError
from pikku_celery.render.documents import (
    attempts_by_step,
    flower_task_url,
    is_celery_task,
    run_document,
    run_json,
    run_parent,
    step_wait,
    steps_after,
)
from pikku_celery.store import RUN_STATUSES, WorkflowRun, now, run_kind

__all__ = ["Views"]

logger = logging.getLogger(__name__)


def _local_path(target: str) -> bool:
    """Only paths on this site: "//host" and "/\\host" would leave it."""
    return target.startswith("/") and not target.startswith(("//", "/\\"))


class Views:
    def __init__(self, dashboard: Dashboard) -> None:
        self.d = dashboard
        self.forms = ActionForms(dashboard)

    def routes(self) -> list[BaseRoute]:
        signed_in_only = [
            Route("/", self.runs_page, name="runs"),
            # Before the run page: "/runs/<id>/cancel" is a POST of that run's form.
            Route("/runs/{run_id:path}/{action}", self.forms.post, methods=["POST"]),
            Route("/runs/{run_id:path}", self.run_page, name="run"),
            Route("/api/runs", self.api_runs, name="api_runs"),
            Route("/api/runs/{run_id:path}", self.api_run, name="api_run"),
            Route("/login", self.login, name="login"),
        ]
        return [
            # Open to monitoring without the password: neither shows a run id or run data.
            Route("/healthz", self.healthz, name="healthz"),
            Route("/readyz", self.readyz, name="readyz"),
            Route("/metrics", self.metrics, name="metrics"),
            # Everything else, any path a later change adds included, is behind it.
            Mount(
                "",
                routes=signed_in_only,
                middleware=[Middleware(RequireSignIn, auth=self.d.auth)],
            ),
        ]

    # --- shared ------------------------------------------------------------

    def _runs(self, f: RunFilters) -> tuple[list[WorkflowRun], int]:
        store = self.d.store
        status = list(f.statuses) or None
        if f.q is not None:
            runs = store.search_runs(
                f.q, workflow=f.workflow, status=status, limit=f.limit, offset=f.offset
            )
        else:
            runs = store.list_runs(
                workflow=f.workflow, status=status, limit=f.limit, offset=f.offset
            )
        total = store.count_runs(workflow=f.workflow, status=status, run_id_prefix=f.q)
        return runs, total

    async def store_failed(self, request: Request, exc: Exception) -> Response:
        """Store errors while reading: not found, a bad filter, or the database is down."""
        if isinstance(exc, NotFoundError):
            status, title = 404, "Not found"
        elif isinstance(exc, InvalidStatus):
            status, title = 400, "Bad request"
        else:
            status, title = 503, "The database is not available"
            logger.warning(
                "dashboard read failed: %s", exc, extra={"action": "dashboard_read_failed"}
            )
        if request.url.path.startswith(f"{self.d.root(request)}/api/"):
            return JSONResponse({"error": str(exc)}, status_code=status)
        if request.url.path == f"{self.d.root(request)}/metrics":
            return Response(f"# {exc}\n", status_code=status, media_type=CONTENT_TYPE)
        return await run_in_threadpool(
            self.d.render, request, "message.html", status_code=status, title=title, message=exc
        )

    # --- pages -------------------------------------------------------------

    def runs_page(self, request: Request) -> Response:
        try:
            f = RunFilters.from_query(request.query_params)
        except ValueError as exc:
            return self.d.render(
                request, "message.html", status_code=400, title="Bad request", message=exc
            )
        if f.q is not None and f.offset == 0:
            # A whole run id goes straight to its run.
            try:
                self.d.store.get_run(f.q)
            except RunNotFound:
                pass
            else:
                return RedirectResponse(self.d.run_url(request, f.q), status_code=303)
        runs, total = self._runs(f)
        store = self.d.store
        pages = max(1, math.ceil(total / f.limit))
        moving = any(run.status == "running" for run in runs)
        root = self.d.root(request)
        return self.d.render(
            request,
            "runs.html",
            runs=runs,
            total=total,
            filters=f,
            statuses=sorted(RUN_STATUSES),
            workflows=store.workflow_names(),
            page=f.offset // f.limit + 1,
            pages=pages,
            prev_url=f"{root}/{f.query(offset=max(0, f.offset - f.limit))}"
            if f.offset > 0
            else None,
            next_url=f"{root}/{f.query(offset=f.offset + f.limit)}"
            if f.offset + f.limit < total
            else None,
            deleted=request.query_params.get("deleted"),
            refresh=self.d.refresh_seconds if moving else 0,
            open_steps=store.count_open_steps(self.d.stale_after),
            stale_after=self.d.stale_after,
            lost=store.lost_steps_by_run(run.run_id for run in runs),
            # Only a store that reads on a replica asks how far behind it is.
            replica=store.replica_lag() if store.replica is not None else None,
        )

    def run_page(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        store = self.d.store
        run = store.get_run(run_id)
        steps = store.list_step_states(run_id)
        history = store.get_run_history(run_id)
        events = store.list_events(run_id)
        states = store.result_states(step.step_id for step in steps)
        by_step = attempts_by_step(history)
        after = steps_after(run, steps, history)
        done = request.query_params.get("done")
        waits = [wait for wait in map(step_wait, steps) if wait is not None and wait.waiting]
        return self.d.render(
            request,
            "run.html",
            run=run,
            steps=[
                (
                    step,
                    by_step.get(step.step_id, []),
                    step_wait(step),
                    after[step.step_id],
                    # A sleep, a wait or a child workflow has no task Flower would know.
                    is_celery_task(step),
                    states.get(step.step_id),
                )
                for step in steps
            ],
            parent=run_parent(run),
            events=events,
            step_names={step.step_id: step.step_name for step in steps},
            # Only a durable workflow's ctx.wait_for takes events; the form offers
            # the event a step waits for now.
            takes_events=run_kind(run.wire) == "workflow",
            waiting_for=waits[0].event if waits else "",
            timeline=render_timeline(history, now()),
            flower=lambda task_id: flower_task_url(self.d.flower_url, task_id),
            done=done if done in ActionForms.ACTIONS else None,
            refresh=self.d.refresh_seconds if run.status == "running" else 0,
        )

    def login(self, request: Request) -> Response:
        """Asks the browser for the password; Basic credentials then go with every request."""
        if not self.d.auth.enabled:
            return self.d.render(
                request,
                "message.html",
                status_code=404,
                title="Sign-in is off",
                message="Set PIKKU_DASHBOARD_PASSWORD (or create_app(auth_token=...)) to turn "
                "on sign-in and run actions.",
            )
        if not self.d.auth.signed_in(request):
            return self.d.auth.challenge(SIGN_IN)
        target = request.query_params.get("next", "")
        if not _local_path(target):
            target = f"{self.d.root(request)}/"
        return RedirectResponse(target, status_code=303)

    # --- API ---------------------------------------------------------------

    def api_runs(self, request: Request) -> Response:
        try:
            f = RunFilters.from_query(request.query_params)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        runs, total = self._runs(f)
        return JSONResponse(
            {
                "runs": [run_json(run) for run in runs],
                "total": total,
                "limit": f.limit,
                "offset": f.offset,
                "status": list(f.statuses),
                "workflow": f.workflow,
                "q": f.q,
            }
        )

    def api_run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        store = self.d.store
        run = store.get_run(run_id)
        steps = store.list_step_states(run_id)
        document = run_document(
            run,
            steps,
            store.get_run_history(run_id),
            self.d.flower_url,
            events=store.list_events(run_id),
            celery_states=store.result_states(step.step_id for step in steps),
        )
        return JSONResponse(document)

    def metrics(self, request: Request) -> Response:
        return Response(
            collect_metrics(self.d.store, stale_after=self.d.stale_after), media_type=CONTENT_TYPE
        )

    def _unreadable(self, exc: StoreError, action: str) -> Response:
        logger.warning("dashboard check failed: %s", exc, extra={"action": action})
        # The reason goes to the log, not to whoever asks without a password.
        return PlainTextResponse(
            "unavailable: the database cannot be read; the dashboard's log says why\n",
            status_code=503,
        )

    def healthz(self, request: Request) -> Response:
        """Liveness: 200 while the dashboard can read its database, whatever its schema.

        A process that answers here needs no restart; whether it can serve pages is
        ``/readyz``'s question.
        """
        try:
            self.d.store.schema_revision()
        except StoreError as exc:
            return self._unreadable(exc, "dashboard_unhealthy")
        return PlainTextResponse("ok\n")

    def readyz(self, request: Request) -> Response:
        """Readiness: 200 once the pages can be served, the database's schema being this
        version's; 503 while it is missing or behind (every page would be a 503 too)."""
        store = self.d.store
        try:
            current = store.schema_revision()
        except StoreError as exc:
            return self._unreadable(exc, "dashboard_not_ready")
        head = store.latest_schema_revision()
        if current != head:
            # Revisions name no run and no server: safe for whoever asks.
            return PlainTextResponse(
                f"not ready: the database schema is at {current or 'none'} and this "
                f"pikku-celery needs {head}; run `pikku-celery db upgrade`\n",
                status_code=503,
            )
        return PlainTextResponse("ready\n")
