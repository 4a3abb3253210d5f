"""The curriculum job: score, select, train, repeat, one stage at a time, resumable.

Each stage ``m`` takes the current checkpoint ``theta_m`` (the initial model at
stage 0) through three steps, each recorded in ``state.json`` once finished:

1. scored:   CROPI: POPI gradients of the pool and every validation split at
             ``theta_m`` over the offline trajectories, then the fused ranking.
             ``pass_rate``: ``p (1 - p)`` per pool prompt from the trajectories.
             ``random`` / ``full``: nothing to score.
2. selected: the stage subset (top fraction, random fraction, or the whole pool),
             written as verl RLVR parquet.
3. trained:  the trainer adapter trains ``theta_m`` on the subset for
             ``steps_per_stage`` steps; its checkpoint is ``theta_{m+1}``.

Offline trajectories come from the behavior policy: the initial model, collected
once and reused at every stage (CROPI), or the current checkpoint when
``recollect_each_stage`` is set. They live under ``<root>/trajectories/<key>/``,
keyed by the behavior checkpoint's fingerprint, the prompt set and the sampling
setup, so every curriculum under one root that can share them does. Projected
gradients and rankings go to the store ``<root>/store``; a checkpoint scored once
(the shared initial model) is not scored again.

Layout of one curriculum::

    <root>/curricula/<name>/state.json        progress, written atomically after every step
    <root>/curricula/<name>/stage-<m>/ranking.parquet   scores behind the selection (cropi, pass_rate)
                                     subset.parquet    the stage subset (verl RLVR parquet)
                                     metrics.json      selection and training summary
                                     train/            the trainer's folder (checkpoint/, logs)

A rerun resumes at stage granularity: finished steps are not redone, a stage
whose training was interrupted is trained again from its start. Rerunning with
more ``stages`` extends a finished curriculum; any other change of the config is
refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import time
from pathlib import Path
from typing import Any, Literal, Optional

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cropi.data import PromptRecord, load_prompts, prompts_fingerprint, write_verl_parquet
from cropi.errors import ConflictError, InvalidInputError, NotFoundError
from cropi.generation import SamplingConfig, make_backend
from cropi.gradients import LossOptions
from cropi.pipeline import baselines
from cropi.pipeline.collect import CollectJob, collect
from cropi.pipeline.gradients import GradientJob, compute_gradients
from cropi.pipeline.progress import Progress, report
from cropi.pipeline.rank import rank
from cropi.projection import ProjectionSpec
from cropi.scoring import Ranking
from cropi.store import TrajectoryStore
from cropi.trainers import make_trainer
from cropi.utils.fingerprint import model_fingerprint
from cropi.utils.fsio import atomic_write_bytes, read_json, resolve, write_json_atomic

METHODS = ("cropi", "full", "random", "pass_rate", "oracle")
POOL = "pool"
STATE_VERSION = 1
MAX_STAGES = 1000
_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"


class CurriculumConfigError(InvalidInputError):
    """A curriculum config that cannot run (a bad file, a missing validation set)."""


class CurriculumConflictError(ConflictError):
    """A curriculum of this name exists under the root with another config."""


class CollectOptions(BaseModel):
    """How the offline trajectories are sampled (CROPI: K=8 pool, K=32 validation, T=0.5)."""

    model_config = ConfigDict(extra="forbid")

    pool_samples: int = Field(8, gt=0, description="K for pool prompts")
    validation_samples: int = Field(32, gt=0, description="K for validation prompts")
    temperature: float = Field(0.5, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(256, gt=0)
    seed: int = Field(0, ge=0)
    backend: Literal["vllm", "hf"] = "vllm"
    batch_prompts: int = Field(32, gt=0)
    backend_options: dict[str, Any] = Field(default_factory=dict)

    def sampling(self, samples: int) -> SamplingConfig:
        return SamplingConfig(samples=samples, temperature=self.temperature, top_p=self.top_p,
                              max_new_tokens=self.max_new_tokens, seed=self.seed)


class CurriculumConfig(BaseModel):
    """One staged curriculum. ``fraction`` and ``spec`` are accepted for ``select_fraction`` and ``projection``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=_NAME_PATTERN, description="the curriculum's folder under <root>/curricula")
    model: str = Field(min_length=1, description="initial checkpoint (Hugging Face folder)")
    pool: str = Field(min_length=1, description="prompt pool file (jsonl, parquet, verl parquet)")
    validation: dict[str, str] = Field(default_factory=dict, description="validation split name -> prompt file")
    stages: int = Field(3, ge=1, le=MAX_STAGES)
    select_fraction: float = Field(0.1, gt=0, le=1, validation_alias=AliasChoices("select_fraction", "fraction"))
    steps_per_stage: int = Field(10, ge=1)
    method: Literal["cropi", "full", "random", "pass_rate", "oracle"] = "cropi"
    trainer: str = "trl"
    trainer_options: dict[str, Any] = Field(default_factory=dict)
    seed: int = Field(0, ge=0)
    reward: str = "math_verify"
    collect: CollectOptions = CollectOptions()
    recollect_each_stage: bool = False
    projection: ProjectionSpec = Field(ProjectionSpec(), validation_alias=AliasChoices("projection", "spec"))
    loss: LossOptions = LossOptions()
    fusion: Literal["rrf", "max"] = "rrf"
    max_validation: int = Field(100, gt=0, description="validation prompts averaged per set")
    gradient_dtype: Literal["float16", "float32"] = "float16"
    device: str = "auto"

    @field_validator("validation")
    @classmethod
    def _split_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if name == POOL or not re.match(_NAME_PATTERN, name):
                raise ValueError(f"validation split name {name!r} must be letters, digits, '_', '.' or '-' "
                                 f"and not {POOL!r}")
        return v

    @model_validator(mode="after")
    def _cropi_needs_validation(self) -> "CurriculumConfig":
        if self.method == "cropi" and not self.validation:
            raise ValueError("method 'cropi' ranks the pool against validation sets: give at least one "
                             "under 'validation' (split name -> prompt file)")
        return self

    @classmethod
    def from_file(cls, path: str | Path) -> "CurriculumConfig":
        """Load a YAML (.yaml/.yml) or JSON file; relative paths in it are taken from the file's folder."""
        path = Path(path)
        if not path.is_file():
            raise CurriculumConfigError(f"curriculum config {path} does not exist")
        text = path.read_text()
        try:
            if path.suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        except Exception as e:  # yaml and json raise different types; the message is what matters
            raise CurriculumConfigError(f"cannot parse {path}: {e}") from None
        if not isinstance(data, dict):
            raise CurriculumConfigError(f"{path} must hold a mapping of config fields, got {type(data).__name__}")
        return cls.parse(_resolve_paths(data, path.parent))

    @classmethod
    def parse(cls, data: dict) -> "CurriculumConfig":
        """``model_validate`` with pydantic's errors as one readable ``CurriculumConfigError``."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}"
                                 for err in e.errors())
            raise CurriculumConfigError(f"bad curriculum config: {problems}") from None

    def resume_key(self) -> str:
        """Hash of everything a resumed run must keep (all but ``stages``)."""
        return _short_hash(self.model_dump(mode="json", exclude={"stages"}))


def _resolve_paths(data: dict, base: Path) -> dict:
    def fix(p: Any) -> Any:
        return str((base / p).resolve()) if isinstance(p, str) and "://" not in p and not Path(p).is_absolute() else p

    data = dict(data)
    for key in ("model", "pool"):
        if key in data:
            data[key] = fix(data[key])
    if isinstance(data.get("validation"), dict):
        data["validation"] = {k: fix(v) for k, v in data["validation"].items()}
    return data


# ---------------------------------------------------------------- layout and state


class CurriculumPaths:
    """Where a curriculum's files go under ``root``."""

    def __init__(self, root: str | Path, name: str):
        self.root = Path(root).resolve()
        self.dir = self.root / "curricula" / name
        self.state = self.dir / "state.json"
        self.store = str(self.root / "store")

    def stage(self, m: int) -> Path:
        return self.dir / f"stage-{m}"

    def trajectories(self, key: str, split: str) -> str:
        return str(self.root / "trajectories" / key / split)


