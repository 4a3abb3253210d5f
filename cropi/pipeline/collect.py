"""The collect job: K responses per prompt from the behavior checkpoint, with their
raw log-probs and verifiable rewards, into a trajectory store.

Every prompt is checked (renders, fits the context) before anything is written, so
bad input leaves the store as it was. Resumable: committed prompts are skipped.
"""

from __future__ import annotations

from typing import Optional

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from cropi.contracts import Backend
from cropi.data import load_prompts, prompts_fingerprint
from cropi.errors import NotFoundError
from cropi.generation import EngineOptions, SamplingConfig, make_backend
from cropi.generation.options import CollectOptions
from cropi.generation.prompting import check_prompt_fits, render_prompt
from cropi.models.loading import load_tokenizer
from cropi.pipeline.checks import tokenizer_fingerprint
from cropi.pipeline.progress import Progress, report
from cropi.pipeline.sharding import in_shard, parse_shard, writer_id
from cropi.rewards import get_reward, score_responses
from cropi.store import TrajectoryStore
from cropi.utils.fingerprint import model_fingerprint


_OPTS = CollectOptions.model_fields
GPU_BATCH_PROMPTS, CPU_BATCH_PROMPTS = 256, 32


class CollectJob(BaseModel):
    """One prompt file's collection into one trajectory store (defaults: ``CollectOptions``')."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model: str = Field(min_length=1, description="behavior checkpoint (Hugging Face folder)")
    prompts: str = Field(min_length=1, description="prompt file: jsonl, parquet or verl parquet")
    out: str = Field(min_length=1, description="trajectory store directory or pyarrow URI")
    sampling: SamplingConfig = SamplingConfig()
    backend: Backend = _OPTS["backend"]
    reward: str = _OPTS["reward"]
    shard: tuple[int, int] = Field((0, 1), description="(i, n): this worker's share of the prompts")
    batch_prompts: Optional[int] = Field(None, gt=0, description="prompts handed to the backend at once (and "
                                         "committed as one shard); default 256 on a GPU, 32 on CPU")
    engine: EngineOptions = Field(EngineOptions(), validation_alias=AliasChoices("engine", "backend_options"))


def collect(job: CollectJob, progress: Progress | None = None, backend=None) -> dict:
    """Run (or resume) collection. ``backend`` may be passed to reuse a started engine."""
    progress = report(progress)
    shard = parse_shard(job.shard)
    reward_fn = get_reward(job.reward)
    tokenizer = load_tokenizer(job.model)
    everything = load_prompts(job.prompts)
    records = [r for r in everything if in_shard(r.prompt_id, shard)]
    rendered = {r.prompt_id: render_prompt(tokenizer, r.prompt) for r in records}
    if job.batch_prompts is None:
        job = job.model_copy(update={"batch_prompts": default_batch_prompts()})
    own = backend is None
    backend = backend or make_backend(job.backend, job.model, job.engine)
    try:
        for r in records:  # every prompt checked before the store is touched
            check_prompt_fits(len(rendered[r.prompt_id]), job.sampling.max_new_tokens, backend.max_model_len,
                              r.prompt_id)
        identity = {"kind": "trajectories",
                    "model": {"path": job.model, "fingerprint": model_fingerprint(job.model)},
                    "tokenizer": tokenizer_fingerprint(tokenizer), "sampling": job.sampling.model_dump(),
                    "seed": job.sampling.seed, "backend": job.backend, "reward": job.reward,
                    # The dtype the behavior log-probs were computed in (vLLM: the teacher-forced float32).
                    "logprob_dtype": getattr(backend, "logprob_dtype", "float32"),
                    "prompts_fingerprint": prompts_fingerprint(everything)}
        store = TrajectoryStore.create_or_open(job.out, identity)
        # what is done is read once the writer is ours: another process collecting this shard may have just
        # finished it
        with store.writer(writer_id(shard), prompts_per_shard=job.batch_prompts) as writer:
            done = store.committed_prompt_ids()
            todo = [r for r in records if r.prompt_id not in done]
            progress("collect", len(records) - len(todo), len(records))
            _run(writer, backend, todo, rendered, job, reward_fn, shard, progress, len(records) - len(todo),
                 len(records))
    finally:
        if own:
            backend.close()
    return {"collected": len(todo), "skipped": len(records) - len(todo), "total": len(records)}


def collected(job: CollectJob) -> bool:
    """Whether the job's store already holds every prompt of its prompt file (of its shard): then the
    job has nothing to do, and no engine need start for it (a vLLM engine takes tens of seconds)."""
    try:
        store = TrajectoryStore.open(job.out)
    except NotFoundError:
        return False
    shard = parse_shard(job.shard)
    return {r.prompt_id for r in load_prompts(job.prompts) if in_shard(r.prompt_id, shard)} <= \
        store.committed_prompt_ids()


def default_batch_prompts() -> int:
    """Prompts per generate call: a GPU engine batches many sequences at once, a CPU one few."""
    import torch

    return GPU_BATCH_PROMPTS if torch.cuda.is_available() else CPU_BATCH_PROMPTS


def _run(writer, backend, todo, rendered, job, reward_fn, shard, progress, start, total) -> None:
    for b in range(0, len(todo), job.batch_prompts):
        batch = todo[b:b + job.batch_prompts]
        outputs = backend.generate([rendered[r.prompt_id] for r in batch],
                                   [r.prompt_id for r in batch], job.sampling)
        for record, samples in zip(batch, outputs):
            rewards = score_responses(reward_fn, [s.text for s in samples], record.answer)
            writer.commit_prompt_rows([_row(record.prompt_id, rendered[record.prompt_id], k, s, rw)
                                       for k, (s, rw) in enumerate(zip(samples, rewards))])
        _record_drift(job, shard, batch, backend)
        progress("collect", start + b + len(batch), total)


def _record_drift(job, shard, batch, backend) -> None:
    """The largest |engine - teacher-forced| log-prob of each batch (one shard), beside the store."""
    drift = getattr(backend, "last_logprob_drift", None)
    if drift is None:
        return
    from cropi.utils.fsio import resolve, write_json_atomic

    fs, root = resolve(job.out)
    path = f"{root}/logprob_drift/{writer_id(shard)}-{batch[0].prompt_id}.json"
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    write_json_atomic(fs, path, {"prompts": [r.prompt_id for r in batch], "max_abs_diff": drift})


def _row(prompt_id, prompt_ids, k, sample, reward) -> dict:
    return {"prompt_id": prompt_id, "sample_index": k, "prompt_token_ids": prompt_ids,
            "response_token_ids": list(sample.token_ids), "behavior_logprobs": list(sample.logprobs),
            "response_text": sample.text, "reward": reward, "finish_reason": sample.finish_reason}

