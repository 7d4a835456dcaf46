"""What `tidegate probe --apply` and `tidegate parity --apply` leave in the stores (JSON), read
back for what routing needs: a probe's endpoint order, a parity run's diverging endpoints."""

from __future__ import annotations

import orjson


def probe_order(ranking: bytes) -> tuple[str, ...]:
    """The endpoint names of an applied probe ranking, fastest first (none for bad JSON)."""
    try:
        found = orjson.loads(ranking)
        return tuple(str(e["endpoint"]) for e in found.get("ranking", ()))
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        return ()


def verdicts_of(verdicts: bytes | None) -> dict[str, str]:
    """Endpoint -> its verdict in an applied parity run (none for no run or bad JSON)."""
    if verdicts is None:
        return {}
    try:
        found = orjson.loads(verdicts)
        return {str(name): str(entry.get("verdict")) for name, entry in found["endpoints"].items()}
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        return {}


def diverging(verdicts: bytes) -> frozenset[str]:
    """The endpoints an applied parity run found to diverge."""
    return frozenset(name for name, verdict in verdicts_of(verdicts).items() if verdict == "diverges")
