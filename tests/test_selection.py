"""The selector registry: every rule against an independent brute force, and the errors a caller meets."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cropi.errors import InvalidInputError
from cropi.scoring import rank_pool
from cropi.selection import REGISTRY, SELECTORS, SelectionInputs, fraction_count, get_selector, pass_rates, select
from cropi.selection.influence import greedy_under_budget, mean_pairwise_cosine


def pick(name, ids, fraction=0.1, **known):
    return select(name, SelectionInputs(list(ids), fraction, **known)).chosen


# ---------------------------------------------------------------- the registry and its errors


def test_unknown_selector_is_refused_listing_the_registered_ones():
    with pytest.raises(InvalidInputError, match="unknown selector 'best'.*cropi.*diverse"):
        get_selector("best")
    assert set(SELECTORS) == set(REGISTRY) >= {"cropi", "full", "random", "pass_rate", "informative", "oracle",
                                               "positive", "diverse"}


def test_missing_inputs_name_the_command_that_computes_them():
    with pytest.raises(InvalidInputError, match="needs pass_rates.*cropi collect"):
        pick("informative", ["a", "b"])
    with pytest.raises(InvalidInputError, match="needs ranking, vectors.*cropi score.*cropi gradients"):
        pick("diverse", ["a", "b"])


def test_options_are_a_closed_model():
    with pytest.raises(InvalidInputError, match="bad options for selector 'cropi'.*budget"):
        select("cropi", SelectionInputs(["a"], 0.5), {"budget": 3})


# ---------------------------------------------------------------- controls


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=1, max_size=60), st.floats(0.01, 1.0), st.integers(0, 5))
def test_pass_rate_selection_is_the_top_fraction_by_p_times_1_minus_p(successes, fraction, seed):
    ids = [f"p{i:03d}" for i in range(len(successes))]
    rates = {p: k / 8 for p, k in zip(ids, successes)}
    chosen = pick("pass_rate", ids, fraction, seed=seed, pass_rates=rates)
    score = {p: rates[p] * (1 - rates[p]) for p in ids}
    useful = [p for p in ids if score[p] > 0]
    assert len(chosen) == len(set(chosen)) == min(len(useful), math.ceil(fraction * len(ids)))
    assert [score[p] for p in chosen] == sorted((score[p] for p in chosen), reverse=True)
    rest = [score[p] for p in useful if p not in chosen]
    assert not rest or score[chosen[-1]] >= max(rest)
    assert chosen == pick("pass_rate", ids, fraction, seed=seed, pass_rates=rates)


def test_pass_rates_ignore_failed_rewards():
    rates = pass_rates([("a", [1.0, 0.0, None, 1.0]), ("b", [None, None]), ("c", [0.0])])
    assert rates == {"a": pytest.approx(2 / 3), "c": 0.0}


def test_random_and_full_selection():
    ids = [f"p{i}" for i in range(50)]
    a = pick("random", ids, seed=3, salt="0")
    assert len(a) == 5 and set(a) <= set(ids)
    assert a == pick("random", ids, seed=3, salt="0")
    assert len({tuple(pick("random", ids, seed=3, salt=str(m))) for m in range(5)}) > 1  # afresh every stage
    assert pick("full", ids) == ids
    with pytest.raises(InvalidInputError, match="select_fraction"):
        pick("random", ids, 0.0)


def test_informative_control_draws_only_mixed_reward_prompts():
    ids = [f"p{i}" for i in range(40)]
    rates = {p: (0.0 if i % 4 == 0 else 1.0 if i % 4 == 1 else (i % 8) / 8) for i, p in enumerate(ids)}
    rates.pop("p2")  # no scored reward: never drawn
    mixed = {p for p, r in rates.items() if 0 < r < 1}
    picked = pick("informative", ids, 0.25, seed=3, pass_rates=rates)
    assert len(picked) == fraction_count(0.25, len(ids)) == 10 and len(set(picked)) == 10
    assert set(picked) <= mixed
    assert pick("informative", ids, 0.25, seed=3, pass_rates=rates) == picked  # deterministic in (seed, stage)
    assert pick("informative", ids, 0.25, seed=3, salt="1", pass_rates=rates) != picked  # afresh every stage
    assert set(pick("informative", ids, 1.0, pass_rates=rates)) == mixed  # fewer mixed than asked: all


# ---------------------------------------------------------------- influence selectors


def _pool(seed=0, n=60, k=32, sets=2):
    """Pool vectors, some zero (zero-advantage), and validation vectors: a ranking as the score step makes it."""
    rng = np.random.default_rng(seed)
    ids = [f"q{i:03d}" for i in range(n)]
    vecs = rng.normal(size=(n, k))
    status = ["ok" if i % 5 else "zero_advantage" for i in range(n)]
    vecs[[i for i, s in enumerate(status) if s != "ok"]] = 0.0
    val = {f"v{j}": ([f"v{j}-{i}" for i in range(6)], rng.normal(size=(6, k)) + rng.normal(size=k), ["ok"] * 6)
           for j in range(sets)}
    return ids, vecs, status, rank_pool(ids, vecs, status, val)


def _gain_brute(ranking, vecs, val_means):
    """Mean cosine with each set's mean validation vector, from the raw vectors."""
    out = {}
    for i, p in enumerate(ranking.prompt_ids):
        if ranking.status[i] != "ok":
            continue
        u = vecs[i] / np.linalg.norm(vecs[i])
        out[p] = float(np.mean([u @ (m / np.linalg.norm(m)) for m in val_means]))
    return out