class StageState:
    """``state.json``: the config it belongs to and, per stage, the finished steps."""

    def __init__(self, paths: CurriculumPaths, doc: dict):
        self.paths = paths
        self.doc = doc

    @classmethod
    def open(cls, paths: CurriculumPaths, config: CurriculumConfig) -> "StageState":
        """The stored state, or a fresh one; refuses a state made under another config."""
        if paths.state.is_file():
            fs, path = resolve(str(paths.state))
            doc = read_json(fs, path)
            if doc.get("resume_key") != config.resume_key():
                raise CurriculumConflictError(
                    f"curriculum {config.name!r} under {paths.root} was started with another config "
                    f"(see {paths.state}); rerun it with that config (only 'stages' may grow), pick another "
                    "name, or delete its folder to start over")
            doc["config"] = config.model_dump(mode="json")
            return cls(paths, doc)
        now = time.time()
        return cls(paths, {"version": STATE_VERSION, "name": config.name, "resume_key": config.resume_key(),
                           "config": config.model_dump(mode="json"), "created": now, "stages": []})

    def stage(self, m: int) -> dict:
        while len(self.doc["stages"]) <= m:
            self.doc["stages"].append({"index": len(self.doc["stages"])})
        return self.doc["stages"][m]

    def finish(self, m: int, step: str, record: dict) -> None:
        """Mark ``step`` of stage ``m`` done with its ``record``, and save atomically."""
        self.stage(m)[step] = {**record, "at": time.time()}
        self.save()

    def save(self) -> None:
        self.doc["updated"] = time.time()
        self.paths.dir.mkdir(parents=True, exist_ok=True)
        fs, path = resolve(str(self.paths.state))
        write_json_atomic(fs, path, self.doc)


