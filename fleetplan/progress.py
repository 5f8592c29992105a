"""One progress bar for long CLI work (profiling a grid, what-if sweeps): rich on stderr, with the count,
the time elapsed and an ETA. Imports nothing of ours, so every floor may use it."""

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def progress_bar(label: str, show: bool = True) -> Iterator[Callable[[int, int], None]]:
    """Yields `update(done, total)`; with `show` false nothing is drawn."""
    if not show:
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    )
    task = None

    def update(done: int, total: int) -> None:
        nonlocal task
        if task is None:
            task = progress.add_task(label, total=total)
        progress.update(task, completed=done, total=total)

    with progress:
        yield update
