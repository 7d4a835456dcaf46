"""docs/config-reference.md is written from the schema (router/config/reference.py): every field
of every section with its type, default and meaning. A schema change without the page
regenerated fails here, and so does a field with nothing said about it."""

from __future__ import annotations

from pathlib import Path

from router.config import GatewayConfig
from router.config.reference import reference_markdown, rows_of

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"


def test_the_reference_page_is_the_schema_as_generated():
    assert PAGE.read_text() == reference_markdown(), (
        "regenerate: python -m router.config.reference > docs/config-reference.md"
    )


def test_every_field_says_what_it_means():
    rows = list(rows_of(GatewayConfig))
    assert len(rows) > 150
    assert [path for path, _, _, meaning in rows if not meaning] == []


def test_required_fields_and_defaults_are_read_from_the_schema():
    found = {path: (kind, default) for path, kind, default, _ in rows_of(GatewayConfig)}
    assert found["models.NAME.dedicated[].gpu_hour_usd"] == ("float", "required")
    assert found["models.NAME.dedicated[].max_concurrency"][1] == "required"
    assert found["state.window_s"] == ("float", "`60.0`")
    assert found["models.NAME.routing.batch.canary"][0] == "`dedicated` \\| `follow`"
