"""DNS pools' slot sets in Redis (router/state/roles.py, `Members`): one hash per pool, read
and written back by version (router/state/redis/scripts.py), so every gateway replica applies
router/state/members.py's rule to the same state; a write that finds the version moved (another
replica claimed in between) reads again. The clock is Redis's, so replicas' clocks do not matter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.errors import StoreUnavailable
from router.state.members import Assignment, Sighting, assign
from router.state.redis.link import RedisRole
from router.state.redis.scripts import READ_MEMBERS, WRITE_MEMBERS

_TRIES = 5
_KEPT_MS = 86_400_000  # a pool no replica claims for a day is forgotten


class RedisMembers(RedisRole):
    async def claim(self, sighting: Sighting) -> dict[int, str]:
        key = self._keys.members(sighting.pool)
        what = f"the members of {sighting.pool} could not be claimed"
        for _ in range(_TRIES):
            now_ms, fields = await self._run(what, READ_MEMBERS, [key], [])
            version, before = _parsed(fields)
            after = assign(before, sighting, float(now_ms) / 1000.0)
            if int(await self._run(what, WRITE_MEMBERS, [key], [version, _KEPT_MS, *_fields(after)])):
                return dict(after.held)
        raise StoreUnavailable(f"{what}: {_TRIES} replicas' claims raced it; the next refresh tries again")


def _parsed(flat: Sequence[Any]) -> tuple[str, Assignment]:
    version, held, seen = "0", {}, {}
    for name, value in zip(flat[::2], flat[1::2], strict=True):
        field, text = _text(name), _text(value)
        if field == "v":
            version = text
        elif field.startswith("s:"):
            held[int(field[2:])] = text
        elif field.startswith("t:"):
            seen[field[2:]] = int(text) / 1000.0
    return version, Assignment(held, seen)


def _fields(after: Assignment) -> list[str]:
    pairs = [(f"s:{slot}", address) for slot, address in after.held.items()]
    pairs += [(f"t:{address}", str(int(at * 1000))) for address, at in after.last_seen.items()]
    return [item for pair in pairs for item in pair]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
