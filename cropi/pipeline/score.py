"""Score a checkpoint: everything between "here is a checkpoint" and "here is its ranking".

The one implementation of this step: the CLI (``cropi score``), the service
(``POST /v1/checkpoints``), the curriculum (step 1 of every CROPI stage), jobs/ and
the demo all call ``score_checkpoint``. In order:

1. trajectories: the given ones, checked against the prompt file they claim to
   score; the missing ones collected from the behavior checkpoint with ONE engine
   for every split, under ``<root>/trajectories/<key>/<split>``. The key hashes the
   behavior checkpoint's fingerprint, the prompt set, the sampling setup, the reward
   and the backend, so equal requests share one store (and a rerun reuses it).
2. gradients: POPI gradients of the pool and of every validation set at the
   checkpoint into ``<root>/store``, under the checkpoint's name: the request's, or
   by default ``<fingerprint>-<hash of trajectories, loss, dtype>``, so one
   checkpoint scored the same way is computed once under a root.
3. rank and select: the fused ranking and its top ``select_fraction``, computed once
   and stored together (the ranking's ``selected`` column). The result carries the
   selected ids best first, so no caller selects again.

Every step resumes, so rerunning a killed request continues where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from cropi.contracts import NAME_HELP, NAME_PATTERN, POOL, SELECTED, is_name
from cropi.data.prompts import load_prompts, prompts_fingerprint
from cropi.errors import InvalidInputError, MismatchError, NotFoundError
from cropi.generation import CollectOptions, make_backend
from cropi.gradients import LossOptions
from cropi.pipeline.collect import CollectJob, collect
from cropi.pipeline.gradients import GradientJob, compute_gradients
from cropi.pipeline.progress import Progress, report
from cropi.pipeline.rank import RankingResult, RankRequest, pool_labels, rank, ranking_path
from cropi.projection import ProjectionSpec
from cropi.store import TrajectoryStore
from cropi.utils.fingerprint import model_fingerprint
from cropi.utils.hashing import short_hash

Dtype = Literal["float16", "float32"]
_RANK = RankRequest.model_fields  # ranking settings: the rank step's defaults and bounds


class ScoreRequest(BaseModel):
    """What to score and how. Old field names are accepted: ``spec`` for ``projection``,
    ``top_fraction`` / ``fraction`` for ``select_fraction``, ``dtype`` for ``gradient_dtype``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: Optional[str] = Field(None, pattern=NAME_PATTERN,
                                description="checkpoint name in the store (default: derived from its content)")
    model: str = Field(min_length=1, description="checkpoint to score (Hugging Face folder)")
    pool: str = Field(min_length=1, description="prompt pool file (jsonl, parquet or verl parquet)")
    validation: dict[str, str] = Field(default_factory=dict, description="validation set name -> prompt file "
                                       "(ranking needs at least one)")
    trajectories: Optional[dict[str, str]] = Field(None, description="split -> trajectory store; missing ones "
                                                                     "are collected")
    behavior: Optional[str] = Field(None, description="checkpoint that collects missing trajectories "
                                                      "(default: the scored model)")
    projection: ProjectionSpec = Field(ProjectionSpec(), validation_alias=AliasChoices("projection", "spec"))
    loss: LossOptions = LossOptions()
    collect: CollectOptions = CollectOptions()
    fusion: Literal["rrf", "max"] = _RANK["fusion"]
    select_fraction: float = Field(_RANK["select_fraction"].default, gt=0, le=1,
                                   description=_RANK["select_fraction"].description,
                                   validation_alias=AliasChoices("select_fraction", "top_fraction", "fraction"))
    max_validation: int = _RANK["max_validation"]
    seed: int = _RANK["seed"]
    gradient_dtype: Dtype = Field("float16", description="stored vector dtype",
                                  validation_alias=AliasChoices("gradient_dtype", "dtype"))
    device: str = Field("auto", description="torch device for gradients ('auto': cuda when present)")
    validation_groups: Literal["none", "answer"] = Field(
        "none", description="'answer': one validation vector per answer label of each set, all fused (against "
                            "label skew on short-answer tasks; see cropi.scoring.diagnostics)")

    @field_validator("validation")
    @classmethod
    def _check_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if name == POOL or not is_name(name):
                raise ValueError(f"validation set name {name!r} must be {NAME_HELP} and not {POOL!r}")
        return v

    @property
    def splits(self) -> dict[str, str]:
        """Split name -> prompt file: the pool first, then the validation sets."""
        return {POOL: self.pool, **self.validation}


