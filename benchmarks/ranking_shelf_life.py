"""How long an influence ranking holds: its noise at one checkpoint against its change over a stage (exploratory:
it decides nothing).

A stage trains on the subset ranked at its start. The ranking is worth that only while it still describes the
checkpoint being trained. Read from the stores of a demo run (``--work TASK=DIR``, a `cropi demo` folder), for the
curricula of one fixed ranking rule (``--curricula``, default CROPI's rule, ``cropi-seed*``):

- **noise at one checkpoint** (``--halves``: seed 0's curriculum only, it scores): each stage's checkpoint scored
  again twice from the two halves of every pool prompt's K reused responses (even and odd ``sample_index``; the
  validation sets' trajectories whole), ``spearman`` between the two orders over the prompts ok in both,
  ``spearman_brown`` (2 rho / (1 + rho)) the whole group's reliability;
- **change over a stage**: Spearman between consecutive stages' rankings (fused and per validation set) over the
  pool prompts ok in both, and the share of a stage's selection in the previous stage's top of the same size
  (``random_top_overlap`` what a random order shares);
- **the target's turn**: per validation set the cosine between its mean projected gradient (the vector the ranking
  scores against, ``cropi.scoring.influence.validation_vector``) at consecutive stages' checkpoints, beside the
  cosine between the two halves of its own prompts at one checkpoint (mean over ``--splits`` random halves: what
  the vector's sampling noise alone allows). Recorded, not read as a verdict: where two halves of a set's own
  prompts agree as little as they do on the demo's tasks (cosine 0.03-0.46), the vector is mostly its prompts' own
  parts, and its turn says little about the direction the ranking followed;
- **how far the weights moved**: seed 0's checkpoint after each stage, ||theta - theta_0|| / ||theta_0||;
- **across seeds**: Spearman between seeds' rankings at the same stage (every seed trained the same stage-0
  subset, and differs only in its rollouts' draws).

``--short N`` (optional) also runs seed 0's curriculum again with ``N`` steps a stage, sharing the demo's
trajectories, and reads its change and turn the same way (the scratch folder keeps it).

    python benchmarks/ranking_shelf_life.py --work lists=DIR/lists ... --halves --short 10 \
        --scratch /tmp/shelf --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cmdline import command_line  # noqa: E402
from common import emit  # noqa: E402

FUSED = "fused"


def ranking_table(path: str) -> tuple[dict[str, dict[str, float]], set[str], dict]:
    """A stored ranking's scores (column -> prompt -> score, ok prompts only), its selection and its meta."""
    from cropi.store.rankings import read_ranking
    from cropi.utils.fsio import resolve

    table, meta = read_ranking(*resolve(path))
    frame = table.to_pandas()
    ok = frame[frame.status == "ok"]
    scores = {c: dict(zip(ok.prompt_id, ok[c])) for c in ok.columns if c == FUSED or c.startswith("score:")}
    return scores, set(frame[frame.selected].prompt_id), meta


def agreement(a: dict[str, float], b: dict[str, float], k: int) -> dict:
    """Spearman over the prompts both scored, and the share of a's top k in b's top k (random: k / n): the
    curriculum's own stage diagnostic (cropi.scoring.diagnostics.ranking_change), its warning left out."""
    from cropi.scoring.diagnostics import ranking_change

    return {key: v for key, v in ranking_change(a, b, k).items() if key in ("prompts", "spearman", "top_overlap",
                                                                           "random_top_overlap")}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def validation_vectors(store_root: Path, ranking: str, meta: dict, splits: int, seed: int) -> dict:
    """Per validation set: its target vector at the ranking's checkpoint, and the cosine between two random
    halves of its ok prompts' mean gradients (mean over ``splits`` draws)."""
    from cropi.scoring.influence import validation_vector
    from cropi.store import GradientStore

    store, spec = GradientStore(str(store_root)), meta["spec_id"]
    rng = np.random.default_rng(seed)
    out = {}
    for name in meta["validation"]:
        t = store.open_split(meta["checkpoint"], spec, name).read()
        status = list(t.columns["status"])
        vector, _ = validation_vector(t.prompt_ids, t.vectors, status, max_prompts=meta["max_validation"],
                                      seed=meta["seed"])
        rows = np.asarray(t.vectors, dtype=np.float64)[[s == "ok" for s in status]]
        halves = [cosine(*(rows[h].mean(0) for h in np.array_split(rng.permutation(len(rows)), 2)))
                  for _ in range(splits)]
        out[name] = {"vector": vector.astype(np.float64), "split_half_cosine": float(np.mean(halves))}
    return out


