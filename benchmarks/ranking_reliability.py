"""How reliable theta_0's influence ranking is, by split halves of each validation set, beside where the default
lost to the controls (exploratory: it decides nothing).

A validation set's target is the mean projected gradient of its ``ok`` prompts (cropi.scoring.influence). Split
those prompts at random into two halves, score the pool's ``ok`` prompts by cosine to each half's mean, and the two
orders agree as much as the set's prompts agree about what helps: Spearman's rho between them, and the share of
one half's top ``fraction`` that is also the other's (a random pair shares ``fraction`` of the ``ok`` prompts:
``random_top_overlap``). ``spearman_brown`` (2 rho / (1 + rho)) is the whole set's reliability from the halves'.
Read from the stores of a demo run (``--work TASK=DIR``: a `cropi demo` folder; theta_0's gradients, and the
validation sets a curriculum of it, ``--curriculum``, names), beside each task's AUC of ``checked`` less ``informative`` and less the better of
``cropi`` and ``diverse`` from a held-out regret file (``--regret``; ``benchmarks/heldout_regret.py``).

    python benchmarks/ranking_reliability.py --work lists=DIR/lists ... --regret REGRET.json --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_json  # noqa: E402


def split_halves(pool: np.ndarray, targets: np.ndarray, *, splits: int, fraction: float, rng) -> dict:
    """``pool``: the pool's ok rows; ``targets``: a validation set's ok rows. Mean over ``splits`` random halves,
    each scored as the ranking scores the pool (``cosine_scores`` to the half's mean gradient)."""
    from cropi.scoring.influence import cosine_scores

    ok = ["ok"] * len(pool)
    k = max(1, round(fraction * len(pool)))
    rhos, shared = [], []
    for _ in range(splits):
        order = rng.permutation(len(targets))
        a, b = (cosine_scores(pool, ok, targets[half].mean(0)) for half in np.array_split(order, [len(order) // 2]))
        rhos.append(spearmanr(a, b)[0])
        shared.append(len(set(np.argsort(-a)[:k]) & set(np.argsort(-b)[:k])) / k)
    rho = float(np.mean(rhos))
    return {"ok_prompts": int(len(targets)), "split_half_spearman": rho, "spearman_brown": 2 * rho / (1 + rho),
            "top_overlap": float(np.mean(shared)), "random_top_overlap": k / len(pool)}


def task_reliability(work: Path, curriculum: str, splits: int, fraction: float, seed: int) -> dict:
    from cropi.store import GradientStore

    from cropi.utils.fingerprint import model_fingerprint

    # theta_0's gradients: the store's one checkpoint named by theta_0's fingerprint (every ranking method scores it
    # at stage 0); the curriculum's config (any method's) names the validation sets
    state = json.loads((work / "runs" / "curricula" / curriculum / "state.json").read_text())
    store = GradientStore(str(work / "runs" / "store"))
    theta0 = model_fingerprint(work / "models" / "theta0")
    (name, spec), = {(s["checkpoint"], s["spec_id"]) for s in store.list_splits() if s["checkpoint"].startswith(theta0)}
    pool = store.open_split(name, spec, "pool").read()
    rows = np.asarray(pool.vectors, dtype=np.float64)[[s == "ok" for s in pool.columns["status"]]]
    config = state["config"]
    rng = np.random.default_rng(seed)
    sets = {}
    for v in sorted(config["validation"]):
        t = store.open_split(name, spec, v).read()
        ok = np.asarray(t.vectors, dtype=np.float64)[[s == "ok" for s in t.columns["status"]]]
        sets[v] = split_halves(rows, ok, splits=splits, fraction=fraction, rng=rng) if len(ok) >= 4 else None
    known = [s["spearman_brown"] for s in sets.values() if s]
    return {"pool_ok_prompts": int(len(rows)), "sets": sets, "min_spearman_brown": min(known) if known else None,
            "mean_spearman_brown": float(np.mean(known)) if known else None}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", action="append", required=True, help="task=a `cropi demo` folder")
    ap.add_argument("--regret", type=Path, required=True, help="a heldout_regret.json with these tasks")
    ap.add_argument("--curriculum", default="full-seed0")
    ap.add_argument("--splits", type=int, default=50)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    regret = json.loads(a.regret.read_text())["tasks"]
    tasks = {}
    for item in a.work:
        task, path = item.split("=", 1)
        auc = regret[task]["auc"]
        tasks[task] = task_reliability(Path(path), a.curriculum, a.splits, a.fraction, a.seed) | {
            "checked_less_informative": auc["checked"] - auc["informative"],
            "checked_less_better_rule": auc["checked"] - max(auc["cropi"], auc["diverse"]),
            "cropi_less_informative": auc["cropi"] - auc["informative"]}
    names = [t for t in tasks if tasks[t]["min_spearman_brown"] is not None]

    def rho(key: str, by: str) -> float:
        return float(spearmanr([tasks[t][by] for t in names], [tasks[t][key] for t in names])[0])

    result = {"command": "python benchmarks/ranking_reliability.py --work TASK=DIR ... --regret REGRET.json "
                         f"--curriculum {a.curriculum} --splits {a.splits} --fraction {a.fraction}",
              "regret": a.regret.name, "tasks": tasks,
              "across_tasks_spearman": {f"{key} ~ {by}": rho(key, by)
                                        for key in ("checked_less_informative", "cropi_less_informative",
                                                    "checked_less_better_rule")
                                        for by in ("min_spearman_brown", "mean_spearman_brown")}}
    write_json(a.out, "ranking_reliability.json", result)
    for t in names:
        r = tasks[t]
        print(f"{t:10s} min SB {r['min_spearman_brown']:+.2f}  checked - informative {r['checked_less_informative']:+.3f}"
              f"  cropi - informative {r['cropi_less_informative']:+.3f}")
    print(json.dumps(result["across_tasks_spearman"], indent=1))
    return result


if __name__ == "__main__":
    main()
