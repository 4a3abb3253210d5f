"""Fidelity of projected influence scores against exact ones, on a model trained on a verifiable task.

The model: a Qwen2 of about 10.7M parameters warm-started on the demo's skills task
exactly as the demo's model is (cropi.models.warmstart, the demo's recipe, only the
shape larger), built once and cached in the work dir. Its trajectories: K=8 responses
per prompt sampled at T=0.5 by the hf backend, scored by the task's verifiable reward.

``--quick`` runs the same measurement on the demo's shipped 0.45M model (nothing to build).

Exact influence of a pool prompt: the cosine of its full (unprojected) POPI gradient
with the mean full gradient of the validation prompts (both targeted validation
sets). Gradients are streamed block by block: only the validation mean, the exact
cosines and the projected vectors are kept. Every cell of the grid (kind x k x kept
fraction x projection seed) projects the same gradients; we report precision@10%
(overlap of the top-10% sets among informative prompts) and Spearman correlation.

``factored`` cells (per-layer ``P_out G P_in^T`` blocks of the linear layers and the tied
embedding, several factor sizes) project the same full gradients (``FactoredProjector.project``,
which equals the hook path: tests/test_factored.py). They leave out biases and norms;
``exact_covered`` reports how the exact influence restricted to the parameters they cover
ranks against the exact one, so a factored cell's loss splits into "which parameters" and "the
projection". ``--cells factored`` runs only those cells (plus the default spec as the anchor) and writes
DIR/fidelity_factored.json beside the full grid's file.

``tensorsketch`` cells (cropi.projection.tensorsketch: the same parameters, one shared sketch of
dim k) project the same full gradients through ``TensorSketchProjector.project``, which equals its
hook path (tests/test_batched_sketch.py). ``batched_goal`` says, per batched cell, whether every seed
reaches precision@10% >= 0.95 at >= 100x; ``exact_boundary`` lists the exact cosines around the
top-10% cut (near-ties there cost precision whatever the projection).

``--model-dtype bfloat16`` measures instead what users' GPUs score with: the default spec (cropi's
``DEFAULT_SPEC``, at its 3 projection seeds) computed the way the gradients job computes it (the batched
computer's hook path, ``make_computer``) with the model itself in bfloat16 (and, side by side in the same
run, in float32), against exact influence from full gradients of the model in float64 (gradients rounded
to float32 once, when stored; cosines in float64). Same model, trajectories and precision@10% as above;
``goal``: every seed >= 0.95 at >= 100x. Writes DIR/fidelity_<dtype>.json (keys ``dtype``,
``compression``, ``precision_at_10_by_seed``), which cropi.projection.fidelity reads.

    python benchmarks/fidelity.py [--quick] [--cells factored,tensorsketch] --out DIR   ->  DIR/fidelity.json, DIR/fidelity.png
    python benchmarks/fidelity.py --model-dtype bfloat16 --out DIR                   ->  DIR/fidelity_bfloat16.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import collect_trajectories, environment, load_model, warm_model, write_json  # noqa: E402

from cropi.demo.assets import RECIPE, shipped_model, task_splits  # noqa: E402
from cropi.gradients import GradientComputer, LossOptions, make_computer  # noqa: E402
from cropi.models.loading import load_causal_lm  # noqa: E402
from cropi.projection import ProjectionSpec, make_projector  # noqa: E402
from cropi.projection.spec import DEFAULT_SPEC  # noqa: E402

MODEL_NAME = "fidelity-10m"
# The demo model's family, wider and deeper: 10.7M parameters.
MODEL_DIMS = dict(hidden_size=384, num_attention_heads=6, num_key_value_heads=2, num_hidden_layers=6,
                  intermediate_size=1152, vocab_size=512)
# the "default" cell of the committed results: cropi's default spec when they were measured (now DEFAULT_SPEC,
# the tensorsketch/k=4096 cell)
DEFAULT = ProjectionSpec(kind="sjlt", dim=32768, kept_fraction=0.1)
SEEDS = (0, 1, 2)
FULL = dict(pool=640, val=50, dims=(4096, 32768), fractions=(1.0, 0.1, 0.01), dense_dims=(1024,),
            factors=(4, 8, 16, 32), sketch_dims=(4096, 32768))
# --quick: the demo's shipped 0.45M model (no warm-start to build), a small pool and grid.
QUICK = dict(pool=80, val=8, dims=(4096, 32768), fractions=(0.1, 0.01), dense_dims=(1024,), factors=(4, 8, 16),
             sketch_dims=(4096,))
DENSE_FRACTION = 0.01  # a dense k x |S| matrix is generated per block: only a small S is affordable on CPU
BLOCK = 32
# Projecting every kept coordinate (r = 1) and generating dense matrices cost most on CPU: those
# cells run at one seed; every other cell at all of SEEDS.
ONE_SEED_FRACTION = 1.0


def warm_config():
    return dataclasses.replace(RECIPE, size=MODEL_NAME)


def grid(cfg: dict, only: str | None = None) -> dict[str, tuple[ProjectionSpec, tuple[int, ...]]]:
    """Cell name -> (spec at seed 0, the seeds it runs at). The default spec is its own cell.
    ``only``: comma-separated prefixes; keep the cells whose name starts with one (and the default)."""
    cells = {}
    for f in cfg["factors"]:
        cells[f"factored/{f}x{f}"] = (ProjectionSpec(kind="factored", factor_in=f, factor_out=f), SEEDS)
    for k in cfg["sketch_dims"]:
        cells[f"tensorsketch/k={k}"] = (ProjectionSpec(kind="tensorsketch", dim=k), SEEDS)
    for k in cfg["dims"]:
        for r in cfg["fractions"]:
            spec = ProjectionSpec(kind="sjlt", dim=k, kept_fraction=r)
            if spec != DEFAULT:
                cells[f"sjlt/k={k}/r={r}"] = (spec, SEEDS[:1] if r >= ONE_SEED_FRACTION else SEEDS)
    cells["default"] = (DEFAULT, SEEDS)
    for kind in ("gaussian", "rademacher"):
        for k in cfg["dense_dims"]:
            cells[f"{kind}/k={k}/r={DENSE_FRACTION}"] = (ProjectionSpec(kind=kind, dim=k, kept_fraction=DENSE_FRACTION),
                                                         SEEDS[:1])
    prefixes = None if only is None else tuple(only.split(","))
    return {k: v for k, v in cells.items() if prefixes is None or k == "default" or k.startswith(prefixes)}


def full_gradients(computer: GradientComputer, trajs, label: str):
    """Yield (results, float32 matrix of full gradients) block by block; only one block in memory."""
    started = time.perf_counter()
    for start in range(0, len(trajs), BLOCK):
        results = [computer.compute(t) for t in trajs[start:start + BLOCK]]
        yield results, torch.from_numpy(np.stack([r.vector for r in results]))
        done = start + len(results)
        print(f"  {label}: {done}/{len(trajs)} prompts, {time.perf_counter() - started:.0f}s", flush=True)


def precision_at(exact: np.ndarray, approx: np.ndarray, frac: float = 0.1) -> float:
    n = max(1, int(round(frac * len(exact))))
    top = lambda s: set(np.argsort(-s, kind="stable")[:n].tolist())  # noqa: E731
    return len(top(exact) & top(approx)) / n


def cosines(mat: np.ndarray, v: np.ndarray) -> np.ndarray:
    return (mat @ v) / (np.linalg.norm(mat, axis=1) * np.linalg.norm(v) + 1e-30)


def named(g: torch.Tensor, shapes: dict) -> list[tuple[str, torch.Tensor]]:
    """Rows of identity-layout gradients (every parameter, in order) as (name, (n, *shape)) pairs."""
    parts = torch.split(g, [int(np.prod(s)) for s in shapes.values()], dim=1)
    return [(n, p.reshape(g.shape[0], *s)) for (n, s), p in zip(shapes.items(), parts)]


def run(quick: bool, out: Path, workdir: Path, only: str | None = None) -> dict:
    torch.set_num_threads(1)  # on a shared 2-core machine one thread is several times faster than two
    cfg = QUICK if quick else FULL
    t0 = time.perf_counter()
    model_path = str(shipped_model()) if quick else warm_model(workdir, MODEL_NAME, MODEL_DIMS, warm_config())
    t_model = time.perf_counter() - t0
    splits = task_splits()
    pool_records = splits["pool"][:cfg["pool"]]
    val_records = splits["val_count"][:cfg["val"]] + splits["val_maxd"][:cfg["val"]]
    pool = collect_trajectories(model_path, pool_records, samples=8, temperature=0.5, seed=1)
    val = collect_trajectories(model_path, val_records, samples=8, temperature=0.5, seed=2)
    t_collect = time.perf_counter() - t0 - t_model

    model = load_model(model_path)
    n_params = sum(p.numel() for p in model.parameters())
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    identity = make_projector(ProjectionSpec(kind="identity", kept_fraction=1.0, identity_limit=2**26), shapes)
    computer = GradientComputer(model, identity)
    cells = grid(cfg, only)
    projectors = {(name, s): make_projector(spec.model_copy(update={"seed": s}), shapes)
                  for name, (spec, seeds) in cells.items() for s in seeds}

    val_sum, val_n = np.zeros(identity.out_dim), 0
    val_proj = {key: 0.0 for key in projectors}
    for results, g in full_gradients(computer, val, "validation gradients"):
        ok = torch.tensor([r.status == "ok" for r in results])
        if not ok.any():
            continue
        val_sum += g[ok].double().sum(0).numpy()
        val_n += int(ok.sum())
        for key, p in projectors.items():
            val_proj[key] = val_proj[key] + p.project(named(g[ok], shapes)).double().sum(0).numpy()
    v_exact = val_sum / max(val_n, 1)
    linear = covered_mask(shapes)

    exact, exact_lin, proj, statuses, ess = [], [], {key: [] for key in projectors}, [], []
    structure = []
    for results, g in full_gradients(computer, pool, "pool gradients + projections"):
        statuses += [r.status for r in results]
        ess += [r.ess for r in results]
        structure += [block_structure(row, shapes) for row, r in zip(g, results) if r.status == "ok"]
        exact.append(np.array([cosines(row.double().numpy()[None], v_exact)[0] for row in g]))
        exact_lin.append(np.array([cosines(row.double().numpy()[None] * linear, v_exact * linear)[0] for row in g]))
        for key, p in projectors.items():
            proj[key].append(p.project(named(g, shapes)).double().numpy())
    t_grad = time.perf_counter() - t0 - t_model - t_collect
    ok = np.array(statuses) == "ok"
    exact = np.concatenate(exact)[ok]
    exact_lin = np.concatenate(exact_lin)[ok]

    report_cells, scatter = {}, None
    for name, (spec, seeds) in cells.items():
        per_seed = {}
        for s in seeds:
            approx = cosines(np.concatenate(proj[(name, s)])[ok], val_proj[(name, s)] / val_n)
            per_seed[s] = {"precision_at_10": precision_at(exact, approx),
                           "spearman": float(spearmanr(exact, approx).statistic),
                           "n_kept": projectors[(name, s)].n_kept}
            if name == "default" and s == SEEDS[0]:
                scatter = (exact.tolist(), approx.tolist())
        prec = np.array([v["precision_at_10"] for v in per_seed.values()])
        kept = np.mean([v["n_kept"] for v in per_seed.values()])
        k = projectors[(name, seeds[0])].out_dim
        report_cells[name] = {"kind": spec.kind, "k": k, "kept_fraction": spec.kept_fraction,
                              "n_kept_mean": float(kept), "compression": float(kept / k),
                              "compression_of_all_parameters": float(n_params / k),
                              "precision_at_10": float(prec.mean()),
                              "precision_at_10_std": float(prec.std(ddof=1)) if len(prec) > 1 else None,
                              "spearman": float(np.mean([v["spearman"] for v in per_seed.values()])),
                              "seeds": {str(s): v for s, v in per_seed.items()}}
    d = report_cells["default"]
    top_n = max(1, int(round(0.1 * ok.sum())))
    rewards = np.array([[r for r in t.rewards] for t in pool], dtype=float)
    report = {"quick": quick, "model": "demo shipped model" if quick else MODEL_NAME,
              "model_parameters": n_params, "model_dims": None if quick else MODEL_DIMS,
              "warm_start": None if quick else dataclasses.asdict(warm_config()),
              "pool_prompts": len(pool), "informative_prompts": int(ok.sum()),
              "top10_size": max(1, int(round(0.1 * ok.sum()))), "validation_prompts": len(val),
              "informative_validation_prompts": val_n, "samples_per_prompt": 8, "temperature": 0.5,
              "pool_mean_reward": float(rewards.mean()),
              "pool_ess_fraction_at_beta": float(np.nanmean([e / 8 for e in ess if e is not None])),
              "default_spec": DEFAULT.model_dump() | {"spec_id": DEFAULT.spec_id}, "seeds": list(SEEDS),
              "precision_at_10": d["precision_at_10"], "precision_at_10_std": d["precision_at_10_std"],
              "spearman": d["spearman"], "compression": d["compression"],
              "goal": {"precision_at_10": 0.90, "compression": 100,
                       "met": bool(d["precision_at_10"] >= 0.90 and d["compression"] >= 100)},
              "cells_run": only or "all",
              "exact_covered": {
                  "what": "exact influence from the parameters the factored kind covers only (2-d weights of the "
                          "linear layers and the embedding; no biases, norms) against that of all parameters",
                  "coordinates": int(linear.sum()), "precision_at_10": precision_at(exact, exact_lin),
                  "spearman": float(spearmanr(exact, exact_lin).statistic)},
              "batched_goal": {
                  name: {"precision_at_10_each_seed": [v["precision_at_10"] for v in c["seeds"].values()],
                         "compression": c["compression"],
                         "met": bool(min(v["precision_at_10"] for v in c["seeds"].values()) >= 0.95
                                     and c["compression"] >= 100)}
                  for name, c in report_cells.items() if c["kind"] in ("factored", "tensorsketch")},
              "exact_boundary": {"ranks": f"{max(1, top_n - 3)}..{top_n + 4} (1-based; the cut after rank {top_n})",
                                 "cosines": np.sort(exact)[::-1][max(0, top_n - 4):top_n + 4].round(5).tolist()},
              "gradient_structure": structure_summary(structure, block_structure(torch.from_numpy(v_exact), shapes)),
              "grid": report_cells,
              "seconds": {"model": t_model, "collect": t_collect, "gradients_and_projections": t_grad,
                          "total": time.perf_counter() - t0},
              "environment": environment()}
    stem = "fidelity" if only is None else "fidelity_" + "_".join(p.strip("/").replace("/", "_") for p in only.split(","))
    write_json(out, f"{stem}.json", report)
    plot(report, cfg, scatter, out / f"{stem}.png")
    return report


def run_dtype(model_dtype: str, quick: bool, out: Path, workdir: Path, attention: str = "sdpa",
              pool_n: int | None = None, val_n: int | None = None) -> dict:
    """The default spec scored with the model in ``model_dtype`` (and in float32 beside it) against exact
    float64 influence (module docstring). ``pool_n`` / ``val_n`` shrink the sets (a smoke run only: the
    goal needs the full pool, whose top 10% is 36 prompts, one miss 0.028)."""
    torch.set_num_threads(1)
    cfg = QUICK if quick else FULL
    t0 = time.perf_counter()
    model_path = str(shipped_model()) if quick else warm_model(workdir, MODEL_NAME, MODEL_DIMS, warm_config())
    t_model = time.perf_counter() - t0
    splits = task_splits()
    pool_n, val_n = pool_n or cfg["pool"], val_n or cfg["val"]
    pool = collect_trajectories(model_path, splits["pool"][:pool_n], samples=8, temperature=0.5, seed=1)
    val = collect_trajectories(model_path, splits["val_count"][:val_n] + splits["val_maxd"][:val_n], samples=8,
                               temperature=0.5, seed=2)
    t_collect = time.perf_counter() - t0 - t_model

    # exact: full gradients of the model in float64 (sdpa: eager attention turns float64 padding rows into NaN)
    exact_model = load_causal_lm(model_path, dtype=torch.float64, attn_implementation="sdpa")
    shapes = {n: tuple(p.shape) for n, p in exact_model.named_parameters()}
    n_params = sum(p.numel() for p in exact_model.parameters())
    identity = make_projector(ProjectionSpec(kind="identity", kept_fraction=1.0, identity_limit=2**26), shapes)
    computer = GradientComputer(exact_model, identity)
    val_sum, val_ok = np.zeros(identity.out_dim), 0
    for results, g in full_gradients(computer, val, "validation gradients (float64)"):
        ok = torch.tensor([r.status == "ok" for r in results])
        val_sum += g[ok].double().sum(0).numpy()
        val_ok += int(ok.sum())
    v_exact = val_sum / max(val_ok, 1)
    exact, statuses = [], []
    for results, g in full_gradients(computer, pool, "pool gradients (float64)"):
        statuses += [r.status for r in results]
        exact.append(cosines(g.double().numpy(), v_exact))
    ok = np.array(statuses) == "ok"
    exact = np.concatenate(exact)[ok]
    del exact_model, computer
    t_exact = time.perf_counter() - t0 - t_model - t_collect

    sides, seconds = {}, {}
    for dtype in dict.fromkeys((model_dtype, "float32")):
        model = load_causal_lm(model_path, dtype=dtype, attn_implementation=attention)
        started = time.perf_counter()
        per_seed = {}
        for seed in SEEDS:
            spec = DEFAULT_SPEC.model_copy(update={"seed": seed})
            comp = make_computer(model, make_projector(spec, shapes), LossOptions())
            scored = {name: [r for i in range(0, len(trajs), comp.prompts_per_call)
                             for r in comp.compute_many(trajs[i:i + comp.prompts_per_call])]
                      for name, trajs in (("val", val), ("pool", pool))}
            v = np.stack([r.vector for r in scored["val"] if r.status == "ok"]).astype(np.float64).mean(0)
            approx = cosines(np.stack([r.vector for r in scored["pool"]]).astype(np.float64), v)[ok]
            per_seed[str(seed)] = {"precision_at_10": precision_at(exact, approx),
                                   "spearman": float(spearmanr(exact, approx).statistic),
                                   "statuses_agree": [r.status for r in scored["pool"]] == statuses}
            print(f"  {dtype} seed {seed}: precision@10% {per_seed[str(seed)]['precision_at_10']:.3f}", flush=True)
        seconds[dtype] = time.perf_counter() - started
        prec = [v["precision_at_10"] for v in per_seed.values()]
        sides[dtype] = {"precision_at_10_by_seed": {s: v["precision_at_10"] for s, v in per_seed.items()},
                        "precision_at_10": float(np.mean(prec)), "seeds": per_seed,
                        "met": bool(min(prec) >= 0.95)}
        del model
    projector = make_projector(DEFAULT_SPEC, shapes)
    compression = projector.n_kept / projector.out_dim
    main = sides[model_dtype]
    report = {"dtype": model_dtype, "attention": attention, "device": "cpu",
              "exact": "full POPI gradients of the model in float64 (rounded to float32 when stored), cosines in "
                       "float64, with the mean validation gradient",
              "scored_with": "the batched computer's hook path (make_computer, as the gradients job), the model in "
                             "this dtype",
              "spec": DEFAULT_SPEC.model_dump() | {"spec_id": DEFAULT_SPEC.spec_id},
              "cell": f"{DEFAULT_SPEC.kind}/k={DEFAULT_SPEC.dim}", "seeds": list(SEEDS),
              "compression": compression, "compression_of_all_parameters": n_params / projector.out_dim,
              "precision_at_10_by_seed": main["precision_at_10_by_seed"],
              "precision_at_10": main["precision_at_10"],
              "goal": {"precision_at_10_each_seed_at_least": 0.95, "compression_at_least": 100,
                       "met": bool(main["met"] and compression >= 100)},
              "by_dtype": sides,
              "quick": quick, "model": "demo shipped model" if quick else MODEL_NAME, "model_parameters": n_params,
              "pool_prompts": len(pool), "informative_prompts": int(ok.sum()),
              "top10_size": max(1, int(round(0.1 * ok.sum()))), "validation_prompts": len(val),
              "informative_validation_prompts": val_ok,
              "seconds": {"model": t_model, "collect": t_collect, "exact_float64": t_exact,
                          **{f"scored_{k}": v for k, v in seconds.items()}, "total": time.perf_counter() - t0},
              "environment": environment()}
    write_json(out, f"fidelity_{model_dtype}.json", report)
    return report


def block_structure(row: torch.Tensor, shapes: dict) -> dict:
    """How concentrated one gradient is: the largest 2-d block's share of the squared norm, and within
    that block the share of its top 20 rows and of its top singular value (why a Kronecker sketch,
    whose error on a rank-one block shrinks only as 1/sqrt(factor), fails here)."""
    parts = dict(zip(shapes, torch.split(row.double(), [int(np.prod(s)) for s in shapes.values()])))
    total = float(row.double().pow(2).sum()) or 1.0
    name = max((n for n, s in shapes.items() if len(s) == 2), key=lambda n: float(parts[n].pow(2).sum()))
    block = parts[name].reshape(shapes[name])
    energy = float(block.pow(2).sum()) or 1.0
    rows = torch.sort(block.pow(2).sum(1), descending=True).values
    sv = torch.linalg.svdvals(block).pow(2)
    return {"block": name, "block_share": energy / total, "top20_rows_share": float(rows[:20].sum()) / energy,
            "top_singular_share": float(sv[0] / sv.sum())}


def structure_summary(rows: list[dict], validation: dict) -> dict:
    names = [r["block"] for r in rows]
    top = max(set(names), key=names.count)
    med = {k: float(np.median([r[k] for r in rows])) for k in ("block_share", "top20_rows_share", "top_singular_share")}
    return {"what": "per informative pool prompt (medians) and for the validation mean: the 2-d block with the largest "
                    "share of the squared gradient norm, that share, and within the block the share of its top 20 "
                    "rows and of its top singular value",
            "dominant_block": top, "prompts_with_that_block": names.count(top) / max(1, len(names)),
            "median": med, "validation_mean": validation}


def covered_mask(shapes: dict) -> np.ndarray:
    """1 on the identity layout's coordinates of the parameters the factored kind covers."""
    covered = set(make_projector(ProjectionSpec(kind="factored", factor_in=1, factor_out=1), shapes).param_names)
    return np.concatenate([np.full(int(np.prod(s)), float(n in covered)) for n, s in shapes.items()])