def test_cropi_selector_is_the_top_fraction_by_fused_score():
    ids, vecs, status, ranking = _pool()
    chosen = pick("cropi", ids, 0.2, ranking=ranking)
    ok = [i for i, s in enumerate(status) if s == "ok"]
    best = sorted(ok, key=lambda i: (-ranking.fused[i], ids[i]))[:fraction_count(0.2, len(ids))]
    assert chosen == [ids[i] for i in best]


def test_positive_draws_only_ok_prompts_of_positive_mean_cosine():
    ids, vecs, status, ranking = _pool(seed=1)
    gain = {p: float(np.mean([ranking.scores[s][i] for s in ranking.scores])) for i, p in enumerate(ids)
            if status[i] == "ok"}
    positive = {p for p, g in gain.items() if g > 0}
    chosen = pick("positive", ids, 0.1, ranking=ranking, salt="a")
    assert len(chosen) == len(set(chosen)) == min(len(positive), fraction_count(0.1, len(ids)))
    assert set(chosen) <= positive
    assert chosen == pick("positive", ids, 0.1, ranking=ranking, salt="a")
    assert chosen != pick("positive", ids, 0.1, ranking=ranking, salt="b")
    assert set(pick("positive", ids, 1.0, ranking=ranking)) == positive


def test_mean_pairwise_cosine_is_the_mean_over_pairs():
    rng = np.random.default_rng(2)
    u = rng.normal(size=(9, 5)) + 0.5
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    brute = np.mean([u[i] @ u[j] for i, j in itertools.combinations(range(9), 2)])
    assert mean_pairwise_cosine(u) == pytest.approx(brute, abs=1e-12)


def _greedy_brute(units, gain, n, c):
    """The rule as written, recomputing |sum u|^2 of every candidate subset from scratch."""
    picked: list[int] = []
    for t in range(1, min(n, len(units)) + 1):
        free = [i for i in range(len(units)) if i not in picked]
        size = {i: float(np.sum(units[picked + [i]], axis=0) @ np.sum(units[picked + [i]], axis=0)) for i in free}
        fits = [i for i in free if size[i] <= t + t * (t - 1) * max(c, 0) + 1e-9]
        picked.append(max(fits, key=lambda i: (gain[i], -i)) if fits else min(free, key=lambda i: (size[i], i)))
    return picked


@pytest.mark.parametrize("seed,c", [(0, 0.0), (1, 0.05), (2, 0.3), (3, -0.1)])
def test_greedy_under_budget_matches_a_brute_force(seed, c):
    rng = np.random.default_rng(seed)
    units = rng.normal(size=(25, 6)) + rng.normal(size=6)  # a shared component: budgets bind
    units /= np.linalg.norm(units, axis=1, keepdims=True)
    gain = rng.normal(size=25)
    assert greedy_under_budget(units, gain, 12, c) == _greedy_brute(units, gain, 12, c)


