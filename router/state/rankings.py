"""An applied `tidegate probe` ranking as the stores keep it: JSON, read back for its order."""

from __future__ import annotations

import orjson


def probe_order(ranking: bytes) -> tuple[str, ...]:
    """The endpoint names of an applied probe ranking, fastest first (none for bad JSON)."""
    try:
        found = orjson.loads(ranking)
        return tuple(str(e["endpoint"]) for e in found.get("ranking", ()))
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        return ()
