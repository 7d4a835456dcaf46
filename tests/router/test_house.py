"""The house stays small: no module over 400 lines and no function over 60 (issue 27), in
the gateway, the policies and the benchmarks, and no code cites a file outside the repository."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
SOURCES = sorted(p for room in ("router", "policies", "tidegate", "bench") for p in (ROOT / room).rglob("*.py"))


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


def _texts() -> list[Path]:
    """Every file a reader of the repository reads: code, tests, docs, config and packaging."""
    found = [
        *SOURCES,
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "scripts").iterdir(),
    ]
    found += [*(ROOT / "examples").iterdir(), *(p for p in (ROOT / "helm").rglob("*") if p.is_file())]
    found += [ROOT / name for name in ("README.md", "pyproject.toml", "Dockerfile", "Makefile", "mkdocs.yml")]
    return [p for p in found if p.is_file() and p != Path(__file__) and "__pycache__" not in p.parts]


def test_no_reference_to_files_outside_the_repository() -> None:
    """The design lives in docs/architecture.md; nothing points at the team's shared notes."""
    citing = [
        str(p.relative_to(ROOT))
        for p in _texts()
        if "DESIGN.md" in (text := p.read_text()) or "../shared/" in text
    ]
    assert not citing, f"cite docs/architecture.md instead: {citing}"


_PATH = re.compile(
    r"\b((?:router|policies|bench|tests|scripts|examples|docs)/[\w/.-]*\w\.(?:py|md|yaml|mjs|json|csv))\b"
)


def test_every_path_the_repository_names_exists() -> None:
    """A comment or a page that names a module names one that is there (moves leave none stale)."""
    stale = sorted(
        f"{p.relative_to(ROOT)}: {name}"
        for p in _texts()
        for name in set(_PATH.findall(p.read_text()))
        if not any((base / name).exists() for base in (ROOT, ROOT / "docs", ROOT / "helm", p.parent))
    )
    assert not stale, stale


def _classes() -> list[tuple[Path, ast.ClassDef]]:
    return [
        (path, node)
        for path in SOURCES
        if path.parts[len(ROOT.parts)] in ("router", "policies", "tidegate")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]


def _base_name(base: ast.expr) -> str:
    return base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else ""


def test_no_product_class_is_assembled_from_the_projects_own_classes_as_mixins() -> None:
    """Issue 37: a store is a composition of role objects, not a class cut into mixins. A
    Protocol may extend protocols (that is a type, not a product); any other class has at most
    one base among the project's own classes."""
    classes = _classes()
    own = {node.name for _, node in classes}
    assert {"RedisStore", "MemoryStore", "RedisLeases", "MemoryLeases"} <= own  # the walk finds them
    mixed = [
        f"{path.relative_to(ROOT)}: {node.name}({', '.join(names)})"
        for path, node in classes
        if "Protocol" not in (names := [_base_name(b) for b in node.bases])
        and sum(name in own for name in names) > 1
    ]
    assert not mixed, f"compose role objects instead: {mixed}"


def test_policy_settings_are_declared_once() -> None:
    """Issue 37: every setting a policy step reads is a protocol in policies/settings.py, and no
    other policy module declares a `...Settings` protocol of its own beside it."""
    settings = ROOT / "policies" / "settings.py"
    declared = [
        f"{path.relative_to(ROOT)}: {node.name}"
        for path, node in _classes()
        if path.parts[len(ROOT.parts)] == "policies"
        and "Protocol" in [_base_name(b) for b in node.bases]
        and (node.name.endswith("Settings") or node.name.endswith("Budget"))
    ]
    elsewhere = [d for d in declared if not d.startswith("policies/settings.py")]
    assert len(declared) - len(elsewhere) >= 6, declared  # the walk finds the ones declared there
    assert not elsewhere, f"declare policy settings in {settings.relative_to(ROOT)}: {elsewhere}"
