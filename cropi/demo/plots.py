"""The demo's PNG plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

ACCURACY_PNG = "accuracy_vs_steps.png"
SCORES_PNG = "score_distributions.png"
SELECTION_PNG = "selection_mix.png"
ESS_PNG = "ess_by_stage.png"
SECONDS_PNG = "accuracy_vs_train_seconds.png"
FILTERED_PNG = "filtered_fraction.png"
DIAGNOSTICS_PNG = "diagnostics_by_stage.png"
# One colour per method, none shared (``color`` gives any other method one no listed method uses).
COLORS = {"cropi": "tab:red", "full": "tab:blue", "random": "tab:gray", "pass_rate": "tab:green",
          "informative": "tab:cyan", "oracle": "tab:purple", "positive": "goldenrod", "diverse": "black",
          "ippo": "tab:orange", "iif": "tab:brown", "random_filter": "tab:olive", "cropi+iif": "tab:pink",
          "cropi_by_answer": "darkred", "cropi_theta": "salmon", "cropi_theta_refresh": "navy",
          "checked_rev8": "darkorange", "checked_rev9": "rosybrown", "checked_widerace": "darkviolet",
          "checked_screen": "olivedrab", "checked_halfrace": "deepskyblue", "checked_stalled": "darkcyan",
          "checked_rev12": "orchid", "checked_noharm": "chocolate",
          "checked_half16": "steelblue", "checked_seq": "mediumseagreen",
          "checked_rev16": "slategray", "checked_unres": "firebrick",
          "checked_raceread": "darkgoldenrod", "checked_rev19": "darkslategray", "checked_nogain": "mediumvioletred",
          "checked_rev22": "darkkhaki", "checked_restart": "mediumturquoise",
          "checked_resolved": "indigo", "checked_revisit": "orangered",
          "checked_mixed": "saddlebrown", "checked_higher": "darkolivegreen",
          "checked_futile": "cadetblue", "checked_rev26": "darkseagreen",
          "checked_gainseq": "mediumorchid", "checked_efficacy": "darkmagenta"}
_SPARE = ("lime", "teal", "magenta", "sienna", "slateblue", "darkgreen", "crimson", "peru")


def color(method: str) -> str:
    """The method's colour: its own in ``COLORS``, else a spare one picked by a stable hash of its name."""
    if method in COLORS:
        return COLORS[method]
    return _SPARE[sum(map(ord, method)) % len(_SPARE)]


