"""The golden case's fixed inputs and the way it calls the `cropi` command (tests/test_golden.py;
test_factored.py runs the same command with the factored kind)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
GOLDEN = HERE / "golden"
MODEL = GOLDEN / "model"  # the demo's shipped model at 12489f8, kept byte for byte as this case's input
COLLECT = ["--backend", "hf", "--samples", "6", "--max-new-tokens", "96", "--temperature", "0.7",
           "--reward", "exact_numeric", "--seed", "3"]


def cli(*args: str) -> dict:
    from cropi.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([*args, "--json"])
    assert code == 0, buf.getvalue()
    return json.loads(buf.getvalue().strip().splitlines()[-1])
