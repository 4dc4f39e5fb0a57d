"""The fault-test tools themselves, on real sockets and processes: a tool that only seems to cut
the network would let a fault test pass without any fault."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time

import psycopg
import pytest
import redis
import sqlalchemy as sa

from tests.support.redis_server import RedisServer
from tests.support.tcp_proxy import THREAD_NAME_PREFIX, TcpProxy
from tests.support.threads import run_threads

PG_HOST = "127.0.0.1"
PG_PORT = 5432
MANY = 300


def pg_dsn(port: int) -> str:
    return f"host={PG_HOST} port={port} user=postgres dbname=test"


def proxy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]


def open_fds() -> set[tuple[str, str]]:
    """Each open descriptor of this process with what it is open on. Another test's object
    in this process may close one meanwhile (the garbage collector finding a connection):
    a leak is one that is open after and was not before, not a change of the count."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except FileNotFoundError:  # the listing's own descriptor, closed already
            continue
    return fds


def assert_refused(port: int) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert time.monotonic() - started < 1


def recv_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = sock.recv(64)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    return data


@pytest.fixture
def pg_reachable() -> None:
    # These tests are about the proxy, so a missing server must not pass for a proxy fault.
    try:
        with psycopg.connect(pg_dsn(PG_PORT), connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {PG_HOST}:{PG_PORT} "
            f"(user postgres, database test): {exc}"
        )


@pytest.fixture
def redis_binary() -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not on PATH: install Redis to run these tests")


@pytest.mark.postgres
def test_cut_resets_connections_refuses_new_ones_and_restore_serves_again(
    pg_reachable: None,
) -> None:
    proxy = TcpProxy(PG_HOST, PG_PORT)
    proxy.start()
    try:
        port = proxy.port
        conn = psycopg.connect(pg_dsn(port), connect_timeout=2)
        try:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert (proxy.connections_total, proxy.open_connections) == (1, 1)

            proxy.cut()
            assert proxy.open_connections == 0
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
            assert time.monotonic() - started < 2
        finally:
            conn.close()

        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg_dsn(port), connect_timeout=2)
        assert time.monotonic() - started < 1
        assert_refused(port)

        proxy.restore()
        assert proxy.port == port
        with psycopg.connect(pg_dsn(port), connect_timeout=2) as again:
            assert again.execute("SELECT 2").fetchone() == (2,)
        assert proxy.connections_total == 2
    finally:
        proxy.stop()
    assert proxy_threads() == []


@pytest.mark.postgres
def test_stop_then_start_listens_on_the_same_port(pg_reachable: None) -> None:
    with TcpProxy(PG_HOST, PG_PORT) as proxy:
        port = proxy.port
    assert proxy_threads() == []
    assert_refused(port)

    with proxy:
        assert proxy.port == port
        with psycopg.connect(pg_dsn(port), connect_timeout=2) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert proxy_threads() == []


@pytest.mark.postgres
def test_a_pre_pinging_pool_fails_while_cut_and_recovers_after_restore(
    pg_reachable: None,
) -> None:
    with TcpProxy(PG_HOST, PG_PORT) as proxy:
        engine = sa.create_engine(
            f"postgresql+psycopg://postgres@{PG_HOST}:{proxy.port}/test",
            pool_size=5,
            max_overflow=0,
            pool_pre_ping=True,
            connect_args={"connect_timeout": 2},
        )

        def query(_: int) -> None:
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT pg_sleep(0.05)")

        try:
            run_threads(5, query)
            assert proxy.open_connections == 5

            proxy.cut()
            with pytest.raises(sa.exc.OperationalError):
                query(0)

            proxy.restore()
            run_threads(5, query)
            assert proxy.open_connections == 5
        finally:
            engine.dispose()
    assert proxy_threads() == []


@pytest.mark.redis
def test_hundreds_of_connections_are_forwarded_then_all_reset_without_leaks(
    redis_binary: None,
) -> None:
    fds_before = open_fds()
    with RedisServer() as server, TcpProxy("127.0.0.1", server.port) as proxy:
        clients: list[socket.socket] = []
        try:
            for _ in range(MANY):
                clients.append(socket.create_connection(("127.0.0.1", proxy.port), timeout=5))
            for client in clients:
                client.sendall(b"PING\r\n")
            for client in clients:
                assert recv_line(client) == b"+PONG\r\n"
            assert (proxy.connections_total, proxy.open_connections) == (MANY, MANY)

            proxy.cut()
            assert proxy.open_connections == 0
            for client in clients:
                with pytest.raises(ConnectionResetError):
                    client.recv(1)
        finally:
            for client in clients:
                client.close()
    assert proxy_threads() == []
    assert open_fds() - fds_before == set()


@pytest.mark.redis
def test_redis_server_restart_keeps_the_port_and_loses_the_data(redis_binary: None) -> None:
    with RedisServer() as server:
        port = server.port
        assert server.url == f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(server.url, socket_timeout=2)
        try:
            assert client.set("pikku", "value")
            assert client.get("pikku") == b"value"

            server.restart(down_for=0.2)
            assert server.port == port
            # The pooled connection died with the old process.
            client.connection_pool.disconnect()
            assert client.ping()
            assert client.get("pikku") is None
        finally:
            client.close()
    assert not server.running
    assert_refused(port)


@pytest.mark.redis
def test_redis_server_that_cannot_start_reports_its_log(redis_binary: None) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = RedisServer(port=int(taken.getsockname()[1]))
        with pytest.raises(RuntimeError, match="exited with code") as failure:
            server.start()
    assert "Address already in use" in str(failure.value)
    assert not server.running


def test_a_reset_after_the_reply_to_commit_leaves_the_commit_done_and_the_client_unaware(
    pg_reachable: None,
) -> None:
    with TcpProxy(PG_HOST, PG_PORT) as proxy:
        table = f"proxy_commit_{os.getpid()}"
        with psycopg.connect(pg_dsn(PG_PORT), autocommit=True) as direct:
            direct.execute(f"CREATE TABLE IF NOT EXISTS {table} (n int)")
            direct.execute(f"TRUNCATE {table}")
            conn = psycopg.connect(pg_dsn(proxy.port))
            conn.execute(f"INSERT INTO {table} VALUES (1)")
            proxy.reset_after_reply_to(b"COMMIT")
            with pytest.raises(psycopg.OperationalError):
                conn.commit()
            conn.close()
            assert direct.execute(f"SELECT count(*) FROM {table}").fetchone() == (1,)
            direct.execute(f"DROP TABLE {table}")