# ---------------------------------------------------------------- the job


def run_curriculum(config: CurriculumConfig, *, root: str | Path, progress: Progress | None = None) -> dict:
    """Run (or resume) the curriculum under ``root``; returns its stages (see ``summary``)."""
    progress = report(progress)
    paths = CurriculumPaths(root, config.name)
    state = StageState.open(paths, config)
    trainer = make_trainer(config.trainer, **config.trainer_options)  # bad options fail before any work
    pool = _load_pool(config.pool)
    initial = {"path": str(Path(config.model).resolve()), "fingerprint": model_fingerprint(config.model)}
    if state.doc.setdefault("initial_model", initial)["fingerprint"] != initial["fingerprint"]:
        raise CurriculumConflictError(f"the initial model {config.model} changed since curriculum {config.name!r} "
                                      f"started (fingerprint {state.doc['initial_model']['fingerprint']}, now "
                                      f"{initial['fingerprint']}); restore it or start a new curriculum")
    state.doc["finished"] = False
    state.save()
    for m in range(config.stages):
        progress(f"curriculum {config.name}", m, config.stages)
        stage = state.stage(m)
        if "trained" in stage:
            continue
        model = _stage_model(state, m)
        staged = _stage_progress(progress, config.name, m)
        if "scored" not in stage:
            state.finish(m, "scored", _score(config, paths, m, model, staged))
        if "selected" not in stage:
            state.finish(m, "selected", _select(config, paths, m, pool, stage["scored"]))
        state.finish(m, "trained", _train(config, paths, m, model, stage["selected"]["subset"], trainer))
        _write_metrics(paths, m, stage)
    progress(f"curriculum {config.name}", config.stages, config.stages)
    state.doc["finished"] = True
    state.save()
    return summary(state.doc, config.stages)


def summary(doc: dict, stages: Optional[int] = None) -> dict:
    """The job result: per stage its subset, size, checkpoint and metrics (the service lists these)."""
    rows = []
    for s in doc["stages"][:stages]:
        selected, trained = s.get("selected", {}), s.get("trained", {})
        rows.append({"index": s["index"], "model": s.get("scored", {}).get("model"),
                     "ranking": s.get("scored", {}).get("ranking"), "subset": selected.get("subset"),
                     "n_prompts": selected.get("n_prompts"), "checkpoint": trained.get("checkpoint"),
                     "steps_done": trained.get("steps_done"), "global_step": trained.get("global_step"),
                     "metrics": trained.get("metrics", {}), "metrics_path": trained.get("metrics_path")})
    done = [r for r in rows if r["checkpoint"]]
    return {"name": doc["name"], "method": doc["config"]["method"], "finished": bool(doc.get("finished")),
            "stages": rows, "final_checkpoint": done[-1]["checkpoint"] if done else None}


def load_state(root: str | Path, name: str) -> dict:
    """The stored state of a curriculum (raises NotFoundError when there is none)."""
    paths = CurriculumPaths(root, name)
    fs, path = resolve(str(paths.state))
    return read_json(fs, path)


def _stage_model(state: StageState, m: int) -> str:
    if m == 0:
        return state.doc["initial_model"]["path"]
    return state.stage(m - 1)["trained"]["checkpoint"]


def _stage_progress(progress: Progress, name: str, m: int) -> Progress:
    return lambda what, done, total: progress(f"{name} stage {m}: {what}", done, total)


def _load_pool(path: str) -> dict[str, PromptRecord]:
    records = load_prompts(path)
    return {r.prompt_id: r for r in records}


def stage_seed(seed: int, m: int) -> int:
    """The trainer's seed at stage ``m``: distinct per stage so stages do not replay one random stream."""
    return seed * MAX_STAGES + m


