"""The ``cropi`` command: one subcommand per job, each a thin door over cropi.pipeline."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from pydantic import ValidationError

from cropi import __version__
from cropi.cli_args import add_model_args, model_values
from cropi.contracts import SCORE_PREFIX, SELECTED
from cropi.errors import CropiError, InvalidInputError, format_validation_error, storage_full

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
    from cropi.pipeline.collect import CollectJob

    add_model_args(p, CollectJob, skip=("shard",))
    _shard_args(p)


def _shard_args(p):
    from cropi.pipeline.distribute import RayPlacement

    p.add_argument("--shard", default="0/1", help="I/N: this worker's share of the prompts (default: %(default)s)")
    p.add_argument("--ray", metavar="ADDRESS", help="run --workers shards as Ray tasks ('local' starts Ray here) (default: none, run here)")
    add_model_args(p, RayPlacement, skip=("address",))  # --workers, --gpus-per-worker: a job file's defaults


def _placement(a):
    """The Ray placement the flags name (the fields left out keep RayPlacement's defaults)."""
    from cropi.pipeline.distribute import RayPlacement

    given = {k: v for k, v in vars(a).items() if k in RayPlacement.model_fields}
    return _validated(RayPlacement, {**given, "address": a.ray})


def _shard(a):
    from cropi.pipeline.sharding import parse_shard

    return parse_shard(a.shard)


def _validated(model, values: dict):
    """The options model from the flags; pydantic's complaints as one readable error."""
    try:
        return model.model_validate(values)
    except ValidationError as e:
        # a flag is named by its field, the last part of the location
        raise InvalidInputError(format_validation_error(
            e, where=lambda loc: "--" + "-".join(str(p) for p in loc[-1:]).replace("_", "-"))) from None


def _run_job(a, fn, job):
    """Run here, or spread over Ray workers when --ray is given."""
    if a.ray:
        from cropi.pipeline.distribute import run_sharded

        return run_sharded(fn, job, _placement(a), progress=_bar(a))
    return fn(job, _bar(a))


@command("collect", "sample K responses per prompt with behavior log-probs and rewards")(_collect_args)
def _collect(a):
    from cropi.pipeline.collect import CollectJob, collect

    return _run_job(a, collect, _validated(CollectJob, {**model_values(a), "shard": _shard(a)}))


# Flag names the gradients and score commands have always had for projection and loss fields.
PROJECTION_FLAGS = {"dim": "projection-dim", "kind": "projection-kind", "seed": "seed", "clip_eps": "clip"}


def _flags(prefix: str, names: dict[str, str]) -> dict[str, str]:
    return {f"{prefix}.{k}": v for k, v in names.items()}


def _gradient_args(p):
    from cropi.pipeline.compute_gradients import GradientJob

    add_model_args(p, GradientJob, skip=("shard",), rename={
        **_flags("projection", PROJECTION_FLAGS), "loss.clip_eps": "clip",
        "gradient_dtype": ["dtype", "gradient-dtype"]})
    _shard_args(p)


def gradient_job_from_args(a):
    from cropi.pipeline.compute_gradients import GradientJob

    return _validated(GradientJob, {**model_values(a), "shard": _shard(a)})


@command("gradients", "POPI gradients of one split at one checkpoint, projected, into the store")(_gradient_args)
def _gradients(a):
    from cropi.pipeline.compute_gradients import compute_gradients

    return _run_job(a, compute_gradients, gradient_job_from_args(a))


def _refresh_args(p):
    from cropi.pipeline.refresh import RefreshJob

    add_model_args(p, RefreshJob, rename={"gradients": ["store", "gradients"], "checkpoint": ["name", "checkpoint"]})


@command("refresh", "re-collect, at the current checkpoint, the prompts whose reused trajectories are least "
         "trustworthy (ESS/K below a threshold, or status likely to change), within a budget")(_refresh_args)
def _refresh(a):
    from cropi.pipeline.refresh import RefreshJob, refresh, summary

    return summary(refresh(_validated(RefreshJob, model_values(a)), _bar(a)))


def _rank_args(p):
    from cropi.pipeline.rank import RankRequest

    add_model_args(p, RankRequest, rename={"select_fraction": ["top-fraction", "select-fraction"]})
    p.add_argument("--limit", type=int, default=20, help="rows to print (--json prints all) (default: 20)")


@command("rank", "rank a pool by influence on validation sets; persist and print")(_rank_args)
def _rank(a):
    from cropi.pipeline.rank import RankRequest

    req = _validated(RankRequest, model_values(a))
    res = req.run()
    from cropi.projection.fidelity import notice_for_split

    # a spec never measured at its size is still used; the notice (stderr: --json stays parseable) says so
    note = notice_for_split(req.store, req.name, res.meta["spec_id"], req.pool)
    if note:
        print(note, file=sys.stderr)
    if a.json:
        return {"meta": res.meta, "rows": res.rows()}
    print(_format_ranking(res, a.limit))
    return None


def _score_args(p):
    from cropi.pipeline.score import ScoreRequest

    add_model_args(p, ScoreRequest, rename={
        **_flags("projection", {**PROJECTION_FLAGS, "seed": "projection-seed"}), "loss.clip_eps": "clip",
        "collect.seed": "collect-seed", "gradient_dtype": ["gradient-dtype", "dtype"],
        "select_fraction": ["select-fraction", "top-fraction"], "validation": "validation",
        "trajectories": "trajectories"})
    p.add_argument("--root", required=True, help="run root: trajectories/ and store/ go here")


@command("score", "score a checkpoint: collect what is missing, gradients of every split, rank, select")(_score_args)
def _score(a):
    from cropi.pipeline.score import ScoreRequest, score_checkpoint

    result = score_checkpoint(_validated(ScoreRequest, model_values(a)), root=a.root, progress=_bar(a))
    return result.model_dump(mode="json")


def _format_ranking(res, limit: int) -> str:
    rows = res.rows(limit)
    score_cols = [c for c in res.table.column_names if c.startswith(SCORE_PREFIX)]
    # the pool's off-policy diagnostics the split was stored with (ESS/K, the weighted pass rate and std)
    diagnostics = [c for c in ("ess_fraction", "p_theta", "std_theta") if c in (res.ess or {})]
    head = ["rank", "prompt_id", "fused", *score_cols, SELECTED, *diagnostics]
    lines = ["\t".join(head)]
    for r in rows:
        lines.append("\t".join(str(r["rank"]) if c == "rank" else (f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c])) for c in head))
    lines.append(f"excluded: {res.excluded or 'none'}; selected: {sum(res.table[SELECTED].to_pylist())} "
                 f"by selector {res.meta.get('selector', 'cropi')}")
    return "\n".join(lines + _format_mix(res.meta.get("selection")))


