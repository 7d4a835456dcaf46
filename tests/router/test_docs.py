"""The docs tell the truth about the config: the annotated example and every YAML block of the
manual (a fragment merged into that example, as a user would paste it) pass the same checks
as `tidegate check-config`."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.app import build_policies
from router.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tidegate.yaml"
ENV = {"TIDEGATE_API_KEY": "client-key", "TIDEGATE_ADMIN_KEY": "admin-key"}
_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def yaml_blocks() -> list[tuple[str, str]]:
    found = []
    for page in sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")]):
        for i, block in enumerate(_BLOCK.findall(page.read_text())):
            if not block.lstrip().startswith("--8<--"):  # an included file: checked as itself
                found.append((f"{page.relative_to(ROOT)}#{i + 1}", block))
    return found


def merged(base: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in fragment.items():
        out[key] = (
            merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def test_the_annotated_example_is_a_valid_config():
    config = parse_config(EXAMPLE.read_text(), ENV)
    build_policies(config)
    assert config.limits.worst_case_bytes() == 576 * 1024 * 1024  # the figure docs/security.md states


@pytest.mark.parametrize(("where", "block"), yaml_blocks(), ids=[w for w, _ in yaml_blocks()])
def test_every_config_block_of_the_docs_is_valid_in_the_example(where, block):
    base = yaml.safe_load(EXAMPLE.read_text())
    text = yaml.safe_dump(merged(base, yaml.safe_load(block)))
    build_policies(parse_config(text, ENV))


def test_the_docs_have_config_blocks_to_check():
    assert len(yaml_blocks()) >= 1


def test_the_architecture_diagram_is_drawn_from_its_source():
    """docs/img/architecture.svg records the SHA-256 of the .mmd it was drawn from: editing the
    source without re-running scripts/render_diagram.py fails here."""
    source = (ROOT / "docs" / "img" / "architecture.mmd").read_text()
    svg = (ROOT / "docs" / "img" / "architecture.svg").read_text()
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert svg.startswith(f"<!-- drawn from architecture.mmd sha256={digest} "), "re-run scripts/render_diagram.py"
    assert "<svg" in svg and "<foreignObject" not in svg  # plain SVG text: any viewer draws it


def test_no_page_asks_the_browser_to_draw_a_diagram():
    """A mermaid fence would make the site fetch mermaid from a CDN: diagrams are SVGs."""
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    assert [p.name for p in pages if "```mermaid" in p.read_text()] == []
