"""Tests of cropi.utils.hashing and cropi.projection.

The reference below re-derives every hash, kept subset and matrix entry from
the documented definitions with pure-Python integers (no torch, no cropi
hashing code), so the projectors are checked against an independent slow
implementation, not against themselves.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from cropi.errors import CropiError
from cropi.projection import (DenseProjector, EmptySelectionError, IdentityLimitError, ProjectionInputError,
                              ProjectionSpec, SpecMismatchError, make_projector)
from cropi.projection.spec import FACTOR_FIELDS
from cropi.utils import hashing

M64 = 2**64


# ---------------------------------------------------------------- reference --
def ref_splitmix(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) % M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % M64
    return z ^ (z >> 31)


def ref_name_key(name: str, seed: int) -> int:
    digest = hashlib.sha256(b"cropi.projection.v1\0" + str(seed).encode() + b"\0" + name.encode()).digest()
    return int.from_bytes(digest[:8], "little")


def ref_hash(key: int, i: int, stream: int) -> int:
    base = ref_splitmix((key + stream * 0xD1B54A32D192ED03) % M64)
    return ref_splitmix((base + i * 0x9E3779B97F4A7C15) % M64)


def ref_kept(name: str, numel: int, spec: ProjectionSpec) -> list[int]:
    key = ref_name_key(name, spec.seed)
    return [i for i in range(numel) if (ref_hash(key, i, 0) >> 40) / 2**24 < spec.kept_fraction]


def ref_entry(spec: ProjectionSpec, key: int, i: int, r: int) -> float:
    """R[r, i] for the dense kinds, one entry at a time."""
    k = spec.dim
    h = ref_hash(key, i * k + r, 1)
    if spec.kind == "rademacher":
        return (1.0 if h < 2**63 else -1.0) / math.sqrt(k)
    u1, u2 = (h >> 40) / 2**24, ((h >> 16) & 0xFFFFFF) / 2**24
    return math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2) / math.sqrt(k)


def ref_matrix(spec: ProjectionSpec, shapes: dict) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """The full k x |S| matrix R (float64), built entry by entry, and its columns' (name, index)."""
    cols = [(n, i) for n, s in shapes.items() for i in ref_kept(n, math.prod(s), spec)]
    k = spec.dim
    R = np.zeros((k, len(cols)))
    for c, (name, i) in enumerate(cols):
        key = ref_name_key(name, spec.seed)
        if spec.kind == "sjlt":
            s = spec.nnz
            for j in range(s):
                h = ref_hash(key, i, 1 + j)
                first, size = j * k // s, (j + 1) * k // s - j * k // s
                R[first + (h >> 1) % size, c] += (-1.0 if h & 1 else 1.0) / math.sqrt(s)
        else:
            for r in range(k):
                R[r, c] = ref_entry(spec, key, i, r)
    return R, cols


def gather_kept(grads: dict, cols) -> np.ndarray:
    """g[S] as an (n, |S|) float64 array, columns in ``cols`` order."""
    return np.stack([grads[n].reshape(grads[n].shape[0], -1)[:, i].double().numpy() for n, i in cols], axis=1)


def random_grads(shapes: dict, n: int, seed: int, dtype=torch.float32) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(n, *s, generator=gen, dtype=torch.float64).to(dtype) for name, s in shapes.items()}


SHAPES = {"embed.weight": (13, 7), "layers.0.mlp.weight": (9, 11), "layers.0.mlp.bias": (9,), "norm.scale": ()}
DENSE_KINDS = ["gaussian", "rademacher"]
ALL_KINDS = ["sjlt", *DENSE_KINDS]


# ------------------------------------------------------------------ hashing --
def test_torch_splitmix_matches_arbitrary_precision_reference():
    rng = np.random.default_rng(0)
    words = [0, 1, 2**63 - 1, 2**63, M64 - 1] + [int(x) for x in rng.integers(0, 2**63, 500, dtype=np.int64)] \
        + [int(x) + 2**63 for x in rng.integers(0, 2**63, 500, dtype=np.int64)]
    got = hashing.splitmix64(torch.tensor([hashing.to_signed(w) for w in words], dtype=torch.int64))
    assert [int(g) % M64 for g in got] == [ref_splitmix(w) for w in words]


