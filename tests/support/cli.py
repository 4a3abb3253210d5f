"""The `cropi` command run in the test's own process, as the CLI tests and the golden case call it."""

from __future__ import annotations

import contextlib
import io
import json


def run_cli(*args: str) -> dict:
    """Run `cropi ARGS --json` in this process; its exit code must be 0. Returns the JSON result it
    printed last (the command may log lines before it)."""
    from cropi.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([*args, "--json"])
    assert code == 0, buf.getvalue()
    return json.loads(buf.getvalue().strip().splitlines()[-1])
