"""Shared fixtures: simulators and a gateway in front of them, all on loopback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from router.app import create_app
from router.config import GatewayConfig, parse_config
from tests.matrix import ROWS, MatrixRow, table
from tests.servers import RedisServer, Sim, ThreadServer
from tidegate.sim.profile import SERVERLESS_PRESETS, Kind, SimProfile

FAST = 1000.0  # time scale for the simulators: modelled seconds run as milliseconds


TIMEOUTS = "{ttft_s: 2, idle_s: 2, connect_s: 1}"


def gateway_config(
    dedicated: Sim | None, serverless: list[Sim], timeouts: str = TIMEOUTS, **model: Any
) -> GatewayConfig:
    """A one-model config (`m`) in front of the given simulators, as YAML like a user's; every
    endpoint with `timeouts` (short by default, so a test of a stall ends quickly)."""
    lines = ["auth: {allow_anonymous: true}", "models:", "  m:"]
    for key, value in model.items():
        lines.append(f"    {key}: {value}")
    if dedicated is not None:
        lines += [
            "    dedicated:",
            "      - name: ded",
            f"        base_url: {dedicated.base_url}",
            "        model: upstream-ded",
            f"        max_concurrency: {dedicated.app.state.sim.profile.max_concurrency}",
            "        gpu_hour_usd: 0",
            f"        timeouts: {timeouts}",
        ]
    if serverless:
        lines.append("    serverless:")
        for i, sim in enumerate(serverless):
            lines += [
                f"      - name: sl{i}",
                f"        base_url: {sim.base_url}",
                f"        model: upstream-sl{i}",
                "        usd_per_mtok_in: 0",
                "        usd_per_mtok_out: 0",
                f"        timeouts: {timeouts}",
            ]
    return parse_config("\n".join(lines) + "\n", {})


def dedicated_profile(**kw: Any) -> SimProfile:
    base: dict[str, Any] = dict(kind=Kind.DEDICATED, name="ded", max_concurrency=4, time_scale=FAST, seed=1)
    base.update(kw)
    return SimProfile(**base)


def serverless_profile(**kw: Any) -> SimProfile:
    base: dict[str, Any] = dict(
        kind=Kind.SERVERLESS, name="sl", ttft=SERVERLESS_PRESETS["fast"], time_scale=FAST, seed=2
    )
    base.update(kw)
    return SimProfile(**base)


@pytest.fixture
def dedicated_sim() -> Iterator[Sim]:
    with Sim(dedicated_profile()) as sim:
        yield sim


@pytest.fixture
def serverless_sims() -> Iterator[list[Sim]]:
    with Sim(serverless_profile(seed=2)) as a, Sim(serverless_profile(seed=3)) as b:
        yield [a, b]


@pytest.fixture
def gateway(dedicated_sim: Sim, serverless_sims: list[Sim]) -> Iterator[ThreadServer]:
    config = gateway_config(dedicated_sim, serverless_sims)
    with ThreadServer(create_app(config)) as server:
        yield server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis_server.flush()
    return redis_server.url


@pytest.fixture(scope="session")
def fault_matrix(request: pytest.FixtureRequest) -> list[MatrixRow]:
    """Rows of the fault matrix; printed as a table at the end of the run."""
    return request.config.stash.setdefault(ROWS, [])


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    rows = config.stash.get(ROWS, [])
    if rows:
        terminalreporter.section("fault matrix")
        terminalreporter.write_line(table(rows))


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A test that runs `tidegate.cli.main.main` in-process points the root logger at that
    test's captured stderr; put the handlers back after it, so a later test's server thread
    does not log into a closed stream ("--- Logging error ---")."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