def _format_mix(mix: dict | None) -> list[str]:
    """The selection's data-source shares and modal-answer shares against the pool, then any warnings."""
    if not mix:
        return ["selection mix: pass --prompts POOL_FILE to see it (data sources, answer-label skew)"]
    lines = ["data_source	pool_share	selected_share	pool_modal_answer	selected_modal_answer"]
    for source, r in mix["sources"].items():
        picked = "-" if r["selected_modal_answer_share"] is None else \
            f"{r['selected_modal_answer_share']:.2f} ({r['selected_modal_answer']})"
        lines.append(f"{source}\t{r['pool_share']:.2f}\t{r['selected_share']:.2f}\t"
                     f"{r['pool_modal_answer_share']:.2f}\t{picked}")
    if mix.get("selection_alignment") is not None:  # how much the selected gradients agree (a shortcut's sign)
        lines.append(f"selection: mean pairwise gradient cosine {mix['selection_alignment']:.3f} (a random draw: "
                     f"{mix['random_alignment']:.3f}); offline pass rate {mix['selection_pass_rate']:.2f} "
                     f"(pool: {mix['pool_pass_rate']:.2f})")
    return lines + [f"WARNING {w['code']}: {w['message']}" for w in mix["warnings"]]


def _curriculum_args(p):
    p.add_argument("--config", required=True, help="curriculum config, YAML or JSON (see cropi.pipeline.curriculum)")
    p.add_argument("--root", required=True, help="run root: trajectories, store and curricula/<name>/ go here")


@command("curriculum", "run (or resume) a staged curriculum: score, select, train, repeat")(_curriculum_args)
def _curriculum(a):
    from cropi.pipeline.curriculum import CurriculumConfig, run_curriculum

    return run_curriculum(CurriculumConfig.from_file(a.config), root=a.root, progress=_bar(a))


def _job_args(p):
    p.add_argument("file", help="job file (JSON): kind and that kind's options (see jobs/README.md)")
    p.add_argument("--shard", help="I/N: this task's share of a collect or gradients job (array jobs)")


