"""The embedded trainer: trl's GRPOTrainer on one machine, CPU or one GPU.

One call trains one curriculum stage. The policy starts from the given
checkpoint; the KL reference is always the run's initial model (as in a verl run
that resumes across stages); the AdamW state of the previous stage is loaded when
that stage was trained here too, and global steps keep counting. The stage's
prompts come from the verl RLVR parquet the selector wrote; the reward is a
``cropi.rewards`` function applied to each completion and the row's answer.

Layout of ``out_dir``::

    checkpoint/          Hugging Face folder: weights, config, tokenizer, cropi_stage.json
    trainer_state/       optimizer.pt (carried into the next stage)
    metrics.jsonl        one JSON object per optimizer step
    train.log            readable per-step lines and trl/transformers warnings
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from cropi.errors import InvalidInputError
from cropi.trainers.base import GrpoOptions, StageResult, TrainerAdapter, check_stage_args
from cropi.trainers.carry import adamw, save_stage
from cropi.trainers.lineage import StageMarker, read_marker
from cropi.utils.device import resolve_device

NAME = "trl"
# Loggers whose warnings go into the stage's train.log.
_LIBRARY_LOGGERS = ("trl", "transformers", "accelerate")


class TrlOptions(GrpoOptions):
    """GRPO on trl. Defaults suit a small model on a CPU; raise them on a GPU.

    ``micro_batch``: completions per forward/backward pass (default: the whole
    step, ``batch_prompts * rollouts``); it must divide that product, and the
    rest is gradient accumulation, so one optimizer step still sees every
    prompt's whole group. ``loss_type="dapo"`` averages over all tokens of the
    step, like verl's ``token-mean``.
    """

    lr: float = Field(1e-5, gt=0)
    batch_prompts: int = Field(8, gt=0)
    rollouts: int = Field(4, ge=2)
    max_prompt_tokens: int = Field(512, gt=0)
    max_new_tokens: int = Field(64, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    micro_batch: Optional[int] = Field(None, gt=0)
    loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo"] = "dapo"
    carry_optimizer: bool = Field(True, description="load the previous stage's AdamW state when there is one")

    @model_validator(mode="after")
    def _micro_divides(self) -> "TrlOptions":
        total = self.batch_prompts * self.rollouts
        if self.micro_batch is not None and total % self.micro_batch:
            raise ValueError(f"micro_batch {self.micro_batch} must divide batch_prompts * rollouts = {total}")
        return self

    @property
    def completions_per_step(self) -> int:
        return self.batch_prompts * self.rollouts


class TrlTrainer(TrainerAdapter):
    """Train a stage in-process with trl's ``GRPOTrainer``."""

    name = NAME
    options_model = TrlOptions

    def train_stage(self, *, model: str, subset: str, out_dir: str, steps: int, seed: int, stage: int,
                    reward: str) -> StageResult:
        check_stage_args(steps=steps, seed=seed, stage=stage)
        from cropi.models.loading import load_causal_lm, load_tokenizer
        from cropi.rewards import get_reward

        reward_fn = get_reward(reward)  # unknown names fail here, before any model is loaded
        opts: TrlOptions = self.options
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        previous = read_marker(model)
        reference = previous.reference_model if previous else str(Path(model).resolve())
        start_step = previous.global_step if previous else 0

        tokenizer = load_tokenizer(model)
        policy = load_causal_lm(model, dtype="float32")
        dataset = stage_dataset(subset, tokenizer, opts, policy.config)
        # trl builds the KL reference from the policy's name_or_path: point it at the run's start.
        policy.config._name_or_path = reference
        optimizer = adamw(policy, lr=opts.lr, weight_decay=opts.weight_decay, carry=opts.carry_optimizer,
                          previous=previous, trainer=NAME)

        log = _StageLog(out, stage, start_step)
        trainer = _grpo_trainer(policy, tokenizer, dataset, reward_fn, reward, opts, out, steps, seed,
                                optimizer, log)
        began = time.monotonic()
        with log.capture_library_warnings():
            trainer.train()
        runtime = time.monotonic() - began

        done = int(trainer.state.global_step)
        # saved with save_pretrained, not Trainer.save_model, which drops a training_args.bin into the folder
        checkpoint = save_stage(trainer.accelerator.unwrap_model(trainer.model), tokenizer, trainer.optimizer, out,
                                StageMarker(trainer=NAME, reference_model=reference, stage=stage,
                                            global_step=start_step + done))
        _remove_if_empty(Path(trainer.args.output_dir))
        return StageResult(checkpoint=str(checkpoint), steps_done=done, global_step=start_step + done,
                           stage=stage, metrics=log.summary(runtime), log_path=str(log.text_path),
                           metrics_path=str(log.jsonl_path))


def stage_dataset(subset: str, tokenizer, opts: TrlOptions, model_config):
    """The stage's prompts as a ``datasets.Dataset`` with ``prompt`` (chat messages) and ``answer``.

    Every prompt is rendered with the chat template and checked to fit
    ``max_prompt_tokens`` and, with the response, the model's context, so a bad
    subset fails before training starts.
    """
    from datasets import Dataset

    from cropi.data import as_messages, load_prompts

    records = load_prompts(subset)
    if len(records) < opts.batch_prompts:
        raise InvalidInputError(f"{subset} has {len(records)} prompts but a step takes batch_prompts="
                                f"{opts.batch_prompts}: lower batch_prompts or select more prompts")
    context = int(getattr(model_config, "max_position_embeddings", 0) or 0)
    rows, too_long = [], []
    for r in records:
        messages = as_messages(r.prompt)
        n = len(_ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)))
        if n > opts.max_prompt_tokens or (context and n + opts.max_new_tokens > context):
            too_long.append(f"{r.prompt_id} ({n} tokens)")
        rows.append({"prompt": messages, "answer": r.answer, "prompt_id": r.prompt_id})
    if too_long:
        shown = ", ".join(too_long[:5]) + (f" and {len(too_long) - 5} more" if len(too_long) > 5 else "")
        raise InvalidInputError(f"{len(too_long)} prompts of {subset} do not fit max_prompt_tokens="
                                f"{opts.max_prompt_tokens} (plus max_new_tokens={opts.max_new_tokens} within "
                                f"the model's {context} positions): {shown}. Raise the limits or drop them")
    return Dataset.from_list(rows)


