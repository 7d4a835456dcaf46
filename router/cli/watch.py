"""What the admin-reading commands share: the options that reach the admin API, and showing a
table once or live (`--watch`) until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable

from rich.console import Console, Group
from rich.live import Live

from router.cli.admin_client import AdminCallFailed
from router.cli.options import add_options, admin_key_option


def add_admin_options(parser: argparse.ArgumentParser) -> None:
    """`--url` and `--admin-key`, from TIDEGATE_URL and TIDEGATE_ADMIN_KEY by default."""
    parser.add_argument(
        "--url",
        default=os.environ.get("TIDEGATE_URL", "http://127.0.0.1:8000"),
        help="the gateway's base URL (env TIDEGATE_URL)",
    )
    add_options(parser, [admin_key_option("the admin key")])


def show(fetch: Callable[[], Group], console: Console, *, watch: bool, every_s: float) -> int:
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
