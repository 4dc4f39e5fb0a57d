"""The action forms: resume, rerun from a step, cancel and delete a run, send it an event.

Each POST needs a configured password, the browser signed in with it (checked
here as well as in front of every route), and the form's CSRF token; only
then is the injected ``RunActions`` (or, for delete, the store) called.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from pikku_celery.dashboard.auth import CSRF_FIELD, SIGN_IN
from pikku_celery.dashboard.context import Dashboard
from pikku_celery.errors import NotFoundError, PikkuCeleryError, RunNotFound

__all__ = ["ActionForms"]

logger = logging.getLogger(__name__)

ACTIONS_OFF: Final = (
    "Run actions are off because no dashboard password is set. Set PIKKU_DASHBOARD_PASSWORD "
    "(or pass auth_token= to create_app) and sign in to resume, rerun, cancel or delete runs "
    "and send them events; "
    "the password then also guards every page and the API."
)


NOT_JSON: Final = (
    "The event's data is not JSON ({problem}), so nothing was sent. Write it as JSON, like "
    '{{"approved": true}}, a number, or a text in double quotes ("yes"); leave it empty to '
    "send null."
)


def _event_data(text: str) -> Any:
    """The send form's data field: JSON, or nothing for null. Raises ValueError with why."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at character {exc.pos}") from None


class ActionForms:
    ACTIONS: Final = ("resume", "rerun", "cancel", "delete", "send")

    def __init__(self, dashboard: Dashboard) -> None:
        self.d = dashboard

    def _refuse(self, request: Request, status: int, title: str, message: str) -> Response:
        return self.d.render(
            request, "message.html", status_code=status, title=title, message=message
        )

    async def post(self, request: Request) -> Response:
        run_id: str = request.path_params["run_id"]
        action: str = request.path_params["action"]
        auth = self.d.auth
        if action not in self.ACTIONS:
            return self._refuse(request, 404, "Not found", f"There is no action {action!r}.")
        if not auth.enabled:
            return self._refuse(request, 403, "Actions are off", ACTIONS_OFF)
        if not auth.signed_in(request):
            return auth.challenge(SIGN_IN)
        async with request.form(max_files=0, max_fields=10) as form:
            token = form.get(CSRF_FIELD)
            step = form.get("step")
            name = form.get("name")
            data_text = form.get("data")
        if not isinstance(token, str) or not auth.csrf_ok(request, token):
            return self._refuse(
                request,
                403,
                "Form expired",
                "The form's CSRF token is missing or wrong; reload the page and try again.",
            )
        if action != "delete" and self.d.actions is None:
            return self._refuse(
                request,
                404,
                "Not available",
                "This dashboard was started without run actions, so it cannot "
                f"{'send events to' if action == 'send' else action} runs; start it with "
                "your app (pikku-celery dashboard --app module:pikku, or "
                "create_app(actions=pikku)).",
            )
        if action == "rerun" and not (isinstance(step, str) and step):
            return self._refuse(request, 400, "Bad request", "Say which step to rerun from.")
        event: tuple[str, Any] | None = None
        if action == "send":
            if not (isinstance(name, str) and name.strip()):
                return self._refuse(
                    request,
                    400,
                    "Bad request",
                    "Say which event to send: its name, the one the workflow's "
                    "ctx.wait_for(name) waits for.",
                )
            try:
                event = (name, _event_data(data_text if isinstance(data_text, str) else ""))
            except ValueError as exc:
                return self._refuse(request, 400, "Bad event data", NOT_JSON.format(problem=exc))
        try:
            await run_in_threadpool(
                self._do, action, run_id, step if isinstance(step, str) else "", event
            )
        except NotFoundError as exc:
            return self._refuse(request, 404, "Not found", str(exc))
        except PikkuCeleryError as exc:
            what = "send the event" if action == "send" else f"{action} the run"
            return self._refuse(request, 409, f"Could not {what}", str(exc))
        if action == "delete":
            root = self.d.root(request)
            return RedirectResponse(f"{root}/?deleted={quote(run_id, safe='')}", status_code=303)
        return RedirectResponse(f"{self.d.run_url(request, run_id)}?done={action}", status_code=303)

    def _do(self, action: str, run_id: str, step: str, event: tuple[str, Any] | None) -> None:
        logger.info(
            "dashboard: %s run %s",
            action,
            run_id,
            extra={"action": "dashboard_run_action", "run_action": action, "run_id": run_id},
        )
        if action == "delete":
            if not self.d.store.delete_run(run_id):
                raise RunNotFound(run_id)
            return
        actions = self.d.actions
        assert actions is not None  # checked by the caller
        if action == "resume":
            actions.resume(run_id)
        elif action == "rerun":
            actions.rerun(run_id, step)
        elif action == "send":
            assert event is not None  # checked by the caller
            actions.send(run_id, *event)
        else:
            actions.cancel(run_id)
