"""The demo report's view of checked stages (cropi.pipeline.curriculum.check): every check and decision,
each stage's case, the seconds of scoring, checks and training, and the checked runs' accuracy on the
same step grid as the others.

A checked run's steps are steps spent (a reverted part and the race's losing part count), and its
trainer evaluates the test splits at each part's end as well as every few steps; ``on_grid`` reads
its accuracy at the unchecked runs' evaluation steps as the latest evaluation at or before each (the
model the run held at that many spent steps), so every method's curve has the same steps.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from cropi.pipeline.curriculum.state import race_sides


def checked_methods(runs: list[dict]) -> set[str]:
    return {r["method"] for r in runs if any((st.get("checks") or {}).get("checked") for st in r["stages"])}


def on_grid(by_step: dict, methods: set[str], reference: str = "full") -> dict:
    """``by_step`` with each of ``methods``' seeds read at ``reference``'s evaluation steps of that seed."""
    out = dict(by_step)
    for method in methods & set(by_step):
        seeds = {}
        for seed, acc in by_step[method].items():
            grid = sorted(int(s) for s in by_step.get(reference, {}).get(seed, acc))
            own = sorted(int(s) for s in acc)
            seeds[seed] = {str(g): acc[str(max([s for s in own if s <= g] or own[:1]))] for g in grid}
        out[method] = seeds
    return out


def check_records(runs: list[dict]) -> dict:
    """method -> seed -> stage -> the stage's checks (cropi.pipeline.curriculum.state.check_summary)."""
    out: dict = defaultdict(dict)
    for run in runs:
        stages = {str(st["index"]): st["checks"] for st in run["stages"] if (st.get("checks") or {}).get("checked")}
        if stages:
            out[run["method"]][str(run["seed"])] = stages
    return dict(out)


def stage_cases(records: dict) -> dict:
    """method -> stage -> how many seeds saw each case (helped, reversed, saturated, both_arms_fell,
    no_fallback, flat)."""
    out: dict = {}
    for method, seeds in records.items():
        by_stage: dict = defaultdict(Counter)
        for stages in seeds.values():
            for m, chk in stages.items():
                by_stage[m].update(chk["end"]["cases"] or [])
        out[method] = {m: dict(c) for m, c in sorted(by_stage.items(), key=lambda kv: int(kv[0]))}
    return out


COSTS = ("scoring", "checks", "training")  # what a stage spends; ``evaluation`` (the demo's test curves) is apart


def cost_split(runs: list[dict], scoring: dict) -> dict:
    """method -> seed -> stage -> {scoring, checks, training, evaluation} seconds; ``scoring`` is the report's
    per-stage scoring cost (shared phases included), the rest come from the stage records (``stage_cost``:
    training without the test-split evaluations, which are ``evaluation`` and in none of the shares)."""
    out: dict = defaultdict(dict)
    for run in runs:
        per = {}
        for st in run["stages"]:
            m = str(st["index"])
            cost = st.get("cost_s") or {}
            per[m] = {"scoring": round(scoring.get(run["method"], {}).get(str(run["seed"]), {}).get(m, 0.0)
                                       + (cost.get("scoring", 0.0) - (st.get("score_s") or 0.0)), 3),
                      "checks": round(cost.get("checks", 0.0), 3), "training": round(cost.get("training", 0.0), 3),
                      "evaluation": round(cost.get("evaluation", 0.0), 3)}
        out[run["method"]][str(run["seed"])] = per
    return dict(out)


def cost_shares(split: dict) -> dict:
    """method -> mean over seeds and stages of each part's share of a stage's seconds, and checks over the
    stage's training (the issue's two cost figures)."""
    out = {}
    for method, seeds in split.items():
        rows = [c for stages in seeds.values() for c in stages.values()]
        total = [sum(c[k] for k in COSTS) or 1.0 for c in rows]
        out[method] = {"checks_of_stage": sum(c["checks"] / t for c, t in zip(rows, total)) / len(rows),
                       "scoring_of_stage": sum(c["scoring"] / t for c, t in zip(rows, total)) / len(rows),
                       "scoring_and_checks_over_training": sum((c["scoring"] + c["checks"]) / max(c["training"], 1e-9)
                                                               for c in rows) / len(rows)}
    return out


def with_checks(scoring: dict, split: dict) -> dict:
    """The per-stage seconds the wall-clock figures count: scoring plus checks."""
    return {m: {s: {k: v["scoring"] + v["checks"] for k, v in stages.items()} for s, stages in seeds.items()}
            for m, seeds in split.items()} if split else scoring


