"""Extract the response schemas the suite validates against from the OpenAI OpenAPI spec,
with every schema they reference, into tests/data/openai_schemas.json (small, in the repo,
so a clean clone needs nothing outside it).

    .venv/bin/python scripts/openai_schemas.py PATH/TO/openapi.yaml   (OpenAI's published spec)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import yaml

ROOTS = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "CreateEmbeddingResponse",
    "Response",
    "ResponseStreamEvent",
    "ListModelsResponse",
    "Model",
)
PREFIX = "#/components/schemas/"
# Where the spec's own text says a field may be null but its schema does not: (schema, path).
ERRATA = (
    # "When present, it contains a null value except for the last chunk" (its description)
    ("CreateChatCompletionStreamResponse", ("properties", "usage")),
    ("CreateCompletionResponse", ("properties", "usage")),  # the same, in completion streams
    # the spec uses one schema for completion chunks too, whose finish_reason is null until the
    # last (as the API sends it, and as the SDKs type it: Optional)
    ("CreateCompletionResponse", ("properties", "choices", "items", "properties", "finish_reason")),
)
# Where the spec's request documents a form its response schema leaves out: (schema, path, form).
# `encoding_format: "base64"` (CreateEmbeddingRequest, and openai-node's default) answers each
# embedding as a base64 string of little-endian float32s.
ALTERNATIVES = (("Embedding", ("properties", "embedding"), {"type": "string", "contentEncoding": "base64"}),)


def nullable(node: Any) -> Any:
    """OpenAPI 3.0's `nullable: true` (which this 3.1 spec still uses) as JSON Schema: null
    joins the type (and the enum), or the node becomes anyOf [itself, null]."""
    if isinstance(node, list):
        return [nullable(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: nullable(v) for k, v in node.items()}
    if node.pop("nullable", False) is not True:
        return node
    return or_null(node)


def or_null(node: dict[str, Any]) -> dict[str, Any]:
    kind = node.get("type")
    if isinstance(kind, str) and "$ref" not in node and "anyOf" not in node and "oneOf" not in node:
        node["type"] = [kind, "null"]
        if isinstance(node.get("enum"), list) and None not in node["enum"]:
            node["enum"] = [*node["enum"], None]
        return node
    return {"anyOf": [node, {"type": "null"}]}


def refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(PREFIX):
            found.add(ref[len(PREFIX) :])
        for value in node.values():
            found |= refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= refs(value)
    return found


def main(spec_path: str) -> None:
    spec = yaml.load(Path(spec_path).read_text(), Loader=yaml.CSafeLoader)
    schemas = spec["components"]["schemas"]
    wanted, todo = set(), list(ROOTS)
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        todo += sorted(refs(schemas[name]) - wanted)
    picked = {name: nullable(schemas[name]) for name in sorted(wanted)}
    for name, path in ERRATA:
        parent = picked[name]
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = or_null(parent[path[-1]])
    for name, path, form in ALTERNATIVES:
        parent = picked[name]
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = {"anyOf": [parent[path[-1]], form]}
    out = {
        "openapi": spec["openapi"],
        "version": spec["info"]["version"],
        "roots": ROOTS,
        "errata": [f"{name}.{'.'.join(path)} may be null" for name, path in ERRATA]
        + [f"{name}.{'.'.join(path)} may be {form}" for name, path, form in ALTERNATIVES],
        "components": {"schemas": picked},
    }
    target = Path(__file__).resolve().parent.parent / "tests" / "data" / "openai_schemas.json"
    target.write_bytes(orjson.dumps(out, option=orjson.OPT_SORT_KEYS))
    print(f"{len(wanted)} schemas -> {target} ({target.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: scripts/openai_schemas.py PATH/TO/openapi.yaml (OpenAI's published spec)")
    main(sys.argv[1])
