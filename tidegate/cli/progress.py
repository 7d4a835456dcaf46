"""One progress bar for a long command's counted steps (plans, hours): a label, a bar and
"n/total" on stderr, gone when the step ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn


@contextmanager
def counting(console: Console, label: str, total: int) -> Iterator[Callable[[int], None]]:
    """Yields the function that counts `n` more steps done."""
    with Progress(
        TextColumn(label), BarColumn(), MofNCompleteColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
