"""One method's AUC in two reports of the same tasks and seeds, paired seed by seed: is the new one worse beyond
the seeds' noise? Issue 32's no-harm rule for a check revision (docs/demo.md, round 8).

    python benchmarks/paired_auc.py --new lists=NEW/report.json --old lists=OLD/report.json \\
        [--new skills=... --old skills=...] [--method checked] --out benchmarks/results/demo/.../paired.json

Per task ``t`` and seed ``s``: ``d = AUC_new - AUC_old``. ``D`` is the mean over tasks of each task's mean over its
seeds; ``SE(D)^2 = (1/T^2) sum_t var_s(d_t) / n_t`` (the unbiased variance of the task's per-seed differences).
The new revision passes when ``D >= -2 SE(D)``. Where every difference is zero (a revision that changed no run),
``SE(D)`` is 0 and ``D`` passes.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def paired(new: dict[str, dict], old: dict[str, dict], method: str = "checked") -> dict:
    """``new`` and ``old``: task -> report; the per-seed differences, ``D``, ``SE(D)`` and the verdict."""
    if sorted(new) != sorted(old):
        raise SystemExit(f"the two sides name different tasks: {sorted(new)} against {sorted(old)}")
    per_task, means, variances = {}, [], []
    for task in sorted(new):
        a, b = new[task]["auc_by_method"][method]["per_seed"], old[task]["auc_by_method"][method]["per_seed"]
        if sorted(a) != sorted(b):
            raise SystemExit(f"{task}: the two reports have different seeds ({sorted(a)} against {sorted(b)})")
        d = [a[s] - b[s] for s in sorted(a, key=int)]
        mean = sum(d) / len(d)
        var = sum((x - mean) ** 2 for x in d) / (len(d) - 1) if len(d) > 1 else float("nan")
        per_task[task] = {"differences": d, "mean": mean, "variance": var, "new": a, "old": b}
        means.append(mean)
        variances.append(var / len(d))
    tasks = len(means)
    big_d = sum(means) / tasks
    se = math.sqrt(sum(variances)) / tasks
    return {"method": method, "tasks": per_task, "D": big_d, "SE": se, "bar": -2 * se,
            "passes": bool(big_d >= -2 * se - 1e-12),
            "rule": "D (mean over tasks of the mean per-seed AUC difference) >= -2 SE(D)"}


def _reports(items: list[str]) -> dict[str, dict]:
    out = {}
    for item in items:
        task, _, path = item.partition("=")
        out[task] = json.loads(Path(path).read_text())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new", action="append", required=True, help="task=path/to/report.json of the new revision")
    p.add_argument("--old", action="append", required=True, help="task=path/to/report.json of the old revision")
    p.add_argument("--method", default="checked")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    result = paired(_reports(a.new), _reports(a.old), a.method)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: result[k] for k in ("D", "SE", "bar", "passes")}, indent=1))


if __name__ == "__main__":
    main()