def test_coord_hash_and_unit_float_match_reference():
    rng = np.random.default_rng(1)
    idx = torch.tensor(rng.integers(0, 2**40, 300), dtype=torch.int64)
    for key, stream in [(0, 0), (M64 - 1, 3), (ref_name_key("w", 9), 1)]:
        h = hashing.coord_hash(key, idx, stream)
        assert [int(x) % M64 for x in h] == [ref_hash(key, int(i), stream) for i in idx]
        u = hashing.to_unit_float(h)
        assert u.dtype == torch.float32 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
        assert u.tolist() == [(int(x) % M64 >> 40) / 2**24 for x in h]


def test_coord_hash_grid_is_coord_hash_of_flattened_grid():
    idx = torch.tensor([0, 5, 2**33 + 7], dtype=torch.int64)
    for width in (1, 3, 1024):
        grid = hashing.coord_hash_grid(77, idx, width, stream=2)
        flat = hashing.coord_hash(77, idx[:, None] * width + torch.arange(width), stream=2)
        assert grid.shape == (3, width) and torch.equal(grid, flat)


def test_name_key_is_sha256_based_and_seeded():
    assert hashing.name_key("layers.0.mlp.weight", 5) == ref_name_key("layers.0.mlp.weight", 5)
    assert hashing.name_key("a", 0) != hashing.name_key("a", 1) != hashing.name_key("b", 1)
    assert 0 <= hashing.name_key("é", 2**62) < M64


# --------------------------------------------------------------------- spec --
@pytest.mark.parametrize("kwargs, field, words", [
    (dict(kind="sjlt", kept_fraction=0.0), "kept_fraction", "(0, 1]"),
    (dict(kind="sjlt", kept_fraction=1.5), "kept_fraction", "(0, 1]"),
    (dict(kind="sjlt", kept_fraction=float("nan")), "kept_fraction", "(0, 1]"),
    (dict(kept_fraction=0.5), "kept_fraction", "name kind='sjlt'"),  # the default kind keeps every coordinate
    (dict(dim=0), "dim", "[1, "),
    (dict(dim=2**30), "dim", "[1, "),
    (dict(dim=None), "dim", "[1, "),
    (dict(kind="sjlt", dim=8, nnz=9), "nnz", "[1, dim=8]"),
    (dict(nnz=0), "nnz", "[1, "),
    (dict(seed=-1), "seed", "[0, 2**63 - 1]"),
    (dict(include="(unclosed"), "include", "regular expression"),
    (dict(exclude="[z-a]"), "exclude", "regular expression"),
    (dict(kind="identity", dim=64), "dim", "leave dim unset"),
    (dict(identity_limit=0), "identity_limit", ">= 1"),
    (dict(kind="fancy"), "kind", "sjlt"),
    (dict(colour="red"), "colour", "Extra inputs"),
])
def test_spec_validation_names_field_and_range(kwargs, field, words):
    with pytest.raises(ValidationError) as info:
        ProjectionSpec(**kwargs)
    text = str(info.value)
    assert field in text and words in text


def test_spec_id_stable_and_sensitive_to_every_field():
    base = ProjectionSpec(kind="sjlt")
    assert ProjectionSpec(kind="sjlt").spec_id == base.spec_id and len(base.spec_id) == 16
    fields = {k: v for k, v in base.model_dump(mode="json").items() if v is not None or k not in FACTOR_FIELDS}
    canon = json.dumps(fields, sort_keys=True, separators=(",", ":"))  # unset factor fields are not hashed
    assert base.spec_id == hashlib.sha256(canon.encode()).hexdigest()[:16]
    changes = dict(kind="gaussian", dim=1024, kept_fraction=0.5, seed=1, nnz=2, include="mlp", exclude="bias",
                   identity_limit=10)
    assert set(changes) | set(FACTOR_FIELDS) == set(ProjectionSpec.model_fields)  # factored's: test_factored.py
    ids = {base.spec_id} | {ProjectionSpec(**{"kind": "sjlt"} | {f: v}).spec_id for f, v in changes.items()}
    assert len(ids) == len(changes) + 1
    ident = ProjectionSpec(kind="identity")
    assert ident.dim is None and ProjectionSpec(kind="identity", dim=None).spec_id == ident.spec_id