def curriculum_stages(curriculum: Path) -> list[dict]:
    state = json.loads((curriculum / "state.json").read_text())
    return [{"index": s["index"], "ranking": s["scored"]["ranking"], "model": s["scored"]["model"]}
            for s in state["stages"] if s.get("scored", {}).get("ranking")]


def changes(curriculum: Path, store_root: Path, splits: int, seed: int) -> list[dict]:
    """Per stage from 1 on: the ranking's agreement with the previous stage's, and each target's turn."""
    rows, prev = [], None
    for stage in curriculum_stages(curriculum):
        scores, selected, meta = ranking_table(stage["ranking"])
        vectors = validation_vectors(store_root, stage["ranking"], meta, splits, seed)
        if prev:
            p_scores, _, p_vectors = prev
            rows.append({"stage": stage["index"],
                         "ranking": {c: agreement(scores[c], p_scores[c], len(selected)) for c in scores},
                         "target_turn": {v: cosine(vectors[v]["vector"], p_vectors[v]["vector"]) for v in vectors},
                         "target_split_half_cosine": {v: vectors[v]["split_half_cosine"] for v in vectors}})
        prev = (scores, selected, vectors)
    return rows


def across_seeds(curricula: list[Path]) -> list[dict]:
    by_stage: dict[int, list] = {}
    for c in curricula:
        for stage in curriculum_stages(c):
            by_stage.setdefault(stage["index"], []).append(ranking_table(stage["ranking"]))
    rows = []
    for index, tables in sorted(by_stage.items()):
        if index == 0 or len(tables) < 2:
            continue  # stage 0 ranks theta_0, the same for every seed
        pairs = [agreement(a[0][FUSED], b[0][FUSED], len(a[1])) for a, b in itertools.combinations(tables, 2)]
        rows.append({"stage": index, "pairs": len(pairs), **{k: float(np.mean([p[k] for p in pairs]))
                                                            for k in ("spearman", "top_overlap", "random_top_overlap")}})
    return rows


def half_store(source: str, half: int, root: Path) -> str:
    """The pool's reused trajectories, only the responses of one parity of ``sample_index``."""
    from cropi.store import TrajectoryStore

    if not (root / "manifest.json").exists():
        src = TrajectoryStore.open(source)
        dst = TrajectoryStore.create_or_open(str(root), {**src.identity, "half": half})
        groups: dict[str, list[dict]] = {}
        for row in src.read_table().to_pylist():
            if row["sample_index"] % 2 == half:
                groups.setdefault(row["prompt_id"], []).append(row)
        with dst.writer("halves") as w:
            for pid in sorted(groups):
                w.commit_prompt_rows(groups[pid])
    return str(root)


