"""`tidegate canary status|start|pause|resume|abort|promote|plan MODEL`: the canary controller
through the admin API (`GET/POST /admin/models/{m}/canary...`), `status --watch` as a live table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Group
from rich.table import Table


def render_status(status: dict[str, Any]) -> Group:
    run = status["run"]
    plan = " → ".join(f"{p:g}" for p in status["plan"])
    head = (
        f"{status['model']}: [bold]{run['state']}[/] at {status['live_percent']:g}% "
        f"(plan {plan}; step {run['step'] + 1 if run['step'] >= 0 else '-'} of {len(status['plan'])}; "
        f"failures in a row {run['failures']})"
    )
    lines: list[Any] = [head]
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


def _check(check: dict[str, Any]) -> str:
    ded, sl = check["dedicated"], check["serverless"]
    shown = f"{ded:.3g}" if ded is not None else "-"
    if sl is not None:
        shown += f"/{sl:.3g}"
    return f"{check['name']} {check['result']} ({shown} vs {check['limit']:g})"


def render_plan(plan: dict[str, Any]) -> str:
    analysis = plan["analysis"]
    checks = "\n".join(f"  {_check(c)}" for c in analysis["checks"])
    return (
        f"{plan['model']} ({plan['state']}, at {plan['percent']:g}%): the controller would {plan['would']} "
        f"→ {plan['percent_after']:g}%\nverdict: {analysis['verdict']} ({analysis['reason']})\n{checks}"
    )
