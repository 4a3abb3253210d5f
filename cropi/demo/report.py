"""The demo's report: report.json (every number), report.md (the readable summary), plots.

The headline metric is the **target accuracy**: the mean over the targeted test splits
of the sampled accuracy mean@k (temperature 1), read by the trainer every few steps;
greedy accuracy is reported beside it. report.json keys:

- ``settings``, ``task`` (split sizes)
- ``accuracy_by_step``: method -> seed -> {step: {"sampled", "greedy", "splits": {split: eval}}}
- ``curves``: metric ("sampled", "greedy") -> method -> steps, mean, std, min, max across seeds
- ``task``: the task's name and split sizes
- ``full_gain``: full-pool's final minus step-0 sampled target accuracy: mean, std, per seed
- ``step_acceleration``: CROPI over full pool at 90% of full's gain, per seed (value, target, full_x,
  method_x, censored, reason), with mean / std / min / max; ``acceleration_by_method`` the same for
  every method; ``acceleration_at_share``: share ("0.5", "0.75", "0.9") -> method -> the same
- ``wallclock_acceleration_by_method``: the 90% figure in seconds, each method's own scoring counted
  (collection, gradients, ranking at every stage) and its checks; ``cost_s``: method -> seed -> stage ->
  {scoring, checks, training} seconds, ``cost_shares`` their shares; ``checks``: method -> seed -> stage -> every
  check and decision of a checked stage, ``check_cases`` the cases per stage; ``auc_by_method``: mean target
  accuracy over the run (area under the curve / steps)
- ``final``: method -> mean final accuracy per test split (sampled and greedy)
- ``selection``: method -> stage -> mean share of each skill and level in the stage subset,
  and the pool's own shares
- ``cropi_scores``: seed -> stage -> cosine statistics of the ranking behind the selection
- ``cropi_ess``: seed -> stage -> ESS/K quantiles of the pool's reused trajectories at that stage
- ``trainer``: mean seconds per step (sampling, update) and per evaluation
- ``by_train_seconds``: method -> seed -> [training seconds, sampled accuracy] at every evaluation
- ``online_filter``: online-filter methods -> filtered fraction per step, filter cost, early stops
- ``default_selector``: the product's default method (``checked``: cropi.demo.settings.DEFAULT_METHOD, when run);
  ``versus_informative``: method -> whether it beats the informative control on AUC and at 75% and 90%
  (the decision rule of docs/demo.md, per task); ``wallclock_acceleration_at_share``: the wall-clock
  figure at every share
- ``diagnostics``: method -> seed -> stage -> saturation and interference figures (cropi.demo.diagnostics)
- ``timing_s`` (wall seconds per phase), ``cpu_s`` (CPU seconds, workers included; both summed over every
  invocation on the folder, so a resumed demo counts what its first run spent),
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
from cropi.demo.acceleration import HEADLINE, SHARES, acceleration, aggregate, area_under_curve
from cropi.demo.diagnostics import stage_diagnostics
from cropi.demo import checks
from cropi.demo.settings import DEFAULT_METHOD, DemoSettings
from cropi.pipeline.rank import pool_labels
from cropi.scoring.diagnostics import selection_mix
from cropi.selection import DEFAULT_SELECTOR, RANKING_SELECTORS, get_selector
from cropi.tasks.base import Task

METRICS = ("sampled", "greedy")


def write_outputs(out: Path, settings: DemoSettings, task: Task, data: dict, runs: list[dict], timing: dict,
                  cpu_s: float) -> dict:
    """Build the report from the finished runs; write report.json, report.md and the PNGs."""
    from cropi.demo import plots

    report = build_report(settings, task, data, runs, timing)
    report["cpu_s"] = cpu_s
    ess = {str(r["seed"]): r.get("pool_ess", {}) for r in runs if r["method"] == "cropi"}
    report["plots"] = plots.draw_all(out, report, score_tables(runs), ess)
    (out / "report.json").write_text(json.dumps(_clean(report), indent=1, sort_keys=True) + "\n")
    (out / "report.md").write_text(markdown(report))
    return report


def build_report(settings: DemoSettings, task: Task, data: dict, runs: list[dict], timing: dict) -> dict:
    by_step = checks.on_grid(accuracy_by_step(runs, settings.eval_samples), checks.checked_methods(runs))
    methods = [m for m in sorted(by_step) if m != "full"]
    at_share = {str(q): {m: step_acceleration(by_step, m, q) for m in methods} for q in SHARES}
    scoring = scoring_cost(runs, timing, settings)
    cost = checks.cost_split(runs, scoring)
    by_seconds = accuracy_by_train_seconds(runs, settings.eval_samples, checks.with_checks(scoring, cost))
    records = checks.check_records(runs)
    by_method = at_share[str(HEADLINE)]
    wallclock = {str(q): {m: wallclock_acceleration(by_seconds, m, q) for m in methods} for q in SHARES}
    aucs = {m: auc(by_step, m) for m in sorted(by_step)}
    return {
        "settings": settings.model_dump(mode="json"),
        "task": {"name": task.name, "description": task.description, "targets": dict(task.targets),
                 "splits": {name: len(load_prompts(path)) for name, path in data.items()}},
        "accuracy_by_step": by_step,
        "curves": {metric: curves(by_step, metric) for metric in METRICS},
        "full_gain": full_gain(by_step),
        "step_acceleration": by_method.get("cropi"),
        "acceleration_by_method": by_method,
        "acceleration_at_share": at_share,
        "wallclock_acceleration_by_method": wallclock[str(HEADLINE)],
        "wallclock_acceleration_at_share": wallclock,
        "auc_by_method": aucs,
        "default_selector": DEFAULT_METHOD if DEFAULT_METHOD in settings.methods else DEFAULT_SELECTOR,
        "versus_informative": versus_informative(at_share, aucs),
        "diagnostics": stage_diagnostics(runs, task, data["pool"], settings.batch_prompts, settings.eval_samples),
        "cost_s": cost,
        "cost_shares": checks.cost_shares(cost),
        "checks": records,
        "check_cases": checks.stage_cases(records),
        "final": final_accuracy(by_step),
        "selection": stage_mix(runs, data["pool"]),
        "selection_warnings": selection_warnings(runs),
        "cropi_scores": cropi_score_stats(runs),
        "cropi_ess": ess_stats(runs),
        "trainer": trainer_timing(runs),
        "by_train_seconds": by_seconds,
        "online_filter": filter_stats(runs),
        "timing_s": dict(timing, total=round(sum(timing.values()), 2)),
    }


def accuracy_by_step(runs: list[dict], k: int) -> dict:
    """method -> seed -> {step: {"sampled", "greedy", "splits"}}; targets averaged over the test splits."""
    out: dict = defaultdict(dict)
    for run in sorted(runs, key=lambda r: (r["method"], r["seed"])):
        acc = {}
        for row in run["evals"]:
            splits = row["eval"]
            acc[str(row["step"])] = {
                "sampled": float(np.mean([e[f"mean@{k}"] for e in splits.values()])),
                "greedy": float(np.mean([e["greedy"] for e in splits.values()])),
                "splits": {name: {key: v for key, v in e.items() if key != "by_group"} for name, e in splits.items()}}
        out[run["method"]][str(run["seed"])] = acc
    return dict(out)


def _series(acc: dict, metric: str) -> tuple[list[int], list[float]]:
    steps = sorted(int(s) for s in acc)
    return steps, [acc[str(s)][metric] for s in steps]


def curves(by_step: dict, metric: str) -> dict:
    """Per method, across seeds: mean, sample std, min and max at each evaluated step."""
    out = {}
    for method, seeds in by_step.items():
        steps = sorted(set.intersection(*({int(s) for s in acc} for acc in seeds.values())))
        rows = np.array([[acc[str(s)][metric] for s in steps] for acc in seeds.values()])
        std = rows.std(axis=0, ddof=1) if len(rows) > 1 else np.full(len(steps), np.nan)
        out[method] = {"steps": steps, "mean": rows.mean(axis=0).tolist(), "std": std.tolist(),
                       "min": rows.min(axis=0).tolist(), "max": rows.max(axis=0).tolist(), "seeds": len(rows)}
    return out


def full_gain(by_step: dict) -> dict:
    """What full-pool training adds to the sampled target accuracy: final (mean of the last 3
    evaluations, as the acceleration's target) minus step 0, per seed."""
    per_seed = {}
    for seed, acc in by_step.get("full", {}).items():
        _, values = _series(acc, "sampled")
        per_seed[seed] = float(np.mean(values[-3:]) - values[0])
    values = list(per_seed.values())
    return {"mean": float(np.mean(values)) if values else None,
            "std": float(np.std(values, ddof=1)) if len(values) > 1 else None, "per_seed": per_seed}


def step_acceleration(by_step: dict, method: str, share: float = HEADLINE) -> dict:
    """Acceleration of ``method`` over full-pool training in steps at ``share`` of full's gain, seed by seed."""
    per_seed = {}
    for seed, full in by_step.get("full", {}).items():
        other = by_step.get(method, {}).get(seed)
        if other is not None:
            fx, fy = _series(full, "sampled")
            x, y = _series(other, "sampled")
            per_seed[seed] = acceleration(fx, fy, x, y, share)
    return {"per_seed": per_seed, **aggregate(per_seed),
            "definition": f"steps full-pool training needs to reach {share:.0%} of its own gain in sampled target "
                          f"accuracy (final = mean of its last 3 evaluations) / steps {method} needs to reach the "
                          "same accuracy; censored: never reached, the value is an upper bound"}


def versus_informative(at_share: dict, aucs: dict) -> dict:
    """method -> which of the decision rule's comparisons with the informative control it wins (means over
    seeds): AUC, and the step acceleration at 75% and at 90% of full-pool training's gain."""
    if "informative" not in aucs:
        return {}
    out = {}
    for method in aucs:
        if method == "informative":
            continue
        wins = {"auc": _above(aucs[method]["mean"], aucs["informative"]["mean"])}
        for q in ("0.75", "0.9"):
            mine, theirs = at_share[q].get(method, {}).get("mean"), at_share[q]["informative"].get("mean")
            wins[f"steps@{q}"] = _above(1.0 if method == "full" else mine, theirs)
        out[method] = {**wins, "all": all(wins.values())}
    return out


def _above(a, b) -> bool:
    return a is not None and b is not None and a > b


def wallclock_acceleration(by_seconds: dict, method: str, share: float = HEADLINE) -> dict:
    """The same ratio in seconds: training steps' own time plus the method's scoring (``scoring_cost``)."""
    per_seed = {}
    for seed, full in by_seconds.get("full", {}).items():
        other = by_seconds.get(method, {}).get(seed)
        if other is not None:
            per_seed[seed] = acceleration([p[0] for p in full], [p[1] for p in full],
                                          [p[0] for p in other], [p[1] for p in other], share)
    return {"per_seed": per_seed, **aggregate(per_seed),
            "definition": f"seconds full-pool training needs to reach {share:.0%} of its gain / seconds {method} "
                          "needs, each counting its training steps and its own scoring (collection, gradients, "
                          "ranking at every stage; evaluations excluded)"}


def auc(by_step: dict, method: str) -> dict:
    """Mean sampled target accuracy over the run (area under the curve / steps), per seed and aggregated."""
    per_seed = {seed: {"value": area_under_curve(*_series(acc, "sampled"))} for seed, acc in by_step[method].items()}
    return {"per_seed": {s: r["value"] for s, r in per_seed.items()}, **aggregate(per_seed)}


def scoring_cost(runs: list[dict], timing: dict, settings: DemoSettings) -> dict:
    """method -> seed -> {stage: seconds} spent choosing that stage's subset, in one process's seconds.

    A stage's own scoring (gradients and ranking at theta_m) is timed by the curriculum. The
    demo's shared phases ran once, on ``workers`` processes, for every seed: the offline
    collection is charged (wall x workers) to every method that reads the trajectories
    (cropi, pass_rate, informative), the validation sets' share only to CROPI; the first
    stage's gradients to CROPI.
    """
    shared = {"collect": timing.get("collect", 0.0) * settings.workers, "score": timing.get("score", 0.0) * settings.workers}
    responses = {"pool": settings.pool_size * settings.pool_samples,
                 "validation": len(settings.load_task().targets) * settings.val_size * settings.validation_samples}
    pool_share = responses["pool"] / sum(responses.values())
    out: dict = defaultdict(dict)
    for run in runs:
        stages = {str(st["index"]): float(st.get("score_s") or 0.0) for st in run["stages"]}
        if run["selection"] in RANKING_SELECTORS:
            stages["0"] = stages.get("0", 0.0) + shared["collect"] + shared["score"]
        elif "pass_rates" in get_selector(run["selection"]).needs:
            stages["0"] = stages.get("0", 0.0) + shared["collect"] * pool_share
        out[run["method"]][str(run["seed"])] = stages
    return dict(out)


def final_accuracy(by_step: dict) -> dict:
    """method -> test split -> {sampled, greedy}: the last evaluation, mean over seeds."""
    out: dict = {}
    for method, seeds in by_step.items():
        finals = [acc[str(max(int(s) for s in acc))]["splits"] for acc in seeds.values()]
        out[method] = {split: {key: float(np.mean([f[split][key] for f in finals]))
                               for key in finals[0][split] if key != "n"} for split in finals[0]}
    return out


def accuracy_by_train_seconds(runs: list[dict], k: int, cost: dict | None = None) -> dict:
    """method -> seed -> [[seconds, sampled target accuracy]] at every evaluation. Seconds sum the
    steps' own time (sampling, the online filter, the update) up to the evaluated (global) step and,
    with ``cost`` (``scoring_cost``), the scoring of every stage begun by then, counted at the stage's
    first step; evaluations are left out (``run_s`` has them). The first point is at 0 s (step 0 is
    evaluated before any scoring counts)."""
    out: dict = defaultdict(dict)
    for run in runs:
        steps = sorted((r["step"], r["step_s"]) for r in run["steps"] if "step_s" in r)
        seconds = np.cumsum([0.0] + [t for _, t in steps])
        numbers = [n for n, _ in steps]
        per_stage = (cost or {}).get(run["method"], {}).get(str(run["seed"]), {})
        starts = sorted((_stage_start(run, int(m)), s) for m, s in per_stage.items())
        points = []
        for row in sorted(run["evals"], key=lambda r: r["step"]):
            spent = sum(s for first, s in starts if first < row["step"]) if row["step"] > 0 else 0.0
            points.append([round(float(seconds[np.searchsorted(numbers, row["step"], side="right")]) + spent, 3),
                           float(np.mean([e[f"mean@{k}"] for e in row["eval"].values()]))])
        out[run["method"]][str(run["seed"])] = points
    return dict(out)


def _stage_start(run: dict, m: int) -> int:
    """The global step before stage ``m``'s first step (its scoring happens there)."""
    done = [st["global_step"] - st["steps_done"] for st in run["stages"] if st["index"] == m and st["global_step"]]
    return done[0] if done else 0


def filter_stats(runs: list[dict]) -> dict:
    """Online-filter methods: method -> filtered fraction per step (mean over seeds), and the filter's
    time over the rest of its step (median over steps and seeds)."""
    out: dict = {}
    for method in sorted({r["method"] for r in runs}):
        rows = [[s for s in r["steps"] if "filtered_fraction" in s] for r in runs if r["method"] == method]
        if not any(rows):
            continue
        n = min(len(x) for x in rows)
        frac = np.array([[s["filtered_fraction"] for s in x[:n]] for x in rows])
        cost = [s["filter_s"] / max(s["step_s"] - s["filter_s"], 1e-9) for x in rows for s in x]
        out[method] = {"filtered_fraction_by_step": frac.mean(axis=0).tolist(),
                       "filtered_fraction_mean": float(frac.mean()),
                       "filter_s_over_rest_of_step": float(np.median(cost)),
                       "early_stops": int(sum(bool(s.get("early_stop")) for x in rows for s in x))}
    return out


def trainer_timing(runs: list[dict]) -> dict:
    steps = [s for r in runs for s in r["steps"]]
    evals = [e for r in runs for e in r["evals"]]
    return {"steps": len(steps), "sample_s": float(np.mean([s["sample_s"] for s in steps])) if steps else None,
            "update_s": float(np.mean([s["update_s"] for s in steps])) if steps else None,
            "eval_s": float(np.mean([e["eval_s"] for e in evals])) if evals else None,
            "run_s": {r["name"]: round(r["seconds"], 1) for r in runs}}


def selection_warnings(runs: list[dict]) -> dict:
    """method -> the selection diagnostics' warnings of every stage subset (seed, stage, code, message)."""
    out: dict = defaultdict(list)
    for run in runs:
        for stage in run["stages"]:
            for w in (stage.get("selection") or {}).get("warnings", []):
                out[run["method"]].append({"seed": run["seed"], "stage": stage["index"], **w})
    return dict(out)


def stage_mix(runs: list[dict], pool_path: str) -> dict:
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
    """Data-source (skill) and level shares, and each source's modal-answer share (the library's
    selection diagnostics, measured against the records themselves)."""
    records = list(records)
    n = len(records)
    labels = pool_labels(records)
    sources = selection_mix(list(labels), labels)["sources"]
    levels = Counter(str(r.extra_info.get("level")) for r in records)
    return {"n": n, "skills": {k: v["pool_share"] for k, v in sources.items()},
            "levels": {k: v / n for k, v in sorted(levels.items())},
            "modal_answer": {k: v["pool_modal_answer_share"] for k, v in sources.items()}}


def _mean_shares(shares: list[dict]) -> dict:
    def mean(kind: str) -> dict:
        keys = sorted({k for s in shares for k in s[kind]})
        if kind == "modal_answer":  # a share among the skill's own prompts: average where the skill is present
            return {k: float(np.mean([s[kind][k] for s in shares if k in s[kind]])) for k in keys}
        return {k: float(np.mean([s[kind].get(k, 0.0) for s in shares])) for k in keys}

    return {"n": float(np.mean([s["n"] for s in shares])), "skills": mean("skills"), "levels": mean("levels"),
            "modal_answer": mean("modal_answer")}


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


def ess_stats(runs: list[dict]) -> dict:
    """Seed -> stage -> quantiles of the pool's ESS/K at the stage's checkpoint over the reused
    trajectories, and the share under 0.5 (what a refresh at that threshold would re-collect)."""
    out: dict = {}
    for run in (r for r in runs if r["method"] == "cropi"):
        out[str(run["seed"])] = {m: _ess_row(np.asarray(v, dtype=float)) for m, v in sorted(run.get("pool_ess", {}).items())}
    return out


def _ess_row(v: np.ndarray) -> dict:
    if not len(v):
        return {"n": 0}
    q = np.quantile(v, [0.1, 0.5, 0.9])
    return {"n": int(len(v)), "p10": float(q[0]), "median": float(q[1]), "p90": float(q[2]),
            "below_0.5": float(np.mean(v < 0.5))}


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
    acc, gain = report["step_acceleration"], report["full_gain"]
    lines = [f"# cropi demo: {', '.join(s['methods'])}", "",
             f"Tiny Qwen2-architecture model warm-started on the {report['task']['name']} task "
             f"({_sizes(report['task']['splits'])}), "
             f"{s['stages']} stages x {s['steps_per_stage']} GRPO steps (lean trainer, {s['batch_prompts']} prompts "
             f"x {s['rollouts']} rollouts a step, lr {s['lr']}), {s['seeds']} seeds, selection fraction "
             f"{s['select_fraction']} (the oracle takes every pool prompt of the targeted skills).", "",
             "Target accuracy: mean over the targeted test splits of the sampled accuracy mean@"
             f"{s['eval_samples']} (temperature 1), read every {s['eval_every']} steps.", "",
             f"**Full-pool gain**: {_pts(gain['mean'])} points over step 0 (std {_pts(gain['std'])}; per seed "
             + ", ".join(f"{k}: {_pts(v)}" for k, v in sorted(gain["per_seed"].items())) + ").", "",
             _default_text(report), "",
             "## Acceleration over full-pool training", "", _acceleration_text(acc), "",
             _versus_informative(report), "", *_acceleration_table(report), ""]
    lines += ["\\* censored on that many seeds: never reached the target within the run (the value is an upper "
              "bound). Steps: to reach 50 / 75 / 90% of full-pool training's own gain (90% is the headline). "
              "Wall-clock: the 90% figure in seconds, each method's training steps plus its own scoring "
              "(collection, gradients, ranking at every stage). AUC: mean target accuracy over the run.", ""]
    lines += _verdict_lines(report) + _diagnostics_lines(report) + checks.markdown_lines(report)
    for metric in METRICS:
        lines += [f"## Target accuracy ({metric}) by training step (mean ± std over seeds)", ""]
        c = report["curves"][metric]
        steps = next(iter(c.values()))["steps"]
        shown = steps[::max(1, len(steps) // 10)] + ([steps[-1]] if (len(steps) - 1) % max(1, len(steps) // 10) else [])
        lines += ["| method | " + " | ".join(str(x) for x in shown) + " |", "|---" * (len(shown) + 1) + "|"]
        for method, m in c.items():
            cells = [f"{m['mean'][steps.index(x)]:.3f} ± {_num(m['std'][steps.index(x)], 3)}" for x in shown]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Final accuracy per test split (mean over seeds)", ""]
    splits = sorted(next(iter(report["final"].values())))
    keys = sorted(next(iter(report["final"].values()))[splits[0]])
    lines += ["| method | " + " | ".join(f"{sp} {k}" for sp in splits for k in keys) + " |",
              "|---" * (len(splits) * len(keys) + 1) + "|"]
    for method, v in report["final"].items():
        lines.append(f"| {method} | " + " | ".join(f"{v[sp][k]:.3f}" for sp in splits for k in keys) + " |")
    lines += ["", "## What each stage selected (skill shares, mean over seeds)", ""] + _selection_table(report["selection"])
    warned = {m: len(w) for m, w in report["selection_warnings"].items()}
    lines += ["", "Share of the most common answer among each targeted skill's selected prompts (label skew; "
              "mean over seeds). Stage subsets with a `label_skew` warning: "
              + (", ".join(f"{m} {n}" for m, n in sorted(warned.items())) or "none") + ".", ""] + _label_table(report["selection"], list(report["task"]["targets"]))
    if report["online_filter"]:
        lines += ["", "## Online filters (I-PPO, IIF) inside training", "",
                  "| method | filtered fraction (mean) | filter time / rest of the step (median) | early stops |",
                  "|---|---|---|---|"]
        for method, st in report["online_filter"].items():
            lines.append(f"| {method} | {st['filtered_fraction_mean']:.3f} | {st['filter_s_over_rest_of_step']:.2f} | "
                         f"{st['early_stops']} |")
    lines += ["", "## How far each stage's checkpoint is from the reused trajectories (pool ESS/K)", ""]
    lines += _ess_table(report["cropi_ess"])
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in report["plots"]]
    t = report["trainer"]
    lines += ["", "## Notes", "",
              "- Offline trajectories come from theta_0 and are collected once; every method and seed reuses them "
              "(CROPI's setting). CROPI's first-stage gradients are computed once and shared by its seeds.",
              "- The task's design criteria (full-pool training learns it within the budget) were fixed before "
              "CROPI was run on it; whatever the numbers say is the result of this setting.",
              f"- Trainer: {_num(t['sample_s'], 3)} s sampling + {_num(t['update_s'], 3)} s update a step, "
              f"{_num(t['eval_s'], 2)} s an evaluation ({t['steps']} steps in all).", "",
              "Wall time per phase (s): " + ", ".join(f"{k} {v:.0f}" for k, v in report["timing_s"].items())
              + f"; CPU time of the whole run: {report['cpu_s']:.0f} s.", ""]
    return "\n".join(lines)


def _verdict_lines(report: dict) -> list[str]:
    """The decision rule's comparisons with the informative control (docs/demo.md), per method."""
    verdicts = report.get("versus_informative") or {}
    if not verdicts:
        return []
    lines = ["## Against the informative control (the decision rule: AUC, steps @75%, steps @90%)", "",
             f"The product's default selector: `{report['default_selector']}`.", "",
             "| method | AUC | steps @75% | steps @90% | all three |", "|---|---|---|---|---|"]
    mark = {True: "beats", False: "-"}
    for method, v in sorted(verdicts.items()):
        lines.append(f"| {method} | {mark[v['auc']]} | {mark[v['steps@0.75']]} | {mark[v['steps@0.9']]} | "
                     f"{'**yes**' if v['all'] else 'no'} |")
    return lines + [""]


def _diagnostics_lines(report: dict) -> list[str]:
    """Per method and stage (mean over seeds): saturation and interference (cropi.demo.diagnostics)."""
    diag = report.get("diagnostics") or {}
    if not diag:
        return []
    lines = ["## Why a selection helps or hurts: diagnostics per stage (mean over seeds)", "",
             "passes: draws over subset size; zero-adv: share of all-equal groups per step; pass rate: theta_0's "
             "offline pass rate of the subset (pool beside it); alignment: mean pairwise cosine of the subset's "
             "theta_0 gradients (a random draw beside it) and the batch signal-to-noise it implies (above 1 "
             "warns); val change: validation accuracy at the stage's end minus its start; vs last ranking: Spearman between "
             "the stage's influence ranking and the last stage's (near 0: the last stage moved the model past it).", "",
             "| method | stage | passes | zero-adv | pass rate (pool) | alignment (random) | batch SNR | val change | "
             "vs last ranking |",
             "|---|---|---|---|---|---|---|---|---|"]
    for method, d in sorted(diag.items()):
        for m, r in d["mean"].items():
            lines.append(f"| {method} | {m} | {_num(r['passes_per_stage'], 1)} | {_num(r['zero_advantage_share'], 2)} | "
                         f"{_num(r['selection_pass_rate'], 2)} ({_num(r['pool_pass_rate'], 2)}) | "
                         f"{_num(r['selection_alignment'], 3)} ({_num(r['random_alignment'], 3)}) | "
                         f"{_num(r['batch_signal_to_noise'], 2)} | {_num(r['validation_change'], 3)} | "
                         f"{_num(r.get('ranking_change'), 2)} |")
    counts = {m: Counter(w["code"] for w in d["warnings"]) for m, d in diag.items()}
    lines += ["", "Warnings over every seed and stage: " + "; ".join(
        f"{m}: " + (", ".join(f"{c} {n}" for c, n in sorted(cs.items())) or "none") for m, cs in sorted(counts.items()))
        + ".", ""]
    return lines


def _ess_table(ess: dict) -> list[str]:
    lines = ["| seed | stage | p10 | median | p90 | share below 0.5 |", "|---|---|---|---|---|---|"]
    for seed, stages in sorted(ess.items()):
        for m, r in sorted(stages.items(), key=lambda kv: int(kv[0])):
            if r["n"]:
                lines.append(f"| {seed} | {m} | {r['p10']:.3f} | {r['median']:.3f} | {r['p90']:.3f} | "
                             f"{r['below_0.5']:.2f} |")
    return lines if len(lines) > 2 else ["(no CROPI run stored ESS)"]


def _pts(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _versus_informative(report: dict) -> str:
    """Whether the influence ranking adds anything over a variance filter (the informative control)."""
    by = report["acceleration_by_method"]
    if "cropi" not in by or "informative" not in by:
        return "(The informative control was not run: what influence adds over a variance filter is not measured.)"
    c, i = by["cropi"]["mean"], by["informative"]["mean"]
    if c is None or i is None:
        return "CROPI against the informative control: undefined (see the table)."
    auc = report["auc_by_method"]
    verdict = ("CROPI beats" if c > i else "CROPI does **not** beat") + " the informative control"
    return (f"{verdict} (a random fraction of the mixed-reward prompts: what CROPI gets from excluding "
            f"zero-advantage prompts alone): {c:.2f}x against {i:.2f}x in steps to 90% of the gain, AUC "
            f"{_num(auc['cropi']['mean'], 3)} against {_num(auc['informative']['mean'], 3)}."
            + ("" if c > i else " On this task the influence ranking adds nothing measurable over a variance filter."))


def _acceleration_table(report: dict) -> list[str]:
    lines = ["| method | steps @50% | steps @75% | steps @90% | per seed @90% | wall-clock @90% | AUC |",
             "|---|---|---|---|---|---|---|"]
    at = report["acceleration_at_share"]
    for method, a in report["acceleration_by_method"].items():
        seeds = ", ".join(f"{k}: {_num(r['value'], 2)}{'*' if r['censored'] else ''}"
                          for k, r in sorted(a["per_seed"].items()))
        cells = [_agg(at[q][method]) for q in ("0.5", "0.75", "0.9")]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {seeds} | "
                     f"{_agg(report['wallclock_acceleration_by_method'][method])} | "
                     f"{_num(report['auc_by_method'][method]['mean'], 3)} |")
    full = report["auc_by_method"].get("full", {})
    lines.append(f"| full | 1 | 1 | 1 | | 1 | {_num(full.get('mean'), 3)} |")
    return lines


def _agg(a: dict) -> str:
    censored = f" ({len(a['censored'])}*)" if a.get("censored") else ""
    return f"{_num(a['mean'], 2)} ± {_num(a['std'], 2)}{censored}"


def _default_text(report: dict) -> str:
    """The product's default method first: its AUC beside full-pool training's and the best other method's, its
    steps to 90% of full's gain, and, where full-pool training lost accuracy, why those steps measure little."""
    name, auc = report["default_selector"], report["auc_by_method"]
    if name not in auc or auc[name]["mean"] is None:
        return f"(The default, `{name}`, was not among the methods run.)"
    # the oracle trains on the targets' own prompts, which no selector can see: no bar for the default
    others = {m: v["mean"] for m, v in auc.items() if m not in (name, "oracle") and v["mean"] is not None}
    text = f"**The default (`{name}`)**: AUC **{auc[name]['mean']:.3f}**"
    if "full" in others:
        text += f"; full-pool training {others['full']:.3f}"
    best = max(others, key=others.get) if others else None
    if best and best != "full":
        text += f"; the best other method, `{best}`, {others[best]:.3f}"
    acc = report["acceleration_by_method"].get(name)
    if acc and acc["mean"] is not None:
        text += (f". Steps to 90% of full-pool training's gain: {acc['mean']:.2f}x (mean over {acc['n']} seed(s)"
                 + (f"; censored on {len(acc['censored'])}" if acc.get("censored") else "") + ")")
    text += "."
    gain = report["full_gain"]["mean"]
    if gain is not None and gain <= 0:
        text += (f" Full-pool training lost {_pts(-gain)} points on average here, so a share of its gain is no "
                 "target: the step figures below measure little, and the AUC is the comparison.")
    return text


def _acceleration_text(acc: dict | None) -> str:
    if acc is None:
        return "CROPI was not among the methods run."
    if acc["mean"] is None:
        return "Undefined on every seed: " + "; ".join(f"seed {s}: {r}" for s, r in acc["undefined"].items())
    text = (f"CROPI's step acceleration to 90% of full-pool training's gain: **{acc['mean']:.2f}x** (above 1: "
            f"sooner than full-pool training; mean over "
            f"{acc['n']} seed(s); std {_num(acc['std'], 2)}, range {acc['min']:.2f} to {acc['max']:.2f}"
            + (f"; censored on {len(acc['censored'])}" if acc.get("censored") else "") + "). CROPI's paper reports "
            "2.66x (to full's final accuracy) on Qwen2.5-1.5B.")
    if acc["undefined"]:
        text += " Undefined on " + "; ".join(f"seed {s}: {r}" for s, r in acc["undefined"].items()) + "."
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


def _label_table(selection: dict, targets: list[str]) -> list[str]:
    sources = [s for s in selection["pool"]["modal_answer"] if s.split("/")[-1] in targets]
    lines = ["| method | stage | " + " | ".join(sources) + " |", "|---" * (len(sources) + 2) + "|"]
    lines.append("| pool | - | " + " | ".join(f"{selection['pool']['modal_answer'].get(k, 0):.2f}" for k in sources) + " |")
    for method, stages in selection.items():
        if method == "pool":
            continue
        for m, mix in stages.items():
            cells = [f"{mix['modal_answer'][k]:.2f}" if k in mix["modal_answer"] else "-" for k in sources]
            lines.append(f"| {method} | {m} | " + " | ".join(cells) + " |")
    return lines


def _sizes(task: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in task.items())


def _num(x, digits: int) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"
