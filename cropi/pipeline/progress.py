"""Progress reporting shared by the jobs: a callback ``(stage, done, total)``.

The CLI shows it as a tqdm bar per stage; the service writes it to its job table.
"""

from __future__ import annotations

import weakref
from typing import Callable, Optional

from tqdm.auto import tqdm

Progress = Callable[[str, int, int], None]


def quiet(stage: str, done: int, total: int) -> None:
    """A progress callback that says nothing."""


_open: "weakref.WeakSet[TqdmProgress]" = weakref.WeakSet()


class TqdmProgress:
    """One tqdm bar per stage, on stderr."""

    def __init__(self, disable: bool = False):
        self.disable = disable
        self.bars: dict[str, tqdm] = {}
        _open.add(self)

    def close(self) -> None:
        """End every bar still open (a job stopped by an error): what is printed next starts a line of its own."""
        for bar in self.bars.values():
            bar.close()

    def __call__(self, stage: str, done: int, total: int) -> None:
        bar = self.bars.get(stage)
        if bar is None:
            bar = self.bars[stage] = tqdm(total=total, desc=stage, unit="prompt", disable=self.disable)
        bar.total = total
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()


def close_bars() -> None:
    """``close`` every ``TqdmProgress`` of this process (the CLI, before it prints an error)."""
    for progress in list(_open):
        progress.close()


def report(progress: Optional[Progress]) -> Progress:
    return progress or quiet
