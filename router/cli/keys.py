"""`tidegate keys create|rotate|list|revoke`: client keys through the admin API
(router/http/keys_admin.py; docs/tenants.md). A new or rotated secret is printed once."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from router.cli.admin_client import AdminCallFailed, call_admin
from router.cli.watch import add_admin_options


def add_parser(commands: Any) -> None:
    keys = commands.add_parser("keys", help="client keys: create, rotate, list, revoke (admin API)")
    actions = keys.add_subparsers(required=True, metavar="ACTION")
    create = actions.add_parser("create", help="a new named key; its secret is printed once")
    create.add_argument("name")
    create.add_argument("--team", default="default")
    create.add_argument("--priority", choices=["interactive", "batch"], default="interactive")
    create.add_argument(
        "--model", action="append", default=None, help="a model it may use (repeat); default all"
    )
    create.add_argument("--rpm", type=int, help="requests per minute, across every replica")
    create.add_argument("--tpm", type=int, help="tokens per minute (prompt + answer)")
    create.add_argument("--max-usd-per-day", type=float)
    create.add_argument("--max-usd-per-month", type=float)
    create.add_argument("--expires-at", help="ISO 8601 with a time zone, e.g. 2027-01-01T00:00:00Z")
    rotate = actions.add_parser("rotate", help="a new secret; the old one stays valid --overlap-s")
    rotate.add_argument("name")
    rotate.add_argument("--overlap-s", type=float, default=3600.0)
    actions.add_parser("list", help="every key (no secrets), with its spend today and this month")
    revoke = actions.add_parser("revoke", help="refused by every replica within a second")
    revoke.add_argument("name")
    for action in actions.choices.values():
        add_admin_options(action)
    for name, action in actions.choices.items():
        action.set_defaults(run=_run, action=name)


def _run(args: argparse.Namespace) -> int:
    try:
        answer = _call(args)
    except AdminCallFailed as exc:
        print(f"tidegate keys {args.action}: {exc}", file=sys.stderr)
        return 1
    console = Console() if sys.stdout.isatty() else Console(width=200)
    if args.action == "list":
        console.print(_table(answer["keys"]))
    elif "secret" in answer:
        print(f"{answer['name']}: {answer['secret']}")
        print("the secret is shown once: store it now", file=sys.stderr)
    else:
        print(f"{answer['name']}: revoked")
    return 0


def _call(args: argparse.Namespace) -> dict[str, Any]:
    if args.action == "list":
        return call_admin("GET", args.url, "/admin/keys", args.admin_key)
    if args.action == "revoke":
        return call_admin("DELETE", args.url, f"/admin/keys/{args.name}", args.admin_key)
    if args.action == "rotate":
        body = {"overlap_s": args.overlap_s}
        return call_admin("POST", args.url, f"/admin/keys/{args.name}/rotate", args.admin_key, body)
    fields = {
        "name": args.name,
        "team": args.team,
        "priority": args.priority,
        "models": args.model,
        "rpm": args.rpm,
        "tpm": args.tpm,
        "max_usd_per_day": args.max_usd_per_day,
        "max_usd_per_month": args.max_usd_per_month,
        "expires_at": args.expires_at,
    }
    return call_admin(
        "POST", args.url, "/admin/keys", args.admin_key, {k: v for k, v in fields.items() if v is not None}
    )


def _table(keys: list[dict[str, Any]]) -> Table:
    table = Table(title="client keys")
    columns = (
        "name",
        "team",
        "priority",
        "source",
        "models",
        "rpm",
        "tpm",
        "$/day",
        "$/month",
        "spent today",
    )
    for column in (*columns, "expires", "state"):
        table.add_column(column)
    for k in keys:
        table.add_row(
            k["name"],
            k["team"],
            k.get("priority", "-"),
            k["source"],
            ", ".join(k["models"]) if k.get("models") else "all",
            *(
                str(k.get(f) if k.get(f) is not None else "-")
                for f in ("rpm", "tpm", "max_usd_per_day", "max_usd_per_month")
            ),
            f"{k.get('spent_usd_today', 0):.4f}",
            k.get("expires_at") or "-",
            "unreadable" if k.get("unreadable") else "revoked" if k.get("revoked") else "active",
        )
    return table
