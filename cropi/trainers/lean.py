"""The lean trainer: GRPO in plain torch, one process, for small models (the CPU demo).

Why not trl here: on the demo's model (4-token responses, 8 prompts x 8 rollouts)
this loop ran 1.8x trl GRPOTrainer's completions per second, 0.29 against 0.51 s a
step (benchmarks/trainer_speed.py, benchmarks/results/trainer_speed.json): trl's
step carries machinery a tiny model cannot amortise. trl stays the adapter for one
GPU, verl for many. The objective is cropi.trainers.objective.

One step::

    B prompts of the stage subset (epochs reshuffled from the seed)
    -> n rollouts each from the live policy (temperature, KV-cache decode loop of cropi.generation.hf)
    -> rewards, group advantages
    -> [online filter: drop responses by influence (cropi.trainers.filters)]
    -> one AdamW update on the GRPO loss (KL to the run's initial model if kl_coef > 0)

Without KL, the update's forward and backward skip the zero-advantage responses (their terms and
gradients are exactly 0; they still count in the token-mean's denominator), and with an online filter
on a batched projection the update's gradient is formed from the filter's own pass.

Evaluation runs inside the stage every ``eval_every`` global steps on ``eval_files``
(greedy and sampled mean@k), like verl's ``test_freq``, so accuracy is resolved
finer than stage ends. Layout of ``out_dir``: ``checkpoint/`` (Hugging Face folder),
``trainer_state/`` (AdamW), ``metrics.jsonl`` (one row per step, eval rows
marked ``"eval"``), ``train.log``.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field

from cropi.errors import InvalidInputError
from cropi.trainers.base import GrpoOptions, StageResult, TrainerAdapter, check_stage_args
from cropi.trainers.filters import OnlineFilterOptions
from cropi.trainers.lineage import StageMarker, read_marker
from cropi.utils.device import resolve_device

NAME = "lean"


class LeanOptions(GrpoOptions):
    """GRPO settings for a small model on a CPU (the demo's defaults)."""

    lr: float = Field(2e-4, gt=0)
    batch_prompts: int = Field(8, gt=0)
    rollouts: int = Field(8, ge=2)
    max_prompt_tokens: int = Field(256, gt=0)
    max_new_tokens: int = Field(16, gt=0)
    aggregation: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    carry_optimizer: bool = Field(True, description="load the previous stage's AdamW state when there is one")
    eval_files: dict[str, str] = Field(default_factory=dict, description="eval split name -> prompt file")
    eval_every: int = Field(10, ge=1, description="global steps between evaluations (and at each stage end)")
    eval_samples: int = Field(4, ge=0, description="k of the sampled mean@k (0: greedy only)")
    stage_eval_files: dict[str, str] = Field(default_factory=dict, description="split name -> prompt file read at "
                                             "step 0 and at every stage's end only (the validation sets: what a "
                                             "stage did to its targets, without reading the test splits)")
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    online_filter: OnlineFilterOptions = Field(default_factory=OnlineFilterOptions,
                                               description="I-PPO / IIF filter between rollout and update")


class LeanTrainer(TrainerAdapter):
    """Train a stage in-process with the lean GRPO loop."""

    name = NAME
    options_model = LeanOptions

    def train_stage(self, *, model: str, subset: str, out_dir: str, steps: int, seed: int, stage: int,
                    reward: str) -> StageResult:
        check_stage_args(steps=steps, seed=seed, stage=stage)
        from cropi.rewards import get_reward

        run = _Run(self.options, model, get_reward(reward), Path(out_dir), seed, stage)
        run.load(subset)
        began = time.monotonic()
        if run.start_step == 0:
            run.evaluate(0)
        for i in range(steps):
            if run.step(run.start_step + i + 1, last=i == steps - 1):
                break  # the filter's early stop: the step evaluated and logged it
        return run.finish(time.monotonic() - began)


class _Run:
    """The state of one stage: policy, reference, optimizer, prompts, sampler, logs."""

    def __init__(self, opts: LeanOptions, model: str, reward_fn, out: Path, seed: int, stage: int):
        self.opts, self.model_path, self.reward_fn, self.out, self.seed, self.stage = \
            opts, model, reward_fn, out, seed, stage
        previous = read_marker(model)
        self.previous = previous
        self.reference = previous.reference_model if previous else str(Path(model).resolve())
        self.start_step = previous.global_step if previous else 0
        self.rows: list[dict] = []

    def load(self, subset: str) -> None:
        import torch

        from cropi.generation.hf import HFBackend
        from cropi.generation.stopping import stop_token_ids
        from cropi.models.loading import load_causal_lm, load_tokenizer
        from cropi.trainers.carry import adamw

        opts = self.opts
        device = resolve_device(opts.device)
        self.tokenizer = load_tokenizer(self.model_path)
        self.policy = load_causal_lm(self.model_path, device=device, attn_implementation="sdpa")
        self.ref = (load_causal_lm(self.reference, device=device, attn_implementation="sdpa")
                    if opts.kl_coef > 0 else None)  # None: no KL term
        # without KL the update's gradient is a weighted sum of an online filter's per-response terms, so the
        # filter's pass also yields it (cropi.trainers.shared_update), where no dropout makes train mode differ
        self.shares_update = self.ref is None and _no_dropout(self.policy)
        self.prompts = _stage_prompts(subset, self.tokenizer, opts)
        if len(self.prompts) < opts.batch_prompts:
            raise InvalidInputError(f"{subset} has {len(self.prompts)} prompts but a step takes batch_prompts="
                                    f"{opts.batch_prompts}: lower batch_prompts or select more prompts")
        self.evals = _eval_sets(opts.eval_files, self.tokenizer)
        self.stage_evals = _eval_sets(opts.stage_eval_files, self.tokenizer)
        self.sampler = HFBackend.from_model(self.policy, self.tokenizer,
                                            stop_token_ids(self.model_path, self.tokenizer))
        self.optimizer = adamw(self.policy, lr=opts.lr, weight_decay=opts.weight_decay,
                               carry=opts.carry_optimizer, previous=self.previous, trainer=NAME)
        self.order = _PromptOrder(len(self.prompts), self.seed)
        self.filter = self._make_filter(opts.online_filter)
        self.out.mkdir(parents=True, exist_ok=True)
        self.metrics_path, self.log_path = self.out / "metrics.jsonl", self.out / "train.log"
        self.metrics_path.write_text("")
        self.log_path.write_text(f"stage {self.stage}: lean GRPO from global step {self.start_step}\n")

    def _make_filter(self, fopts: OnlineFilterOptions):
        """The online filter of this stage (None when off); I-PPO's validation rollouts are sampled here."""
        if fopts.policy == "none":
            return None
        from cropi.generation.base import SamplingConfig
        from cropi.trainers.filters import OnlineFilter

        online = OnlineFilter(fopts, self.policy, pad_id=self.sampler.pad_id, seed=_step_seed(self.seed, -1))
        if fopts.resolved_target == "validation":
            sets = {name: _stage_prompts(path, self.tokenizer, self.opts)
                    for name, path in fopts.validation_files.items()}
            self.policy.eval()
            online.sample_validation(self.sampler, sets, self.reward_fn, SamplingConfig(
                samples=fopts.validation_rollouts, temperature=self.opts.temperature,
                max_new_tokens=self.opts.max_new_tokens, seed=_step_seed(self.seed, -2)))
        return online

    def step(self, step: int, *, last: bool) -> bool:
        """One GRPO step; True when the online filter ends the stage early."""
        import torch

        from cropi.generation.base import SamplingConfig
        from cropi.rewards import score_responses
        from cropi.trainers.objective import group_advantages

        opts = self.opts
        t0 = time.monotonic()
        batch = [self.prompts[i] for i in self.order.take(opts.batch_prompts)]
        cfg = SamplingConfig(samples=opts.rollouts, temperature=opts.temperature,
                             max_new_tokens=opts.max_new_tokens, seed=_step_seed(self.seed, step))
        self.policy.eval()
        groups = self.sampler.generate([p["ids"] for p in batch], [p["id"] for p in batch], cfg)
        t1 = time.monotonic()
        rewards = [r or 0.0 for p, g in zip(batch, groups)
                   for r in score_responses(self.reward_fn, [s.text for s in g], p["answer"])]
        n = opts.rollouts  # what the trainer saw of each prompt: free evidence for the next stage's selector
        observed = {p["id"]: sum(rewards[i * n:(i + 1) * n]) / n for i, p in enumerate(batch)}
        adv = group_advantages(torch.tensor(rewards), opts.rollouts)
        zero_groups = float((adv.reshape(-1, opts.rollouts).abs().sum(1) == 0).float().mean())
        seqs = [(p["ids"], s.token_ids) for p, g in zip(batch, groups) for s in g]
        filtered, stop, shared = {}, False, None
        if self.filter is not None:
            # filter: influence at the step's starting parameters; kept responses keep their full-group advantages.
            # Where the update is shared (self.shares_update), no second forward and backward
            result = self.filter.select(seqs, adv, aggregation=opts.aggregation if self.shares_update else None)
            seqs, adv = [seqs[i] for i in result.keep], adv[torch.tensor(result.keep, dtype=torch.long)]
            filtered, shared = result.row(), result.update
            threshold = opts.online_filter.early_stop_fraction
            stop = threshold is not None and filtered["filtered_fraction"] >= threshold
        t2 = time.monotonic()
        if shared is not None:
            stats = self._apply(shared) if seqs else self._update(seqs, adv)
            update_s = shared.seconds + time.monotonic() - t2
        else:
            stats = self._update(seqs, adv)
            update_s = time.monotonic() - t2
        row = {"stage": self.stage, "step": step, "reward_mean": sum(rewards) / len(rewards),
               "zero_advantage_groups": zero_groups, "prompt_rewards": observed,
               "sample_s": t1 - t0, "update_s": update_s, **filtered, **stats,
               "step_s": time.monotonic() - t0}
        if stop:
            row["early_stop"] = True
        self._log(row)
        if step % opts.eval_every == 0 or last or stop:
            self.evaluate(step, stage_end=last or stop)
        return stop

    def _update(self, seqs: list[tuple[list[int], list[int]]], adv) -> dict:
        import torch

        from cropi.trainers.objective import grpo_loss, token_logprobs

        opts = self.opts
        if not seqs:  # the filter dropped every response: no update this step
            return {"loss": 0.0, "grad_norm": 0.0, "kl": 0.0, "tokens": 0.0}
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ref is None:  # no KL term
            loss, stats = self._policy_gradient(seqs, adv)
        else:
            ids, attn, mask = _right_pad(seqs, self.sampler.pad_id, self.policy.device)
            logp = token_logprobs(self.policy, ids, attn)
            with torch.no_grad():
                ref_logp = token_logprobs(self.ref, ids, attn)
            loss, stats = grpo_loss(logp, mask, adv.to(logp.device), ref_logp=ref_logp, kl_coef=opts.kl_coef,
                                    aggregation=opts.aggregation)
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), opts.grad_clip)
        self.optimizer.step()
        return {"loss": float(loss.detach()), "grad_norm": float(norm), **stats}

    def _policy_gradient(self, seqs, adv):
        """The no-KL loss's backward over the responses that carry signal: a zero-advantage response's term
        and gradient are exactly 0 and it only counts in the aggregation's denominator, so the pass skips it
        and the loss over the others is rescaled to the whole batch's denominator."""
        import torch

        from cropi.trainers.objective import grpo_loss, token_logprobs

        live = [i for i in range(len(seqs)) if float(adv[i]) != 0]
        tokens = float(sum(len(r) for _, r in seqs))
        if not live:  # no signal: a zero gradient, and AdamW still steps (as the loss's own backward would have)
            for p in self.policy.parameters():
                p.grad = torch.zeros_like(p)
            return torch.zeros(()), {"kl": 0.0, "tokens": tokens}
        ids, attn, mask = _right_pad([seqs[i] for i in live], self.sampler.pad_id, self.policy.device)
        logp = token_logprobs(self.policy, ids, attn)
        loss, _ = grpo_loss(logp, mask, adv[live].to(logp.device), aggregation=self.opts.aggregation)
        if self.opts.aggregation == "token-mean":
            loss = loss * (float(mask.sum()) / max(tokens, 1.0))
        else:
            loss = loss * (len(live) / len(seqs))
        loss.backward()
        return loss, {"kl": 0.0, "tokens": tokens}

    def _apply(self, shared) -> dict:
        """The update from the filter's pass: its gradient over the kept responses, then the same clip and step."""
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        for p in self.policy.parameters():
            p.grad = shared.grads.get(p)
        norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.opts.grad_clip)
        self.optimizer.step()
        return {"loss": shared.loss, "grad_norm": float(norm), "kl": 0.0, "tokens": shared.tokens}

    def evaluate(self, step: int, *, stage_end: bool = True) -> None:
        """The eval files at ``step``; the stage-eval files too at step 0 and at a stage's end."""
        sets = dict(self.evals) | (self.stage_evals if stage_end else {})
        if not sets:
            return
        from cropi.generation.evaluate import evaluate_policy

        self.policy.eval()
        t0 = time.monotonic()
        results = {name: evaluate_policy(self.sampler, data, self.reward_fn, samples=self.opts.eval_samples,
                                         max_new_tokens=self.opts.max_new_tokens, seed=step)
                   for name, data in sets.items()}
        row = {"stage": self.stage, "step": step, "eval": {k: v for k, v in results.items() if k in self.evals},
               "eval_s": time.monotonic() - t0}
        if stage_end and self.stage_evals:
            row["stage_eval"] = {k: v for k, v in results.items() if k in self.stage_evals}
        self._log(row)

    def finish(self, runtime: float) -> StageResult:
        from cropi.trainers.carry import save_stage

        steps_done = sum(1 for r in self.rows if "eval" not in r)
        global_step = self.start_step + steps_done
        checkpoint = save_stage(self.policy, self.tokenizer, self.optimizer, self.out, StageMarker(
            trainer=NAME, reference_model=self.reference, stage=self.stage, global_step=global_step))
        train = [r for r in self.rows if "eval" not in r]
        # the test-split evaluations (eval_every) are the demo's measurement, not training: a stage's cost leaves
        # them out (cropi.pipeline.curriculum.state.stage_cost)
        evaluated = sum(r["eval_s"] for r in self.rows if "eval" in r)
        metrics = {"runtime_s": runtime, "eval_s": round(evaluated, 3), "steps_logged": float(len(train))}
        if any(r.get("early_stop") for r in train):
            metrics["early_stopped"] = 1.0
        if train and "filtered_fraction" in train[0]:
            metrics["filtered_fraction_mean"] = sum(r["filtered_fraction"] for r in train) / len(train)
        if train:
            metrics |= {"zero_advantage_share": sum(r["zero_advantage_groups"] for r in train) / len(train)}
            metrics |= {"reward_mean": sum(r["reward_mean"] for r in train) / len(train),
                        "reward_first": train[0]["reward_mean"], "reward_last": train[-1]["reward_mean"],
                        "loss_last": train[-1]["loss"], "kl_last": train[-1]["kl"]}
        return StageResult(checkpoint=str(checkpoint), steps_done=steps_done, global_step=global_step,
                           stage=self.stage, metrics=metrics, log_path=str(self.log_path),
                           metrics_path=str(self.metrics_path))

    def _log(self, row: dict) -> None:
        self.rows.append(row)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        with self.log_path.open("a") as f:
            f.write(_line(row) + "\n")