def test_diverse_avoids_a_mutually_aligned_cluster_that_cropi_takes():
    """A shortcut: 12 prompts whose gradients share one direction that also aligns with the targets
    (high cosine each), and 48 spread prompts with a smaller positive cosine. CROPI's top 10 are
    the cluster; the budget of a random draw's concentration lets diverse take few of them."""
    rng = np.random.default_rng(4)
    k = 64
    target = np.zeros(k)
    target[0] = 1.0
    shortcut = np.zeros(k)
    shortcut[:2] = [0.6, 0.8]
    cluster = shortcut + 0.03 * rng.normal(size=(12, k))
    spread = rng.normal(size=(48, k)) + 0.9 * target * np.sqrt(k) / 4
    vecs = np.vstack([cluster, spread])
    ids = [f"c{i:02d}" for i in range(12)] + [f"s{i:02d}" for i in range(48)]
    status = ["ok"] * 60
    val = {"v": (["v0", "v1"], np.stack([target, target]), ["ok", "ok"])}
    ranking = rank_pool(ids, vecs, status, val)
    cropi = pick("cropi", ids, 10 / 60, ranking=ranking)
    diverse = pick("diverse", ids, 10 / 60, ranking=ranking, vectors=vecs)
    assert sum(p.startswith("c") for p in cropi) == 10
    assert sum(p.startswith("c") for p in diverse) <= 3
    units = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    chosen = units[[ids.index(p) for p in diverse]]
    assert mean_pairwise_cosine(chosen) <= mean_pairwise_cosine(units) + 1e-9  # no more concentrated than random
    brute = _gain_brute(ranking, vecs, [target])
    assert all(brute[p] > 0 for p in diverse)


def test_diverse_ranks_excluded_prompts_never_and_takes_what_fits():
    ids, vecs, status, ranking = _pool(seed=5)
    chosen = pick("diverse", ids, 0.2, ranking=ranking, vectors=vecs)
    ok = {p for p, s in zip(ids, status) if s == "ok"}
    positive = [i for i, p in enumerate(ids) if p in ok and np.mean([ranking.scores[s][i] for s in ranking.scores]) > 0]
    assert set(chosen) <= ok and len(chosen) == len(set(chosen))
    assert len(chosen) == min(fraction_count(0.2, len(ids)), len(positive))
    assert set(pick("diverse", ids, 1.0, ranking=ranking, vectors=vecs)) == {ids[i] for i in positive}


# ---------------------------------------------------------------- what a selection is made of


def test_field_skew_warns_on_a_latent_feature_the_answers_hide():
    from cropi.scoring.diagnostics import FIELD_SKEW, field_skew

    ids = [f"p{i}" for i in range(100)]
    position = {p: ("last" if i % 4 == 0 else "first") for i, p in enumerate(ids)}  # 25% last in the pool
    skewed = [p for p in ids if position[p] == "last"][:18] + [p for p in ids if position[p] == "first"][:2]
    out = field_skew(skewed, {"answer_position": position})
    row = out["fields"]["answer_position"]
    assert row == {"value": "last", "selected_share": 0.9, "pool_share": 0.25}
    assert [w["code"] for w in out["warnings"]] == [FIELD_SKEW]
    even = [p for p in ids if position[p] == "last"][:5] + [p for p in ids if position[p] == "first"][:15]
    assert field_skew(even, {"answer_position": position})["warnings"] == []  # 75% first, as the pool
    assert field_skew(skewed[:9], {"answer_position": position})["warnings"] == []  # too few to judge