def test_every_spec_field_is_described_once_for_the_cli_and_the_service():
    """The help of each field is the model's description: the CLI's flag and the service's schema show it."""
    import argparse

    from cropi.cli_args import add_model_args
    from cropi_service.options.caller import Projection

    described = {name: f.description for name, f in ProjectionSpec.model_fields.items()}
    assert all(described.values()), [n for n, d in described.items() if not d]
    parser = argparse.ArgumentParser()
    add_model_args(parser, ProjectionSpec)
    helps = {a.dest: a.help for a in parser._actions if a.dest in described}
    assert set(helps) == set(described) and all(helps[n].startswith(described[n]) for n in described)
    schema = Projection.model_json_schema()["properties"]
    assert {n: schema[n].get("description") for n in described} == described


def test_spec_record_round_trip_and_tamper_detection():
    spec = ProjectionSpec(kind="rademacher", dim=128, seed=4)
    record = spec.model_dump() | {"spec_id": spec.spec_id}
    assert ProjectionSpec.from_record(record) == spec
    with pytest.raises(SpecMismatchError, match="spec_id"):
        ProjectionSpec.from_record(record | {"seed": 5})
    with pytest.raises(SpecMismatchError):
        spec.require_same(ProjectionSpec(kind="rademacher", dim=128, seed=5))
    assert issubclass(SpecMismatchError, CropiError)


def test_every_kind_has_one_projector_class_and_an_unknown_kind_is_refused_by_name():
    """One table maps kind -> class (a kind the spec accepts without a class fails here, not in a run);
    a kind it does not know is refused with the known ones named, never projected as some other kind."""
    import typing

    from cropi.projection.factory import PROJECTORS, UnknownKindError

    kinds = typing.get_args(ProjectionSpec.model_fields["kind"].annotation)
    assert set(PROJECTORS) == set(kinds)
    stray = ProjectionSpec.model_construct(**{**ProjectionSpec(kind="identity").model_dump(), "kind": "fancy"})
    with pytest.raises(UnknownKindError) as info:
        make_projector(stray, SHAPES)
    assert "'fancy'" in str(info.value) and all(k in str(info.value) for k in kinds)
    assert isinstance(info.value, CropiError)


def test_batchedness_is_the_kinds_own_and_the_projectors_read_it():
    """Whether a kind runs on the batched hook path is stated once (BATCHED_KINDS); a projector's
    ``hook_path`` is that statement, and the batched kinds share one base (which parameters they take)."""
    from cropi.projection.factory import PROJECTORS
    from cropi.projection.layers import LayerProjector
    from cropi.projection.spec import BATCHED_KINDS

    for kind, cls in PROJECTORS.items():
        assert issubclass(cls, LayerProjector) == (kind in BATCHED_KINDS), kind
        assert "hook_path" not in vars(cls), kind  # no second statement on a class
    shapes = {"layer.weight": (6, 5), "layer.bias": (6,)}
    for kind in ("sjlt", *BATCHED_KINDS):
        fields = dict(factor_in=2, factor_out=2) if kind == "factored" else dict(dim=8)
        proj = make_projector(ProjectionSpec(kind=kind, **fields), shapes)
        assert proj.hook_path == (kind in BATCHED_KINDS)
        assert proj.param_names == (["layer.weight"] if kind in BATCHED_KINDS else list(shapes))


# -------------------------------------------------------------- brute force --
@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("fraction", [0.4, 1.0])
def test_projector_equals_brute_force_matrix(kind, fraction):
    spec = ProjectionSpec(kind=kind, dim=24, kept_fraction=fraction, seed=11, nnz=3)
    proj = make_projector(spec, SHAPES)
    R, cols = ref_matrix(spec, SHAPES)
    assert proj.n_kept == len(cols) and proj.n_coords == sum(math.prod(s) for s in SHAPES.values())
    for name, shape in SHAPES.items():
        assert proj.kept_indices(name).tolist() == ref_kept(name, math.prod(shape), spec)
    grads = random_grads(SHAPES, 3, seed=2)
    want = gather_kept(grads, cols) @ R.T
    got = proj.project(grads.items())
    assert got.dtype == torch.float32 and got.shape == (3, 24)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_identity_is_kept_coordinates_in_order():
    spec = ProjectionSpec(kind="identity", kept_fraction=0.5, seed=3)
    proj = make_projector(spec, SHAPES)
    cols = [(n, i) for n, s in SHAPES.items() for i in ref_kept(n, math.prod(s), spec)]
    grads = random_grads(SHAPES, 2, seed=4)
    assert proj.out_dim == proj.n_kept == len(cols)
    np.testing.assert_array_equal(proj.project(grads.items()).numpy(), gather_kept(grads, cols).astype(np.float32))