def _line(row: dict) -> str:
    if "eval" in row:
        parts = [f"{name} " + " ".join(f"{k} {v:.3f}" for k, v in res.items() if k not in ("n", "by_group"))
                 for name, res in row["eval"].items()]
        return f"stage {row['stage']} step {row['step']} eval: " + "; ".join(parts)
    line = (f"stage {row['stage']} step {row['step']}: reward {row['reward_mean']:.3f} loss {row['loss']:.4f} "
            f"kl {row['kl']:.4g} ({row['sample_s']:.2f}s sample, {row['update_s']:.2f}s update)")
    if "filtered_fraction" in row:
        line += (f"; filtered {row['filtered_fraction']:.3f}, mean influence {row['influence_mean']:.3g} "
                 f"({row['filter_s']:.2f}s filter of {row['step_s']:.2f}s)")
    if row.get("early_stop"):
        line += "; early stop: the filtered fraction reached online_filter.early_stop_fraction"
    return line


def _stage_prompts(subset: str, tokenizer, opts: LeanOptions) -> list[dict]:
    """The subset's prompts rendered once; a prompt over ``max_prompt_tokens`` is an error, not a truncation."""
    from cropi.data import load_prompts
    from cropi.generation.prompting import render_prompt

    rows, too_long = [], []
    for r in load_prompts(subset):
        ids = render_prompt(tokenizer, r.prompt)
        if len(ids) > opts.max_prompt_tokens:
            too_long.append(f"{r.prompt_id} ({len(ids)} tokens)")
        rows.append({"id": r.prompt_id, "ids": ids, "answer": r.answer})
    if too_long:
        raise InvalidInputError(f"{len(too_long)} prompts of {subset} exceed max_prompt_tokens="
                                f"{opts.max_prompt_tokens}: {', '.join(too_long[:5])}; raise it or drop them")
    return rows