def test_alignment_is_the_mean_pairwise_cosine_and_warns_past_a_batch_snr_of_one():
    from cropi.scoring.diagnostics import CONCENTRATED, alignment

    rng = np.random.default_rng(7)
    pool = rng.normal(size=(40, 16))
    pool[:3] = 0.0  # zero-advantage rows carry no direction: left out
    shared = rng.normal(size=16)
    chosen = shared + 0.3 * rng.normal(size=(10, 16))

    def brute(rows):
        rows = [r / np.linalg.norm(r) for r in rows if np.linalg.norm(r) > 0]
        return np.mean([a @ b for a, b in itertools.combinations(rows, 2)])

    out = alignment(chosen, pool, batch=16)
    assert out["selection_alignment"] == pytest.approx(brute(chosen), abs=1e-12)
    assert out["random_alignment"] == pytest.approx(brute(pool), abs=1e-12)
    c = out["selection_alignment"]
    assert out["batch_signal_to_noise"] == pytest.approx(16 * c / (1 - c))
    assert [w["code"] for w in out["warnings"]] == [CONCENTRATED]
    assert alignment(pool[3:13], pool, batch=16)["warnings"] == []  # a random draw: no warning
    assert "batch_signal_to_noise" not in alignment(chosen, pool)  # no batch size, no verdict


def test_lists_declares_the_answer_position_shortcut():
    from cropi.data import PromptRecord
    from cropi.tasks.lists import TASK, answer_position

    def rec(question, answer):
        return PromptRecord(prompt_id="x", prompt=[{"role": "user", "content": question}], answer=str(answer))

    assert answer_position(rec("After 887 in 412 887 305?", 305)) == "last"
    assert answer_position(rec("Before 887 in 412 887 305?", 412)) == "first"
    assert answer_position(rec("Largest of 412 887 305?", 887)) == "middle"
    assert answer_position(rec("First above 500 in 412 887 305?", 887)) == "middle"
    assert answer_position(rec("Third of 305 412 887?", 887)) == "last"  # "of" when the list follows "of"
    assert TASK.fields["answer_position"] is answer_position


def test_every_demo_method_has_its_own_colour():
    from cropi.demo.plots import color
    from cropi.demo.settings import known_methods

    colours = [color(m) for m in known_methods()]
    assert len(set(colours)) == len(colours)


def test_diverse_past_its_work_bound_runs_the_sampled_greedy(monkeypatch):
    """Past the exact greedy's bound the selector still answers (it refused before): distinct ok prompts of
    positive gain, as many as fit, the same for the same stage and seed, from the sampled greedy."""
    from cropi.selection import influence

    ids, vecs, status, ranking = _pool(seed=6, n=200)
    exact = pick("diverse", ids, 0.2, ranking=ranking, vectors=vecs)
    calls = []
    sampled = influence.sampled_greedy_under_budget
    monkeypatch.setattr(influence, "sampled_greedy_under_budget", lambda *a, **k: calls.append(1) or sampled(*a, **k))
    monkeypatch.setattr(influence, "MAX_GREEDY_WORK", 10.0)
    chosen = pick("diverse", ids, 0.2, ranking=ranking, vectors=vecs)
    assert calls and len(chosen) == len(set(chosen)) == len(exact)  # both take min(count, candidates)
    assert set(chosen) <= {p for p, s in zip(ids, status) if s == "ok"}
    assert all(np.mean([ranking.scores[s][ids.index(p)] for s in ranking.scores]) > 0 for p in chosen)
    assert pick("diverse", ids, 0.2, ranking=ranking, vectors=vecs) == chosen  # seeded: a resume picks the same


@pytest.mark.parametrize("seed,c", [(0, 0.0), (1, 0.05), (2, 0.3), (3, -0.1)])
def test_sampled_greedy_whose_sample_holds_every_row_is_the_brute_force(seed, c):
    """With ``ln(1 / miss) >= n`` the sample (``R / n * ln(1 / miss)`` rows) is every free row at every step: the
    sampled greedy is then the exact one, so its budget, fit test and running sum are checked against the brute
    force."""
    from cropi.selection.influence import sampled_greedy_under_budget

    rng = np.random.default_rng(seed)
    units = rng.normal(size=(25, 6)) + rng.normal(size=6)
    units /= np.linalg.norm(units, axis=1, keepdims=True)
    gain = rng.normal(size=25)
    got = sampled_greedy_under_budget(units, gain, 12, c, np.random.default_rng(9), miss=1e-9)
    assert got == _greedy_brute(units, gain, 12, c)


