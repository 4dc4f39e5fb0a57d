"""CPU spent in the receivers of Celery's task signals, counted per signal in this thread.

Celery's tracer calls each signal's ``send`` through a name bound at import in
``celery.app.trace`` (``send_prerun``, ``send_success``, ``send_postrun``);
:class:`SignalClock` rebinds those names to timed ones while it times, and can time
some receivers of those signals on their own (pikku-celery's: the send's figure less
theirs is Celery's dispatch). ``time.thread_time`` around each: CPU of this thread,
whatever else the process does. The clock's own cost per timed call (about 0.6 µs
here, :meth:`SignalClock.bias`) is measured and taken off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["SignalClock"]


class SignalClock:
    """CPU seconds spent in each of ``signals`` (Celery ``Signal`` objects) while timed."""

    def __init__(self, names: Sequence[str], receivers: str | None = None) -> None:
        """``names``: of ``celery.app.trace`` (``send_prerun``, ...); ``receivers``: the
        ``dispatch_uid`` prefix of the receivers timed on their own as well (the sends'
        figures then hold Celery's dispatch, theirs only what they do)."""
        self._names = list(names)  # of celery.app.trace: send_prerun, ...
        self._prefix = receivers
        self.seconds: dict[str, float] = {self.label(n): 0.0 for n in self._names}
        self.receivers: dict[str, float] = {self.label(n): 0.0 for n in self._names}
        #: Timed calls by signal (its sends and its timed receivers): each counts the
        #: clock's own cost once (:meth:`bias`), taken off by :meth:`net`.
        self.calls: dict[str, int] = {}
        self._sends: dict[str, int] = {}

    @staticmethod
    def label(name: str) -> str:
        return "task_" + name.removeprefix("send_")

    def reset(self) -> None:
        for name in self.seconds:
            self.seconds[name] = self.receivers[name] = 0.0

    def total(self) -> float:
        return sum(self.seconds.values())

    def net(self, bias: float) -> tuple[dict[str, float], dict[str, float]]:
        """CPU seconds by signal, of its sends and of its timed receivers, the clock's own
        cost taken off (a send's holds its receivers' clocks too)."""
        sends, receivers = {}, {}
        for name, seconds in self.seconds.items():
            calls = self.calls.get(name, 0)
            sends[name] = max(seconds - calls * bias, 0.0)
            # One timed receiver a send at most, so the receivers made calls - sends calls.
            timed = calls - self._sends.get(name, 0)
            receivers[name] = max(self.receivers[name] - timed * bias, 0.0)
        return sends, receivers

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Within the block, every send of the signals by Celery's tracer is timed (and the
        receivers named by ``receivers``)."""
        from celery import signals
        from celery.app import trace

        saved = {name: getattr(trace, name) for name in self._names}
        lists: list[tuple[Any, list[Any]]] = []
        for name, send in saved.items():
            label = self.label(name)
            setattr(trace, name, self._counted(label, self._timed(label, send)))
            signal = getattr(signals, label)
            if self._prefix is not None:
                lists.append((signal, list(signal.receivers)))
                signal.receivers = [
                    (key, self._timed(label, receiver, self.receivers))
                    if str(key[0]).startswith(self._prefix)
                    else (key, receiver)
                    for key, receiver in signal.receivers
                ]
                signal.sender_receivers_cache.clear()
        try:
            yield
        finally:
            for name, send in saved.items():
                setattr(trace, name, send)
            for signal, receivers in lists:
                signal.receivers = receivers
                signal.sender_receivers_cache.clear()

    def _counted(self, name: str, send: Callable[..., Any]) -> Callable[..., Any]:
        counts = self._sends

        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] = counts.get(name, 0) + 1
            return send(*args, **kwargs)

        return counted

    def bias(self, sends: int = 20_000) -> float:
        """CPU seconds the clock itself adds to each timed send (what it counts of a send
        that does nothing): taken off the figures."""
        counted = {"nothing": 0.0}
        timed = self._timed("nothing", lambda: None, counted)
        for _ in range(sends):
            timed()
        self.calls.pop("nothing", None)
        return counted["nothing"] / sends

    def _timed(
        self, name: str, send: Callable[..., Any], into: dict[str, float] | None = None
    ) -> Callable[..., Any]:
        seconds = self.seconds if into is None else into
        calls = self.calls
        clock = time.thread_time

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return send(*args, **kwargs)
            finally:
                seconds[name] += clock() - start
                calls[name] = calls.get(name, 0) + 1

        return timed
