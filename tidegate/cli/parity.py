"""`tidegate parity`: run the production suite against every endpoint of a model and say which
ones answer like the reference (docs/parity.md).

    tidegate parity --config FILE --model M --suite SUITE.jsonl [--repeat 3] [--endpoint NAME ...]
                    [--reference NAME] [--concurrency 4] [--max-usd 2] [--yes] [--min-agreement 0.95]
                    [--out DIR] [--html] [--apply URL]
    tidegate parity --compare DIR1 DIR2

Each endpoint is called directly (its base URL, model id and key; never through the routing).
Exit status: 0 when no endpoint diverges, 3 when one does (a CI job can gate on it), 2 for a
usage or config error or a run over --max-usd with nobody to ask (no terminal, no --yes), 1
when --apply failed or the person asked said no.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from router.cli.admin_client import AdminCallFailed, call_admin
from router.cli.options import add_options, admin_key_option
from router.config import ConfigError, ServerlessEndpoint, load_config
from tidegate.cli.parity_output import compare, table, write_html
from tidegate.cli.probe import refused
from tidegate.offline.parity.run import Endpoint, estimate_usd, run_suite, score
from tidegate.offline.parity.suite import Case, SuiteError, load_suite
from tidegate.offline.parity.verdict import DIVERGES, case_matrix, failed_cases, summarise, verdict

DIVERGED_EXIT = 3


def add_parser(commands: Any) -> None:
    parity = commands.add_parser(
        "parity", help="run a suite against every endpoint of a model and compare what they answer"
    )
    parity.add_argument("--config", help="the gateway config whose endpoints to test")
    parity.add_argument("--model", help="the model whose endpoints to test")
    parity.add_argument("--suite", type=Path, help="the cases, one JSON object a line (docs/parity.md)")
    parity.add_argument("--repeat", type=int, default=3, help="times each case runs on each endpoint")
    parity.add_argument("--endpoint", action="append", default=[], help="only this endpoint (repeatable)")
    parity.add_argument("--reference", help="the endpoint others are held to (default: the first dedicated)")
    parity.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    parity.add_argument("--max-usd", type=float, default=2.0, help="ask before a run estimated over this")
    parity.add_argument("--yes", action="store_true", help="do not ask, whatever the estimate")
    parity.add_argument("--min-agreement", type=float, default=0.95, help="below this share: diverges")
    parity.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    parity.add_argument("--out", type=Path, help="where results go (default parity-<UTC time>)")
    parity.add_argument("--html", action="store_true", help="also write parity.html (the case matrix)")
    parity.add_argument("--apply", metavar="URL", help="store the verdicts in a running gateway (admin API)")
    add_options(parity, [admin_key_option("for --apply")])
    parity.add_argument("--compare", nargs=2, type=Path, metavar="DIR", help="what changed between two runs")
    parity.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    console = Console() if sys.stdout.isatty() else Console(width=200)
    if args.compare:
        try:
            console.print(compare(*args.compare))
        except (OSError, ValueError, KeyError) as exc:
            print(f"tidegate parity --compare: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        cases, endpoints, reference = _prepare(args)
    except (ConfigError, SuiteError, ValueError) as exc:
        print(f"tidegate parity: {exc}", file=sys.stderr)
        return 2
    status = _over_cap(args, endpoints, cases, console)
    if status is not None:
        return status
    report = _execute(args, cases, endpoints, reference, console)
    console.print(table(report))
    for entry in report["endpoints"]:
        if entry["verdict"] == DIVERGES:
            console.print(
                f"  {entry['endpoint']} diverges: {entry['why']}; cases: {', '.join(entry['failed_cases'])}"
            )
    console.print(f"results: {report['out']}")
    if args.apply and not _apply(args, report, console):
        return 1
    return DIVERGED_EXIT if any(e["verdict"] == DIVERGES for e in report["endpoints"]) else 0


def _prepare(args: argparse.Namespace) -> tuple[list[Case], list[Endpoint], str]:
    if not (args.config and args.model and args.suite):
        raise ValueError("--config, --model and --suite are required (or --compare DIR1 DIR2)")
    if args.repeat < 1 or args.concurrency < 1 or args.timeout_s <= 0 or not 0 <= args.min_agreement <= 1:
        raise ValueError(
            "--repeat and --concurrency must be >= 1, --timeout-s > 0, --min-agreement in [0, 1]"
        )
    config = load_config(args.config)
    model = config.models.get(args.model)
    if model is None:
        raise ValueError(f"--model {args.model}: not in the config (models: {', '.join(config.models)})")
    chosen = [e for e in model.endpoints if not args.endpoint or e.name in args.endpoint]
    missing = set(args.endpoint) - {e.name for e in chosen}
    if missing:
        raise ValueError(f"--endpoint {', '.join(sorted(missing))}: not an endpoint of {args.model}")
    endpoints = [
        Endpoint(
            e.name,
            e.base_url,
            e.model,
            e.api_key,
            (e.usd_per_mtok_in, e.usd_per_mtok_out) if isinstance(e, ServerlessEndpoint) else None,
        )
        for e in chosen
    ]
    reference = args.reference or next((e.name for e in model.dedicated if e in chosen), chosen[0].name)
    if reference not in {e.name for e in endpoints}:
        raise ValueError(f"--reference {reference}: not among the endpoints tested")
    if len(endpoints) < 2:
        raise ValueError("parity needs at least two endpoints: the reference and one to hold to it")
    return load_suite(args.suite), endpoints, reference


def _over_cap(
    args: argparse.Namespace, endpoints: list[Endpoint], cases: list[Case], console: Console
) -> int | None:
    """None to go on; else the exit status (refused over --max-usd: 1 by a person, 2 with
    nobody to ask)."""
    console.print(
        f"parity plan: {len(cases)} cases x {args.repeat} repeats on {len(endpoints)} endpoints, "
        f"{args.concurrency} at a time:"
    )
    total = 0.0
    for endpoint in endpoints:
        usd = estimate_usd(endpoint, cases, args.repeat)
        total += usd or 0.0
        cost = "provisioned (already paid)" if usd is None else f"at most ${usd:.4f}"
        console.print(f"  {endpoint.name}: {len(cases) * args.repeat} requests, {cost}")
    if total <= args.max_usd:
        return None
    console.print(f"estimated at most ${total:.4f}, over --max-usd {args.max_usd:g}")
    return refused(args)


def _execute(
    args: argparse.Namespace,
    cases: list[Case],
    endpoints: list[Endpoint],
    reference: str,
    console: Console,
) -> dict[str, Any]:
    out: Path = args.out or Path(f"parity-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC).isoformat()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("parity", total=len(cases) * args.repeat * len(endpoints))
        replies = asyncio.run(
            run_suite(
                endpoints,
                cases,
                repeat=args.repeat,
                concurrency=args.concurrency,
                timeout_s=args.timeout_s,
                done=lambda reply: progress.advance(task),
            )
        )
    outcomes = score(replies, cases, endpoints, reference)
    matrix = case_matrix(outcomes)
    summaries = {e.name: summarise(e.name, [o for o in outcomes if o.endpoint == e.name]) for e in endpoints}
    for name, summary in summaries.items():
        summary["verdict"], summary["why"] = verdict(summary, summaries[reference], args.min_agreement)
        summary["failed_cases"] = failed_cases(matrix, name)
    report = {
        "at": started,
        "model": args.model,
        "suite": str(args.suite),
        "reference": reference,
        "method": {"repeat": args.repeat, "cases": len(cases), "min_agreement": args.min_agreement},
        "endpoints": list(summaries.values()),
        "cases": matrix,
        "out": str(out),
    }
    (out / "parity.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    with (out / "answers.jsonl").open("wb") as lines:
        for o in outcomes:
            lines.write(orjson.dumps(o) + b"\n")
    if args.html:
        write_html(report, out / "parity.html")
    return report


def _apply(args: argparse.Namespace, report: dict[str, Any], console: Console) -> bool:
    """PUT /admin/models/{model}/parity: the verdicts, for the spill order and the canary."""
    body = {
        "at": report["at"],
        "reference": report["reference"],
        "endpoints": {
            e["endpoint"]: {k: e[k] for k in ("verdict", "why", "pass_rate", "agreement", "failed_cases")}
            for e in report["endpoints"]
        },
    }
    try:
        call_admin("PUT", args.apply, f"/admin/models/{report['model']}/parity", args.admin_key, body)
    except AdminCallFailed as exc:
        print(f"--apply: {exc}", file=sys.stderr)
        return False
    console.print(f"applied the verdicts to {args.apply} for {report['model']}")
    return True
