"""A prompt's trajectories as the gradient computer takes them (a stand-in with the fields it reads), a tiny
model, and the independently written brute-force POPI gradient the gradient tests compare against."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from cropi.gradients import GradientComputer, LossOptions
from cropi.projection import make_projector
VOCAB = 97


@dataclass
class Traj:
    prompt_id: str
    prompt_token_ids: list
    responses: list
    behavior_logprobs: list
    rewards: list


def tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=0)
    cfg._attn_implementation = "eager"
    return Qwen2ForCausalLM(cfg).eval()


def make_traj(rng, rewards, prompt_len=5, noise=0.3, behavior=None):
    prompt = rng.integers(1, VOCAB, prompt_len).tolist()
    lengths = rng.integers(1, 9, len(rewards))
    responses = [rng.integers(1, VOCAB, n).tolist() for n in lengths]
    beh = behavior or [(rng.normal(-4.6, noise, n)).tolist() for n in lengths]
    return Traj("p0", prompt, responses, beh, list(rewards))


def copy_response(traj, src: int, dst: int, shift: float = 0.25) -> None:
    """Response ``dst`` becomes a second draw of response ``src`` (the same tokens) whose behavior log-probs
    differ (another batch's rounding, or another behavior policy's draw) and whose reward stays its own:
    the packed layout packs the tokens once, and each copy must still keep its own weight and advantage."""
    traj.responses[dst] = list(traj.responses[src])
    traj.behavior_logprobs[dst] = [b - shift for b in traj.behavior_logprobs[src]]


def seq_logprobs(model, prompt, response):
    """Log-probs of each response token, one unpadded sequence, position by position."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0]
    out = []
    for t, tok in enumerate(response):
        out.append(torch.log_softmax(logits[len(prompt) + t - 1].double(), -1)[tok])
    return torch.stack(out)


def brute_force_grad(model, traj, clip=None):
    r = np.array(traj.rewards, dtype=np.float64)
    adv = (r - r.mean()) / (r.std(ddof=1) + 1e-4)
    model.zero_grad()
    total = 0.0
    for k, resp in enumerate(traj.responses):
        logp = seq_logprobs(model, traj.prompt_token_ids, resp)
        rho = torch.exp(logp - torch.tensor(traj.behavior_logprobs[k], dtype=torch.float64))
        term = rho * adv[k]
        if clip is not None:
            term = torch.minimum(term, torch.clamp(rho, 1 - clip, 1 + clip) * adv[k])
        total = total + term.mean()
    loss = -total / len(traj.responses)
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(loss, params)
    return [(n, g) for (n, _), g in zip(model.named_parameters(), grads)]


def computer_for(model, spec, **opts):
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    projector = make_projector(spec, shapes)
    return GradientComputer(model, projector, LossOptions(**opts)), projector


# The batched path's two layouts (cropi.gradients.packing): every response its own row, or a prompt's
# responses packed into one row. Tests of the batched path run both, forced by ``use_layout``.
LAYOUTS = ("rows", "packed")

# Tolerance of the packed layout against the one-sequence-at-a-time brute force on float64 models:
# transformers' Qwen2RMSNorm computes in float32 whatever the model's dtype, so every gradient through a
# norm is rounded to float32 (relative 2**-24, 6e-8). A packed row sums its responses' gradients at the
# prompt's tokens before that rounding, the brute force after it, so the two differ by a few float32
# roundings per layer (measured: at most 1.1e-7 on vectors of norm ~3). A dropped token, a wrong position
# or a response that sees another moves these vectors by 1e-3 or more.
PACKED_TOL = dict(rtol=1e-6, atol=1e-6)


def use_layout(monkeypatch, layout: str) -> None:
    """Force the batched computer's choice of layout (its own rule, ``should_pack``, decides otherwise)."""
    import cropi.gradients.batched as batched

    assert layout in LAYOUTS
    monkeypatch.setattr(batched, "should_pack", lambda *args, **kwargs: layout == "packed")
