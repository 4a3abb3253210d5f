"""Supervised warm-start of a tiny model on the arithmetic task.

RL from verifiable rewards learns nothing from a policy that never (or always)
answers correctly: every GRPO group then has zero advantage. A freshly built
tiny model never does, so the demo first teaches it the answer format and some
arithmetic with a supervised run on the task's answers, stopped while the
targeted skills are still partly learned (sampled accuracy 20-50%, pass@8 well
above): GRPO at this scale sharpens what the model can already sample.

Plain torch: teacher-forced cross-entropy on the response tokens only (the
prompt is rendered through the chat template exactly as generation renders it),
AdamW with a linear warm-up and cosine decay. Deterministic in ``seed``: the
model, the tokenizer, the batch order and the updates all derive from it.

Thread policy: a build always runs at ``TORCH_THREADS`` torch threads, whatever the
caller's process was set to (restored afterwards). A float32 reduction split over two
threads adds in another order than over one, so a model trained at the machine's core
count differs in its last bits from one trained at 1 thread, and after hundreds of
steps in its sampled accuracy too: the recipe, not the launcher, must decide the model.
The instruction set torch dispatches to (``ATEN_CPU_CAPABILITY``) changes the bits as
well and cannot be changed inside a running process: see docs/demo.md, "What is
reproducible across machines".
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Literal, Sequence

import torch

from cropi.data.records import PromptRecord, as_messages
from cropi.errors import InvalidInputError
from cropi.models import build_tiny_model, load_causal_lm, load_tokenizer
from cropi.models.tiny import IM_END, IM_START, default_corpus

# The one thread count of every model build and every demo phase (cropi.demo.work.init_worker): one
# thread is also the fastest for models this small, where thread start-up outweighs the arithmetic.
TORCH_THREADS = 1
Log = Callable[[str], None]
Answer = Callable[[PromptRecord], str]  # the response the warm start teaches for a record
Snapshot = Callable[[int, object, object], bool]  # (steps done, model in eval mode, tokenizer) -> stop here


def _answer(record: PromptRecord) -> str:
    return record.answer


class WarmStartError(InvalidInputError):
    """The warm-start cannot run with the given settings."""


@dataclass(frozen=True)
class WarmStartConfig:
    """Settings of one supervised warm-start run."""

    size: Literal["tiny", "small"] = "tiny"
    steps: int = 400
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.01
    seed: int = 0
    stop_at: int | None = None  # stop after this many steps of the ``steps``-long schedule

    @property
    def steps_run(self) -> int:
        return self.steps if self.stop_at is None else min(self.stop_at, self.steps)

    def check(self) -> None:
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise WarmStartError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise WarmStartError(f"lr must be > 0, got {self.lr}")


def set_threads(n: int) -> None:
    """Set torch's intra-op thread count, even where vLLM's in-process CPU worker has replaced
    ``torch.set_num_threads`` with a no-op (vllm/v1/worker/cpu_worker.py does, after binding its
    threads): the builtin itself is called, so the thread policy holds in any process."""
    torch._C.set_num_threads(n)


@contextlib.contextmanager
def torch_threads(n: int = TORCH_THREADS):
    """Run the block at ``n`` torch threads (intra-op, which also sets MKL's), then give the caller
    back its own count."""
    if n < 1:
        raise WarmStartError(f"torch threads must be >= 1, got {n}")
    before = torch.get_num_threads()
    set_threads(n)
    try:
        yield
    finally:
        set_threads(before)


def numerics() -> dict:
    """What decides a build's bits besides its recipe: recorded beside the model, as a rebuild
    is byte-identical only where these agree (docs/demo.md, "What is reproducible across machines")."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability().lower(),
            "torch_threads": TORCH_THREADS}


def task_corpus(records: Sequence[PromptRecord], seed: int, answer: Answer = _answer) -> Iterator[str]:
    """Text the tokenizer is trained on: the builder's default corpus plus chat-formatted task dialogues,
    so the task's words become single tokens and sequences stay short."""
    yield from default_corpus(seed)
    for r in records:
        question = r.prompt if isinstance(r.prompt, str) else r.prompt[-1]["content"]
        yield (f"{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n"
               f"{answer(r)}{IM_END}\n")


