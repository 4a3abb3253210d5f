"""Why the checked stage cannot see, within stage 0, what makes CROPI's subsets lose on ``skills``: the
answers each checkpoint gives on the validation sets, against the sets' own labels (issue 32's unmet goal).

    cropi demo --task skills --out S          # the default methods, 3 seeds (what the report came from)
    python benchmarks/answer_collapse.py --work S --seed 0 \\
        --out benchmarks/results/demo/checked_skills/answer_collapse.json

Per checkpoint and validation set: the pass rate over ``samples`` draws a prompt (the check's temperature),
the model's most frequent answer (``final_number`` of ``exact_numeric``, the task's reward) and its share of
the draws, and the share of the set's labels that are that answer. A model that answers by skill answers in
the labels' proportions; a share far above the labels' is one answer given whatever the question (a label
collapse, docs/demo.md "What the demo found on skills"). The checkpoints: theta_0, the checked run's stage-0
race arms and parts, and the stage ends of ``full``, ``cropi``, ``random`` and ``checked``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np

from cropi.data import load_prompts
from cropi.generation.base import SamplingConfig
from cropi.generation.hf import HFBackend
from cropi.generation.prompting import render_prompt
from cropi.rewards.numeric import final_number


def answers(checkpoint: Path, sets: dict, samples: int, temperature: float, max_new_tokens: int, seed: int) -> dict:
    backend = HFBackend(str(checkpoint), device="cpu", max_batch_rows=512)
    cfg = SamplingConfig(samples=samples, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    out = {}
    try:
        for name, recs in sets.items():
            groups = backend.generate([render_prompt(backend.tokenizer, r.prompt) for r in recs],
                                      [r.prompt_id for r in recs], cfg)
            given = [str(final_number(s.text)) for g in groups for s in g]
            labels = [str(final_number(str(r.answer))) for r in recs]
            right = [a == lab for g, lab in zip(groups, labels) for a in [str(final_number(s.text)) for s in g]]
            modal, count = Counter(given).most_common(1)[0]
            out[name] = {"pass_rate": round(float(np.mean(right)), 4), "modal_answer": modal,
                         "modal_share": round(count / len(given), 4),
                         "labels_share_of_it": round(labels.count(modal) / len(labels), 4),
                         "top_label": Counter(labels).most_common(1)[0][0],
                         "top_label_share": round(Counter(labels).most_common(1)[0][1] / len(labels), 4)}
    finally:
        backend.close()
    return out


def stage_ends(work: Path, seed: int, methods, stages) -> dict[str, Path]:
    """``"<method> stage-<m> end"`` -> the checkpoint each method's curriculum (seed ``seed``) trained to by the end
    of stage m, from its state.json (benchmarks/zero_gradient_drift.py reads the same)."""
    found = {}
    for method in methods:
        state = json.loads((work / "runs" / "curricula" / f"{method}-seed{seed}" / "state.json").read_text())
        for m in stages:
            found[f"{method} stage-{m} end"] = Path(state["stages"][m]["trained"]["checkpoint"])
    return found


def checkpoints(work: Path, seed: int) -> dict[str, Path]:
    runs = work / "runs" / "curricula"
    found = {"theta0": work / "models" / "theta0"}
    checked = runs / f"checked-seed{seed}" / "stage-0"
    for part in sorted(checked.glob("*/train/checkpoint")):
        found[f"checked stage-0 {part.parent.parent.name}"] = part
    return found | stage_ends(work, seed, ("full", "cropi", "random", "checked"), (0, 1, 4))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, type=Path, help="a `cropi demo --task skills` folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    report = json.loads((args.work / "report.json").read_text())
    settings = report["settings"]
    sets = {name: load_prompts(str(path)) for name, path in
            ((p.stem.removeprefix("val_"), p) for p in sorted((args.work / "data").glob("val_*.jsonl")))}
    rows = {}
    for name, path in checkpoints(args.work, args.seed).items():
        rows[name] = answers(path, sets, args.samples, settings["temperature"], settings["max_new_tokens"], 7)
        print(name, json.dumps(rows[name]), flush=True)
    doc = {"command": f"python benchmarks/answer_collapse.py --work DIR --seed {args.seed} --out {args.out}",
           "task": report.get("task"), "seed": args.seed, "samples": args.samples,
           "temperature": settings["temperature"], "validation_prompts": {k: len(v) for k, v in sets.items()},
           "checkpoints": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
