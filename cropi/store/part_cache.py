"""A bounded, byte-sized cache of verified shard parts, with concurrent loads of one part coalesced.

What it holds was read into owned memory and checked against its commit entry when it
was loaded; its key includes that entry's sha256, so a part committed again under the
same name is a different key. A part edited on disk after it was cached is never
served: the cache serves the bytes that were verified, and the next load from disk
verifies again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable, TypeVar

from cropi.errors import InvalidInputError

V = TypeVar("V")


class PartCache:
    """LRU of loaded parts holding at most ``max_bytes`` in all (0: keeps nothing, still coalesces).

    ``get(key, size, load)`` returns the cached value or calls ``load()``; threads asking
    for a part that is being loaded wait for that one load instead of starting their own.
    ``loads`` and ``bytes_loaded`` count the loads (tests and benchmarks read them).
    """

    def __init__(self, max_bytes: int):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidInputError(f"part cache size must be a byte count >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.loads = 0
        self.bytes_loaded = 0
        self._entries: OrderedDict[Hashable, tuple[int, object]] = OrderedDict()
        self._loading: dict[Hashable, tuple[threading.Event, list]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def peek(self, key: Hashable) -> object | None:
        """The cached value of ``key``, or None; never loads."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            self._entries.move_to_end(key)
            return hit[1]

    def get(self, key: Hashable, size: int, load: Callable[[], V]) -> V:
        while True:
            with self._lock:
                hit = self._entries.get(key)
                if hit is not None:
                    self._entries.move_to_end(key)
                    return hit[1]
                pending = self._loading.get(key)
                if pending is None:
                    pending = self._loading[key] = (threading.Event(), [])
                    break
            pending[0].wait()
            if pending[1]:  # the loader's value (kept or not); empty when its load failed: try ours
                return pending[1][0]
        event, slot = pending
        try:
            value = load()
            slot.append(value)
            self._keep(key, size, value)
        finally:
            with self._lock:
                self._loading.pop(key, None)
            event.set()
        return value

    def _keep(self, key: Hashable, size: int, value: object) -> None:
        with self._lock:
            self.loads += 1
            self.bytes_loaded += size
            if size > self.max_bytes:
                return  # larger than the whole budget: served once, not kept
            self._entries[key] = (size, value)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (dropped, _) = self._entries.popitem(last=False)
                self.bytes -= dropped