# ---------------------------------------------------------------- step 1: score


def _score(config: CurriculumConfig, paths: CurriculumPaths, m: int, model: str, progress: Progress) -> dict:
    if config.method in ("full", "random", "oracle"):
        return {"model": model, "ranking": None}
    behavior = model if config.recollect_each_stage else str(Path(config.model).resolve())
    trajectories = collect_trajectories(config, paths, behavior, scoring_splits(config), progress)
    out = paths.stage(m) / "ranking.parquet"
    if config.method == "pass_rate":
        table = _pass_rate_table(trajectories[POOL])
    else:
        table = _cropi_ranking(config, paths, model, trajectories, progress)
    _write_table(out, table)
    return {"model": model, "behavior": behavior, "ranking": str(out), "trajectories": trajectories}


def collect_jobs(config: CurriculumConfig, paths: CurriculumPaths, behavior: str,
                 splits: dict[str, tuple[str, int]]) -> dict[str, CollectJob]:
    """The collect job of each split (prompt file, K) for trajectories of ``behavior``.

    A split's store path is keyed by the behavior fingerprint, the prompt set, the sampling
    setup, the reward and the backend, so equal requests share one store.
    """
    fingerprint = model_fingerprint(behavior)
    jobs = {}
    for split, (prompts, samples) in splits.items():
        sampling = config.collect.sampling(samples)
        key = _short_hash({"model": fingerprint, "prompts": prompts_fingerprint(load_prompts(prompts)),
                           "sampling": sampling.model_dump(), "reward": config.reward,
                           "backend": config.collect.backend})
        jobs[split] = CollectJob(model=behavior, prompts=prompts, out=paths.trajectories(key, split),
                                 sampling=sampling, backend=config.collect.backend, reward=config.reward,
                                 batch_prompts=config.collect.batch_prompts,
                                 backend_options=config.collect.backend_options)
    return jobs


def scoring_splits(config: CurriculumConfig) -> dict[str, tuple[str, int]]:
    """The prompt sets the method scores, with their K: the pool, and for CROPI the validation sets."""
    splits = {POOL: (config.pool, config.collect.pool_samples)}
    if config.method == "cropi":
        splits |= {name: (path, config.collect.validation_samples) for name, path in config.validation.items()}
    return splits


def collect_trajectories(config: CurriculumConfig, paths: CurriculumPaths, behavior: str,
                         splits: dict[str, tuple[str, int]], progress: Progress) -> dict[str, str]:
    """Collect (or reuse) the behavior policy's trajectories of each split; returns split -> store path.

    One generation engine serves every split that still lacks prompts; none is started
    when every split is complete (the usual case after the first stage).
    """
    jobs = collect_jobs(config, paths, behavior, splits)
    todo = [job for job in jobs.values() if not _collected(job)]
    if todo:
        backend = make_backend(config.collect.backend, behavior, **config.collect.backend_options)
        try:
            for job in todo:
                collect(job, progress, backend=backend)
        finally:
            backend.close()
    return {split: job.out for split, job in jobs.items()}


def _collected(job: CollectJob) -> bool:
    """Whether the job's store already holds every prompt of its prompt file."""
    try:
        store = TrajectoryStore.open(job.out)
    except NotFoundError:
        return False
    return {r.prompt_id for r in load_prompts(job.prompts)} <= store.committed_prompt_ids()


def _cropi_ranking(config: CurriculumConfig, paths: CurriculumPaths, model: str, trajectories: dict[str, str],
                   progress: Progress) -> pa.Table:
    jobs = gradient_jobs(config, paths, model, trajectories)
    for job in jobs:
        compute_gradients(job, progress)
    result = rank(paths.store, jobs[0].name, POOL, list(config.validation), fusion=config.fusion,
                  top_fraction=config.select_fraction, spec_id=config.projection.spec_id,
                  max_validation=config.max_validation, seed=config.seed)
    meta = {k: v for k, v in result.meta.items() if k != "created"}
    return result.table.replace_schema_metadata({b"cropi.ranking": json.dumps(meta).encode()})


def gradient_jobs(config: CurriculumConfig, paths: CurriculumPaths, model: str,
                  trajectories: dict[str, str]) -> list[GradientJob]:
    """The gradients job of every split at ``model`` (pool first), all under one checkpoint name."""
    name = checkpoint_name(model, trajectories, config)
    return [GradientJob(model=model, trajectories=traj, store=paths.store, split=split, name=name,
                        spec=config.projection, loss=config.loss, dtype=config.gradient_dtype, device=config.device)
            for split, traj in trajectories.items()]


