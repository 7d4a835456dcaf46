"""tidegate: an OpenAI-compatible LLM gateway that fills reserved GPUs and spills bursts to
serverless providers. Every command is described in docs/commands.md."""

# Each command lives in its own module (`_COMMANDS`): the gateway's in router/cli/, the offline
# tools' in tidegate/cli/; each adds its parser here;
# the parsers are the one declaration (tests/router/test_commands_listed.py holds docs/commands.md
# and the README's table to them). The simulator is imported only by the commands that start it.

from __future__ import annotations

import argparse
from collections.abc import Sequence

from router.cli import canary, gateway, keys, report, stats
from router.cli.serving import configure_logging
from tidegate.cli import demo, parity, plan, probe, replay, sim, trace

_COMMANDS = (gateway, demo, canary, stats, keys, probe, parity, replay, trace, plan, sim, report)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level or getattr(args, "quiet_log_level", "info"))
    code: int = args.run(args)
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidegate", description=__doc__)
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="default: info (the demo: warning)"
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.add_parser(commands)
    return parser
