"""Run a reward under a wall-clock deadline, in the main thread or any other.

In the main thread (POSIX) the deadline is a ``SIGALRM`` timer that interrupts
the computation itself. Signals cannot be used elsewhere, so in other threads
the reward runs in a helper thread that is abandoned if it overruns: the caller
moves on, the stuck computation finishes (or not) in the background.

math_verify has its own ``signal.alarm`` timeouts, which share the one
``ITIMER_REAL`` timer with ours and only work in the main thread. While a
deadline from here is armed, ``deadline_active()`` is true and the math_verify
reward switches its own timeouts off, so the two never fight over the timer.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable

from cropi.errors import CropiError


class RewardTimeoutError(CropiError):
    """A reward took longer than its deadline."""

    code = "reward_timeout"


class _Interrupt(BaseException):
    # A BaseException, like math_verify's own TimeoutException, so a reward's
    # ``except Exception`` cannot swallow the deadline.
    pass


_state = threading.local()


def deadline_active() -> bool:
    """True while this thread runs under a deadline from ``call_with_deadline``."""
    return getattr(_state, "active", False)


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def call_with_deadline(fn: Callable[..., Any], args: tuple, seconds: float | None) -> Any:
    """``fn(*args)``, or ``RewardTimeoutError`` once ``seconds`` have passed (None: no limit)."""
    if seconds is None:
        return fn(*args)
    if seconds <= 0:
        raise ValueError(f"a deadline must be positive seconds or None, got {seconds}")
    if in_main_thread() and hasattr(signal, "setitimer"):
        return _with_alarm(fn, args, seconds)
    return _in_helper_thread(fn, args, seconds)


def _with_alarm(fn, args, seconds):
    def on_alarm(signum, frame):
        raise _Interrupt()

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    _state.active = True
    try:
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Interrupt:  # also when the alarm lands between the return and the disarm above
        raise RewardTimeoutError(f"reward took longer than {seconds:g} s") from None
    finally:
        _state.active = False
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:  # someone else's alarm was pending: give it back what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - start), 1e-3))


def _in_helper_thread(fn, args, seconds):
    box: dict[str, Any] = {}

    def run():
        _state.active = True
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    worker = threading.Thread(target=run, name="cropi-reward", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise RewardTimeoutError(f"reward took longer than {seconds:g} s (left running in the background)")
    if "error" in box:
        raise box["error"]
    return box["value"]
