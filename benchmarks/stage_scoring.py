"""A curriculum stage's scoring, an old revision against the working tree, side by side.

The real situation: the checkpoints a `make demo` run trained (``--work``: its folder; the curriculum
``--curriculum``, stages 1 to 4, each scored at its own start as the curriculum scores it) and theta_0's
trajectories that run collected. Each side scores every stage into a fresh store (``score_checkpoint``,
what the curriculum's score step calls), in a process of its own with the demo's one torch thread and
its imports made before the clock starts; the sides alternate, their order rotating round by round,
so load on a shared machine hits both alike. A stage's ranking must come out the same on both sides:
bitwise (the hash of its scores and order), or, where the working tree sums the same terms in another
order (``--rounding``: a response drawn twice packed once), every score within ``ROUNDING`` of the
baseline's relative to the column's largest, and the top ``select_fraction`` of the fused order the same
prompts. A speedup that changed a score beyond rounding is not one.

    python benchmarks/stage_scoring.py --work out/demo [--baseline REV] [--rounds 3] [--rounding] --out benchmarks/results
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, write_json  # noqa: E402
from sides import REPO, alternate, run_side  # noqa: E402

DEFAULT_BASELINE = "0531a70"  # main before the packed batch was filled in numpy
# float32 vectors of a few thousand coordinates summed in another order: relative differences of a few
# 1e-7 per coordinate, a few 1e-6 in a cosine; a dropped or doubled response moves a score by 1e-2 or more
ROUNDING = 1e-5


def child(work: Path, curriculum: str, root: Path) -> dict:
    """Score stages 1-4 of ``curriculum`` at their starting checkpoints; seconds and score hashes."""
    import torch

    from cropi.demo.work import init_worker

    init_worker()  # the demo worker's thread policy and imports
    from cropi.pipeline.curriculum.config import CurriculumConfig
    from cropi.pipeline.score import score_checkpoint
    from cropi.store.rankings import read_ranking
    from cropi.utils.fsio import resolve

    state = json.loads((work / "runs" / "curricula" / curriculum / "state.json").read_text())
    config = CurriculumConfig.model_validate(state["config"])
    out = {}
    for stage in state["stages"][1:]:
        model = stage["scored"]["model"]
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(work / "runs" / "trajectories", root / "trajectories")
        request = config.score_request(model, str(Path(config.model).resolve()))
        began = time.perf_counter()
        result = score_checkpoint(request, root=str(root), progress=lambda *a, **k: None)
        seconds = time.perf_counter() - began
        table, _ = read_ranking(*resolve(result.ranking))
        digest = hashlib.sha256()  # every target's score and the fused one, in the ranking's order
        for name in [c for c in table.column_names if c == "fused" or c.startswith("score:")] + ["prompt_id"]:
            digest.update(json.dumps(table.column(name).to_pylist()).encode())
        ids = table.column("prompt_id").to_pylist()
        top = ids[:max(1, round(config.select_fraction * len(ids)))]
        scores = {name: dict(zip(ids, table.column(name).to_pylist())) for name in table.column_names
                  if name == "fused" or name.startswith("score:")}
        out[str(stage["index"])] = {"seconds": seconds, "score_sha256": digest.hexdigest(),
                                    "top": sorted(top), "scores": scores}
    import cropi

    # where cropi came from, relative to the side's code root (raises if it was not that side's): no path of
    # this machine goes into the results
    side_root = Path(os.environ["PYTHONPATH"]).resolve()
    return {"stages": out, "torch_threads": torch.get_num_threads(),
            "cropi_from": str(Path(cropi.__file__).resolve().parent.relative_to(side_root))}


def side(code: Path, work: Path, curriculum: str, scratch: Path) -> dict:
    return run_side(code, __file__, ["--child", "--work", str(work), "--curriculum", curriculum, "--scratch",
                                     str(scratch)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, type=Path, help="a `cropi demo` output folder")
    p.add_argument("--curriculum", default="checked-seed0")
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision of the old side")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--rounding", action="store_true",
                   help=f"accept scores within {ROUNDING} (relative) and the same top fraction, not only bitwise")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.work.resolve(), a.curriculum, a.scratch)))
        return 0
    runs = alternate(a.baseline, a.rounds, lambda code, scratch: side(code, a.work.resolve(), a.curriculum, scratch),
                     lambda run: ", ".join(f"stage {m} {v['seconds']:.2f}s" for m, v in run["stages"].items()))
    stages = list(runs["baseline"][0]["stages"])
    total = {name: [sum(v["seconds"] for v in run["stages"].values()) for run in rs] for name, rs in runs.items()}
    same = all(run["stages"][m]["score_sha256"] == runs["baseline"][0]["stages"][m]["score_sha256"]
               for rs in runs.values() for run in rs for m in stages)
    gaps, same_top = within_rounding(runs, stages)
    for rs in runs.values():  # the scores served the comparison; the results keep their hashes
        for run in rs:
            for v in run["stages"].values():
                v.pop("scores"), v.pop("top")
    best = {name: min(t) for name, t in total.items()}
    payload = {"command": "python benchmarks/stage_scoring.py --work DIR --baseline %s --rounds %d%s" % (
                   a.baseline, a.rounds, " --rounding" if a.rounding else ""),
               "baseline": a.baseline, "work": a.work.name, "curriculum": a.curriculum, "stages": stages,
               "seconds_per_round": total, "best_s": best,
               "working_tree_over_baseline": best["working_tree"] / best["baseline"],
               "paired_ratio_per_round": [w / b for w, b in zip(total["working_tree"], total["baseline"])],
               "rankings_bitwise_equal": same, "largest_relative_score_gap": gaps,
               "top_fraction_same_prompts": same_top, "rounding": ROUNDING if a.rounding else None,
               "runs": runs, "environment": environment()}
    path = write_json(a.out, "stage_scoring.json", payload)
    close = max(gaps.values()) <= ROUNDING and all(same_top.values())
    print(f"working tree / baseline: {payload['working_tree_over_baseline']:.3f} (best of {a.rounds}); rankings "
          f"bitwise equal: {same}; largest relative score gap {max(gaps.values()):.2e}, top fraction the same: "
          f"{all(same_top.values())}; {path}")
    return 0 if same or (a.rounding and close) else 1


def within_rounding(runs: dict[str, list[dict]], stages: list[str]) -> tuple[dict, dict]:
    """Per stage: the largest score gap between the sides (relative to the column's largest score), and
    whether the top fraction of the fused order holds the same prompts on both."""
    base = runs["baseline"][0]["stages"]
    gaps, same_top = {}, {}
    for m in stages:
        gap = 0.0
        for run in runs["working_tree"]:
            for name, col in base[m]["scores"].items():
                other = run["stages"][m]["scores"][name]
                scale = max((abs(v) for v in col.values() if v is not None), default=0.0) or 1.0
                for k, v in col.items():
                    if (v is None) != (other[k] is None):
                        gap = math.inf  # a score one side has and the other lacks
                    elif v is not None:
                        gap = max(gap, abs(other[k] - v) / scale)
        gaps[m] = gap
        same_top[m] = all(run["stages"][m]["top"] == base[m]["top"] for rs in runs.values() for run in rs)
    return gaps, same_top


if __name__ == "__main__":
    sys.exit(main())
