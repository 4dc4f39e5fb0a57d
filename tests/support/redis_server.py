"""A private redis-server for fault tests, so they can stop and restart a broker of their own
and never the shared one."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.http import free_port

_HOST = "127.0.0.1"
_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 10.0
_LOG_TAIL_LINES = 30


class RedisServer:
    """``redis-server`` on 127.0.0.1, without persistence, in a temp dir of its own.

    The port is chosen when the object is made, so a URL can be handed out before ``start()``
    and stays valid across ``restart()``.
    """

    def __init__(self, port: int = 0) -> None:
        self._port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{_HOST}:{self._port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        if self._process is not None:
            raise RuntimeError(f"redis-server on port {self._port} is already started")
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH: install Redis to run these tests")
        self._dir = Path(tempfile.mkdtemp(prefix="pikku-redis-"))
        command = [
            binary,
            "--bind",
            _HOST,
            "--port",
            str(self._port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self._dir),
            "--daemonize",
            "no",
        ]
        # Without --logfile Redis logs to stdout; stderr joins it so config errors show in the tail.
        with self._log_path.open("wb") as log:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def restart(self, down_for: float = 0.0) -> None:
        self.stop()
        if down_for > 0:
            time.sleep(down_for)
        self.start()

    def log_tail(self) -> str:
        if self._dir is None or not self._log_path.exists():
            return ""
        lines = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-_LOG_TAIL_LINES:])

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def _log_path(self) -> Path:
        assert self._dir is not None
        return self._dir / "redis.log"

    def _wait_until_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            code = self._process.poll()
            if code is not None:
                raise RuntimeError(
                    f"redis-server on port {self._port} exited with code {code}:\n{self.log_tail()}"
                )
            if self._ping():
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"redis-server on port {self._port} did not answer PING within "
                    f"{_START_TIMEOUT:g} s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _ping(self) -> bool:
        # The wait loop is the retry: the client's own retries would hold a failed start
        # for many seconds before its exit is seen.
        client = redis.Redis(
            host=_HOST,
            port=self._port,
            socket_connect_timeout=0.5,
            socket_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()
