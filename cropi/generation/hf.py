"""Generation with transformers: a plain sampling loop over a KV cache.

Our own loop rather than ``model.generate`` because each response needs its own
seeded ``torch.Generator`` (``generate`` takes none) and the raw logits of every
step. Response ``k`` of a prompt draws its noise from a generator seeded with
``prompt_seed(cfg.seed, key) + k``, as vLLM seeds its parallel samples, so a
prompt's responses depend neither on its batch neighbours nor on K.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from cropi.generation.base import (GenerationBackend, GenerationError, Sample, SamplingConfig, check_batch,
                                   prompt_seed)
from cropi.generation.prompting import check_prompt_fits
from cropi.utils.device import resolve_device
from cropi.generation.stopping import stop_token_ids


@dataclass
class _Rows:
    """Per-row state of one batch of responses (row = prompt index * K + sample index)."""

    generators: list[torch.Generator]
    tokens: list[list[int]]
    logprobs: list[list[float]]
    stopped: list[bool]


class HFBackend(GenerationBackend):
    """Samples with a transformers causal LM, batching prompts with left padding.

    Options: ``device`` ("cpu", "cuda", "auto"), ``dtype`` ("float32" default: the
    behavior log-probs must match teacher forcing), ``max_batch_rows`` (responses
    decoded together; whole prompts are never split across batches), and
    ``attn_implementation`` ("sdpa" default: about 25% less CPU time than eager here).
    """

    def __init__(self, model_path: str | Path, *, device: str = "cpu", dtype: str = "float32",
                 max_batch_rows: int = 64, attn_implementation: str = "sdpa") -> None:
        from cropi.models.loading import load_causal_lm, load_tokenizer

        if max_batch_rows <= 0:
            raise GenerationError(f"max_batch_rows must be positive, got {max_batch_rows}")
        self.device = torch.device(resolve_device(device))
        self.model = load_causal_lm(model_path, device=self.device, dtype=dtype,
                                    attn_implementation=attn_implementation)
        self.tokenizer = load_tokenizer(model_path)
        self.max_batch_rows = max_batch_rows
        self.stop_ids = stop_token_ids(model_path, self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.stop_ids)
        self.max_model_len = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    @classmethod
    def from_model(cls, model, tokenizer, stop_ids: set[int], *, max_batch_rows: int = 256) -> "HFBackend":
        """A backend over an already loaded model (a trainer's live policy): the same decode loop."""
        backend = cls.__new__(cls)
        backend.device, backend.model, backend.tokenizer = model.device, model, tokenizer
        backend.max_batch_rows, backend.stop_ids = max_batch_rows, set(stop_ids)
        backend.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop_ids)
        backend.max_model_len = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        return backend

    def generate(self, prompts: list[list[int]], keys: list[str], cfg: SamplingConfig) -> list[list[Sample]]:
        if self.model is None:
            raise GenerationError("this backend was closed: make a new one with make_backend")
        check_batch(prompts, keys)
        for ids, key in zip(prompts, keys):
            check_prompt_fits(len(ids), cfg.max_new_tokens, self.max_model_len, key)
        out: list[list[Sample]] = []
        per_batch = max(1, self.max_batch_rows // cfg.samples)
        for start in range(0, len(prompts), per_batch):
            chunk = slice(start, start + per_batch)
            out.extend(self._generate_batch(prompts[chunk], keys[chunk], cfg))
        return out

    def close(self) -> None:
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], keys: list[str], cfg: SamplingConfig) -> list[list[Sample]]:
        k = cfg.samples
        seeds = [prompt_seed(cfg.seed, key) + j for key in keys for j in range(k)]
        n_rows = len(seeds)
        state = _Rows(generators=[_generator(s, self.device) for s in seeds], tokens=[[] for _ in range(n_rows)],
                      logprobs=[[] for _ in range(n_rows)], stopped=[False] * n_rows)
        self._decode(prompts, k, state, cfg)
        samples = [self._sample(state, i) for i in range(n_rows)]
        return [samples[p * k:(p + 1) * k] for p in range(len(prompts))]

    def _decode(self, prompts: list[list[int]], k: int, state: _Rows, cfg: SamplingConfig) -> None:
        """Prefill each prompt once, copy its cache K times, then decode the rows still running."""
        from transformers import DynamicCache

        input_ids, mask = _left_pad(prompts, self.pad_id, self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(input_ids, mask, positions, cache).repeat_interleave(k, dim=0)
        cache.batch_repeat_interleave(k)
        mask, positions = mask.repeat_interleave(k, dim=0), positions[:, -1:].repeat_interleave(k, dim=0)
        live = torch.arange(len(state.generators), device=self.device)  # rows of `state` still decoding
        stop = torch.tensor(sorted(self.stop_ids), device=self.device)
        for step in range(cfg.max_new_tokens):
            raw = torch.log_softmax(logits, dim=-1)  # the behavior log-prob: temperature 1, no top-p
            rows = live.tolist()
            chosen = _sample_tokens(logits, cfg, [state.generators[i] for i in rows])
            hit = torch.isin(chosen, stop)
            _record(state, rows, chosen.tolist(), raw.gather(1, chosen[:, None])[:, 0].tolist(), hit.tolist())
            if step + 1 == cfg.max_new_tokens or bool(hit.all()):
                break
            if bool(hit.any()):  # drop finished rows from the batch and the cache
                keep = (~hit).nonzero()[:, 0]
                cache.batch_select_indices(keep)
                live, chosen, mask, positions = live[keep], chosen[keep], mask[keep], positions[keep]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
            positions = positions + 1
            logits = self._forward(chosen[:, None], mask, positions, cache)

    def _forward(self, input_ids, mask, positions, cache) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def _sample(self, state: _Rows, i: int) -> Sample:
        ids = state.tokens[i]
        reason = "stop" if state.stopped[i] else "length"
        return Sample(token_ids=ids, logprobs=state.logprobs[i], finish_reason=reason,
                      text=self.tokenizer.decode(ids, skip_special_tokens=True))


def _record(state: _Rows, rows: list[int], chosen: list[int], picked: list[float], hit_stop: list[bool]) -> None:
    for i, tok, lp, hit in zip(rows, chosen, picked, hit_stop):
        state.tokens[i].append(tok)
        state.logprobs[i].append(lp)
        state.stopped[i] = hit


def _sample_tokens(logits: torch.Tensor, cfg: SamplingConfig, generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row: greedy at temperature 0, else temperature + top-p sampling."""
    if cfg.temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(_top_p(logits / cfg.temperature, cfg.top_p), dim=-1)
    noise = torch.empty_like(probs)
    for i, g in enumerate(generators):
        noise[i].exponential_(generator=g)
    # argmax(p / E) with E ~ Exp(1) draws exactly from p (the exponential race).
    return (probs / noise).argmax(dim=-1)


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask all but the smallest set of most likely tokens whose mass reaches ``top_p``."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
    drop_sorted = before >= top_p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def _generator(seed: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g

