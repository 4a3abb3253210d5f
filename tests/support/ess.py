"""Groups whose behavior log-probs are a tiny model's own (shifted by known amounts): the ESS and
importance-weighted statistics tests share them."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from support.gradients import VOCAB, Traj


def tiny_model():
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=0)
    cfg._attn_implementation = "eager"
    return Qwen2ForCausalLM(cfg).eval()


def teacher_forced(model, prompt, response) -> list[float]:
    """Each response token's log-prob, one unpadded sequence at a time (independent of the batching)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].double()
    return [float(torch.log_softmax(logits[len(prompt) + t - 1], -1)[tok]) for t, tok in enumerate(response)]


def group(model, rng, rewards, shifts=None):
    prompt = rng.integers(1, VOCAB, 4).tolist()
    responses = [rng.integers(1, VOCAB, int(n)).tolist() for n in rng.integers(1, 6, len(rewards))]
    behavior = [teacher_forced(model, prompt, r) for r in responses]
    if shifts is not None:  # behavior log-probs moved by a known amount per response
        behavior = [[b + s / len(bs) for b in bs] for bs, s in zip(behavior, shifts)]
    return Traj("p", prompt, responses, behavior, list(rewards))
