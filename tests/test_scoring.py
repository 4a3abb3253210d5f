"""Scoring: cosine influence, validation vectors, fusion, selection, against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from cropi.errors import InvalidInputError
from cropi.scoring import Ranking, cosine_scores, fuse, rank_pool, ranks, select_top, validation_vector


def _pool(n=50, k=16, seed=0):
    rng = np.random.default_rng(seed)
    ids = [f"p{i:03d}" for i in rng.permutation(n)]
    vecs = rng.normal(size=(n, k)).astype(np.float32)
    status = ["ok"] * n
    return ids, vecs, status


def test_cosine_matches_brute_force_and_masks_non_ok():
    ids, vecs, status = _pool()
    status[3] = "zero_advantage"
    vecs[5] = 0
    t = np.random.default_rng(1).normal(size=16)
    got = cosine_scores(vecs, status, t, chunk=7)
    for i, v in enumerate(vecs):
        if i in (3, 5):
            assert np.isnan(got[i])
        else:
            want = float(v.astype(np.float64) @ t / (np.linalg.norm(v.astype(np.float64)) * np.linalg.norm(t)))
            assert got[i] == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_validation_vector_samples_ok_prompts_with_seed():
    ids, vecs, status = _pool(300)
    status[:10] = ["zero_advantage"] * 10
    v1, used1 = validation_vector(ids, vecs, status, max_prompts=100, seed=3)
    v2, used2 = validation_vector(ids, vecs, status, max_prompts=100, seed=3)
    _, used3 = validation_vector(ids, vecs, status, max_prompts=100, seed=4)
    assert used1 == used2 and used1 != used3 and len(used1) == 100
    assert len(set(used1)) == 100 and len(set(used3)) == 100  # a sample without replacement
    assert not set(used1) & set(ids[:10])
    rows = [ids.index(p) for p in used1]
    np.testing.assert_allclose(v1, vecs[rows].mean(axis=0), rtol=1e-5, atol=1e-6)
    small, used = validation_vector(ids[:20], vecs[:20], ["ok"] * 20, max_prompts=100)
    np.testing.assert_allclose(small, vecs[:20].mean(axis=0), rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidInputError, match="no prompt with status 'ok'"):
        validation_vector(ids[:3], vecs[:3], ["zero_advantage"] * 3)


def test_ranks_break_ties_by_prompt_id():
    scores = np.array([0.5, 0.9, 0.5, np.nan, 0.1])
    ids = ["b", "z", "a", "c", "d"]
    assert ranks(scores, ids).tolist() == [3, 1, 2, 0, 4]


def test_rrf_and_max_fusion_brute_force():
    rng = np.random.default_rng(0)
    ids = [f"q{i}" for i in range(30)]
    a, b = rng.normal(size=30), rng.normal(size=30)
    a[4] = np.nan
    fused = fuse({"a": a, "b": b}, ids, "rrf")
    for i in range(30):
        if i == 4:
            assert np.isnan(fused[i])
            continue
        ra = 1 + sum(1 for j in range(30) if np.isfinite(a[j]) and (a[j] > a[i] or (a[j] == a[i] and ids[j] < ids[i])))
        rb = 1 + sum(1 for j in range(30) if b[j] > b[i] or (b[j] == b[i] and ids[j] < ids[i]))
        assert fused[i] == pytest.approx(1 / ra + 1 / rb)
    mx = fuse({"a": a, "b": b}, ids, "max")
    assert mx[0] == max(a[0], b[0]) and np.isnan(mx[4])
    with pytest.raises(InvalidInputError, match="unknown fusion"):
        fuse({"a": a}, ids, "mean")


def test_selection_never_picks_non_ok_and_is_deterministic():
    ids = [f"p{i}" for i in range(20)]
    fused = np.linspace(1, 0, 20)
    status = ["ok"] * 20
    status[0] = "truncated"
    status[1] = "nonfinite"
    picked = select_top(ids, fused, status, top_fraction=0.1)
    assert picked == ["p2", "p3"]
    assert select_top(ids, fused, status, top_k=100) == ids[2:]
    tied = select_top(["b", "a", "c"], np.array([1.0, 1.0, 1.0]), ["ok"] * 3, top_k=2)
    assert tied == ["a", "b"]
    for bad in (dict(top_fraction=0), dict(top_fraction=1.5), dict(top_k=0), {}):
        with pytest.raises(InvalidInputError):
            select_top(ids, fused, status, **bad)


@pytest.mark.parametrize("n, fraction, want", [(25, 0.1, 3), (21, 0.1, 3), (20, 0.1, 2), (9, 0.5, 5), (3, 0.01, 1)])
def test_top_fraction_rounds_up(n, fraction, want):
    ids = [f"p{i:02d}" for i in range(n)]
    picked = select_top(ids, np.linspace(1, 0, n), ["ok"] * n, top_fraction=fraction)
    assert picked == ids[:want]
    r = Ranking.from_table(rank_pool(ids, _pool(n)[1], ["ok"] * n, {"v": _pool(5, seed=9)}).to_table())
    assert len(r.select(top_fraction=fraction)) == want


def test_validation_sample_is_without_replacement_at_every_size():
    for n, cap in ((101, 100), (150, 100), (12, 10), (3, 2)):
        ids, vecs, status = _pool(n, seed=n)
        for seed in range(5):
            mean, used = validation_vector(ids, vecs, status, max_prompts=cap, seed=seed)
            assert len(used) == cap == len(set(used))
            rows = [ids.index(p) for p in used]
            np.testing.assert_allclose(mean, vecs[rows].astype(np.float64).mean(axis=0), rtol=1e-5, atol=1e-6)


def test_rank_pool_roundtrips_through_arrow():
    ids, vecs, status = _pool(40)
    status[7] = "zero_advantage"
    val = {"gsm": _pool(10, seed=2), "math": _pool(12, seed=3)}
    r = rank_pool(ids, vecs, status, val, fusion="rrf")
    assert r.excluded == {"zero_advantage": 1}
    assert sorted(r.rank[r.rank > 0].tolist()) == list(range(1, 40))
    back = Ranking.from_table(r.to_table())
    order = [back.prompt_ids.index(p) for p in ids]
    np.testing.assert_array_equal(back.rank[order], r.rank)
    np.testing.assert_allclose(back.scores["math"][order], r.scores["math"])
    assert back.select(top_k=5) == r.select(top_k=5)
    assert r.to_table()["rank"].to_pylist()[:3] == [1, 2, 3]