def plot(report: dict, cfg: dict, scatter, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = report["grid"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    ax = axes[0]
    for k in cfg["dims"]:
        rows = [c for c in cells.values() if c["kind"] == "sjlt" and c["k"] == k]
        rows.sort(key=lambda c: c["kept_fraction"])
        ax.errorbar([c["kept_fraction"] for c in rows], [c["precision_at_10"] for c in rows],
                    yerr=[c["precision_at_10_std"] or 0 for c in rows], marker="o", capsize=3, label=f"sjlt k={k}")
    for name, c in cells.items():
        if c["kind"] in ("factored", "tensorsketch"):
            ax.errorbar([1.0], [c["precision_at_10"]], yerr=[c["precision_at_10_std"] or 0], marker="^", capsize=3,
                        linestyle="none", label=f"{name} ({c['compression']:.0f}x)")
        if c["kind"] in ("gaussian", "rademacher"):
            ax.errorbar([c["kept_fraction"]], [c["precision_at_10"]], yerr=[c["precision_at_10_std"] or 0],
                        marker="s", capsize=3, linestyle="none", label=f"{c['kind']} k={c['k']}")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.axhline(0.9, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("kept fraction r")
    ax.set_ylabel(f"precision@10% (mean +- sd over seeds)")
    ax.set_title(f"{report['model_parameters'] / 1e6:.1f}M-param model, {report['informative_prompts']} "
                 f"informative prompts")
    ax.legend(fontsize=8)
    exact, approx = scatter
    axes[1].scatter(exact, approx, s=8)
    axes[1].set_xlabel("exact cosine (full gradients)")
    axes[1].set_ylabel("projected cosine (default spec, seed 0)")
    axes[1].set_title(f"default spec: p@10% {report['precision_at_10']:.2f} +- {report['precision_at_10_std']:.2f}, "
                      f"compression {report['compression']:.0f}x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the demo's shipped model, fewer prompts and cells")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workdir", type=Path, default=None, help="where the model is built and cached (default: OUT/work)")
    ap.add_argument("--cells", default=None, help="run only the cells whose name starts with one of these "
                    "comma-separated prefixes (e.g. factored,tensorsketch)")
    ap.add_argument("--model-dtype", choices=["float32", "bfloat16", "float16"], default=None,
                    help="score the default spec with the model in this dtype (through the batched computer, with "
                    "float32 beside it) against exact float64 influence; writes OUT/fidelity_<dtype>.json")
    ap.add_argument("--attention", default="sdpa", help="--model-dtype: the scored model's attention (default: sdpa)")
    ap.add_argument("--pool", type=int, default=None, help="--model-dtype: pool prompts (a smoke run; default: all)")
    ap.add_argument("--val", type=int, default=None, help="--model-dtype: prompts per validation set (smoke run)")
    a = ap.parse_args(argv)
    if a.model_dtype:
        r = run_dtype(a.model_dtype, a.quick, a.out, a.workdir or a.out / "work", a.attention, a.pool, a.val)
        print(f"{a.model_dtype}: precision@10% by seed {r['precision_at_10_by_seed']} at {r['compression']:.0f}x "
              f"(float32 side by side: {r['by_dtype'].get('float32', {}).get('precision_at_10_by_seed')}); goal met: "
              f"{r['goal']['met']}; wrote {a.out / f'fidelity_{a.model_dtype}.json'}")
        return
    report = run(a.quick, a.out, a.workdir or a.out / "work", a.cells)
    print(f"precision@10% (default spec {DEFAULT.spec_id}, {len(SEEDS)} seeds): {report['precision_at_10']:.3f} "
          f"+- {report['precision_at_10_std']:.3f}, compression {report['compression']:.1f}x, "
          f"{report['informative_prompts']} informative prompts; wrote {a.out}")


if __name__ == "__main__":
    main()
