"""The demo's report: report.json (every number), report.md (the readable summary), plots.

report.json keys:

- ``settings``, ``task`` (split sizes), ``initial_model`` (theta_0's test accuracy)
- ``accuracy_by_step``: method -> seed -> {step: test accuracy}
- ``curves``: method -> steps, mean, std, min, max across seeds
- ``final_by_skill``: method -> skill -> mean final accuracy across seeds
- ``step_acceleration``: per seed (value, target, full_steps, cropi_steps, reason) and the
  mean / std / min / max over the seeds where it is defined
- ``selection``: method -> stage -> mean share of each skill and level in the stage subset,
  and the pool's own shares
- ``cropi_scores``: seed -> stage -> cosine statistics of the ranking behind the selection
- ``timing_s`` (wall seconds per phase), ``cpu_s`` (CPU seconds of the run, workers included),
  ``plots`` (file names)
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from cropi.data import load_prompts
from cropi.demo.acceleration import aggregate, step_acceleration
from cropi.demo.settings import DemoSettings


def write_outputs(out: Path, settings: DemoSettings, data: dict, step0: dict, runs: list[dict],
                  timing: dict, cpu_s: float) -> dict:
    """Build the report from the finished runs; write report.json, report.md and the PNGs."""
    from cropi.demo import plots

    report = build_report(settings, data, step0, runs, timing)
    report["cpu_s"] = cpu_s
    report["plots"] = plots.draw_all(out, report, score_tables(runs))
    (out / "report.json").write_text(json.dumps(_clean(report), indent=1, sort_keys=True) + "\n")
    (out / "report.md").write_text(markdown(report))
    return report


def build_report(settings: DemoSettings, data: dict, step0: dict, runs: list[dict], timing: dict) -> dict:
    by_step = accuracy_by_step(step0, runs)
    return {
        "settings": settings.model_dump(mode="json"),
        "task": {name: len(load_prompts(path)) for name, path in data.items()},
        "initial_model": {"test_accuracy": step0["accuracy"], "by_skill": step0["by_skill"]},
        "accuracy_by_step": by_step,
        "curves": curves(by_step),
        "final_by_skill": final_by_skill(runs),
        "step_acceleration": acceleration(by_step),
        "selection": selection_mix(runs, data["pool"]),
        "cropi_scores": cropi_score_stats(runs),
        "timing_s": dict(timing, total=round(sum(timing.values()), 2)),
    }


def accuracy_by_step(step0: dict, runs: list[dict]) -> dict:
    """method -> seed -> {step: accuracy}, step 0 being theta_0 for every run."""
    out: dict = defaultdict(dict)
    for run in sorted(runs, key=lambda r: (r["method"], r["seed"])):
        acc = {"0": step0["accuracy"]}
        acc |= {str(e["step"]): e["accuracy"] for e in run["evals"]}
        out[run["method"]][str(run["seed"])] = acc
    return dict(out)


def curves(by_step: dict) -> dict:
    """Per method, across seeds: mean, sample std, min and max at each evaluated step."""
    out = {}
    for method, seeds in by_step.items():
        steps = sorted({int(s) for acc in seeds.values() for s in acc})
        rows = np.array([[acc[str(s)] for s in steps] for acc in seeds.values()])
        std = rows.std(axis=0, ddof=1) if len(rows) > 1 else np.full(len(steps), np.nan)
        out[method] = {"steps": steps, "mean": rows.mean(axis=0).tolist(), "std": std.tolist(),
                       "min": rows.min(axis=0).tolist(), "max": rows.max(axis=0).tolist(), "seeds": len(rows)}
    return out


def acceleration(by_step: dict) -> dict:
    """Step acceleration of CROPI over full-pool training, seed by seed, then aggregated."""
    per_seed = {}
    for seed, full in by_step.get("full", {}).items():
        cropi = by_step.get("cropi", {}).get(seed)
        if cropi is None:
            continue
        steps = sorted(int(s) for s in full)
        per_seed[seed] = step_acceleration(steps, [full[str(s)] for s in steps], [cropi[str(s)] for s in steps])
    return {"per_seed": per_seed, **aggregate(per_seed),
            "definition": "steps full-pool training needs to reach its final test accuracy / steps CROPI needs "
                          "to reach the same, both read at the evaluated steps (stage ends)"}


def final_by_skill(runs: list[dict]) -> dict:
    out: dict = {}
    for method in sorted({r["method"] for r in runs}):
        finals = [r["evals"][-1]["by_skill"] for r in runs if r["method"] == method]
        skills = sorted({k for f in finals for k in f})
        out[method] = {k: float(np.mean([f[k] for f in finals if k in f])) for k in skills}
    return out


def selection_mix(runs: list[dict], pool_path: str) -> dict:
    """Skill and level shares of every stage subset (mean over seeds), and of the pool."""
    out: dict = {"pool": _shares(load_prompts(pool_path))}
    for method in sorted({r["method"] for r in runs}):
        stages: dict = defaultdict(list)
        for run in (r for r in runs if r["method"] == method):
            for stage in run["stages"]:
                stages[stage["index"]].append(_shares(load_prompts(stage["subset"])))
        out[method] = {str(m): _mean_shares(shares) for m, shares in sorted(stages.items())}
    return out


def _shares(records) -> dict:
    skills = Counter(r.extra_info.get("skill") for r in records)
    levels = Counter(str(r.extra_info.get("level")) for r in records)
    n = len(records)
    return {"n": n, "skills": {k: v / n for k, v in sorted(skills.items())},
            "levels": {k: v / n for k, v in sorted(levels.items())}}


def _mean_shares(shares: list[dict]) -> dict:
    def mean(kind: str) -> dict:
        keys = sorted({k for s in shares for k in s[kind]})
        return {k: float(np.mean([s[kind].get(k, 0.0) for s in shares])) for k in keys}

    return {"n": float(np.mean([s["n"] for s in shares])), "skills": mean("skills"), "levels": mean("levels")}


def score_tables(runs: list[dict]) -> dict:
    """seed -> stage -> the CROPI stage ranking table (as numpy columns)."""
    out: dict = defaultdict(dict)
    for run in (r for r in runs if r["method"] == "cropi"):
        for stage in run["stages"]:
            t = pq.read_table(stage["ranking"])
            out[str(run["seed"])][stage["index"]] = {c: t[c].to_numpy(zero_copy_only=False) for c in t.column_names}
    return dict(out)


def cropi_score_stats(runs: list[dict]) -> dict:
    """Per seed and stage: prompts scored, excluded by status, and cosine statistics per validation set."""
    out: dict = {}
    for seed, stages in score_tables(runs).items():
        out[seed] = {}
        for m, t in sorted(stages.items()):
            ok = t["status"] == "ok"
            sel = t["selected"].astype(bool)
            row = {"scored": int(ok.sum()), "excluded": dict(Counter(t["status"][~ok].tolist())),
                   "selected": int(sel.sum())}
            for col in (c for c in t if c.startswith("score:")):
                v = t[col].astype(float)
                row[col[6:]] = {"mean": _nanmean(v[ok]), "positive_share": float(np.mean(v[ok] > 0)) if ok.any() else None,
                                "selected_mean": _nanmean(v[sel])}
            out[seed][str(m)] = row
    return out


def _nanmean(v: np.ndarray) -> float | None:
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else None


def _clean(obj):
    """Strict JSON: NaN and inf become null."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, np.generic):
        return _clean(obj.item())
    return obj