def checkpoint_name(model: str, trajectories: dict[str, str], config: CurriculumConfig) -> str:
    """The store name of a checkpoint scored over these trajectories with these loss settings.

    The same checkpoint scored the same way gets the same name, so its gradients are
    computed once for every curriculum under the root (the shared initial model).
    """
    setup = _short_hash({"trajectories": sorted(trajectories.items()), "loss": config.loss.model_dump(),
                         "dtype": config.gradient_dtype})
    return f"{model_fingerprint(model)}-{setup[:8]}"


def _pass_rate_table(trajectories: str) -> pa.Table:
    store = TrajectoryStore.open(trajectories)
    rates = baselines.pass_rates((t.prompt_id, t.rewards) for t in store.iter_prompts())
    ids = sorted(rates)
    return pa.table({"prompt_id": ids, "pass_rate": [rates[p] for p in ids],
                     "score": [baselines.pass_rate_score(rates[p]) for p in ids]})


# ---------------------------------------------------------------- step 2: select


def _select(config: CurriculumConfig, paths: CurriculumPaths, m: int, pool: dict[str, PromptRecord],
            scored: dict) -> dict:
    selected = select_prompts(config, m, pool, scored.get("ranking"))
    if not selected:
        raise InvalidInputError(f"stage {m} of {config.name!r} selected no prompts: every pool prompt was "
                                "excluded (see the ranking's status counts); check the trajectories' rewards")
    subset = paths.stage(m) / "subset.parquet"
    write_verl_parquet([pool[p] for p in selected], str(subset), split="train")
    return {"subset": str(subset), "n_prompts": len(selected), "pool_size": len(pool)}


def select_prompts(config: CurriculumConfig, m: int, pool: dict[str, PromptRecord], ranking: Optional[str]) -> list[str]:
    """The stage-``m`` subset by the config's method, best first where there is an order."""
    pool_ids = list(pool)
    if config.method == "full":
        return baselines.select_full(pool_ids)
    if config.method == "random":
        return baselines.select_random(pool_ids, config.select_fraction, seed=config.seed, stage=m)
    if config.method == "oracle":
        return baselines.select_oracle(pool, [r for path in config.validation.values() for r in load_prompts(path)])
    table = pq.read_table(ranking)
    if config.method == "pass_rate":
        rates = dict(zip(table["prompt_id"].to_pylist(), table["pass_rate"].to_pylist()))
        return baselines.select_pass_rate(pool_ids, rates, config.select_fraction, seed=config.seed)
    missing = set(pool_ids) - set(table["prompt_id"].to_pylist())
    if missing:
        raise InvalidInputError(f"the stage ranking lacks {len(missing)} pool prompts (e.g. {sorted(missing)[:3]}); "
                                "the pool file changed after scoring: start a new curriculum")
    ranking_obj = Ranking.from_table(table.drop_columns(["selected"]).replace_schema_metadata(None))
    chosen = ranking_obj.select(top_fraction=config.select_fraction)
    return chosen


# ---------------------------------------------------------------- step 3: train


def _train(config: CurriculumConfig, paths: CurriculumPaths, m: int, model: str, subset: str, trainer) -> dict:
    out = paths.stage(m) / "train"
    if out.exists():  # a run killed mid-stage: train the stage again from its start
        shutil.rmtree(out)
    result = trainer.train_stage(model=model, subset=subset, out_dir=str(out), steps=config.steps_per_stage,
                                 seed=stage_seed(config.seed, m), stage=m, reward=config.reward)
    return {"checkpoint": result.checkpoint, "fingerprint": model_fingerprint(result.checkpoint),
            "steps_done": result.steps_done, "global_step": result.global_step,
            "metrics": _finite(result.metrics), "log": result.log_path, "metrics_path": result.metrics_path}


def _write_metrics(paths: CurriculumPaths, m: int, stage: dict) -> None:
    doc = {"index": m, "selected": stage["selected"], "trained": stage["trained"],
           "ranking": stage["scored"].get("ranking")}
    fs, path = resolve(str(paths.stage(m) / "metrics.json"))
    write_json_atomic(fs, path, doc)


# ---------------------------------------------------------------- helpers


def _write_table(path: Path, table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    fs, p = resolve(str(path))
    atomic_write_bytes(fs, p, sink.getvalue().to_pybytes())


def _finite(metrics: dict) -> dict:
    """Metrics with NaN / inf as None: state.json is strict JSON."""
    return {k: (float(v) if math.isfinite(v) else None) for k, v in metrics.items()}


def _short_hash(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
