"""The config reference (docs/config-reference.md), written from the schema itself: every field
of every section, its type, its default and what it means, read from the comment beside (or
above) the field in router/config/. tests/router/test_config_reference.py fails when the page
and the schema differ; regenerate it with

    python -m router.config.reference > docs/config-reference.md
"""

from __future__ import annotations

import ast
import enum
import inspect
import io
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from router.config.gateway import GatewayConfig

_HEAD = """# Config reference

Every key of `tidegate.yaml`, generated from the schema (`python -m router.config.reference`;
`make test` fails when this page and the schema differ). `NAME` is a key you choose (a model's
name), `[]` a list. The annotated example and the prose are in [Configuration](configuration.md).

| key | type | default | meaning |
|---|---|---|---|
"""


def reference_markdown() -> str:
    rows = [
        f"| `{path}` | {kind} | {default} | {meaning} |"
        for path, kind, default, meaning in rows_of(GatewayConfig)
    ]
    return _HEAD + "\n".join(rows) + "\n"


def rows_of(
    cls: type[BaseModel], prefix: str = "", seen: dict[type, str] | None = None
) -> Iterator[tuple[str, str, str, str]]:
    """(key path, type, default, meaning) for every field of `cls`, its sections after it; a
    section met a second time points at the first (a shadow's candidate is a serverless endpoint)."""
    seen = {} if seen is None else seen
    comments = field_comments(cls)
    for name, field in cls.model_fields.items():
        path = f"{prefix}{name}"
        nested, suffix = _nested(field.annotation)
        meaning = _cell(comments.get(name, "")) or (_cell(_summary(nested)) if nested else "")
        if nested is not None and nested in seen:
            meaning = f"{meaning} The keys of `{seen[nested]}`.".strip()
        yield path, _type_name(field.annotation), _default(field), meaning
        if nested is not None and nested not in seen:
            seen[nested] = f"{path}{suffix}"
            yield from rows_of(nested, f"{path}{suffix}.", seen)


def field_comments(cls: type[BaseModel]) -> dict[str, str]:
    """Each field's comment in the class's source: the comment lines just above it, then the one
    on its own line(s)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        ours = (
            isinstance(klass, type) and issubclass(klass, BaseModel) and klass.__module__ != "pydantic.main"
        )
        if not ours:
            continue
        source = textwrap.dedent(inspect.getsource(klass))
        lines = source.splitlines()
        comments = {
            token.start[0]: token.string.lstrip("#").strip()
            for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT
        }
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for node in body.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                above: list[str] = []
                line = node.lineno - 1
                while line >= 1 and lines[line - 1].strip().startswith("#"):
                    above.insert(0, comments[line])
                    line -= 1
                last = node.end_lineno or node.lineno
                beside = [comments[n] for n in range(node.lineno, last + 1) if n in comments]
                found[node.target.id] = " ".join(part for part in (*above, *beside) if part)
    return found


def _nested(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The section class a field holds, and how its keys are reached (`.NAME`, `[]`, or none)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    if origin is typing.Annotated:
        return _nested(args[0])
    if origin in (dict, typing.Mapping) or str(origin).endswith("Mapping'>"):
        inner, suffix = _nested(args[1])
        return inner, ".NAME" + suffix
    if origin in (tuple, list):
        inner, suffix = _nested(args[0])
        return inner, "[]" + suffix
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            inner, suffix = _nested(arg)
            if inner is not None:
                return inner, suffix
    return None, ""


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        shown = " \\| ".join(f"`{a}`" for a in args)
    elif origin in (typing.Union, types.UnionType):
        shown = " or ".join(_type_name(a) for a in args)
    elif origin in (tuple, list):
        shown = f"list of {_type_name(args[0])}"
    elif origin is dict or str(origin).endswith("Mapping'>"):
        shown = f"mapping of {_type_name(args[1])}"
    elif annotation is type(None):
        shown = "none"
    elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        shown = " \\| ".join(f"`{m.value}`" for m in annotation)
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        shown = "section"
    else:
        shown = getattr(annotation, "__name__", str(annotation))
    return shown


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    value = value.value if isinstance(value, enum.Enum) else value
    if isinstance(value, BaseModel):
        shown = "(its defaults)"
    elif value is None:
        shown = "none"
    elif isinstance(value, bool):
        shown = f"`{str(value).lower()}`"
    elif isinstance(value, tuple | list | dict) and not value:
        shown = "`{}`" if isinstance(value, dict) else "`[]`"
    else:
        shown = f'`"{value}"`' if isinstance(value, str) else f"`{value!s}`"
    return shown


def _summary(cls: type[BaseModel]) -> str:
    doc = inspect.getdoc(cls) or ""
    if not doc or cls.__doc__ is None or cls.__doc__ == BaseModel.__doc__:
        return ""
    return doc.split("\n\n")[0]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    print(reference_markdown(), end="")
