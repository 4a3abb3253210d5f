"""The gradients job: POPI gradients of one split at one checkpoint into the store.

Resumable (prompts already committed are skipped) and shardable (``shard=(i, n)``
takes the prompts whose id hashes to i, so n workers can share one store).

The model runs in the dtype and with the attention ``model_options`` name ('auto': float32 and eager
on CPU, bfloat16 and sdpa on CUDA; cropi.gradients.options.ModelOptions); a projection left out is
the default spec of the device the job runs on (cropi.projection.spec.default_spec).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from cropi.contracts import NAME_PATTERN, VectorDtype
from cropi.errors import CropiError, InvalidInputError
from cropi.gradients import LossOptions, make_computer
from cropi.gradients.options import ModelOptions
from cropi.models.loading import load_causal_lm, load_tokenizer
from cropi.pipeline.checks import check_tokenizer_matches, check_token_ids_fit
from cropi.pipeline.progress import Progress, report
from cropi.pipeline.sharding import in_shard, parse_shard, writer_id
from cropi.projection import ProjectionSpec, make_projector
from cropi.projection.spec import DEFAULT_SPEC, default_spec, is_batched
from cropi.store import CheckpointRef, GradientStore, TrajectoryStore
from cropi.utils.fingerprint import model_fingerprint
from cropi.utils.hashing import SPACED, short_hash
from cropi.utils.device import resolve_device


class GradientJob(BaseModel):
    """Everything the gradients job needs; the CLI, Ray and the service all build one."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model: str = Field(min_length=1, description="checkpoint to score (Hugging Face folder)")
    trajectories: str = Field(min_length=1, description="trajectory store made by `cropi collect`")
    store: str = Field(min_length=1, description="gradient store directory or pyarrow URI")
    split: str = Field(pattern=NAME_PATTERN, description="name of this prompt set in the store (pool, gsm8k, ...)")
    name: Optional[str] = Field(None, pattern=NAME_PATTERN, description="checkpoint name; default: model folder name")
    projection: ProjectionSpec = Field(DEFAULT_SPEC, validation_alias=AliasChoices("projection", "spec"))
    loss: LossOptions = LossOptions()
    model_options: ModelOptions = ModelOptions()
    shard: tuple[int, int] = Field((0, 1), description="(i, n): this worker's share of the prompts")
    gradient_dtype: VectorDtype = Field("float16", description="stored vector dtype",
                                                   validation_alias=AliasChoices("gradient_dtype", "dtype"))
    device: str = Field("auto", description="torch device ('auto': cuda when present)")
    rows_per_shard: int = Field(64, gt=0, description="prompts per committed shard")

    @property
    def checkpoint_name(self) -> str:
        return self.name or Path(self.model).resolve().name

    def on_device(self, device: str) -> "GradientJob":
        """The job as it runs on ``device``: a projection left out is that device's default spec."""
        if "projection" in self.model_fields_set:
            return self
        return self.model_copy(update={"projection": default_spec(device)})


def open_split(job: GradientJob, projector, trajectories: TrajectoryStore, fingerprint: str, device: str = "cpu"):
    spec, extra = _identity(job, trajectories, device)
    extra |= {"n_kept": projector.n_kept, "n_coords": projector.n_coords}
    return GradientStore(job.store).split(CheckpointRef(name=job.checkpoint_name, fingerprint=fingerprint),
                                          spec, job.split, dim=projector.out_dim, dtype=job.gradient_dtype, extra=extra)


def _identity(job: GradientJob, trajectories: TrajectoryStore, device: str) -> tuple[dict, dict]:
    """The split's spec and the part of its ``extra`` that needs no projector (``open_split`` adds the
    projector's counts, which the spec and the model's shapes decide)."""
    spec = job.projection.model_dump() | {"spec_id": job.projection.spec_id}
    extra = {"loss": job.loss.recorded(), "trajectories": _identity_hash(trajectories.identity)}
    model = job.model_options.recorded(device)
    if model:  # float32 with eager attention records nothing: stores made before the option still match
        extra["model"] = model
    return spec, extra


