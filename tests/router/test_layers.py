"""The layer rules, read from each module's imports (its AST, nothing is imported):

- `policies` imports nothing from `router`: policies own their vocabulary, the gateway
  imports it (router -> policies, never the reverse);
- nothing in production imports the simulator (`router.sim`) except the CLI, which starts
  it for `tidegate demo` / `tidegate sim`;
- the state stores (`router.state`) import no request-path module (dispatch, api, app,
  relay, upstream, bookkeeping, breaker, signals).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUEST_PATH = {"dispatch", "api", "app", "relay", "upstream", "bookkeeping", "breaker", "signals", "job"}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def imported(path: Path) -> set[str]:
    """Every module `path` imports, absolute, at any depth of its code (lazy imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_the_packages_are_where_the_rules_expect_them():
    assert modules("policies") and modules("router/state") and (ROOT / "router/sim").is_dir()


@pytest.mark.parametrize("path", modules("policies"), ids=module_name)
def test_policies_import_nothing_from_router(path):
    assert not {m for m in imported(path) if m == "router" or m.startswith("router.")}


def _is_cli(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return parts[:2] == ("router", "cli") or parts == ("router", "cli.py")


def _production_outside_the_simulator() -> list[Path]:
    return [p for p in modules("router") if "sim" not in p.relative_to(ROOT).parts[1:2] and not _is_cli(p)]


@pytest.mark.parametrize("path", _production_outside_the_simulator(), ids=module_name)
def test_only_the_cli_imports_the_simulator(path):
    assert not {m for m in imported(path) if m.startswith("router.sim")}


@pytest.mark.parametrize("path", modules("router/state"), ids=module_name)
def test_the_state_stores_import_no_request_path_module(path):
    request_path = {f"router.{name}" for name in REQUEST_PATH}
    assert not {m for m in imported(path) if m in request_path or m.rpartition(".")[0] in request_path}
