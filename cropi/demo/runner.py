"""``cropi demo``: the checked default against CROPI's rule, diverse, informative and full-pool training (the
other selectors and controls by name, ``--methods``).

Phases (each logged with its wall time):

1. data     the task's splits (``--task``, cropi.tasks): a pool mixing every skill, a
            validation set and a held-out test split per targeted skill
2. model    the warm-started tiny model theta_0 (shipped with the package for the built-in
            tasks, else built from the task's recipe)
3. workers  the worker processes started and their libraries imported (torch, transformers,
            the pipeline), so no later phase's seconds, and no method's scoring, carry them
4. collect  offline trajectories of theta_0, once: pool (K=8) and validation prompts,
            sharded over the worker processes. Every method and seed reuses them: they come
            from the behavior policy theta_0, which all runs share.
5. score    POPI gradients of every split at theta_0 (shared by every CROPI seed's first stage)
6. train    one curriculum per (method, seed), same lean GRPO trainer, steps and seeds, side by
            side in the worker processes; the trainer reads the test splits every few steps
7. report   report.json, report.md and the plots

All runs live under ``<out>/runs`` (see cropi.pipeline.curriculum); rerunning the demo
with the same ``--out`` resumes where it stopped.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import os
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from cropi.contracts import POOL
from cropi.data import write_jsonl
from cropi.demo.assets import place_model, task_splits
from cropi.demo.log import say
from cropi.demo.settings import ONLINE_METHODS, VARIANTS, DemoSettings, is_checked, selection_of
from cropi.demo.work import init_worker, ready, run_collect, run_gradients, run_method
from cropi.errors import InvalidInputError
from cropi.pipeline.curriculum import (CollectOptions, CurriculumConfig, CurriculumPaths, collect_jobs,
                                       gradient_jobs, scoring_splits)
from cropi.pipeline.rank import silent_splits
from cropi.scoring.influence import no_signal_error
from cropi.scoring.ranking import silent_warning
from cropi.selection import RANKING_SELECTORS, get_selector
from cropi.tasks.base import Task
from cropi.utils.fsio import resolve, write_json_atomic



def run_order(methods) -> list[str]:
    """The methods to run, those that score at every stage first (their runs are the longest), then as listed."""
    return sorted(methods, key=lambda m: (selection_of(m) not in RANKING_SELECTORS, list(methods).index(m)))


def run_demo(settings: DemoSettings, out: str | Path, *, warm_start: bool = False) -> dict:
    """Run the whole demo into ``out``; returns the report (also written as report.json)."""
    from cropi.demo.report import write_outputs

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings, task = settings.resolved(), settings.load_task()
    clock = _Clock(out)
    say(f"task {task.name}; writing into {out}; {settings.seeds} seeds x {len(settings.methods)} methods, {settings.stages} stages "
        f"x {settings.steps_per_stage} steps, {settings.workers} worker processes")
    with clock.phase("data"):
        data = write_task(settings, task, out / "data")
    with clock.phase("model"):
        model = str(place_model(out / "models" / "theta0", task, warm_start_now=warm_start, log=say))
    root = str(out / "runs")
    configs = [curriculum_config(settings, task, method, seed, model, data)
               for seed in range(settings.seeds) for method in run_order(settings.methods)]
    with ExitStack() as stack:
        with clock.phase("workers"):
            pool = stack.enter_context(_executor(settings.workers, settings.task))
            _start(pool, settings.workers)
        # theta_0's collection and scoring serve every method's first stage (and a later run on the folder)
        reference = next((c for c in configs if c.selector == "cropi"), None) or curriculum_config(
            settings, task, "cropi", 0, model, data)
        with clock.phase("collect") as phase:
            trajectories, phase.worked = _collect(pool, settings, reference, root, model)
        with clock.phase("score") as phase:
            phase.worked = _score_initial(pool, settings, reference, root, model, trajectories)
        with clock.phase("train"):
            runs = _train(pool, configs, root)
    with clock.phase("report"):
        report = write_outputs(out, settings, task, data, runs, clock.totals(), clock.cpu_s())
    say(f"done in {sum(clock.seconds.values()):.0f}s ({report['cpu_s']:.0f} CPU-s over every run on the folder): "
        f"see {out / 'report.md'}")
    return report


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished worker processes.

    On a shared machine wall time says little; CPU seconds divided by the cores used
    approximate the wall time the same run takes on an idle machine.
    """
    import resource

    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime, 1)


