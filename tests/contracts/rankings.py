"""The rankings role: an applied probe ranking and parity verdicts are kept as written, and
what routing needs of them (the endpoint order, the diverging endpoints) reaches every
process's snapshot; a ranking nobody can read orders nothing."""

from __future__ import annotations

import orjson

from tests.contracts.pair import Pair

RANKING = orjson.dumps({"ranking": [{"endpoint": "fast"}, {"endpoint": "slow"}]})
VERDICTS = orjson.dumps({"endpoints": {"a": {"verdict": "diverges"}, "b": {"verdict": "agrees"}}})


async def check_a_probe_ranking_orders_every_snapshot(pair: Pair) -> None:
    assert await pair.store.rankings.probe("m") is None
    await pair.store.rankings.set_probe("m", RANKING)
    assert await pair.peer.rankings.probe("m") == RANKING
    await pair.sync(pair.peer)
    assert pair.peer.snapshot().probe_order == {"m": ("fast", "slow")}


async def check_parity_verdicts_mark_the_diverging_endpoints(pair: Pair) -> None:
    await pair.store.rankings.set_parity("m", VERDICTS)
    assert await pair.peer.rankings.parity("m") == VERDICTS
    await pair.sync(pair.peer)
    assert pair.peer.snapshot().parity_diverges == {"m": frozenset({"a"})}


async def check_an_unreadable_ranking_orders_nothing(pair: Pair) -> None:
    await pair.store.rankings.set_probe("m", b"not json")
    await pair.sync(pair.peer)
    assert pair.peer.snapshot().probe_order == {"m": ()}
