"""The ``cropi`` command: one subcommand per job, each a thin door over cropi.pipeline."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from cropi.errors import CropiError

COMMANDS: dict[str, tuple[str, Callable, Callable]] = {}


def command(name: str, help: str):
    """Register ``add_args(parser)`` and ``run(args)`` under a subcommand."""
    def wrap(add_args):
        def with_run(run):
            COMMANDS[name] = (help, add_args, run)
            return run
        return with_run
    return wrap


def _collect_args(p):
    p.add_argument("--model", required=True, help="behavior checkpoint (Hugging Face folder)")
    p.add_argument("--prompts", required=True, help="prompt file: jsonl, parquet or verl parquet")
    p.add_argument("--out", required=True, help="trajectory store directory or pyarrow URI")
    p.add_argument("--samples", type=int, default=8, help="responses per prompt (CROPI: 8 pool, 32 validation)")
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["vllm", "hf"], default="vllm")
    p.add_argument("--reward", default="math_verify")
    p.add_argument("--batch-prompts", type=int, default=None,
                   help="prompts generated (and committed) at once (default 256 on a GPU, 32 on CPU)")
    _shard_args(p)


def _shard_args(p):
    p.add_argument("--shard", default="0/1", help="I/N: this worker's share of the prompts")
    p.add_argument("--ray", metavar="ADDRESS", help="run --workers shards as Ray tasks ('local' starts Ray here)")
    p.add_argument("--workers", type=int, default=2, help="Ray workers (with --ray)")
    p.add_argument("--gpus-per-worker", type=float, default=None,
                   help="GPUs per Ray worker (with --ray; default 1 when the cluster has GPUs, else 0)")


def _run_job(a, fn, job):
    """Run here, or spread over Ray workers when --ray is given."""
    if a.ray:
        from cropi.pipeline.distribute import run_sharded

        return run_sharded(fn, job, workers=a.workers, address=a.ray, gpus_per_worker=a.gpus_per_worker,
                           progress=_bar(a))
    return fn(job, _bar(a))


@command("collect", "sample K responses per prompt with behavior log-probs and rewards")(_collect_args)
def _collect(a):
    from cropi.generation import SamplingConfig
    from cropi.pipeline.collect import CollectJob, collect
    from cropi.pipeline.sharding import parse_shard

    sampling = SamplingConfig(samples=a.samples, temperature=a.temperature, top_p=a.top_p,
                              max_new_tokens=a.max_new_tokens, seed=a.seed)
    job = CollectJob(model=a.model, prompts=a.prompts, out=a.out, sampling=sampling, backend=a.backend,
                     reward=a.reward, shard=parse_shard(a.shard), batch_prompts=a.batch_prompts)
    return _run_job(a, collect, job)


def _gradient_args(p):
    p.add_argument("--model", required=True, help="checkpoint to score (Hugging Face folder)")
    p.add_argument("--trajectories", required=True, help="trajectory store made by `cropi collect`")
    p.add_argument("--store", required=True, help="gradient store directory or pyarrow URI")
    p.add_argument("--split", required=True, help="name of this prompt set in the store (pool, gsm8k, ...)")
    p.add_argument("--name", help="checkpoint name (default: the model folder's name)")
    p.add_argument("--projection-dim", type=int, default=None, help="k (default 32768)")
    p.add_argument("--kept-fraction", type=float, default=None, help="fraction r of coordinates kept")
    p.add_argument("--projection-kind", choices=["sjlt", "gaussian", "rademacher", "identity"], default=None)
    p.add_argument("--seed", type=int, default=None, help="projection seed")
    p.add_argument("--include", help="regex: only parameters whose name matches")
    p.add_argument("--exclude", help="regex: skip parameters whose name matches")
    p.add_argument("--clip", type=float, default=None, help="PPO ratio clip epsilon (default: unclipped)")
    p.add_argument("--token-budget", type=int, default=8192, help="padded tokens per micro-batch")
    p.add_argument("--dtype", choices=["float16", "float32"], default="float16", help="stored vector dtype")
    p.add_argument("--rows-per-shard", type=int, default=64, help="prompts per committed shard")
    p.add_argument("--device", default="auto")
    _shard_args(p)


def gradient_job_from_args(a):
    from cropi.gradients import LossOptions
    from cropi.pipeline.gradients import GradientJob
    from cropi.pipeline.sharding import parse_shard
    from cropi.projection import ProjectionSpec

    spec_fields = {"dim": a.projection_dim, "kept_fraction": a.kept_fraction, "kind": a.projection_kind,
                   "seed": a.seed, "include": a.include, "exclude": a.exclude}
    spec = ProjectionSpec(**{k: v for k, v in spec_fields.items() if v is not None})
    return GradientJob(model=a.model, trajectories=a.trajectories, store=a.store, split=a.split, name=a.name,
                       spec=spec, loss=LossOptions(clip_eps=a.clip, token_budget=a.token_budget),
                       shard=parse_shard(a.shard), dtype=a.dtype, device=a.device,
                       rows_per_shard=a.rows_per_shard)


@command("gradients", "POPI gradients of one split at one checkpoint, projected, into the store")(_gradient_args)
def _gradients(a):
    from cropi.pipeline.gradients import compute_gradients

    return _run_job(a, compute_gradients, gradient_job_from_args(a))


def _rank_args(p):
    p.add_argument("--store", required=True)
    p.add_argument("--name", required=True, help="checkpoint name")
    p.add_argument("--pool", required=True, help="pool split")
    p.add_argument("--validation", required=True, help="validation splits, comma separated")
    p.add_argument("--fusion", choices=["rrf", "max"], default="rrf")
    p.add_argument("--top-fraction", type=float, default=0.1)
    p.add_argument("--spec-id", help="projection spec id, when the checkpoint has several")
    p.add_argument("--max-validation", type=int, default=100, help="validation prompts averaged per set")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=20, help="rows to print (--json prints all)")


@command("rank", "rank a pool by influence on validation sets; persist and print")(_rank_args)
def _rank(a):
    from cropi.pipeline.rank import rank

    res = rank(a.store, a.name, a.pool, [v for v in a.validation.split(",") if v], fusion=a.fusion,
               top_fraction=a.top_fraction, spec_id=a.spec_id, max_validation=a.max_validation, seed=a.seed)
    if a.json:
        return {"meta": res.meta, "rows": res.table.to_pylist()}
    print(_format_ranking(res, a.limit))
    return None


def _format_ranking(res, limit: int) -> str:
    rows = res.table.slice(0, limit).to_pylist()
    score_cols = [c for c in res.table.column_names if c.startswith("score:")]
    head = ["rank", "prompt_id", "fused", *score_cols, "selected"]
    lines = ["\t".join(head)]
    for r in rows:
        lines.append("\t".join(str(r["rank"]) if c == "rank" else (f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c])) for c in head))
    lines.append(f"excluded: {res.excluded or 'none'}; selected: {sum(res.table['selected'].to_pylist())}")
    return "\n".join(lines)


def _curriculum_args(p):
    p.add_argument("--config", required=True, help="curriculum config, YAML or JSON (see cropi.pipeline.curriculum)")
    p.add_argument("--root", required=True, help="run root: trajectories, store and curricula/<name>/ go here")


@command("curriculum", "run (or resume) a staged curriculum: score, select, train, repeat")(_curriculum_args)
def _curriculum(a):
    from cropi.pipeline.curriculum import CurriculumConfig, run_curriculum

    return run_curriculum(CurriculumConfig.from_file(a.config), root=a.root, progress=_bar(a))


def _demo_args(p):
    p.add_argument("--quick", action="store_true", help="fewer prompts, stages, steps and seeds (a few minutes)")
    p.add_argument("--out", default="out/demo", help="output folder (rerun with the same folder to resume)")
    p.add_argument("--seeds", type=int, help="training seeds per method (default: 3, --quick: 2)")
    p.add_argument("--workers", type=int, help="worker processes (default 2: one per core)")
    p.add_argument("--methods", help="comma-separated subset of cropi,full,random,pass_rate,oracle (default: all)")
    p.add_argument("--warm-start", action="store_true", help="warm-start the model now instead of using the shipped one")


@command("demo", "CROPI against full-pool, random, pass-rate and oracle selection on a synthetic task (CPU)")(_demo_args)
def _demo(a):
    from cropi.demo import DemoSettings, run_demo

    given = {"seeds": a.seeds, "workers": a.workers,
             "methods": tuple(a.methods.split(",")) if a.methods else None}
    overrides = {k: v for k, v in given.items() if v is not None}
    settings = DemoSettings.make(quick=a.quick, **overrides)
    report = run_demo(settings, a.out, warm_start=a.warm_start)
    acc = report["step_acceleration"]
    return {"out": a.out, "full_gain": report["full_gain"],
            "step_acceleration": {k: acc[k] for k in ("mean", "std", "n", "undefined")} if acc else None,
            "timing_s": report["timing_s"]}


def _serve_args(p):
    p.add_argument("--root", required=True, help="service state and store directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--token-file", help="file holding the bearer token (required off loopback)")
    p.add_argument("--data-root", action="append", help="directory callers' paths must lie under (repeatable)")


@command("serve", "run the influence service (FastAPI)")(_serve_args)
def _serve(a):
    from services.cli import serve

    serve(root=a.root, host=a.host, port=a.port, token_file=a.token_file, data_roots=a.data_root or ())


def _bar(a):
    from cropi.pipeline.progress import TqdmProgress

    return TqdmProgress(disable=getattr(a, "json", False))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cropi", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help, add_args, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
        add_args(p)
        p.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = COMMANDS[args.command][2](args)
    except CropiError as e:
        print(f"cropi {args.command}: error: {e}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, indent=None if args.json else 2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
