"""The canary role: a run is replaced only at the version it was read at and, for a leader,
only while it leads; its history is newest first and bounded; the live percent reaches every
process's snapshot and a clear hands it back to the config file; read from the store it is
the newest whatever the snapshot says."""

from __future__ import annotations

from tests.contracts.pair import Pair


async def check_a_run_is_written_at_its_version_only(pair: Pair) -> None:
    assert await pair.store.canary.canary_run("m") == (0, None)
    written = await pair.store.canary.write_canary("m", b"run-1", None, version=0, leader=None, history=5)
    assert written == 1
    stale = await pair.peer.canary.write_canary("m", b"stale", None, version=0, leader=None, history=5)
    assert stale == -1
    assert await pair.peer.canary.canary_run("m") == (1, b"run-1")


async def check_a_leader_writes_only_while_it_leads(pair: Pair) -> None:
    fenced = await pair.store.canary.write_canary("m", b"x", None, version=0, leader="a", history=5)
    assert fenced == 0  # nobody leads
    assert await pair.store.leadership.lead("a", 30.0)
    assert await pair.store.canary.write_canary("m", b"x", None, version=0, leader="a", history=5) == 1
    assert await pair.peer.canary.write_canary("m", b"y", None, version=1, leader="b", history=5) == 0


async def check_the_history_is_newest_first_and_bounded(pair: Pair) -> None:
    version = 0
    for n in range(5):
        event = f"event-{n}".encode()
        version = await pair.store.canary.write_canary("m", b"r", event, version=version, leader=None, history=3)
    assert await pair.peer.canary.canary_history("m", 10) == [b"event-4", b"event-3", b"event-2"]
    assert await pair.peer.canary.canary_history("m", 2) == [b"event-4", b"event-3"]


async def check_the_live_percent_reaches_every_snapshot_until_cleared(pair: Pair) -> None:
    await pair.store.canary.set_canary("m", 35.0)
    assert pair.store.snapshot().canary_percent == {"m": 35.0}  # its own at once
    await pair.sync(pair.peer)
    assert pair.peer.snapshot().canary_percent == {"m": 35.0}
    await pair.peer.canary.clear_canary("m")
    await pair.sync(pair.store)
    assert pair.store.snapshot().canary_percent == {}


async def check_the_live_percent_read_from_the_store_never_waits_for_a_refresh(pair: Pair) -> None:
    """What an admin answer reports: the percent stored a moment ago by any process."""
    assert await pair.peer.canary.live_canary("m") is None
    await pair.store.canary.set_canary("m", 40.0)
    assert await pair.peer.canary.live_canary("m") == 40.0  # no sync in between
    await pair.store.canary.set_canary("m", 10.0)
    assert await pair.peer.canary.live_canary("m") == 10.0
    await pair.peer.canary.clear_canary("m")
    assert await pair.store.canary.live_canary("m") is None
