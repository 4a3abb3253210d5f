"""How much of a stage-0 race's noise is its reading's (exploratory: it decides nothing; docs/demo.md, "round 21").

A race reads its two arms on the check's sample: ``n`` prompts a set (sized for a fall of ``resolve``) at the
check's draws. The rest of each validation set, beyond the ``n`` held out to confirm a fall, is not read. Here a
finished curriculum's stage-0 race checkpoints (each arm after the race's first half) are read again, with the
check's own ``ValidationSample``, on:

- ``check``: the check's sample, as the race read it;
- ``rest``: every prompt of each set except the confirmation sample;
- each of those at 4x the check's draws (``check_x4``, ``rest_x4``);

each on three random streams. Per reading, the paired lead of the primary over the fallback and its SE
(``chk.paired_change_df``, the race's own statistic). The ratio of a layout's mean SE to the check's is what a
race reading that layout would gain in resolution.

    python benchmarks/race_reading_noise.py --work lists=DEMO_DIR ... --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cmdline import command_line  # noqa: E402
from common import emit  # noqa: E402

from cropi.data.readers import load_prompts  # noqa: E402
from cropi.pipeline.curriculum import check as chk  # noqa: E402

STREAMS = ("", "noise-1", "noise-2")


def layouts(sets: dict, plan: dict, seed: int) -> dict[str, chk.ValidationSample]:
    """The check's sample, the rest of each set beside its confirmation sample, and both at 4x the draws."""
    check, confirm = chk.ValidationSample.draw_pair(sets, plan["prompts_per_set"], seed, plan["samples"])
    rest = chk.ValidationSample.beside(sets, confirm, seed, plan["samples"]).records
    k = plan["samples"]
    return {"check": check, "check_x4": chk.ValidationSample(check.records, seed, 4 * k),
            "rest": chk.ValidationSample(rest, seed, k), "rest_x4": chk.ValidationSample(rest, seed, 4 * k)}


def read_race(run: Path) -> dict:
    """One curriculum's stage-0 race, read again on every layout and stream."""
    state = json.loads((run / "state.json").read_text())
    config, record = state["config"], state["stages"][0]["check"]
    sets = {name: load_prompts(path) for name, path in config["validation"].items()}
    arms = {e["arm"]: e["checkpoint"] for e in record["race"]}
    primary, fallback = record["plan"]["arms"]
    sampling = {"reward": config["reward"], "temperature": config["trainer_options"].get("temperature", 1.0),
                "max_new_tokens": config["trainer_options"]["max_new_tokens"]}
    out = {}
    for name, sample in layouts(sets, record["plan"], config["seed"]).items():
        reads = []
        for stream in STREAMS:
            a, _ = sample.measure(arms[primary], stream=stream, **sampling)
            b, _ = sample.measure(arms[fallback], stream=stream, **sampling)
            lead, se, df = chk.paired_change_df(a, b)
            reads.append({"lead": round(lead, 5), "se": round(se, 5), "df": round(df, 1)})
        out[name] = {"prompts": sample.size(), "draws": sample.samples, "reads": reads,
                     "mean_se": round(float(np.mean([r["se"] for r in reads])), 5)}
    for name in out:
        out[name]["se_over_check"] = round(out[name]["mean_se"] / out["check"]["mean_se"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", action="append", required=True, help="TASK=DEMO_DIR (a demo folder with checked runs)")
    ap.add_argument("--method", default="checked")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = {"command": command_line("benchmarks/race_reading_noise.py"), "streams": list(STREAMS), "races": {}}
    for item in args.work:
        task, _, folder = item.partition("=")
        for run in sorted((Path(folder) / "runs" / "curricula").glob(f"{args.method}-seed*")):
            result["races"][f"{task}/{run.name}"] = read_race(run)
            print(task, run.name, {k: v["se_over_check"] for k, v in result["races"][f"{task}/{run.name}"].items()},
                  flush=True)
    ratios = {name: [r[name]["se_over_check"] for r in result["races"].values()] for name in
              ("check_x4", "rest", "rest_x4")}
    result["summary"] = {name: {"median": float(np.median(v)), "min": min(v), "max": max(v), "n": len(v)}
                         for name, v in ratios.items()}
    emit(args.out, "race_reading_noise.json", result, "summary")


if __name__ == "__main__":
    main()