def test_identity_refuses_above_limit():
    spec = ProjectionSpec(kind="identity", kept_fraction=1.0, identity_limit=100)
    with pytest.raises(IdentityLimitError, match="identity_limit=100"):
        make_projector(spec, {"w": (20, 20)})
    assert make_projector(spec, {"w": (10, 10)}).out_dim == 100


# ---------------------------------------------------------------- JL checks --
def gradient_like(n: int, d: int, seed: int) -> torch.Tensor:
    """Correlated heavy-tailed rows: shared low-rank directions plus Student-t(2) noise."""
    rng = np.random.default_rng(seed)
    basis = rng.standard_t(2, size=(3, d))
    mix = rng.normal(size=(n, 3)) * np.array([3.0, 1.5, 0.5])
    return torch.tensor(mix @ basis + rng.standard_t(2, size=(n, d)))


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("structured", [False, True])
def test_jl_preserves_cosines_and_norms(kind, structured):
    d, n, k = 6000, 16, 1024
    spec = ProjectionSpec(kind=kind, dim=k, kept_fraction=0.5, seed=21, nnz=4)
    G = gradient_like(n, d, 0) if structured else torch.randn(n, d, generator=torch.Generator().manual_seed(0),
                                                               dtype=torch.float64)
    proj = make_projector(spec, {"w": (d,)})
    P = proj.project_flat(G.float()).double().numpy()
    X = G[:, proj.kept_indices("w")].numpy()  # exact g[S]
    cos = lambda A: (A / np.linalg.norm(A, axis=1, keepdims=True)) @ (A / np.linalg.norm(A, axis=1, keepdims=True)).T
    exact, approx = cos(X), cos(P)
    if structured:
        assert np.abs(exact[np.triu_indices(n, 1)]).max() > 0.5  # the set really has large cosines
    # JL: errors of order 1/sqrt(k); 5 standard deviations over 120 pairs
    assert np.abs(approx - exact).max() < 5 / math.sqrt(k)
    ratio = (P**2).sum(1) / (X**2).sum(1)
    assert np.abs(ratio - 1).max() < 5 * math.sqrt(2 / k)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_squared_norm_unbiased_over_seeds(kind):
    g = torch.randn(1, 400, generator=torch.Generator().manual_seed(5))
    k, seeds = 16, 300
    ratios = [float(make_projector(ProjectionSpec(kind=kind, dim=k, kept_fraction=1.0, seed=s, nnz=2), {"w": (400,)})
                    .project_flat(g).pow(2).sum()) / float(g.pow(2).sum()) for s in range(seeds)]
    # one ratio has standard deviation about sqrt(2/k); the mean of 300 must be near 1
    assert abs(np.mean(ratios) - 1) < 4 * math.sqrt(2 / k) / math.sqrt(seeds)
    assert np.std(ratios) > 0.05  # the seeds really give different matrices


def test_kept_count_is_binomial():
    numel, f = 200_000, 0.1
    proj = make_projector(ProjectionSpec(kind="sjlt", kept_fraction=f, dim=8), {"w": (numel,)})
    sd = math.sqrt(numel * f * (1 - f))
    assert abs(proj.n_kept - numel * f) < 5 * sd
    assert make_projector(ProjectionSpec(kind="sjlt", kept_fraction=1.0, dim=8), {"w": (numel,)}).n_kept == numel


def test_gaussian_entries_have_mean_zero_variance_one_over_k():
    k, cols = 256, 2000
    proj = make_projector(ProjectionSpec(kind="gaussian", dim=k, kept_fraction=1.0, seed=8), {"w": (cols,)})
    assert isinstance(proj, DenseProjector)
    R = proj.block(hashing.name_key("w", 8), torch.arange(cols)).double().numpy().ravel() * math.sqrt(k)
    N = R.size
    assert abs(R.mean()) < 5 / math.sqrt(N)
    assert abs(R.var() - 1) < 5 * math.sqrt(2 / N)
    assert abs(np.mean(np.abs(R) < 1) - 0.682689) < 0.005  # Gaussian mass within one sigma
    assert abs(np.mean(R**4) - 3) < 0.05  # Gaussian kurtosis


