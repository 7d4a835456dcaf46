"""The house stays small: no module over 400 lines and no function over 60 (issue 27), in
the gateway, the policies and the benchmarks, and no code cites a file outside the repository."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
SOURCES = sorted(p for room in ("router", "policies", "bench") for p in (ROOT / room).rglob("*.py"))


def test_there_are_sources_to_check() -> None:
    assert len(SOURCES) > 50


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_function_sizes(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_FILE_LINES, f"{path.name}: split it by what its parts do"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_reference_to_files_outside_the_repository() -> None:
    """The design lives in docs/architecture.md; nothing points at the team's shared notes."""
    citing = [
        str(p.relative_to(ROOT))
        for p in [*SOURCES, *(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
        if p != Path(__file__) and ("DESIGN.md" in p.read_text() or "../shared/" in p.read_text())
    ]
    citing += [str(p.relative_to(ROOT)) for p in (ROOT / "examples").iterdir() if "DESIGN.md" in p.read_text()]
    assert not citing, f"cite docs/architecture.md instead: {citing}"