# ---------------------------------------------------------------- markdown


def markdown(report: dict) -> str:
    s = report["settings"]
    acc = report["step_acceleration"]
    lines = ["# cropi demo: CROPI against full-pool, random and pass-rate selection", "",
             f"Tiny Qwen2-architecture model (warm-started on the task), synthetic arithmetic task "
             f"({_sizes(report['task'])}), {s['stages']} stages x {s['steps_per_stage']} GRPO steps (trl, "
             f"{s['batch_prompts']} prompts x {s['rollouts']} rollouts a step, lr {s['lr']}), "
             f"{s['seeds']} seeds, selection fraction {s['select_fraction']}.", "",
             "## Step acceleration", "", _acceleration_text(acc), "",
             "| seed | value | target acc | full steps | CROPI steps | note |", "|---|---|---|---|---|---|"]
    for seed, r in sorted(acc["per_seed"].items()):
        lines.append(f"| {seed} | {_num(r['value'], 2)} | {r['target']:.3f} | {r['full_steps']} | "
                     f"{r['cropi_steps'] if r['cropi_steps'] is not None else '-'} | {r['reason'] or ''} |")
    lines += ["", "## Test accuracy by training step (mean ± std over seeds)", ""]
    steps = next(iter(report["curves"].values()))["steps"]
    lines += ["| method | " + " | ".join(str(x) for x in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for method, c in report["curves"].items():
        cells = [f"{m:.3f} ± {_num(sd, 3)}" for m, sd in zip(c["mean"], c["std"])]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "Final accuracy by skill (mean over seeds):", ""]
    skills = sorted({k for v in report["final_by_skill"].values() for k in v})
    lines += ["| method | " + " | ".join(skills) + " |", "|---" * (len(skills) + 1) + "|"]
    lines.append("| theta_0 | " + " | ".join(f"{report['initial_model']['by_skill'].get(k, 0):.3f}" for k in skills) + " |")
    for method, v in report["final_by_skill"].items():
        lines.append(f"| {method} | " + " | ".join(f"{v.get(k, 0):.3f}" for k in skills) + " |")
    lines += ["", "## What each stage selected (skill shares, mean over seeds)", ""] + _selection_table(report["selection"])
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in report["plots"]]
    lines += ["", "## Notes", "",
              "- Offline trajectories come from theta_0 and are collected once; every method and seed reuses them "
              "(CROPI's setting). CROPI's first-stage gradients are computed once and shared by its seeds.",
              "- Accuracy is greedy decoding on the held-out test split, read at step 0 and at every stage end; "
              "step counts in the acceleration are those evaluated steps.",
              "- The task was not tuned to the method; whatever the numbers say is the result of this setting.", "",
              "Wall time per phase (s): " + ", ".join(f"{k} {v:.0f}" for k, v in report["timing_s"].items())
              + f"; CPU time of the whole run: {report['cpu_s']:.0f} s.", ""]
    return "\n".join(lines)


