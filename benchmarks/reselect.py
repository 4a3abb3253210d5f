"""A checked stage's other selection: scored again (as before) against re-ranked from the store, side by side.

The real situation: a checked curriculum that a `cropi demo` run trained (``--work``: its folder;
``--curriculum``, default ``checked-seed0``), each stage's step-1 record as the curriculum wrote it. At
every stage the fallback arm's selection at the stage's fraction (what a race or a fallback trains, and
what a widened subset does at a wider one) is made both ways in one process, the order alternating
stage by stage and round by round so load on a shared machine hits both alike:

- ``again``: ``select_ids`` without the record, which scores the checkpoint again with that selector
  (checks the trajectory stores, finds every gradient stored and the refresh planned, ranks before
  and after the refresh): what every revision up to 19 ran;
- ``reselect``: ``select_ids`` with the record, which ranks once from the stored gradients and the
  refresh split the stage's ranking read (``cropi.pipeline.score.reselect``).

Both must pick the same prompts in the same order at every stage; a speedup that changed a pick is not
one. It runs in the demo's folder, whose stores it needs at their own paths (a checkpoint's name in the
store hashes its trajectory stores' paths, so a copy would compute every gradient again), and writes there
only what scoring again writes: the fallback's rankings, the same rows under a new time stamp.

    python benchmarks/reselect.py --work out/demo [--rounds 3] --out benchmarks/results/demo/reselect
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, write_json  # noqa: E402


def measure(work: Path, curriculum: str, rounds: int) -> dict:
    import torch

    from cropi.data import load_prompts
    from cropi.pipeline.curriculum import CurriculumConfig, steps
    from cropi.pipeline.curriculum.state import CurriculumPaths

    torch.set_num_threads(1)  # the demo's workers run one torch thread each
    runs = work / "runs"
    doc = json.loads((runs / "curricula" / curriculum / "state.json").read_text())
    config = CurriculumConfig.model_validate(doc["config"])
    paths = CurriculumPaths(runs, config.name)
    pool = {r.prompt_id: r for r in load_prompts(config.pool)}
    arm, fraction = config.check.fallback, config.select_fraction
    stages = sorted(doc["stages"], key=lambda s: s["index"])
    seconds = {"again": {}, "reselect": {}}
    picks: dict = {}
    for r in range(rounds):
        for st in stages:
            m, scored = st["index"], st["scored"]
            ways = [("again", None), ("reselect", scored)]
            for way, record in (ways if (r + m) % 2 == 0 else ways[::-1]):
                began = time.perf_counter()
                ids = steps.select_ids(config, paths, m, pool, scored["model"], arm, fraction, record)
                seconds[way].setdefault(str(m), []).append(time.perf_counter() - began)
                picks.setdefault(str(m), {}).setdefault(way, ids)
                if picks[str(m)][way] != ids:
                    raise SystemExit(f"stage {m}: {way} picked otherwise in round {r}")
    same = {m: p["again"] == p["reselect"] for m, p in picks.items()}
    if not all(same.values()):
        raise SystemExit(f"the two ways picked otherwise: {same}")
    median = {way: {m: statistics.median(v) for m, v in by.items()} for way, by in seconds.items()}
    later = [m for m in median["again"] if m != "0"]  # stages 1-4: refreshed, as the curriculum scores them
    return {"arm": arm, "fraction": fraction, "same_picks": same,
            "n_picked": {m: len(p["again"]) for m, p in picks.items()}, "seconds": seconds, "median_s": median,
            "later_stages_median_s": {way: statistics.median(median[way][m] for m in later) for way in median},
            "speedup_later_stages": statistics.median(median["again"][m] / median["reselect"][m] for m in later)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="a cropi demo folder with a checked curriculum")
    ap.add_argument("--curriculum", default="checked-seed0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    result = measure(args.work.resolve(), args.curriculum, args.rounds)
    result |= {"command": f"python benchmarks/reselect.py --work DIR --curriculum {args.curriculum} "
                          f"--rounds {args.rounds} --out {args.out}",
               "environment": environment()}
    write_json(args.out, "reselect.json", result)
    print(json.dumps({k: result[k] for k in ("same_picks", "later_stages_median_s", "speedup_later_stages")}))


if __name__ == "__main__":
    main()
