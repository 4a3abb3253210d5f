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


# ---------------------------------------------------------------- selection diagnostics


def _labelled_pool():
    # source a: 20 prompts, answers 1 (x10), 2 (x6), 3 (x4); source b: 20 prompts, answers 0..9 twice each
    pool = {f"a{i}": ("a", "1" if i < 10 else "2" if i < 16 else "3") for i in range(20)}
    pool |= {f"b{i}": ("b", str(i % 10)) for i in range(20)}
    return pool


def test_selection_mix_against_a_hand_count():
    from cropi.scoring.diagnostics import selection_mix

    pool = _labelled_pool()
    chosen = ["a0", "a1", "a10", "b0", "b10", "b1"]  # a: answers 1, 1, 2; b: answers 0, 0, 1
    mix = selection_mix(chosen, pool)
    a, b = mix["sources"]["a"], mix["sources"]["b"]
    assert mix["n"] == 6 and mix["pool_n"] == 40
    assert a["pool_share"] == 0.5 and a["selected_share"] == 0.5 and a["selected"] == 3
    assert a["pool_modal_answer_share"] == 10 / 20 and a["selected_modal_answer"] == "1"
    assert a["selected_modal_answer_share"] == pytest.approx(2 / 3)
    assert b["pool_modal_answer_share"] == 2 / 20 and b["selected_modal_answer"] == "0"
    assert b["selected_modal_answer_share"] == pytest.approx(2 / 3)
    assert mix["warnings"] == []  # 3 selected prompts per source: below MIN_SELECTED, no verdict
    with pytest.raises(KeyError):
        selection_mix(["zz"], pool)


def test_label_skew_warning_fires_on_a_skewed_selection_only():
    from cropi.scoring.diagnostics import LABEL_SKEW, MIN_SELECTED, SKEW_THRESHOLD, selection_mix

    pool = {f"p{i}": ("s", str(i % 10)) for i in range(200)}  # 10% per answer
    skewed = [f"p{i}" for i in range(200) if i % 10 == 7][:MIN_SELECTED]  # all answer 7: 100% vs 10%
    balanced = [f"p{i}" for i in range(20)]  # two of each answer: 10% vs 10%
    warned = selection_mix(skewed, pool)["warnings"]
    assert [(w["code"], w["data_source"], w["answer"]) for w in warned] == [(LABEL_SKEW, "s", "7")]
    assert "100%" in warned[0]["message"] and "validation_groups" in warned[0]["message"]
    assert selection_mix(balanced, pool)["warnings"] == []
    # just at the threshold is not a warning; just past it is
    at = [f"p{i}" for i in range(100) if i % 10 == 7][:3] + [f"p{i}" for i in range(100) if i % 10 != 7][:7]
    share = 3 / 10
    assert (share - 0.1 > SKEW_THRESHOLD) == bool(selection_mix(at, pool)["warnings"])


def test_validation_groups_split_each_set_by_label():
    from cropi.scoring.ranking import MIN_GROUP, split_by_label

    ids = [f"v{i}" for i in range(14)]
    vecs = np.arange(14 * 2, dtype=np.float32).reshape(14, 2)
    status = ["ok"] * 13 + ["zero_advantage"]
    labels = {p: ("1" if i < 6 else "2" if i < 12 else "3") for i, p in enumerate(ids)}  # 3 has 1 ok prompt
    out = split_by_label({"val": (ids, vecs, status)}, {"val": labels})
    assert sorted(out) == ["val[1]", "val[2]"]  # "3" (1 ok + 1 zero) pooled into rest, which is too small
    got_ids, got_vecs, _ = out["val[2]"]
    assert got_ids == ids[6:12] and np.array_equal(got_vecs, vecs[6:12]) and MIN_GROUP <= 6
    untouched = split_by_label({"val": (ids, vecs, status), "w": (ids, vecs, status)}, {"val": labels})
    assert untouched["w"][0] == ids


def test_grouping_validation_by_answer_draws_the_selection_from_every_label():
    """The label-skew mechanism in miniature: each answer label pushes its own direction; the validation
    set holds 8 prompts of label A to 2 of label B. The plain mean ranks A's pool prompts first; one vector
    per label, fused by reciprocal rank, interleaves the labels."""
    rng = np.random.default_rng(0)
    a_dir, b_dir = np.eye(16)[0], np.eye(16)[1]
    pool = np.stack([a_dir + 0.1 * rng.standard_normal(16) for _ in range(10)] +
                    [b_dir + 0.1 * rng.standard_normal(16) for _ in range(10)]).astype(np.float32)
    pool_ids = [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)]
    val = np.stack([a_dir] * 8 + [b_dir] * 2).astype(np.float32) + 0.01
    val_ids = [f"v{i}" for i in range(10)]
    status = ["ok"] * 10
    sets = {"val": (val_ids, val, status)}
    plain = rank_pool(pool_ids, pool, ["ok"] * 20, sets).select(top_k=6)
    assert all(p.startswith("a") for p in plain)
    labels = {"val": {p: ("A" if i < 8 else "B") for i, p in enumerate(val_ids)}}
    from cropi.scoring import ranking as ranking_module

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ranking_module, "MIN_GROUP", 2)  # label B has 2 validation prompts here
        grouped = rank_pool(pool_ids, pool, ["ok"] * 20, sets, groups=labels)
    assert set(grouped.scores) == {"val[A]", "val[B]"}
    picked = grouped.select(top_k=6)
    assert sum(p.startswith("a") for p in picked) == 3 and sum(p.startswith("b") for p in picked) == 3