def _acceleration_text(acc: dict) -> str:
    if acc["mean"] is None:
        return "Undefined on every seed: " + "; ".join(f"seed {s}: {r}" for s, r in acc["undefined"].items())
    text = (f"**{acc['mean']:.2f}x** (mean over {acc['n']} seed(s); std {_num(acc['std'], 2)}, "
            f"range {acc['min']:.2f} to {acc['max']:.2f}). CROPI reports 2.66x on Qwen2.5-1.5B.")
    if acc["undefined"]:
        text += " Undefined on " + "; ".join(f"seed {s}: {r}" for s, r in acc["undefined"].items())
    return text


def _selection_table(selection: dict) -> list[str]:
    skills = sorted(selection["pool"]["skills"])
    lines = ["| method | stage | n | " + " | ".join(skills) + " |", "|---" * (len(skills) + 3) + "|"]
    lines.append("| pool | - | " + f"{selection['pool']['n']} | " +
                 " | ".join(f"{selection['pool']['skills'].get(k, 0):.2f}" for k in skills) + " |")
    for method, stages in selection.items():
        if method == "pool":
            continue
        for m, mix in stages.items():
            lines.append(f"| {method} | {m} | {mix['n']:.0f} | " +
                         " | ".join(f"{mix['skills'].get(k, 0):.2f}" for k in skills) + " |")
    return lines


def _sizes(task: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in task.items())


def _num(x, digits: int) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"
