"""scripts/test finds the timing tests by a grep (it collects only their files, beside the lint
steps), and the main tier deselects them: a timing test the grep missed would run nowhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOUND_BY = "grep -l '^@pytest.mark.timing' tests/integration/test_*.py"


def _mentions() -> list[tuple[Path, int, str]]:
    return [
        (path, number, line)
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path.name != Path(__file__).name
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bmark\.timing\b|\btiming\b\s*=|\"timing\"", line)
    ]


def test_the_script_finds_timing_tests_as_this_test_expects() -> None:
    assert FOUND_BY in (ROOT / "scripts" / "test").read_text()


def test_every_timing_mark_is_one_the_script_finds() -> None:
    mentions = _mentions()
    assert mentions, "no timing test at all: the timing run would collect nothing"
    strays = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path, number, line in mentions
        if not (re.fullmatch(r"@pytest\.mark\.timing\b.*", line) and re.fullmatch(r"test_\w+\.py", path.name))
        or path.parent != ROOT / "tests" / "integration"
    ]
    assert not strays, f"mark timing tests with a line '@pytest.mark.timing' in tests/integration: {strays}"
