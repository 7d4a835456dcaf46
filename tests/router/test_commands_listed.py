"""The commands are declared once, by their parsers: docs/commands.md and the README's table
name every command and every action of the commands that have actions."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from tidegate.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def listed(argv: list[str]) -> list[str]:
    """The commands (or actions) `tidegate ARGV --help` lists under its positional arguments."""
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), contextlib.suppress(SystemExit):
        main([*argv, "--help"])
    section = shown.getvalue().split("positional arguments:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^    ([a-z][a-z-]*)", section, re.M)


def commands() -> dict[str, list[str]]:
    """Each command and its actions (`canary set`, `keys create`, ...), as the parsers declare them."""
    found: dict[str, list[str]] = {}
    for name in listed([]):
        usage = io.StringIO()
        with contextlib.redirect_stdout(usage), contextlib.suppress(SystemExit):
            main([name, "--help"])
        has_actions = re.search(r" [A-Z]+ \.\.\.$", usage.getvalue().splitlines()[0])  # `ACTION ...`
        found[name] = listed([name]) if has_actions else []
    return found


def named(text: str) -> dict[str, set[str]]:
    """`tidegate CMD a|b|c` and `canary start|pause` forms: each command with the words after it."""
    shown: dict[str, set[str]] = {}
    for cmd, rest in re.findall(r"`(?:tidegate )?([a-z-]+) ([a-z-]+(?:\\?\|[a-z-]+)*)", text):
        shown.setdefault(cmd, set()).update(re.split(r"\\?\|", rest))
    for cmd in re.findall(r"`tidegate ([a-z-]+)", text):
        shown.setdefault(cmd, set())
    return shown


def test_every_command_and_action_is_in_the_docs_and_the_readme():
    for page in (ROOT / "docs" / "commands.md", ROOT / "README.md"):
        shown = named(page.read_text())
        for command, actions in commands().items():
            assert command in shown, f"{page.name} does not name `tidegate {command}`"
            missing = set(actions) - shown[command]
            assert not missing, f"{page.name} does not name `tidegate {command}` {sorted(missing)}"


def test_the_parsers_have_commands_with_actions():
    found = commands()
    assert len(found) >= 12
    assert {"set", "reset", "status"} <= set(found["canary"])
    assert {"create", "revoke"} <= set(found["keys"]) and "synth" in found["trace"]