def write_task(settings: DemoSettings, task: Task, folder: Path) -> dict[str, str]:
    """The task's splits as JSONL files; returns split -> path."""
    drawn = task_splits(task)
    splits = {name: drawn[name][:n] for name, n in settings.split_sizes().items()}
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, records in splits.items():
        paths[name] = str(folder / f"{name}.jsonl")
        write_jsonl(records, paths[name])
    say("task: " + ", ".join(f"{n} {len(r)}" for n, r in splits.items()))
    return paths


def validation_files(task: Task, data: dict[str, str]) -> dict[str, str]:
    return {val: data[val] for val in task.validation_splits()}


def test_files(task: Task, data: dict[str, str]) -> dict[str, str]:
    return {test: data[test] for test in task.test_splits()}


def curriculum_config(settings: DemoSettings, task: Task, method: str, seed: int, model: str,
                      data: dict) -> CurriculumConfig:
    """One run of the comparison: only ``method`` and ``seed`` differ between runs."""
    settings = settings.resolved()
    validation = validation_files(task, data)
    return CurriculumConfig(
        name=f"{run_label(method)}-seed{seed}", model=model, pool=data["pool"],
        validation=validation, stages=settings.stages,
        select_fraction=settings.select_fraction, steps_per_stage=settings.steps_per_stage,
        selector=selection_of(method),
        trainer="lean", trainer_options=settings.trainer_options(test_files(task, data), method, validation),
        seed=seed,
        reward=settings.reward,
        **_variant(settings, method),
        collect=CollectOptions(pool_samples=settings.pool_samples, validation_samples=settings.validation_samples,
                               temperature=settings.temperature, max_new_tokens=settings.max_new_tokens,
                               seed=0, backend="hf", batch_prompts=64, backend_options={"max_batch_rows": 512}),
        gradient_dtype="float32", device="cpu")


def _variant(settings: DemoSettings, method: str) -> dict:
    """The curriculum fields a method sets beyond its selector (``selection_of``): the checked methods' check, with
    the demo's samples."""
    variant = {k: v for k, v in VARIANTS.get(method, {}).items() if k != "selector"}
    check = variant["check"] | {"samples": settings.check_samples} if is_checked(method) else {"enabled": False}
    return variant | {"check": check}


def run_label(method: str) -> str:
    """A method's name as a folder name ("cropi+iif" -> "cropi-iif")."""
    return method.replace("+", "-")


def _collect(pool, settings: DemoSettings, config: CurriculumConfig, root: str,
             model: str) -> tuple[dict[str, str], bool]:
    """theta_0's trajectories of every split, and whether any prompt was collected (a resume finds them done)."""
    # The transformers backend, sharded over the workers: for a model this small and responses
    # this short, a vLLM engine's 20-40 s start costs more than the whole collection.
    paths = CurriculumPaths(root, config.name)
    jobs = collect_jobs(config, paths, model, scoring_splits(config))
    n = _shards(settings)
    done = _wait([pool.submit(run_collect, job.model_dump(mode="json"), (i, n))
                  for job in jobs.values() for i in range(n)])
    return {split: job.out for split, job in jobs.items()}, any(r["collected"] for r in done)


def _score_initial(pool, settings: DemoSettings, config: CurriculumConfig, root: str, model: str,
                   trajectories: dict[str, str]) -> bool:
    """theta_0's gradients of every split; whether any prompt's gradient was computed."""
    jobs = gradient_jobs(config, CurriculumPaths(root, config.name), model, trajectories)
    n = _shards(settings)
    done = _wait([pool.submit(run_gradients, job.model_dump(mode="json"), (i, n)) for job in jobs for i in range(n)])
    _signal_preflight(settings, config, jobs[0])
    return any(sum(r["computed"].values()) for r in done)


def _signal_preflight(settings: DemoSettings, config: CurriculumConfig, job) -> None:
    """Before any training, what theta_0's gradients leave to select: refuse, naming the counts, a pool without
    one ok prompt or targets none of whose validation sets has one, when a method selects from them (its first
    stage would fail after the others had trained); say which validation sets alone are silent (the rankings go
    on without them)."""
    silent = silent_splits(job.store, job.checkpoint_name, [POOL, *config.validation])
    selecting = [m for m in settings.methods if get_selector(selection_of(m)).needs]  # a ranking or pass rates
    if POOL in silent and selecting:
        counts = ", ".join(f"{k} {v}" for k, v in silent[POOL].items() if k != "prompts")
        raise InvalidInputError(f"no pool prompt has an ok gradient at theta_0 ({silent[POOL]['prompts']} prompts: "
                                f"{counts}), so {', '.join(selecting)} have nothing to select: use a pool this model "
                                "sometimes solves and sometimes fails, or more samples per pool prompt (pool_samples)")
    quiet = {v: c for v, c in silent.items() if v != POOL}
    if not quiet:
        return
    ranking = [m for m in settings.methods if selection_of(m) in RANKING_SELECTORS]
    if len(quiet) == len(config.validation) and ranking:
        raise no_signal_error(quiet)
    signal = sorted(set(config.validation) - set(quiet))
    say(f"warning: {silent_warning(quiet, signal)['message']}" if signal else
        f"warning: no validation set carries a gradient at theta_0 ({', '.join(quiet)}); no method here ranks")


