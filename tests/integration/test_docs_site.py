"""The docs site as a reader opens it: built with mkdocs (as `make test` builds it), it loads
no font, script or stylesheet from the internet, and its tables show no escaped pipes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
_LOADED = re.compile(r'<(?:script|img|iframe)[^>]*\ssrc="(https?://[^"]+)"|<link[^>]*\shref="(https?://[^"]+)"')


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    subprocess.run(
        [str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        check=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return out


def test_the_built_site_loads_nothing_from_the_internet(site: Path):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    loaded = {url for page in pages for found in _LOADED.findall(page.read_text()) for url in found if url}
    assert loaded == set()
    css = " ".join(p.read_text() for p in site.rglob("*.css"))
    assert "fonts.googleapis" not in css and "@import url(http" not in css
    assert not any('class="mermaid"' in page.read_text() for page in pages)  # it would fetch mermaid
    architecture = (site / "architecture" / "index.html").read_text()
    assert 'src="../img/architecture.svg"' in architecture


def test_no_table_shows_an_escaped_pipe(site: Path):
    shown = {page.parent.name: page.read_text().count("\\|") for page in site.rglob("index.html")}
    assert {name: n for name, n in shown.items() if n} == {}
