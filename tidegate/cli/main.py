"""tidegate: an OpenAI-compatible LLM gateway that fills reserved GPUs and spills bursts to
serverless providers. Every command is described in docs/commands.md."""

# Each command lives in its own module: the gateway's in router/cli/, the offline tools' in
# tidegate/cli/; each adds its parser here. The parsers are the one declaration of a command's
# arguments (tests/router/test_commands_listed.py holds docs/commands.md and the README's table to
# them); `_COMMANDS` only says which module declares each command, so that a process imports the
# module of the command it runs and no other (importing all of them cost a simulator or a gateway
# ~2 s of CPU at start). tests/router/test_cli_main.py holds `_COMMANDS` to the parsers.

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from types import MappingProxyType

_COMMANDS = MappingProxyType(
    {
        "serve": "router.cli.gateway",
        "check-config": "router.cli.gateway",
        "demo": "tidegate.cli.demo",
        "canary": "router.cli.canary",
        "stats": "router.cli.stats",
        "keys": "router.cli.keys",
        "probe": "tidegate.cli.probe",
        "parity": "tidegate.cli.parity",
        "replay": "tidegate.cli.replay",
        "trace": "tidegate.cli.trace",
        "plan": "tidegate.cli.plan",
        "sim": "tidegate.cli.sim",
        "report": "router.cli.report",
    }
)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser(command_named(argv)).parse_args(argv)
    configure_logging(args.log_level or getattr(args, "quiet_log_level", "info"))
    code: int = args.run(args)
    return code


def configure_logging(level: str = "info") -> None:
    """Plain lines on stderr: the access log is already one JSON object per line."""
    logging.basicConfig(level=level.upper(), format="%(message)s", stream=sys.stderr, force=True)
    # the format names no thread or process, so no record looks them up (the logging HOWTO's
    # "Optimization"): an access line per request paid for both
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call is noise


def command_named(argv: Sequence[str] | None) -> str | None:
    """The command word of `argv` if it names a known command, else None (then every command's
    parser is built: for `--help`, or for argparse's own error naming the choices)."""
    words = list(sys.argv[1:] if argv is None else argv)
    while words and words[0].startswith("-"):
        flag = words.pop(0)
        if flag == "--log-level" and words:
            words.pop(0)
    return words[0] if words and words[0] in _COMMANDS else None


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidegate", description=__doc__)
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="default: info (the demo: warning)"
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    modules = [_COMMANDS[only]] if only is not None else list(dict.fromkeys(_COMMANDS.values()))
    for module in modules:
        importlib.import_module(module).add_parser(commands)
    return parser