def _train(pool, configs: list[CurriculumConfig], root: str) -> list[dict]:
    futures = {pool.submit(run_method, c.model_dump(mode="json"), root): c.name for c in configs}
    methods = {f"{run_label(m)}-seed{c.seed}": m for c in configs for m in {*ONLINE_METHODS, *VARIANTS, c.selector}}
    runs = []
    for n, future in enumerate(cf.as_completed(futures), start=1):
        runs.append(future.result() | {"method": methods[futures[future]]})  # the demo's method; "selection" the rule
        say(f"runs finished: {n}/{len(futures)} ({futures[future]})")
    return runs


def _start(pool, workers: int, rounds: int = 600) -> None:
    """Every worker process started and its libraries imported (``init_worker``): a pool spawns its
    processes on demand, so tasks are handed out until each process has answered one (at most ``rounds``
    rounds; a process that never answers shows in the phases after this one)."""
    seen: set[int] = set()
    for _ in range(rounds):
        seen |= {f.result() for f in [pool.submit(ready) for _ in range(workers)]}
        if len(seen) >= workers:
            return


def _shards(settings: DemoSettings) -> int:
    return max(1, settings.workers)


def _wait(futures: list) -> list:
    return [f.result() for f in cf.as_completed(futures)]  # re-raises the first failure here


def _executor(workers: int, task: str):
    if workers <= 1:
        return _InlineExecutor()
    return cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=init_worker, initargs=(os.getpid(), task))


class _InlineExecutor:
    """``submit`` runs the call at once in this process (one worker: no processes to start)."""

    def submit(self, fn: Callable, *args: Any) -> cf.Future:
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args))
        except BaseException as e:  # handed to the caller through the future, as a pool would
            future.set_exception(e)
        return future

    def __enter__(self) -> "_InlineExecutor":
        import torch

        # the worker settings (one torch thread) hold for the run only: the caller's process gets its own back
        self._threads = torch.get_num_threads()
        init_worker()
        return self

    def __exit__(self, *exc) -> None:
        from cropi.models.warmstart import set_threads

        set_threads(self._threads)


class _Clock:
    """Wall seconds per phase, logged as each ends, and with the CPU seconds kept in
    ``<out>/phases.json`` summed over every invocation on the folder. A resumed demo finds the
    shared collection and scoring done and spends about nothing on them: its own clock alone
    would drop their cost from the wall-clock figures and the CPU total. A phase that says it did
    no work (``phase.worked = False``: a resume found theta_0's collection or scoring done) adds
    nothing to the folder's seconds: those seconds are the stage-0 charge of every ranking method,
    and each resume used to add its check of the stores to them (2-3 s a resume, x workers)."""

    def __init__(self, out: Path):
        self.path = out / "phases.json"
        self.before = _earlier_phases(out)
        self.seconds: dict[str, float] = {}

    def totals(self) -> dict[str, float]:
        """Seconds per phase over every invocation."""
        earlier = self.before["seconds"]
        return {k: round(earlier.get(k, 0.0) + self.seconds.get(k, 0.0), 2) for k in {**earlier, **self.seconds}}

    def cpu_s(self) -> float:
        return round(self.before["cpu_s"] + cpu_seconds(), 1)

    @contextmanager
    def phase(self, name: str) -> Iterator[SimpleNamespace]:
        say(f"phase {name} ...")
        start = time.monotonic()
        phase = SimpleNamespace(worked=True)
        yield phase
        seconds = round(time.monotonic() - start, 2)
        self.seconds[name] = seconds if phase.worked else 0.0
        say(f"phase {name} done in {seconds:.1f}s" + ("" if phase.worked else " (nothing left to do: not counted)"))
        write_json_atomic(*resolve(str(self.path)), {"seconds": self.totals(), "cpu_s": self.cpu_s()})


def _earlier_phases(out: Path) -> dict:
    """What earlier invocations spent: phases.json, else (a folder from before it) the report's figures."""
    for name, seconds, cpu in (("phases.json", "seconds", "cpu_s"), ("report.json", "timing_s", "cpu_s")):
        try:
            doc = json.loads((out / name).read_text())
            return {"seconds": {k: float(v) for k, v in doc[seconds].items() if k != "total"},
                    "cpu_s": float(doc[cpu])}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return {"seconds": {}, "cpu_s": 0.0}
