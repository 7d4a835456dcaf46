"""Command-line options as tables: one `option(...)` entry per flag, exactly argparse's
`add_argument` arguments, added by one loop. A command's parser then reads as its table."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Option:
    flags: tuple[str, ...]
    settings: Mapping[str, Any]


def option(*flags: str, **settings: Any) -> Option:
    """One row of an options table: the flags and argparse's settings for them."""
    return Option(flags, settings)


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, options: Iterable[Option]) -> None:
    for entry in options:
        parser.add_argument(*entry.flags, **entry.settings)


def admin_key_option(purpose: str) -> Option:
    """`--admin-key`, from TIDEGATE_ADMIN_KEY by default: every command that calls the admin API."""
    return option(
        "--admin-key",
        default=os.environ.get("TIDEGATE_ADMIN_KEY", ""),
        help=f"{purpose} (env TIDEGATE_ADMIN_KEY)",
    )
