"""Which projection specs have a measured ranking fidelity, and the notice for one that has none.

``benchmarks/fidelity.py`` measures, on a trained 10.5M-parameter model with real rewards, how well
a spec's projected influence ranks the pool against the exact (unprojected) one: precision@10%
over three projection seeds. A spec's fidelity depends on its kind and its sizes (dim, kept
fraction, nnz, factors, the parameter filter), not on its seed, so a spec counts as measured when a
committed result holds a cell with the same fields but the seed. Any spec can still be used: a
spec measured nowhere only gets a notice (``cropi rank`` prints it) naming the benchmark that
measures it.

``MEASURED`` is copied from the committed results it names (tests/test_fidelity_notice.py checks
every cell of those files is here, so a new result that is not added fails a test). Each entry says
where it was measured: on CPU, with the model in float32 (``device``, ``model_dtype``). The model's
dtype changes the gradients (bfloat16 rounds every activation), so a bfloat16 model's fidelity is its
own measurement (``benchmarks/fidelity.py --model-dtype bfloat16``, against exact float64 influence):
``DTYPE_MEASURED`` lists the specs measured so; a spec scored in a dtype measured nowhere gets the
notice too, naming that benchmark.
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
    where = {"device": "cpu", "model_dtype": "float32"}
    return {_key(ProjectionSpec(**fields)): {"result": path, "cell": cell, **where} for fields, path, cell in rows}


MEASURED = _cells()

# Specs whose fidelity was measured with the model in another dtype than float32: (spec key, dtype) -> where.
# Filled from the committed results of ``benchmarks/fidelity.py --model-dtype <dtype>`` (each holds one cell:
# the spec it scored, at 3 seeds); tests/test_fidelity_notice.py checks each entry against its file.
DTYPE_RESULTS = {"bfloat16": "benchmarks/results/fidelity_bfloat16.json"}


def _dtype_cells() -> dict[tuple, dict[str, Any]]:
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = {}
    for dtype, path in DTYPE_RESULTS.items():
        file = root / path
        if not file.is_file():  # not measured yet (or an installed copy without the results)
            continue
        doc = json.loads(file.read_text())
        spec = ProjectionSpec(**{k: v for k, v in doc["spec"].items() if k != "spec_id"})
        out[(_key(spec), dtype)] = {"result": path, "cell": doc["cell"], "device": doc["device"],
                                    "model_dtype": dtype, "met": bool(doc["goal"]["met"])}
    return out


DTYPE_MEASURED = _dtype_cells()


def measured(spec: ProjectionSpec, model_dtype: str = "float32") -> dict[str, Any] | None:
    """Where ``spec``'s fidelity was measured with the model in ``model_dtype`` (``{"result": path, "cell":
    name, "device": ..., "model_dtype": ...}``), or None."""
    if model_dtype == "float32":
        return MEASURED.get(_key(spec))
    return DTYPE_MEASURED.get((_key(spec), model_dtype))


def notice(spec: ProjectionSpec, model_dtype: str = "float32") -> str | None:
    """A one-line notice for a spec whose fidelity was never measured at its size (or with the model in
    ``model_dtype``); None when it was."""
    if measured(spec, model_dtype) is not None:
        return None
    if model_dtype != "float32" and measured(spec) is not None:
        return (f"notice: projection spec {spec.spec_id} has a measured ranking fidelity with the model in float32, "
                f"not in {model_dtype}; {BENCHMARK} --model-dtype {model_dtype} measures it (precision@10% against "
                f"exact float64 influence on {MODEL}, 3 seeds). The ranking is still valid for this spec.")
    sizes = ", ".join(f"{k}={v}" for k, v in _key(spec) if v is not None and k not in ("identity_limit",)
                      and not (k == "nnz" and spec.kind != "sjlt"))
    return (f"notice: projection spec {spec.spec_id} ({sizes}) has no measured ranking fidelity at this size; "
            f"{BENCHMARK} measures it (precision@10% against exact influence on {MODEL}, 3 seeds): add the "
            f"spec to its grid and run it. The ranking is still valid for this spec.")


def notice_for_record(record: Mapping[str, Any], model_dtype: str = "float32") -> str | None:
    """``notice`` for a spec as a store records it (its fields and ``spec_id``); None when the record does
    not rebuild a spec (an older or foreign record): the notice is advice and never fails a ranking."""
    try:
        spec = ProjectionSpec.from_record(record)
    except (CropiError, ValueError, TypeError, KeyError):
        return None
    return notice(spec, model_dtype)


def notice_for_split(store: str, checkpoint: str, spec_id: str, split: str) -> str | None:
    """``notice`` for the spec a stored split was computed with, and the model dtype it ran in (the split's
    identity records it when not float32: cropi.gradients.options.ModelOptions.recorded)."""
    from cropi.store import GradientStore

    split_ = GradientStore(store).open_split(checkpoint, spec_id, split)
    model = split_.extra.get("model") if isinstance(split_.extra, dict) else None
    dtype = model.get("model_dtype", "float32") if isinstance(model, dict) else "float32"
    return notice_for_record(split_.spec, dtype)
