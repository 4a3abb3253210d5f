"""A child process that goes when its parent goes: the service's job workers and the demo's pool workers.

Killing a parent alone (``kill PID``, a crashed server; Ctrl-C reaches the whole group) leaves its
children running: a job worker would go on writing a job its restarted runner retries, a demo worker
would go on training into a folder a demo started again on it runs the same curricula in. Both call
``die_with_parent`` first thing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


def kill_group(*_args) -> None:
    """Kill this process and everything it started when it leads its own process group (a job worker, in its
    own session); else this process alone (a pool's worker, in its parent's group). Never returns."""
    try:
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(1)


def die_with_parent(parent_pid: int, every_s: float = 1.0) -> None:
    """Go (``kill_group``) once the parent ``parent_pid`` is gone, however it ended: Linux's parent-death
    signal, and everywhere a thread that sees this process re-parented within ``every_s``. SIGTERM goes the
    same way, so a stop takes the group too. What is killed had its writes atomic; the rest is redone."""
    signal.signal(signal.SIGTERM, kill_group)
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        kill_group()

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                kill_group()
            time.sleep(every_s)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