def halves(curriculum: Path, scratch: Path) -> list[dict]:
    """Each stage's checkpoint scored from either half of the pool's responses: the two orders' agreement. The
    request is the curriculum's own score step (``CurriculumConfig.score_request``: its projection, loss, vector
    dtype, device), with only the pool's trajectories and the checkpoint's name replaced."""
    from cropi.pipeline.curriculum import CurriculumConfig
    from cropi.pipeline.score import score_checkpoint

    state = json.loads((curriculum / "state.json").read_text())
    config, first = CurriculumConfig.model_validate(state["config"]), state["stages"][0]["scored"]
    stores = {h: half_store(first["trajectories"]["pool"], h, scratch / f"half{h}") for h in (0, 1)}
    rows = []
    for stage in curriculum_stages(curriculum):
        tables = []
        for h in (0, 1):
            request = config.score_request(stage["model"], first["behavior"]).model_copy(update={
                "trajectories": {**first["trajectories"], "pool": stores[h]},
                "name": f"{curriculum.name}-stage{stage['index']}-half{h}"})
            tables.append(ranking_table(score_checkpoint(request, root=scratch / "root").ranking))
        (a, sel, _), (b, _, _) = tables
        agree = agreement(a[FUSED], b[FUSED], len(sel))
        rho = agree["spearman"]
        rows.append({"stage": stage["index"], **agree, "spearman_brown": 2 * rho / (1 + rho)})
    return rows


def weight_change(theta0: str, checkpoint: str) -> float:
    """||theta - theta_0|| / ||theta_0|| over every weight: how far a checkpoint moved from where it started."""
    from safetensors.torch import load_file

    a, b = (load_file(str(Path(p) / "model.safetensors")) for p in (theta0, checkpoint))
    moved = sum(float(((b[k].double() - a[k].double()) ** 2).sum()) for k in a)
    return (moved / sum(float((a[k].double() ** 2).sum()) for k in a)) ** 0.5


def moved(curriculum: Path) -> list[dict]:
    """Each stage's checkpoint's weight change from theta_0 (the stage-0 row: after its training)."""
    state = json.loads((curriculum / "state.json").read_text())
    theta0 = state["config"]["model"]
    return [{"after_stage": s["index"], "weight_change": weight_change(theta0, s["trained"]["checkpoint"])}
            for s in state["stages"] if s.get("trained", {}).get("checkpoint")]


def short_run(curriculum: Path, steps: int, scratch: Path) -> Path:
    """Seed 0's curriculum again with ``steps`` a stage, on the demo's trajectories (linked, so none is collected)."""
    from cropi.pipeline.curriculum import CurriculumConfig, run_curriculum

    config = json.loads((curriculum / "state.json").read_text())["config"]
    config.update(name=f"{curriculum.name}-steps{steps}", steps_per_stage=steps)
    root = scratch / "short"
    root.mkdir(parents=True, exist_ok=True)
    link = root / "trajectories"
    if not link.exists():
        link.symlink_to(curriculum.parent.parent / "trajectories")
    run_curriculum(CurriculumConfig.model_validate(config), root=root)
    return root / "curricula" / config["name"]


def summary(rows: list[dict], pick) -> float | None:
    values = [v for r in rows for v in pick(r)]
    return float(np.mean(values)) if values else None


