"""Off-policy fidelity: rankings from the behavior policy's reused trajectories (POPI) against
fresh on-policy rankings, at checkpoints along a real GRPO run, and what refresh by ESS buys.

theta_0 = the demo's shipped warm-started model. Its offline trajectories (pool K=8,
validation K=32, T=0.5) are collected once. GRPO (the lean trainer, whole pool) moves the
policy; at each checkpoint theta_m:

- POPI: per-prompt gradients at theta_m over theta_0's trajectories; score = cosine with
  the mean validation gradient (also over theta_0's trajectories).
- Reference: fresh trajectories sampled at theta_m with K=32 (pool and validation), on-policy
  gradients, same score.
- Refresh: the pool prompts whose ESS/K at theta_m is lowest and below a threshold (at most
  a budget fraction of the pool) are re-collected at theta_m (K=8) and their gradients
  recomputed; a random choice of as many prompts is the control.
- Estimator variants over the same reused trajectories: PPO clip of the token ratio,
  sequence-level truncated importance weights, and cropi's 'theta' estimator (advantages from
  the importance-weighted pass rate and std at theta_m, LossOptions(advantage="theta")).
- Refresh by status: the pool prompts whose reused group most likely differs from a fresh one
  in carrying signal (cropi.pipeline.refresh.status_change_probability above 1/2, highest
  first, at most the budget) are re-collected at theta_m (K=8, the ESS refresh's seed), under
  CROPI's estimator and under 'theta'; a random choice of as many (the ESS control's seed) is
  the control.

Gradients are exact (all parameters, no projection): what is measured is the off-policy
drift alone (benchmarks/fidelity.py measures projection). Top-10% overlap is over the
whole pool (prompts with zero advantage are never ranked), Spearman over prompts
informative in both rankings.

    python benchmarks/offpolicy.py [--quick] [--seed S] --out DIR   ->  DIR/offpolicy.json, DIR/offpolicy.png
                                                                   (seed S > 0: DIR/offpolicy_seedS.*)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import collect_trajectories, environment, write_json  # noqa: E402

from cropi.data import write_jsonl  # noqa: E402
from cropi.demo.assets import copy_model, shipped_model, task_splits  # noqa: E402
from cropi.gradients import GradientComputer, LossOptions  # noqa: E402
from cropi.gradients.popi import sequence_log_weights  # noqa: E402
from cropi.models.loading import load_causal_lm  # noqa: E402
from cropi.pipeline.refresh import select_above, status_change_probability  # noqa: E402
from cropi.projection import ProjectionSpec, make_projector  # noqa: E402
from cropi.trainers import make_trainer  # noqa: E402

FULL = dict(pool=500, val=50, steps=(0, 50, 100, 200))
QUICK = dict(pool=120, val=16, steps=(0, 10, 30))
K_OFFLINE, K_VAL, K_REF = 8, 32, 32
TEMPERATURE = 0.5
REFRESH_BELOW = 0.5    # ESS/K under which a prompt's reused trajectories are re-collected
REFRESH_BUDGET = 0.2   # at most this fraction of the pool
PPO_CLIP = 0.2
TIS_CAP = 2.0          # sequence-level truncated importance weight cap
STATUS_ABOVE = 0.5     # refresh by status: more likely than not that a fresh group's status differs


class TruncatedISComputer(GradientComputer):
    """Sequence-level truncated importance sampling:
    g = -(1/K) sum_k min(w_k, c) A_k (1/|y_k|) sum_t grad log pi(y_kt), w_k = prod_t pi/beta (no gradient
    through w). At theta = beta it is the on-policy POPI gradient, as the default estimator is."""

    def _loss(self, logp, behavior_logp, mask, adv, n_group):
        lw = sequence_log_weights(logp.detach(), behavior_logp, mask)
        w = torch.exp(lw).clamp(max=TIS_CAP).to(logp.dtype)
        per = (logp * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return -(w * adv.to(logp.dtype) * per).sum() / n_group


def scores(computer: GradientComputer, pool, val) -> tuple[np.ndarray, dict, np.ndarray]:
    """Cosine of every pool prompt's gradient with the mean validation gradient (-inf: not informative),
    each pool prompt's record (its diagnostics: ESS/K, p_theta, ...), and the validation mean.
    Gradients stream: only the mean is kept."""
    v = None
    for t in val:
        r = computer.compute(t)
        if r.status == "ok":
            v = r.vector.astype(np.float64) if v is None else v + r.vector
    out, records = np.full(len(pool), -np.inf), {}
    for i, t in enumerate(pool):
        out[i], records[t.prompt_id] = score_one(computer, t, v)
    return out, records, v


def score_one(computer: GradientComputer, traj, v: np.ndarray):
    r = computer.compute(traj)
    if r.status != "ok":
        return -np.inf, r
    g = r.vector.astype(np.float64)
    return float(g @ v / (np.linalg.norm(g) * np.linalg.norm(v) + 1e-30)), r


def top_overlap(a: np.ndarray, b: np.ndarray, frac: float = 0.1) -> float:
    n = max(1, int(round(frac * len(a))))
    top = lambda s: set(np.argsort(-s, kind="stable")[:n].tolist())  # noqa: E731
    return len(top(a) & top(b)) / n


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    both = np.isfinite(a) & np.isfinite(b)
    return float(spearmanr(a[both], b[both]).statistic) if both.sum() > 2 else float("nan")


def exact_computer(model, cls=GradientComputer, **loss) -> GradientComputer:
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    projector = make_projector(ProjectionSpec(kind="identity", kept_fraction=1.0), shapes)
    return cls(model, projector, LossOptions(**loss))


def train_to(steps: int, start: Path, done: int, work: Path, subset: str, seed: int = 0) -> Path:
    """Continue the GRPO run from ``start`` (at ``done`` steps) to ``steps`` steps; the new checkpoint."""
    if steps == done:
        return start
    trainer = make_trainer("lean", eval_files={})
    result = trainer.train_stage(model=str(start), subset=subset, out_dir=str(work / f"step{steps}"),
                                 steps=steps - done, seed=seed, stage=0, reward="exact_numeric")
    return Path(result.checkpoint)


def refresh(model_path: Path, model, pool, base: np.ndarray, v: np.ndarray, chosen: list[int], seed: int,
            computer: GradientComputer | None = None, fresh=None):
    """Scores with the ``chosen`` pool prompts re-collected at the checkpoint (K_OFFLINE) and recomputed
    (the validation mean stays the reused trajectories' one: refresh spends its budget on the pool).
    ``fresh``: those prompts' trajectories already collected (``recollect``)."""
    out = base.copy()
    if not chosen:
        return out
    fresh = fresh if fresh is not None else recollect(model_path, pool, chosen, seed)
    computer = computer or exact_computer(model)
    for i, t in zip(chosen, fresh):
        out[i], _ = score_one(computer, t, v)
    return out


def recollect(model_path: Path, pool, chosen: list[int], seed: int):
    records = [pool_records_by_id[pool[i].prompt_id] for i in chosen]
    return collect_trajectories(str(model_path), records, samples=K_OFFLINE, temperature=TEMPERATURE, seed=seed)


def status_choice(pool, records: dict) -> tuple[list[int], np.ndarray]:
    """Pool indices chosen by refresh-by-status (cropi's own selection), and every prompt's value."""
    rs = [records[t.prompt_id] for t in pool]
    value = status_change_probability([r.reward_mean for r in rs], [r.reward_std for r in rs],
                                      [r.n_responses for r in rs], [_nan(r.p_theta) for r in rs],
                                      [_nan(r.log_mean_weight) for r in rs])
    ids = [t.prompt_id for t in pool]
    index = {p: i for i, p in enumerate(ids)}
    return sorted(index[p] for p in select_above(ids, value, STATUS_ABOVE, REFRESH_BUDGET)), value


def _nan(x) -> float:
    return float("nan") if x is None else float(x)


def refresh_row(refreshed: np.ndarray, control: np.ndarray, base: np.ndarray, ref: np.ndarray, n: int) -> dict:
    """Overlap and Spearman after a refresh of ``n`` prompts and after a random one of as many."""
    b = top_overlap(base, ref)
    gain = lambda s: (top_overlap(s, ref) - b) / n if n else None  # noqa: E731
    return {"overlap_at_10": top_overlap(refreshed, ref), "spearman": spearman(refreshed, ref),
            "overlap_gain_per_refreshed_prompt": gain(refreshed),
            "random": {"overlap_at_10": top_overlap(control, ref), "spearman": spearman(control, ref),
                       "overlap_gain_per_refreshed_prompt": gain(control)}}


def pass_rate_error(pool, records: dict, ref_records: dict) -> dict:
    """Mean |estimate - fresh K_REF pass rate| over the prompts the reused group has mixed rewards on:
    the reused group's mean against the importance-weighted p_theta."""
    rows = [(records[t.prompt_id], ref_records[t.prompt_id].reward_mean) for t in pool
            if records[t.prompt_id].reward_std > 0 and records[t.prompt_id].p_theta is not None]
    return {"prompts": len(rows), "reused_mean": float(np.mean([abs(r.reward_mean - p) for r, p in rows])),
            "p_theta": float(np.mean([abs(r.p_theta - p) for r, p in rows]))}


pool_records_by_id: dict = {}


def run(quick: bool, out: Path, workdir: Path, seed: int = 0) -> dict:
    """``seed`` 0 is the committed run; seed s draws every sample, control and the GRPO run afresh
    (each seed below offset by 1000 s)."""
    S = lambda x: x + 1000 * seed  # noqa: E731
    torch.set_num_threads(1)  # on a shared 2-core machine one thread is several times faster than two
    cfg = QUICK if quick else FULL
    t0 = time.perf_counter()
    workdir.mkdir(parents=True, exist_ok=True)
    theta0 = copy_model(shipped_model(), workdir / "theta0")
    splits = task_splits()
    pool_records = splits["pool"][:cfg["pool"]]
    pool_records_by_id.update({r.prompt_id: r for r in pool_records})
    val_records = splits["val_count"][:cfg["val"]] + splits["val_maxd"][:cfg["val"]]
    subset = str(workdir / "pool.jsonl")
    write_jsonl(pool_records, subset)
    pool = collect_trajectories(str(theta0), pool_records, samples=K_OFFLINE, temperature=TEMPERATURE, seed=S(1))
    val = collect_trajectories(str(theta0), val_records, samples=K_VAL, temperature=TEMPERATURE, seed=S(2))
    n_budget = int(math.floor(REFRESH_BUDGET * len(pool)))
    rng = np.random.default_rng(S(0))
    rng_status = np.random.default_rng(S(1))  # its own stream: the ESS control's draws stay as they were

    rows, path, done = [], theta0, 0
    for steps in cfg["steps"]:
        path, done = train_to(steps, path, done, workdir, subset, seed), steps
        model = load_causal_lm(str(path), device="cpu")
        popi, records, v_popi = scores(exact_computer(model), pool, val)
        ess = {p: r.ess_fraction for p, r in records.items()}
        ref_pool = collect_trajectories(str(path), pool_records, samples=K_REF, temperature=TEMPERATURE, seed=S(100 + steps))
        ref_val = collect_trajectories(str(path), val_records, samples=K_REF, temperature=TEMPERATURE, seed=S(200 + steps))
        ref, ref_records, _ = scores(exact_computer(model), ref_pool, ref_val)
        fractions = np.array([ess[t.prompt_id] if ess[t.prompt_id] is not None else np.inf for t in pool])
        low = [int(i) for i in np.argsort(fractions, kind="stable") if fractions[i] < REFRESH_BELOW][:n_budget]
        refreshed = refresh(path, model, pool, popi, v_popi, low, seed=S(300 + steps))
        control_idx = sorted(rng.choice(len(pool), size=len(low), replace=False).tolist()) if low else []
        control = refresh(path, model, pool, popi, v_popi, control_idx, seed=S(400 + steps))
        clip, _, _ = scores(exact_computer(model, clip_eps=PPO_CLIP), pool, val)
        tis, _, _ = scores(exact_computer(model, TruncatedISComputer), pool, val)
        theta_computer = exact_computer(model, advantage="theta")
        theta, _, v_theta = scores(theta_computer, pool, val)
        chosen, change = status_choice(pool, records)
        fresh = recollect(path, pool, chosen, seed=S(300 + steps)) if chosen else None
        rand_idx = sorted(rng_status.choice(len(pool), size=len(chosen), replace=False).tolist()) if chosen else []
        rand_fresh = recollect(path, pool, rand_idx, seed=S(400 + steps)) if chosen else None
        status = {"above": STATUS_ABOVE, "refreshed_prompts": len(chosen), "refresh_fraction": len(chosen) / len(pool),
                  "above_threshold": int(np.nansum(change > STATUS_ABOVE)),
                  "popi": refresh_row(refresh(path, model, pool, popi, v_popi, chosen, 0, fresh=fresh),
                                      refresh(path, model, pool, popi, v_popi, rand_idx, 0, fresh=rand_fresh),
                                      popi, ref, len(chosen)),
                  "theta": refresh_row(refresh(path, model, pool, theta, v_theta, chosen, 0, theta_computer, fresh),
                                       refresh(path, model, pool, theta, v_theta, rand_idx, 0, theta_computer,
                                               rand_fresh), theta, ref, len(chosen))}
        base_overlap = top_overlap(popi, ref)
        row = {"steps": steps, "overlap_at_10": base_overlap, "spearman": spearman(popi, ref),
               "overlap_at_10_refresh": top_overlap(refreshed, ref), "spearman_refresh": spearman(refreshed, ref),
               "refresh_fraction": len(low) / len(pool), "refreshed_prompts": len(low),
               "overlap_gain_per_refreshed_prompt": ((top_overlap(refreshed, ref) - base_overlap) / len(low)
                                                     if low else None),
               "overlap_at_10_random_refresh": top_overlap(control, ref),
               "ess_fraction": {"mean": float(np.mean(fractions[np.isfinite(fractions)])),
                                "median": float(np.median(fractions[np.isfinite(fractions)])),
                                "below_threshold": int((fractions < REFRESH_BELOW).sum())},
               "variants": {"ppo_clip": {"clip_eps": PPO_CLIP, "overlap_at_10": top_overlap(clip, ref),
                                         "spearman": spearman(clip, ref)},
                            "truncated_is": {"cap": TIS_CAP, "overlap_at_10": top_overlap(tis, ref),
                                             "spearman": spearman(tis, ref)},
                            "theta": {"overlap_at_10": top_overlap(theta, ref), "spearman": spearman(theta, ref),
                                      "informative": int(np.isfinite(theta).sum())}},
               "status_refresh": status,
               "pass_rate_error": pass_rate_error(pool, records, ref_records),
               "informative": {"popi": int(np.isfinite(popi).sum()), "reference": int(np.isfinite(ref).sum())},
               "seconds": time.perf_counter() - t0}
        rows.append(row)
        print(f"step {steps}: overlap {row['overlap_at_10']:.3f} (refresh {row['overlap_at_10_refresh']:.3f} "
              f"with {len(low)} prompts; random {row['overlap_at_10_random_refresh']:.3f}), "
              f"spearman {row['spearman']:.3f}, ess/K median {row['ess_fraction']['median']:.3f}, "
              f"clip {row['variants']['ppo_clip']['overlap_at_10']:.3f}, "
              f"tis {row['variants']['truncated_is']['overlap_at_10']:.3f}, "
              f"theta {row['variants']['theta']['overlap_at_10']:.3f}; status refresh of {len(chosen)}: "
              f"popi {status['popi']['overlap_at_10']:.3f} (random {status['popi']['random']['overlap_at_10']:.3f}), "
              f"theta {status['theta']['overlap_at_10']:.3f} (random {status['theta']['random']['overlap_at_10']:.3f}), "
              f"{row['seconds']:.0f}s", flush=True)

    far = rows[-1]
    report = {"quick": quick, "seed": seed, "model": "demo shipped warm-start (cropi.demo.assets.shipped_model)",
              "model_parameters": sum(p.numel() for p in load_causal_lm(str(theta0)).parameters()),
              "pool_prompts": len(pool), "validation_prompts": len(val), "k_offline": K_OFFLINE,
              "k_validation_offline": K_VAL, "k_reference": K_REF, "temperature": TEMPERATURE,
              "trainer": "lean GRPO, whole pool, defaults", "refresh_below": REFRESH_BELOW,
              "refresh_budget": REFRESH_BUDGET, "checkpoints": rows,
              "status_above": STATUS_ABOVE,
              "goal": goal(far),
              "seconds": time.perf_counter() - t0, "environment": environment()}
    name = "offpolicy" if seed == 0 else f"offpolicy_seed{seed}"
    write_json(out, f"{name}.json", report)
    plot(report, out / f"{name}.png")
    return report


def goal(far: dict) -> dict:
    """Top-10% overlap >= 0.5 at the farthest checkpoint with at most the budget refreshed: by ESS
    (the original refresh), or by status under CROPI's or the theta estimator."""
    st = far["status_refresh"]
    within = lambda f: f <= REFRESH_BUDGET + 1e-12  # noqa: E731
    by = {"ess_refresh": (far["overlap_at_10_refresh"], far["refresh_fraction"]),
          "status_refresh_popi": (st["popi"]["overlap_at_10"], st["refresh_fraction"]),
          "status_refresh_theta": (st["theta"]["overlap_at_10"], st["refresh_fraction"])}
    met = [k for k, (o, f) in by.items() if o >= 0.5 and within(f)]
    return {"overlap_at_10_refresh_farthest": 0.5, "refresh_fraction_max": REFRESH_BUDGET,
            "farthest": {k: o for k, (o, _) in by.items()}, "met_by": met, "met": bool(met)}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["checkpoints"]
    steps = [r["steps"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    ax = axes[0]
    ax.plot(steps, [r["overlap_at_10"] for r in rows], "o-", label="POPI (reused theta_0 trajectories)")
    ax.plot(steps, [r["overlap_at_10_refresh"] for r in rows], "s-",
            label=f"refresh ESS/K < {report['refresh_below']} (<= {report['refresh_budget']:.0%} of pool)")
    ax.plot(steps, [r["overlap_at_10_random_refresh"] for r in rows], "x--", label="refresh as many, at random")
    ax.plot(steps, [r["variants"]["ppo_clip"]["overlap_at_10"] for r in rows], "^:", label="PPO clip 0.2")
    ax.plot(steps, [r["variants"]["truncated_is"]["overlap_at_10"] for r in rows], "v:",
            label=f"sequence TIS cap {TIS_CAP}")
    ax.plot(steps, [r["variants"]["theta"]["overlap_at_10"] for r in rows], "D-", label="theta estimator (no refresh)")
    ax.plot(steps, [r["status_refresh"]["popi"]["overlap_at_10"] for r in rows], "P-", lw=2,
            label=f"refresh by status (<= {report['refresh_budget']:.0%}), CROPI estimator")
    ax.plot(steps, [r["status_refresh"]["theta"]["overlap_at_10"] for r in rows], "*-",
            label="refresh by status, theta estimator")
    ax.plot(steps, [r["status_refresh"]["popi"]["random"]["overlap_at_10"] for r in rows], "P--", alpha=0.6,
            label="random refresh of as many, CROPI estimator")
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("GRPO steps from theta_0")
    ax.set_ylabel(f"top-10% overlap with fresh K={report['k_reference']} ranking")
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(steps, [r["spearman"] for r in rows], "o-", label="Spearman (POPI vs fresh)")
    ax.plot(steps, [r["ess_fraction"]["median"] for r in rows], "s-", label="median ESS/K of reused trajectories")
    ax.plot(steps, [r["refresh_fraction"] for r in rows], "x--", label="fraction refreshed (ESS)")
    ax.plot(steps, [r["status_refresh"]["refresh_fraction"] for r in rows], "P--", label="fraction refreshed (status)")
    ax.plot(steps, [r["variants"]["theta"]["spearman"] for r in rows], "D-", label="Spearman (theta vs fresh)")
    ax.plot(steps, [r["status_refresh"]["popi"]["spearman"] for r in rows], "P-",
            label="Spearman (status refresh, CROPI est.)")
    ax.set_xlabel("GRPO steps from theta_0")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompts and checkpoints")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workdir", type=Path, default=None, help="checkpoints and subsets (default: OUT/work)")
    ap.add_argument("--seed", type=int, default=0, help="0: the committed run (offpolicy.json); s > 0 draws "
                    "everything afresh into offpolicy_seed<s>.json")
    a = ap.parse_args(argv)
    report = run(a.quick, a.out, a.workdir or a.out / f"work{a.seed or ''}", a.seed)
    far = report["checkpoints"][-1]
    print(f"farthest checkpoint (step {far['steps']}): overlap@10% {far['overlap_at_10']:.3f}, with ESS refresh of "
          f"{far['refresh_fraction']:.0%} {far['overlap_at_10_refresh']:.3f}; goal met by {report['goal']['met_by']}; "
          f"wrote it into {a.out}")


if __name__ == "__main__":
    main()
