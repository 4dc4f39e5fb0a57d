"""Celery signal handlers: read what Celery says, hand it to the mirror. Nothing else.

Handlers are connected once, explicitly, by :func:`install` (``weak=False``
and a ``dispatch_uid``, so a second install changes nothing). Each handler
ignores the tasks its app's :class:`TaskSelection` leaves alone (by default
those that are not a ``WorkflowTask``) and never raises.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, NamedTuple

from celery import current_task, signals, states
from celery.exceptions import Reject, Retry

from pikku_celery.faults import crash_point
from pikku_celery.integration import control, installed, replace
from pikku_celery.integration import headers as h
from pikku_celery.integration.backend import AppChords, executed, executing
from pikku_celery.integration.installed import Installed, installed_on, registry
from pikku_celery.integration.run_context import RunContext, current_run
from pikku_celery.integration.task import retry_policy
from pikku_celery.mirror import PublishedStep, process_id
from pikku_celery.store import NewRun, error_document

__all__ = [
    "Installed",
    "Mirrored",
    "RunContext",
    "current_run",
    "install",
    "mirror_of",
    "registry",
    "uninstall",
]

logger = logging.getLogger(__name__)

_UID: Final = "pikku_celery.{}"


def install(pikku: Installed) -> None:
    """Mirror ``pikku.app``'s tasks in this process (the handlers are connected once)."""
    installed.register(pikku)
    # A chord's last part written by this process's sink: its body goes from here.
    pikku.mirror.on_chords_fired(AppChords(pikku.app))
    control.register(_journal_folders)
    for signal, handler in _HANDLERS:
        signal.connect(handler, weak=False, dispatch_uid=_UID.format(handler.__name__))


def uninstall(pikku: Installed) -> None:
    """Mirror ``pikku.app``'s tasks no more; the handlers stay, for the other apps."""
    installed.unregister(pikku)


def _isolated(handler: Callable[..., None]) -> Callable[..., None]:
    """Whatever goes wrong in a handler is logged, never raised into Celery."""

    def run(*args: Any, **kwargs: Any) -> None:
        try:
            handler(*args, **kwargs)
        except Exception:
            logger.exception(
                "pikku-celery signal handler %s failed",
                handler.__name__,
                extra={"action": "signal_handler_failed", "handler": handler.__name__},
            )

    run.__name__ = handler.__name__
    return run


def _journal_folders(app: Any) -> list[Path]:
    pikku = installed_on(app)
    return [] if pikku is None else [pikku.mirror.journal_folder]


class Mirrored(NamedTuple):
    """A task the mirror records: the ``PikkuCelery`` that does, and the task's step name."""

    pikku: Installed
    step_name: str


def mirror_of(task: Any) -> Mirrored | None:
    """Whether a running task is mirrored, as its app's selection decides (cached per name)."""
    pikku = installed_on(getattr(task, "app", None))
    if pikku is None:
        return None
    step_name = pikku.selection.step_name(task)
    return None if step_name is None else Mirrored(pikku, step_name)


def step_of(task: Any, request: Any = None) -> Mirrored | None:
    """A running task's step: its own when it is mirrored, else the replaced step whose
    task id it took over (a ``celery.accumulate`` at the end of a replacing group)."""
    mirrored = mirror_of(task)
    if mirrored is not None:
        return mirrored
    request = request if request is not None else getattr(task, "request", None)
    if request is None or replace.continued_attempt(request) is None:
        return None
    pikku = installed_on(getattr(task, "app", None))
    if pikku is None:
        return None
    return Mirrored(pikku, str(h.from_request(request, h.STEP_NAME) or ""))


def _running_task() -> Any:
    return current_task._get_current_object() if current_task else None  # type: ignore[attr-defined]


def _follow_replacement(sender: str, headers: dict[str, Any], body: Any) -> None:
    """A message of the running step's replacement: the task that takes over its id is marked."""
    task = _running_task()
    request = getattr(task, "request", None)
    if request is None or not replace.is_replacement(request, headers, sender):
        return
    mirrored = step_of(task)
    if mirrored is None:
        return
    step_id = str(request.id)
    run_id = h.from_request(request, h.RUN_ID) or step_id
    step_name = h.from_request(request, h.STEP_NAME) or mirrored.step_name
    marks = replace.successor_headers(request, run_id, step_name)
    taken_by = replace.hand_over(step_id, headers, body, marks)
    if taken_by and not getattr(request, replace.REPLACED_BY, None):
        setattr(request, replace.REPLACED_BY, taken_by)