# --------------------------------------------------------------- identities --
def test_same_spec_same_vectors_in_fresh_process(tmp_path):
    script = (
        "import sys, torch, numpy as np\n"
        "from cropi.projection import ProjectionSpec, make_projector\n"
        "shapes = {'a': (50, 40), 'b': (300,)}\n"
        "x = torch.sin(torch.arange(2 * 2300, dtype=torch.float64) * 0.37).float().reshape(2, 2300)\n"
        "out = []\n"
        "for kind in ['sjlt', 'gaussian', 'rademacher', 'identity']:\n"
        "    spec = ProjectionSpec(kind=kind, dim=None if kind == 'identity' else 64, kept_fraction=0.3, seed=77)\n"
        "    out.append(make_projector(spec, shapes).project_flat(x).numpy().ravel())\n"
        "np.save(sys.argv[1], np.concatenate(out))\n"
    )
    path = tmp_path / "vec.npy"
    env = dict(os.environ, PYTHONHASHSEED="12345", OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, env=env, cwd=os.getcwd())
    shapes = {"a": (50, 40), "b": (300,)}
    x = torch.sin(torch.arange(2 * 2300, dtype=torch.float64) * 0.37).float().reshape(2, 2300)
    here, other_seed = [], []
    # bitwise against the child: the same thread count here as there (a dense kind's matmul split over
    # more threads sums in another order); the instruction set is the child's too (same environment)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for kind in ["sjlt", "gaussian", "rademacher", "identity"]:
            dim = None if kind == "identity" else 64
            here.append(make_projector(ProjectionSpec(kind=kind, dim=dim, kept_fraction=0.3, seed=77), shapes)
                        .project_flat(x).numpy().ravel())
            other = make_projector(ProjectionSpec(kind=kind, dim=dim, kept_fraction=0.3, seed=78),
                                   shapes).project_flat(x)
            assert other.numel() != here[-1].size or not np.allclose(other.numpy().ravel(), here[-1])
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_array_equal(np.load(path), np.concatenate(here))


@pytest.mark.parametrize("kind", [*ALL_KINDS, "identity"])
def test_order_and_filtered_parameters_do_not_matter(kind):
    spec = ProjectionSpec(kind=kind, dim=None if kind == "identity" else 32, kept_fraction=0.5, seed=2,
                          exclude=r"^extra\.")
    grads = random_grads(SHAPES, 2, seed=9)
    proj = make_projector(spec, SHAPES)
    want = proj.project(grads.items())
    assert torch.equal(proj.project(reversed(list(grads.items()))), want)
    # an extra parameter the filter excludes: in the shapes, in the call, or only in the call
    extra = {"extra.w": (5, 5)}
    wider = make_projector(spec, {**extra, **SHAPES})
    with_extra = [("extra.w", torch.randn(2, 5, 5)), *grads.items()]
    assert wider.param_names == proj.param_names
    assert torch.equal(wider.project(with_extra), want) and torch.equal(proj.project(with_extra), want)


