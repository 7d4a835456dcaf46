"""`tidegate serve` (the gateway for a config file) and `tidegate check-config`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
from pathlib import Path
from typing import Any

from router.cli.serving import Served, bind, cannot_listen, run, run_workers, serving_of, startup_failed
from router.config import ConfigError, DedicatedEndpoint, Endpoint, GatewayConfig, load_config


def add_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the gateway for a config file")
    serve.add_argument("--config", required=True, type=Path, help="path to tidegate.yaml")
    serve.add_argument("--host", help="override listen.host")
    serve.add_argument("--port", type=int, help="override listen.port")
    serve.add_argument(
        "--workers", type=int, default=1, help="processes accepting on the port (more than 1 needs Redis)"
    )
    serve.set_defaults(run=_serve)
    check = commands.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("file", type=Path)
    check.set_defaults(run=_check_config)


def _serve(args: argparse.Namespace) -> int:
    from router.app import create_app  # noqa: PLC0415 (lazy: the other commands start fast)

    try:
        config = load_config(args.config)
        app = create_app(config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    refused = _refusal(args, config)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    listening = _listen(args, app, config)
    if listening is None:
        return 2
    sock, companions = listening
    served = serving_of(app, sock, config)
    if args.workers == 1:
        with contextlib.suppress(SystemExit):  # uvicorn exits 3 when the lifespan refused to start
            run(served, companions)
        failed = startup_failed(app)
        if failed:
            print(f"tidegate: cannot start: {failed}", file=sys.stderr)
            return 2
        return 0
    return run_workers(
        lambda: create_app(config), served, args.workers, companions[0] if companions else None
    )


def _refusal(args: argparse.Namespace, config: GatewayConfig) -> str | None:
    """Why `serve` must not start, said before it listens; None when it may."""
    if args.workers < 1 or (args.workers > 1 and not config.state.redis_url):
        return (
            "--workers must be 1 without state.redis_url: the memory store is per process, so "
            "workers would each admit max_concurrency (set TIDEGATE_REDIS_URL / state.redis_url)"
        )
    unreachable = _reach_state(config)
    return f"tidegate: cannot start: {unreachable}" if unreachable else None


def _reach_state(config: GatewayConfig) -> str | None:
    """Connect to the configured Redis once, as start-up will, and let go: an unreachable or
    refusing Redis is said in one line before `serve` says it is listening (start-up inside
    the server would say it after, under the lifespan's traceback). None: reachable, not
    Redis, or `state.start_degraded` (which starts without it on purpose)."""
    from router.app import store_for  # noqa: PLC0415 (lazy, as create_app)
    from router.state.roles import StoreUnreachableAtStart  # noqa: PLC0415

    if not config.state.redis_url or config.state.start_degraded:
        return None

    async def probe() -> None:
        store = store_for(config)
        try:
            await store.start()
        finally:
            await store.close()

    try:
        asyncio.run(probe())
    except StoreUnreachableAtStart as exc:
        return str(exc)
    return None


def _listen(
    args: argparse.Namespace, app: Any, config: GatewayConfig
) -> tuple[socket.socket, list[Served]] | None:
    """The client socket and the companions' (announced once all are bound); None, said on
    stderr with the key to change, when one cannot listen (the caller exits 2)."""
    host = args.host or config.listen.host
    port = args.port if args.port is not None else config.listen.port
    try:
        sock = bind(host, port)
    except OSError as exc:
        print(cannot_listen(host, port, exc, "--port or listen.port"), file=sys.stderr)
        return None
    try:
        companions = _metrics_listener(app, config)
    except OSError as exc:
        sock.close()
        print(
            f"tidegate: cannot start: cannot listen for /metrics (server.metrics_listen): {exc}",
            file=sys.stderr,
        )
        return None
    bound_host, bound_port = sock.getsockname()[:2]
    print(
        f"tidegate listening on http://{bound_host}:{bound_port}/v1 ({len(config.models)} model(s), "
        f"store: {app.state.store.name}, workers: {args.workers})",
        flush=True,
    )
    for companion in companions:
        at_host, at_port = companion.sock.getsockname()[:2]
        print(f"tidegate metrics on http://{at_host}:{at_port}/metrics (server.metrics_listen)", flush=True)
    return sock, companions


def _metrics_listener(app: Any, config: GatewayConfig) -> list[Served]:
    """`/metrics` on `server.metrics_listen`, when set, beside the gateway."""
    listen = config.server.metrics_listen
    if listen is None:
        return []
    return [Served(app.state.metrics_app, bind(listen.host, listen.port))]


def _price(endpoint: Endpoint) -> str:
    """A route's price as reports will bill it; a zero says so, so a free route is a choice
    the operator sees rather than a price they forgot."""
    if isinstance(endpoint, DedicatedEndpoint):
        if endpoint.gpu_hour_usd == 0:
            return "$0/GPU-hour: reports bill it nothing"
        return f"${endpoint.gpu_hour_usd:g}/GPU-hour x {endpoint.gpus} GPU(s)"
    if endpoint.usd_per_mtok_in == 0 and endpoint.usd_per_mtok_out == 0:
        return "$0/Mtok: reports bill it nothing"
    return f"${endpoint.usd_per_mtok_in:g} in, ${endpoint.usd_per_mtok_out:g} out per Mtok"


def _check_config(args: argparse.Namespace) -> int:
    from router.app import build_policies, check_state  # noqa: PLC0415 (lazy: the others start fast)

    problems: list[str] = []
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        problems = list(exc.problems)
    else:
        for check in (build_policies, check_state):
            try:
                check(config)
            except ConfigError as exc:
                problems += exc.problems
    if problems:
        print(f"{args.file}: {len(problems)} problem(s)", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    for name, model in config.models.items():
        routes = ", ".join(f"{e.name} ({e.kind}, {_price(e)})" for e in model.endpoints)
        extras = "".join(
            (
                ", parity enforced" if model.parity.enforce else "",
                f", shadow {model.shadow.percent:g}% to {model.shadow.target_name}" if model.shadow else "",
            )
        )
        print(f"model {name}: policy {model.policy}, canary {model.canary_percent:g}%, {routes}{extras}")
    worst = config.limits.worst_case_bytes() / (1 << 20)
    print(f"limits: clients can make one process hold at most {worst:,.0f} MiB (docs/security.md)")
    print(f"{args.file}: OK")
    return 0
