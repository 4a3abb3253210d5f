"""CROPI settings tried against the demo's label-skew failure, on a finished demo's own setup.

The skills demo (benchmarks/results/demo/skills/) found CROPI's stage subsets skewed by answer label
(with one-token answers a prompt's gradient is dominated by its answer token). This
reruns CROPI on the same data, initial model, trajectories, trainer and seed with one
setting changed at a time, and records each run's target-accuracy curve and the label
skew of its subsets:

- ``noembed``: the projection's parameter filter excludes the token embedding (tied
  with the output layer), the most direct carrier of the answer label;
- ``recollect``: trajectories re-collected at every stage's checkpoint (on-policy).

    python benchmarks/cropi_variants.py --demo out/demo --seed 0 --out benchmarks/results/demo
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo", required=True, help="output folder of a finished `cropi demo`")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", default="noembed,recollect")
    p.add_argument("--out", default="benchmarks/results/demo")
    a = p.parse_args(argv)
    from cropi.demo.work import init_worker

    init_worker()
    demo = Path(a.demo).resolve()
    report = json.loads((demo / "report.json").read_text())
    results = {"baseline": _baseline(report, a.seed)}
    for variant in a.variants.split(","):
        results[variant] = _run(demo, variant, a.seed)
        print(variant, json.dumps(results[variant].get("target_sampled") or results[variant]), flush=True)
    doc = {"benchmark": "cropi_variants", "demo": demo.name,  # the demo run's folder name (not this machine's path) "seed": a.seed, "settings": report["settings"],
           "results": results}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cropi_variants.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def _baseline(report: dict, seed: int) -> dict:
    acc = report["accuracy_by_step"]["cropi"][str(seed)]
    return {"target_sampled": {s: v["sampled"] for s, v in acc.items()},
            "modal_answer_by_stage": {m: mix["modal_answer"] for m, mix in report["selection"]["cropi"].items()}}


def _run(demo: Path, variant: str, seed: int) -> dict:
    from cropi.demo.runner import curriculum_config
    from cropi.demo.settings import DemoSettings
    from cropi.demo.work import run_method
    from cropi.errors import CropiError

    settings = DemoSettings.model_validate(json.loads((demo / "report.json").read_text())["settings"])
    data = {path.stem: str(path) for path in (demo / "data").glob("*.jsonl")}
    config = curriculum_config(settings, settings.load_task(), "cropi", seed, str(demo / "models" / "theta0"), data)
    change = {"noembed": {"projection": config.projection.model_copy(update={"exclude": "embed_tokens"})},
              "recollect": {"recollect_each_stage": True}}[variant]
    config = type(config).model_validate(config.model_copy(update={"name": f"cropi-{variant}-seed{seed}", **change})
                                         .model_dump())
    try:
        run = run_method(config.model_dump(mode="json"), str(demo / "runs"))
    except CropiError as e:  # a variant that cannot go on is a result too
        return {"failed": str(e), "change": {k: str(v) for k, v in change.items()}}
    return {"change": {k: str(v) for k, v in change.items()},
            "target_sampled": {str(e["step"]): sum(v[f"mean@{settings.eval_samples}"] for v in e["eval"].values())
                               / len(e["eval"]) for e in run["evals"]},
            "modal_answer_by_stage": {str(s["index"]): _modal(s["subset"]) for s in run["stages"]}}


def _modal(subset: str) -> dict:
    from cropi.data import load_prompts

    by_skill: dict = {}
    for r in load_prompts(subset):
        by_skill.setdefault(r.extra_info["skill"], Counter())[r.answer] += 1
    return {k: max(c.values()) / sum(c.values()) for k, c in sorted(by_skill.items())}


if __name__ == "__main__":
    raise SystemExit(main())
