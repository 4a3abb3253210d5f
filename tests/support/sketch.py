"""The batched kinds' shared test inputs (tests/test_batched_sketch.py, test_sketch_engines.py,
test_model_options.py): float64 models, two prompts, the batched path's vectors, and the pair-hash count
sketch written out coordinate by coordinate (the definition the tensorsketch is checked against)."""

from __future__ import annotations

import numpy as np
import torch
from support.gradients import copy_response, make_traj, tiny_model

from cropi.gradients import LossOptions, make_computer
from cropi.gradients.batched import BatchedComputer
from cropi.projection import make_projector
from cropi.utils.hashing import coord_hash, name_key, top_bits


def shapes_of(model):
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def double_model(seed=0):
    model = tiny_model(seed).double()
    model.config._attn_implementation = "sdpa"  # eager in float64 turns left padding's masked rows into NaN
    return model


def two_prompts():
    rng = np.random.default_rng(11)
    out = []
    for i, (rewards, plen) in enumerate((([1, 0, 1, 0], 4), ([0, 1, 1], 6))):
        t = make_traj(rng, rewards, prompt_len=plen)
        t.prompt_id = f"p{i}"
        if i == 0:
            copy_response(t, 0, 2)  # a response drawn twice: packed once, each copy its own weight
        t.behavior_logprobs = [np.float32(b).astype(float).tolist() for b in t.behavior_logprobs]
        out.append(t)
    return out


def batched_vectors(model, spec, trajs):
    comp = make_computer(model, make_projector(spec, shapes_of(model)), LossOptions())
    assert isinstance(comp, BatchedComputer)  # the batched path
    return comp.vectors([comp._prepare(t) for t in trajs])


def pair_hash_sketch(spec, shapes, grads, dim):
    """The definition, coordinate by coordinate: P[b] = sum over (o, i) with (h_out(o) + h_in(i)) mod dim = b
    of s_out(o) s_in(i) G[o, i]; h and s from the hash streams cropi.projection.tensorsketch names."""
    out = np.zeros(dim)
    for n in make_projector(spec, shapes).param_names:
        key = name_key(n, spec.seed)
        g = grads[n].double().numpy()
        side = {}
        for label, size, stream in (("out", g.shape[0], 4), ("in", g.shape[1], 3)):
            h = coord_hash(key, torch.arange(size), stream)
            side[label] = ((top_bits(h, 32) * dim) >> 32).numpy(), ((h & 1) * 2 - 1).numpy()
        (ho, so), (hi, si) = side["out"], side["in"]
        for o in range(g.shape[0]):
            np.add.at(out, (ho[o] + hi) % dim, so[o] * si * g[o])
    return out
