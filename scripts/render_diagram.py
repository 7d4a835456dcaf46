"""Render a Mermaid diagram (docs/img/NAME.mmd) to the SVG the docs show (docs/img/NAME.svg),
so the docs site loads no script from the internet to draw it.

    python scripts/render_diagram.py docs/img/architecture.mmd

Needs `npm` (to fetch mermaid 11 from the npm registry into a temporary directory) and
`chromium` (headless, to run it). The SVG records the SHA-256 of the source it was drawn from;
tests/router/test_docs.py fails when the source changed and the SVG was not re-rendered.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

MERMAID = "mermaid@11"
_PAGE = """<!doctype html><meta charset="utf-8"><body><textarea id="out"></textarea>
<script src="mermaid.min.js"></script><script>
mermaid.initialize({startOnLoad: false, theme: "neutral", htmlLabels: false, flowchart: {htmlLabels: false}});
mermaid.render("diagram", %s).then(r => { document.getElementById("out").textContent = r.svg; });
</script>"""


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def render(source: str, workdir: Path) -> str:
    packed = subprocess.run(
        ["npm", "pack", MERMAID, "--silent"], cwd=workdir, check=True, capture_output=True, text=True
    ).stdout.split()[-1]
    with tarfile.open(workdir / packed) as archive:
        member = archive.getmember("package/dist/mermaid.min.js")
        (workdir / "mermaid.min.js").write_bytes(archive.extractfile(member).read())  # type: ignore[union-attr]
    (workdir / "page.html").write_text(_PAGE % json.dumps(source))
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
         "--dump-dom", (workdir / "page.html").as_uri()],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    found = re.search(r'<textarea id="out">(.*?)</textarea>', dom, re.S)
    svg = html.unescape(found.group(1)) if found else ""
    if not svg.startswith("<svg"):
        raise SystemExit(f"mermaid drew nothing; the page was:\n{dom[:2000]}")
    return svg


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path, help="a .mmd file; the .svg is written beside it")
    args = parser.parse_args()
    source = args.source.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        svg = render(source, Path(tmp))
    digest = source_digest(source)
    stamp = f"<!-- drawn from {args.source.name} sha256={digest} by scripts/render_diagram.py -->\n"
    args.source.with_suffix(".svg").write_text(stamp + svg + "\n")
    print(f"wrote {args.source.with_suffix('.svg')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