def _eval_sets(files: dict[str, str], tokenizer) -> dict:
    from cropi.data import load_prompts
    from cropi.generation.evaluate import EvalSet

    return {name: EvalSet.build(name, load_prompts(path), tokenizer) for name, path in sorted(files.items())}


def _right_pad(seqs: list[tuple[list[int], list[int]]], pad_id: int, device):
    """Prompt+response rows, right-padded: ids, attention mask, and the mask of response targets.

    The target mask is aligned with ``token_logprobs`` (position t scores token t+1).
    """
    import torch

    width = max(len(p) + len(r) for p, r in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    target = torch.zeros((len(seqs), width - 1))
    for i, (p, r) in enumerate(seqs):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        attn[i, :len(p) + len(r)] = 1
        target[i, len(p) - 1:len(p) + len(r) - 1] = 1
    return ids.to(device), attn.to(device), target.to(device)


def _step_seed(seed: int, step: int) -> int:
    digest = hashlib.blake2b(f"cropi.lean:{seed}:{step}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "big")


def _no_dropout(policy) -> bool:
    """True when the policy computes the same in train and eval mode: the shared pass runs in the mode the
    sampler left (eval), and gives the train-mode update's gradient only where no dropout acts."""
    import torch

    cfg = policy.config
    return (all(m.p == 0 for m in policy.modules() if isinstance(m, torch.nn.Dropout))
            and not any(getattr(cfg, k, 0) for k in ("attention_dropout", "hidden_dropout", "dropout")))


class _PromptOrder:
    """Prompt indices in epochs, each a fresh shuffle from the seed; a batch never repeats a prompt
    (one crossing an epoch's end waits for the next batch)."""

    def __init__(self, n: int, seed: int):
        self.n, self.rng, self.queue = n, random.Random(f"cropi.lean.order:{seed}"), []

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        deferred: list[int] = []
        while len(out) < k:
            if not self.queue:
                self.queue = list(range(self.n))
                self.rng.shuffle(self.queue)
            i = self.queue.pop(0)
            (deferred if i in out else out).append(i)
        self.queue = deferred + self.queue
        return out


__all__ = ["LeanOptions", "LeanTrainer"]
