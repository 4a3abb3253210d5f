"""The golden case's fixed inputs and the way it calls the `cropi` command (tests/test_golden.py;
test_factored.py runs the same command with the factored kind)."""

from __future__ import annotations

from pathlib import Path

from support.cli import run_cli as cli  # noqa: F401  (the golden case runs the command as every CLI test does)

HERE = Path(__file__).resolve().parents[1]
GOLDEN = HERE / "golden"
MODEL = GOLDEN / "model"  # the demo's shipped model at 12489f8, kept byte for byte as this case's input
COLLECT = ["--backend", "hf", "--samples", "6", "--max-new-tokens", "96", "--temperature", "0.7",
           "--reward", "exact_numeric", "--seed", "3"]