@command("job", "run one job file, as a scheduler does (collect, gradients, rank, refresh, score or curriculum)")(_job_args)
def _job(a):
    from cropi.pipeline.jobfile import load_job_file, run_job_file

    return run_job_file(load_job_file(a.file, _shard(a) if a.shard else None), _bar(a))


def _demo_args(p):
    from cropi.demo.settings import METHODS, QUICK_POOL_SIZE, DemoSettings, known_methods
    from cropi.tasks.base import BUILTIN, DEFAULT_TASK

    p.add_argument("--quick", action="store_true", help="fewer prompts, stages, steps and seeds (a few minutes)")
    p.add_argument("--out", default="out/demo", help="output folder (rerun with the same folder to resume)")
    p.add_argument("--seeds", type=int, help="training seeds per method (default: 3, --quick: 2)")
    p.add_argument("--workers", type=int, help="worker processes (default 2: one per core)")
    p.add_argument("--pool-size", type=int, help=DemoSettings.model_fields["pool_size"].description
                   + f" (default: {DemoSettings.model_fields['pool_size'].default}, --quick: {QUICK_POOL_SIZE})")
    p.add_argument("--task", help=f"built-in task ({', '.join(BUILTIN)}; default {DEFAULT_TASK}) or "
                                  "module:attribute naming a cropi.tasks.Task (docs/demo.md)")
    p.add_argument("--methods", help=f"comma-separated methods (default: {','.join(METHODS)}; "
                                     f"also {', '.join(m for m in known_methods() if m not in METHODS)})")
    p.add_argument("--lr", type=float, help=f"every trainer's learning rate (default: "
                                            f"{DemoSettings.model_fields['lr'].default})")
    p.add_argument("--warm-start", action="store_true", help="warm-start the model now from the task's recipe "
                                                             "instead of using the shipped one")


@command("demo", "the checked default against CROPI's rule, diverse, informative and full-pool training on a task (CPU)")(_demo_args)
def _demo(a):
    from cropi.demo import DemoSettings, run_demo

    given = {"seeds": a.seeds, "workers": a.workers, "task": a.task, "pool_size": a.pool_size, "lr": a.lr,
             "methods": tuple(a.methods.split(",")) if a.methods else None}
    overrides = {k: v for k, v in given.items() if v is not None}
    settings = DemoSettings.make(quick=a.quick, **overrides)
    report = run_demo(settings, a.out, warm_start=a.warm_start)
    acc = report["step_acceleration"]
    return {"out": a.out, "full_gain": report["full_gain"],
            "step_acceleration": {k: acc[k] for k in ("mean", "std", "n", "undefined")} if acc else None,
            "timing_s": report["timing_s"]}


# Commands other packages add (the service: `cropi serve`, `cropi worker`): entry points in this
# group, named by command; each is called with the arguments from the command name on.
PLUGIN_GROUP = "cropi.commands"
PLUGIN_HINTS = {"serve": "run the influence service (FastAPI)", "worker": "run queued service jobs"}


def _plugin(name: str):
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name == name]
    return found[0].load() if found else None


def _run_plugin(argv: list[str]) -> int:
    fn = _plugin(argv[0])
    if fn is None:
        print(f"cropi {argv[0]}: the service is not installed: install cropi[serve] "
              "(pip install 'cropi[serve]') to get `cropi serve`", file=sys.stderr)
        return 2
    return int(fn(argv) or 0)


def _bar(a):
    from cropi.pipeline.progress import TqdmProgress

    return TqdmProgress(disable=getattr(a, "json", False))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cropi", description=__doc__)
    parser.add_argument("--version", action="version", version=f"cropi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help, add_args, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
        add_args(p)
        p.add_argument("--json", action="store_true", help="print the result as JSON")
    for name, help in PLUGIN_HINTS.items():  # listed in --help; dispatched before parsing (see main)
        sub.add_parser(name, help=f"{help} (needs cropi[serve])", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PLUGIN_HINTS:
        return _run_plugin(argv)
    args = build_parser().parse_args(argv)
    try:
        result = COMMANDS[args.command][2](args)
    except (CropiError, OSError) as e:  # of OSErrors, a full device's (a trainer's checkpoint, a worker's write)
        error = e if isinstance(e, CropiError) else storage_full(e)
        if error is None:
            raise
        from cropi.pipeline.progress import close_bars

        close_bars()  # a bar the error stopped halfway: the message starts a line of its own
        print(f"cropi {args.command}: error: {error}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, indent=None if args.json else 2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
