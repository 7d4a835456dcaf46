"""The `tidegate` command: `serve` (the gateway for a config file), `demo` (the gateway in
front of simulated upstreams), `sim` (one simulated upstream), `check-config`, `canary get |
set` (a model's live canary percent), `stats` (the routes report, once or `--watch`) and
`report` (costs, what-ifs, advice and traffic shape).

The simulator is imported only by the commands that start it."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console, Group
from rich.live import Live

from router.app import build_policies, create_app
from router.cli import plan as plan_cli
from router.cli import probe as probe_cli
from router.cli import replay as replay_cli
from router.cli import sim as sim_cli
from router.cli.admin_client import AdminCallFailed, call_admin
from router.cli.canary import render_plan, render_status
from router.cli.serving import (
    Served,
    bind,
    configure_logging,
    run,
    run_workers,
    serving_of,
    startup_failed,
)
from router.cli.stats import render
from router.config import ConfigError, GatewayConfig, load_config, parse_config


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    code: int = args.run(args)
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidegate", description=__doc__)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the gateway for a config file")
    serve.add_argument("--config", required=True, type=Path, help="path to tidegate.yaml")
    serve.add_argument("--host", help="override listen.host")
    serve.add_argument("--port", type=int, help="override listen.port")
    serve.add_argument(
        "--workers", type=int, default=1, help="processes accepting on the port (more than 1 needs Redis)"
    )
    serve.set_defaults(run=_serve)

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
    demo.set_defaults(run=_demo)

    check = commands.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("file", type=Path)
    check.set_defaults(run=_check_config)

    canary = commands.add_parser("canary", help="a model's canary: set it by hand, or drive the controller")
    canary_commands = canary.add_subparsers(required=True, metavar="ACTION")
    canary_set = canary_commands.add_parser("set", help="set MODEL's canary percent on every replica")
    canary_set.add_argument("model")
    canary_set.add_argument("percent", type=float)
    _add_admin_args(canary_set)
    canary_set.set_defaults(run=_canary_set)
    status = canary_commands.add_parser("status", help="the canary controller's run and history")
    status.add_argument("model")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--every", type=float, default=2.0, help="seconds between refreshes with --watch")
    _add_admin_args(status)
    status.set_defaults(run=_canary_status)
    for action, text in (
        ("start", "start a run: step through the plan while dedicated holds up"),
        ("pause", "pause the run at its current percent"),
        ("resume", "resume a paused run"),
        ("abort", "end the run and send the model's traffic back to 0%"),
        ("promote", "end the run at the plan's last percent"),
        ("plan", "dry run: what the controller would do now, and why (changes nothing)"),
    ):
        command = canary_commands.add_parser(action, help=text)
        command.add_argument("model")
        _add_admin_args(command)
        command.set_defaults(run=_canary_action, action=action)

    stats = commands.add_parser(
        "stats", help="per-route figures over a window, as tables (GET /admin/routes)"
    )
    stats.add_argument("--window", default="5m", help="e.g. 30s, 5m, 1h (default 5m)")
    stats.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    stats.add_argument("--every", type=float, default=2.0, help="seconds between refreshes with --watch")
    _add_admin_args(stats)
    stats.set_defaults(run=_stats)

    probe_cli.add_parser(commands, _probe, os.environ.get("TIDEGATE_ADMIN_KEY", ""))
    for add_parser in (replay_cli.add_parser, plan_cli.add_parser, sim_cli.add_parser):
        add_parser(commands)

    report = commands.add_parser(
        "report",
        help="cost per route and per successful task, what-ifs, advice and traffic shape (GET /admin/report)",
    )
    report.add_argument("--model", help="one model (default: all)")
    report.add_argument("--window", default="24h", help="e.g. 30m, 6h, 24h, 7d (default 24h)")
    report.add_argument("--format", choices=("table", "json", "html"), default="table")
    report.add_argument(
        "--out", type=Path, help="also write report.json (and with html: the PNGs and report.html)"
    )
    _add_admin_args(report)
    report.set_defaults(run=_report)

    return parser


def _add_admin_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("TIDEGATE_URL", "http://127.0.0.1:8000"),
        help="the gateway's base URL (env TIDEGATE_URL)",
    )
    parser.add_argument(
        "--admin-key",
        default=os.environ.get("TIDEGATE_ADMIN_KEY", ""),
        help="the admin key (env TIDEGATE_ADMIN_KEY)",
    )


def _canary_set(args: argparse.Namespace) -> int:
    try:
        body = call_admin(
            "PUT", args.url, f"/admin/models/{args.model}/canary", args.admin_key, {"percent": args.percent}
        )
    except AdminCallFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    live, configured = body["canary_percent"], body["configured_canary_percent"]
    print(f"{args.model}: canary {live:g}% (configured {configured:g}%)")
    return 0


def _canary_status(args: argparse.Namespace) -> int:
    def fetch() -> Group:
        return render_status(
            call_admin("GET", args.url, f"/admin/models/{args.model}/canary", args.admin_key)
        )

    return _show(fetch, Console(), watch=args.watch, every_s=args.every)


def _show(fetch: Callable[[], Group], console: Console, *, watch: bool, every_s: float) -> int:
    """Print `fetch()` once, or keep it live (refreshed every `every_s`) until Ctrl-C.

    Ctrl-C sets an event instead of raising KeyboardInterrupt wherever the main thread happens
    to be: raised inside a lock's critical section (rich's, or the HTTP client's), it can leave
    the lock held and the exit hung (seen once in the suite)."""
    try:
        if not watch:
            console.print(fetch())
            return 0
        stop = threading.Event()
        previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
        try:
            with Live(fetch(), console=console, refresh_per_second=4) as live:
                while not stop.wait(every_s):
                    live.update(fetch())
        finally:
            signal.signal(signal.SIGINT, previous)
        return 0
    except AdminCallFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the handler was installed
        return 0


def _canary_action(args: argparse.Namespace) -> int:
    try:
        if args.action == "plan":
            print(
                render_plan(
                    call_admin("GET", args.url, f"/admin/models/{args.model}/canary/plan", args.admin_key)
                )
            )
            return 0
        found = call_admin(
            "POST", args.url, f"/admin/models/{args.model}/canary/{args.action}", args.admin_key
        )
    except AdminCallFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    Console().print(render_status(found))
    return 0


def _stats(args: argparse.Namespace) -> int:
    """Print the routes report once, or refresh it every `--every` seconds with `--watch`."""
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the tables into 80 columns
        console = Console(width=220)

    def fetch() -> Group:
        return render(call_admin("GET", args.url, f"/admin/routes?window={args.window}", args.admin_key))

    return _show(fetch, console, watch=args.watch, every_s=args.every)


def _probe(args: argparse.Namespace) -> int:
    console = Console()
    if not console.is_terminal:  # piped or captured: keep the table whole
        console = Console(width=200)
    if args.compare:
        console.print(probe_cli.compare(*args.compare))
        return 0
    problem = probe_cli.check_args(args)
    if problem is not None:
        print(f"tidegate probe: {problem}", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return 2
    args.prompt = args.prompt or probe_cli.DEFAULT_PROMPT
    chosen = probe_cli.targets(config, args.model, args.endpoint)
    every = probe_cli.schedule(args)
    runs = 1 if every is None else max(1, int(every[1] // every[0]))
    console.print(
        f"probe plan: {runs} run(s), each {args.warmup} warm-up + {args.requests} requests per endpoint, "
        f"one at a time, {args.interval_s:g}s apart, max_tokens {args.max_tokens}:"
    )
    planned = (args.requests + args.warmup) * runs
    for name, line in probe_cli.estimate(chosen, planned, args.prompt, args.max_tokens):
        console.print(f"  {name}: {line}")
    status = probe_cli.refused(args)
    if status is not None:
        return status
    out = args.out or Path(f"probe-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    for run_index in range(runs):
        started = time.monotonic()
        target = out if every is None else out / time.strftime("run-%Y%m%d-%H%M%S", time.gmtime())
        found = probe_cli.run_probe(args, config, chosen, target, console)
        console.print(probe_cli.table(found))
        for entry in found["ranking"]:
            if entry["caution"]:
                console.print(f"  {entry['endpoint']}: {entry['caution']}")
        console.print(f"results: {target}")
        if args.apply and not _apply_probe(args, found, console):
            return 1
        if every is not None:
            console.print(probe_cli.hours_table(out) or "")  # every run so far: peak against off-peak
        if every is not None and run_index < runs - 1:
            time.sleep(max(0.0, every[0] - (time.monotonic() - started)))
    return 0


def _apply_probe(args: argparse.Namespace, found: dict[str, Any], console: Console) -> bool:
    try:
        models = probe_cli.apply(args.apply, args.admin_key, found, call_admin)
    except AdminCallFailed as exc:
        print(f"--apply: {exc}", file=sys.stderr)
        return False
    console.print(f"applied the ranking to {args.apply} for {', '.join(models)}")
    return True


def _report(args: argparse.Namespace) -> int:
    from router.cli import report as reporting  # noqa: PLC0415 (lazy: matplotlib only for html)

    console = Console(stderr=True)
    query = f"/admin/report?window={args.window}" + (f"&model={args.model}" if args.model else "")
    try:
        with console.status(f"gathering the last {args.window} from {args.url} ..."):
            found = call_admin("GET", args.url, query, args.admin_key, timeout=60)
    except AdminCallFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    figures: dict[str, bytes] = {}
    if args.format == "html":
        with console.status("drawing the plots ..."):
            figures = reporting.plots(found)
    if args.out is not None:
        for path in reporting.write_out(found, args.out, figures):
            console.print(f"wrote {path}")
    if args.format == "json":
        sys.stdout.write(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif args.format == "html":
        if args.out is None:
            sys.stdout.write(reporting.write_html(found, figures))
    else:
        Console(width=None if sys.stdout.isatty() else 200).print(reporting.render_tables(found))
    return 0


def _check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
        build_policies(config)
    except ConfigError as exc:
        print(f"{args.file}: {len(exc.problems)} problem(s)", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    for name, model in config.models.items():
        routes = ", ".join(f"{e.name} ({e.kind})" for e in model.endpoints)
        print(f"model {name}: policy {model.policy}, canary {model.canary_percent:g}%, {routes}")
    worst = config.limits.worst_case_bytes() / (1 << 20)
    print(f"limits: clients can make one process hold at most {worst:,.0f} MiB (README: Security and limits)")
    print(f"{args.file}: OK")
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        app = create_app(config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.workers < 1 or (args.workers > 1 and not config.state.redis_url):
        print(
            "--workers must be 1 without state.redis_url: the memory store is per process, so "
            "workers would each admit max_concurrency (set TIDEGATE_REDIS_URL / state.redis_url)",
            file=sys.stderr,
        )
        return 2
    sock = bind(args.host or config.listen.host, args.port if args.port is not None else config.listen.port)
    host, port = sock.getsockname()[:2]
    print(
        f"tidegate listening on http://{host}:{port}/v1 ({len(config.models)} model(s), "
        f"store: {app.state.store.name}, workers: {args.workers})",
        flush=True,
    )
    served = serving_of(app, sock, config)
    if args.workers == 1:
        with contextlib.suppress(SystemExit):  # uvicorn exits 3 when the lifespan refused to start
            run(served)
        failed = startup_failed(app)
        if failed:
            print(f"tidegate: cannot start: {failed}", file=sys.stderr)
            return 2
        return 0
    return run_workers(lambda: create_app(config), served, args.workers)


def _demo(args: argparse.Namespace) -> int:
    from router.cli.scenarios import SCENARIOS  # noqa: PLC0415 (lazy: it loads the simulator)
    from router.sim.app import create_sim_app  # noqa: PLC0415

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
    sock = bind(args.host, args.port)
    url = f"http://{args.host}:{sock.getsockname()[1]}/v1"
    key = config.auth.api_keys[0] if scenario.needs_key else "unused"
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
            canary=_canary_banner(config, url.removesuffix("/v1")),
        ),
        flush=True,
    )
    run(serving_of(create_app(config), sock, config), companions)
    return 0


def _canary_banner(config: GatewayConfig, root: str) -> str:
    """How to watch the demo's canary runs, for the models that have one."""
    lines = [
        f"\nThe canary run of {name} (steps {', '.join(f'{p:g}%' for p in model.canary.plan())}):\n\n"
        f"    tidegate canary status {name} --url {root} --admin-key {config.auth.admin_key} --watch\n"
        for name, model in config.models.items()
        if model.canary is not None
    ]
    return "".join(lines)


_DEMO_BANNER = """\
tidegate demo ({scenario}): gateway on {url} (embedded in-memory state store)
  model demo-model: {summary}
{upstreams}

Point any OpenAI client at it:

    from openai import OpenAI
    client = OpenAI(base_url="{url}", api_key="{key}")
    reply = client.chat.completions.create(
        model="demo-model", messages=[{{"role": "user", "content": "Hello"}}])
    print(reply.choices[0].message.content)

Try: {try_this}

Response headers x-tidegate-route / -kind / -reason / -outcome say where each request went.
Watch every route (TTFT p50/p95/p99, CV%, spills, utilization) from another terminal:

    tidegate stats --url {root} --admin-key {admin} --watch
{canary}
Prometheus metrics: {root}/metrics. One JSON line per request is logged below.
Other scenarios: tidegate demo --scenario default | faults | auth | tight. Ctrl-C stops everything.
"""
