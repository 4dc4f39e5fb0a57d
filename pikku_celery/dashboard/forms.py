"""The action forms: resume, rerun from a step, cancel and delete a run.

Each POST needs a configured password, the browser signed in with it (checked
here as well as in front of every route), and the form's CSRF token; only
then is the injected ``RunActions`` (or, for delete, the store) called.
"""

from __future__ import annotations

import logging
from typing import Final
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
    "(or pass auth_token= to create_app) and sign in to resume, rerun, cancel or delete runs; "
    "the password then also guards every page and the API."
)


class ActionForms:
    ACTIONS: Final = ("resume", "rerun", "cancel", "delete")

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
                f"This dashboard was started without run actions, so it cannot {action} runs.",
            )
        if action == "rerun" and not (isinstance(step, str) and step):
            return self._refuse(request, 400, "Bad request", "Say which step to rerun from.")
        try:
            await run_in_threadpool(self._do, action, run_id, step if isinstance(step, str) else "")
        except NotFoundError as exc:
            return self._refuse(request, 404, "Not found", str(exc))
        except PikkuCeleryError as exc:
            return self._refuse(request, 409, f"Could not {action} the run", str(exc))
        if action == "delete":
            root = self.d.root(request)
            return RedirectResponse(f"{root}/?deleted={quote(run_id, safe='')}", status_code=303)
        return RedirectResponse(f"{self.d.run_url(request, run_id)}?done={action}", status_code=303)

    def _do(self, action: str, run_id: str, step: str) -> None:
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
        else:
            actions.cancel(run_id)