class ScoreResult(BaseModel):
    """What one scoring did and where its output lies."""

    name: str = Field(description="checkpoint name in the store")
    spec_id: str
    trajectories: dict[str, str] = Field(description="split -> trajectory store used")
    computed: dict[str, dict[str, int]] = Field(description="split -> gradient rows computed now, by status")
    excluded: dict[str, int] = Field(description="pool prompts left unranked, by status")
    ranked: int
    selected: list[str] = Field(description="the selected pool prompts, best first")
    ranking: str = Field(description="the stored ranking file (its 'selected' column is ``selected``)")
    diagnostics: dict = Field(default_factory=dict, description="the selection's data-source and answer-label mix "
                                                                "against the pool, with warnings")


def score_checkpoint(request: ScoreRequest, *, root: str | Path, progress: Progress | None = None) -> ScoreResult:
    """Score ``request.model`` under ``root`` (store at ``root/store``): collect, gradients, rank, select."""
    if not request.validation:
        raise InvalidInputError("name at least one validation set: the pool is ranked by its influence on them")
    progress = report(progress)
    store = store_path(root)
    trajectories = ensure_trajectories(request, root, progress)
    jobs = gradient_jobs(request, root, trajectories)
    computed = {job.split: compute_gradients(job, progress)["computed"] for job in jobs}
    name = jobs[0].checkpoint_name
    groups = ({split: {r.prompt_id: r.answer for r in load_prompts(path)} for split, path in request.validation.items()}
              if request.validation_groups == "answer" else None)
    result = rank(store, name, POOL, list(request.validation), fusion=request.fusion,
                  top_fraction=request.select_fraction, spec_id=request.projection.spec_id,
                  max_validation=request.max_validation, seed=request.seed, groups=groups,
                  labels=pool_labels(load_prompts(request.pool)))
    _, path = ranking_path(store, name, request.projection.spec_id, POOL)
    return ScoreResult(name=name, spec_id=request.projection.spec_id, trajectories=trajectories, computed=computed,
                       excluded=result.excluded, ranked=int((result.ranking.rank > 0).sum()),
                       selected=selected_ids(result), ranking=path, diagnostics=result.meta.get("selection", {}))


def selected_ids(result: RankingResult) -> list[str]:
    """The prompts the ranking selected, best first (the table is in rank order)."""
    return [p for p, s in zip(result.table["prompt_id"].to_pylist(), result.table[SELECTED].to_pylist()) if s]


def store_path(root: str | Path) -> str:
    return str(Path(root).resolve() / "store")


# ---------------------------------------------------------------- trajectories


def collect_jobs(request: ScoreRequest, root: str | Path, splits: Optional[dict[str, str]] = None
                 ) -> dict[str, CollectJob]:
    """The collect job of each split (default: every split) at its content-keyed store path."""
    behavior = request.behavior or request.model
    fingerprint = model_fingerprint(behavior)
    opts = request.collect
    jobs = {}
    for split, prompts in (splits or request.splits).items():
        sampling = opts.sampling(opts.pool_samples if split == POOL else opts.validation_samples)
        key = short_hash({"model": fingerprint, "prompts": prompts_fingerprint(load_prompts(prompts)),
                          "sampling": sampling.model_dump(), "reward": opts.reward, "backend": opts.backend})
        jobs[split] = CollectJob(model=behavior, prompts=prompts, sampling=sampling, backend=opts.backend,
                                 reward=opts.reward, batch_prompts=opts.batch_prompts, engine=opts.engine,
                                 out=str(Path(root).resolve() / "trajectories" / key / split))
    return jobs


