"""Shared-prompt packing (cropi.gradients.packing): a prompt's responses in one row read the same
log-probs as each response alone, no response sees another, and the rule packs only where the cost
model says a packed row is cheaper. The batched vectors in the packed layout are tested against the
brute force in tests/test_factored.py and tests/test_batched_sketch.py (both layouts)."""

from __future__ import annotations

import numpy as np
import torch
from support.gradients import make_traj, seq_logprobs, tiny_model

from cropi.gradients.packing import ModelShape, build_packed, packed_logprobs, should_pack


def float64_model():
    model = tiny_model(4).double()
    model.config._attn_implementation = "sdpa"  # every op float64 but the norms (see support.PACKED_TOL)
    return model


def groups(seed=0):
    """Two prompts of unequal lengths (left padding), responses of lengths 1-8, one of a single token."""
    rng = np.random.default_rng(seed)
    out = [make_traj(rng, [1, 0, 1, 0], prompt_len=3), make_traj(rng, [0, 1, 1], prompt_len=9)]
    out[0].responses[1] = out[0].responses[1][:1]
    out[0].behavior_logprobs[1] = out[0].behavior_logprobs[1][:1]
    return [(t.prompt_token_ids, t.responses, t.behavior_logprobs) for t in out]


def test_packed_logprobs_equal_each_response_alone():
    model, rows = float64_model(), groups()
    batch = build_packed(rows, pad_id=0)
    with torch.no_grad():
        got = packed_logprobs(model, batch, "cpu")
        r = 0
        for prompt, responses, _ in rows:
            for response in responses:
                want = seq_logprobs(model, prompt, response)  # one unpadded sequence, position by position
                n = len(response)
                torch.testing.assert_close(got[r, -n:], want, rtol=1e-12, atol=1e-12)
                assert torch.all(batch.response_mask[r, :-n] == 0) and torch.all(batch.response_mask[r, -n:] == 1)
                r += 1
    assert r == got.shape[0] == 7


def test_a_response_never_sees_another_and_every_response_sees_the_prompt():
    model, rows = float64_model(), groups(1)
    (prompt, responses, behavior), other = rows
    with torch.no_grad():
        base = packed_logprobs(model, build_packed(rows, 0), "cpu")
        changed = [list(r) for r in responses]
        changed[2] = [(t % 90) + 2 for t in changed[2]]  # another response's tokens
        after = packed_logprobs(model, build_packed([(prompt, changed, behavior), other], 0), "cpu")
        keep = [0, 1, 3]
        torch.testing.assert_close(after[keep], base[keep], rtol=0, atol=1e-13)
        assert not torch.allclose(after[2], base[2])
        moved = packed_logprobs(model, build_packed([([5] + prompt[1:], responses, behavior), other], 0), "cpu")
        n = len(responses)
        for r in range(n):  # the prompt's first token changed: every one of its responses moves
            assert (moved[r] - base[r]).abs().max() > 1e-6
        torch.testing.assert_close(moved[n:], base[n:], rtol=0, atol=1e-13)  # the other row is untouched


def lengths(prompt_len: int, response_lens: list[int]):
    """A prompt and responses of these lengths, no two responses alike."""
    return [7] * prompt_len, [[k] * n for k, n in enumerate(response_lens)]