# Set on a retrying task's request: the ETA Celery gave its retry's message, and when
# that message went out.
_RETRY_ETA: Final = "pikku_retry_eta"
_RETRY_AT: Final = "pikku_retry_at"
# Chords in chords' headers are followed this deep (a signature could name itself).
_NESTING: Final = 32


def _moment(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc)


def _note_retry_eta(headers: dict[str, Any]) -> None:
    """A task's own retry: the next attempt is due when its message says, not when the
    retry handler runs a few milliseconds later."""
    request = getattr(_running_task(), "request", None)
    if request is not None and getattr(request, "id", None) == headers.get("id"):
        # No ETA (countdown=0): due as it is published, which is before any worker has it.
        published = time.time()
        setattr(request, _RETRY_ETA, headers.get("eta") or _moment(published))
        # The attempt failed then, not when the retry handler runs after the publish: the
        # next attempt may start (elsewhere) in between.
        setattr(request, _RETRY_AT, published)


def _lookup(task_name: str) -> tuple[Any, Mirrored | None]:
    """The task a message is published for, and who mirrors it (None: nobody does).

    A publisher knows only the task's name; a shared task is in every app, and
    an app that mirrors it wins over one that does not.
    """
    found = None
    for pikku in registry.values():
        task = pikku.app.tasks.get(task_name)
        if task is None:
            continue
        step_name = pikku.selection.step_name(task)
        if step_name is not None:
            return task, Mirrored(pikku, step_name)
        found = found or task
    return found, None


def _publish_context(message_headers: dict[str, Any]) -> RunContext | None:
    run_id = message_headers.get(h.RUN_ID)
    if run_id:
        return RunContext(run_id, message_headers.get(h.PARENT_STEP))
    explicit = current_run.get()
    if explicit is not None:
        return explicit
    # Published from inside a running task (a chain's next link, a chord's
    # body, a child task): it joins that task's run, after that task's step.
    request = getattr(_running_task(), "request", None)
    run_id = h.from_request(request, h.RUN_ID) if request is not None else None
    if not run_id:
        return None
    # A step's children follow that step (a task that took over a replaced step's
    # id is that step); a helper task's (a chord's unlock) follow the step the
    # helper itself follows.
    step_id = getattr(request, "id", None)
    is_step = step_id is not None and h.from_request(request, h.STEP_NAME) is not None
    parent = str(step_id) if is_step else h.from_request(request, h.PARENT_STEP)
    return RunContext(run_id, parent)


def _eta(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, str):
        moment = dt.datetime.fromisoformat(value)
    elif isinstance(value, int | float):
        moment = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=value)
    else:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def _eta_seconds(value: Any) -> float | None:
    """A request's ETA in seconds since the epoch (Celery gives an ISO string)."""
    moment = _eta(value)
    return None if moment is None else moment.timestamp()


