"""A process imports what its command needs and nothing else: `tidegate sim` never loads the
gateway, and a gateway on the memory store without OTLP or named nameservers never loads
redis-py, the OpenTelemetry SDK or dnspython (each cost a process a few tenths of a second of
CPU at start, paid by every simulator and gateway a deployment or the suite starts)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from tidegate.cli.main import _COMMANDS, command_named

GATEWAY_EXTRAS = ("redis", "opentelemetry.sdk", "opentelemetry.exporter", "dns")


def declared_by(module: str) -> set[str]:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    importlib.import_module(module).add_parser(commands)
    return set(commands.choices)


def test_the_command_index_names_each_module_with_the_commands_its_parser_declares():
    for module in set(_COMMANDS.values()):
        assert declared_by(module) == {name for name, owner in _COMMANDS.items() if owner == module}


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        (["sim", "--port", "0"], "sim"),
        (["--log-level", "debug", "serve", "--config", "x"], "serve"),
        (["--log-level=debug", "plan"], "plan"),
        (["--help"], None),
        (["bogus"], None),
        ([], None),
    ],
)
def test_the_command_word_is_found_after_the_global_options(argv, found):
    assert command_named(argv) == found


def loaded_after(code: str) -> set[str]:
    """The top-level and second-level module names a fresh interpreter holds after `code`."""
    probe = f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_a_simulator_process_loads_no_gateway_and_no_other_command():
    loaded = loaded_after("from tidegate.cli.main import _parser; _parser('sim')")
    assert "tidegate.cli.sim" in loaded
    assert not {"router.app", "router.cli.gateway", "tidegate.cli.plan", "redis"} & loaded


def test_a_memory_store_gateway_loads_no_redis_no_otel_sdk_and_no_dnspython():
    config = (
        "auth: {allow_anonymous: true}\n"
        "models:\n  m:\n"
        "    dedicated: [{name: d, base_url: 'http://127.0.0.1:1/v1', model: x, gpu_hour_usd: 1, max_concurrency: 2}]\n"
        "    serverless: [{name: s, base_url: 'http://127.0.0.1:2/v1', model: y, usd_per_mtok_in: 1, usd_per_mtok_out: 1}]\n"
    )
    code = f"from router.app import create_app\nfrom router.config import parse_config\ncreate_app(parse_config({config!r}, {{}}))"
    loaded = loaded_after(code)
    assert "router.app" in loaded
    extras = {name for name in loaded if name.startswith(GATEWAY_EXTRAS)}
    assert not extras, f"a memory-store gateway loaded {sorted(extras)}"
