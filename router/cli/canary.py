"""`tidegate canary set|reset|status|start|pause|resume|abort|promote|plan MODEL`: the canary
through the admin API (`PUT/DELETE/GET/POST /admin/models/{m}/canary...`), `status --watch` as a
live table."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group
from rich.table import Table

from router.cli.admin_client import AdminCallFailed, call_admin
from router.cli.watch import add_admin_options, show


def render_status(status: dict[str, Any]) -> Group:
    run = status["run"]
    plan = " → ".join(f"{p:g}" for p in status["plan"])
    head = (
        f"{status['model']}: [bold]{run['state']}[/] at {status['live_percent']:g}% "
        f"(plan {plan}; step {run['step'] + 1 if run['step'] >= 0 else '-'} of {len(status['plan'])}; "
        f"failures in a row {run['failures']})"
    )
    lines: list[Any] = [head]
    if status.get("live_override"):
        lines.append(
            live_override_line(status["model"], status["live_percent"], status["configured_percent"])
        )
    if status["next_analysis_in_s"] is not None:
        lines.append(
            f"next analysis in {status['next_analysis_in_s']:.0f}s (every {status['interval_s']:g}s)"
        )
    if run["note"]:
        lines.append(f"note: {run['note']}")
    table = Table(title="history (newest first)", title_justify="left")
    for column in ("time (UTC)", "action", "percent", "verdict", "reason", "checks"):
        table.add_column(column)
    for event in status["history"]:
        checks = ""
        if event.get("analysis"):
            checks = ", ".join(_check(c) for c in event["analysis"]["checks"])
        before = event.get("percent_before")
        percent = f"{before:g} → {event['percent']:g}" if before is not None else f"{event['percent']:g}"
        table.add_row(
            datetime.fromtimestamp(event["at"], UTC).strftime("%H:%M:%S"),
            event["action"],
            percent,
            event.get("verdict") or "-",
            (event.get("reason") or "")[:60],
            checks[:90],
        )
    lines.append(table)
    return Group(*lines)


def live_override_line(model: str, live: float, configured: float) -> str:
    """Said wherever the percent is shown: a live percent outlives restarts and wins over the file."""
    return (
        f"live canary {live:g}% overrides the file's canary_percent {configured:g}% (set live, kept "
        f"across restarts); `tidegate canary reset {model}` returns to the file's"
    )


def _check(check: dict[str, Any]) -> str:
    ded, sl = check["dedicated"], check["serverless"]
    shown = f"{ded:.3g}" if ded is not None else "-"
    if sl is not None:
        shown += f"/{sl:.3g}"
    return f"{check['name']} {check['result']} ({shown} vs {check['limit']:g})"


def render_plan(plan: dict[str, Any]) -> str:
    analysis = plan["analysis"]
    checks = "\n".join(f"  {_check(c)}" for c in analysis["checks"])
    if plan.get("hypothetical"):
        head = (
            f"{plan['model']} ({plan['state']}: no run in progress). A run started now would begin at "
            f"{plan['percent']:g}% and {plan['would']} → {plan['percent_after']:g}%"
        )
    else:
        head = (
            f"{plan['model']} ({plan['state']}, at {plan['percent']:g}%): the controller would "
            f"{plan['would']} → {plan['percent_after']:g}%"
        )
    return f"{head}\nverdict: {analysis['verdict']} ({analysis['reason']})\n{checks}"


def add_parser(commands: Any) -> None:
    canary = commands.add_parser("canary", help="a model's canary: set it by hand, or drive the controller")
    actions = canary.add_subparsers(required=True, metavar="ACTION")
    setter = actions.add_parser("set", help="set MODEL's canary percent on every replica")
    setter.add_argument("model")
    setter.add_argument("percent", type=float)
    add_admin_options(setter)
    setter.set_defaults(run=_canary_set)
    reset = actions.add_parser("reset", help="drop MODEL's live percent: back to the file's canary_percent")
    reset.add_argument("model")
    add_admin_options(reset)
    reset.set_defaults(run=_canary_reset)
    status = actions.add_parser("status", help="the canary controller's run and history")
    status.add_argument("model")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--every", type=float, default=2.0, help="seconds between refreshes with --watch")
    add_admin_options(status)
    status.set_defaults(run=_canary_status)
    for action, text in _ACTIONS:
        command = actions.add_parser(action, help=text)
        command.add_argument("model")
        add_admin_options(command)
        command.set_defaults(run=_canary_action, action=action)


_ACTIONS = (
    ("start", "start a run: step through the plan while dedicated holds up"),
    ("pause", "pause the run at its current percent"),
    ("resume", "resume a paused run"),
    ("abort", "end the run and send the model's traffic back to 0 percent"),
    ("promote", "end the run at the plan's last percent"),
    ("plan", "dry run: what the controller would do now, and why (changes nothing)"),
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
    if live != configured:
        print(live_override_line(args.model, live, configured))
    return 0


def _canary_reset(args: argparse.Namespace) -> int:
    try:
        body = call_admin("DELETE", args.url, f"/admin/models/{args.model}/canary", args.admin_key)
    except AdminCallFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{args.model}: canary {body['canary_percent']:g}% (the file's canary_percent; no live percent)")
    return 0


def _canary_status(args: argparse.Namespace) -> int:
    def fetch() -> Group:
        return render_status(
            call_admin("GET", args.url, f"/admin/models/{args.model}/canary", args.admin_key)
        )

    return show(fetch, Console(), watch=args.watch, every_s=args.every)


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