def test_sampled_greedy_picks_among_the_n_best_free_rows_but_at_rate_miss():
    """Where every row fits (``c = 1``: the budget ``t^2`` bounds any sum of ``t`` unit rows), a step's pick is the
    sample's best; it falls outside the ``n`` best free rows only when the sample missed all of them, at most
    ``(1 - n / R)^s <= miss`` a step. A sample without the log factor (``s = R / n``) misses about e^-1 of the time,
    one of ``n`` rows from their order at random far more."""
    from cropi.selection.influence import sampled_greedy_under_budget

    miss, rows, n, outside, steps = 0.05, 400, 20, 0, 0
    for run in range(40):
        rng = np.random.default_rng(100 + run)
        units = rng.normal(size=(rows, 4))
        units /= np.linalg.norm(units, axis=1, keepdims=True)
        gain = rng.normal(size=rows)
        picked = sampled_greedy_under_budget(units, gain, n, 1.0, np.random.default_rng(run), miss=miss)
        free = set(range(rows))
        for j in picked:
            best = sorted(free, key=lambda i: -gain[i])[:n]
            outside += j not in best
            steps += 1
            free.remove(j)
    se = math.sqrt(miss * (1 - miss) / steps)
    assert outside / steps <= miss + 4 * se, (outside, steps)


def _brute_spearman(x, y) -> float:
    """Pearson's r of the ranks, ranks by a double argsort (the values below have no ties)."""
    rx, ry = (np.argsort(np.argsort(v)).astype(float) for v in (x, y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float(rx @ ry / math.sqrt((rx @ rx) * (ry @ ry)))


@pytest.mark.parametrize("noise", [0.0, 0.3, 1.0, 3.0, 10.0, 100.0])
def test_ranking_change_is_spearman_over_the_prompts_both_ranked_and_warns_only_when_not_above_zero(noise):
    """rho over the common prompts only (a prompt one ranking lacks must not count), the top-k overlap by brute
    force, and the turnover warning exactly when rho sqrt(n - 1) is not above the one-sided normal quantile."""
    from cropi.scoring.diagnostics import TURNED_OVER, ranking_change

    rng = np.random.default_rng(int(noise * 10))
    n, k = 101, 10
    before = {f"p{i}": float(v) for i, v in enumerate(rng.normal(size=n))}
    now = {p: v + noise * float(rng.normal()) for p, v in before.items()}
    now["only-now"], before["only-before"] = 99.0, 99.0  # top of each, and in neither comparison
    out = ranking_change(now, before, k, alpha=0.05)
    common = [f"p{i}" for i in range(n)]
    rho = _brute_spearman([now[p] for p in common], [before[p] for p in common])
    assert out["prompts"] == n and out["spearman"] == pytest.approx(rho, abs=1e-12)
    top = lambda d: set(sorted(common, key=lambda p: -d[p])[:k])  # noqa: E731
    assert out["top_overlap"] == len(top(now) & top(before)) / k and out["random_top_overlap"] == k / n
    warned = [w["code"] for w in out["warnings"]] == [TURNED_OVER]
    assert warned == (rho * math.sqrt(n - 1) <= 1.6448536269514722)
    assert ranking_change({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 2.0, "c": 0.0}, 1)["spearman"] is None  # 2 in common
    flat = ranking_change({p: 0.0 for p in common}, before, k)  # every score equal: rho undefined, nothing claimed
    assert flat["spearman"] is None and flat["warnings"] == []


def test_ranking_change_of_a_reversed_order_warns_and_of_the_same_order_does_not():
    from cropi.scoring.diagnostics import ranking_change

    scores = {f"p{i}": float(i) for i in range(50)}
    same = ranking_change(scores, dict(scores), 5)
    assert same["spearman"] == pytest.approx(1.0) and same["top_overlap"] == 1.0 and same["warnings"] == []
    flipped = ranking_change(scores, {p: -v for p, v in scores.items()}, 5)
    assert flipped["spearman"] == pytest.approx(-1.0) and flipped["top_overlap"] == 0.0 and flipped["warnings"]