def read_task(work: Path, pattern: str, args, scratch: Path) -> dict:
    curricula = sorted((work / "runs" / "curricula").glob(pattern))
    if not curricula:
        raise SystemExit(f"no curriculum {pattern} under {work}/runs/curricula")
    store = work / "runs" / "store"
    result = {"curricula": [c.name for c in curricula],
              "change": {c.name: changes(c, store, args.splits, args.seed) for c in curricula},
              "across_seeds": across_seeds(curricula)}
    result["weight_change"] = moved(curricula[0])
    if args.halves:
        result["halves"] = halves(curricula[0], scratch / "halves")
    if args.short:
        short = short_run(curricula[0], args.short, scratch)
        result["short"] = {"steps_per_stage": args.short, "change": changes(short, short.parent.parent / "store",
                                                                           args.splits, args.seed),
                           "weight_change": moved(short)}
    every = [r for rows in result["change"].values() for r in rows]
    result["summary"] = {
        "change_fused_spearman": summary(every, lambda r: [r["ranking"][FUSED]["spearman"]]),
        "change_top_overlap": summary(every, lambda r: [r["ranking"][FUSED]["top_overlap"]]),
        "random_top_overlap": summary(every, lambda r: [r["ranking"][FUSED]["random_top_overlap"]]),
        "target_turn": summary(every, lambda r: r["target_turn"].values()),
        "target_turn_negative_share": summary(every, lambda r: [v < 0 for v in r["target_turn"].values()]),
        "target_split_half_cosine": summary(every, lambda r: r["target_split_half_cosine"].values()),
        "across_seeds_spearman": summary(result["across_seeds"], lambda r: [r["spearman"]]),
        "weight_change_first_stage": result["weight_change"][0]["weight_change"],
    }
    if args.halves:
        first, later = result["halves"][0], result["halves"][1:]
        result["summary"] |= {"theta0_spearman_brown": first["spearman_brown"],
                              "later_spearman_brown": summary(later, lambda r: [r["spearman_brown"]])}
    if args.short:
        rows = result["short"]["change"]
        result["summary"] |= {"short_change_fused_spearman": summary(rows, lambda r: [r["ranking"][FUSED]["spearman"]]),
                              "short_target_turn": summary(rows, lambda r: r["target_turn"].values()),
                              "short_weight_change_first_stage": result["short"]["weight_change"][0]["weight_change"]}
    return result


BARS = (("later_spearman_brown", "one checkpoint, two halves of the responses (Spearman-Brown)"),
        ("change_fused_spearman", "consecutive stages of the run"),
        ("short_change_fused_spearman", "consecutive stages of {short} steps"),
        ("across_seeds_spearman", "two seeds after the same stage"))


def plot(summary: dict, path: Path, short: int = 0) -> None:
    """Per task, a bar per agreement: how much a later ranking agrees with itself, its successor, another seed's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(summary)
    bars = [(key, label) for key, label in BARS if any(summary[t].get(key) is not None for t in tasks)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(tasks)), 4.4))
    width = 0.8 / len(bars)
    for i, (key, label) in enumerate(bars):
        values = [summary[t].get(key) or 0.0 for t in tasks]
        ax.bar(np.arange(len(tasks)) + (i - (len(bars) - 1) / 2) * width, values, width, label=label.format(short=short))
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xticks(np.arange(len(tasks)), tasks, rotation=20, ha="right")
    ax.set_ylabel("Spearman of the fused influence ranking")
    ax.set_title("A later stage's ranking: reproducible at its checkpoint, gone a stage on")
    ax.set_ylim(min(-0.1, ax.get_ylim()[0]), 1.0)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", action="append", required=True, help="TASK=DIR: a cropi demo folder (repeatable)")
    p.add_argument("--curricula", default="cropi-seed*", help="the curricula to read (a glob under runs/curricula)")
    p.add_argument("--halves", action="store_true", help="score seed 0's checkpoints from halves of the responses")
    p.add_argument("--short", type=int, default=0, help="also run seed 0's curriculum with this many steps a stage")
    p.add_argument("--splits", type=int, default=20, help="random halves of a validation set's prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scratch", type=Path, help="where --halves and --short write (needed with either)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if (args.halves or args.short) and not args.scratch:
        p.error("--halves and --short write stores: give --scratch DIR")
    tasks = {}
    for item in args.work:
        task, work = item.split("=", 1)
        tasks[task] = read_task(Path(work), args.curricula, args, (args.scratch or Path(".")) / task)
        print(task, json.dumps(tasks[task]["summary"]), flush=True)
    result = {"benchmark": "ranking_shelf_life", "command": command_line("benchmarks/ranking_shelf_life.py", argv),
              "tasks": tasks, "summary": {t: r["summary"] for t, r in tasks.items()}}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        plot(result["summary"], args.out / "ranking_shelf_life.png", args.short)
    return emit(args.out, "ranking_shelf_life.json", result, "summary")


if __name__ == "__main__":
    main()