def draw_all(out: Path, report: dict, scores: dict, ess: dict) -> list[str]:
    """Draw every plot into ``out``; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    return [accuracy_plot(out / ACCURACY_PNG, report["curves"]),
            score_plot(out / SCORES_PNG, scores),
            selection_plot(out / SELECTION_PNG, report["selection"]),
            ess_plot(out / ESS_PNG, ess),
            seconds_plot(out / SECONDS_PNG, report["by_train_seconds"]),
            diagnostics_plot(out / DIAGNOSTICS_PNG, report["diagnostics"])] + \
        ([filtered_plot(out / FILTERED_PNG, report["online_filter"])] if report["online_filter"] else []) + \
        ([checks_plot(out / CHECKS_PNG, report["checks"])] if report.get("checks") else [])


CHECKS_PNG = "checks_by_stage.png"
_ACTION_MARKERS = {"kept": "o", "reverted": "X", "widened": "^", "unconfirmed": "d", "no_fallback": "s"}


def checks_plot(path: Path, records: dict) -> str:
    """One panel per stage of the checked method(s): the validation objective at the stage's start and after
    each part (x: steps into the stage), per seed, with the check's margin as an error bar; a cross marks a
    reversal (the stage went back to its best checkpoint and switched arm), a diamond a fall the fresh
    reading did not confirm (kept), a square a fall at the whole pool (kept: no fallback), a triangle a
    widening (at once, or a widening race the doubled fraction won). A race's loser is a hollow circle at its
    step, joined to the winner by a solid line where the lead is resolved (``race_lead``) and a dotted one where
    it is not: the arms' race at the stage's first part, a widening race at the part it stands for. The arms are
    drawn at their check-sample readings, the curve's scale; revision 22's race decides on its own wider reading
    (``race_objective``), so a loser can sit above its winner here."""
    import matplotlib.pyplot as plt

    from cropi.pipeline.curriculum.state import race_sides

    method, seeds = sorted(records.items())[0]
    stages = sorted({m for st in seeds.values() for m in st}, key=int)
    fig, axes = plt.subplots(1, len(stages), figsize=(3.2 * len(stages), 3.4), sharey=True, squeeze=False)
    for ax, m in zip(axes[0], stages):
        for i, (seed, st) in enumerate(sorted(seeds.items())):
            if m not in st:
                continue
            rec = st[m]
            xs, ys, errs, marks, x = [0], [rec["start"]["objective"]], [0.0], ["o"], 0
            widen_races = rec.get("widen_races") or []
            races = [(sides, rec.get("race_lead"), sides[1]["steps"])] if (sides := race_sides(rec)) else []
            for part in rec["parts"]:
                x += part["steps"]
                xs.append(x)
                race = widen_races[part["widen_race"]] if part.get("widen_race") is not None else None
                if race and race.get("lead"):
                    lost = next(e for e in race["entries"] if e["race"] == "lost")
                    races.append(((part, lost), race["lead"], x))
                    part = part | ({"widened": race["winner"]} if race["winner"] > race["fractions"][0] else {})
                ys.append(part["objective"])
                errs.append(part.get("margin") or 0.0)
                action = next((a for a in ("reverted", "unconfirmed", "no_fallback") if a in part["action"]),
                              "widened" if part.get("widened") else "kept")
                marks.append(_ACTION_MARKERS[action])
            line = ax.errorbar(xs, ys, yerr=errs, capsize=2, lw=1, alpha=0.8, label=f"seed {seed}")
            for xx, yy, mk in zip(xs, ys, marks):
                ax.plot([xx], [yy], marker=mk, ms=7 if mk != "o" else 3, color=line[0].get_color())
            for (won, lost), lead, at in races:
                ax.plot([at] * 2, [lost["objective"], won["objective"]], ls="-" if (lead or {}).get("resolved") else ":",
                        lw=1, color=line[0].get_color())
                ax.plot([at], [lost["objective"]], marker="o", mfc="none", ms=6, color=line[0].get_color())
        ax.set_title(f"stage {m}")
        ax.set_xlabel("steps into the stage")
    axes[0][0].set_ylabel(f"{method}: validation objective")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def diagnostics_plot(path: Path, diagnostics: dict) -> str:
    """Per method and stage (mean over seeds): how aligned its subset's gradients are (against a random
    draw's, dashed), the share of all-equal groups it trained on, the validation sets' change, and how much the
    stage's influence ranking agrees with the last stage's (near 0: the last stage moved the model past it)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = (("selection_alignment", "mean pairwise gradient cosine (theta_0)"),
              ("zero_advantage_share", "zero-advantage groups per step"),
              ("validation_change", "validation accuracy change over the stage"),
              ("ranking_change", "Spearman with the last stage's ranking"))
    fig, axes = plt.subplots(1, len(panels), figsize=(17, 3.8))
    for ax, (key, title) in zip(axes, panels):
        for method, d in sorted(diagnostics.items()):
            stages = sorted(d["mean"], key=int)
            ys = [d["mean"][m].get(key) for m in stages]
            ax.plot([int(m) for m in stages], [np.nan if y is None else y for y in ys], marker="o", ms=3,
                    color=color(method), label=method)
        if key == "selection_alignment" and diagnostics:
            ref = next(iter(diagnostics.values()))["mean"]
            ax.axhline(_first(ref, "random_alignment"), color="tab:gray", ls="--", lw=0.8, label="random draw")
        if key in ("validation_change", "ranking_change"):
            ax.axhline(0.0, color="tab:gray", lw=0.6)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("stage")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _first(rows: dict, key: str) -> float:
    values = [r.get(key) for r in rows.values() if r.get(key) is not None]
    return values[0] if values else np.nan


def seconds_plot(path: Path, by_seconds: dict) -> str:
    """Sampled target accuracy against training seconds (steps' own time: the online filters' cost
    counts, evaluations and CROPI's between-stage scoring do not); mean over seeds per evaluation."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method, seeds in sorted(by_seconds.items()):
        n = min(len(p) for p in seeds.values())
        pts = np.array([p[:n] for p in seeds.values()])  # seeds x evaluations x (seconds, accuracy)
        ax.plot(pts[:, :, 0].mean(0), pts[:, :, 1].mean(0), color=color(method), label=method)
    ax.set_xlabel("training seconds (sampling + filter + update)")
    ax.set_ylabel("target test accuracy (sampled)")
    ax.set_title("accuracy against training time (mean over seeds)", fontsize=10)
    return _save(fig, path, ax)


def filtered_plot(path: Path, stats: dict) -> str:
    """Fraction of each step's responses the online filter dropped (mean over seeds)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for method, st in sorted(stats.items()):
        ax.plot(range(1, len(st["filtered_fraction_by_step"]) + 1), st["filtered_fraction_by_step"],
                color=color(method), label=method, lw=0.9)
    ax.set_xlabel("training step")
    ax.set_ylabel("fraction of responses filtered")
    ax.set_ylim(0, 1)
    return _save(fig, path, ax)


