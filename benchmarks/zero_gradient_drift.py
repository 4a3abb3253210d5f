"""What happens, during training, to the pool prompts whose offline rewards were all equal at theta_0.

Their offline POPI gradient is exactly zero (every advantage of the group is 0), and the curriculum scores
every stage from theta_0's trajectories, so no influence-ranked subset (CROPI's rule, ``diverse``,
``pass_rate``, ``informative``) ever contains them, at any stage. A subset that moves the policy away from
what it solved at theta_0 is then never corrected by them, while ``full`` and ``random`` keep training on
them. This measures that drift (exploratory, after round 8; no rule depends on it): each pool prompt is
sampled ``samples`` times (the trainer's temperature) at theta_0 and at each method's stage-0 and stage-1
ends, and the prompts are split by their theta_0 offline class (all correct, all wrong, mixed).

    cropi demo --task skills --out S --methods checked,full,random,informative --seeds 1
    python benchmarks/zero_gradient_drift.py --work S --out benchmarks/results/demo/checked_skills/zero_gradient_drift.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from cropi.data import load_prompts
from cropi.generation.base import SamplingConfig
from cropi.generation.hf import HFBackend
from cropi.generation.prompting import render_prompt
from cropi.rewards import get_reward, score_responses
from cropi.store import TrajectoryStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from answer_collapse import stage_ends  # noqa: E402  (the same state.json reading)

METHODS = ("checked", "full", "random", "informative", "cropi", "diverse")


def offline_class(rewards) -> str:
    """all_correct, all_wrong or mixed, from a prompt's offline rewards (a failed reward, None, is not scored;
    a prompt with none scored is all_wrong: the pipeline's advantages are all 0 there too)."""
    scored = [r for r in rewards if r is not None]
    rate = sum(scored) / len(scored) if scored else 0.0
    return "all_correct" if rate == 1.0 else "all_wrong" if rate == 0.0 else "mixed"


def offline_classes(work: Path) -> dict[str, str]:
    """Pool prompt -> its class at theta_0 from the offline trajectories."""
    (pool,) = [p for p in (work / "runs" / "trajectories").glob("*/pool")]
    return {t.prompt_id: offline_class(t.rewards) for t in TrajectoryStore.open(str(pool)).iter_prompts()}


def checkpoints(work: Path, seed: int) -> dict[str, Path]:
    """theta_0 and the stage-0 and stage-1 ends of every method of METHODS the folder ran."""
    ran = [m for m in METHODS if (work / "runs" / "curricula" / f"{m}-seed{seed}" / "state.json").exists()]
    return {"theta0": work / "models" / "theta0"} | stage_ends(work, seed, ran, (0, 1))


def pass_rates(checkpoint: Path, records, reward_fn, cfg: SamplingConfig) -> dict[str, float]:
    backend = HFBackend(str(checkpoint), device="cpu", max_batch_rows=512)
    try:
        groups = backend.generate([render_prompt(backend.tokenizer, r.prompt) for r in records],
                                  [r.prompt_id for r in records], cfg)
    finally:
        backend.close()
    return {r.prompt_id: float(np.mean([bool(x) for x in score_responses(reward_fn, [s.text for s in g], r.answer)]))
            for r, g in zip(records, groups)}


def summary(rates: dict[str, float], classes: dict[str, str]) -> dict:
    out = {}
    for c in ("all_correct", "all_wrong", "mixed"):
        vals = np.array([rates[p] for p, k in classes.items() if k == c])
        if not vals.size:  # no prompt of that class in this pool
            continue
        out[c] = {"prompts": int(vals.size), "pass_rate": round(float(vals.mean()), 4),
                  "share_now_mixed": round(float(((vals > 0) & (vals < 1)).mean()), 4),
                  "share_now_all_wrong": round(float((vals == 0).mean()), 4)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, type=Path, help="a `cropi demo` folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    settings = json.loads((args.work / "report.json").read_text())["settings"]
    records = load_prompts(str(args.work / "data" / "pool.jsonl"))
    classes = offline_classes(args.work)
    reward_fn = get_reward(settings["reward"])
    cfg = SamplingConfig(samples=args.samples, temperature=settings["temperature"],
                         max_new_tokens=settings["max_new_tokens"], seed=11)
    rows = {}
    for name, path in checkpoints(args.work, args.seed).items():
        rows[name] = summary(pass_rates(path, records, reward_fn, cfg), classes)
        print(name, json.dumps(rows[name]), flush=True)
    doc = {"command": f"python benchmarks/zero_gradient_drift.py --work DIR --seed {args.seed} --out {args.out}",
           "task": settings["task"], "seed": args.seed, "samples": args.samples,
           "temperature": settings["temperature"], "pool_prompts": len(records),
           "theta0_offline_classes": {c: sum(1 for k in classes.values() if k == c)
                                      for c in ("all_correct", "all_wrong", "mixed")},
           "checkpoints": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
