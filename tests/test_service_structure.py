"""The service's shape: the HTTP process imports no torch, job targets are real functions, the
library never imports the service, cropi_service's floors and the library's layers import only
downwards and without circles, and ``cropi serve`` is the service's entry point."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SERVICE = REPO / "cropi_service"
FLOORS = ("base", "options", "jobs", "domain", "api", "entry")  # bottom up: each imports only from below
# The library's layers, bottom up (docs/architecture.md): a module imports its own layer or lower ones.
LAYERS = (("errors", "contracts", "utils"),
          ("projection", "store", "scoring"),
          ("gradients", "selection", "data", "rewards", "models", "tasks"),
          ("generation", "trainers"),
          ("pipeline",),
          ("demo",),
          ("cli", "cli_args"))


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(path: Path, package_name: str = "cropi_service") -> set[str]:
    """Every module of ``package_name`` that ``path`` imports: top-level, in functions and under TYPE_CHECKING alike."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            # ``from . import schemas``: the submodule itself
            found |= {f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")}
    # a submodule importing its own package (``from cropi.x import y`` inside cropi/x/) runs no new code
    return {m for m in found if m.split(".")[0] == package_name and _is_module(m) and not name.startswith(m + ".")
            and m != name}


def _is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOORS) else len(FLOORS)


def import_graph(package: Path = SERVICE) -> dict[str, set[str]]:
    return {module_name(p): package_imports(p, package.name) for p in package.rglob("*.py")}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, str] = {}
    found: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for i in sorted(graph.get(m, ())):
            if state.get(i) == "open":
                found.append(path[path.index(i):] + [i] if i in path else [m, i])
            elif i not in state:
                visit(i, [*path, i])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def test_every_service_import_runs_down_the_floors():
    graph = import_graph()
    assert {p.name for p in SERVICE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(FLOORS)
    assert graph["cropi_service.api.app"] >= {"cropi_service.domain.service"}  # the walk sees relative imports
    upward = sorted(f"{m} -> {i}" for m, imports in graph.items() for i in imports if floor(i) > floor(m))
    assert not upward, upward


def layer(module: str) -> int | None:
    """The library layer of ``module`` (None for the ``cropi`` package itself, which imports nothing)."""
    parts = module.split(".")
    return next((i for i, names in enumerate(LAYERS) if len(parts) > 1 and parts[1] in names), None)


def named_modules(path: Path) -> set[str]:
    """Library modules ``path`` names in a string (``"cropi.x.y"`` or ``"cropi.x.y:attr"``): what lazy
    exports and registries import by name when first asked, which the import walk does not see."""
    return {node.value.partition(":")[0] for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.startswith("cropi.") and _is_module(node.value.partition(":")[0])}


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {i}" for m, imports in graph.items() for i in imports
                  if layer(m) is not None and layer(i) is not None and layer(i) > layer(m))


def test_every_library_import_runs_down_the_layers():
    library = REPO / "cropi"
    graph = import_graph(library)
    for path in library.rglob("*.py"):
        graph[module_name(path)] |= named_modules(path)
    unplaced = sorted({m.split(".")[1] for m in graph if m != "cropi" and layer(m) is None})
    assert not unplaced, f"give {unplaced} a layer in LAYERS (and docs/architecture.md)"
    # the walk sees imports inside functions and by name, so a lazy import cannot hide one going up
    assert "cropi.gradients.engine" in graph["cropi.trainers.filters"]
    assert "cropi.gradients.computer" in graph["cropi.gradients"]
    assert upward({"cropi.gradients.engine": {"cropi.trainers.shared_update"}}) == \
        ["cropi.gradients.engine -> cropi.trainers.shared_update"]
    found = upward(graph)
    assert not found, found


def test_the_docs_list_the_librarys_layers_as_the_walk_checks_them():
    """docs/architecture.md's layer table and the README's layout name every package at its layer."""
    table: dict[int, set[str]] = {}
    for row in (REPO / "docs" / "architecture.md").read_text().splitlines():
        cells = row.split("|")
        if len(cells) > 3 and cells[1].strip().isdigit():
            names = {n.removeprefix("cropi.") for n in re.findall(r"`(cropi\.\w+)`", cells[2])}
            names |= {n.removesuffix(".py") for n in re.findall(r"`(\w+\.py)`", cells[2])}
            table.setdefault(int(cells[1]), set()).update(names)
    assert table == dict(enumerate(map(set, LAYERS)))
    readme = (REPO / "README.md").read_text()
    line = " ".join(readme.split("\n- `cropi/` the library", 1)[1].split("\n- ", 1)[0].split())
    layout = [set(re.findall(r"`(\w+)`", part)) for part in line.split(":", 1)[1].split(" < ")]
    assert layout == list(map(set, LAYERS))


@pytest.mark.parametrize("package", ["cropi_service", "cropi"])
def test_the_imports_have_no_circles(package):
    assert not circles(import_graph(REPO / package))


def test_the_http_server_imports_no_torch():
    code = ("import sys, cropi_service.api.app, cropi_service.entry.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out


def test_builtin_job_kinds_are_the_library_functions():
    from cropi.pipeline.score import score_checkpoint
    from cropi_service.jobs import kinds
    from cropi_service.jobs.runner import DEFAULT_KINDS
    from cropi_service.jobs.worker import resolve_target

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
        main = getattr(importlib.import_module(module), attr)
        assert callable(main)
    from cropi_service.entry.cli import build_parser

    # the README's `cropi serve --root ... --data-root ...`: the plugin gets argv from the command name on
    a = build_parser().parse_args(["serve", "--root", "/r", "--data-root", "/d"])
    assert a.command == "serve" and a.root == "/r" and a.data_roots == ["/d"]


def test_no_test_module_imports_another():
    for path in (REPO / "tests").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0].startswith("test_")], path  # shared parts: tests/support
        assert "sys.path.insert" not in path.read_text() or path.name == "test_service_structure.py", path

