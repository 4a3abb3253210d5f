"""The service's shape: the HTTP process imports no torch, job targets are real functions, the
library never imports the service, and ``cropi serve`` is the service's entry point."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_http_server_imports_no_torch():
    code = ("import sys, services.api.app, services.entry.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out


def test_builtin_job_kinds_are_the_library_functions():
    from cropi.pipeline.score import score_checkpoint
    from services.jobs import kinds
    from services.jobs.runner import DEFAULT_KINDS
    from services.jobs.worker import resolve_target

    assert set(DEFAULT_KINDS) == set(kinds.BUILTIN)
    for kind, target in DEFAULT_KINDS.items():
        assert resolve_target(kind, target) is kinds.BUILTIN[kind]
    assert kinds.score_checkpoint is score_checkpoint  # imported directly: a rename fails at import, not at run time


def test_the_library_never_imports_the_service():
    for path in (REPO / "cropi").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.split(".")[0] in ("services", "cropi_service")]
            assert not bad, f"{path} imports {bad}"  # `cropi serve` is found by entry point


def test_serve_is_an_entry_point_of_the_service_package():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    commands = meta["project"]["entry-points"]["cropi.commands"]
    assert set(commands) == {"serve", "worker"}
    import importlib

    for name, target in commands.items():
        module, _, attr = target.partition(":")
        assert module.startswith("cropi_service.")
        main = getattr(importlib.import_module(module.replace("cropi_service", "services", 1)), attr)
        assert callable(main)
    from services.entry.cli import build_parser

    # the README's `cropi serve --root ... --data-root ...`: the plugin gets argv from the command name on
    a = build_parser().parse_args(["serve", "--root", "/r", "--data-root", "/d"])
    assert a.command == "serve" and a.root == "/r" and a.data_roots == ["/d"]