def _already_done(job: GradientJob, trajectories: TrajectoryStore, mine: list[str], fingerprint: str,
                  device: str) -> dict | None:
    """The job's result when its split already holds every prompt of ``mine``, computed as this job would
    compute them (the same checkpoint fingerprint, spec, loss, trajectories, model options and dtype);
    None otherwise, and the job runs as usual (which names any mismatch). So a checkpoint scored again (`cropi
    score` with another selector or fraction, a resumed curriculum or scoring job) loads no model and no
    tokenizer: at 1.5B that is seconds a split. The projector's counts are left out of the comparison: the
    spec and the model's shapes decide them, and the fingerprint pins the model."""
    try:
        stored = GradientStore(job.store).open_split(job.checkpoint_name, job.projection.spec_id, job.split)
        identity = stored.dataset.identity
    except CropiError:  # no such split yet (or one unreadable: the usual path says what is wrong)
        return None
    spec, extra = _identity(job, trajectories, device)
    kept = {k: v for k, v in (identity.get("extra") or {}).items() if k not in ("n_kept", "n_coords")}
    same = (identity.get("checkpoint") == CheckpointRef(name=job.checkpoint_name, fingerprint=fingerprint).model_dump()
            and identity.get("spec") == spec and identity.get("dtype") == job.gradient_dtype and kept == extra)
    if not same or not set(mine) <= stored.committed_prompt_ids():
        return None
    return _result(job, {}, len(mine), len(mine))


def _result(job: GradientJob, counts: dict, skipped: int, total: int) -> dict:
    return {"split": job.split, "checkpoint": job.checkpoint_name, "spec_id": job.projection.spec_id,
            "computed": counts, "skipped": skipped, "total": total}


def compute_gradients(job: GradientJob, progress: Progress | None = None) -> dict:
    """Run (or resume) the job; returns counts by status of what this call computed."""
    progress = report(progress)
    shard = parse_shard(job.shard)
    device = resolve_device(job.device)
    job = job.on_device(device)
    if job.model_options.checkpoint_layers and not is_batched(job.projection):
        raise InvalidInputError(f"checkpoint_layers applies to the batched kinds (factored, tensorsketch), not kind "
                                f"{job.projection.kind!r}: leave it off, or project with the default spec")
    trajectories = TrajectoryStore.open(job.trajectories)
    mine = sorted(p for p in trajectories.committed_prompt_ids() if in_shard(p, shard))
    stage = f"gradients:{job.split}"
    fingerprint = model_fingerprint(job.model)
    done = _already_done(job, trajectories, mine, fingerprint, device)
    if done is not None:
        progress(stage, len(mine), len(mine))
        return done
    check_tokenizer_matches(trajectories.identity, load_tokenizer(job.model), job.model)
    dtype, attention = job.model_options.resolve(device)
    model = load_causal_lm(job.model, device=device, dtype=dtype, attn_implementation=attention)
    projector = make_projector(job.projection, {n: tuple(p.shape) for n, p in model.named_parameters()}, device=device)
    split = open_split(job, projector, trajectories, fingerprint, device)
    computer = make_computer(model, projector, job.loss)  # the factored kind batches many prompts a backward
    computer.checkpoint_layers = job.model_options.checkpoint_layers
    counts: dict[str, int] = {}
    # what is done is read once the writer is ours: another process writing this shard may have just finished it
    with split.writer(writer_id(shard), rows_per_shard=job.rows_per_shard) as writer:
        done = split.committed_prompt_ids()
        todo = [p for p in mine if p not in done]
        done_n = len(mine) - len(todo)
        progress(stage, done_n, len(mine))
        for batch in _batches(trajectories.iter_prompts(todo), computer.prompts_per_call):
            for traj in batch:
                check_token_ids_fit(traj, model.config.vocab_size)
            for res in computer.compute_many(batch):
                writer.write(res)
                counts[res.status] = counts.get(res.status, 0) + 1
            done_n += len(batch)
            progress(stage, done_n, len(mine))
    return _result(job, counts, len(mine) - len(todo), len(mine))


def _batches(items, size: int):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _identity_hash(identity: dict) -> str:
    return short_hash(identity, separators=SPACED)  # spaced: the hash already in stores' identities
