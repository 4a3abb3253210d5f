"""Fidelity of projected influence scores against exact ones.

On a small local model (a few million parameters), the exact POPI gradients of a
pool and a validation set are computed in full; the exact score of a pool prompt is
the cosine of its full gradient with the mean full validation gradient. Every
projection spec of the grid (k x kept fraction) scores the same gradients, and we
report precision@10% (overlap of the top-10% sets) and Spearman correlation.

    python benchmarks/fidelity.py [--quick] --out DIR   ->  DIR/fidelity.json, DIR/fidelity.png
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, load_model, small_model, synthetic_trajectories, write_json  # noqa: E402

from cropi.gradients import GradientComputer  # noqa: E402
from cropi.projection import ProjectionSpec, make_projector  # noqa: E402

DIMS = (1024, 4096, 8192, 32768)
FRACTIONS = (1.0, 0.3, 0.1, 0.03, 0.01)
DEFAULT = ProjectionSpec()


def grid_specs() -> dict[str, ProjectionSpec]:
    specs = {f"sjlt/k={k}/r={r}": ProjectionSpec(kind="sjlt", dim=k, kept_fraction=r) for k in DIMS for r in FRACTIONS}
    specs["default"] = DEFAULT
    for kind in ("gaussian", "rademacher"):  # dense kinds are slow on CPU: one small point each
        specs[f"{kind}/k=1024/r=0.01"] = ProjectionSpec(kind=kind, dim=1024, kept_fraction=0.01)
    specs["sjlt-nnz1/k=1024/r=0.01"] = ProjectionSpec(kind="sjlt", dim=1024, kept_fraction=0.01, nnz=1)
    return specs


def exact_gradients(model, trajs, block: int, label: str):
    """Yield (status list, float32 matrix of full gradients) block by block."""
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    full = make_projector(ProjectionSpec(kind="identity", kept_fraction=1.0, identity_limit=2**26), shapes)
    computer = GradientComputer(model, full)
    bar = tqdm(total=len(trajs), desc=f"{label} gradients + projections", unit="prompt")
    for start in range(0, len(trajs), block):
        results = [computer.compute(t) for t in trajs[start:start + block]]
        yield [r.status for r in results], np.stack([r.vector for r in results])
        bar.update(len(results))
    bar.close()


def precision_at(exact: np.ndarray, approx: np.ndarray, frac: float = 0.1) -> float:
    n = max(1, int(round(frac * len(exact))))
    top = lambda s: set(np.argsort(-s, kind="stable")[:n].tolist())  # noqa: E731
    return len(top(exact) & top(approx)) / n


def cosines(mat: np.ndarray, v: np.ndarray) -> np.ndarray:
    return (mat @ v) / (np.linalg.norm(mat, axis=1) * np.linalg.norm(v) + 1e-30)


def run(quick: bool, out: Path, workdir: Path) -> dict:
    n_pool, n_val = (120, 24) if quick else (240, 48)
    t0 = time.perf_counter()
    model_path = small_model(workdir)
    model = load_model(model_path)
    n_params = sum(p.numel() for p in model.parameters())
    trajs = synthetic_trajectories(model_path, n_pool + n_val, seed=1)
    pool, val = trajs[:n_pool], trajs[n_pool:]
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    specs = grid_specs()
    projectors = {name: make_projector(s, shapes) for name, s in specs.items()}
    t_setup = time.perf_counter() - t0

    val_sum, val_n, val_proj = 0.0, 0, {name: 0.0 for name in specs}
    for status, g in exact_gradients(model, val, 16, "validation"):
        ok = np.array(status) == "ok"
        val_sum = val_sum + g[ok].astype(np.float64).sum(0)
        val_n += int(ok.sum())
        for name, p in projectors.items():
            val_proj[name] = val_proj[name] + p.project_flat(_t(g[ok])).numpy().astype(np.float64).sum(0)
    v_exact = val_sum / val_n

    exact, proj, statuses = [], {name: [] for name in specs}, []
    for status, g in exact_gradients(model, pool, 16, "pool"):
        statuses += status
        exact.append(cosines(g.astype(np.float64), v_exact))
        for name, p in projectors.items():
            proj[name].append(p.project_flat(_t(g)).numpy().astype(np.float64))
    ok = np.array(statuses) == "ok"
    exact = np.concatenate(exact)[ok]
    results = {}
    for name, chunks in proj.items():
        approx = cosines(np.concatenate(chunks)[ok], val_proj[name] / val_n)
        results[name] = {"spec": specs[name].model_dump(), "spec_id": specs[name].spec_id,
                         "n_kept": projectors[name].n_kept,
                         "precision_at_10": precision_at(exact, approx),
                         "spearman": float(spearmanr(exact, approx).statistic),
                         "max_abs_cos_error": float(np.max(np.abs(exact - approx))),
                         "exact": exact.tolist() if name == "default" else None,
                         "approx": approx.tolist() if name == "default" else None}
    report = {"quick": quick, "model_parameters": n_params, "pool_prompts": n_pool, "ok_pool_prompts": int(ok.sum()),
              "validation_prompts": n_val, "ok_validation_prompts": val_n, "default_spec": DEFAULT.model_dump(),
              "precision_at_10": results["default"]["precision_at_10"], "spearman": results["default"]["spearman"],
              "grid": {k: {kk: vv for kk, vv in v.items() if kk not in ("exact", "approx")} for k, v in results.items()},
              "seconds": {"setup": t_setup, "total": time.perf_counter() - t0}, "environment": environment()}
    write_json(out, "fidelity.json", report)
    plot(results, out / "fidelity.png")
    return report


def _t(a: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, metric in zip(axes[:2], ("precision_at_10", "spearman")):
        grid = np.array([[results[f"sjlt/k={k}/r={r}"][metric] for r in FRACTIONS] for k in DIMS])
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis")
        ax.set_xticks(range(len(FRACTIONS)), [str(r) for r in FRACTIONS])
        ax.set_yticks(range(len(DIMS)), [str(k) for k in DIMS])
        ax.set_xlabel("kept fraction r")
        ax.set_ylabel("k")
        ax.set_title(f"sjlt: {metric}")
        for (i, j), val in np.ndenumerate(grid):
            ax.text(j, i, f"{val:.2f}", ha="center", va="center", color="w" if val < 0.6 else "k")
        fig.colorbar(im, ax=ax)
    d = results["default"]
    axes[2].scatter(d["exact"], d["approx"], s=8)
    axes[2].set_xlabel("exact cosine")
    axes[2].set_ylabel("projected cosine")
    axes[2].set_title(f"default spec: p@10%={d['precision_at_10']:.2f}, rho={d['spearman']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompts (a few minutes on 2 cores)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workdir", type=Path, default=None, help="where the model is built (default: OUT/work)")
    a = ap.parse_args(argv)
    report = run(a.quick, a.out, a.workdir or a.out / "work")
    print(f"precision@10% (default spec {DEFAULT.spec_id}): {report['precision_at_10']:.3f}, "
          f"spearman {report['spearman']:.3f}; wrote {a.out / 'fidelity.json'}")


if __name__ == "__main__":
    main()
