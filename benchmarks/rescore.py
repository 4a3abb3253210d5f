"""A checkpoint scored again: an old revision against the working tree, side by side, and what the work it
skips costs at the Qwen2.5-1.5B shape.

Users score a checkpoint again with another selector or fraction (`cropi score`), and a killed curriculum or
scoring job resumes past scoring that finished: every gradient, trajectory and refresh is stored, so the answer
is a ranking. The real situation: a `make demo` run's folder (``--work``), its checked curriculum's stage
``--stage`` checkpoint (trained, scored in that run with the stage's refresh), scored again as the curriculum
scores it, with the other arm's selector. Each side runs in its own process (``sides.py``), rounds alternating,
against its own copy of the run's store; the selection must be the same prompts on both sides. Counted in
each run: model loads (``from_pretrained``), generation engines started, weight files hashed for fingerprints.

``--shape-1p5b``: the seconds one model load and one fingerprint cost at Qwen2.5-1.5B's decoder shape
(random weights in bfloat16, the demo's 512-token vocabulary; a load on CPU in float32, as scoring loads it),
and a fingerprint asked again of the unchanged folder. A re-score's saving at that shape is read from the
counts times these costs (a projection: scoring such a model on 2 cores is out of reach).

    python benchmarks/rescore.py --work out/demo [--baseline REV] [--rounds 3] [--shape-1p5b] --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, write_json  # noqa: E402
from sides import REPO, alternate, run_side  # noqa: E402

DEFAULT_BASELINE = "46e67c0"  # main before scoring again skipped its loads, engines and hashes
QWEN_1P5B = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2}


def child(work: Path, curriculum: str, stage: int) -> dict:
    """Score the stage's checkpoint again where the run scored it, with the other arm's selector."""
    from cropi.demo.work import init_worker

    init_worker()
    import transformers

    from cropi.generation import hf
    from cropi.pipeline.curriculum.config import CurriculumConfig
    from cropi.pipeline.score import score_checkpoint
    from cropi.utils import fingerprint

    counts = {"model_loads": 0, "engines_started": 0, "weights_hashed": 0}

    def counting(key, fn, when=lambda *a: True):
        def wrapped(*a, **k):
            counts[key] += bool(when(*a))
            return fn(*a, **k)
        return wrapped

    auto = transformers.AutoModelForCausalLM
    auto.from_pretrained = counting("model_loads", auto.from_pretrained)
    hf.HFBackend.__init__ = counting("engines_started", hf.HFBackend.__init__)
    # a fingerprint's cost is its weight files' bytes (one a folder here, as at 1.5B in one safetensors file)
    fingerprint._hash_file = counting("weights_hashed", fingerprint._hash_file,
                                      lambda _digest, f: fingerprint.is_weight_file(f.name))
    root = work / "runs"
    state = json.loads((root / "curricula" / curriculum / "state.json").read_text())
    config = CurriculumConfig.model_validate(state["config"])
    scored = state["stages"][stage]["scored"]
    request = config.score_request(scored["model"], str(Path(config.model).resolve()))
    other = config.check.fallback if request.selector != config.check.fallback else config.selector
    request = request.model_copy(update={"selector": other})
    began = time.perf_counter()
    result = score_checkpoint(request, root=str(root), refresh=config.stage_refresh, progress=lambda *a, **k: None)
    seconds = time.perf_counter() - began
    return {"seconds": seconds, "selector": other, "selected": result.selected, **counts,
            "computed": result.computed}


def side(code: Path, work: Path, curriculum: str, stage: int) -> dict:
    return run_side(code, __file__, ["--child", "--work", str(work), "--curriculum", curriculum,
                                     "--stage", str(stage)])


def shape_costs(tokenizer_from: Path, tmp: Path) -> dict:
    """Seconds of a load and of a fingerprint (fresh, then asked again) at the 1.5B decoder shape."""
    import torch
    import transformers

    from cropi.models.loading import load_causal_lm
    from cropi.utils import fingerprint

    folder = tmp / "qwen1p5b-shape"
    config = transformers.Qwen2Config(vocab_size=512, tie_word_embeddings=True, max_position_embeddings=1024,
                                      **QWEN_1P5B)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    del model
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, folder / name)
    time.sleep(fingerprint.RACY_S + 0.5)  # written and settled, as a checkpoint scored again is
    began = time.perf_counter()
    first = fingerprint.model_fingerprint(folder)
    fresh = time.perf_counter() - began
    began = time.perf_counter()
    again = fingerprint.model_fingerprint(folder)
    kept = time.perf_counter() - began
    assert again == first
    began = time.perf_counter()
    loaded = load_causal_lm(str(folder), device="cpu")
    load = time.perf_counter() - began
    del loaded
    size = sum(f.stat().st_size for f in folder.iterdir())
    return {"parameters": params, "folder_bytes": size, "load_s": load, "fingerprint_s": fresh,
            "fingerprint_again_s": kept, "shape": QWEN_1P5B | {"vocab_size": 512, "saved_dtype": "bfloat16"}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, type=Path, help="a `cropi demo` output folder")
    p.add_argument("--curriculum", default="checked-seed0")
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision of the old side")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shape-1p5b", action="store_true", help="also time a load and a fingerprint at the 1.5B shape")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    work = a.work.resolve()
    if a.child:
        print(json.dumps(child(work, a.curriculum, a.stage)))
        return 0
    runs = alternate(a.baseline, a.rounds, lambda code, _scratch: side(code, work, a.curriculum, a.stage),
                     lambda r: f"{r['seconds']:.2f} s, loads {r['model_loads']}, engines {r['engines_started']}, "
                               f"weight files hashed {r['weights_hashed']}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("CROPI_BENCH_TMP")) as tmp:
        shape = shape_costs(work / "models" / "theta0", Path(tmp)) if a.shape_1p5b else None
    same = all(r["selected"] == runs["baseline"][0]["selected"] for rs in runs.values() for r in rs)
    computed = all(not any(r["computed"].values()) for rs in runs.values() for r in rs)
    best = {name: min(r["seconds"] for r in rs) for name, rs in runs.items()}
    counts = {name: {k: rs[-1][k] for k in ("model_loads", "engines_started", "weights_hashed")}
              for name, rs in runs.items()}
    for rs in runs.values():
        for r in rs:
            r.pop("selected")
    payload = {"command": f"python benchmarks/rescore.py --work DIR --baseline {a.baseline} --rounds {a.rounds}"
                          + (" --shape-1p5b" if a.shape_1p5b else ""),
               "baseline": a.baseline, "curriculum": a.curriculum, "stage": a.stage,
               "selector": runs["baseline"][0]["selector"], "best_s": best,
               "working_tree_over_baseline": best["working_tree"] / best["baseline"],
               "paired_ratio_per_round": [w["seconds"] / b["seconds"] for w, b in
                                          zip(runs["working_tree"], runs["baseline"])],
               "counts_per_rescore": counts, "selection_same_prompts": same, "nothing_computed": computed,
               "runs": runs, "environment": environment()}
    if shape is not None:
        skipped = {k: counts["baseline"][k] - counts["working_tree"][k] for k in ("model_loads", "weights_hashed")}
        payload["at_1p5b_shape"] = shape | {
            "projected_saving_s": skipped["model_loads"] * shape["load_s"]
            + skipped["weights_hashed"] * shape["fingerprint_s"],
            "how": "(model loads skipped) x load_s + (weight files hashed skipped) x fingerprint_s, a re-score's "
                   "counts on the demo; a vLLM engine's start (an hf engine's is one of the loads) not counted"}
    path = write_json(a.out, "rescore.json", payload)
    print(f"working tree / baseline: {payload['working_tree_over_baseline']:.3f}; counts {counts}; the same selection: "
          f"{same}; {path}")
    return 0 if same and computed else 1


if __name__ == "__main__":
    sys.exit(main())