def markdown_lines(report: dict) -> list[str]:
    """The report's section on the checked stages: the cases per stage, and the cost split."""
    records, cases = report.get("checks") or {}, report.get("check_cases") or {}
    if not records:
        return []
    lines = ["## The checked stages", "",
             "Each stage of the checked method trains in parts; after each the validation objective is measured "
             "and the stage keeps going, falls back (`reversed`: restored its best checkpoint and switched arm) or "
             "widens its fraction (`saturated`; `both_arms_fell`: both arms fell from one checkpoint; with a widening "
             "race, `raced_wider` or `kept_narrower`: the doubled subset raced the current one from one checkpoint "
             "and won or lost; with `widen_when: stalled`, `saturated_rising`: a saturated part whose rise was "
             "resolved kept its fraction; `no_gain`: a race's winner showed no gain over the stage's start (none "
             "resolved, under check.race_gain: resolved), and the whole pool went on, its mixed prompts under "
             "check.no_gain_draw: mixed, the arm `mixed`); at the whole "
             "pool a fall has no fallback and the part is kept (`no_fallback`). "
             "`helped`: the stage ended above its start by more than the "
             "check's margin. Seeds per case:", "",
             "| method | stage | cases | arms at the end | fraction at the end |", "|---|---|---|---|---|"]
    for method, by_stage in cases.items():
        for m, counts in by_stage.items():
            ends = [seeds[m]["end"] for seeds in records[method].values() if m in seeds]
            arms = Counter(e["arm"] for e in ends)
            fractions = Counter(str(e["fraction"]) for e in ends)
            lines.append(f"| {method} | {m} | " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                         + " | " + ", ".join(f"{k} {v}" for k, v in sorted(arms.items())) + " | "
                         + ", ".join(f"{k} {v}" for k, v in sorted(fractions.items())) + " |")
    lines += _race_lines(records)
    shares = report.get("cost_shares") or {}
    if shares:
        lines += ["", "Training's seconds leave out the trainer's test-split evaluations (the curves' measurement).",
                  "", "| method | checks / stage | scoring / stage | (scoring + checks) / training |", "|---|---|---|---|"]
        for method, s in shares.items():
            lines.append(f"| {method} | {s['checks_of_stage']:.1%} | {s['scoring_of_stage']:.1%} | "
                         f"{s['scoring_and_checks_over_training']:.2f} |")
    return lines + [""]


def _race_lines(records: dict) -> list[str]:
    """The races the checked stages ran: who won, by how much, its paired SE, and whether the sample resolved
    the lead (``race_lead``; the race keeps the higher reading either way)."""
    rows = []
    for method, seeds in records.items():
        for seed, stages in seeds.items():
            for m, st in sorted(stages.items(), key=lambda kv: int(kv[0])):
                for where, won, lead, look in _races(m, st):
                    rows.append(f"| {method} | {seed} | {where} | {won} | {lead['lead']:+.3f} | {lead['se']:.3f} "
                                f"| {_ratio(lead)} | {'yes' if lead['resolved'] else 'no'} | {_first_look(look)} |")
    if not rows:
        return []
    return ["", "The races (a stage's first part trained with each arm, or with `widen_check: race` a saturated "
            "subset against its doubled fraction; the higher validation reading goes on). "
            "The lead is paired (the same prompts and stream), resolved where it exceeds the one-sided critical "
            "value at the check's alpha. A sequential race (`check.race_length: sequential`) is read first at half a "
            "part: where that lead is resolved it stops there, else both arms train on to a whole part, whose lead "
            "the row gives; with `check.race_futility: stop` it also stops where the higher half reads at or below "
            "the stage's start (futile: no gain left to resolve), with `check.race_efficacy: stop` where the higher "
            "half's gain over the start is resolved there (gain resolved: only the unresolved pick left), and with "
            "`check.race_gain_length: sequential` a winner stopped at its first look whose gain over the start is "
            "above zero but not resolved trains on to a whole part alone before the no-gain test reads it (winner on). With `check.race_unresolved: "
            "fallback` a race whose lead is not resolved goes on with the fallback, the row giving the higher "
            "reading's lead. With "
            "`check.pool_revisit: race` a stage after one that ended holding the pool by the no-gain action races "
            "the ranked subset against the pool (`revisit`), the ranked subset going on only where its lead is "
            "resolved:", "",
            "| method | seed | stage | won | lead | SE | lead / SE | resolved | first look (lead / SE) |",
            "|---|---|---|---|---|---|---|---|---|", *rows]


def _ratio(lead: dict) -> str:
    return f"{lead['lead'] / lead['se']:.2f}" if lead["se"] else "-"


def _first_look(look: dict | None) -> str:
    """A sequential race's reading at half a part: its lead over its SE, and whether the race stopped there."""
    if not look:
        return "-"
    if look["resolved"]:
        gain = look.get("gain_look")  # race_gain_length: sequential, the winner's gain over the start at its half
        done = "stopped" + (f" (gain {_ratio(gain['gain'])}: winner on)" if gain and gain["on"] else "")
    elif look.get("futile"):
        done = "stopped, futile"
    elif look.get("gained"):  # race_efficacy: stop, the higher half's gain over the start resolved
        done = f"stopped, gain resolved ({_ratio(look['gain'])})"
    else:
        done = "went on"
    return f"{_ratio(look)}, {done}"


def _races(m: str, st: dict):
    """A stage's decided races as (where, who won, its ``race_lead``, a sequential race's first look or None): the
    arms' race, then the widening races."""
    lead, sides = st.get("race_lead"), race_sides(st)
    if lead and sides:
        unresolved = st.get("race_unresolved")  # race_unresolved: fallback, the higher reading not resolved
        won = f"{sides[0]['arm']} (fallback; {unresolved['higher']} read higher)" if unresolved else sides[0]["arm"]
        revisit = st.get("revisit")  # pool_revisit: race, the ranked subset against the pool
        if revisit:
            won = (f"revisit: {revisit['went_on']} ({revisit['arm']} {revisit['fraction']:g} against the pool; "
                   f"{revisit['higher']} read higher)")
        yield m, won, lead, st.get("race_first_look") and st["race_first_look"] | (
            {"gain_look": st["race_gain_look"]} if st.get("race_gain_look") else {})
    for race in st.get("widen_races") or []:
        if race.get("lead"):
            yield (f"{m} (part {race['part']})", f"fraction {race['winner']:g} of {race['fractions'][0]:g}, "
                   f"{race['fractions'][1]:g}", race["lead"], None)
