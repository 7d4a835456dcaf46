"""Model many independent runs (plans, hours) on every core: the planner is CPU-bound and each
run is a pure function of its inputs, so the figures are the same whatever the number of
processes. Processes are spawned, not forked (the caller's progress bar runs a thread), and
the inputs every run shares are sent to each worker once."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_shared: tuple[Any, ...] = ()  # in a worker: what every run there shares


def _keep(shared: tuple[Any, ...]) -> None:
    global _shared  # noqa: PLW0603 (one per worker process, set once at its start)
    _shared = shared


def _run(function: Callable[..., R], item: Any) -> R:
    return function(item, *_shared)


def in_processes(
    function: Callable[..., R],
    items: Sequence[T],
    jobs: int,
    *,
    progress: Callable[[int], None] = lambda _: None,
    shared: tuple[Any, ...] = (),
    size: Callable[[T], int] = lambda _: 1,
) -> list[R]:
    """`function(item, *shared)` for every item, in the items' order, `jobs` at a time;
    `progress(size(item))` as each is done."""
    if jobs <= 1 or len(items) < 2:
        found = []
        for item in items:
            found.append(function(item, *shared))
            progress(size(item))
        return found
    results: list[Any] = [None] * len(items)
    context = multiprocessing.get_context("spawn")
    workers = min(jobs, len(items))
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_keep, initargs=(shared,)) as pool:
        futures = {pool.submit(_run, function, item): i for i, item in enumerate(items)}
        for future in as_completed(futures):
            index = futures[future]
            results[index] = future.result()
            progress(size(items[index]))
    return results