def test_the_rule_packs_short_responses_and_leaves_long_ones():
    demo = ModelShape(n_weights=459_904, layers=2, width=128, heads=2)  # the lists demo's model
    assert should_pack(*lengths(40, [5] * 8), demo, 8192)
    assert not should_pack(*lengths(40, [5]), demo, 8192)  # nothing to share
    qwen = ModelShape(n_weights=1_543_714_304, layers=28, width=1536, heads=12)  # Qwen2.5-1.5B
    assert should_pack(*lengths(600, [40] * 8), qwen, 8192)
    # 8 responses of 1,000 tokens: 8,200 packed tokens; the heads x T^2 attention weights of one row
    # (8.1e8) are far above the budget's hidden states (1.3e7): left unpacked whatever the FLOPs say
    assert not should_pack(*lengths(200, [1000] * 8), qwen, 8192)
    # 8 responses of 600 tokens: 5,000 packed tokens, unpacked; one response drawn 8 times packs into a row of
    # 800 tokens (7.7e6 attention weights) and costs an eighth of its 8 rows
    assert not should_pack(*lengths(200, [600] * 8), qwen, 8192)
    assert should_pack([7] * 200, [[3] * 600] * 8, qwen, 8192)
    # the FLOP side alone, by hand: with attention priced high a long packed row loses to its rows
    costly = ModelShape(n_weights=1000, layers=100, width=1000, heads=1)
    packed, rows = 10 + 40, [10 + 20, 10 + 20]

    def cost(t):
        return 2 * 1000 * t + 4 * 100 * 1000 * t * t

    assert cost(packed) > sum(map(cost, rows)) and not should_pack(*lengths(10, [20, 20]), costly, 10**9)
    assert cost(10 + 2) * 1 < 2 * cost(10 + 1) and should_pack(*lengths(10, [1, 1]), costly, 10**9)
    # two copies of one response pack into the prompt and one response: cheaper than the two rows
    assert cost(10 + 20) < 2 * cost(10 + 20) and should_pack([7] * 10, [[3] * 20] * 2, costly, 10**9)


def test_model_shape_reads_the_config():
    model = tiny_model()
    shape = ModelShape.of(model)
    assert shape.n_weights == sum(p.numel() for p in model.parameters())
    assert (shape.layers, shape.width, shape.heads) == (2, 64, 2)


def test_a_response_drawn_twice_is_packed_once_and_each_copy_reads_its_log_probs():
    model, rows = float64_model(), groups(2)
    (prompt, responses, behavior), other = rows
    copies = [list(r) for r in responses] + [list(responses[2]), list(responses[0])]
    shifted = [list(b) for b in behavior] + [[x - 1.0 for x in behavior[2]], [x - 2.0 for x in behavior[0]]]
    batch = build_packed([(prompt, copies, shifted), other], 0)
    # the first row: the prompt and its 4 distinct responses once, whatever the 2 copies add
    assert int(batch.token_mask[0].sum()) == len(prompt) + sum(map(len, responses))
    assert batch.expand.tolist()[:6] == [0, 1, 2, 3, 2, 0] and batch.targets.shape[0] == 4 + len(other[1])
    with torch.no_grad():
        got = packed_logprobs(model, batch, "cpu")
    for r, response in enumerate(copies):
        n = len(response)
        torch.testing.assert_close(got[r, -n:], seq_logprobs(model, prompt, response), rtol=1e-12, atol=1e-12)
        # each copy keeps its own behavior log-probs, right-aligned under its own mask
        torch.testing.assert_close(batch.behavior_logp[r, -n:], torch.tensor(shifted[r], dtype=torch.float32))
        assert torch.all(batch.response_mask[r, :-n] == 0) and torch.all(batch.response_mask[r, -n:] == 1)
    assert got.shape[0] == len(copies) + len(other[1])


def test_log_probs_of_half_precision_logits_are_float32_and_their_gradient_half():
    """vocab_logprobs / picked_logprobs: from bfloat16 logits, float32 log-probs equal to a float32 softmax of
    the same logits (independently: log-sum-exp by hand in float64), and the gradient back in bfloat16."""
    from cropi.gradients.groups import picked_logprobs

    gen = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(2, 5, 300, generator=gen)).to(torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, 300, (2, 5), generator=gen)
    got = picked_logprobs(logits, targets)
    wide = logits.detach().double()
    want = wide.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(wide, -1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)  # float32 softmax of exact bf16 values
    (grad,) = torch.autograd.grad(got.sum(), logits)
    assert grad.dtype == torch.bfloat16
    onehot = torch.nn.functional.one_hot(targets, 300).double()
    torch.testing.assert_close(grad.double(), onehot - torch.softmax(wide, -1), rtol=0, atol=4e-3)  # bf16 rounding