def _seconds(value: Any) -> float | None:
    """A time a header carries, in seconds since the epoch; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _routing(exchange: Any, routing_key: Any) -> dict[str, Any]:
    """Where a message goes: an exchange (kombu's object or its name) and a routing key."""
    name = getattr(exchange, "name", exchange)
    return {"exchange": name or "", "routing_key": routing_key}


def _delivered_to(request: Any) -> dict[str, Any] | None:
    info = getattr(request, "delivery_info", None) or {}
    if info.get("routing_key") is None:
        return None
    return _routing(info.get("exchange"), info.get("routing_key"))


def _call_data(args: Any, kwargs: Any) -> dict[str, Any]:
    return {"args": list(args or ()), "kwargs": dict(kwargs or {})}


def _journal_result(task: Any) -> None:
    """The task has run: a result ``backend="pikku://"`` stored at its end that no
    mirrored end of its attempt handed on (a task the mirror does not record) goes now."""
    request = getattr(task, "request", None)
    executed(request)
    if request is None:
        return
    traced = _traced(request)
    pikku = traced.pikku if traced is not None else installed_on(getattr(task, "app", None))
    if pikku is not None and pikku.mirror.release(str(request.id)):
        crash_point("after_result_journaled", str(getattr(task, "name", "")))


def _chord_body(body: Any) -> str | None:
    """The task id of the body of the chord a message is a header task of: protocol 2
    embeds the body's frozen signature, whatever finishes the chord later."""
    embed = body[2] if isinstance(body, list | tuple) and len(body) >= 3 else None
    return _awaited_body(embed.get("chord") if isinstance(embed, dict) else None)


def _chain_result_id(body: Any) -> str | None:
    """The id of the result a chain's ``apply_async`` returns, when this message is the
    chain's first link: its last link's task id (a chord's body's, for a chord at its end).

    Protocol 2 embeds the links still to come, last first. A task sent from inside a
    task is no link of it: it joins that task's run and never gets here."""
    embed = body[2] if isinstance(body, list | tuple) and len(body) >= 3 else None
    links = embed.get("chain") if isinstance(embed, dict) else None
    last = links[0] if isinstance(links, list | tuple) and links else None
    for _ in range(_NESTING):
        if not (isinstance(last, dict) and last.get("subtask_type") == "chord"):
            break
        kwargs = last.get("kwargs")
        last = kwargs.get("body") if isinstance(kwargs, dict) else None
    options = last.get("options") if isinstance(last, dict) else None
    task_id = options.get("task_id") if isinstance(options, dict) else None
    return str(task_id) if task_id else None


def _bodies_of_request(request: Any) -> tuple[str, ...]:
    """The chord bodies a task's failure means Celery will not send: its own chord's, and
    those of the chain links after it that Celery fails with it (a chain in a chord's
    header carries the chord on its last link)."""
    bodies = list(_bodies_up(getattr(request, "chord", None)))
    for link in getattr(request, "chain", None) or ():
        if not isinstance(link, dict):
            continue
        # A chord in the chain is a link too: the outer chord waits on that chord's body.
        kwargs = link.get("kwargs")
        inner = kwargs.get("body") if isinstance(kwargs, dict) else None
        for signature in (link, inner):
            options = signature.get("options") if isinstance(signature, dict) else None
            if isinstance(options, dict):
                bodies.extend(b for b in _bodies_up(options.get("chord")) if b not in bodies)
    return tuple(bodies)


def _bodies_up(chord: Any) -> tuple[str, ...]:
    """The task ids of the bodies of a header task's chord and of every chord that chord's
    body is a part of (a chord in a chord's header), innermost first."""
    bodies: list[str] = []
    while isinstance(chord, dict) and len(bodies) < _NESTING:
        options = chord.get("options")
        if not isinstance(options, dict):
            break
        if options.get("task_id"):
            bodies.append(str(options["task_id"]))
        chord = options.get("chord")
    return tuple(bodies)


def _awaited_body(chord: Any) -> str | None:
    """The task id of a chord's body (its frozen signature) if it becomes a step."""
    if not isinstance(chord, dict) or chord.get("subtask_type") is not None:
        # A group's or chain's frozen id is no step's: only a lone task's body is awaited.
        return None
    if _lookup(str(chord.get("task")))[1] is None:
        return None  # a body that is not mirrored never becomes a step to wait for
    options = chord.get("options")
    task_id = options.get("task_id") if isinstance(options, dict) else None
    return str(task_id) if task_id else None


def _attempt(task: Any) -> int:
    return replace.attempt_of(task.request)


@_isolated
def before_task_publish(
    sender: str | None = None,
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
    body: Any = None,
    exchange: Any = None,
    routing_key: Any = None,
    **_: Any,
) -> None:
    if headers is None or sender is None:
        return  # message protocol 1 carries no headers to follow
    _follow_replacement(sender, headers, body)
    context = _publish_context(headers)
    task, mirrored = _lookup(sender)
    if mirrored is None:
        if context is not None:  # not a step, but its children stay in the run
            headers.setdefault(h.RUN_ID, context.run_id)
            if context.parent_step_id:
                headers.setdefault(h.PARENT_STEP, context.parent_step_id)
        return
    if headers.get("retries"):
        _note_retry_eta(headers)
    if headers.get("retries") or headers.get(h.ORCHESTRATED) or replace.takes_over(headers):
        # A retry republishes its step (the retry handler records the attempt);
        # a workflow's replay claimed its step before it published it; a replacement
        # carries on a step that exists.
        return
    step_id = str(headers["id"])
    args, kwargs = (
        (body[0], body[1]) if isinstance(body, list | tuple) and len(body) >= 2 else ((), {})
    )
    base_name = (
        (properties or {}).get(h.STEP_NAME) or headers.get(h.STEP_NAME) or mirrored.step_name
    )
    data = _call_data(args, kwargs)
    if context is None:
        # A lone task is a run of its own, under its own task id; a chain's first link
        # starts its chain's run, under the id the chain's result has (its last link's).
        run_id = _chain_result_id(body) or step_id
        parent, new_run = None, NewRun(task.name, data, {"type": "task"})
    else:
        run_id, parent, new_run = context.run_id, context.parent_step_id, None
    retries, retry_delay = retry_policy(task)
    sent_at = time.time()
    mirrored.pikku.mirror.published(
        PublishedStep(
            run_id=run_id,
            step_id=step_id,
            step_name=str(base_name),
            rpc_name=task.name,
            data=data,
            parent_step_id=parent,
            retries=retries,
            retry_delay=retry_delay,
            eta=_eta(headers.get("eta")),
            new_run=new_run,
            routing=_routing(exchange, routing_key),
            chord_body=_chord_body(body),
            at=sent_at,
        )
    )
    headers[h.RUN_ID] = run_id
    headers[h.SENT_AT] = sent_at
    # The name asked for: a repeat gets its "#N" when the step reaches SQL.
    headers[h.STEP_NAME] = str(base_name)


class _Traced:
    """A mirrored task's step as its ``task_prerun`` read it from the request, kept on the
    request for its ``task_success`` and ``task_postrun``: the headers are read once."""

    __slots__ = ("attempt", "orchestrated", "pikku", "run_id", "step_id")

    def __init__(
        self, pikku: Installed, step_id: str, run_id: str, attempt: int, orchestrated: bool
    ) -> None:
        self.pikku, self.step_id, self.run_id = pikku, step_id, run_id
        self.attempt, self.orchestrated = attempt, orchestrated


# Set on a traced request by task_prerun: its _Traced (None: a task the mirror leaves alone).
_TRACED: Final = "pikku_traced"


def _traced(request: Any) -> _Traced | None:
    """What ``task_prerun`` read of this request, if it ran for it in this process."""
    traced = getattr(request, _TRACED, None)
    if traced is not None and traced.step_id == request.id:
        return traced  # type: ignore[no-any-return]
    return None


@_isolated
def task_prerun(task: Any = None, args: Any = None, kwargs: Any = None, **_: Any) -> None:
    # First, for every task (mirrored or not): the result its end stores waits for its
    # task_postrun, which follows only a body that runs in this process.
    request = getattr(task, "request", None)
    executing(request)
    if request is None:
        return
    mirrored = step_of(task, request)
    if mirrored is None:
        return
    step_id = str(request.id)
    fields = h.fields_of(request)
    header_run = fields.get(h.RUN_ID)
    orchestrated = bool(fields.get(h.ORCHESTRATED))
    continued = replace.continued_from(fields.get(h.REPLACES), request.id)
    attempt = (continued or 1) + int(getattr(request, "retries", 0) or 0)
    mirror = mirrored.pikku.mirror
    adoption = None
    # A workflow's replay claimed its steps; a replacement's step was recorded before it.
    if not orchestrated and continued is None:
        retries, retry_delay = retry_policy(task)
        published = header_run is not None and not lone(request, step_id, header_run)
        eta = request.eta
        adoption = mirror.adoption(
            header_run or step_id,
            fields.get(h.STEP_NAME) or mirrored.step_name,
            task.name,
            published=published,
            data=None if published else _call_data(args, kwargs),
            retries=retries,
            retry_delay=retry_delay,
            routing=_delivered_to(request),
            sent_at=_seconds(fields.get(h.SENT_AT)),
            eta=None if eta is None else _eta_seconds(eta),
            chord_body=_awaited_body(getattr(request, "chord", None)),
        )
    mirror.started(
        step_id,
        attempt,
        worker=request.hostname,
        pid=process_id(),
        adoption=adoption,
        # A replacement carries the attempt on: not one more delivery of its message.
        delivery=continued is None,
    )
    setattr(
        request,
        _TRACED,
        _Traced(mirrored.pikku, step_id, header_run or step_id, attempt, orchestrated),
    )


def lone(request: Any, step_id: str, header_run: str | None) -> bool:
    """Whether a task is lone: a run of its own, the root of its tree and no chord's header.
    Its worker records both from the message at once, and its events never wait behind
    the publisher's journal.

    A chain's last link has its run's id too, but its chain's root. A chord's header task
    applied outside a run is a run of its own, but which run holds the chord for its body
    is decided by the order its publisher wrote the header in. Both wait for their publish."""
    root = getattr(request, "root_id", None)
    return (
        header_run == step_id
        and (root is None or str(root) == step_id)
        and getattr(request, "chord", None) is None
    )


def _declared_delay(reason: Any) -> float | None:
    """The countdown a retry was given (``retry(countdown=...)``, autoretry's backoff, or the
    task's ``default_retry_delay``, which Celery puts in when none is given), as declared:
    the difference between its ETA and its publish also counts whatever ran in between."""
    when = reason.when if isinstance(reason, Retry) else None
    if isinstance(when, bool) or not isinstance(when, int | float):
        return None
    return max(float(when), 0.0)


@_isolated
def task_retry(
    sender: Any = None, request: Any = None, reason: Any = None, einfo: Any = None, **_: Any
) -> None:
    mirrored = step_of(sender, request)
    if mirrored is None or request is None:
        return
    pikku = mirrored.pikku
    cause = reason.exc if isinstance(reason, Retry) and reason.exc is not None else reason
    # Celery formatted the traceback already: formatting it again reads every frame's source.
    formatted = getattr(einfo, "traceback", None) or None
    error = error_document(
        cause if isinstance(cause, BaseException) else str(cause), formatted=formatted
    )
    if formatted is not None:
        error["traceback"] = error["stack"] = formatted
    when = getattr(request, _RETRY_ETA, None) or (
        reason.when if isinstance(reason, Retry) else None
    )
    attempt = replace.attempt_of(request)
    at = getattr(request, _RETRY_AT, None)
    due = _eta(when)
    # This retry's delay, and the task's max_retries: what the step gets from now on.
    delay = _declared_delay(reason)
    if delay is None and due is not None and at is not None:
        delay = max(due.timestamp() - at, 0.0)  # an ETA given to retry(): a moment, not a delay
    pikku.mirror.retried(
        str(request.id),
        attempt,
        error,
        due,
        at=at,
        retries=getattr(sender, "max_retries", None),
        retry_delay=delay,
    )


@_isolated
def task_success(sender: Any = None, result: Any = None, **_: Any) -> None:
    request = getattr(sender, "request", None)
    traced = _traced(request)
    if traced is not None:
        # A workflow's step: the workflow function decides the run's outcome, in a
        # replay sent once this success is committed.
        traced.pikku.mirror.succeeded(
            None if traced.orchestrated else traced.run_id,
            traced.step_id,
            traced.attempt,
            result,
            orchestrated=traced.orchestrated,
        )
        return
    mirrored = step_of(sender)
    if mirrored is None:
        return
    pikku = mirrored.pikku
    request = sender.request
    run_id = h.from_request(request, h.RUN_ID) or str(request.id)
    orchestrated = bool(h.from_request(request, h.ORCHESTRATED))
    pikku.mirror.succeeded(
        None if orchestrated else run_id,
        str(request.id),
        _attempt(sender),
        result,
        orchestrated=orchestrated,
    )


@_isolated
def task_failure(
    sender: Any = None,
    task_id: Any = None,
    exception: BaseException | None = None,
    einfo: Any = None,
    **_: Any,
) -> None:
    mirrored = step_of(sender)
    if mirrored is None:
        return
    pikku = mirrored.pikku
    request = sender.request
    formatted = getattr(einfo, "traceback", None) or None
    error = error_document(
        exception if exception is not None else "task failed", formatted=formatted
    )
    if formatted is not None:
        error["traceback"] = error["stack"] = formatted
    if isinstance(exception, Reject):
        error["message"] = (
            "The task rejected its message without requeue (Reject(requeue=False)): the broker "
            "dead-letters or drops it, so it will not run again; publish it again or resume "
            f"the run to retry it. {error['message']}"
        ).strip()
    if task_id is not None and str(getattr(request, "id", None)) != str(task_id):
        # Sent by the worker's main process (a rejected message, a hard time
        # limit), which has no request context: the step's current attempt and
        # its run are meant, and the store finds them.
        error["step"] = None
        pikku.mirror.ended(None, str(task_id), None, "failed", error)
        return
    error["step"] = h.from_request(request, h.STEP_NAME)
    run_id = h.from_request(request, h.RUN_ID) or str(request.id)
    # StepFailed is raised at the step's ctx.do; the workflow may compensate.
    orchestrated = bool(h.from_request(request, h.ORCHESTRATED))
    pikku.mirror.ended(
        None if orchestrated else run_id,
        str(request.id),
        _attempt(sender),
        "failed",
        error,
        orchestrated=orchestrated,
        chord_bodies=_bodies_of_request(request),
    )


@_isolated
def task_revoked(
    sender: Any = None,
    request: Any = None,
    terminated: bool = False,
    signum: Any = None,
    expired: bool = False,
    **_: Any,
) -> None:
    mirrored = step_of(sender, request)
    if mirrored is None or request is None:
        return
    pikku = mirrored.pikku
    why = "expired" if expired else ("terminated" if terminated else "revoked")
    error = {
        "type": "celery.exceptions.TaskRevokedError",
        "message": f"The task was {why} before it finished"
        + (f" (signal {signum})" if signum else "")
        + "; publish it again or resume the run to run it.",
        "traceback": None,
        "step": h.from_request(request, h.STEP_NAME),
    }
    step_id = str(request.id)
    run_id = h.from_request(request, h.RUN_ID) or step_id
    pikku.mirror.ended(
        run_id,
        step_id,
        replace.attempt_of(request),
        "cancelled",
        error,
        chord_bodies=_bodies_of_request(request),
    )


@_isolated
def task_postrun(task: Any = None, state: Any = None, **_: Any) -> None:
    _journal_result(task)
    if state != states.IGNORED:
        return  # every other end has a signal of its own
    mirrored = step_of(task)
    if mirrored is None:
        return
    request = task.request
    step_id = str(request.id)
    taken_by = getattr(request, replace.REPLACED_BY, None)
    if taken_by:
        mirrored.pikku.mirror.replaced(step_id, _attempt(task), str(taken_by))
        return
    # The task raised Ignore itself: Celery records nothing and runs it no more.
    error = {
        "type": "celery.exceptions.Ignore",
        "message": "The task raised Ignore, so Celery recorded no outcome and will not run it "
        "again; publish it again or resume the run to run it.",
        "traceback": None,
        "step": h.from_request(request, h.STEP_NAME),
    }
    orchestrated = bool(h.from_request(request, h.ORCHESTRATED))
    run_id = h.from_request(request, h.RUN_ID) or step_id
    mirrored.pikku.mirror.ended(
        None if orchestrated else run_id,
        step_id,
        _attempt(task),
        "cancelled",
        error,
        orchestrated=orchestrated,
    )


@_isolated
def worker_process_init(**_: Any) -> None:
    for pikku in registry.values():
        pikku.mirror.store  # noqa: B018 - drops the parent's connections in this child


@_isolated
def worker_process_shutdown(**_: Any) -> None:
    for pikku in registry.values():
        pikku.mirror.close()


def _hostname(sender: Any) -> str:
    return str(getattr(sender, "hostname", None) or os.uname().nodename)


@_isolated
def worker_init(sender: Any = None, **_: Any) -> None:
    control.worker_started()
    forks = _forks_a_pool(sender)
    for pikku in registry.values():
        pikku.prepare_upkeep(_hostname(sender))
        if forks:
            # Its pool processes then only append: one flusher per node, not per process.
            pikku.mirror.serve_node()
        else:
            # A worker's events never wait for another process (a hosted publisher's do).
            pikku.mirror.write_own_journal()


def _forks_a_pool(worker: Any) -> bool:
    """Whether the worker runs its tasks in processes it forks (the prefork pool)."""
    pool = getattr(worker, "pool_cls", None)
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
    return any(alias in str(name) for alias in ("prefork", "processes"))


@_isolated
def worker_ready(sender: Any = None, **_: Any) -> None:
    hostname = _hostname(sender)
    for pikku in registry.values():
        # The main process's flusher writes its own events (a rejected message, a
        # hard time limit) and adopts the journals of children and processes that
        # are gone, within seconds.
        pikku.mirror.start()
        pikku.start_upkeep(hostname)


@_isolated
def worker_shutdown(**_: Any) -> None:
    for pikku in registry.values():
        pikku.stop_upkeep()
        pikku.mirror.close()


_HANDLERS: Final[list[tuple[Any, Callable[..., None]]]] = [
    (signals.before_task_publish, before_task_publish),
    (signals.task_prerun, task_prerun),
    (signals.task_retry, task_retry),
    (signals.task_success, task_success),
    (signals.task_failure, task_failure),
    (signals.task_revoked, task_revoked),
    (signals.task_postrun, task_postrun),
    (signals.worker_process_init, worker_process_init),
    (signals.worker_process_shutdown, worker_process_shutdown),
    (signals.worker_init, worker_init),
    (signals.worker_ready, worker_ready),
    (signals.worker_shutdown, worker_shutdown),
]
