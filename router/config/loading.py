"""Typed, frozen gateway configuration loaded from YAML plus the environment.

The file format is the annotated example `examples/tidegate.yaml` (docs/configuration.md).
Strings may reference the environment: `${VAR}` (an error at load time if unset) and
`${VAR:-default}` (falls back to `default`). Validation happens once, at start, and every
problem is reported with its key path (`models.m.dedicated[0].max_concurrency`), what was
expected and what was found, so `tidegate check-config` can print them all at once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from router.config.endpoints import PRICE_FIELDS
from router.config.gateway import ConfigError, GatewayConfig, check_endpoints
from router.config.pools import expand_pools

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read, substitute and validate a config file; raise ConfigError with every problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from exc
    return parse_config(text, env if env is not None else os.environ)


def parse_config(text: str, env: Mapping[str, str]) -> GatewayConfig:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"not valid YAML: {exc}"]) from exc
    if not isinstance(raw, dict):
        raise ConfigError([f"top level: expected a mapping, found {type(raw).__name__}"])
    problems: list[str] = _plain_secrets(raw)
    resolved = _substitute(raw, env, "", problems)
    if problems:
        raise ConfigError(problems)
    try:
        config = GatewayConfig.model_validate(resolved)
    except ValidationError as exc:
        raise ConfigError([_describe(err) for err in exc.errors()]) from exc
    config = expand_pools(config)  # a pool's replicas are its dedicated endpoints from here
    check_endpoints(config)
    return config


def _plain_secrets(raw: dict[str, Any]) -> list[str]:
    """auth.keys secrets written in the file itself: a `key` must be one `${VAR}` reference
    (or use key_sha256), so the file can be shared, committed and shown without the secrets."""
    auth = raw.get("auth")
    keys = auth.get("keys") if isinstance(auth, dict) else None
    problems = []
    for i, entry in enumerate(keys if isinstance(keys, list) else ()):
        secret = entry.get("key") if isinstance(entry, dict) else None
        if isinstance(secret, str) and secret and not _ENV_REF.fullmatch(secret.strip()):
            problems.append(
                f"auth.keys[{i}].key: a secret written in the file; use a ${{VAR}} reference or key_sha256"
            )
    return problems


def _substitute(node: Any, env: Mapping[str, str], path: str, problems: list[str]) -> Any:
    if isinstance(node, dict):
        return {k: _substitute(v, env, _join(path, str(k)), problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, env, f"{path}[{i}]", problems) for i, v in enumerate(node)]
    if isinstance(node, str):
        return _ENV_REF.sub(lambda m: _lookup(m, env, path, problems), node)
    return node


def _lookup(match: re.Match[str], env: Mapping[str, str], path: str, problems: list[str]) -> str:
    name, default = match.group(1), match.group(2)
    if name in env:
        return env[name]
    if default is not None:
        return default
    problems.append(f"{path}: environment variable {name} is not set (use ${{{name}:-}} for a default)")
    return ""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(err: Any) -> str:
    path = ""
    for part in err["loc"]:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, str(part))
    found = err.get("input")
    if err["type"] == "missing":
        shown = "nothing"
    elif isinstance(found, dict):
        shown = "an empty mapping" if not found else "a mapping"
    else:
        shown = repr(found)
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "missing" and err["loc"] and err["loc"][-1] in PRICE_FIELDS:
        message = "a route's price is required (write 0 if it costs nothing, and reports will say $0)"
    return f"{path or 'top level'}: {message} (found {shown})"
