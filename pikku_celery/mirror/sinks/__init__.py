"""One :class:`~pikku_celery.mirror.sink.EventSink` per process role.

- :class:`OwnSink` - a process that writes its own journal from a flusher thread
  (a publisher, a solo or threads worker);
- :class:`InlineSink` - the same, written when asked (tests, ``redirected``);
- :class:`HostedSink` - a publisher that only appends, written by a node's flusher
  of its machine (``pikku_publisher_journal = "node"``);
- :class:`NodeSink` - a prefork worker's main process, writing its pool
  processes' journals with its own;
- :class:`AppendOnlySink` - a pool process of such a node;
- :class:`DirectSink` - no journal: each event written at once.

The recorder chooses one when it is made, again in a forked child
(``EventSink.forked``) and when it serves a node or is redirected; nothing
downstream asks which it has.
"""

from __future__ import annotations

from pikku_celery.mirror.sinks.direct import DirectSink
from pikku_celery.mirror.sinks.hosted import HostedSink, publisher_sink
from pikku_celery.mirror.sinks.node import AppendOnlySink, NodeSink
from pikku_celery.mirror.sinks.own import InlineSink, OwnSink, own_sink

__all__ = [
    "AppendOnlySink",
    "DirectSink",
    "HostedSink",
    "InlineSink",
    "NodeSink",
    "OwnSink",
    "own_sink",
    "publisher_sink",
]
