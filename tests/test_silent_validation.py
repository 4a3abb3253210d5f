"""A validation set without one ``ok`` prompt (every group's rewards equal: its targets all solved or all failed)
has a zero gradient, so it adds nothing to any pool prompt's influence: the ranking leaves it out, says so in its
meta and its selection's warnings, and refuses, naming every set, only when all are silent. The demo says so
before it trains anything, and refuses there when a method of its would have to rank."""

from __future__ import annotations


import numpy as np
import pytest

from cropi.errors import InvalidInputError
from cropi.pipeline.rank import rank, silent_splits
from cropi.scoring import rank_pool
from cropi.scoring.diagnostics import SILENT_VALIDATION
from support.store import CKPT, open_split


def _set(n: int, seed: int, status: str | None = "ok", dim: int = 16):
    rng = np.random.default_rng(seed)
    ids = [f"s{seed}-{i:03d}" for i in range(n)]
    return ids, rng.standard_normal((n, dim)).astype(np.float32), [status] * n


def test_a_silent_set_is_left_out_exactly_as_if_it_were_not_given():
    pool_ids, pool_vecs, pool_status = _set(60, seed=1)
    pool_status[5] = "zero_advantage"
    signal = _set(20, seed=2)
    silent = _set(15, seed=3, status="zero_advantage")
    silent[2][0] = "truncated"  # no ok prompt among mixed non-ok statuses is silent too

    got = rank_pool(pool_ids, pool_vecs, pool_status, {"val_a": signal, "val_b": silent})
    alone = rank_pool(pool_ids, pool_vecs, pool_status, {"val_a": signal})
    assert set(got.scores) == {"val_a"}
    np.testing.assert_array_equal(got.rank, alone.rank)
    np.testing.assert_array_equal(got.fused, alone.fused)
    assert got.meta["silent_validation"] == {"val_b": {"prompts": 15, "zero_advantage": 14, "truncated": 1}}
    [warning] = got.meta["warnings"]
    assert warning["code"] == SILENT_VALIDATION and warning["sets"] == ["val_b"] and warning["ranked_on"] == ["val_a"]
    assert "val_b" in warning["message"]

    # brute force, independent of the implementation: one set's order is the pool rows' cosine with the mean of
    # its ok vectors, largest first; the non-ok pool prompt is not ranked
    mean = signal[1].astype(np.float64).mean(axis=0)
    cos = pool_vecs.astype(np.float64) @ mean / (np.linalg.norm(pool_vecs, axis=1) * np.linalg.norm(mean))
    ranked = [i for i in np.argsort(-cos) if i != 5]
    assert [pool_ids[i] for i in ranked] == [pool_ids[i] for i in np.argsort(got.rank) if got.rank[i] > 0]
    assert got.rank[5] == 0


def test_every_set_silent_is_refused_naming_each_with_its_counts():
    pool = _set(30, seed=1)
    with pytest.raises(InvalidInputError) as err:
        rank_pool(*pool, {"val_a": _set(4, seed=2, status="zero_advantage"),
                          "val_b": _set(3, seed=3, status="nonfinite")})
    said = str(err.value)
    assert "val_a: 4 prompts, none ok (zero_advantage 4)" in said
    assert "val_b: 3 prompts, none ok (nonfinite 3)" in said
    assert "samples per validation prompt" in said  # what to do


def _write(split, ids, status: str, seed: int):
    rng = np.random.default_rng(seed)
    with split.writer("w0") as w:
        for pid in ids:
            w.append(prompt_id=pid, vector=rng.standard_normal(split.dim), raw_norm=1.0, n_responses=8,
                     reward_mean=0.0 if status != "ok" else 0.5, reward_std=0.0, n_tokens=10, status=status)


@pytest.mark.parametrize("selector", ["cropi", "diverse"])
def test_a_stored_ranking_with_a_silent_set_warns_with_its_selection(tmp_path, selector):
    store = tmp_path / "store"
    pool = [f"p{i:02d}" for i in range(40)]
    _write(open_split(store, split="pool"), pool, "ok", 1)
    _write(open_split(store, split="val_a"), [f"a{i}" for i in range(10)], "ok", 2)
    _write(open_split(store, split="val_b"), [f"b{i}" for i in range(6)], "zero_advantage", 3)
    assert silent_splits(str(store), CKPT.name, ["val_a", "val_b"]) == {"val_b": {"prompts": 6,
                                                                                     "zero_advantage": 6}}
    labels = {p: ("src", "1") for p in pool}
    got = rank(str(store), CKPT.name, "pool", ["val_a", "val_b"], top_fraction=0.25, selector=selector,
               labels=labels)
    assert 0 < sum(got.table["selected"].to_pylist()) <= 10  # the selection is made from the signal set's scores
    assert [w["code"] for w in got.meta["selection"]["warnings"]].count(SILENT_VALIDATION) == 1
    assert got.meta["silent_validation"] == {"val_b": {"prompts": 6, "zero_advantage": 6}}
    with pytest.raises(InvalidInputError, match="val_b: 6 prompts"):
        rank(str(store), CKPT.name, "pool", ["val_b"], top_fraction=0.25, selector=selector)


UNANSWERABLE = '''
import dataclasses
from cropi.tasks import lists
from cropi.tasks.remix import remix

_task = remix("unanswerable", ("nth",), {{s: 1 / 6 for s in lists.SKILLS}}, "some splits unanswerable")


def _splits(seed, asked):
    out = _task.make_splits(seed, asked)
    for split in {splits!r}:
        out[split] = [r.model_copy(update={{"answer": "unanswerable"}}) for r in out[split]]
    return out


TASK = dataclasses.replace(_task, make_splits=_splits)
'''


@pytest.mark.parametrize("splits, methods, said", [
    (("val_nth", "test_nth"), "cropi,full", ["no validation set carries a gradient", "val_nth: 24 prompts, none ok"]),
    (("pool",), "informative,full", ["no pool prompt has an ok gradient at theta_0 (360 prompts: zero_advantage 360)",
                                     "informative have nothing to select"]),
])
def test_the_demo_refuses_what_leaves_nothing_to_select_before_training(tmp_path, monkeypatch, capsys, splits,
                                                                         methods, said):
    """A task whose targets, or whose pool, no response of theta_0 ever answers (every group's rewards 0)."""
    from cropi.cli import main

    module = "unanswerable_" + "_".join(splits)  # a module name per case: an imported module stays imported
    (tmp_path / f"{module}.py").write_text(UNANSWERABLE.format(splits=splits))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--task", f"{module}:TASK", "--seeds", "1", "--methods", methods,
                 "--workers", "1", "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert all(s in err for s in said), err[-2000:]
    assert not list((out / "runs").glob("*/stages/*/train"))  # refused before any method trained
