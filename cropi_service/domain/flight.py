"""Work and answers in flight: the heavy-request slots, waited for without a thread, and the ledger of
answer bytes not yet handed to the network (per caller and in all).

Both are shared between the event loop and the request threads, so they use a ``threading.Lock`` and
wake an event loop's waiter with ``call_soon_threadsafe``: no asyncio primitive is bound to one loop
(a test app is served by several loops in turn)."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

from ..base.errors import BusyError, OverloadedError


class _Waiter:
    __slots__ = ("loop", "future", "granted")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.future, self.granted = loop, loop.create_future(), False


class Slots:
    """``n`` slots handed out first come, first served. ``acquire`` waits as a coroutine: a request
    waiting its turn holds no thread (before, each waiting batch held one of the server's 40 request
    threads for up to heavy_wait_s, and 60 of them left /healthz 5 s behind: issue 26, W2)."""

    def __init__(self, n: int):
        self.n, self.free = n, n
        self._waiters: deque[_Waiter] = deque()
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def try_acquire(self) -> bool:
        with self._lock:
            if self.free and not self._waiters:
                self.free -= 1
                return True
            return False

    async def acquire(self, timeout: float, max_waiting: int | None = None) -> bool | None:
        """True once a slot is this caller's; False after ``timeout`` seconds without one; None at once
        when ``max_waiting`` requests are already waiting."""
        with self._lock:
            if self.free and not self._waiters:
                self.free -= 1
                return True
            if max_waiting is not None and len(self._waiters) >= max_waiting:
                return None
            waiter = _Waiter(asyncio.get_running_loop())
            self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter.future, timeout)
            return True
        except asyncio.TimeoutError:
            with self._lock:
                if waiter.granted:  # the grant raced the timeout: the slot is ours
                    return True
                self._waiters.remove(waiter)
            return False
        except asyncio.CancelledError:  # the request was cancelled (its client went away)
            with self._lock:
                granted = waiter.granted
                if not granted:
                    self._waiters.remove(waiter)
            if granted:
                self.release()  # handed to us as we left: pass it on
            raise

    def release(self) -> None:
        with self._lock:
            if self._waiters:  # the slot passes straight to the first waiter
                waiter = self._waiters.popleft()
                waiter.granted = True
                waiter.loop.call_soon_threadsafe(_wake, waiter.future)
            else:
                self.free += 1


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(True)


class Reservation:
    """Bytes of one answer in the ledger; ``release`` is idempotent."""

    __slots__ = ("ledger", "caller", "nbytes", "released")

    def __init__(self, ledger: "AnswerLedger", caller: str, nbytes: int):
        self.ledger, self.caller, self.nbytes, self.released = ledger, caller, nbytes, False

    def resize(self, nbytes: int) -> None:
        self.ledger._resize(self, nbytes)

    def release(self) -> None:
        self.ledger._resize(self, 0, release=True)


class AnswerLedger:
    """Bytes of answers made and not yet handed to the network, per caller and in all.

    An answer counts from when it is made (for a gradient batch: from before it is made, at its size
    bound) until its last byte is written to the connection or the connection is gone; a client that
    reads nothing is closed after ``stall_timeout_s`` (the server's protocol), which ends the count.
    A new request is refused while its caller (429) or the server (503) is at its bound; a gradient
    batch is refused when its bound would not fit."""

    def __init__(self, max_bytes: int, max_bytes_per_caller: int, retry_after_s: int):
        self.max_bytes, self.max_bytes_per_caller = int(max_bytes), int(max_bytes_per_caller)
        self.retry_after_s = retry_after_s
        self.total = 0
        self.by_caller: dict[str, int] = {}
        self.answers = 0
        self._lock = threading.Lock()

    def admit(self, caller: str) -> None:
        """Refuse a new request while its caller's answers, or everyone's, fill their bound."""
        with self._lock:
            mine, total = self.by_caller.get(caller, 0), self.total
        if mine >= self.max_bytes_per_caller:
            raise self._caller_full(mine)
        if total >= self.max_bytes:
            raise self._server_full(total)

    def reserve(self, caller: str, nbytes: int, check: bool = True) -> Reservation:
        """``nbytes`` for one answer of ``caller``; with ``check``, refused unless they fit both bounds
        (what is made already is counted without ``check``: refusing it would not give its memory back)."""
        nbytes = max(0, int(nbytes))
        with self._lock:
            mine = self.by_caller.get(caller, 0)
            if check and mine + nbytes > self.max_bytes_per_caller:
                raise self._caller_full(mine, nbytes)
            if check and self.total + nbytes > self.max_bytes:
                raise self._server_full(self.total, nbytes)
            self.by_caller[caller] = mine + nbytes
            self.total += nbytes
            self.answers += 1
        return Reservation(self, caller, nbytes)

    def _resize(self, r: Reservation, nbytes: int, release: bool = False) -> None:
        with self._lock:
            if r.released:
                return
            delta = nbytes - r.nbytes
            r.nbytes = nbytes
            self.total += delta
            left = self.by_caller.get(r.caller, 0) + delta
            if release:
                r.released = True
                self.answers -= 1
            if left > 0:
                self.by_caller[r.caller] = left
            else:  # a caller's entry lives only while it has answers in flight
                self.by_caller.pop(r.caller, None)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"bytes": self.total, "answers": self.answers, "callers": len(self.by_caller)}

    def _caller_full(self, mine: int, more: int = 0) -> BusyError:
        asking = f" and this answer can take {more / 2**20:.1f} MB" if more else ""
        return BusyError(f"your answers not yet read take {mine / 2**20:.1f} MB{asking}, against "
                         f"{self.max_bytes_per_caller / 2**20:g} MB a caller (answer_memory_mb_per_caller): read "
                         "the answers you asked for (or close their connections) before asking for more",
                         retry_after_s=self.retry_after_s)

    def _server_full(self, total: int, more: int = 0) -> OverloadedError:
        asking = f" and this answer can take {more / 2**20:.1f} MB" if more else ""
        return OverloadedError(f"answers not yet read by their clients take {total / 2**20:.1f} MB{asking}, "
                               f"against this server's {self.max_bytes / 2**20:g} MB (answer_memory_mb): retry "
                               "after the time in Retry-After", retry_after_s=self.retry_after_s)
