"""Run ASGI apps under uvicorn (uvloop + httptools), several in one event loop if needed."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace

import uvicorn
import uvloop
from starlette.types import ASGIApp

from router.cli import heap
from router.config import GatewayConfig, LimitsConfig
from router.http.connection import Callers, guarded_protocol
from router.openai import PATHS

LARGE_BODY_PATHS = frozenset("/v1" + path for path in PATHS)  # limits.max_body_bytes; others: control


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 picks a free one (read it back from getsockname).

    The protocol is given explicitly: asyncio turns Nagle off (TCP_NODELAY) only on accepted
    sockets whose `proto` is IPPROTO_TCP, and the default 0 left a stream's first event
    waiting ~40 ms for the client's delayed ACK after the response headers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def cannot_listen(host: str, port: int, exc: OSError, change: str) -> str:
    """The one line said when `bind` fails; `change` names how to pick another address."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"tidegate: cannot start: {host}:{port} is already in use by another process; "
            f"choose another port with {change} (0: any free port)"
        )
    if exc.errno == errno.EACCES:
        return (
            f"tidegate: cannot start: not allowed to listen on {host}:{port} "
            f"(ports under 1024 need root); use {change}"
        )
    return f"tidegate: cannot start: cannot listen on {host}:{port} ({change}): {exc.strerror or exc}"


class _Companion(uvicorn.Server):
    """A server that leaves signal handling to the main server of the same loop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@dataclass(frozen=True)
class Served:
    """An app on a listening socket. On SIGTERM it stops accepting, lets in-flight requests
    (streams included) finish for up to `drain_s`, then cancels the rest; its lifespan then
    releases what it holds. `limits` bound its connections and bodies (router/http/connection.py);
    X-Forwarded-* headers are believed only from `forwarded_allow_ips` (none by default)."""

    app: ASGIApp
    sock: socket.socket
    drain_s: int = 30
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    forwarded_allow_ips: tuple[str, ...] = ()
    callers: Callers | None = None  # the app's client keys, for the connections' fair shares


def serving_of(app: ASGIApp, sock: socket.socket, config: GatewayConfig) -> Served:
    """The gateway `app` on `sock` as its config says: drain, limits, trusted proxies, and its
    client keys for the connection layer's fair shares."""
    callers = getattr(getattr(app, "state", None), "keys", None)
    limits, trusted = config.limits, config.server.forwarded_allow_ips
    return Served(app, sock, limits.drain_s, limits, trusted, callers)


def server_config(served: Served, log_level: str = "warning", loop: str = "uvloop") -> uvicorn.Config:
    """uvicorn's config for `served`: httptools under our connection limits, keep-alive
    `limits.keep_alive_s` (above clients' and load balancers' own idle timeouts, so the
    server is never the side that closes a connection a client is about to reuse)."""
    return uvicorn.Config(
        served.app,
        loop=loop,
        http=guarded_protocol(served.limits, LARGE_BODY_PATHS, served.callers, served.forwarded_allow_ips),
        proxy_headers=bool(served.forwarded_allow_ips),
        forwarded_allow_ips=list(served.forwarded_allow_ips) or None,
        lifespan="on",
        access_log=False,
        log_level=log_level,
        log_config=None,
        timeout_graceful_shutdown=served.drain_s,
        timeout_keep_alive=int(served.limits.keep_alive_s),
    )


async def serve_all(main: Served, companions: Sequence[Served] = (), log_level: str = "warning") -> None:
    """Serve `main` until it is told to stop (SIGINT/SIGTERM), then stop the companions."""
    others = [_Companion(server_config(c, log_level)) for c in companions]
    tasks = [asyncio.create_task(s.serve(sockets=[c.sock])) for s, c in zip(others, companions, strict=True)]
    try:
        await uvicorn.Server(server_config(main, log_level)).serve(sockets=[main.sock])
    finally:
        for server in others:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)


def startup_failed(app: ASGIApp) -> str | None:
    """Why the app's lifespan refused to start (e.g. Redis unreachable), if it did."""
    state = getattr(app, "state", None)
    return getattr(state, "startup_error", None)


def run(main: Served, companions: Sequence[Served] = (), log_level: str = "warning") -> None:
    heap.settle()
    uvloop.run(serve_all(main, companions, log_level))


def run_workers(
    make_app: Callable[[], ASGIApp], template: Served, workers: int, metrics: Served | None = None
) -> int:
    """Pre-fork `workers` processes that accept on the same listening socket; each builds its
    own app (its own event loop, upstream pools and store connections), and serves its own
    `/metrics` on `metrics`'s socket when given. SIGTERM/SIGINT are passed on to every worker;
    when one worker ends on its own, the others are stopped too and the exit status is 1,
    leaving restarts to the supervisor (systemd, Kubernetes)."""
    children: list[int] = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:  # the worker
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            code = 0
            try:
                app = make_app()
                extra = [replace(metrics, app=app.state.metrics_app)] if metrics is not None else []  # type: ignore[attr-defined]
                run(replace(template, app=app), extra)
                code = 2 if startup_failed(app) else 0
            except BaseException:
                logging.getLogger("tidegate").exception("worker %d failed", os.getpid())
                code = 1
            os._exit(code)
        children.append(pid)
    stopping = False

    def stop_all(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    status = 0
    remaining = set(children)
    while remaining:
        pid, _ = os.wait()
        remaining.discard(pid)
        if not stopping:  # a worker ended on its own: take the rest down, report failure
            status = 1
            stop_all(signal.SIGTERM, None)
    return status
