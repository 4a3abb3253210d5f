"""Which projection specs have a measured ranking fidelity, and the notice for one that has none.

``benchmarks/fidelity.py`` measures, on a trained 10.5M-parameter model with real rewards, how well
a spec's projected influence ranks the pool against the exact (unprojected) one: precision@10%
over three projection seeds. A spec's fidelity depends on its kind and its sizes (dim, kept
fraction, nnz, factors, the parameter filter), not on its seed, so a spec counts as measured when a
committed result holds a cell with the same fields but the seed. Any spec can still be used: a
spec measured nowhere only gets a notice (``cropi rank`` prints it) naming the benchmark that
measures it.

``MEASURED`` is copied from the committed results it names (tests/test_fidelity_notice.py checks
every cell of those files is here, so a new result that is not added fails a test).
"""

from __future__ import annotations

from typing import Any, Mapping

from cropi.errors import CropiError
from cropi.projection.spec import ProjectionSpec

BENCHMARK = "benchmarks/fidelity.py"
MODEL = "the 10.5M-parameter fidelity model"


def _key(spec: ProjectionSpec) -> tuple:
    """The fields fidelity depends on: the recorded spec without its seed."""
    return tuple(sorted((k, v) for k, v in spec.recorded().items() if k != "seed"))


def _cells() -> dict[tuple, dict[str, Any]]:
    """Measured spec (as ``_key``) -> figures and the result file that holds them."""
    rows = []
    grid = "benchmarks/results/fidelity.json"
    for k in (4096, 32768):
        for r in (1.0, 0.1, 0.01):
            rows.append((dict(kind="sjlt", dim=k, kept_fraction=r), grid, f"sjlt/k={k}/r={r}"))
    for kind in ("gaussian", "rademacher"):
        rows.append((dict(kind=kind, dim=1024, kept_fraction=0.01), grid, f"{kind}/k=1024/r=0.01"))
    batched = "benchmarks/results/fidelity_factored_tensorsketch.json"
    for f in (4, 8, 16, 32):
        rows.append((dict(kind="factored", factor_in=f, factor_out=f), batched, f"factored/{f}x{f}"))
    for k in (4096, 32768):
        rows.append((dict(kind="tensorsketch", dim=k), batched, f"tensorsketch/k={k}"))
    return {_key(ProjectionSpec(**fields)): {"result": path, "cell": cell} for fields, path, cell in rows}


MEASURED = _cells()


def measured(spec: ProjectionSpec) -> dict[str, Any] | None:
    """Where ``spec``'s fidelity was measured (``{"result": path, "cell": name}``), or None."""
    return MEASURED.get(_key(spec))


def notice(spec: ProjectionSpec) -> str | None:
    """A one-line notice for a spec whose fidelity was never measured at its size; None when it was."""
    if measured(spec) is not None:
        return None
    sizes = ", ".join(f"{k}={v}" for k, v in _key(spec) if v is not None and k not in ("identity_limit",)
                      and not (k == "nnz" and spec.kind != "sjlt"))
    return (f"notice: projection spec {spec.spec_id} ({sizes}) has no measured ranking fidelity at this size; "
            f"{BENCHMARK} measures it (precision@10% against exact influence on {MODEL}, 3 seeds): add the "
            f"spec to its grid and run it. The ranking is still valid for this spec.")


def notice_for_record(record: Mapping[str, Any]) -> str | None:
    """``notice`` for a spec as a store records it (its fields and ``spec_id``); None when the record does
    not rebuild a spec (an older or foreign record): the notice is advice and never fails a ranking."""
    try:
        spec = ProjectionSpec.from_record(record)
    except (CropiError, ValueError, TypeError, KeyError):
        return None
    return notice(spec)


def notice_for_split(store: str, checkpoint: str, spec_id: str, split: str) -> str | None:
    """``notice`` for the spec a stored split was computed with."""
    from cropi.store import GradientStore

    return notice_for_record(GradientStore(store).open_split(checkpoint, spec_id, split).spec)