def make_reward_func(reward_fn, name: str):
    """Wrap ``fn(response_text, answer) -> float`` as a trl reward function.

    trl calls it with the batch's completions (chat messages for chat prompts)
    and every other dataset column as a keyword list, ``answer`` among them.
    """
    def reward(completions: list, answer: list[str], **_: Any) -> list[float]:
        return [float(reward_fn(completion_text(c), a)) for c, a in zip(completions, answer)]

    reward.__name__ = name
    return reward


def completion_text(completion: Any) -> str:
    """The generated text of one trl completion: plain text, or the assistant messages joined."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role", "assistant") == "assistant")


def _ids(rendered: Any) -> list[int]:
    # apply_chat_template returns a list, or a BatchEncoding with input_ids, by transformers version.
    return list(rendered["input_ids"]) if hasattr(rendered, "keys") else list(rendered)


def _grpo_trainer(policy, tokenizer, dataset, reward_fn, reward_name, opts: TrlOptions, out: Path,
                  steps: int, seed: int, optimizer, log: "_StageLog"):
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    micro = opts.micro_batch or opts.completions_per_step
    args = GRPOConfig(
        output_dir=str(out / "trl"), use_cpu=_use_cpu(), bf16=False, fp16=False, seed=seed, data_seed=seed,
        per_device_train_batch_size=micro, gradient_accumulation_steps=opts.completions_per_step // micro,
        num_generations=opts.rollouts, num_iterations=1, max_completion_length=opts.max_new_tokens,
        temperature=opts.temperature, top_p=opts.top_p, max_steps=steps, learning_rate=opts.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=opts.weight_decay,
        max_grad_norm=opts.grad_clip, beta=opts.kl_coef, loss_type=opts.loss_type, scale_rewards="group",
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False, shuffle_dataset=True)
    trainer = GRPOTrainer(model=policy, reward_funcs=make_reward_func(reward_fn, reward_name), args=args,
                          train_dataset=dataset, processing_class=tokenizer, optimizers=(optimizer, None),
                          callbacks=[log.callback()])
    # Steps go to the stage's own log files; trl would also print every step's dict.
    trainer.remove_callback(PrinterCallback)
    return trainer


def _use_cpu() -> bool:
    return resolve_device("auto") == "cpu"


def _remove_if_empty(folder: Path) -> None:
    # trl insists on an output_dir; with saving off it stays empty.
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


class _StageLog:
    """Per-step metrics to ``metrics.jsonl`` and a readable ``train.log``."""

    def __init__(self, out: Path, stage: int, start_step: int):
        self.stage, self.start_step = stage, start_step
        self.jsonl_path, self.text_path = out / "metrics.jsonl", out / "train.log"
        self.jsonl_path.write_text("")
        self.text_path.write_text(f"stage {stage}: starting at global step {start_step}\n")
        self.rows: list[dict] = []

    def record(self, stage_step: int, logs: dict) -> None:
        numbers = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        row = {"stage": self.stage, "step": self.start_step + stage_step, "stage_step": stage_step,
               "reward_mean": numbers.get("reward"), **numbers}
        self.rows.append(row)
        with self.jsonl_path.open("a") as f:
            f.write(json.dumps(row, allow_nan=True) + "\n")
        with self.text_path.open("a") as f:
            f.write(f"stage {self.stage} step {row['step']} (stage step {stage_step}): reward_mean "
                    f"{_fmt(row['reward_mean'])} loss {_fmt(numbers.get('loss'))} kl {_fmt(numbers.get('kl'))}\n")

    def callback(self):
        from transformers import TrainerCallback

        log = self

        class _Callback(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                # The end-of-training summary has train_runtime and no reward: not a step.
                if logs and "reward" in logs:
                    log.record(int(state.global_step), logs)

        return _Callback()

    def capture_library_warnings(self):
        return _LoggerCapture(self.text_path)

    def summary(self, runtime: float) -> dict[str, float]:
        rewards = [r["reward_mean"] for r in self.rows if r["reward_mean"] is not None]
        last = self.rows[-1] if self.rows else {}
        summary = {"runtime_s": runtime, "steps_logged": float(len(self.rows))}
        if rewards:
            summary |= {"reward_mean": sum(rewards) / len(rewards), "reward_last": rewards[-1],
                        "reward_first": rewards[0]}
        for key, name in (("loss", "loss_last"), ("kl", "kl_last"), ("entropy", "entropy_last")):
            if key in last and math.isfinite(last[key]):
                summary[name] = last[key]
        return summary


class _LoggerCapture:
    """Send warnings of trl/transformers/accelerate to the stage log while training."""

    def __init__(self, path: Path):
        self.handler = logging.FileHandler(path)
        self.handler.setLevel(logging.WARNING)
        self.handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def __enter__(self):
        for name in _LIBRARY_LOGGERS:
            logging.getLogger(name).addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        for name in _LIBRARY_LOGGERS:
            logging.getLogger(name).removeHandler(self.handler)
        self.handler.close()
        return False


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.4g}"


__all__ = ["TrlOptions", "TrlTrainer", "make_reward_func", "completion_text", "stage_dataset"]