def ess_plot(path: Path, ess: dict) -> str:
    """ESS/K of the pool's reused trajectories at each CROPI stage's checkpoint, one box per
    (stage, seed): 1 at the behavior policy, falling as training moves theta away."""
    import matplotlib.pyplot as plt

    boxes = [(f"s{m}/seed{seed}", v) for seed, stages in sorted(ess.items())
             for m, v in sorted(stages.items(), key=lambda kv: int(kv[0])) if v]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(boxes) + 2), 3.6))
    if boxes:
        ax.boxplot([v for _, v in boxes], showfliers=False)
        ax.set_xticks(range(1, len(boxes) + 1), [name for name, _ in boxes], fontsize=8)
    ax.axhline(0.5, color="tab:red", lw=0.8, ls="--", label="a refresh threshold (0.5)")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("ESS / K per pool prompt")
    ax.set_title("CROPI: ESS of the reused trajectories by stage", fontsize=10)
    return _save(fig, path, ax)


def accuracy_plot(path: Path, curves: dict) -> str:
    """Target accuracy against training steps, sampled (left) and greedy (right): mean across
    seeds, shaded min to max."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(6.0 * len(curves), 4.2), squeeze=False)
    for ax, (metric, by_method) in zip(axes[0], curves.items()):
        for method, c in by_method.items():
            shade = color(method)
            ax.plot(c["steps"], c["mean"], color=shade, label=f"{method} (n={c['seeds']})")
            ax.fill_between(c["steps"], c["min"], c["max"], color=shade, alpha=0.15)
        ax.set_xlabel("training steps")
        ax.set_ylabel(f"target test accuracy ({metric})")
        ax.set_title(f"{metric} (mean; band: min-max over seeds)")
    return _save(fig, path, *axes[0])


def score_plot(path: Path, scores: dict) -> str:
    """Per stage (rows) of the first CROPI seed: histograms of each set's cosine and of the fused score,
    selected prompts on top of all scored ones."""
    import matplotlib.pyplot as plt

    seed = sorted(scores)[0] if scores else None
    stages = scores.get(seed, {})
    columns = sorted(c for t in stages.values() for c in t if c.startswith("score:"))
    columns = list(dict.fromkeys(columns)) + ["fused"]
    fig, axes = plt.subplots(max(1, len(stages)), len(columns), figsize=(3.4 * len(columns), 2.4 * max(1, len(stages))),
                             squeeze=False)
    for row, (m, t) in enumerate(sorted(stages.items())):
        ok = t["status"] == "ok"
        sel = t["selected"].astype(bool)
        for col, name in enumerate(columns):
            ax = axes[row][col]
            v = t[name].astype(float)
            bins = np.histogram_bin_edges(v[ok & np.isfinite(v)], bins=30) if (ok & np.isfinite(v)).any() else 10
            ax.hist(v[ok], bins=bins, color="tab:gray", alpha=0.6, label="scored")
            ax.hist(v[sel], bins=bins, color="tab:red", alpha=0.8, label="selected")
            ax.set_title(f"stage {m}: {name.replace('score:', 'cos ')}", fontsize=9)
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    fig.suptitle(f"CROPI scores per stage (seed {seed}); zero-advantage prompts are not scored", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def selection_plot(path: Path, selection: dict) -> str:
    """Skill mix (left) and level mix (right) of each method's stage subsets against the pool."""
    import matplotlib.pyplot as plt

    bars = [("pool", selection["pool"])]
    for method, stages in selection.items():
        if method != "pool":
            bars += [(f"{method} s{m}", mix) for m, mix in stages.items()]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.35 * len(bars) + 2.2))
    for ax, kind in zip(axes, ("skills", "levels")):
        keys = sorted({k for _, mix in bars for k in mix[kind]})
        left = np.zeros(len(bars))
        cmap = plt.get_cmap("tab10")
        for i, key in enumerate(keys):
            share = np.array([mix[kind].get(key, 0.0) for _, mix in bars])
            ax.barh(range(len(bars)), share, left=left, color=cmap(i % 10), label=f"{kind[:-1]} {key}")
            left += share
        ax.set_yticks(range(len(bars)), [name for name, _ in bars], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of the stage subset")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=6, frameon=False)
    fig.suptitle("What each stage selected (mean over seeds) vs the pool", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def _save(fig, path: Path, *axes) -> str:
    """Grid and legend on each of ``axes``, tight layout, write the PNG, free the figure; returns the file name."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name