def ensure_trajectories(request: ScoreRequest, root: str | Path, progress: Progress) -> dict[str, str]:
    """Split -> trajectory store: the given ones checked, the missing ones collected (one engine).

    No engine starts when every store is already complete (the usual case on a rerun).
    """
    given = dict(request.trajectories or {})
    unknown = sorted(set(given) - set(request.splits))
    if unknown:
        raise MismatchError(f"trajectories given for {unknown}, which are neither the pool nor a validation set "
                            f"({sorted(request.validation)}): name them as the request does")
    for split, path in given.items():
        check_trajectories(split, path, request.splits[split])
    missing = {s: p for s, p in request.splits.items() if s not in given}
    jobs = collect_jobs(request, root, missing) if missing else {}
    todo = [job for job in jobs.values() if not _complete(job)]
    if todo:
        with make_backend(request.collect.backend, todo[0].model, request.collect.engine) as backend:
            for job in todo:
                collect(job, progress, backend=backend)
    for split, job in jobs.items():
        check_trajectories(split, job.out, job.prompts)
    return {split: given[split] if split in given else jobs[split].out for split in request.splits}


def check_trajectories(split: str, path: str, prompts: str) -> None:
    """The store at ``path`` holds exactly the prompts of the file ``prompts``; else a MismatchError."""
    store = TrajectoryStore.open(path)
    records = load_prompts(prompts)
    want, have = {r.prompt_id for r in records}, store.committed_prompt_ids()
    recorded = store.identity.get("prompts_fingerprint")
    if want == have and recorded in (None, prompts_fingerprint(records)):
        return
    lacking, foreign = sorted(want - have), sorted(have - want)
    raise MismatchError(
        f"the trajectories of split {split!r} at {path} do not match its prompt file {prompts}: the file has "
        f"{len(want)} prompts, the store {len(have)} ({len(lacking)} missing, e.g. {lacking[:3]}; {len(foreign)} "
        f"not in the file, e.g. {foreign[:3]})" + ("" if want != have else "; the prompt texts differ") +
        f". Pass the trajectories collected from {prompts}, or leave {split!r} out of 'trajectories' to have "
        "them collected")


def _complete(job: CollectJob) -> bool:
    """Whether the job's store already holds every prompt of its prompt file."""
    try:
        store = TrajectoryStore.open(job.out)
    except NotFoundError:
        return False
    return {r.prompt_id for r in load_prompts(job.prompts)} <= store.committed_prompt_ids()


# ---------------------------------------------------------------- gradients


def gradient_jobs(request: ScoreRequest, root: str | Path, trajectories: dict[str, str]) -> list[GradientJob]:
    """The gradients job of every split (pool first), all under one checkpoint name."""
    name = request.name or checkpoint_name(request, trajectories)
    return [GradientJob(model=request.model, trajectories=trajectories[split], store=store_path(root),
                        split=split, name=name, projection=request.projection, loss=request.loss,
                        gradient_dtype=request.gradient_dtype, device=request.device)
            for split in request.splits]


def checkpoint_name(request: ScoreRequest, trajectories: dict[str, str]) -> str:
    """The naming rule of an unnamed checkpoint: its fingerprint and a hash of how it is scored.

    The same checkpoint scored over the same trajectories with the same loss and dtype gets
    the same name, so its gradients are computed once for every caller under the root.
    """
    setup = {"trajectories": sorted(trajectories.items()), "loss": request.loss.model_dump(),
             "dtype": request.gradient_dtype}
    if request.validation_groups != "none":  # its own ranking file, never overwriting the plain one
        setup["validation_groups"] = request.validation_groups
    setup = short_hash(setup)
    return f"{model_fingerprint(request.model)}-{setup[:8]}"