def warm_start(out_dir: str | Path, records: Sequence[PromptRecord], config: WarmStartConfig = WarmStartConfig(),
               *, answer: Answer = _answer, log: Log | None = None, snapshot: Snapshot | None = None,
               snapshot_every: int = 100) -> dict:
    """Build a tiny model into ``out_dir`` and fine-tune it to answer ``records`` with ``answer(record)``.

    Returns a summary: steps, final loss, wall seconds. ``out_dir`` ends up holding a
    Hugging Face folder (safetensors weights, tokenizer, chat template). ``snapshot`` is
    called every ``snapshot_every`` steps with the model (in eval mode, under no_grad), as
    the design criteria pick the stopping step; it must not change the model, and training
    stops there when it returns True (the model saved is then the one it saw).
    Runs at ``TORCH_THREADS`` threads whatever the caller's setting (the module's thread policy).
    """
    config.check()
    if not records:
        raise WarmStartError("no records to warm-start on: pass the task's training prompts")
    say = log or (lambda _msg: None)
    out = Path(out_dir)
    started = time.perf_counter()
    with torch_threads():
        build_tiny_model(out, size=config.size, seed=config.seed, corpus=task_corpus(records, config.seed, answer))
        tokenizer = load_tokenizer(out)
        examples = [encode_example(tokenizer, r, answer) for r in records]
        model = load_causal_lm(out).train()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            watch = None if snapshot is None else (snapshot_every, lambda step: snapshot(step, model, tokenizer))
            losses = _train(model, examples, config, tokenizer.pad_token_id, say, watch)
        model.eval()
        model.save_pretrained(out, safe_serialization=True)
    summary = {"steps": len(losses), "loss_first": losses[0], "loss_last": sum(losses[-20:]) / len(losses[-20:]),
               "examples": len(examples), "seconds": round(time.perf_counter() - started, 2),
               "numerics": numerics()}
    say(f"warm-start: {len(losses)} steps, loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}, "
        f"{summary['seconds']:.1f}s")
    return summary


def encode_example(tokenizer, record: PromptRecord, answer: Answer = _answer) -> tuple[list[int], int]:
    """(prompt + solution + end-of-turn token ids, number of prompt tokens).

    The prompt goes through the chat template with the assistant turn opened, exactly as
    cropi.generation renders prompts for sampling (a test checks they agree).
    """
    prompt = _ids(tokenizer.apply_chat_template(as_messages(record.prompt), add_generation_prompt=True,
                                                tokenize=True))
    response = tokenizer.encode(answer(record), add_special_tokens=False)
    return prompt + response + [tokenizer.convert_tokens_to_ids(IM_END)], len(prompt)


def _ids(rendered) -> list[int]:
    # a list, or a BatchEncoding holding input_ids, depending on the transformers version
    return [int(i) for i in (rendered["input_ids"] if hasattr(rendered, "keys") else rendered)]


def _train(model, examples, config: WarmStartConfig, pad_id: int, say: Log, watch=None) -> list[float]:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, config))
    losses: list[float] = []
    for step, batch in enumerate(_batches(examples, config.batch_size, config.seed, config.steps_run)):
        ids, labels, mask = _collate(batch, pad_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if (step + 1) % 50 == 0:
            say(f"warm-start step {step + 1}/{config.steps_run}: loss {sum(losses[-50:]) / 50:.3f}")
        if watch and (step + 1) % watch[0] == 0 and _look(model, watch[1], step + 1):
            break
    return losses


def _look(model, fn, step: int) -> bool:
    """Run a snapshot callback on the model in eval mode without touching the training RNG stream."""
    model.eval()
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        stop = bool(fn(step))
    model.train()
    return stop


def _lr_factor(step: int, config: WarmStartConfig) -> float:
    if step < config.warmup:
        return (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _batches(examples: list, size: int, seed: int, steps: int) -> Iterable[list]:
    """``steps`` batches, epochs reshuffled from ``seed``."""
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < size:
            fresh = list(range(len(examples)))
            rng.shuffle(fresh)
            order.extend(fresh)
        yield [examples[i] for i in order[:size]]
        del order[:size]


def _collate(batch, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, labels with -100 on prompt and padding, attention mask."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (seq, n_prompt) in enumerate(batch):
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, n_prompt:len(seq)] = torch.tensor(seq[n_prompt:])
        mask[i, :len(seq)] = 1
    return ids, labels, mask