def test_kept_subset_independent_of_other_parameters():
    spec = ProjectionSpec(kind="sjlt", kept_fraction=0.3, seed=6, dim=16)
    alone = make_projector(spec, {"layers.0.mlp.weight": (9, 11)}).kept_indices("layers.0.mlp.weight")
    crowd = make_projector(spec, {"z": (1000,), "layers.0.mlp.weight": (9, 11), "a": (3,)})
    assert torch.equal(crowd.kept_indices("layers.0.mlp.weight"), alone)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_batch_equals_single_calls_and_settings_do_not_change_results(kind):
    spec = ProjectionSpec(kind=kind, dim=40, kept_fraction=0.6, seed=13, nnz=2)
    grads = random_grads(SHAPES, 5, seed=3)
    proj = make_projector(spec, SHAPES)
    batch = proj.project(grads.items())
    singles = torch.cat([proj.project((n, g[i : i + 1]) for n, g in grads.items()) for i in range(5)])
    torch.testing.assert_close(batch, singles, rtol=1e-5, atol=1e-5)
    tiny = make_projector(spec, SHAPES, cache=False, chunk_coords=7, max_block_elems=50)
    torch.testing.assert_close(tiny.project(grads.items()), batch, rtol=1e-5, atol=1e-5)
    assert tiny.cache_bytes == 0 and proj.cache_bytes > 0  # cache=False keeps no plans


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["sjlt", "gaussian"])
def test_low_precision_inputs_accumulate_in_float32(dtype, kind):
    shapes = {"w": (20_000,)}
    spec = ProjectionSpec(kind=kind, dim=8, kept_fraction=1.0, seed=1, nnz=1)
    g = random_grads(shapes, 2, seed=7, dtype=dtype)["w"] + 1.0  # positive mean: large partial sums
    proj = make_projector(spec, shapes)
    got = proj.project([("w", g)])
    if kind == "gaussian":  # the projector's own float32 entries: only the accumulation is under test
        R = proj.block(hashing.name_key("w", 1), torch.arange(20_000)).double().numpy().T
    else:
        R = ref_matrix(spec, shapes)[0]
    want = g.double().numpy() @ R.T
    assert got.dtype == torch.float32
    # float32 accumulation: ~1e-6 relative; float16/bfloat16 accumulation would be off by ~1e-3 or worse
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=2e-5 * np.abs(want).max())


# -------------------------------------------------------------------- errors --
def test_input_errors_are_clear():
    proj = make_projector(ProjectionSpec(kind="sjlt", dim=8, exclude="bias"), SHAPES)
    grads = random_grads(SHAPES, 1, seed=0)
    assert "layers.0.mlp.bias" not in proj.param_names
    with pytest.raises(ProjectionInputError, match="missing"):
        proj.project([(n, g) for n, g in grads.items() if n != "embed.weight"])
    with pytest.raises(ProjectionInputError, match="unknown parameter 'ghost'"):
        proj.project([*grads.items(), ("ghost", torch.zeros(1, 2))])
    proj.project([*grads.items(), ("ghost.bias", torch.zeros(1, 2))])  # excluded by the filter: skipped
    with pytest.raises(ProjectionInputError, match="appears twice"):
        proj.project([*grads.items(), ("embed.weight", grads["embed.weight"])])
    with pytest.raises(ProjectionInputError, match="leading batch dimension"):
        proj.project([(n, g[0]) if n == "embed.weight" else (n, g) for n, g in grads.items()])
    with pytest.raises(ProjectionInputError, match="floating-point"):
        proj.project([(n, g.long()) for n, g in grads.items()])
    with pytest.raises(ProjectionInputError, match="project_flat needs shape"):
        proj.project_flat(torch.zeros(1, 3))
    with pytest.raises(EmptySelectionError, match="no parameter survives"):
        make_projector(ProjectionSpec(kind="sjlt", include="nothing-matches"), SHAPES)
    assert issubclass(ProjectionInputError, CropiError) and issubclass(IdentityLimitError, CropiError)


def test_project_flat_matches_project():
    proj = make_projector(ProjectionSpec(kind="sjlt", dim=16, kept_fraction=0.7), SHAPES)
    grads = random_grads(SHAPES, 3, seed=1)
    flat = torch.cat([g.reshape(3, -1) for g in grads.values()], dim=1)
    assert torch.equal(proj.project_flat(flat), proj.project(grads.items()))


# ----------------------------------------------------------------------- GPU --
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", [*ALL_KINDS, "identity"])
def test_cpu_and_cuda_agree(kind):
    shapes = {"a": (300, 70), "b": (5000,)}
    spec = ProjectionSpec(kind=kind, dim=None if kind == "identity" else 512, kept_fraction=0.3, seed=4)
    grads = random_grads(shapes, 4, seed=6)
    cpu = make_projector(spec, shapes).project(grads.items())
    gpu = make_projector(spec, shapes, device="cuda").project((n, g.cuda()) for n, g in grads.items())
    for name in shapes:
        assert torch.equal(make_projector(spec, shapes, device="cuda").kept_indices(name).cpu(),
                           make_projector(spec, shapes).kept_indices(name))
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-5 * float(cpu.abs().max()))
