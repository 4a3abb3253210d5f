"""Progress of the demo as plain log lines on stderr (worker processes share the terminal,
so one line per event reads better than interleaved progress bars)."""

from __future__ import annotations

import sys
import time


def say(msg: str) -> None:
    """One timestamped line on stderr."""
    print(f"[cropi demo {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class LogProgress:
    """A ``Progress`` callback that logs each stage's start, end, and every ``every_s`` seconds between."""

    def __init__(self, prefix: str = "", every_s: float = 15.0):
        self.prefix = prefix
        self.every_s = every_s
        self.last: dict[str, float] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if stage not in self.last or done >= total or now - self.last[stage] >= self.every_s:
            self.last[stage] = now
            say(f"{self.prefix}{stage}: {done}/{total}")
