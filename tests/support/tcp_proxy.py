"""A TCP forwarding proxy whose network can be cut and restored, for fault tests.

One background thread owns every socket and serves all connections from a selector: sockets are
never touched from two threads, so a cut from the test thread cannot race a half-done send, and
hundreds of pooled connections cost no more threads.
"""

from __future__ import annotations

import errno
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from types import TracebackType

THREAD_NAME_PREFIX = "TcpProxy"
_HOST = "127.0.0.1"
# Per direction: past this much unsent data a side stops being read, so a slow reader
# slows its writer down instead of growing the buffer without bound.
_BUFFER_LIMIT = 256 * 1024
_CHUNK = 64 * 1024
_COMMAND_TIMEOUT = 10.0
# Only an outgoing connection that happened to get the port as its local port keeps
# the port taken while the proxy is cut, and that passes quickly.
_REBIND_TIMEOUT = 3.0
# Linger on, for zero seconds: close() then resets the connection instead of a FIN handshake.
_LINGER_RESET = struct.pack("ii", 1, 0)


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    except OSError:
        pass  # already dead: closing it is all that is left
    sock.close()


class _Pipe:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.connected = False
        self.closed = False
        self.to_upstream = bytearray()
        self.to_client = bytearray()
        self.client_eof = False
        self.upstream_eof = False
        self.upstream_shut = False
        self.client_shut = False
        # The client sent the armed pattern: its server's next reply is never passed on.
        self.reset_on_reply = False


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host:target_port`` until cut.

    ``cut()`` is the network going away: every connection is reset and the port refuses new
    ones. ``restore()`` listens again on the same port, so a client's URL keeps working.
    """

    def __init__(self, target_host: str, target_port: int, listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._port = listen_port
        self._listener: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._commands: queue.SimpleQueue[tuple[Callable[[], None], Future[None]]] = (
            queue.SimpleQueue()
        )
        self._running = False
        self._pipes: set[_Pipe] = set()
        self._connections_total = 0
        self._reset_pattern: bytes | None = None

    # -- public API ----------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port == 0:
            raise RuntimeError("the proxy has no port until start()")
        return self._port

    @property
    def connections_total(self) -> int:
        return self._connections_total

    @property
    def open_connections(self) -> int:
        return len(self._pipes)

    @property
    def is_cut(self) -> bool:
        return self._listener is None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the proxy is already started")
        listener = self._bind(rebind_timeout=_REBIND_TIMEOUT if self._port else 0.0)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._adopt(listener)
        self._running = True
        self._thread = threading.Thread(
            target=self._serve, name=f"{THREAD_NAME_PREFIX}-{self._port}", daemon=True
        )
        self._thread.start()

    def cut(self) -> None:
        self._require_started()
        self._call(self._cut)

    def reset_after_reply_to(self, pattern: bytes) -> None:
        """The next time a client sends ``pattern``, the server's reply is dropped and that
        connection reset: the server did the work (a COMMIT, say), the client never hears."""
        self._require_started()

        def arm() -> None:
            self._reset_pattern = pattern

        self._call(arm)

    def restore(self) -> None:
        self._require_started()
        if self._listener is not None:
            return
        listener = self._bind(rebind_timeout=_REBIND_TIMEOUT)
        try:
            self._call(lambda: self._adopt(listener))
        except BaseException:
            listener.close()
            raise

    def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._call(self._cut)
        self._call(self._quit)
        thread.join(_COMMAND_TIMEOUT)
        if thread.is_alive():
            raise RuntimeError(f"{thread.name} did not stop")
        self._thread = None
        # The thread is gone, so these are no longer shared.
        self._cut()
        assert self._selector is not None
        assert self._wake_r is not None
        assert self._wake_w is not None
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        self._selector = self._wake_r = self._wake_w = None

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- caller side ---------------------------------------------------------------------

    def _require_started(self) -> None:
        if self._thread is None:
            raise RuntimeError("the proxy is not started")

    def _bind(self, *, rebind_timeout: float) -> socket.socket:
        deadline = time.monotonic() + rebind_timeout
        while True:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((_HOST, self._port))
                listener.listen(1024)
                listener.setblocking(False)
            except OSError as exc:
                listener.close()
                if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
                continue
            self._port = int(listener.getsockname()[1])
            return listener

    def _call(self, command: Callable[[], None]) -> None:
        """Runs ``command`` on the proxy thread and waits for it, so it is done on return."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            command()  # no thread left to race with
            return
        done: Future[None] = Future()
        self._commands.put((command, done))
        self._wake()
        done.result(_COMMAND_TIMEOUT)

    def _wake(self) -> None:
        assert self._wake_w is not None
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:
            pass  # a wake-up is already pending

    # -- proxy thread --------------------------------------------------------------------

    def _serve(self) -> None:
        selector = self._selector
        assert selector is not None
        try:
            while self._running:
                for key, events in selector.select():
                    if key.data is None:
                        self._run_commands()
                    elif key.data == "listener":
                        self._accept()
                    else:
                        pipe, side = key.data
                        self._on_event(pipe, side, events)
        finally:
            self._running = False
            self._run_commands()

    def _run_commands(self) -> None:
        assert self._wake_r is not None
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                command, done = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                command()
            except BaseException as exc:  # handed to the waiting caller
                done.set_exception(exc)
            else:
                done.set_result(None)

    def _quit(self) -> None:
        self._running = False

    def _adopt(self, listener: socket.socket) -> None:
        assert self._selector is not None
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, "listener")

    def _cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            self._unregister(listener)
            # Connections still in the backlog are reset by this close, like the rest.
            listener.close()
        for pipe in list(self._pipes):
            self._close(pipe, reset=True)

    def _accept(self) -> None:
        listener = self._listener
        if listener is None:
            return
        while True:
            try:
                client, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # out of descriptors, say: the client waits in the backlog
            self._connections_total += 1
            client.setblocking(False)
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.setblocking(False)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pipe = _Pipe(client, upstream)
            self._pipes.add(pipe)
            code = upstream.connect_ex(self.target)
            if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                self._close(pipe, reset=True)
                continue
            self._update(pipe)

    def _on_event(self, pipe: _Pipe, side: str, events: int) -> None:
        # An earlier event of the same batch may have closed this pipe.
        if pipe.closed:
            return
        try:
            if side == "upstream" and not pipe.connected:
                code = pipe.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    self._close(pipe, reset=True)
                    return
                pipe.connected = True
            elif side == "client":
                if events & selectors.EVENT_WRITE:
                    self._flush(pipe.client, pipe.to_client)
                if events & selectors.EVENT_READ:
                    pipe.client_eof = self._fill(pipe.client, pipe.to_upstream)
                    pattern = self._reset_pattern
                    if pattern is not None and pattern in pipe.to_upstream:
                        self._reset_pattern = None
                        pipe.reset_on_reply = True
            else:
                if events & selectors.EVENT_WRITE:
                    self._flush(pipe.upstream, pipe.to_upstream)
                if events & selectors.EVENT_READ:
                    if pipe.reset_on_reply and not pipe.to_upstream:
                        reply = bytearray()
                        self._fill(pipe.upstream, reply)
                        if reply:
                            self._close(pipe, reset=True)
                            return
                    pipe.upstream_eof = self._fill(pipe.upstream, pipe.to_client)
            self._pass_on_eof(pipe)
        except OSError:
            # A reset on one side is passed on to the other as a reset.
            self._close(pipe, reset=True)
            return
        if pipe.client_shut and pipe.upstream_shut:
            self._close(pipe, reset=False)
        else:
            self._update(pipe)

    @staticmethod
    def _fill(sock: socket.socket, buffer: bytearray) -> bool:
        """Reads what ``sock`` has into ``buffer``; True at end of stream."""
        try:
            data = sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return False
        buffer += data
        return not data

    @staticmethod
    def _flush(sock: socket.socket, buffer: bytearray) -> None:
        try:
            sent = sock.send(buffer)
        except (BlockingIOError, InterruptedError):
            return
        del buffer[:sent]

    @staticmethod
    def _pass_on_eof(pipe: _Pipe) -> None:
        if pipe.client_eof and not pipe.to_upstream and not pipe.upstream_shut:
            pipe.upstream.shutdown(socket.SHUT_WR)
            pipe.upstream_shut = True
        if pipe.upstream_eof and not pipe.to_client and not pipe.client_shut:
            pipe.client.shutdown(socket.SHUT_WR)
            pipe.client_shut = True

    def _update(self, pipe: _Pipe) -> None:
        client_events = 0
        upstream_events = 0
        if not pipe.connected:
            upstream_events = selectors.EVENT_WRITE
        else:
            if not pipe.client_eof and len(pipe.to_upstream) < _BUFFER_LIMIT:
                client_events |= selectors.EVENT_READ
            if not pipe.upstream_eof and len(pipe.to_client) < _BUFFER_LIMIT:
                upstream_events |= selectors.EVENT_READ
            if pipe.to_client:
                client_events |= selectors.EVENT_WRITE
            if pipe.to_upstream:
                upstream_events |= selectors.EVENT_WRITE
        self._watch(pipe.client, client_events, (pipe, "client"))
        self._watch(pipe.upstream, upstream_events, (pipe, "upstream"))

    def _watch(self, sock: socket.socket, events: int, data: tuple[_Pipe, str]) -> None:
        assert self._selector is not None
        try:
            key = self._selector.get_key(sock)
        except KeyError:
            if events:
                self._selector.register(sock, events, data)
            return
        if not events:
            self._selector.unregister(sock)
        elif key.events != events:
            self._selector.modify(sock, events, data)

    def _unregister(self, sock: socket.socket) -> None:
        assert self._selector is not None
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass  # never registered, or no events were wanted

    def _close(self, pipe: _Pipe, *, reset: bool) -> None:
        if pipe.closed:
            return
        pipe.closed = True
        self._pipes.discard(pipe)
        for sock in (pipe.client, pipe.upstream):
            self._unregister(sock)
            if reset:
                _reset(sock)
            else:
                sock.close()
