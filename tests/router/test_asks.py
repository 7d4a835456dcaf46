"""The client's own headers (x-tidegate-*) read in one pass (router/request/asks.py)."""

from __future__ import annotations

from router.request.asks import NOTHING_ASKED, asks_of


def test_a_request_without_our_headers_asks_nothing():
    headers = [(b"host", b"gw"), (b"content-type", b"application/json"), (b"x-request-id", b"r1")]
    assert asks_of(headers) is NOTHING_ASKED
    assert asks_of([]) is NOTHING_ASKED


def test_each_header_is_read_and_the_first_of_a_repeated_one_wins():
    asks = asks_of(
        [
            (b"x-tidegate-session", b"s-1"),
            (b"x-tidegate-task-id", b"task-9"),
            (b"x-tidegate-priority", b" Batch "),
            (b"x-tidegate-deadline-ms", b" 250 "),
            (b"x-tidegate-no-shadow", b"1"),
            (b"x-tidegate-session", b"s-2"),
            (b"x-tidegate-unknown", b"ignored"),
        ]
    )
    assert (asks.session, asks.task_id, asks.priority, asks.deadline_ms) == ("s-1", "task-9", "batch", "250")
    assert asks.no_shadow is True


def test_no_shadow_is_off_for_empty_or_zero():
    assert asks_of([(b"x-tidegate-no-shadow", b"0")]).no_shadow is False
    assert asks_of([(b"x-tidegate-no-shadow", b" ")]).no_shadow is False
    assert asks_of([(b"x-tidegate-no-shadow", b"yes")]).no_shadow is True
