"""`tidegate demo`: the gateway in front of simulated upstreams, one scenario at a time
(tidegate/cli/scenarios.py). The simulator is imported only when the command runs."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from router.cli.serving import Served, bind, cannot_listen, run, serving_of
from router.config import CanaryControllerConfig, GatewayConfig, parse_config


def add_parser(commands: Any) -> None:
    demo = commands.add_parser("demo", help="gateway + simulated dedicated and serverless upstreams")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8000, help="gateway port (0: any free port)")
    demo.add_argument(
        "--scenario",
        choices=("default", "faults", "auth", "tight"),
        default="default",
        help="default: spill and failover; faults: flaky, 429 and stream-cutting upstreams; "
        "auth: client and admin keys; tight: one dedicated slot, nowhere to spill",
    )
    demo.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=argparse.SUPPRESS,  # unset: `tidegate --log-level` or the demo's own quiet default
        help="info: one JSON line per request and the canary's events (default: warning, so the "
        "banner stays on screen)",
    )
    demo.set_defaults(run=_demo, quiet_log_level="warning")


def _demo(args: argparse.Namespace) -> int:
    from router.app import create_app  # noqa: PLC0415 (lazy: the other commands start fast)
    from tidegate.cli.scenarios import SCENARIOS  # noqa: PLC0415 (lazy: it loads the simulator)
    from tidegate.sim.app import create_sim_app  # noqa: PLC0415

    scenario = SCENARIOS[args.scenario]
    env = dict(os.environ)
    companions, upstreams = [], []
    for var, profile in scenario.sims.items():
        sock = bind("127.0.0.1", 0)
        env[var] = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        companions.append(Served(create_sim_app(profile), sock))
        upstreams.append(f"    {profile.kind.value:10} {profile.name:16} {env[var]}")
    text = resources.files("router").joinpath("examples", scenario.config).read_text(encoding="utf-8")
    config = parse_config(text, env)
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        print(cannot_listen(args.host, args.port, exc, "--port N, or make demo PORT=N"), file=sys.stderr)
        return 2
    url = f"http://{args.host}:{sock.getsockname()[1]}/v1"
    key = config.auth.api_keys[0] if scenario.needs_key else "unused"
    tidegate = _command()
    print(
        _DEMO_BANNER.format(
            url=url,
            scenario=args.scenario,
            summary=scenario.summary,
            upstreams="\n".join(upstreams),
            key=key,
            try_this=scenario.try_this,
            root=url.removesuffix("/v1"),
            admin=config.auth.admin_key,
            canary=_canary_banner(config, url.removesuffix("/v1"), tidegate),
            tidegate=tidegate,
            python=_python(),
            quiet="" if getattr(args, "log_level", None) in ("debug", "info") else _QUIET,
        ),
        flush=True,
    )
    run(serving_of(create_app(config), sock, config), companions)
    return 0


def _command() -> str:
    """`tidegate` as another terminal can run it: the bare name when that terminal's PATH finds
    this same program, else its full path (`make demo` runs .venv/bin/tidegate, not on PATH)."""
    ours = Path(sys.argv[0]).resolve()
    found = shutil.which("tidegate")
    if found and Path(found).resolve() == ours:
        return "tidegate"
    return str(ours) if ours.name == "tidegate" else f"{sys.executable} -m tidegate"


def _python() -> str:
    """The interpreter whose environment has the `openai` package, if this one does."""
    try:
        import openai  # noqa: F401, PLC0415 (only asked whether it is installed)
    except ImportError:
        return "python3 (after: pip install openai)"
    return sys.executable


def canary_volume(canary: CanaryControllerConfig) -> str:
    """What traffic a canary run needs to move at all, said where a user first meets it."""
    first = canary.plan()[0]
    needed = f"{canary.min_samples} requests per side per {canary.interval_s:g} s analysis (fewer: it holds)"
    if first >= 100:  # no serverless side to compare with at the first step
        return f"It steps on {needed}."
    rate = canary.min_samples / (min(first, 100 - first) / 100) / canary.interval_s
    return (
        f"It steps up on {needed}: about {rate:.1f}\nrequests/s at {first:g}%, streamed or not. "
        "The percent is a share of `user` values (else\nx-tidegate-session, else each request), "
        "not of requests."
    )


def _canary_banner(config: GatewayConfig, root: str, tidegate: str) -> str:
    """How to watch the demo's canary runs, for the models that have one."""
    lines = [
        f"\nThe canary run of {name} (steps {', '.join(f'{p:g}%' for p in model.canary.plan())}):\n\n"
        f"    {tidegate} canary status {name} --url {root} --admin-key {config.auth.admin_key} --watch\n\n"
        f"{canary_volume(model.canary)}\n"
        for name, model in config.models.items()
        if model.canary is not None
    ]
    return "".join(lines)


_QUIET = "; --log-level info shows one JSON line per request"
_DEMO_BANNER = """\
tidegate demo ({scenario}): gateway on {url} (embedded in-memory state store)
  model demo-model: {summary}
{upstreams}

Point any OpenAI client at it. From a shell:

    curl -si {url}/chat/completions \\
      -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\
      -d '{{"model": "demo-model", "messages": [{{"role": "user", "content": "Hello"}}]}}'

In Python, with {python}:

    from openai import OpenAI
    client = OpenAI(base_url="{url}", api_key="{key}")
    reply = client.chat.completions.create(
        model="demo-model", messages=[{{"role": "user", "content": "Hello"}}])
    print(reply.choices[0].message.content)

Try: {try_this}

Response headers x-tidegate-route / -kind / -reason / -outcome say where each request went.
Watch every route (TTFT p50/p95/p99, CV%, spills, utilization) from another terminal:

    {tidegate} stats --url {root} --admin-key {admin} --watch
{canary}
Prometheus metrics: {root}/metrics{quiet}.
Other scenarios: {tidegate} demo --scenario default | faults | auth | tight. Ctrl-C stops everything.
"""
